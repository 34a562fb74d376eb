-- Cancels run p_run_id of consumer p_dag_id: a queued run, or a running one at once, whoever
-- holds it, becomes cancelled, a final state: never claimed, not counted in max_active_runs.
-- Its holder is fenced like a worker whose lease was lost (I8): its next heartbeat or
-- completion is refused (AQ010) and nothing it wrote in its completion's transaction commits.
-- Its events stay consumed by this run (retry_run queues it again with them). error records
-- "cancelled" and p_reason. AQ008 for a run already final (success, failed, cancelled),
-- AQ006 for an unknown run. Returns the run (the complete_run columns, no output events).
CREATE OR REPLACE FUNCTION {{ns}}.cancel_run(p_dag_id text, p_run_id text, p_reason text DEFAULT NULL)
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
    v_now   timestamptz;
BEGIN
    SELECT l.p_id, l.p_state INTO v_id, v_state FROM {{ns}}.lock_run(p_dag_id, p_run_id) l;
    IF v_state NOT IN ('queued', 'running') THEN
        RAISE EXCEPTION 'run % of dag % is %: only a queued or running run can be cancelled', p_run_id, p_dag_id, v_state
            USING ERRCODE = 'AQ008',
                  HINT = 'A final run stays as it is; assetq run retry queues a failed or cancelled run again.';
    END IF;
    v_now := clock_timestamp();
    UPDATE {{ns}}.dag_run r
       SET state = 'cancelled', ended_at = v_now, updated_at = v_now, lease_until = NULL,
           not_before = NULL, deadline = NULL,
           error = left('cancelled' || coalesce(': ' || p_reason, ''), 4000)
     WHERE r.id = v_id;
    RETURN QUERY
    SELECT r.id, r.dag_id, r.run_id, r.seq, r.state, r.run_after, r.created_at, r.started_at,
           r.ended_at, r.triggering_event_id, r.event_count, r.attempt, r.worker, r.lease_until,
           r.not_before, r.error, CAST('{}' AS bigint[]), r.partition_key
      FROM {{ns}}.dag_run r
     WHERE r.id = v_id;
END
$$;

ALTER FUNCTION {{ns}}.cancel_run(text, text, text)
    SECURITY DEFINER SET search_path = pg_catalog, pg_temp;
