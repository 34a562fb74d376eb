-- Statements of benchmarks/bench.py for MySQL/MariaDB, by name (parsed like sql/*/queries.sql).
-- The timestamp-window baseline (tests/stress.py, WindowAlgorithm) keeps its own tables bl_*
-- in the connection's default database; these give it the same consumed history as assetq's.
-- Rows are numbered 1 .. 10,000 by four cross-joined digit tables: bench.py loads larger
-- histories in chunks (MySQL 8 and MariaDB have no generate_series in common).

-- window_history_events --
-- Events :first + 1 .. :first + :n (:n <= 10,000), spread over :assets assets, in the past.
INSERT INTO bl_event (asset, ts)
WITH d AS (SELECT 0 AS d UNION ALL SELECT 1 UNION ALL SELECT 2 UNION ALL SELECT 3
           UNION ALL SELECT 4 UNION ALL SELECT 5 UNION ALL SELECT 6 UNION ALL SELECT 7
           UNION ALL SELECT 8 UNION ALL SELECT 9),
     n AS (SELECT 1 + a.d + 10 * b.d + 100 * c.d + 1000 * e.d AS g FROM d a, d b, d c, d e)
SELECT CONCAT('a', MOD(:first + n.g, :assets)),
       TIMESTAMPADD(MICROSECOND, 1000 * (:first + n.g), '2000-01-01 00:00:00')
  FROM n WHERE n.g <= :n

-- window_history_runs --
-- :n runs (:n <= 10,000) of the baseline's consumers in turn, in the past.
INSERT INTO bl_run (dag_id, run_after)
WITH d AS (SELECT 0 AS d UNION ALL SELECT 1 UNION ALL SELECT 2 UNION ALL SELECT 3
           UNION ALL SELECT 4 UNION ALL SELECT 5 UNION ALL SELECT 6 UNION ALL SELECT 7
           UNION ALL SELECT 8 UNION ALL SELECT 9),
     n AS (SELECT 1 + a.d + 10 * b.d + 100 * c.d + 1000 * e.d AS g FROM d a, d b, d c, d e)
SELECT k.dag_id, '2000-01-01 00:00:00'
  FROM n
  JOIN (SELECT dag_id, ROW_NUMBER() OVER (ORDER BY dag_id) - 1 AS k FROM bl_dag) k
    ON k.k = MOD(n.g, :consumers)
 WHERE n.g <= :n

-- window_history_links --
-- Links of events :first + 1 .. :first + :n (:n <= 10,000), :per_run per run (the baseline
-- has no foreign keys).
INSERT INTO bl_link (run_id, dag_id, event_id)
WITH d AS (SELECT 0 AS d UNION ALL SELECT 1 UNION ALL SELECT 2 UNION ALL SELECT 3
           UNION ALL SELECT 4 UNION ALL SELECT 5 UNION ALL SELECT 6 UNION ALL SELECT 7
           UNION ALL SELECT 8 UNION ALL SELECT 9),
     n AS (SELECT 1 + a.d + 10 * b.d + 100 * c.d + 1000 * e.d AS g FROM d a, d b, d c, d e)
SELECT (:first + n.g + :per_run - 1) DIV :per_run, 'history', :first + n.g
  FROM n WHERE n.g <= :n

-- window_history_done --
-- Every consumer's last run after the whole history, as after consuming it.
UPDATE bl_dag SET last_run_after = (SELECT MAX(ts) FROM bl_event)

-- window_analyze --
-- Fresh statistics after the bulk load.
ANALYZE TABLE bl_event, bl_run, bl_link, bl_dag

-- create_schema --
-- A database of the benchmark's own (the baseline's tables of one history level).
CREATE DATABASE IF NOT EXISTS {{ns}} CHARACTER SET utf8mb4 COLLATE utf8mb4_bin

-- drop_schema --
-- Drop such a database and everything in it.
DROP DATABASE IF EXISTS {{ns}}

-- registration_rows --
-- Events, queue rows, and queue rows that carry their event's timestamp, in a namespace.
SELECT (SELECT COUNT(*) FROM {{ns}}.asset_event) AS events,
       (SELECT COUNT(*) FROM {{ns}}.asset_dag_run_queue) AS queued,
       (SELECT COUNT(*) FROM {{ns}}.asset_dag_run_queue q
          JOIN {{ns}}.asset_event e ON e.id = q.asset_event_id
         WHERE q.created_at = e.`timestamp`) AS stamped

-- settings --
-- Server settings that shape the figures.
-- SHOW VARIABLES: the isolation variable is tx_isolation on MariaDB 10 and
-- transaction_isolation on MySQL 8; a SELECT of the other one would fail.
SHOW VARIABLES WHERE Variable_name IN ('version', 'innodb_flush_log_at_trx_commit',
    'innodb_buffer_pool_size', 'tx_isolation', 'transaction_isolation',
    'innodb_autoinc_lock_mode', 'log_bin')

-- create_database --
-- A database of the benchmark's own on the server (its default database).
CREATE DATABASE {{ns}} CHARACTER SET utf8mb4 COLLATE utf8mb4_bin

-- drop_database --
-- Drop the benchmark's database.
DROP DATABASE IF EXISTS {{ns}}

-- grow_buffer_pool --
-- On the benchmark's throw-away server only: room for a million events of history in memory.
SET GLOBAL innodb_buffer_pool_size = 536870912

-- flush_log_at_commit --
-- On the benchmark's throw-away server only: 1 flushes the log to disk at every commit
-- (durable), 2 once a second (as tests/dbs.py starts the server).
SET GLOBAL innodb_flush_log_at_trx_commit = :mode
