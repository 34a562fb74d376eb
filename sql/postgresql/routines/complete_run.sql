-- complete_run_v2 with no claim time (the attempt alone fences): the routine of assetq
-- 0.1.0's workers, kept for them while they are in the compatibility window
-- (docs/operations.md).
CREATE OR REPLACE FUNCTION {{ns}}.complete_run(
    p_dag_id  text,
    p_run_id  text,
    p_attempt integer,
    p_state   text,
    p_error   text DEFAULT NULL,
    p_events  jsonb DEFAULT NULL
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
LANGUAGE sql AS $$
    SELECT * FROM {{ns}}.complete_run_v2(p_dag_id, p_run_id, p_attempt, p_state, p_error, p_events, NULL)
$$;

ALTER FUNCTION {{ns}}.complete_run(text, text, integer, text, text, jsonb)
    SECURITY DEFINER SET search_path = pg_catalog, pg_temp;
