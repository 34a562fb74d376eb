-- One row per consumer, for `assetq status` and dashboards. Read-only (it aggregates).
--   queued_events              queue rows of the consumer: events it has not consumed yet
--   oldest_queued_at           timestamp of the oldest of them (NULL when none)
--   oldest_queued_age_seconds  how long that one has waited, by the server's clock
--   runs_last_hour             runs created in the last hour (runs purged are not counted)
--   last_run_at                when its newest run still in the history was created
--   runs_total                 runs ever created for it (its run sequence; purge keeps it)
--   last_scheduled_at          when a scheduler pass last examined it
--   max_active_runs            the consumer's cap on active runs (NULL: none)
--   active_runs                its runs in state queued or running
-- The queue is grouped whole: it holds pending rows only, never history.
CREATE OR REPLACE VIEW {{ns}}.dag_queue_status AS
SELECT d.dag_id,
       d.is_paused,
       coalesce(q.queued_events, 0) AS queued_events,
       q.oldest_queued_at,
       CAST(extract(epoch FROM now() - q.oldest_queued_at) AS double precision)
           AS oldest_queued_age_seconds,
       (SELECT count(*)
          FROM {{ns}}.dag_run r
         WHERE r.dag_id = d.dag_id AND r.created_at > now() - interval '1 hour') AS runs_last_hour,
       (SELECT max(r.created_at) FROM {{ns}}.dag_run r WHERE r.dag_id = d.dag_id) AS last_run_at,
       d.last_run_seq AS runs_total,
       d.last_scheduled_at,
       d.max_active_runs,
       (SELECT count(*)
          FROM {{ns}}.dag_run r
         WHERE r.dag_id = d.dag_id AND r.state IN ('queued', 'running')) AS active_runs,
       w.running_runs,
       w.oldest_lease_until,
       w.expired_leases,
       w.retrying_runs,
       (SELECT count(*)
          FROM {{ns}}.dag_run r
         WHERE r.dag_id = d.dag_id AND r.state = 'failed') AS failed_runs,
       d.max_attempts
  FROM {{ns}}.dag d
  CROSS JOIN LATERAL (
        SELECT count(*) FILTER (WHERE r.state = 'running') AS running_runs,
               min(r.lease_until) AS oldest_lease_until,
               count(*) FILTER (WHERE r.state = 'running' AND r.lease_until < now()) AS expired_leases,
               count(*) FILTER (WHERE r.attempt > CASE r.state WHEN 'running' THEN 1 ELSE 0 END)
                   AS retrying_runs
          FROM {{ns}}.dag_run r
         WHERE r.dag_id = d.dag_id AND r.state IN ('queued', 'running')) w
  LEFT JOIN (SELECT q.target_dag_id,
                    count(*) AS queued_events,
                    min(q.created_at) AS oldest_queued_at
               FROM {{ns}}.asset_dag_run_queue q
              GROUP BY q.target_dag_id) q
    ON q.target_dag_id = d.dag_id;
