-- The fence of assetq 0.1.0's workers' calls (heartbeat_run, complete_run): lock_claim with no
-- claim time, the attempt alone.
CREATE OR REPLACE FUNCTION {{ns}}.lock_held_run(
    p_dag_id  text,
    p_run_id  text,
    p_attempt integer,
    p_hint    text
) RETURNS bigint
LANGUAGE sql AS $$
    SELECT {{ns}}.lock_claim(p_dag_id, p_run_id, p_attempt, NULL, p_hint)
$$;
