-- Statements of benchmarks/latency.py for PostgreSQL, by name (parsed like sql/*/queries.sql).
-- {{ns}} is the quoted namespace.

-- disable_notify --
-- Switch the scheduler wake-up off, to measure what it costs producers.
ALTER TABLE {{ns}}.asset_dag_run_queue DISABLE TRIGGER asset_dag_run_queue_notify

-- enable_notify --
-- Switch the scheduler wake-up back on.
ALTER TABLE {{ns}}.asset_dag_run_queue ENABLE TRIGGER asset_dag_run_queue_notify

-- async_commit --
-- This session's commits do not wait for the WAL flush (the other commit mode measured).
SET synchronous_commit = off
