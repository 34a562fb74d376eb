-- Every statement the Python layer sends to MySQL/MariaDB, by name.
-- Each query starts with a "-- name --" line and a one-line description; parameters are
-- SQLAlchemy binds (:name); {{ns}} is the backquoted namespace (a MySQL database).
-- sql/postgresql/queries.sql has the same names with the same parameters and result columns.
--
-- CALL takes arguments by position only (MySQL has no named arguments): the order is the
-- procedure's parameter order in schema.sql. A CALL that returns a result set leaves one more
-- (its status) behind; the dialect drains it before the connection is used again.

-- register_event --
-- Register one event in the caller's transaction; the trigger fans it out.
CALL {{ns}}.register_event(:asset, :extra, :source_dag_id, :source_task_id, :source_run_id,
                           :source_map_index, :idempotency_key)

-- register_events --
-- Register a batch of events (a JSON array) in the caller's transaction; one row per item.
CALL {{ns}}.register_events(:events)

-- register_event_v2 --
-- register_event with two more result columns, always NULL here: errors are raised, and undo
-- the one writing statement only (PostgreSQL's reports them there).
CALL {{ns}}.register_event_v2(:asset, :extra, :source_dag_id, :source_task_id, :source_run_id,
                              :source_map_index, :idempotency_key)

-- register_events_v2 --
-- register_events under the routine's own savepoint (an error leaves the caller's transaction
-- as it was), with two more result columns, always NULL here: errors are raised.
CALL {{ns}}.register_events_v2(:events)

-- declare_asset --
-- Create an asset, or update the uri/extra of an existing one; returns its id.
CALL {{ns}}.declare_asset(:name, :uri, :extra)

-- declare_dag --
-- Create or replace a consumer, its compiled condition, its caps, paused and retry options.
CALL {{ns}}.declare_dag(:dag_id, :condition, :clauses, :paused, :max_active_runs,
                        :max_events_per_run, :queue_while_paused, :max_attempts,
                        :retry_delay_seconds, :max_retry_delay_seconds)

-- set_dag_partitions --
-- Set a consumer's partitioning (NULL: unpartitioned), right after its declare_dag.
CALL {{ns}}.set_dag_partitions(:dag_id, :partitions)

-- dag_partitioned --
-- Is consumer :dag_id declared, and partitioned? No row for an unknown consumer.
SELECT d.partitioning IS NOT NULL AS partitioned FROM {{ns}}.dag d WHERE d.dag_id = :dag_id

-- unkeyed_recent_events --
-- Of the namespace's :window most recent events (its timestamp index, read backwards: the
-- cost is the window's, never the history's), how many are of each asset consumer :dag_id is
-- scheduled on and carry no partition key: the producers a partitioned declaration would
-- break (their next events refused, UnmappablePartition).
SELECT a.name AS asset_name, COUNT(*) AS unkeyed
  FROM (SELECT e.asset_id, e.partition_key
          FROM {{ns}}.asset_event e
         ORDER BY e.`timestamp` DESC, e.id DESC
         LIMIT :window) e
  JOIN {{ns}}.dag_schedule_asset_reference r ON r.asset_id = e.asset_id AND r.dag_id = :dag_id
  JOIN {{ns}}.asset a ON a.id = e.asset_id
 WHERE e.partition_key IS NULL
 GROUP BY a.name
 ORDER BY a.name

-- set_dag_paused --
-- Pause or unpause a consumer.
CALL {{ns}}.set_dag_paused(:dag_id, :paused)

-- scheduler_transaction --
-- First statement of a scheduler pass's transaction: the pass must run at READ COMMITTED
-- (see schedule_pass in schema.sql), whatever the session's default level is.
SET TRANSACTION ISOLATION LEVEL READ COMMITTED

-- schedule_pass --
-- One scheduler pass over at most :limit consumers; returns the runs it created.
CALL {{ns}}.schedule_pass_v2(:limit, NULL, 0)

-- set_run_state --
-- Move a run to another state; returns the run (the get_run columns).
CALL {{ns}}.set_run_state(:dag_id, :run_id, :state)

-- delete_dag --
-- Remove a consumer with its queue, condition, runs and links (no result set).
CALL {{ns}}.delete_dag(:dag_id)

-- delete_asset --
-- Remove an asset that no condition names, with its events; returns how many events went.
CALL {{ns}}.delete_asset(:asset)

-- get_run --
-- One run of a consumer by run id (no row when there is none).
SELECT r.id AS dag_run_id, r.dag_id, r.run_id, r.seq, r.state, r.run_after, r.created_at,
       r.started_at, r.ended_at, r.triggering_event_id, r.event_count, r.attempt, r.worker,
       r.lease_until, r.not_before, r.error, r.partition_key, r.deadline
  FROM {{ns}}.dag_run r
 WHERE r.dag_id = :dag_id AND r.run_id = :run_id

