-- Sets consumer p_dag_id's timeout to p_timeout_seconds (NULL: none; above 0, at most 604800):
-- an attempt claimed from now on that runs longer ends as failed ("timed out after 30s") and
-- is retried by max_attempts like any failure (claim_runs_v2). assetq.declare_dag calls it
-- after declare_dag, in the same transaction. AQ002 for a bad timeout, AQ003 for an unknown
-- consumer.
CREATE OR REPLACE FUNCTION {{ns}}.set_dag_timeout(p_dag_id text, p_timeout_seconds double precision)
RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    -- NOT (x > 0): NaN is refused too.
    IF p_timeout_seconds IS NOT NULL AND NOT (p_timeout_seconds > 0 AND p_timeout_seconds <= 604800) THEN
        RAISE EXCEPTION 'timeout must be above 0 and at most 604800 seconds, got %', p_timeout_seconds
            USING ERRCODE = 'AQ002';
    END IF;
    UPDATE {{ns}}.dag d SET timeout_seconds = p_timeout_seconds WHERE d.dag_id = p_dag_id;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'unknown dag %', quote_nullable(p_dag_id) USING ERRCODE = 'AQ003';
    END IF;
END
$$;

ALTER FUNCTION {{ns}}.set_dag_timeout(text, double precision)
    SECURITY DEFINER SET search_path = pg_catalog, pg_temp;
