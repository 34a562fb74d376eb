-- Operations: scheduler wake-ups (PostgreSQL), the
-- dag_queue_status view, retention (purge_runs, purge_events) and least privilege
-- (grant_access, revoke_access; the granted routines run with their owner's rights).

-- The wake-up:
-- a producer's transaction notifies only while a scheduler holds or waits for the
-- namespace's wake-up lock; otherwise it holds the lock shared until it ends, so a scheduler
-- that wants to wait first waits for it to end.
CREATE OR REPLACE FUNCTION {{ns}}.asset_dag_run_queue_notify() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    -- A statement trigger fires for an INSERT ... SELECT that inserted nothing too (an event
    -- of an asset nobody consumes): no wake-up for that.
    IF EXISTS (SELECT 1 FROM new_rows)
       AND NOT pg_try_advisory_xact_lock_shared(
               (CAST(1634956401 AS bigint) << 32) + CAST(TG_RELID AS bigint)) THEN
        PERFORM pg_notify(TG_TABLE_SCHEMA, 'queued');
    END IF;
    RETURN NULL;
END
$$;
