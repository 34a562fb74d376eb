-- The fence of a worker's call (I8; heartbeat_run, complete_run): run p_run_id of consumer
-- p_dag_id locked (lock_run), and its key when attempt p_attempt still holds it. Held means
-- running under a lease at this attempt: a run moved to running by hand (set_run_state) has
-- none, and no claim of an earlier attempt holds it. Otherwise AQ010 (lease lost), with
-- p_hint, what the caller must do now.
CREATE OR REPLACE FUNCTION {{ns}}.lock_held_run(
    p_dag_id  text,
    p_run_id  text,
    p_attempt integer,
    p_hint    text
) RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    v_run record;
BEGIN
    SELECT * INTO v_run FROM {{ns}}.lock_run(p_dag_id, p_run_id);
    IF v_run.p_state <> 'running' OR v_run.p_attempt IS DISTINCT FROM p_attempt
       OR v_run.p_lease IS NULL THEN
        RAISE EXCEPTION 'lease lost: run % of dag % is % at attempt %, not running at attempt %',
                p_run_id, p_dag_id, v_run.p_state, v_run.p_attempt,
                coalesce(CAST(p_attempt AS text), 'NULL')
            USING ERRCODE = 'AQ010', HINT = p_hint;
    END IF;
    RETURN v_run.p_id;
END
$$;
