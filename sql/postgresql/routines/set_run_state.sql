-- Moves run p_run_id of consumer p_dag_id to state p_state and returns it. Allowed:
-- queued -> running, success or failed; running -> success or failed. Moving a run to the
-- state it is in changes nothing (a retry is harmless). Anything else raises AQ008; an
-- unknown run AQ006. started_at is set on entering running, ended_at on entering success or
-- failed. A run in success or failed no longer counts against max_active_runs. A run a
-- worker holds (claim_runs) is refused with AQ008: its worker completes it (complete_run).
CREATE OR REPLACE FUNCTION {{ns}}.set_run_state(p_dag_id text, p_run_id text, p_state text)
RETURNS TABLE (
    dag_run_id          bigint,
    dag_id              varchar,
    run_id              varchar,
    seq                 bigint,
    state               varchar,
    run_after           timestamptz,
    created_at          timestamptz,
    started_at          timestamptz,
    ended_at            timestamptz,
    triggering_event_id bigint,
    event_count         integer,
    attempt             integer,
    worker              varchar,
    lease_until         timestamptz,
    not_before          timestamptz,
    error               text,
    partition_key       varchar
)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_id      bigint;
    v_old     text;
    v_worker  text;
    v_attempt integer;
    v_lease   timestamptz;
BEGIN
    IF p_state IS NULL OR p_state NOT IN ('queued', 'running', 'success', 'failed') THEN
        RAISE EXCEPTION 'unknown run state %: use queued, running, success or failed', quote_nullable(p_state)
            USING ERRCODE = 'AQ008';
    END IF;
    SELECT l.p_id, l.p_state, l.p_worker, l.p_attempt, l.p_lease
      INTO v_id, v_old, v_worker, v_attempt, v_lease
      FROM {{ns}}.lock_run(p_dag_id, p_run_id) l;
    -- A run a worker holds (claimed by claim_runs: running under a lease) is finished by that
    -- worker's complete_run, fenced by its attempt (I8): moving it here would let a second
    -- party finish a run someone holds. A run moved to running by hand has no lease.
    IF v_old = 'running' AND v_lease IS NOT NULL AND v_old <> p_state THEN
        RAISE EXCEPTION 'run % of dag % is held by worker % (attempt %): its worker completes it (assetq.complete_run)',
                p_run_id, p_dag_id, quote_literal(v_worker), v_attempt
            USING ERRCODE = 'AQ008',
                  HINT = 'If the worker died, the run is claimed again when its lease expires.';
    END IF;
    IF v_old <> p_state THEN
        IF NOT ((v_old = 'queued' AND p_state IN ('running', 'success', 'failed'))
                OR (v_old = 'running' AND p_state IN ('success', 'failed'))) THEN
            RAISE EXCEPTION 'run % of dag % is %: it cannot move to %', p_run_id, p_dag_id, v_old, p_state
                USING ERRCODE = 'AQ008',
                      HINT = 'Runs move queued -> running -> success or failed; success and failed are final.';
        END IF;
        UPDATE {{ns}}.dag_run r
           SET state = p_state,
               started_at = CASE WHEN p_state = 'running' THEN clock_timestamp() ELSE r.started_at END,
               ended_at = CASE WHEN p_state IN ('success', 'failed') THEN clock_timestamp() ELSE r.ended_at END,
               updated_at = clock_timestamp(),
               -- Leaving queued by hand: no worker may claim it any more.
               not_before = NULL,
               lease_until = NULL
         WHERE r.id = v_id;
        IF p_state IN ('success', 'failed') THEN
            PERFORM {{ns}}.run_ended(p_dag_id);
        END IF;
    END IF;
    RETURN QUERY
    SELECT r.id, r.dag_id, r.run_id, r.seq, r.state, r.run_after, r.created_at, r.started_at,
           r.ended_at, r.triggering_event_id, r.event_count, r.attempt, r.worker, r.lease_until,
           r.not_before, r.error, r.partition_key
      FROM {{ns}}.dag_run r
     WHERE r.id = v_id;
END
$$;

ALTER FUNCTION {{ns}}.set_run_state(text, text, text)
    SECURITY DEFINER SET search_path = pg_catalog, pg_temp;
