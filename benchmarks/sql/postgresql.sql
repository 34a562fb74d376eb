-- Statements of benchmarks/bench.py for PostgreSQL, by name (parsed like sql/*/queries.sql).
-- The timestamp-window baseline (tests/stress.py, WindowAlgorithm) keeps its own tables bl_*
-- in the connection's default schema; these give it the same consumed history as assetq's.

-- window_history_events --
-- Events :first + 1 .. :first + :n of the baseline, spread over its :assets assets, in the past.
INSERT INTO bl_event (asset, ts)
SELECT 'a' || ((CAST(:first AS bigint) + g) % CAST(:assets AS integer)),
       timestamp '2000-01-01 00:00:00' + (CAST(:first AS bigint) + g) * interval '1 millisecond'
  FROM generate_series(1, CAST(:n AS integer)) AS g

-- window_history_runs --
-- :n runs of the baseline's consumers in turn, in the past.
INSERT INTO bl_run (dag_id, run_after)
SELECT d.dag_id, timestamp '2000-01-01 00:00:00'
  FROM generate_series(1, CAST(:n AS integer)) AS g
  JOIN (SELECT dag_id, row_number() OVER (ORDER BY dag_id) - 1 AS k FROM bl_dag) d
    ON d.k = g % CAST(:consumers AS integer)

-- window_history_links --
-- Links of events :first + 1 .. :first + :n, :per_run per run (the baseline has no foreign keys).
INSERT INTO bl_link (run_id, dag_id, event_id)
SELECT (CAST(:first AS bigint) + g + CAST(:per_run AS integer) - 1) / CAST(:per_run AS integer),
       'history', CAST(:first AS bigint) + g
  FROM generate_series(1, CAST(:n AS integer)) AS g

-- window_history_done --
-- Every consumer's last run after the whole history, as after consuming it.
UPDATE bl_dag SET last_run_after = (SELECT max(ts) FROM bl_event)

-- window_analyze --
-- Fresh statistics after the bulk load.
ANALYZE bl_event, bl_run, bl_link, bl_dag

-- create_schema --
-- A schema of the benchmark's own (the baseline's tables of one history level).
CREATE SCHEMA IF NOT EXISTS {{ns}}

-- drop_schema --
-- Drop such a schema and everything in it.
DROP SCHEMA IF EXISTS {{ns}} CASCADE

-- registration_rows --
-- Events, queue rows, and queue rows that carry their event's timestamp, in a namespace.
SELECT (SELECT count(*) FROM {{ns}}.asset_event) AS events,
       (SELECT count(*) FROM {{ns}}.asset_dag_run_queue) AS queued,
       (SELECT count(*) FROM {{ns}}.asset_dag_run_queue q
          JOIN {{ns}}.asset_event e ON e.id = q.asset_event_id
         WHERE q.created_at = e."timestamp") AS stamped

-- settings --
-- Server settings that shape the figures.
SELECT 'server_version' AS name, current_setting('server_version') AS value
UNION ALL SELECT 'synchronous_commit', current_setting('synchronous_commit')
UNION ALL SELECT 'fsync', current_setting('fsync')
UNION ALL SELECT 'shared_buffers', current_setting('shared_buffers')
UNION ALL SELECT 'default_transaction_isolation', current_setting('default_transaction_isolation')
UNION ALL SELECT 'max_connections', current_setting('max_connections')

-- create_database --
-- A database of the benchmark's own on the server.
CREATE DATABASE {{ns}}

-- drop_database --
-- Drop the benchmark's database, closing any session left in it.
DROP DATABASE IF EXISTS {{ns}} WITH (FORCE)
