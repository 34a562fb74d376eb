-- Every statement the Python layer sends to PostgreSQL, by name.
-- Each query starts with a "-- name --" line and a one-line description; parameters are
-- SQLAlchemy binds (:name); {{ns}} is the quoted namespace. sql/mysql/queries.sql has the
-- same names with the same parameters and result columns.

-- register_event --
-- Register one event in the caller's transaction; the trigger fans it out.
SELECT event_id, asset_id, event_timestamp, created
  FROM {{ns}}.register_event(
        p_asset => :asset,
        p_extra => CAST(:extra AS jsonb),
        p_source_dag_id => :source_dag_id,
        p_source_task_id => :source_task_id,
        p_source_run_id => :source_run_id,
        p_source_map_index => :source_map_index,
        p_idempotency_key => :idempotency_key)

-- register_events --
-- Register a batch of events (a JSON array) in the caller's transaction; one row per item.
SELECT item_no, event_id, asset_id, event_timestamp, created
  FROM {{ns}}.register_events(p_events => CAST(:events AS jsonb))

-- register_event_v2 --
-- register_event under the routine's own savepoint: an error is reported in error_code and
-- error_message, and leaves the caller's transaction as it was.
SELECT event_id, asset_id, event_timestamp, created, error_code, error_message
  FROM {{ns}}.register_event_v2(
        p_asset => :asset,
        p_extra => CAST(:extra AS jsonb),
        p_source_dag_id => :source_dag_id,
        p_source_task_id => :source_task_id,
        p_source_run_id => :source_run_id,
        p_source_map_index => :source_map_index,
        p_idempotency_key => :idempotency_key)

-- register_events_v2 --
-- register_events under the routine's own savepoint: an error is one row with error_code and
-- error_message, and leaves the caller's transaction as it was.
SELECT item_no, event_id, asset_id, event_timestamp, created, error_code, error_message
  FROM {{ns}}.register_events_v2(p_events => CAST(:events AS jsonb))

-- declare_asset --
-- Create an asset, or update the uri/extra of an existing one; returns its id.
SELECT {{ns}}.declare_asset(p_name => :name, p_uri => :uri, p_extra => CAST(:extra AS jsonb)) AS asset_id

-- declare_dag --
-- Create or replace a consumer and its compiled condition.
SELECT {{ns}}.declare_dag(
        p_dag_id => :dag_id,
        p_condition => CAST(:condition AS jsonb),
        p_clauses => CAST(:clauses AS jsonb),
        p_paused => :paused,
        p_max_active_runs => CAST(:max_active_runs AS integer),
        p_max_events_per_run => CAST(:max_events_per_run AS integer),
        p_queue_while_paused => :queue_while_paused,
        p_max_attempts => CAST(:max_attempts AS integer),
        p_retry_delay_seconds => CAST(:retry_delay_seconds AS double precision),
        p_max_retry_delay_seconds => CAST(:max_retry_delay_seconds AS double precision))

-- set_dag_partitions --
-- Set a consumer's partitioning (NULL: unpartitioned), right after its declare_dag.
SELECT {{ns}}.set_dag_partitions(p_dag_id => :dag_id, p_partitions => CAST(:partitions AS jsonb))

-- dag_partitioned --
-- Is consumer :dag_id declared, and partitioned? No row for an unknown consumer.
SELECT d.partitioning IS NOT NULL AS partitioned FROM {{ns}}.dag d WHERE d.dag_id = :dag_id

-- unkeyed_recent_events --
-- Of the namespace's :window most recent events (its timestamp index, read backwards: the
-- cost is the window's, never the history's), how many are of each asset consumer :dag_id is
-- scheduled on and carry no partition key: the producers a partitioned declaration would
-- break (their next events refused, UnmappablePartition).
SELECT a.name AS asset_name, count(*) AS unkeyed
  FROM (SELECT e.asset_id, e.partition_key
          FROM {{ns}}.asset_event e
         ORDER BY e."timestamp" DESC, e.id DESC
         LIMIT :window) e
  JOIN {{ns}}.dag_schedule_asset_reference r ON r.asset_id = e.asset_id AND r.dag_id = :dag_id
  JOIN {{ns}}.asset a ON a.id = e.asset_id
 WHERE e.partition_key IS NULL
 GROUP BY a.name
 ORDER BY a.name

-- set_dag_paused --
-- Pause or unpause a consumer.
SELECT {{ns}}.set_dag_paused(p_dag_id => :dag_id, p_paused => :paused)

-- scheduler_transaction --
-- First statement of a scheduler pass's transaction: the pass must run at READ COMMITTED
-- (see schedule_pass in schema.sql), whatever the session's default level is.
SET TRANSACTION ISOLATION LEVEL READ COMMITTED

-- schedule_pass --
-- One scheduler pass over at most :limit consumers; returns the runs it created.
SELECT dag_run_id, dag_id, run_id, seq, run_after, created_at, event_ids, triggering_event_id,
       state, partition_key
  FROM {{ns}}.schedule_pass_v2(p_limit => CAST(:limit AS integer))

-- set_run_state --
-- Move a run to another state; returns the run (the get_run columns).
SELECT dag_run_id, dag_id, run_id, seq, state, run_after, created_at, started_at, ended_at,
       triggering_event_id, event_count, attempt, worker, lease_until, not_before, error,
       partition_key
  FROM {{ns}}.set_run_state(p_dag_id => :dag_id, p_run_id => :run_id, p_state => :state)