-- runs_page --
-- A page of a consumer's runs, newest first: seq below :before_seq (NULL: from the newest),
-- in state :state (NULL: any). Read backwards along the (dag_id, seq) key.
SELECT r.id AS dag_run_id, r.dag_id, r.run_id, r.seq, r.state, r.run_after, r.created_at,
       r.started_at, r.ended_at, r.triggering_event_id, r.event_count, r.attempt, r.worker,
       r.lease_until, r.not_before, r.error, r.partition_key, r.deadline
  FROM {{ns}}.dag_run r
 WHERE r.dag_id = :dag_id
   AND (:state IS NULL OR r.state = :state)
   AND (:before_seq IS NULL OR r.seq < :before_seq)
 ORDER BY r.seq DESC
 LIMIT :limit

-- runs_page_all --
-- A page of every consumer's runs, newest (highest id) first: id below :before_id (NULL: from
-- the newest), in state :state (NULL: any). With a state it reads dag_run_state_idx
-- backwards (the driver inlines the parameters, so the NULL tests fold away).
SELECT r.id AS dag_run_id, r.dag_id, r.run_id, r.seq, r.state, r.run_after, r.created_at,
       r.started_at, r.ended_at, r.triggering_event_id, r.event_count, r.attempt, r.worker,
       r.lease_until, r.not_before, r.error, r.partition_key, r.deadline
  FROM {{ns}}.dag_run r
 WHERE (:state IS NULL OR r.state = :state)
   AND (:before_id IS NULL OR r.id < :before_id)
 ORDER BY r.id DESC
 LIMIT :limit

-- claim_runs --
-- Claim up to :limit runs for worker :worker with a lease of :lease_seconds and a default
-- timeout of :timeout_seconds (NULL: none) (own READ COMMITTED transaction); :dag_ids is a
-- JSON array of dag ids or NULL.
CALL {{ns}}.claim_runs_v2(:worker, :limit, :lease_seconds, :dag_ids, :timeout_seconds)

-- schedule_and_claim --
-- A pass over the consumers :dag_ids, waiting up to :wait_seconds for one another pass
-- holds, then claim_runs, in one call (own READ COMMITTED transaction).
CALL {{ns}}.schedule_and_claim(:worker, :limit, :lease_seconds, :dag_ids, :timeout_seconds,
                               :wait_seconds)

-- heartbeat_run --
-- Renew the lease of a run held at :attempt by the claim made at :started_at; returns the
-- new end of the lease.
CALL {{ns}}.heartbeat_run_v2(:dag_id, :run_id, :attempt, :lease_seconds, :started_at)

-- complete_run --
-- Finish attempt :attempt of a run, claimed at :started_at, as :state (success with output
-- :events, or failed with :error) in the caller's transaction; returns the run.
CALL {{ns}}.complete_run_v2(:dag_id, :run_id, :attempt, :state, :error, :events, :started_at)

-- retry_run --
-- Put a failed run back in the queue as its next attempt; returns the run.
CALL {{ns}}.retry_run(:dag_id, :run_id)

-- cancel_run --
-- Cancel a queued or running run, fencing its holder; returns the run.
CALL {{ns}}.cancel_run(:dag_id, :run_id, :reason)

-- set_dag_timeout --
-- A consumer's timeout in seconds (NULL: none), in the caller's transaction.
CALL {{ns}}.set_dag_timeout(:dag_id, :timeout_seconds)

-- queued_events_page --
-- A page of the events queued for a consumer, oldest first (the order max_events_per_run
-- consumes them in): after (:after_timestamp, :after_id), or from the oldest when NULL.
-- aliases is a JSON array of the names of the aliases the event came through, sorted.
-- MySQL 8 / MariaDB: JSON_ARRAYAGG takes no ORDER BY on MySQL, so the array is built with
-- GROUP_CONCAT, whose result MySQL cuts at group_concat_max_len (1024 by default): SET_VAR
-- raises it for this statement (MySQL >= 8.0.3; MariaDB, whose default is 1 MiB, more than
-- 100 names of 512 characters need, takes the hint for a comment). The row comparison
-- (a, b) > (x, y) is spelled out.
SELECT /*+ SET_VAR(group_concat_max_len = 1073741824) */
       e.id AS event_id, e.asset_id, a.name AS asset_name, a.uri AS asset_uri,
       e.`timestamp` AS event_timestamp, e.extra, e.source_dag_id, e.source_task_id,
       e.source_run_id, e.source_map_index, e.partition_key,
       COALESCE((SELECT CONCAT('[', GROUP_CONCAT(JSON_QUOTE(al.name) ORDER BY al.name SEPARATOR ','), ']')
                   FROM {{ns}}.asset_event_alias ea
                   JOIN {{ns}}.asset_alias al ON al.id = ea.alias_id
                  WHERE ea.asset_event_id = e.id), '[]') AS aliases
  FROM {{ns}}.asset_dag_run_queue q
  JOIN {{ns}}.asset_event e ON e.id = q.asset_event_id
  JOIN {{ns}}.asset a ON a.id = e.asset_id
 WHERE q.target_dag_id = :dag_id
   AND (:after_timestamp IS NULL
        OR q.created_at > :after_timestamp
        OR (q.created_at = :after_timestamp AND q.asset_event_id > :after_id))
 ORDER BY q.created_at, q.asset_event_id
 LIMIT :limit

