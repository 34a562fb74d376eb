-- register_events under a savepoint of its own, taken and released by the server inside the
-- call's one round trip, reporting its error instead of raising it, as register_event_v2
-- does for one event (its file says why): a failed batch leaves the caller's transaction
-- exactly as it was, and usable.
--
-- Returns register_events' rows with error_code and error_message NULL, or, after an error,
-- one row with only those two set (item_no NULL): nothing of the batch remains.
CREATE OR REPLACE FUNCTION {{ns}}.register_events_v2(p_events jsonb)
RETURNS TABLE (
    item_no         integer,
    event_id        bigint,
    asset_id        bigint,
    event_timestamp timestamptz,
    created         boolean,
    error_code      text,
    error_message   text
)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_code    text;
    v_message text;
    v_detail  text;
    v_hint    text;
BEGIN
    BEGIN
        -- Read whole before any row is returned: an error after some rows leaves none.
        RETURN QUERY
        SELECT r.item_no, r.event_id, r.asset_id, r.event_timestamp, r.created,
               NULL::text, NULL::text
          FROM {{ns}}.register_events(p_events) r;
    EXCEPTION
        WHEN OTHERS OR query_canceled THEN  -- register_event_v2.sql says why both
            GET STACKED DIAGNOSTICS v_code = RETURNED_SQLSTATE,
                                    v_message = MESSAGE_TEXT,
                                    v_detail = PG_EXCEPTION_DETAIL,
                                    v_hint = PG_EXCEPTION_HINT;
            RETURN QUERY
            SELECT NULL::integer, NULL::bigint, NULL::bigint, NULL::timestamptz, NULL::boolean,
                   v_code, concat_ws(' ', v_message, 'Detail: ' || nullif(v_detail, ''),
                                     'Hint: ' || nullif(v_hint, ''));
    END;
END
$$;

-- Runs with its owner's rights, its search_path pinned (grant_access.sql says why).
ALTER FUNCTION {{ns}}.register_events_v2(jsonb)
    SECURITY DEFINER SET search_path = pg_catalog, pg_temp;
