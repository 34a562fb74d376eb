-- Renews the lease of run p_run_id of consumer p_dag_id held at attempt p_attempt to
-- p_lease_seconds from now (database clock) and returns the new end. AQ010 (lease lost) when
-- the run is no longer running at that attempt: another worker claimed it after the lease
-- expired, or it was finished; nothing is written. AQ006 for an unknown run.
CREATE OR REPLACE FUNCTION {{ns}}.heartbeat_run(
    p_dag_id        text,
    p_run_id        text,
    p_attempt       integer,
    p_lease_seconds double precision
) RETURNS TABLE (lease_until timestamptz)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_id      bigint;
    v_state   text;
    v_attempt integer;
    v_lease   timestamptz;
    v_until   timestamptz;
BEGIN
    IF p_lease_seconds IS NULL OR NOT (p_lease_seconds > 0 AND p_lease_seconds <= 604800) THEN
        RAISE EXCEPTION 'lease must be above 0 and at most 604800 seconds, got %', quote_nullable(p_lease_seconds)
            USING ERRCODE = 'AQ002';
    END IF;
    SELECT r.id, r.state, r.attempt, r.lease_until INTO v_id, v_state, v_attempt, v_lease
      FROM {{ns}}.dag_run r
     WHERE r.dag_id = p_dag_id AND r.run_id = p_run_id
       FOR NO KEY UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'unknown run % of dag %', quote_nullable(p_run_id), quote_nullable(p_dag_id)
            USING ERRCODE = 'AQ006';
    END IF;
    -- Held means running under a lease at this attempt: a run moved to running by hand
    -- (set_run_state) has none, and no claim of an earlier attempt holds it.
    IF v_state <> 'running' OR v_attempt IS DISTINCT FROM p_attempt OR v_lease IS NULL THEN
        RAISE EXCEPTION 'lease lost: run % of dag % is % at attempt %, not running at attempt %',
                p_run_id, p_dag_id, v_state, v_attempt, coalesce(CAST(p_attempt AS text), 'NULL')
            USING ERRCODE = 'AQ010',
                  HINT = 'Stop working on it: another worker holds it now, or it was finished.';
    END IF;
    v_until := clock_timestamp() + make_interval(secs => p_lease_seconds);
    UPDATE {{ns}}.dag_run r
       SET lease_until = v_until, not_before = v_until, updated_at = clock_timestamp()
     WHERE r.id = v_id;
    lease_until := v_until;
    RETURN NEXT;
END
$$;

ALTER FUNCTION {{ns}}.heartbeat_run(text, text, integer, double precision)
    SECURITY DEFINER SET search_path = pg_catalog, pg_temp;
