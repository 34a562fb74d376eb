-- Takes every kind of access grant_access gave p_grantee away again. Idempotent.
CREATE OR REPLACE FUNCTION {{ns}}.revoke_access(p_grantee text, p_host text DEFAULT NULL)
RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    IF p_host IS NOT NULL THEN
        RAISE EXCEPTION 'a PostgreSQL role has no host: got %', quote_literal(p_host)
            USING ERRCODE = 'AQ002';
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_roles r WHERE r.rolname = p_grantee) THEN
        RAISE EXCEPTION 'role % does not exist', quote_nullable(p_grantee) USING ERRCODE = 'AQ002';
    END IF;
    EXECUTE format('REVOKE EXECUTE ON FUNCTION'
                   ' {{ns}}.register_event(text, jsonb, text, text, text, integer, text),'
                   ' {{ns}}.register_event_v2(text, jsonb, text, text, text, integer, text),'
                   ' {{ns}}.register_events(jsonb), {{ns}}.register_events_v2(jsonb),'
                   ' {{ns}}.schedule_pass(integer),'
                   ' {{ns}}.schedule_pass_v2(integer, jsonb, double precision),'
                   ' {{ns}}.set_run_state(text, text, text), {{ns}}.retry_run(text, text),'
                   ' {{ns}}.cancel_run(text, text, text),'
                   ' {{ns}}.claim_runs(text, integer, double precision, jsonb),'
                   ' {{ns}}.claim_runs_v2(text, integer, double precision, jsonb, double precision),'
                   ' {{ns}}.schedule_and_claim(text, integer, double precision, jsonb, double precision, double precision),'
                   ' {{ns}}.heartbeat_run(text, text, integer, double precision),'
                   ' {{ns}}.heartbeat_run_v2(text, text, integer, double precision, timestamptz),'
                   ' {{ns}}.complete_run(text, text, integer, text, text, jsonb),'
                   ' {{ns}}.complete_run_v2(text, text, integer, text, text, jsonb, timestamptz),'
                   ' {{ns}}.process_heartbeat(text, text, text, text, bigint, text, double precision),'
                   ' {{ns}}.process_gone(text),'
                   ' {{ns}}.process_handles(text, jsonb) FROM %I',
                   p_grantee);
    EXECUTE format('REVOKE SELECT ON ALL TABLES IN SCHEMA {{ns}} FROM %I', p_grantee);
    EXECUTE format('REVOKE USAGE ON SCHEMA {{ns}} FROM %I', p_grantee);
END
$$;
