-- Finishes attempt p_attempt of run p_run_id of consumer p_dag_id, in the caller's
-- transaction (I9): with p_state 'success' the run succeeds and the events p_events (a JSON
-- array, as register_events takes it, or NULL) are registered and fanned out, so the caller's
-- own writes, the success and the output events commit together or not at all. With
-- 'failed' the error p_error is recorded and the run retried or failed for good
-- (fail_attempt, the retry policy). Success and a final failure free a place under
-- max_active_runs. Returns the run, with the ids of the output events in input order.
-- p_started_at, the claim's started_at, fences the claim itself (lock_claim): NULL, the
-- attempt alone.
-- AQ010 (lease lost, nothing written) unless the run is running at that attempt, and for a
-- success past the attempt's deadline (its timeout); AQ008 for another state; AQ002 for events with a failure; register_events' own errors for bad events.
CREATE OR REPLACE FUNCTION {{ns}}.complete_run_v2(
    p_dag_id     text,
    p_run_id     text,
    p_attempt    integer,
    p_state      text,
    p_error      text DEFAULT NULL,
    p_events     jsonb DEFAULT NULL,
    p_started_at timestamptz DEFAULT NULL
) RETURNS TABLE (
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
    v_id        bigint;
    v_now       timestamptz;
    v_out       bigint[];
BEGIN
    IF p_state IS NULL OR p_state NOT IN ('success', 'failed') THEN
        RAISE EXCEPTION 'a run is completed as success or failed, got %', quote_nullable(p_state)
            USING ERRCODE = 'AQ008';
    END IF;
    IF p_state = 'failed' AND p_events IS NOT NULL AND p_events <> '[]'::jsonb THEN
        RAISE EXCEPTION 'a failed run produces no events' USING ERRCODE = 'AQ002';
    END IF;
    v_id := {{ns}}.lock_claim(
        p_dag_id, p_run_id, p_attempt, p_started_at,
        'Roll back: another worker holds it now, or it was finished; nothing was written.');
    v_now := clock_timestamp();
    IF p_state = 'success' THEN
        -- Past its deadline the attempt has timed out (claim_runs_v2): its success is refused
        -- as a lost lease is, whatever the caller wrote rolls back; a failure is still taken.
        IF EXISTS (SELECT 1 FROM {{ns}}.dag_run r WHERE r.id = v_id AND r.deadline <= v_now) THEN
            RAISE EXCEPTION 'lease lost: attempt % of run % of dag % timed out', p_attempt, p_run_id, p_dag_id
                USING ERRCODE = 'AQ010',
                      HINT = 'Roll back: the attempt ran past its timeout; nothing was written.';
        END IF;
        IF p_events IS NOT NULL AND p_events <> '[]'::jsonb THEN
            SELECT array_agg(e.event_id ORDER BY e.item_no) INTO v_out
              FROM {{ns}}.register_events(p_events) e;
        END IF;
        UPDATE {{ns}}.dag_run r
           SET state = 'success', ended_at = v_now, updated_at = v_now, lease_until = NULL,
               not_before = NULL, deadline = NULL
         WHERE r.id = v_id;
        PERFORM {{ns}}.run_ended(p_dag_id);
    ELSE
        PERFORM {{ns}}.fail_attempt(v_id, p_error, v_now);
    END IF;
    RETURN QUERY
    SELECT r.id, r.dag_id, r.run_id, r.seq, r.state, r.run_after, r.created_at, r.started_at,
           r.ended_at, r.triggering_event_id, r.event_count, r.attempt, r.worker, r.lease_until,
           r.not_before, r.error, coalesce(v_out, '{}'), r.partition_key
      FROM {{ns}}.dag_run r
     WHERE r.id = v_id;
END
$$;

ALTER FUNCTION {{ns}}.complete_run_v2(text, text, integer, text, text, jsonb, timestamptz)
    SECURITY DEFINER SET search_path = pg_catalog, pg_temp;
