-- Migration 0005_wakeup_on_demand (down): every producer transaction that queued events
-- notifies again, as at 0003 (schedulers of this version still take the wake-up lock; with
-- this trigger it only makes them wait for producers in flight before they sleep).

CREATE OR REPLACE FUNCTION {{ns}}.asset_dag_run_queue_notify() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    -- A statement trigger fires for an INSERT ... SELECT that inserted nothing too (an event
    -- of an asset nobody consumes): no wake-up for that.
    IF EXISTS (SELECT 1 FROM new_rows) THEN
        PERFORM pg_notify(TG_TABLE_SCHEMA, 'queued');
    END IF;
    RETURN NULL;
END
$$;
