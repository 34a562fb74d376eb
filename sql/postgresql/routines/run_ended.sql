-- Called in the transaction that ends a run of consumer p_dag_id (success, a final failure, a
-- cancel): when the consumer is capped (max_active_runs), the run's end frees a place for its
-- next run, so a scheduler waiting for notifications is woken ('ended' on the namespace's
-- channel, sent at commit) instead of finding it at its next poll. Only while one waits:
-- as the fan-out's wake-up (asset_dag_run_queue_notify), a shared try of the wake-up lock
-- fails only while a scheduler holds it, and then notifies.
CREATE OR REPLACE FUNCTION {{ns}}.run_ended(p_dag_id text)
RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM {{ns}}.dag d WHERE d.dag_id = p_dag_id AND d.max_active_runs IS NOT NULL)
       AND NOT pg_try_advisory_xact_lock_shared(
               (CAST(1634956401 AS bigint) << 32)
               + CAST(CAST(CAST('{{ns}}.asset_dag_run_queue' AS regclass) AS oid) AS bigint)) THEN
        PERFORM pg_notify({{database}}, 'ended');
    END IF;
END
$$;

ALTER FUNCTION {{ns}}.run_ended(text)
    SECURITY DEFINER SET search_path = pg_catalog, pg_temp;
