-- Statements of benchmarks/peers.py on PostgreSQL, by name (parsed like sql/*/queries.sql).
-- Sent through bare psycopg 3 on every side (%(name)s parameters), each one statement on an
-- autocommit connection unless peers.py says otherwise; {{ns}} is an assetq namespace.

-- ============================== assetq (its own routines) ================================

-- aq_register --
-- One event, fanned out by the trigger: what assetq.register_event sends.
SELECT event_id FROM {{ns}}.register_event(p_asset => %(asset)s)

-- aq_register_batch --
-- A batch of events in one call: what assetq.register_events sends.
SELECT count(*) FROM {{ns}}.register_events(CAST(%(events)s AS jsonb))

-- aq_fill --
-- Backlog, not timed: %(n)s events of one asset in one INSERT ... SELECT (the trigger queues
-- each for the asset's consumers, as a producer's events would be).
INSERT INTO {{ns}}.asset_event (asset_id)
SELECT a.id
  FROM generate_series(1, CAST(%(n)s AS integer)) AS g
  JOIN {{ns}}.asset a ON a.name = %(asset)s
 ORDER BY g

-- aq_pass --
-- One scheduler pass over the namespace's one consumer: what assetq.schedule sends (its
-- default limit is 100: a capped consumer gets up to 100 runs in a pass; limit 1 is one run
-- per pass, as every pass was before development schema 0011_runs_per_pass).
SELECT dag_run_id, event_ids FROM {{ns}}.schedule_pass(p_limit => %(limit)s)

-- aq_vacuum --
-- Dead rows of the previous slices gone and statistics fresh (autovacuum may be off).
VACUUM (ANALYZE) {{ns}}.asset_event, {{ns}}.asset_dag_run_queue, {{ns}}.dag_run,
       {{ns}}.dagrun_asset_event, {{ns}}.dag

-- ======================= producer profile: variants of the schema =========================
-- Each applied to a copy namespace of its own (never to a real one), to see what a part of
-- the producer path costs by measuring the path without it.

-- prof_no_notify --
-- Without the wake-up trigger on the queue.
DROP TRIGGER asset_dag_run_queue_notify ON {{ns}}.asset_dag_run_queue

-- prof_no_fk --
-- Without the foreign key a producer's rows check: the event's to its asset (the queue has
-- none since development schema 0013_queue_checks).
ALTER TABLE {{ns}}.asset_event DROP CONSTRAINT asset_event_asset_id_fkey

-- prof_no_claim_indexes --
-- Without the two queue indexes the capped claim reads (sql/postgresql/tables.sql).
DROP INDEX {{ns}}.asset_dag_run_queue_order_idx, {{ns}}.asset_dag_run_queue_asset_idx

-- prof_no_queue_indexes --
-- Without any secondary index of the queue (the capped claim's two and the purge's event
-- index).
DROP INDEX {{ns}}.asset_dag_run_queue_order_idx, {{ns}}.asset_dag_run_queue_asset_idx,
           {{ns}}.asset_dag_run_queue_event_idx

-- prof_unlogged --
-- Event and queue tables unlogged (no WAL). A logged table cannot reference an unlogged one:
-- the alias records' foreign key to asset_event goes first (not on the path; the links have
-- none since development schema 0012_link_checks).
ALTER TABLE {{ns}}.asset_event_alias DROP CONSTRAINT asset_event_alias_asset_event_id_fkey;
ALTER TABLE {{ns}}.asset_dag_run_queue SET UNLOGGED;
ALTER TABLE {{ns}}.asset_event SET UNLOGGED

-- prof_no_fan_out --
-- The statement trigger off: the client's single CTE (prof_cte_register) writes the rows.
ALTER TABLE {{ns}}.asset_event DISABLE TRIGGER asset_event_fan_out

-- prof_cte_register --
-- The same rows as register_event + the fan-out trigger, as one client CTE: the event, then one
-- queue row per consumer of its asset, the consumer and reference rows locked FOR KEY SHARE as
-- the trigger locks them (no plpgsql wrapper, no statement trigger, no alias probe).
WITH e AS (
    INSERT INTO {{ns}}.asset_event (asset_id)
    SELECT a.id FROM {{ns}}.asset a WHERE a.name = %(asset)s
    RETURNING id, asset_id, "timestamp"
)
INSERT INTO {{ns}}.asset_dag_run_queue (target_dag_id, asset_event_id, asset_id, created_at)
SELECT d.dag_id, e.id, e.asset_id, e."timestamp"
  FROM e
  JOIN {{ns}}.dag_schedule_asset_reference r ON r.asset_id = e.asset_id
  JOIN {{ns}}.dag d ON d.dag_id = r.dag_id
 WHERE NOT d.is_paused OR d.queue_while_paused
   FOR KEY SHARE OF d, r

-- aq_drop_copy --
-- A variant's namespace, gone (its altered schema is no longer what alembic would undo).
DROP SCHEMA IF EXISTS {{ns}} CASCADE

-- prof_raw_insert --
-- The event alone by a plain INSERT (the fan-out trigger writes the queue rows): what the
-- register_event routine adds is its asset lookup by name or uri, ON CONFLICT and RETURNING.
INSERT INTO {{ns}}.asset_event (asset_id)
SELECT a.id FROM {{ns}}.asset a WHERE a.name = %(asset)s

-- prof_lean_fan_out --
-- The fan-out trigger's function without its FOR KEY SHARE locks and its alias probe (since
-- development schema 0013_queue_checks no foreign-key check locks the dag row either: not a
-- safe schema, a measurement of what the locks cost).
CREATE OR REPLACE FUNCTION {{ns}}.asset_event_fan_out() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO {{ns}}.asset_dag_run_queue (target_dag_id, asset_event_id, asset_id, created_at)
    SELECT d.dag_id, e.id, e.asset_id, e."timestamp"
      FROM new_events e
      JOIN {{ns}}.dag_schedule_asset_reference r ON r.asset_id = e.asset_id
      JOIN {{ns}}.dag d ON d.dag_id = r.dag_id
     WHERE NOT d.is_paused OR d.queue_while_paused;
    RETURN NULL;
END
$$

-- prof_rows --
-- Rows per event of a namespace: events, queue rows (the variants must write the same rows).
SELECT (SELECT count(*) FROM {{ns}}.asset_event) AS events,
       (SELECT count(*) FROM {{ns}}.asset_dag_run_queue) AS queued

-- ====================== floors: the rows a missed target must write =======================
-- What bounds the targets assetq misses, measured beside PgQ: the least the queue's layout
-- (one queue row per consumer per event, one link per consumed event) writes, with none of
-- assetq's routines, locks or checks around it. Each timed on a namespace of its own: as
-- installed, or a copy with a part taken away (prof_no_fan_out, prof_no_queue_indexes).

-- floor_insert_batch --
-- %(n)s events of the assets a0..a3 in turn, in one plain INSERT (the trigger, where it is
-- on, fans them out): RETURNING counts the event rows written.
WITH ins AS (
    INSERT INTO {{ns}}.asset_event (asset_id)
    SELECT a.id
      FROM generate_series(0, CAST(%(n)s AS integer) - 1) AS g
      JOIN {{ns}}.asset a ON a.name = 'a' || mod(g, 4)
     ORDER BY g
    RETURNING 1
)
SELECT count(*) FROM ins

-- floor_run_writes --
-- A run's writes alone, for a whole backlog: one dag_run row, every queue row of consumer_0
-- deleted, a link per deleted row. No condition, no order, no claim guard, no run state: the
-- least any pass consuming the backlog writes in this layout.
WITH run AS (
    INSERT INTO {{ns}}.dag_run (dag_id, run_id, seq, run_after)
    SELECT 'consumer_0', 'floor_' || n.seq, n.seq, clock_timestamp()
      FROM (SELECT coalesce(max(seq), 0) + 1 AS seq
              FROM {{ns}}.dag_run WHERE dag_id = 'consumer_0') AS n
    RETURNING id, dag_id
), gone AS (
    DELETE FROM {{ns}}.asset_dag_run_queue q
     WHERE q.target_dag_id = 'consumer_0'
    RETURNING q.asset_event_id
), linked AS (
    INSERT INTO {{ns}}.dagrun_asset_event (dag_run_id, asset_event_id, dag_id)
    SELECT run.id, gone.asset_event_id, run.dag_id FROM run CROSS JOIN gone
    RETURNING 1
)
SELECT count(*) FROM linked

-- ====================================== PgQ ===============================================

-- pgq_available --
-- Whether this server has the pgq extension's files (Debian: postgresql-NN-pgq3).
SELECT count(*) FROM pg_available_extensions WHERE name = 'pgq'

-- pgq_server_major --
-- The server's major version, for the Debian package's name.
SELECT current_setting('server_version_num')::integer / 10000

-- pgq_install --
-- PgQ in this database (no restart: it needs no shared library preloaded).
CREATE EXTENSION IF NOT EXISTS pgq

-- pgq_uninstall --
-- Gone, with its queues.
DROP EXTENSION IF EXISTS pgq CASCADE

-- pgq_version --
SELECT pgq.version()

-- pgq_create_queue --
-- A queue; the ticker makes a tick whenever one new event is there (peers.py ticks by hand:
-- no pgqd daemon runs).
SELECT pgq.create_queue(%(queue)s),
       pgq.set_queue_config(%(queue)s, 'ticker_max_count', '1')

-- pgq_register_consumer --
SELECT pgq.register_consumer(%(queue)s, %(consumer)s)

-- pgq_insert --
-- One event: PgQ writes one row whatever the number of consumers.
SELECT pgq.insert_event(%(queue)s, 'event', %(data)s)

-- pgq_insert_batch --
-- A batch of events in one statement.
SELECT count(pgq.insert_event(%(queue)s, 'event', d)) FROM unnest(CAST(%(data)s AS text[])) AS d

-- pgq_fill --
-- Backlog, not timed: %(n)s events in one statement.
SELECT count(pgq.insert_event(%(queue)s, 'event', CAST(g AS text)))
  FROM generate_series(1, CAST(%(n)s AS integer)) AS g

-- pgq_tick --
-- A tick: the events committed since the last tick become the next batch.
SELECT pgq.ticker(%(queue)s)

-- pgq_next_batch --
SELECT pgq.next_batch(%(queue)s, %(consumer)s)

-- pgq_batch_events --
SELECT ev_id, ev_data FROM pgq.get_batch_events(%(batch_id)s)

-- pgq_finish_batch --
SELECT pgq.finish_batch(%(batch_id)s)

-- ====================================== pgmq ==============================================

-- pgmq_uninstall --
-- pgmq's SQL-only install is the schema pgmq: gone, with its queues.
DROP SCHEMA IF EXISTS pgmq CASCADE

-- pgmq_create_queue --
SELECT pgmq.create(%(queue)s)

-- pgmq_bind --
-- The queue receives every message sent to the topic.
SELECT pgmq.bind_topic(%(topic)s, %(queue)s)

-- pgmq_send_topic --
-- One message to every queue bound to the topic, in one call (one row per queue).
SELECT pgmq.send_topic(%(topic)s, CAST(%(msg)s AS jsonb))

-- pgmq_send_batch_topic --
-- A batch of messages to every queue bound to the topic, in one call.
SELECT count(*) FROM pgmq.send_batch_topic(%(topic)s, CAST(%(msgs)s AS jsonb[]))

-- pgmq_fill --
-- Backlog, not timed: %(n)s messages in one queue.
SELECT count(*)
  FROM pgmq.send_batch(%(queue)s,
                       ARRAY(SELECT jsonb_build_object('n', g)
                               FROM generate_series(1, CAST(%(n)s AS integer)) AS g))

-- pgmq_read --
-- Up to %(n)s messages, invisible to other readers for 300 s.
SELECT msg_id FROM pgmq.read(%(queue)s, 300, CAST(%(n)s AS integer))

-- pgmq_delete --
SELECT count(*) FROM pgmq.delete(%(queue)s, CAST(%(ids)s AS bigint[]))

-- pgmq_vacuum --
-- A queue's table ({{ns}}: q_<queue>), as assetq's tables are vacuumed.
VACUUM (ANALYZE) pgmq.{{ns}}

-- ================================= procrastinate ==========================================
-- On a connection whose search_path is procrastinate's schema (benchmarks/burndown.py
-- installs it).

-- proc_defer --
-- One job per queue in %(queues)s, in one call of its defer function.
SELECT procrastinate_defer_jobs_v1(ARRAY(
    SELECT CAST(ROW(q, 'noop', 0, NULL, NULL, '{}'::jsonb, NULL) AS procrastinate_job_to_defer_v1)
      FROM unnest(CAST(%(queues)s AS text[])) AS q))

-- proc_defer_batch --
-- %(n)s jobs per queue in %(queues)s, in one call.
SELECT cardinality(procrastinate_defer_jobs_v1(ARRAY(
    SELECT CAST(ROW(q, 'noop', 0, NULL, NULL, jsonb_build_object('n', g), NULL)
                AS procrastinate_job_to_defer_v1)
      FROM generate_series(1, CAST(%(n)s AS integer)) AS g, unnest(CAST(%(queues)s AS text[])) AS q)))

-- proc_fill --
-- Backlog, not timed: %(n)s jobs of queue %(queue)s (its insert triggers run).
INSERT INTO procrastinate_jobs (queue_name, task_name, args)
SELECT %(queue)s, 'noop', '{}'::jsonb FROM generate_series(1, CAST(%(n)s AS integer))

-- proc_reset --
-- No jobs left (the worker registered stays).
TRUNCATE procrastinate_jobs RESTART IDENTITY CASCADE

-- proc_vacuum --
-- As assetq's tables are vacuumed.
VACUUM (ANALYZE) procrastinate_jobs, procrastinate_events
