-- Registers one event in the caller's transaction and returns it, in one round trip.
-- With an idempotency key, a retry (same asset, same key) returns the original event with
-- created = false and queues nothing; the same key with a different extra raises AQ005.
CREATE OR REPLACE FUNCTION {{ns}}.register_event(
    p_asset             text,
    p_extra             jsonb DEFAULT '{}'::jsonb,
    p_source_dag_id     text DEFAULT NULL,
    p_source_task_id    text DEFAULT NULL,
    p_source_run_id     text DEFAULT NULL,
    p_source_map_index  integer DEFAULT -1,
    p_idempotency_key   text DEFAULT NULL
) RETURNS TABLE (event_id bigint, asset_id bigint, event_timestamp timestamptz, created boolean)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_asset_id  bigint;
    v_extra     jsonb := coalesce(p_extra, '{}'::jsonb);
    v_old_extra jsonb;
BEGIN
    IF jsonb_typeof(v_extra) <> 'object' THEN
        RAISE EXCEPTION 'event extra must be a JSON object, got %', jsonb_typeof(v_extra)
            USING ERRCODE = 'AQ002';
    END IF;
    v_asset_id := {{ns}}.resolve_asset(p_asset);
    asset_id := v_asset_id;

    INSERT INTO {{ns}}.asset_event AS e
           (asset_id, extra, source_dag_id, source_task_id, source_run_id, source_map_index,
            idempotency_key)
    VALUES (v_asset_id, v_extra, p_source_dag_id, p_source_task_id, p_source_run_id,
            coalesce(p_source_map_index, -1), p_idempotency_key)
    ON CONFLICT (asset_id, idempotency_key) DO NOTHING
    RETURNING e.id, e."timestamp" INTO event_id, event_timestamp;

    IF FOUND THEN
        created := true;
    ELSE
        -- Only an idempotency-key conflict reaches here (a NULL key never conflicts). The
        -- conflicting row is committed: ON CONFLICT waited for its transaction to finish.
        SELECT e.id, e."timestamp", e.extra INTO event_id, event_timestamp, v_old_extra
          FROM {{ns}}.asset_event e
         WHERE e.asset_id = v_asset_id AND e.idempotency_key = p_idempotency_key;
        IF v_old_extra IS DISTINCT FROM v_extra THEN
            RAISE EXCEPTION 'idempotency key % was already used for event % of this asset with a different extra',
                    quote_literal(p_idempotency_key), event_id
                USING ERRCODE = 'AQ005',
                      HINT = 'Reuse a key only to retry the very same registration.';
        END IF;
        created := false;
    END IF;
    RETURN NEXT;
END
$$;

-- Runs with its owner's rights, its search_path pinned (grant_access.sql says why).
ALTER FUNCTION {{ns}}.register_event(text, jsonb, text, text, text, integer, text)
    SECURITY DEFINER SET search_path = pg_catalog, pg_temp;