-- delete_dag --
-- Remove a consumer with its queue, condition, runs and links.
SELECT {{ns}}.delete_dag(p_dag_id => :dag_id) AS deleted

-- delete_asset --
-- Remove an asset that no condition names, with its events; returns how many events went.
SELECT deleted_events FROM {{ns}}.delete_asset(p_asset => :asset)

-- get_run --
-- One run of a consumer by run id (no row when there is none).
SELECT r.id AS dag_run_id, r.dag_id, r.run_id, r.seq, r.state, r.run_after, r.created_at,
       r.started_at, r.ended_at, r.triggering_event_id, r.event_count, r.attempt, r.worker,
       r.lease_until, r.not_before, r.error, r.partition_key, r.deadline
  FROM {{ns}}.dag_run r
 WHERE r.dag_id = :dag_id AND r.run_id = :run_id

-- runs_page --
-- A page of a consumer's runs, newest first: seq below :before_seq (NULL: from the newest),
-- in state :state (NULL: any).
SELECT r.id AS dag_run_id, r.dag_id, r.run_id, r.seq, r.state, r.run_after, r.created_at,
       r.started_at, r.ended_at, r.triggering_event_id, r.event_count, r.attempt, r.worker,
       r.lease_until, r.not_before, r.error, r.partition_key, r.deadline
  FROM {{ns}}.dag_run r
 WHERE r.dag_id = :dag_id
   AND (CAST(:state AS text) IS NULL OR r.state = CAST(:state AS text))
   AND (CAST(:before_seq AS bigint) IS NULL OR r.seq < CAST(:before_seq AS bigint))
 ORDER BY r.seq DESC
 LIMIT :limit

-- runs_page_all --
-- A page of every consumer's runs, newest (highest id) first: id below :before_id (NULL: from
-- the newest), in state :state (NULL: any). With a state it reads dag_run_state_idx.
SELECT r.id AS dag_run_id, r.dag_id, r.run_id, r.seq, r.state, r.run_after, r.created_at,
       r.started_at, r.ended_at, r.triggering_event_id, r.event_count, r.attempt, r.worker,
       r.lease_until, r.not_before, r.error, r.partition_key, r.deadline
  FROM {{ns}}.dag_run r
 WHERE (CAST(:state AS text) IS NULL OR r.state = CAST(:state AS text))
   AND (CAST(:before_id AS bigint) IS NULL OR r.id < CAST(:before_id AS bigint))
 ORDER BY r.id DESC
 LIMIT :limit

-- claim_runs --
-- Claim up to :limit runs for worker :worker with a lease of :lease_seconds and a default
-- timeout of :timeout_seconds (NULL: none) (own transaction).
SELECT dag_run_id, dag_id, run_id, seq, run_after, created_at, event_ids, triggering_event_id,
       state, attempt, worker, lease_until, started_at, partition_key, deadline, capped
  FROM {{ns}}.claim_runs_v2(
        p_worker => :worker,
        p_limit => CAST(:limit AS integer),
        p_lease_seconds => CAST(:lease_seconds AS double precision),
        p_dag_ids => CAST(:dag_ids AS jsonb),
        p_timeout_seconds => CAST(:timeout_seconds AS double precision))

-- schedule_and_claim --
-- A pass over the consumers :dag_ids, waiting up to :wait_seconds for one another pass
-- holds, then claim_runs, in one statement (own transaction).
SELECT dag_run_id, dag_id, run_id, seq, run_after, created_at, event_ids, triggering_event_id,
       state, attempt, worker, lease_until, started_at, partition_key, deadline, capped, made
  FROM {{ns}}.schedule_and_claim(
        p_worker => :worker,
        p_limit => CAST(:limit AS integer),
        p_lease_seconds => CAST(:lease_seconds AS double precision),
        p_dag_ids => CAST(:dag_ids AS jsonb),
        p_timeout_seconds => CAST(:timeout_seconds AS double precision),
        p_wait_seconds => CAST(:wait_seconds AS double precision))

-- heartbeat_run --
-- Renew the lease of a run held at :attempt by the claim made at :started_at; returns the
-- new end of the lease.
SELECT lease_until
  FROM {{ns}}.heartbeat_run_v2(
        p_dag_id => :dag_id,
        p_run_id => :run_id,
        p_attempt => CAST(:attempt AS integer),
        p_lease_seconds => CAST(:lease_seconds AS double precision),
        p_started_at => CAST(:started_at AS timestamptz))

-- complete_run --
-- Finish attempt :attempt of a run, claimed at :started_at, as :state (success with output
-- :events, or failed with :error) in the caller's transaction; returns the run.
SELECT dag_run_id, dag_id, run_id, seq, state, run_after, created_at, started_at, ended_at,
       triggering_event_id, event_count, attempt, worker, lease_until, not_before, error,
       output_event_ids, partition_key
  FROM {{ns}}.complete_run_v2(
        p_dag_id => :dag_id,
        p_run_id => :run_id,
        p_attempt => CAST(:attempt AS integer),
        p_state => :state,
        p_error => :error,
        p_events => CAST(:events AS jsonb),
        p_started_at => CAST(:started_at AS timestamptz))

-- retry_run --
-- Put a failed run back in the queue as its next attempt; returns the run.
SELECT dag_run_id, dag_id, run_id, seq, state, run_after, created_at, started_at, ended_at,
       triggering_event_id, event_count, attempt, worker, lease_until, not_before, error,
       output_event_ids, partition_key
  FROM {{ns}}.retry_run(p_dag_id => :dag_id, p_run_id => :run_id)