-- consumed_events_page --
-- A page of the events a run consumed, by event id, after :after_id (NULL: from the first).
-- The same columns as queued_events_page (see there for aliases).
SELECT /*+ SET_VAR(group_concat_max_len = 1073741824) */
       e.id AS event_id, e.asset_id, a.name AS asset_name, a.uri AS asset_uri,
       e.`timestamp` AS event_timestamp, e.extra, e.source_dag_id, e.source_task_id,
       e.source_run_id, e.source_map_index, e.partition_key,
       COALESCE((SELECT CONCAT('[', GROUP_CONCAT(JSON_QUOTE(al.name) ORDER BY al.name SEPARATOR ','), ']')
                   FROM {{ns}}.asset_event_alias ea
                   JOIN {{ns}}.asset_alias al ON al.id = ea.alias_id
                  WHERE ea.asset_event_id = e.id), '[]') AS aliases
  FROM {{ns}}.dag_run r
  JOIN {{ns}}.dagrun_asset_event l ON l.dag_run_id = r.id AND l.dag_id = r.dag_id
  JOIN {{ns}}.asset_event e ON e.id = l.asset_event_id
  JOIN {{ns}}.asset a ON a.id = e.asset_id
 WHERE r.dag_id = :dag_id AND r.run_id = :run_id
   AND (:after_id IS NULL OR l.asset_event_id > :after_id)
 ORDER BY l.asset_event_id
 LIMIT :limit

-- create_namespace --
-- Create the database that holds every assetq object (kept as it is when it exists).
CREATE DATABASE IF NOT EXISTS {{ns}} CHARACTER SET utf8mb4 COLLATE utf8mb4_bin

-- lock_namespace --
-- Serialize installs and uninstalls of one namespace. A named lock, not a row lock: every
-- DDL statement commits, which would release a row lock half-way. It belongs to the session
-- and is released by unlock_namespace. Names are limited to 64 characters; two namespaces
-- that share a long prefix merely share the lock.
SELECT GET_LOCK(LEFT(CONCAT('assetq:', :namespace), 64), 600) AS locked

-- unlock_namespace --
-- Release the lock taken by lock_namespace.
SELECT RELEASE_LOCK(LEFT(CONCAT('assetq:', :namespace), 64)) AS released

-- namespace_exists --
-- 1 when the namespace exists.
SELECT COUNT(*) AS n FROM information_schema.SCHEMATA WHERE SCHEMA_NAME = {{database}}

-- version_table_exists --
-- 1 when alembic's version table exists in the namespace.
SELECT COUNT(*) AS n
  FROM information_schema.TABLES
 WHERE TABLE_SCHEMA = {{database}} AND TABLE_NAME = '{{prefix}}assetq_alembic_version'
   AND TABLE_TYPE = 'BASE TABLE'

-- drop_version_table --
-- Remove alembic's version table after a downgrade to base.
DROP TABLE IF EXISTS {{ns}}.assetq_alembic_version

-- namespace_object_count --
-- How many objects (tables, views, routines, triggers, events) are left in the namespace,
-- plus one when the namespace is the connection's own database: a user with a single
-- database installs assetq into it, and uninstall must never drop that database. The install
-- lock of a Galera cluster (lifecycle.sql, take_install_lock) is not counted: the uninstall
-- holding it drops the namespace with it. A namespace with a table prefix (appdb.assetq_)
-- counts the objects with the prefix only, plus one: its database is the application's and
-- is never dropped.
SELECT (SELECT COUNT(*) FROM information_schema.TABLES
         WHERE TABLE_SCHEMA = {{database}} AND TABLE_NAME <> '{{prefix}}assetq_install_lock'
           AND LEFT(TABLE_NAME, CHAR_LENGTH('{{prefix}}')) = '{{prefix}}')
     + (SELECT COUNT(*) FROM information_schema.ROUTINES
         WHERE ROUTINE_SCHEMA = {{database}} AND LEFT(ROUTINE_NAME, CHAR_LENGTH('{{prefix}}')) = '{{prefix}}')
     + (SELECT COUNT(*) FROM information_schema.TRIGGERS
         WHERE TRIGGER_SCHEMA = {{database}} AND LEFT(TRIGGER_NAME, CHAR_LENGTH('{{prefix}}')) = '{{prefix}}')
     + (SELECT COUNT(*) FROM information_schema.EVENTS
         WHERE EVENT_SCHEMA = {{database}} AND LEFT(EVENT_NAME, CHAR_LENGTH('{{prefix}}')) = '{{prefix}}')
     + (CASE WHEN DATABASE() = {{database}} OR '{{prefix}}' <> '' THEN 1 ELSE 0 END) AS n

