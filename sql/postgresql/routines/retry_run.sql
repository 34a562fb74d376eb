-- Puts failed or cancelled run p_run_id of consumer p_dag_id back in the queue, claimable
-- now, with the same events and run id; its next claim is the next attempt (the count goes
-- on), and it is given one more attempt whatever max_attempts says. AQ008 unless the run is
-- failed or cancelled, AQ006 for an unknown run. It may put the consumer one run over
-- max_active_runs. Returns the run (the complete_run columns, no output events).
CREATE OR REPLACE FUNCTION {{ns}}.retry_run(p_dag_id text, p_run_id text)
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
    output_event_ids    bigint[],
    partition_key       varchar
)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_id    bigint;
    v_state text;
BEGIN
    SELECT l.p_id, l.p_state INTO v_id, v_state FROM {{ns}}.lock_run(p_dag_id, p_run_id) l;
    IF v_state NOT IN ('failed', 'cancelled') THEN
        RAISE EXCEPTION 'run % of dag % is %: only a failed or cancelled run can be retried', p_run_id, p_dag_id, v_state
            USING ERRCODE = 'AQ008';
    END IF;
    UPDATE {{ns}}.dag_run r
       SET state = 'queued', ended_at = NULL, lease_until = NULL, deadline = NULL,
           not_before = clock_timestamp(),
           updated_at = clock_timestamp()
     WHERE r.id = v_id;
    RETURN QUERY
    SELECT r.id, r.dag_id, r.run_id, r.seq, r.state, r.run_after, r.created_at, r.started_at,
           r.ended_at, r.triggering_event_id, r.event_count, r.attempt, r.worker, r.lease_until,
           r.not_before, r.error, CAST('{}' AS bigint[]), r.partition_key
      FROM {{ns}}.dag_run r
     WHERE r.id = v_id;
END
$$;

ALTER FUNCTION {{ns}}.retry_run(text, text)
    SECURITY DEFINER SET search_path = pg_catalog, pg_temp;
