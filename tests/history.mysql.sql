-- Consumed history for the history-independence specs and the benchmarks (tests/history.py):
-- events already linked to runs, inserted set-based, as a long-running installation holds
-- them. Named queries as in sql/mysql/queries.sql; {{ns}} is the backquoted namespace.
--
-- The numbers 1 .. 10,000 come from four cross-joined digit tables (MySQL 8 and MariaDB have
-- no generate_series; MariaDB's seq_1_to_N tables are not in MySQL): tests/history.py inserts
-- larger histories in chunks of 10,000.

-- history_bounds --
-- The largest event and run ids, and the number of consumers.
SELECT (SELECT COALESCE(MAX(id), 0) FROM {{ns}}.asset_event) AS event_id,
       (SELECT COALESCE(MAX(id), 0) FROM {{ns}}.dag_run) AS run_id,
       (SELECT COUNT(*) FROM {{ns}}.dag) AS consumers

-- fan_out_definition --
-- The fan-out trigger as created (statement, sql_mode), to put it back after a bulk load.
SHOW CREATE TRIGGER {{ns}}.asset_event_fan_out

-- pause_fan_out --
-- MySQL cannot disable a trigger, and it would run once per history event (which has no
-- consumers): it is dropped for the load and created again from its definition.
DROP TRIGGER {{ns}}.asset_event_fan_out

-- current_database --
-- The connection's default database (NULL for none).
SELECT DATABASE() AS name

-- session_sql_mode --
-- The connection's sql_mode.
SELECT @@SESSION.sql_mode AS sql_mode

-- set_session_sql_mode --
-- Set the connection's sql_mode.
SET SESSION sql_mode = :sql_mode

-- skip_checks --
-- No foreign-key checks for the rows loaded (until restore_checks).
SET SESSION foreign_key_checks = 0

-- restore_checks --
-- Foreign-key checks on again.
SET SESSION foreign_key_checks = 1

-- history_events --
-- Events :first + 1 .. :first + :n (:n <= 10,000) of asset :asset_id, in the past.
INSERT INTO {{ns}}.asset_event (id, asset_id, `timestamp`)
WITH d AS (SELECT 0 AS d UNION ALL SELECT 1 UNION ALL SELECT 2 UNION ALL SELECT 3
           UNION ALL SELECT 4 UNION ALL SELECT 5 UNION ALL SELECT 6 UNION ALL SELECT 7
           UNION ALL SELECT 8 UNION ALL SELECT 9),
     n AS (SELECT 1 + a.d + 10 * b.d + 100 * c.d + 1000 * e.d AS g FROM d a, d b, d c, d e)
SELECT :first + n.g, :asset_id, '2000-01-01 00:00:00' FROM n WHERE n.g <= :n

-- history_runs --
-- Runs :first + 1 .. :first + :n (:n <= 10,000), each of the consumer numbered (id mod
-- :consumers).
INSERT INTO {{ns}}.dag_run (id, dag_id, run_id, seq, run_after, state)
WITH d AS (SELECT 0 AS d UNION ALL SELECT 1 UNION ALL SELECT 2 UNION ALL SELECT 3
           UNION ALL SELECT 4 UNION ALL SELECT 5 UNION ALL SELECT 6 UNION ALL SELECT 7
           UNION ALL SELECT 8 UNION ALL SELECT 9),
     n AS (SELECT 1 + a.d + 10 * b.d + 100 * c.d + 1000 * e.d AS g FROM d a, d b, d c, d e)
SELECT :first + n.g, k.dag_id, CONCAT('history__', :first + n.g), :first + n.g,
       '2000-01-01 00:00:00', 'success'
  FROM n
  JOIN (SELECT dag_id, ROW_NUMBER() OVER (ORDER BY dag_id) - 1 AS k FROM {{ns}}.dag) k
    ON k.k = MOD(:first + n.g, :consumers)
 WHERE n.g <= :n

-- history_links --
-- Links of events :first_event + 1 .. + :n (:n <= 10,000), :per_run per run from run
-- :first_run + 1 on.
INSERT INTO {{ns}}.dagrun_asset_event (dag_run_id, asset_event_id, dag_id)
WITH d AS (SELECT 0 AS d UNION ALL SELECT 1 UNION ALL SELECT 2 UNION ALL SELECT 3
           UNION ALL SELECT 4 UNION ALL SELECT 5 UNION ALL SELECT 6 UNION ALL SELECT 7
           UNION ALL SELECT 8 UNION ALL SELECT 9),
     n AS (SELECT 1 + a.d + 10 * b.d + 100 * c.d + 1000 * e.d AS g FROM d a, d b, d c, d e)
SELECT r.id, :first_event + n.g, r.dag_id
  FROM n
  JOIN {{ns}}.dag_run r ON r.id = :first_run + (n.g + :per_run - 1) DIV :per_run
 WHERE n.g <= :n

-- history_last_run_seq --
-- Every consumer's run sequence above the seq of its runs, so new runs continue after them.
UPDATE {{ns}}.dag_lock l
  JOIN (SELECT dag_id, MAX(seq) AS seq FROM {{ns}}.dag_run GROUP BY dag_id) r
    ON r.dag_id = l.dag_id
   SET l.last_run_seq = r.seq
 WHERE r.seq > l.last_run_seq

-- history_sequences --
-- Nothing to do: AUTO_INCREMENT follows explicit ids by itself.
SELECT 1 AS events, 1 AS runs

-- analyze --
-- Fresh statistics after a bulk load, as InnoDB's background statistics would take them.
ANALYZE TABLE {{ns}}.asset_event, {{ns}}.dag_run, {{ns}}.dagrun_asset_event

-- backlog_events --
-- :n (<= 10,000) new events of asset :asset, all at one timestamp, queued for its consumers by
-- the fan-out trigger (per row, as for every event): register_events' fast path, one INSERT
-- ... SELECT, for a test's backlog. On MySQL 9.7 register_events takes its row-by-row path
-- (innodb_autoinc_lock_mode = 2, the default), 2.6 times slower for a large backlog here.
INSERT INTO {{ns}}.asset_event (asset_id, `timestamp`)
WITH d AS (SELECT 0 AS d UNION ALL SELECT 1 UNION ALL SELECT 2 UNION ALL SELECT 3
           UNION ALL SELECT 4 UNION ALL SELECT 5 UNION ALL SELECT 6 UNION ALL SELECT 7
           UNION ALL SELECT 8 UNION ALL SELECT 9),
     n AS (SELECT 1 + a.d + 10 * b.d + 100 * c.d + 1000 * e.d AS g FROM d a, d b, d c, d e)
SELECT a.id, UTC_TIMESTAMP(6) FROM n, {{ns}}.asset a WHERE a.name = :asset AND n.g <= :n
ORDER BY n.g
