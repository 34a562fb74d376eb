-- Operating runs (issue 26): timeouts, cancellation, and which consumers each live worker
-- can run. Expand only: two nullable columns, a wider state check, a new table.

-- A consumer's timeout: an attempt running longer ends as failed ("timed out after 30s")
-- and is retried by max_attempts like any failure. NULL: the worker's default, if any.
ALTER TABLE {{ns}}.dag ADD COLUMN timeout_seconds double precision;
ALTER TABLE {{ns}}.dag ADD CONSTRAINT dag_timeout_check
    CHECK (timeout_seconds > 0 AND timeout_seconds <= 604800) NOT VALID;

-- When the running attempt times out (its claim's time plus the timeout), NULL for none. A
-- lease never runs past it, so the run's not_before is at most its deadline and the next
-- claim finds a timed-out attempt by the same index as an expired lease.
ALTER TABLE {{ns}}.dag_run ADD COLUMN deadline timestamptz;

-- cancelled: a final state (cancel_run), like success and failed.
-- NOT VALID, then VALIDATE: the check is wider than the old one, and validating takes a lock
-- that lets producers, passes and workers go on.
ALTER TABLE {{ns}}.dag_run DROP CONSTRAINT dag_run_state_check;
ALTER TABLE {{ns}}.dag_run ADD CONSTRAINT dag_run_state_check
    CHECK (state IN ('queued', 'running', 'success', 'failed', 'cancelled')) NOT VALID;
ALTER TABLE {{ns}}.dag_run VALIDATE CONSTRAINT dag_run_state_check;
ALTER TABLE {{ns}}.dag VALIDATE CONSTRAINT dag_timeout_check;

-- The consumers a live worker has handlers for (process_handles), so status and doctor can
-- tell a consumer whose runs nobody can execute. Written with the process's liveness row and
-- deleted with it (process_gone, purge). No foreign key: readers join it to the liveness
-- row, whose last_seen_at says who is alive.
CREATE TABLE {{ns}}.process_dag (
    process_id  varchar(64) NOT NULL,
    dag_id      varchar(250) NOT NULL,
    PRIMARY KEY (process_id, dag_id)
);
CREATE INDEX process_dag_dag_idx ON {{ns}}.process_dag (dag_id);
