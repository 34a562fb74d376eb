-- Workers are woken when runs are created (PostgreSQL): a notification on the namespace's
-- channel with payload 'runs' (producers' notifications say 'queued'; each loop reads only
-- its own). Sent by the scheduler pass's transaction, never by a producer's, so producers
-- pay nothing for it.
CREATE OR REPLACE FUNCTION {{ns}}.dag_run_notify() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM new_runs) THEN
        PERFORM pg_notify(TG_TABLE_SCHEMA, 'runs');
    END IF;
    RETURN NULL;
END
$$;
