-- register_event under a savepoint of its own, taken and released by the server inside the
-- one round trip of the call, and reporting its error instead of raising it: the caller's
-- transaction is left exactly as it was before a failed call, and usable. PostgreSQL aborts a
-- transaction at any raised error, so without this the client had to send SAVEPOINT before
-- and RELEASE after every call: two round trips more, a third of a producer's throughput
-- (docs/benchmarks.md, "The producer's default path").
--
-- Returns register_event's row with error_code and error_message NULL, or, after an error,
-- one row with only those two set: the SQLSTATE (AQ001 unknown asset, AQ002, AQ005
-- idempotency conflict, AQ011 unmappable partition, or the server's own code: a foreign key,
-- a deadlock, a lock timeout, a cancelled statement) and the message with its detail and hint,
-- as a client would have read them from the error. Nothing of the failed call remains, its
-- locks included (the exception block's subtransaction is rolled back). Errors that end the
-- session (a lost connection, a shutdown) are not caught: there is no transaction left.
CREATE OR REPLACE FUNCTION {{ns}}.register_event_v2(
    p_asset             text,
    p_extra             jsonb DEFAULT '{}'::jsonb,
    p_source_dag_id     text DEFAULT NULL,
    p_source_task_id    text DEFAULT NULL,
    p_source_run_id     text DEFAULT NULL,
    p_source_map_index  integer DEFAULT -1,
    p_idempotency_key   text DEFAULT NULL
) RETURNS TABLE (
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
    v_detail text;
    v_hint   text;
BEGIN
    BEGIN
        SELECT r.event_id, r.asset_id, r.event_timestamp, r.created
          INTO event_id, asset_id, event_timestamp, created
          FROM {{ns}}.register_event(p_asset, p_extra, p_source_dag_id, p_source_task_id,
                                     p_source_run_id, p_source_map_index, p_idempotency_key) r;
    EXCEPTION
        -- OTHERS leaves out query_canceled (a statement_timeout, a cancel request), named
        -- here: the client's savepoint rolled that back too, and the caller still gets it.
        WHEN OTHERS OR query_canceled THEN
            GET STACKED DIAGNOSTICS error_code = RETURNED_SQLSTATE,
                                    error_message = MESSAGE_TEXT,
                                    v_detail = PG_EXCEPTION_DETAIL,
                                    v_hint = PG_EXCEPTION_HINT;
            event_id := NULL;
            asset_id := NULL;
            event_timestamp := NULL;
            created := NULL;
            error_message := concat_ws(' ', error_message,
                                       'Detail: ' || nullif(v_detail, ''),
                                       'Hint: ' || nullif(v_hint, ''));
    END;
    RETURN NEXT;
END
$$;

-- Runs with its owner's rights, its search_path pinned (grant_access.sql says why).
ALTER FUNCTION {{ns}}.register_event_v2(text, jsonb, text, text, text, integer, text)
    SECURITY DEFINER SET search_path = pg_catalog, pg_temp;
