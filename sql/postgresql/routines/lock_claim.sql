-- The fence of a worker's call (I8; heartbeat_run_v2, complete_run_v2): run p_run_id of
-- consumer p_dag_id locked (FOR NO KEY UPDATE), and its key when the claim that started
-- attempt p_attempt at p_started_at still holds it. Held means running under a lease at this
-- attempt, claimed at that moment: a run moved to running by hand (set_run_state) has no
-- lease, no claim of an earlier attempt holds it, and neither does a claim whose run was
-- made again with the same run id and attempt (a claim lost in a crash or a failover, its
-- run made again by the next pass: another claim, at another time). Otherwise AQ010 (lease
-- lost), with p_hint, what the caller must do now; for a run that does not exist, AQ010 too
-- when p_started_at is given (the claim's run is gone), AQ006 (unknown run) without it.
-- p_started_at NULL: the attempt alone fences (the routines of assetq 0.1.0's workers).
CREATE OR REPLACE FUNCTION {{ns}}.lock_claim(
    p_dag_id     text,
    p_run_id     text,
    p_attempt    integer,
    p_started_at timestamptz,
    p_hint       text
) RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    v_run record;
BEGIN
    SELECT r.id, r.state, r.attempt, r.lease_until, r.started_at INTO v_run
      FROM {{ns}}.dag_run r
     WHERE r.dag_id = p_dag_id AND r.run_id = p_run_id
       FOR NO KEY UPDATE;
    IF NOT FOUND THEN
        IF p_started_at IS NOT NULL THEN
            RAISE EXCEPTION 'lease lost: run % of dag % no longer exists', p_run_id, p_dag_id
                USING ERRCODE = 'AQ010', HINT = p_hint;
        END IF;
        RAISE EXCEPTION 'unknown run % of dag %', quote_nullable(p_run_id), quote_nullable(p_dag_id)
            USING ERRCODE = 'AQ006';
    END IF;
    IF v_run.state <> 'running' OR v_run.attempt IS DISTINCT FROM p_attempt
       OR v_run.lease_until IS NULL THEN
        RAISE EXCEPTION 'lease lost: run % of dag % is % at attempt %, not running at attempt %',
                p_run_id, p_dag_id, v_run.state, v_run.attempt,
                coalesce(CAST(p_attempt AS text), 'NULL')
            USING ERRCODE = 'AQ010', HINT = p_hint;
    END IF;
    IF p_started_at IS NOT NULL AND v_run.started_at IS DISTINCT FROM p_started_at THEN
        RAISE EXCEPTION 'lease lost: attempt % of run % of dag % is another claim''s (claimed at %, not at %)',
                p_attempt, p_run_id, p_dag_id, v_run.started_at, p_started_at
            USING ERRCODE = 'AQ010', HINT = p_hint;
    END IF;
    RETURN v_run.id;
END
$$;