-- cancel_run --
-- Cancel a queued or running run, fencing its holder; returns the run.
SELECT dag_run_id, dag_id, run_id, seq, state, run_after, created_at, started_at, ended_at,
       triggering_event_id, event_count, attempt, worker, lease_until, not_before, error,
       output_event_ids, partition_key
  FROM {{ns}}.cancel_run(p_dag_id => :dag_id, p_run_id => :run_id, p_reason => :reason)

-- set_dag_timeout --
-- A consumer's timeout in seconds (NULL: none), in the caller's transaction.
SELECT {{ns}}.set_dag_timeout(p_dag_id => :dag_id,
                              p_timeout_seconds => CAST(:timeout_seconds AS double precision))

-- queued_events_page --
-- A page of the events queued for a consumer, oldest first (the order max_events_per_run
-- consumes them in): after (:after_timestamp, :after_id), or from the oldest when NULL.
SELECT e.id AS event_id, e.asset_id, a.name AS asset_name, a.uri AS asset_uri,
       e."timestamp" AS event_timestamp, e.extra, e.source_dag_id, e.source_task_id,
       e.source_run_id, e.source_map_index, e.partition_key,
       coalesce((SELECT json_agg(al.name ORDER BY al.name)
                   FROM {{ns}}.asset_event_alias ea
                   JOIN {{ns}}.asset_alias al ON al.id = ea.alias_id
                  WHERE ea.asset_event_id = e.id)::text, '[]') AS aliases
  FROM {{ns}}.asset_dag_run_queue q
  JOIN {{ns}}.asset_event e ON e.id = q.asset_event_id
  JOIN {{ns}}.asset a ON a.id = e.asset_id
 WHERE q.target_dag_id = :dag_id
   AND (CAST(:after_timestamp AS timestamptz) IS NULL
        OR (q.created_at, q.asset_event_id)
           > (CAST(:after_timestamp AS timestamptz), CAST(:after_id AS bigint)))
 ORDER BY q.created_at, q.asset_event_id
 LIMIT :limit

-- consumed_events_page --
-- A page of the events a run consumed, by event id, after :after_id (NULL: from the first).
SELECT e.id AS event_id, e.asset_id, a.name AS asset_name, a.uri AS asset_uri,
       e."timestamp" AS event_timestamp, e.extra, e.source_dag_id, e.source_task_id,
       e.source_run_id, e.source_map_index, e.partition_key,
       coalesce((SELECT json_agg(al.name ORDER BY al.name)
                   FROM {{ns}}.asset_event_alias ea
                   JOIN {{ns}}.asset_alias al ON al.id = ea.alias_id
                  WHERE ea.asset_event_id = e.id)::text, '[]') AS aliases
  FROM {{ns}}.dag_run r
  JOIN {{ns}}.dagrun_asset_event l ON l.dag_run_id = r.id
  JOIN {{ns}}.asset_event e ON e.id = l.asset_event_id
  JOIN {{ns}}.asset a ON a.id = e.asset_id
 WHERE r.dag_id = :dag_id AND r.run_id = :run_id
   AND (CAST(:after_id AS bigint) IS NULL OR l.asset_event_id > CAST(:after_id AS bigint))
 ORDER BY l.asset_event_id
 LIMIT :limit

-- create_namespace --
-- Create the namespace that holds every assetq object.
CREATE SCHEMA IF NOT EXISTS {{ns}}

-- lock_namespace --
-- Serialize installs and uninstalls of one namespace (held until the transaction ends).
SELECT 1 AS locked FROM pg_advisory_xact_lock(hashtextextended('assetq:' || :namespace, 0))

-- unlock_namespace --
-- Nothing to do: the transaction-level lock of lock_namespace ends with the transaction.
SELECT 1 AS released

-- namespace_exists --
-- 1 when the namespace exists.
SELECT count(*) AS n FROM pg_namespace WHERE nspname = :namespace

-- version_table_exists --
-- 1 when alembic's version table exists in the namespace.
SELECT count(*) AS n
  FROM pg_class c JOIN pg_namespace s ON s.oid = c.relnamespace
 WHERE s.nspname = :namespace AND c.relname = 'assetq_alembic_version' AND c.relkind = 'r'

-- drop_version_table --
-- Remove alembic's version table after a downgrade to base.
DROP TABLE IF EXISTS {{ns}}.assetq_alembic_version

-- namespace_object_count --
-- How many objects (tables, routines, types) are left in the namespace.
SELECT (SELECT count(*) FROM pg_class c JOIN pg_namespace s ON s.oid = c.relnamespace
         WHERE s.nspname = :namespace)
     + (SELECT count(*) FROM pg_proc p JOIN pg_namespace s ON s.oid = p.pronamespace
         WHERE s.nspname = :namespace)
     + (SELECT count(*) FROM pg_type t JOIN pg_namespace s ON s.oid = t.typnamespace
         WHERE s.nspname = :namespace AND t.typtype NOT IN ('c', 'b')) AS n

-- drop_namespace --
-- Drop the (empty) namespace; RESTRICT so an object someone else put there is never dropped.
DROP SCHEMA IF EXISTS {{ns}} RESTRICT

-- listen --
-- Subscribe this session to the namespace's wake-up channel (trigger asset_dag_run_queue_notify).
LISTEN {{ns}}

-- listener_settings --
-- The listening session of run_scheduler: no statement timeout (a role's default would break
-- its lock waits), and TCP keepalives, so that the server notices a dead scheduler within
-- about two minutes and releases its locks (ignored on a Unix socket).
SELECT set_config('statement_timeout', '0', false),
       set_config('tcp_keepalives_idle', '60', false),
       set_config('tcp_keepalives_interval', '10', false),
       set_config('tcp_keepalives_count', '6', false)

