-- Attempt history (issue 27): one row per ended attempt of a run, so that the run's page and
-- `assetq run show` can give every attempt (worker, claimed, ended, outcome, error with its
-- traceback) and not only the last, which dag_run keeps. Expand only: a new table, written by
-- the trigger dag_run_attempt_end (triggers/), so every path that ends an attempt (a
-- completion, a failure and its retry, a timeout, a cancel, an expired lease claimed again)
-- records it, whichever package version called it. Runs that ended before this step have no
-- rows here: readers fall back to dag_run's last attempt.
--
-- outcome: success, failed (retried or not: the run's next attempt says), cancelled, or
-- expired (the lease ran out and another claim took the run as its next attempt).
-- The foreign key deletes a run's attempts with it (purge_runs, delete_dag).
CREATE TABLE IF NOT EXISTS {{ns}}.dag_run_attempt (
    dag_run_id  BIGINT NOT NULL,
    attempt     INT NOT NULL,
    worker      VARCHAR(250) NULL,
    started_at  DATETIME(6) NULL,
    ended_at    DATETIME(6) NOT NULL,
    outcome     VARCHAR(20) NOT NULL,
    error       TEXT NULL,
    PRIMARY KEY (dag_run_id, attempt),
    CONSTRAINT dag_run_attempt_run_fkey FOREIGN KEY (dag_run_id)
        REFERENCES {{ns}}.dag_run (id) ON DELETE CASCADE
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;
