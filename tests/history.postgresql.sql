-- Consumed history for the history-independence specs and the benchmarks (tests/history.py):
-- events already linked to runs, inserted set-based, as a long-running installation holds
-- them. Named queries as in sql/postgresql/queries.sql; {{ns}} is the quoted namespace.

-- history_bounds --
-- The largest event and run ids, and the number of consumers.
SELECT (SELECT coalesce(max(id), 0) FROM {{ns}}.asset_event) AS event_id,
       (SELECT coalesce(max(id), 0) FROM {{ns}}.dag_run) AS run_id,
       (SELECT count(*) FROM {{ns}}.dag) AS consumers

-- pause_fan_out --
-- History events have no consumers; skip the fan-out trigger's join over them.
ALTER TABLE {{ns}}.asset_event DISABLE TRIGGER asset_event_fan_out

-- resume_fan_out --
-- Switch the fan-out trigger back on.
ALTER TABLE {{ns}}.asset_event ENABLE TRIGGER asset_event_fan_out

-- skip_checks --
-- Until the end of the transaction: no foreign-key checks (nor the fan-out trigger) for the
-- rows loaded. Needs a superuser.
SET LOCAL session_replication_role = replica

-- history_events --
-- Events :first + 1 .. :first + :n of asset :asset_id, in the past.
INSERT INTO {{ns}}.asset_event (id, asset_id, "timestamp")
SELECT CAST(:first AS bigint) + g, :asset_id, timestamptz '2000-01-01 00:00:00+00'
  FROM generate_series(1, CAST(:n AS integer)) AS g

-- history_runs --
-- Runs :first + 1 .. :first + :n, each of the consumer numbered (id mod :consumers).
INSERT INTO {{ns}}.dag_run (id, dag_id, run_id, seq, run_after, state)
SELECT CAST(:first AS bigint) + g, d.dag_id, 'history__' || (CAST(:first AS bigint) + g),
       CAST(:first AS bigint) + g, timestamptz '2000-01-01 00:00:00+00', 'success'
  FROM generate_series(1, CAST(:n AS integer)) AS g
  JOIN (SELECT dag_id, row_number() OVER (ORDER BY dag_id) - 1 AS k FROM {{ns}}.dag) d
    ON d.k = (CAST(:first AS bigint) + g) % CAST(:consumers AS integer)

-- history_links --
-- Links of events :first_event + 1 .. + :n, :per_run per run from run :first_run + 1 on.
INSERT INTO {{ns}}.dagrun_asset_event (dag_run_id, asset_event_id, dag_id)
SELECT r.id, CAST(:first_event AS bigint) + g, r.dag_id
  FROM generate_series(1, CAST(:n AS integer)) AS g
  JOIN {{ns}}.dag_run r
    ON r.id = CAST(:first_run AS bigint) + (g + CAST(:per_run AS integer) - 1) / CAST(:per_run AS integer)

-- history_last_run_seq --
-- Every consumer's run sequence above the seq of its runs, so new runs continue after them.
UPDATE {{ns}}.dag d
   SET last_run_seq = r.seq
  FROM (SELECT dag_id, max(seq) AS seq FROM {{ns}}.dag_run GROUP BY dag_id) r
 WHERE r.dag_id = d.dag_id AND r.seq > d.last_run_seq

-- history_sequences --
-- Identity sequences above the ids inserted explicitly.
SELECT setval(pg_get_serial_sequence('{{ns}}.asset_event', 'id'),
              greatest(1, (SELECT max(id) FROM {{ns}}.asset_event))) AS events,
       setval(pg_get_serial_sequence('{{ns}}.dag_run', 'id'),
              greatest(1, (SELECT max(id) FROM {{ns}}.dag_run))) AS runs

-- analyze --
-- Fresh statistics after a bulk load, as autovacuum would take them.
ANALYZE