-- wakeup_lock_timeout_short --
-- How long the listening session's first wait for the wake-up lock lasts (run_scheduler).
SET lock_timeout = '250ms'

-- wakeup_lock_timeout_long --
-- Its later waits, while a producer's transaction stays open: each wait that times out is an
-- ERROR line in the server's log, so they are longer.
SET lock_timeout = '2s'

-- wakeup_arm --
-- The scheduler's locks, all session locks of its listening connection (run_scheduler; the
-- protocol is explained in migrations/0005_wakeup_on_demand.up.sql and scheduler.py):
--   the wake-up lock, key ('astq' << 32) + the queue table's oid: exclusive while a scheduler
--     waits for notifications (producers try it shared, and notify when they cannot have it);
--   the busy lock, key ('astb' << 32) + the queue table's oid: shared while a scheduler's
--     passes create runs, so the others know they need not be woken.
--
-- Take the wake-up lock, waiting (up to the session's lock_timeout) for the producers in
-- flight that did not notify: they hold it shared. While this waits, producers notify.
SELECT pg_advisory_lock(
    (CAST(1634956401 AS bigint) << 32)
    + CAST(CAST(CAST('{{ns}}.asset_dag_run_queue' AS regclass) AS oid) AS bigint))

-- wakeup_try --
-- Take the wake-up lock if nobody holds it; never waits.
SELECT pg_try_advisory_lock(
    (CAST(1634956401 AS bigint) << 32)
    + CAST(CAST(CAST('{{ns}}.asset_dag_run_queue' AS regclass) AS oid) AS bigint)) AS armed

-- wakeup_disarm --
-- Give the wake-up lock back: producers stop notifying.
SELECT pg_advisory_unlock(
    (CAST(1634956401 AS bigint) << 32)
    + CAST(CAST(CAST('{{ns}}.asset_dag_run_queue' AS regclass) AS oid) AS bigint))

-- wakeup_held_by_scheduler --
-- Does a session hold the wake-up lock exclusively (a scheduler waiting for notifications)?
-- pg_locks shows a bigint advisory key as classid (high half), objid (low half), objsubid 1,
-- for every database of the server: this one's only.
SELECT EXISTS (
    SELECT 1
      FROM pg_locks
     WHERE locktype = 'advisory'
       AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
       AND classid = CAST(1634956401 AS oid)
       AND objid = CAST(CAST('{{ns}}.asset_dag_run_queue' AS regclass) AS oid)
       AND objsubid = 1
       AND mode = 'ExclusiveLock'
       AND granted) AS held

-- workers_listen_mark --
-- A worker's listening connection (run_worker) holds the workers' lock shared, a session lock,
-- key ('astw' << 32) + the queue table's oid, for as long as it listens: a scheduler woken by
-- a producer then gives listening workers a head start (workers_listening; run_scheduler's
-- worker_head_start), since a worker's claim makes and claims its consumers' runs itself.
SELECT pg_advisory_lock_shared(
    (CAST(1634956407 AS bigint) << 32)
    + CAST(CAST(CAST('{{ns}}.asset_dag_run_queue' AS regclass) AS oid) AS bigint))

-- workers_listening --
-- Does a worker listen on this namespace (a session holds the workers' lock)?
SELECT EXISTS (
    SELECT 1
      FROM pg_locks
     WHERE locktype = 'advisory'
       AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
       AND classid = CAST(1634956407 AS oid)
       AND objid = CAST(CAST('{{ns}}.asset_dag_run_queue' AS regclass) AS oid)
       AND objsubid = 1
       AND granted) AS listening

-- busy_mark --
-- Try to take the busy lock shared (never waits): true when this session holds it now.
SELECT pg_try_advisory_lock_shared(
    (CAST(1634956386 AS bigint) << 32)
    + CAST(CAST(CAST('{{ns}}.asset_dag_run_queue' AS regclass) AS oid) AS bigint)) AS marked

-- busy_unmark --
-- Give the busy lock back.
SELECT pg_advisory_unlock_shared(
    (CAST(1634956386 AS bigint) << 32)
    + CAST(CAST(CAST('{{ns}}.asset_dag_run_queue' AS regclass) AS oid) AS bigint))

-- busy_others --
-- Is another scheduler busy (holding the busy lock)? An exclusive lock this session can take
-- (and gives back at once) means no. Never waits.
SELECT CASE
         WHEN pg_try_advisory_lock(
                (CAST(1634956386 AS bigint) << 32)
                + CAST(CAST(CAST('{{ns}}.asset_dag_run_queue' AS regclass) AS oid) AS bigint))
         THEN NOT pg_advisory_unlock(
                (CAST(1634956386 AS bigint) << 32)
                + CAST(CAST(CAST('{{ns}}.asset_dag_run_queue' AS regclass) AS oid) AS bigint))
         ELSE true
       END AS busy

-- dag_queue_status --
-- One row per consumer from the dag_queue_status view: queue depth, oldest queued, recent runs.
SELECT dag_id, is_paused, queued_events, oldest_queued_at, oldest_queued_age_seconds,
       runs_last_hour, last_run_at, runs_total, last_scheduled_at, max_active_runs, active_runs,
       running_runs, oldest_lease_until, expired_leases, retrying_runs, failed_runs, max_attempts
  FROM {{ns}}.dag_queue_status
 ORDER BY dag_id

-- unexamined_consumers --
-- How many unpaused consumers with queued events no pass has examined since :since (the
-- database's clock, from server_clock)? The scheduler loop passes again while there are and
-- their number goes down: a pass examines at most :limit consumers, and may have found
-- nothing while a ready one waits further on.
SELECT count(*) AS behind
  FROM {{ns}}.dag d
 WHERE NOT d.is_paused
   AND (d.last_scheduled_at IS NULL OR d.last_scheduled_at < CAST(:since AS timestamptz))
   -- One probe by key per consumer; OFFSET 0 keeps it from becoming a hash of the whole
   -- queue (as in schedule_pass). A partitioned consumer waits for a pass only when a row
   -- arrived that no pass has examined (as in schedule_pass).
   AND CASE WHEN d.partitioning IS NULL
            THEN EXISTS (SELECT 1 FROM {{ns}}.asset_dag_run_queue q
                          WHERE q.target_dag_id = d.dag_id OFFSET 0)
            ELSE EXISTS (SELECT 1 FROM {{ns}}.asset_partition_queue p
                          WHERE p.target_dag_id = d.dag_id AND NOT p.examined OFFSET 0)
       END

-- server_clock --
-- The database's current time (UTC): when a scheduler round starts.
SELECT clock_timestamp() AS now

-- purge_cutoff --
-- The cutoff of a purge: the server's current time minus :seconds (one clock for every batch).
SELECT clock_timestamp() - make_interval(secs => CAST(:seconds AS double precision)) AS cutoff

-- purge_runs --
-- Delete one batch of runs created before :older_than, with their links.
SELECT deleted FROM {{ns}}.purge_runs(p_older_than => :older_than, p_batch_size => :batch_size)

-- purge_events --
-- Examine the next batch of events before :older_than after the cursor; delete the consumed ones.
SELECT deleted, examined, last_timestamp, last_id
  FROM {{ns}}.purge_events(
        p_older_than => :older_than,
        p_batch_size => :batch_size,
        p_after_timestamp => :after_timestamp,
        p_after_id => :after_id)

-- process_heartbeat --
-- Record that loop :process_id (a scheduler or worker) is alive now, by the database's clock
-- (a short transaction of its own, never a pass's or a run's).
SELECT {{ns}}.process_heartbeat(
        p_process_id => :process_id,
        p_kind => :kind,
        p_name => :name,
        p_host => :host,
        p_pid => CAST(:pid AS bigint),
        p_version => :version,
        p_interval_seconds => CAST(:interval_seconds AS double precision))

-- process_gone --
-- Delete loop :process_id's liveness row: it stopped cleanly.
SELECT {{ns}}.process_gone(p_process_id => :process_id)

-- process_handles --
-- Record the consumers worker :process_id has handlers for (:dag_ids, a JSON array), in its
-- heartbeat's transaction; returns those that name no declared consumer (unknown_dag_id).
SELECT unknown_dag_id
  FROM {{ns}}.process_handles(p_process_id => :process_id, p_dag_ids => CAST(:dag_ids AS jsonb))

-- purge_process_dags --
-- Delete the consumers of processes that have no liveness row any more (purge_processes
-- deleted it, or a process_gone of an older package did): a handful of rows, one per live
-- worker and handler, read whole.
DELETE FROM {{ns}}.process_dag p
 WHERE NOT EXISTS (SELECT 1 FROM {{ns}}.process_liveness l WHERE l.process_id = p.process_id)

-- worker_coverage --
-- Per consumer with queued runs or expired leases: how many of each; how long its oldest
-- claimable queued run has waited since it became claimable (its not_before: a retry's delay
-- is not waiting) and how many have waited longer than :stuck_seconds; how many live workers
-- (liveness rows not stale by :stale_intervals, as in processes) have a handler for it.
-- Reads the active runs only, by dag_run_state_idx, never the history.
SELECT r.dag_id,
       count(*) FILTER (WHERE r.state = 'queued') AS queued_runs,
       count(*) FILTER (WHERE r.state = 'running' AND r.lease_until < clock_timestamp())
           AS expired_runs,
       CAST(extract(epoch FROM clock_timestamp()
                               - min(r.not_before) FILTER (WHERE r.state = 'queued'
                                                             AND r.not_before <= clock_timestamp()))
            AS double precision) AS oldest_queued_run_age_seconds,
       count(*) FILTER (WHERE r.state = 'queued'
                          AND r.not_before < clock_timestamp()
                              - make_interval(secs => CAST(:stuck_seconds AS double precision)))
           AS stuck_runs,
       (SELECT count(*)
          FROM {{ns}}.process_dag p
          JOIN {{ns}}.process_liveness l ON l.process_id = p.process_id
         WHERE p.dag_id = r.dag_id
           AND l.kind = 'worker'
           AND l.last_seen_at >= clock_timestamp()
               - make_interval(secs => l.interval_seconds * CAST(:stale_intervals AS double precision)))
           AS live_workers
  FROM {{ns}}.dag_run r
 WHERE r.state IN ('queued', 'running')
 GROUP BY r.dag_id
 ORDER BY r.dag_id

-- processes --
-- Every scheduler and worker loop of the liveness table, with how long ago it was last seen
-- (database clock) and whether that is more than :stale_intervals of its intervals ago.
SELECT l.process_id, l.kind, l.name, l.host, l.pid, l.version, l.interval_seconds,
       l.started_at, l.last_seen_at,
       CAST(EXTRACT(EPOCH FROM clock_timestamp() - l.last_seen_at) AS double precision)
           AS last_seen_age_seconds,
       l.last_seen_at < clock_timestamp()
           - make_interval(secs => l.interval_seconds * CAST(:stale_intervals AS double precision))
           AS stale
  FROM {{ns}}.process_liveness l
 ORDER BY l.kind, l.host, l.pid, l.started_at, l.process_id

-- purge_processes --
-- Delete the liveness rows last seen before :older_than (killed loops) that are stale too: not
-- seen for :stale_intervals of their own intervals. A live loop's row is never deleted, whatever
-- the cutoff (purge --older-than 0s took every live one, and status lost them until their next
-- heartbeat); the test is the processes query's "stale".
DELETE FROM {{ns}}.process_liveness l
 WHERE l.last_seen_at < :older_than
   AND l.last_seen_at < clock_timestamp()
       - make_interval(secs => l.interval_seconds * CAST(:stale_intervals AS double precision))

-- old_processes --
-- How many liveness rows purge_processes would delete (purge --dry-run): the same test.
SELECT COUNT(*) AS processes
  FROM {{ns}}.process_liveness l
 WHERE l.last_seen_at < :older_than
   AND l.last_seen_at < clock_timestamp()
       - make_interval(secs => l.interval_seconds * CAST(:stale_intervals AS double precision))

-- grant_access --
-- Give an existing role one kind of access: producer, scheduler, worker or reader.
SELECT {{ns}}.grant_access(p_access => :access, p_grantee => :grantee, p_host => :host)

-- revoke_access --
-- Take every kind of access grant_access gave a role away again.
SELECT {{ns}}.revoke_access(p_grantee => :grantee, p_host => :host)

-- namespace_objects --
-- Every table, view, routine and trigger in the namespace as (kind, name, detail); a trigger's
-- detail says whether it is enabled (ALTER TABLE ... DISABLE TRIGGER silences it).
SELECT CASE c.relkind WHEN 'v' THEN 'view' ELSE 'table' END AS kind, c.relname AS name,
       NULL AS detail
  FROM pg_class c JOIN pg_namespace s ON s.oid = c.relnamespace
 WHERE s.nspname = :namespace AND c.relkind IN ('r', 'p', 'v')
UNION ALL
SELECT 'routine', p.proname, NULL
  FROM pg_proc p JOIN pg_namespace s ON s.oid = p.pronamespace
 WHERE s.nspname = :namespace
UNION ALL
SELECT 'trigger', t.tgname, CASE t.tgenabled WHEN 'D' THEN 'disabled' ELSE 'enabled' END
  FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid
  JOIN pg_namespace s ON s.oid = c.relnamespace
 WHERE s.nspname = :namespace AND NOT t.tgisinternal
 ORDER BY 1, 2

-- routine_security --
-- Per routine: whose rights it runs with (DEFINER or INVOKER), its owner (MySQL: definer),
-- whether that owner is a superuser, and its pinned settings ('' when none; MySQL: NULL,
-- it has no such thing).
SELECT p.proname AS name,
       CASE WHEN p.prosecdef THEN 'DEFINER' ELSE 'INVOKER' END AS security,
       r.rolname AS owner,
       r.rolsuper AS owner_is_superuser,
       coalesce(array_to_string(p.proconfig, '; '), '') AS config
  FROM pg_proc p JOIN pg_namespace s ON s.oid = p.pronamespace
  JOIN pg_roles r ON r.oid = p.proowner
 WHERE s.nspname = :namespace
 ORDER BY 1

-- account_exists --
-- 1 when the role (MySQL: the 'user@host' account) exists.
SELECT count(*) AS n FROM pg_roles WHERE rolname = :account

-- server_settings --
-- Server facts doctor reports, as (name, value).
SELECT name, setting AS value
  FROM pg_settings
 WHERE name IN ('server_version', 'default_transaction_isolation', 'TimeZone')
 ORDER BY name

-- current_privileges --
-- What the connected role may do with assetq (each NULL where the engine cannot tell).
SELECT current_user AS account,
       has_function_privilege('{{ns}}.register_event(text, jsonb, text, text, text, integer, text)',
                              'EXECUTE') AS can_register,
       has_function_privilege('{{ns}}.schedule_pass_v2(integer, jsonb, double precision)',
                              'EXECUTE') AS can_schedule,
       has_table_privilege('{{ns}}.dag_queue_status', 'SELECT') AS can_read_status

-- can_operate --
-- May the connected role retry and cancel runs and pause consumers (the console's actions:
-- `assetq web` offers them by default only then)?
SELECT has_function_privilege('{{ns}}.cancel_run(text, text, text)', 'EXECUTE')
       AND has_function_privilege('{{ns}}.retry_run(text, text)', 'EXECUTE')
       AND has_function_privilege('{{ns}}.set_dag_paused(text, boolean)', 'EXECUTE')
       AS can_operate

-- deployment_settings --
-- What doctor checks about the deployment, as (name, value): a standby (in recovery) or a
-- server whose sessions refuse writes by default cannot run producers or passes
-- (docs/deployment.md).
SELECT 'in_recovery' AS name, CAST(pg_is_in_recovery() AS text) AS value
UNION ALL
SELECT 'default_transaction_read_only', current_setting('default_transaction_read_only')

-- backend_pid --
-- The server process of this session: the listening connections of run_scheduler and
-- run_worker compare it with the one the handshake gave, and between transactions, to see
-- whether they hold one server session or go through a transaction-pooling pooler.
SELECT pg_backend_pid() AS pid

-- dags_page --
-- The operator's list of consumers (assetq dags), by dag id after :after_dag_id (NULL: from
-- the first), or the one consumer :dag_id: its declaration, its queue depth and oldest queued
-- event (database clock), its queued and running runs. The counts read the pending queue and
-- the active runs of each consumer by index, never the history.
SELECT d.dag_id, d.condition, d.is_paused, d.max_active_runs, d.max_events_per_run,
       d.max_attempts, d.retry_delay_seconds, d.max_retry_delay_seconds, d.timeout_seconds,
       d.partitioning IS NOT NULL AS partitioned,
       q.queued_events, q.oldest_queued_at,
       CAST(extract(epoch FROM clock_timestamp() - q.oldest_queued_at) AS double precision)
           AS oldest_queued_age_seconds,
       (SELECT count(*) FROM {{ns}}.dag_run r
         WHERE r.dag_id = d.dag_id AND r.state = 'queued') AS queued_runs,
       (SELECT count(*) FROM {{ns}}.dag_run r
         WHERE r.dag_id = d.dag_id AND r.state = 'running') AS running_runs
  FROM {{ns}}.dag d
 CROSS JOIN LATERAL (SELECT count(*) AS queued_events, min(q.created_at) AS oldest_queued_at
                       FROM {{ns}}.asset_dag_run_queue q
                      WHERE q.target_dag_id = d.dag_id) q
 WHERE (CAST(:dag_id AS text) IS NULL OR d.dag_id = CAST(:dag_id AS text))
   AND (CAST(:after_dag_id AS text) IS NULL OR d.dag_id > CAST(:after_dag_id AS text))
 ORDER BY d.dag_id
 LIMIT :limit

-- run_outputs_page --
-- A page of the events whose source is run :run_id of :dag_id (a success's output events),
-- by id after :after_id (NULL: from the first), among the events registered between
-- :from_timestamp and :to_timestamp (its last attempt's start and a little after its end):
-- no index leads by source, so the read is a range of asset_event_timestamp_idx that the
-- attempt's own duration bounds, never the history.
SELECT e.id AS event_id, e.asset_id, a.name AS asset_name, a.uri AS asset_uri,
       e."timestamp" AS event_timestamp, e.extra, e.source_dag_id, e.source_task_id,
       e.source_run_id, e.source_map_index, e.partition_key,
       coalesce((SELECT json_agg(al.name ORDER BY al.name)
                   FROM {{ns}}.asset_event_alias ea
                   JOIN {{ns}}.asset_alias al ON al.id = ea.alias_id
                  WHERE ea.asset_event_id = e.id)::text, '[]') AS aliases
  FROM {{ns}}.asset_event e
  JOIN {{ns}}.asset a ON a.id = e.asset_id
 WHERE e."timestamp" >= CAST(:from_timestamp AS timestamptz)
   AND e."timestamp" <= CAST(:to_timestamp AS timestamptz)
   AND e.source_dag_id = :dag_id AND e.source_run_id = :run_id
   AND (CAST(:after_id AS bigint) IS NULL OR e.id > CAST(:after_id AS bigint))
 ORDER BY e.id
 LIMIT :limit

-- run_attempts_page --
-- The ended attempts of run :dag_run_id (dag_run_attempt, written by the trigger
-- dag_run_attempt_end), newest first, before attempt :before_attempt (NULL: from the newest),
-- at most :limit: a range of the table's primary key.
SELECT attempt, worker, started_at, ended_at, outcome, error
  FROM {{ns}}.dag_run_attempt
 WHERE dag_run_id = :dag_run_id
   AND (CAST(:before_attempt AS integer) IS NULL OR attempt < CAST(:before_attempt AS integer))
 ORDER BY attempt DESC
 LIMIT :limit

-- pending_partitions_page --
-- A partitioned consumer's pending partitions: the keys of its partition queue after
-- :after_key (NULL: from the first), at most :limit, each with its queued events, the names
-- of the assets they are events of (a JSON array), and when the oldest arrived. By
-- asset_partition_queue_key_idx, key by key: the rows read are the listed keys' own.
SELECT q.partition_key, count(*) AS events, min(q.created_at) AS oldest_queued_at,
       json_agg(DISTINCT a.name ORDER BY a.name)::text AS asset_names
  FROM {{ns}}.asset_partition_queue q
  JOIN {{ns}}.asset a ON a.id = q.asset_id
 WHERE q.target_dag_id = :dag_id
   AND (CAST(:after_key AS text) IS NULL OR q.partition_key > CAST(:after_key AS text))
 GROUP BY q.partition_key
 ORDER BY q.partition_key
 LIMIT :limit

-- find_asset --
-- The asset :asset names: by name, else by uri (as register_event finds it); no row if none.
SELECT a.id AS asset_id, a.name AS asset_name, a.uri AS asset_uri
  FROM {{ns}}.asset a
 WHERE a.name = :asset OR a.uri = :asset
 ORDER BY a.name = :asset DESC
 LIMIT 1

-- asset_events_page --
-- A page of asset :asset_id's events, newest first: registered at or after :since (its
-- timestamp, database clock) and before (:before_timestamp, :before_id) (NULL: from the
-- newest). The window bounds the read: no index orders one asset's events, so this walks
-- asset_event_timestamp_idx backwards (or the asset's own events, when it has few).
SELECT e.id AS event_id, e.asset_id, a.name AS asset_name, a.uri AS asset_uri,
       e."timestamp" AS event_timestamp, e.extra, e.source_dag_id, e.source_task_id,
       e.source_run_id, e.source_map_index, e.partition_key,
       coalesce((SELECT json_agg(al.name ORDER BY al.name)
                   FROM {{ns}}.asset_event_alias ea
                   JOIN {{ns}}.asset_alias al ON al.id = ea.alias_id
                  WHERE ea.asset_event_id = e.id)::text, '[]') AS aliases
  FROM {{ns}}.asset_event e
  JOIN {{ns}}.asset a ON a.id = e.asset_id
 WHERE e.asset_id = :asset_id
   AND e."timestamp" >= clock_timestamp() - make_interval(secs => CAST(:since_seconds AS double precision))
   AND (CAST(:before_timestamp AS timestamptz) IS NULL
        OR (e."timestamp", e.id) < (CAST(:before_timestamp AS timestamptz), CAST(:before_id AS bigint)))
 ORDER BY e."timestamp" DESC, e.id DESC
 LIMIT :limit

-- web_assets_page --
-- The console's asset list (assetq.web, /assets): the assets by name after :after_name (NULL:
-- from the first), at most :limit, each with how many consumers name it (counted on the
-- reference table's primary key, which starts with the asset).
SELECT a.id AS asset_id, a.name AS asset_name, a.uri AS asset_uri,
       (SELECT count(*) FROM {{ns}}.dag_schedule_asset_reference r
         WHERE r.asset_id = a.id) AS consumers
  FROM {{ns}}.asset a
 WHERE CAST(:after_name AS text) IS NULL OR a.name > CAST(:after_name AS text)
 ORDER BY a.name
 LIMIT :limit

-- web_asset_consumers --
-- The consumers whose condition names asset :asset_id (assetq.web, /assets/<name>), by dag id
-- after :after_dag_id (NULL: from the first), at most :limit, read by the reference table's
-- primary key (asset_id, dag_id).
SELECT r.dag_id, d.is_paused
  FROM {{ns}}.dag_schedule_asset_reference r
  JOIN {{ns}}.dag d ON d.dag_id = r.dag_id
 WHERE r.asset_id = :asset_id
   AND (CAST(:after_dag_id AS text) IS NULL OR r.dag_id > CAST(:after_dag_id AS text))
 ORDER BY r.dag_id
 LIMIT :limit

-- web_process_dags --
-- The consumers each process of the liveness table has handlers for (assetq.web, /workers),
-- by process and dag id, at most :limit rows: as many as the live workers declare, never the
-- history.
SELECT p.process_id, p.dag_id
  FROM {{ns}}.process_dag p
  JOIN {{ns}}.process_liveness l ON l.process_id = p.process_id
 ORDER BY p.process_id, p.dag_id
 LIMIT :limit

-- web_activity_per_minute --
-- The events registered and the runs created in the last hour, per minute (assetq.web, /): one
-- row per series ('events', 'runs') and minutes_ago (0: the last 60 seconds, up to 59) that has
-- any. The hour bounds both reads, whatever the history: events are a range of
-- asset_event_timestamp_idx ("timestamp", id), runs a range of dag_run_created_idx (created_at);
-- what they read grows with the last hour's rate only. statement_timestamp() is stable (unlike
-- clock_timestamp()), so the planner can bound the index range with it.
SELECT 'events' AS series,
       CAST(LEAST(59, GREATEST(0, floor(extract(epoch FROM statement_timestamp() - e."timestamp") / 60))) AS integer) AS minutes_ago,
       count(*) AS n
  FROM {{ns}}.asset_event e
 WHERE e."timestamp" > statement_timestamp() - interval '1 hour'
 GROUP BY 2
UNION ALL
SELECT 'runs' AS series,
       CAST(LEAST(59, GREATEST(0, floor(extract(epoch FROM statement_timestamp() - r.created_at) / 60))) AS integer) AS minutes_ago,
       count(*) AS n
  FROM {{ns}}.dag_run r
 WHERE r.created_at > statement_timestamp() - interval '1 hour'
 GROUP BY 2

-- web_asset_event_by_key --
-- The event of asset :asset_id registered with idempotency key :idempotency_key, if any
-- (assetq.web, /assets/<name>?key=): at most one row, read by the unique index
-- asset_event_idempotency_key (asset_id, idempotency_key). Columns: as asset_events_page.
SELECT e.id AS event_id, e.asset_id, a.name AS asset_name, a.uri AS asset_uri,
       e."timestamp" AS event_timestamp, e.extra, e.source_dag_id, e.source_task_id,
       e.source_run_id, e.source_map_index, e.partition_key,
       coalesce((SELECT json_agg(al.name ORDER BY al.name)
                   FROM {{ns}}.asset_event_alias ea
                   JOIN {{ns}}.asset_alias al ON al.id = ea.alias_id
                  WHERE ea.asset_event_id = e.id)::text, '[]') AS aliases
  FROM {{ns}}.asset_event e
  JOIN {{ns}}.asset a ON a.id = e.asset_id
 WHERE e.asset_id = :asset_id
   AND e.idempotency_key = CAST(:idempotency_key AS text)

-- web_asset_aliases --
-- The aliases asset :asset_id was registered through (assetq.web, /assets/<name>), by name, at
-- most :limit: the asset's rows of asset_alias_asset, read by asset_alias_asset_asset_idx, as
-- many as its aliases whatever the history.
SELECT al.name AS alias_name
  FROM {{ns}}.asset_alias_asset aa
  JOIN {{ns}}.asset_alias al ON al.id = aa.alias_id
 WHERE aa.asset_id = :asset_id
 ORDER BY al.name
 LIMIT :limit
