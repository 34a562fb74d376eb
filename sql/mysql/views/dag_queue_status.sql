-- One row per consumer, for `assetq status` and dashboards. Read-only (it aggregates).
--   queued_events              queue rows of the consumer: events it has not consumed yet
--   oldest_queued_at           timestamp of the oldest of them (NULL when none), UTC
--   oldest_queued_age_seconds  how long that one has waited, by the server's clock
--   runs_last_hour             runs created in the last hour (runs purged are not counted)
--   last_run_at                when its newest run still in the history was created, UTC
--   runs_total                 runs ever created for it (its run sequence; purge keeps it)
--   last_scheduled_at          when a scheduler pass last examined it, UTC
--   max_active_runs            its cap on active runs (NULL: none)
--   active_runs                its runs in state queued or running
--   running_runs               its runs in state running
--   oldest_lease_until         the earliest end of a lease among its active runs (NULL: none)
--   expired_leases             running runs whose lease has ended: their worker stopped
--                              renewing it (the next claim takes them as a new attempt, or
--                              fails the last one)
--   retrying_runs              active runs already on a retry (a failed attempt or an expired
--                              lease behind them)
--   failed_runs                its failed runs still in the history
--   max_attempts               its max_attempts
-- The queue is grouped whole: it holds pending rows only, never history; the active runs are
-- grouped through dag_run_state_idx, so the view costs what is active, never the finished
-- history (failed_runs is one index range per consumer). SQL SECURITY DEFINER: a reader
-- needs SELECT on the view only.
-- MySQL 8 / MariaDB: no LATERAL on MariaDB, hence the grouped derived tables and the
-- correlated subqueries.
CREATE OR REPLACE SQL SECURITY DEFINER VIEW {{ns}}.dag_queue_status AS
SELECT d.dag_id,
       d.is_paused,
       COALESCE(q.queued_events, 0) AS queued_events,
       q.oldest_queued_at,
       TIMESTAMPDIFF(MICROSECOND, q.oldest_queued_at, UTC_TIMESTAMP(6)) / 1000000
           AS oldest_queued_age_seconds,
       (SELECT COUNT(*)
          FROM {{ns}}.dag_run r
         WHERE r.dag_id = d.dag_id
           AND r.created_at > UTC_TIMESTAMP(6) - INTERVAL 1 HOUR) AS runs_last_hour,
       (SELECT MAX(r.created_at) FROM {{ns}}.dag_run r WHERE r.dag_id = d.dag_id) AS last_run_at,
       l.last_run_seq AS runs_total,
       l.last_scheduled_at,
       d.max_active_runs,
       (SELECT COUNT(*)
          FROM {{ns}}.dag_run r
         WHERE r.dag_id = d.dag_id AND r.state IN ('queued', 'running')) AS active_runs,
       COALESCE(w.running_runs, 0) AS running_runs,
       w.oldest_lease_until,
       COALESCE(w.expired_leases, 0) AS expired_leases,
       COALESCE(w.retrying_runs, 0) AS retrying_runs,
       (SELECT COUNT(*)
          FROM {{ns}}.dag_run r
         WHERE r.dag_id = d.dag_id AND r.state = 'failed') AS failed_runs,
       d.max_attempts
  FROM {{ns}}.dag d
  JOIN {{ns}}.dag_lock l ON l.dag_id = d.dag_id
  LEFT JOIN (SELECT r.dag_id,
                    COUNT(CASE WHEN r.state = 'running' THEN 1 END) AS running_runs,
                    MIN(r.lease_until) AS oldest_lease_until,
                    COUNT(CASE WHEN r.state = 'running' AND r.lease_until < UTC_TIMESTAMP(6)
                               THEN 1 END) AS expired_leases,
                    COUNT(CASE WHEN r.attempt > CASE r.state WHEN 'running' THEN 1 ELSE 0 END
                               THEN 1 END) AS retrying_runs
               FROM {{ns}}.dag_run r
              WHERE r.state IN ('queued', 'running')
              GROUP BY r.dag_id) w
    ON w.dag_id = d.dag_id
  LEFT JOIN (SELECT q.target_dag_id,
                    COUNT(*) AS queued_events,
                    MIN(q.created_at) AS oldest_queued_at
               FROM {{ns}}.asset_dag_run_queue q
              GROUP BY q.target_dag_id) q
    ON q.target_dag_id = d.dag_id;