-- drop_namespace --
-- Drop the (empty) database. MySQL has no RESTRICT: DROP DATABASE drops whatever is inside,
-- so assetq.uninstall runs this only after namespace_object_count found nothing.
DROP DATABASE IF EXISTS {{ns}}

-- listen --
-- MySQL has no LISTEN/NOTIFY: never sent (Dialect.supports_notify is false); schedulers poll.
SELECT 0 AS listening

-- workers_listen_mark --
-- Workers do not listen on MySQL (no notifications): never sent.
SELECT 0 AS marked

-- workers_listening --
-- Workers do not listen on MySQL (no notifications): never sent.
SELECT 0 AS listening

-- dag_queue_status --
-- One row per consumer from the dag_queue_status view: queue depth, oldest queued, recent runs.
SELECT dag_id, is_paused, queued_events, oldest_queued_at, oldest_queued_age_seconds,
       runs_last_hour, last_run_at, runs_total, last_scheduled_at, max_active_runs, active_runs,
       running_runs, oldest_lease_until, expired_leases, retrying_runs, failed_runs, max_attempts
  FROM {{ns}}.dag_queue_status
 ORDER BY dag_id

-- dag_queue_status_hashed --
-- MariaDB: dag_queue_status with hashed join buffers (join_cache_level 6, for this statement
-- alone). The view joins two grouped derived tables (active runs, queue) to every consumer;
-- MariaDB's default buffers (level 2, no key on a derived table) compare every consumer with
-- every group: 144 ms at 1,000 consumers, 58 ms hashed (benchmarks/web_pages.py). MySQL 8
-- hashes such joins by itself and has no join_cache_level: it reads dag_queue_status.
SET STATEMENT join_cache_level = 6 FOR
SELECT dag_id, is_paused, queued_events, oldest_queued_at, oldest_queued_age_seconds,
       runs_last_hour, last_run_at, runs_total, last_scheduled_at, max_active_runs, active_runs,
       running_runs, oldest_lease_until, expired_leases, retrying_runs, failed_runs, max_attempts
  FROM {{ns}}.dag_queue_status
 ORDER BY dag_id

-- unexamined_consumers --
-- How many unpaused consumers with queued events no pass has examined since :since (the
-- database's clock, from server_clock)? The scheduler loop passes again while there are and
-- their number goes down: a pass examines at most :limit consumers, and may have found
-- nothing while a ready one waits further on. On MySQL a pass records when it examined a
-- consumer in its lock row (dag_lock.last_scheduled_at), never in the dag row. Queued rows
-- are probed once per consumer by key, as schedule_pass does: MariaDB 10.11 answered an
-- EXISTS here by materializing every queued row's consumer (100,020 index entries read for
-- 1,001 consumers over 100,000 queued rows), a scalar subquery is never flattened.
SELECT COUNT(*) AS behind
  FROM {{ns}}.dag d
  JOIN {{ns}}.dag_lock l ON l.dag_id = d.dag_id
 WHERE NOT d.is_paused
   AND (l.last_scheduled_at IS NULL OR l.last_scheduled_at < :since)
   AND CASE WHEN d.partitioning IS NULL
            THEN (SELECT q.target_dag_id
                    FROM {{ns}}.asset_dag_run_queue q FORCE INDEX (PRIMARY)
                   WHERE q.target_dag_id = d.dag_id
                   LIMIT 1)
            -- A partitioned consumer waits for a pass only when a row arrived that no pass
            -- has examined (as in schedule_pass).
            ELSE (SELECT p.target_dag_id
                    FROM {{ns}}.asset_partition_queue p FORCE INDEX (asset_partition_queue_new_idx)
                   WHERE p.target_dag_id = d.dag_id AND p.examined = FALSE
                   LIMIT 1)
       END IS NOT NULL

-- server_clock --
-- The database's current time (UTC, as every DATETIME(6) assetq writes): when a scheduler
-- round starts.
SELECT UTC_TIMESTAMP(6) AS now

-- purge_cutoff --
-- The cutoff of a purge: the server's current UTC time minus :seconds (one clock for every batch).
SELECT UTC_TIMESTAMP(6) - INTERVAL CAST(ROUND(:seconds * 1000000) AS SIGNED) MICROSECOND AS cutoff

-- purge_runs --
-- Delete one batch of runs created before :older_than, with their links.
CALL {{ns}}.purge_runs(:older_than, :batch_size)

