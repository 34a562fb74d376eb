-- AQ002 unless the arguments of a claim are valid: a worker name of 1 to 250 characters, a
-- limit of 1 to 1000, a lease above 0 and at most a week, a timeout NULL or above 0 and at
-- most a week, and p_dag_ids NULL or a JSON array of dag ids (check_dag_ids). claim_runs_v2
-- and schedule_and_claim check with it before anything is written.
CREATE OR REPLACE FUNCTION {{ns}}.check_claim(
    p_worker          text,
    p_limit           integer,
    p_lease_seconds   double precision,
    p_dag_ids         jsonb,
    p_timeout_seconds double precision
) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    IF p_worker IS NULL OR p_worker = '' OR length(p_worker) > 250 THEN
        RAISE EXCEPTION 'worker must be a name of 1 to 250 characters, got %', quote_nullable(left(p_worker, 60))
            USING ERRCODE = 'AQ002';
    END IF;
    IF p_limit IS NULL OR p_limit < 1 OR p_limit > 1000 THEN
        RAISE EXCEPTION 'limit must be 1 to 1000, got %', quote_nullable(p_limit)
            USING ERRCODE = 'AQ002';
    END IF;
    -- NOT (... > 0): NaN is refused too.
    IF p_lease_seconds IS NULL OR NOT (p_lease_seconds > 0 AND p_lease_seconds <= 604800) THEN
        RAISE EXCEPTION 'lease must be above 0 and at most 604800 seconds, got %', quote_nullable(p_lease_seconds)
            USING ERRCODE = 'AQ002';
    END IF;
    IF p_timeout_seconds IS NOT NULL AND NOT (p_timeout_seconds > 0 AND p_timeout_seconds <= 604800) THEN
        RAISE EXCEPTION 'timeout must be above 0 and at most 604800 seconds, got %', p_timeout_seconds
            USING ERRCODE = 'AQ002';
    END IF;
    PERFORM {{ns}}.check_dag_ids(p_dag_ids);
END
$$;
