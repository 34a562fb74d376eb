-- Renews the lease of run p_run_id of consumer p_dag_id held at attempt p_attempt to
-- p_lease_seconds from now (database clock) and returns the new end. AQ010 (lease lost) when
-- the run is no longer running at that attempt: another worker claimed it after the lease
-- expired, or it was finished or cancelled; nothing is written. The lease never runs past the
-- attempt's deadline (its timeout, claim_runs_v2): a heartbeat at or after it is refused
-- (AQ010, timed out), and the next claim ends the attempt. AQ006 for an unknown run.
-- p_started_at, the claim's started_at, fences the claim itself (lock_claim): NULL, the
-- attempt alone.
CREATE OR REPLACE FUNCTION {{ns}}.heartbeat_run_v2(
    p_dag_id        text,
    p_run_id        text,
    p_attempt       integer,
    p_lease_seconds double precision,
    p_started_at    timestamptz DEFAULT NULL
) RETURNS TABLE (lease_until timestamptz)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_id       bigint;
    v_now      timestamptz;
    v_until    timestamptz;
    v_deadline timestamptz;
BEGIN
    IF p_lease_seconds IS NULL OR NOT (p_lease_seconds > 0 AND p_lease_seconds <= 604800) THEN
        RAISE EXCEPTION 'lease must be above 0 and at most 604800 seconds, got %', quote_nullable(p_lease_seconds)
            USING ERRCODE = 'AQ002';
    END IF;
    v_id := {{ns}}.lock_claim(
        p_dag_id, p_run_id, p_attempt, p_started_at,
        'Stop working on it: another worker holds it now, or it was finished.');
    v_now := clock_timestamp();
    SELECT r.deadline INTO v_deadline FROM {{ns}}.dag_run r WHERE r.id = v_id;
    IF v_deadline <= v_now THEN
        RAISE EXCEPTION 'lease lost: attempt % of run % of dag % timed out', p_attempt, p_run_id, p_dag_id
            USING ERRCODE = 'AQ010',
                  HINT = 'Stop working on it: it ran past its timeout; the next claim ends the attempt.';
    END IF;
    -- least() ignores a NULL deadline.
    v_until := least(v_now + make_interval(secs => p_lease_seconds), v_deadline);
    UPDATE {{ns}}.dag_run r
       SET lease_until = v_until, not_before = v_until, updated_at = v_now
     WHERE r.id = v_id;
    lease_until := v_until;
    RETURN NEXT;
END
$$;

ALTER FUNCTION {{ns}}.heartbeat_run_v2(text, text, integer, double precision, timestamptz)
    SECURITY DEFINER SET search_path = pg_catalog, pg_temp;
