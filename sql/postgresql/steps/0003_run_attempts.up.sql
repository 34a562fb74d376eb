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
CREATE TABLE {{ns}}.dag_run_attempt (
    dag_run_id  bigint NOT NULL REFERENCES {{ns}}.dag_run (id) ON DELETE CASCADE,
    attempt     integer NOT NULL,
    worker      varchar(250),
    started_at  timestamptz,
    ended_at    timestamptz NOT NULL,
    outcome     varchar(20) NOT NULL,
    error       text,
    PRIMARY KEY (dag_run_id, attempt)
);