-- purge_events --
-- Examine the next batch of events before :older_than after the cursor; delete the consumed ones.
CALL {{ns}}.purge_events(:older_than, :batch_size, :after_timestamp, :after_id)

-- process_heartbeat --
-- Record that loop :process_id (a scheduler or worker) is alive now, by the database's clock
-- (a short transaction of its own, never a pass's or a run's). No result set.
CALL {{ns}}.process_heartbeat(:process_id, :kind, :name, :host, :pid, :version, :interval_seconds)

-- process_gone --
-- Delete loop :process_id's liveness row: it stopped cleanly. No result set.
CALL {{ns}}.process_gone(:process_id)

-- process_handles --
-- Record the consumers worker :process_id has handlers for (:dag_ids, a JSON array), in its
-- heartbeat's transaction; returns those that name no declared consumer (unknown_dag_id).
CALL {{ns}}.process_handles(:process_id, :dag_ids)

-- purge_process_dags --
-- Delete the consumers of processes that have no liveness row any more (purge_processes
-- deleted it, or a process_gone of an older package did): a handful of rows, one per live
-- worker and handler, read whole.
DELETE p FROM {{ns}}.process_dag p
 WHERE NOT EXISTS (SELECT 1 FROM {{ns}}.process_liveness l WHERE l.process_id = p.process_id)

-- worker_coverage --
-- Per consumer with queued runs or expired leases: how many of each; how long its oldest
-- claimable queued run has waited since it became claimable (its not_before: a retry's delay
-- is not waiting) and how many have waited longer than :stuck_seconds; how many live workers
-- (liveness rows not stale by :stale_intervals, as in processes) have a handler for it.
-- Reads the active runs only, by dag_run_state_idx, never the history.
SELECT r.dag_id,
       SUM(r.state = 'queued') AS queued_runs,
       SUM(r.state = 'running' AND r.lease_until < UTC_TIMESTAMP(6)) AS expired_runs,
       TIMESTAMPDIFF(MICROSECOND,
                     MIN(CASE WHEN r.state = 'queued' AND r.not_before <= UTC_TIMESTAMP(6)
                              THEN r.not_before END),
                     UTC_TIMESTAMP(6)) / 1000000 AS oldest_queued_run_age_seconds,
       SUM(r.state = 'queued'
           AND r.not_before < UTC_TIMESTAMP(6)
               - INTERVAL CAST(ROUND(:stuck_seconds * 1000000) AS SIGNED) MICROSECOND)
           AS stuck_runs,
       (SELECT COUNT(*)
          FROM {{ns}}.process_dag p
          JOIN {{ns}}.process_liveness l ON l.process_id = p.process_id
         WHERE p.dag_id = r.dag_id
           AND l.kind = 'worker'
           AND l.last_seen_at >= UTC_TIMESTAMP(6)
               - INTERVAL CAST(ROUND(l.interval_seconds * :stale_intervals * 1000000) AS SIGNED) MICROSECOND)
           AS live_workers
  FROM {{ns}}.dag_run r
 WHERE r.state IN ('queued', 'running')
 GROUP BY r.dag_id
 ORDER BY r.dag_id

-- processes --
-- Every scheduler and worker loop of the liveness table, with how long ago it was last seen
-- (database clock, UTC) and whether that is more than :stale_intervals of its intervals ago.
SELECT l.process_id, l.kind, l.name, l.host, l.pid, l.version, l.interval_seconds,
       l.started_at, l.last_seen_at,
       TIMESTAMPDIFF(MICROSECOND, l.last_seen_at, UTC_TIMESTAMP(6)) / 1000000 AS last_seen_age_seconds,
       l.last_seen_at < UTC_TIMESTAMP(6)
           - INTERVAL CAST(ROUND(l.interval_seconds * :stale_intervals * 1000000) AS SIGNED) MICROSECOND
           AS stale
  FROM {{ns}}.process_liveness l
 ORDER BY l.kind, l.host, l.pid, l.started_at, l.process_id

-- purge_processes --
-- Delete the liveness rows last seen before :older_than (killed loops) that are stale too: not
-- seen for :stale_intervals of their own intervals. A live loop's row is never deleted, whatever
-- the cutoff (purge --older-than 0s took every live one, and status lost them until their next
-- heartbeat); the test is the processes query's "stale".
DELETE FROM {{ns}}.process_liveness
 WHERE last_seen_at < :older_than
   AND last_seen_at < UTC_TIMESTAMP(6)
       - INTERVAL CAST(ROUND(interval_seconds * :stale_intervals * 1000000) AS SIGNED) MICROSECOND

