-- The first step of every call on one run (heartbeat_run, complete_run, retry_run,
-- set_run_state): run p_run_id of consumer p_dag_id locked, with what the caller decides on:
-- its key, state, attempt, lease and worker. AQ006 for an unknown run. FOR NO KEY UPDATE,
-- as everywhere a run is changed: none of these calls changes its key.
CREATE OR REPLACE FUNCTION {{ns}}.lock_run(
    p_dag_id      text,
    p_run_id      text,
    OUT p_id      bigint,
    OUT p_state   text,
    OUT p_attempt integer,
    OUT p_lease   timestamptz,
    OUT p_worker  text
)
LANGUAGE plpgsql AS $$
BEGIN
    SELECT r.id, r.state, r.attempt, r.lease_until, r.worker
      INTO p_id, p_state, p_attempt, p_lease, p_worker
      FROM {{ns}}.dag_run r
     WHERE r.dag_id = p_dag_id AND r.run_id = p_run_id
       FOR NO KEY UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'unknown run % of dag %', quote_nullable(p_run_id), quote_nullable(p_dag_id)
            USING ERRCODE = 'AQ006';
    END IF;
END
$$;
