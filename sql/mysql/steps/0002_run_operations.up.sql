-- Operating runs (issue 26): timeouts, cancellation, and which consumers each live worker
-- can run. Expand only: two nullable columns (instant on MySQL 8.0+ and MariaDB 10.3+), one
-- check dropped and a new table: nothing here copies a table.

-- A consumer's timeout: an attempt running longer ends as failed ("timed out after 30s")
-- and is retried by max_attempts like any failure. NULL: the worker's default, if any.
ALTER TABLE {{ns}}.dag ADD COLUMN timeout_seconds DOUBLE NULL;

-- When the running attempt times out (its claim's time plus the timeout), NULL for none. A
-- lease never runs past it, so the run's not_before is at most its deadline and the next
-- claim finds a timed-out attempt by the same index as an expired lease.
ALTER TABLE {{ns}}.dag_run ADD COLUMN deadline DATETIME(6) NULL;

-- cancelled, a final state (cancel_run), is not among the states dag_run_state_check allows.
-- The check goes instead of being widened: MySQL 8 / MariaDB: adding a check constraint
-- copies the table (ALGORITHM=COPY, writes to runs wait for it), dropping one is instant. The
-- routines are the only writers of a run's state. DROP CONSTRAINT: MySQL 8.0.19+ and MariaDB
-- (MySQL's older DROP CHECK is not MariaDB's).
ALTER TABLE {{ns}}.dag_run DROP CONSTRAINT dag_run_state_check;

-- The consumers a live worker has handlers for (process_handles), so status and doctor can
-- tell a consumer whose runs nobody can execute. Written with the process's liveness row and
-- deleted with it (process_gone, purge). No foreign key: readers join it to the liveness
-- row, whose last_seen_at says who is alive.
CREATE TABLE IF NOT EXISTS {{ns}}.process_dag (
    process_id  VARCHAR(64) NOT NULL,
    dag_id      VARCHAR(250) NOT NULL,
    PRIMARY KEY (process_id, dag_id),
    KEY process_dag_dag_idx (dag_id)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;