-- old_processes --
-- How many liveness rows purge_processes would delete (purge --dry-run): the same test.
SELECT COUNT(*) AS processes
  FROM {{ns}}.process_liveness l
 WHERE l.last_seen_at < :older_than
   AND l.last_seen_at < UTC_TIMESTAMP(6)
       - INTERVAL CAST(ROUND(l.interval_seconds * :stale_intervals * 1000000) AS SIGNED) MICROSECOND

-- grant_access --
-- Give an existing account one kind of access: producer, scheduler, worker or reader.
CALL {{ns}}.grant_access(:access, :grantee, :host)

-- revoke_access --
-- Take every kind of access grant_access gave an account away again.
CALL {{ns}}.revoke_access(:grantee, :host)

-- namespace_objects --
-- Every table, view, routine and trigger in the namespace as (kind, name, detail). MySQL
-- cannot disable a trigger: they are always enabled. With a table prefix: the objects named
-- with it, by their names without it (the names assetq's scripts give them).
SELECT CASE t.TABLE_TYPE WHEN 'VIEW' THEN 'view' ELSE 'table' END AS kind,
       SUBSTRING(t.TABLE_NAME, CHAR_LENGTH('{{prefix}}') + 1) AS name, NULL AS detail
  FROM information_schema.TABLES t
 WHERE t.TABLE_SCHEMA = {{database}} AND LEFT(t.TABLE_NAME, CHAR_LENGTH('{{prefix}}')) = '{{prefix}}'
UNION ALL
SELECT 'routine', SUBSTRING(r.ROUTINE_NAME, CHAR_LENGTH('{{prefix}}') + 1), NULL
  FROM information_schema.ROUTINES r
 WHERE r.ROUTINE_SCHEMA = {{database}} AND LEFT(r.ROUTINE_NAME, CHAR_LENGTH('{{prefix}}')) = '{{prefix}}'
UNION ALL
SELECT 'trigger', SUBSTRING(g.TRIGGER_NAME, CHAR_LENGTH('{{prefix}}') + 1), 'enabled'
  FROM information_schema.TRIGGERS g
 WHERE g.TRIGGER_SCHEMA = {{database}} AND LEFT(g.TRIGGER_NAME, CHAR_LENGTH('{{prefix}}')) = '{{prefix}}'
 ORDER BY 1, 2

-- routine_security --
-- Per routine: whose rights it runs with (DEFINER or INVOKER), its definer, whether that is a
-- superuser (NULL: MySQL cannot tell) and its pinned settings (none on MySQL).
SELECT SUBSTRING(r.ROUTINE_NAME, CHAR_LENGTH('{{prefix}}') + 1) AS name, r.SECURITY_TYPE AS security, r.DEFINER AS owner,
       NULL AS owner_is_superuser, NULL AS config
  FROM information_schema.ROUTINES r
 WHERE r.ROUTINE_SCHEMA = {{database}} AND LEFT(r.ROUTINE_NAME, CHAR_LENGTH('{{prefix}}')) = '{{prefix}}'
 ORDER BY 1

-- account_exists --
-- 1 when the 'user@host' account (PostgreSQL: the role) exists. Needs SELECT on mysql.user.
SELECT COUNT(*) AS n FROM mysql.user u WHERE CONCAT(u.User, '@', u.Host) = :account

-- server_settings --
-- Server facts doctor reports, as (name, value): the defaults a new session gets.
-- MySQL 8 / MariaDB: MySQL 8 calls the isolation variable transaction_isolation, MariaDB
-- before 11.1 tx_isolation; SHOW lists whichever exists (SELECT @@x fails on the other).
SHOW GLOBAL VARIABLES
 WHERE Variable_name IN ('version', 'tx_isolation', 'transaction_isolation', 'time_zone',
                         'system_time_zone')

-- current_privileges --
-- What the connected account may do with assetq (each NULL where the engine cannot tell:
-- MySQL keeps routine privileges in mysql.procs_priv, which few accounts may read).
SELECT CURRENT_USER() AS account, NULL AS can_register, NULL AS can_schedule,
       NULL AS can_read_status

-- can_operate --
-- Whether the account may retry, cancel and pause: MySQL keeps routine rights where an account
-- may not always read them (mysql.procs_priv), so NULL, unknown.
SELECT NULL AS can_operate

-- deployment_settings --
-- What doctor checks about the deployment, as (name, value), as new sessions get them:
-- binary logging in STATEMENT format makes InnoDB refuse writes at READ COMMITTED (error
-- 1665, every pass fails); read_only refuses the writes of accounts without READ ONLY ADMIN
-- or SUPER (docs/deployment.md).
SHOW GLOBAL VARIABLES
 WHERE Variable_name IN ('log_bin', 'binlog_format', 'read_only')

-- backend_pid --
-- The server thread of this session (the PostgreSQL twin tells a pooled session apart).
SELECT CONNECTION_ID() AS pid

-- dags_page --
-- The operator's list of consumers (assetq dags), by dag id after :after_dag_id (NULL: from
-- the first), or the one consumer :dag_id: its declaration, its queue depth and oldest queued
-- event (database clock, UTC), its queued and running runs. The counts read the pending
-- queue and the active runs of each consumer by index, never the history.
SELECT d.dag_id, d.`condition`, d.is_paused, d.max_active_runs, d.max_events_per_run,
       d.max_attempts, d.retry_delay_seconds, d.max_retry_delay_seconds, d.timeout_seconds,
       d.partitioning IS NOT NULL AS partitioned,
       (SELECT COUNT(*) FROM {{ns}}.asset_dag_run_queue q
         WHERE q.target_dag_id = d.dag_id) AS queued_events,
       (SELECT MIN(q.created_at) FROM {{ns}}.asset_dag_run_queue q
         WHERE q.target_dag_id = d.dag_id) AS oldest_queued_at,
       TIMESTAMPDIFF(MICROSECOND,
                     (SELECT MIN(q.created_at) FROM {{ns}}.asset_dag_run_queue q
                       WHERE q.target_dag_id = d.dag_id),
                     UTC_TIMESTAMP(6)) / 1000000 AS oldest_queued_age_seconds,
       (SELECT COUNT(*) FROM {{ns}}.dag_run r
         WHERE r.dag_id = d.dag_id AND r.state = 'queued') AS queued_runs,
       (SELECT COUNT(*) FROM {{ns}}.dag_run r
         WHERE r.dag_id = d.dag_id AND r.state = 'running') AS running_runs
  FROM {{ns}}.dag d
 WHERE (:dag_id IS NULL OR d.dag_id = :dag_id)
   AND (:after_dag_id IS NULL OR d.dag_id > :after_dag_id)
 ORDER BY d.dag_id
 LIMIT :limit

