-- Workers are woken when runs are created (PostgreSQL): a notification on the namespace's
-- channel with payload 'runs' (producers' notifications say 'queued'; each loop reads only
-- its own). Sent by the scheduler pass's transaction, never by a producer's, so producers
-- pay nothing for it. Not sent for the runs of a worker's own pass (schedule_and_claim,
-- which sets assetq.claiming_runs to the namespace meanwhile): it claims them in the same
-- transaction, and notifies itself when it leaves some unclaimed. No transition table: every
-- insert into dag_run is one row (INSERT ... VALUES in schedule_runs and
-- schedule_partitions), so the statement inserted a run; capturing it cost each run 5% of a
-- worker's claim with a pass.
CREATE OR REPLACE FUNCTION {{ns}}.dag_run_notify() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF current_setting('assetq.claiming_runs', true) IS DISTINCT FROM TG_TABLE_SCHEMA THEN
        PERFORM pg_notify(TG_TABLE_SCHEMA, 'runs');
    END IF;
    RETURN NULL;
END
$$;
