-- Migration 0005_wakeup_on_demand (up): producers notify only while a scheduler waits.
-- Frozen once released: later changes go into new migrations.
--
-- PostgreSQL serializes the commits of transactions that sent a notification (NOTIFY takes
-- a database-wide lock at commit and holds it through the WAL flush), so with 0003's trigger
-- concurrent producers lost their group commit: 8 producers registered about 20% fewer
-- events per second with it than without it. Now a producer's transaction notifies only when
-- a scheduler asked to be woken:
--
--   * a scheduler that found nothing to do takes the namespace's wake-up lock (an advisory
--     lock, exclusive, held by its LISTENing session) before its last pass and keeps it while
--     it waits; it gives the lock up as soon as a pass creates runs again;
--   * the trigger tries the same lock in shared mode (never waiting). Taken: no scheduler
--     waits, and the shared lock, held to the end of the transaction, makes a scheduler that
--     wants to wait first wait for this transaction to end, so its last pass sees these
--     events. Not taken: a scheduler holds or is about to take it and LISTENs already, so
--     the notification wakes it.
--
-- Either way every committed queue row is seen by a pass that runs after its commit. (A
-- scheduler also leaves the lock alone while another one is busy, which passes again anyway:
-- see run_scheduler.) The
-- lock's key is (x'61737471' = 'astq', the queue table's oid), one per installed namespace;
-- queries.sql (wakeup_arm) computes the same key for the scheduler.
--
-- {{ns}} is replaced by the quoted namespace when the file is loaded.

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