-- run_outputs_page --
-- A page of the events whose source is run :run_id of :dag_id (a success's output events),
-- by id after :after_id (NULL: from the first), among the events registered between
-- :from_timestamp and :to_timestamp (its last attempt's start and a little after its end):
-- no index leads by source, so the read is a range of asset_event_timestamp_idx that the
-- attempt's own duration bounds, never the history. aliases: see queued_events_page.
SELECT /*+ SET_VAR(group_concat_max_len = 1073741824) */
       e.id AS event_id, e.asset_id, a.name AS asset_name, a.uri AS asset_uri,
       e.`timestamp` AS event_timestamp, e.extra, e.source_dag_id, e.source_task_id,
       e.source_run_id, e.source_map_index, e.partition_key,
       COALESCE((SELECT CONCAT('[', GROUP_CONCAT(JSON_QUOTE(al.name) ORDER BY al.name SEPARATOR ','), ']')
                   FROM {{ns}}.asset_event_alias ea
                   JOIN {{ns}}.asset_alias al ON al.id = ea.alias_id
                  WHERE ea.asset_event_id = e.id), '[]') AS aliases
  FROM {{ns}}.asset_event e
  JOIN {{ns}}.asset a ON a.id = e.asset_id
 WHERE e.`timestamp` >= :from_timestamp
   AND e.`timestamp` <= :to_timestamp
   AND e.source_dag_id = :dag_id AND e.source_run_id = :run_id
   AND (:after_id IS NULL OR e.id > :after_id)
 ORDER BY e.id
 LIMIT :limit

-- run_attempts_page --
-- The ended attempts of run :dag_run_id (dag_run_attempt, written by the trigger
-- dag_run_attempt_end), newest first, before attempt :before_attempt (NULL: from the newest),
-- at most :limit: a range of the table's primary key.
SELECT attempt, worker, started_at, ended_at, outcome, error
  FROM {{ns}}.dag_run_attempt
 WHERE dag_run_id = :dag_run_id
   AND (:before_attempt IS NULL OR attempt < :before_attempt)
 ORDER BY attempt DESC
 LIMIT :limit

-- pending_partitions_page --
-- A partitioned consumer's pending partitions: the keys of its partition queue after
-- :after_key (NULL: from the first), at most :limit, each with its queued events, the names
-- of the assets they are events of (a JSON array), and when the oldest arrived. By
-- asset_partition_queue_key_idx, key by key: the rows read are the listed keys' own.
SELECT /*+ SET_VAR(group_concat_max_len = 1073741824) */
       q.partition_key, COUNT(*) AS events, MIN(q.created_at) AS oldest_queued_at,
       CONCAT('[', GROUP_CONCAT(DISTINCT JSON_QUOTE(a.name) ORDER BY a.name SEPARATOR ','), ']')
           AS asset_names
  FROM {{ns}}.asset_partition_queue q
  JOIN {{ns}}.asset a ON a.id = q.asset_id
 WHERE q.target_dag_id = :dag_id
   AND (:after_key IS NULL OR q.partition_key > :after_key)
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
-- timestamp, database clock, UTC) and before (:before_timestamp, :before_id) (NULL: from the
-- newest). The window bounds the read: no index orders one asset's events, so this walks
-- asset_event_timestamp_idx backwards (or the asset's own events, when it has few).
-- aliases: see queued_events_page.
SELECT /*+ SET_VAR(group_concat_max_len = 1073741824) */
       e.id AS event_id, e.asset_id, a.name AS asset_name, a.uri AS asset_uri,
       e.`timestamp` AS event_timestamp, e.extra, e.source_dag_id, e.source_task_id,
       e.source_run_id, e.source_map_index, e.partition_key,
       COALESCE((SELECT CONCAT('[', GROUP_CONCAT(JSON_QUOTE(al.name) ORDER BY al.name SEPARATOR ','), ']')
                   FROM {{ns}}.asset_event_alias ea
                   JOIN {{ns}}.asset_alias al ON al.id = ea.alias_id
                  WHERE ea.asset_event_id = e.id), '[]') AS aliases
  FROM {{ns}}.asset_event e
  JOIN {{ns}}.asset a ON a.id = e.asset_id
 WHERE e.asset_id = :asset_id
   AND e.`timestamp` >= UTC_TIMESTAMP(6)
       - INTERVAL CAST(ROUND(:since_seconds * 1000000) AS SIGNED) MICROSECOND
   AND (:before_timestamp IS NULL
        OR e.`timestamp` < :before_timestamp
        OR (e.`timestamp` = :before_timestamp AND e.id < :before_id))
 ORDER BY e.`timestamp` DESC, e.id DESC
 LIMIT :limit

-- web_assets_page --
-- The console's asset list (assetq.web, /assets): the assets by name after :after_name (NULL:
-- from the first), at most :limit, each with how many consumers name it (counted on the
-- reference table's primary key, which starts with the asset).
SELECT a.id AS asset_id, a.name AS asset_name, a.uri AS asset_uri,
       (SELECT COUNT(*) FROM {{ns}}.dag_schedule_asset_reference r
         WHERE r.asset_id = a.id) AS consumers
  FROM {{ns}}.asset a
 WHERE :after_name IS NULL OR a.name > :after_name
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
   AND (:after_dag_id IS NULL OR r.dag_id > :after_dag_id)
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
-- asset_event_timestamp_idx (`timestamp`, id), runs a range of dag_run_created_idx (created_at);
-- what they read grows with the last hour's rate only. UTC_TIMESTAMP(6) is the statement's
-- start, one value for the whole statement.
SELECT 'events' AS series,
       CAST(LEAST(59, GREATEST(0, FLOOR(TIMESTAMPDIFF(MICROSECOND, e.`timestamp`, UTC_TIMESTAMP(6)) / 60000000))) AS SIGNED) AS minutes_ago,
       COUNT(*) AS n
  FROM {{ns}}.asset_event e
 WHERE e.`timestamp` > UTC_TIMESTAMP(6) - INTERVAL 1 HOUR
 GROUP BY minutes_ago
UNION ALL
SELECT 'runs' AS series,
       CAST(LEAST(59, GREATEST(0, FLOOR(TIMESTAMPDIFF(MICROSECOND, r.created_at, UTC_TIMESTAMP(6)) / 60000000))) AS SIGNED) AS minutes_ago,
       COUNT(*) AS n
  FROM {{ns}}.dag_run r
 WHERE r.created_at > UTC_TIMESTAMP(6) - INTERVAL 1 HOUR
 GROUP BY minutes_ago

-- web_asset_event_by_key --
-- The event of asset :asset_id registered with idempotency key :idempotency_key, if any
-- (assetq.web, /assets/<name>?key=): at most one row, read by the unique index
-- asset_event_idempotency_key (asset_id, idempotency_key). Columns: as asset_events_page.
SELECT /*+ SET_VAR(group_concat_max_len = 1073741824) */
       e.id AS event_id, e.asset_id, a.name AS asset_name, a.uri AS asset_uri,
       e.`timestamp` AS event_timestamp, e.extra, e.source_dag_id, e.source_task_id,
       e.source_run_id, e.source_map_index, e.partition_key,
       COALESCE((SELECT CONCAT('[', GROUP_CONCAT(JSON_QUOTE(al.name) ORDER BY al.name SEPARATOR ','), ']')
                   FROM {{ns}}.asset_event_alias ea
                   JOIN {{ns}}.asset_alias al ON al.id = ea.alias_id
                  WHERE ea.asset_event_id = e.id), '[]') AS aliases
  FROM {{ns}}.asset_event e
  JOIN {{ns}}.asset a ON a.id = e.asset_id
 WHERE e.asset_id = :asset_id
   AND e.idempotency_key = :idempotency_key

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
