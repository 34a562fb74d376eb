-- Least privilege. Four kinds of access, granted to existing roles by grant_access:
--   producer   register_event(_v2) and register_events(_v2): can register events, nothing else;
--   scheduler  schedule_pass(_v2), set_run_state, retry_run and cancel_run: can run scheduler
--              passes, move run states, retry failed runs and cancel runs, nothing else;
--   worker     claim_runs(_v2), schedule_and_claim, heartbeat_run(_v2) and complete_run(_v2):
--              can claim runs (after a pass of their own consumers: schedule_and_claim),
--              renew their leases and complete them with their output events, nothing else;
--   reader     SELECT on every table and view of the namespace: can read, never write.
-- Schedulers and workers may also record that they are alive (process_heartbeat and
-- process_gone); producers and readers may not. Workers may also record the consumers they
-- have handlers for (process_handles).
-- Every kind also gets USAGE on the schema and SELECT on the version table (assetq checks
-- the installed revision). No kind gets any other right on a table: they act only through
-- the routines granted to them, which run with their owner's rights (SECURITY DEFINER, in
-- each routine's file after its CREATE). Their search_path is pinned to pg_catalog then
-- pg_temp, so a caller cannot slip an object of its own in front of a built-in; every assetq
-- object they use is schema-qualified already. A routine a later package adds is given to
-- the roles of its kind when it is created (assetq.routines.regrant).
--
-- Gives the existing role p_grantee one kind of access (see above); p_host must be NULL (it
-- is MySQL's account host). Idempotent. Runs with the caller's rights: the caller must own
-- assetq's objects (or hold them WITH GRANT OPTION). AQ002 for an unknown kind or role.
CREATE OR REPLACE FUNCTION {{ns}}.grant_access(p_access text, p_grantee text, p_host text DEFAULT NULL)
RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    IF p_access IS NULL OR p_access NOT IN ('producer', 'scheduler', 'worker', 'reader') THEN
        RAISE EXCEPTION 'unknown access %: use producer, scheduler, worker or reader', quote_nullable(p_access)
            USING ERRCODE = 'AQ002';
    END IF;
    IF p_host IS NOT NULL THEN
        RAISE EXCEPTION 'a PostgreSQL role has no host: got %', quote_literal(p_host)
            USING ERRCODE = 'AQ002';
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_roles r WHERE r.rolname = p_grantee) THEN
        RAISE EXCEPTION 'role % does not exist', quote_nullable(p_grantee)
            USING ERRCODE = 'AQ002',
                  HINT = 'Create it first, e.g. CREATE ROLE name LOGIN PASSWORD ''...''.';
    END IF;
    EXECUTE format('GRANT USAGE ON SCHEMA {{ns}} TO %I', p_grantee);
    EXECUTE format('GRANT SELECT ON {{ns}}.assetq_alembic_version TO %I', p_grantee);
    IF p_access = 'producer' THEN
        EXECUTE format('GRANT EXECUTE ON FUNCTION'
                       ' {{ns}}.register_event(text, jsonb, text, text, text, integer, text),'
                       ' {{ns}}.register_event_v2(text, jsonb, text, text, text, integer, text),'
                       ' {{ns}}.register_events(jsonb), {{ns}}.register_events_v2(jsonb) TO %I',
                       p_grantee);
    ELSIF p_access = 'scheduler' THEN
        EXECUTE format('GRANT EXECUTE ON FUNCTION {{ns}}.schedule_pass(integer),'
                       ' {{ns}}.schedule_pass_v2(integer, jsonb, double precision),'
                       ' {{ns}}.set_run_state(text, text, text),'
                       ' {{ns}}.retry_run(text, text),'
                       ' {{ns}}.cancel_run(text, text, text) TO %I', p_grantee);
    ELSIF p_access = 'worker' THEN
        EXECUTE format('GRANT EXECUTE ON FUNCTION'
                       ' {{ns}}.claim_runs(text, integer, double precision, jsonb),'
                       ' {{ns}}.claim_runs_v2(text, integer, double precision, jsonb, double precision),'
                       ' {{ns}}.schedule_and_claim(text, integer, double precision, jsonb, double precision, double precision),'
                       ' {{ns}}.heartbeat_run(text, text, integer, double precision),'
                       ' {{ns}}.heartbeat_run_v2(text, text, integer, double precision, timestamptz),'
                       ' {{ns}}.complete_run(text, text, integer, text, text, jsonb),'
                       ' {{ns}}.complete_run_v2(text, text, integer, text, text, jsonb, timestamptz) TO %I', p_grantee);
    ELSE
        EXECUTE format('GRANT SELECT ON ALL TABLES IN SCHEMA {{ns}} TO %I', p_grantee);
    END IF;
    -- Schedulers and workers record that they are alive.
    IF p_access IN ('scheduler', 'worker') THEN
        EXECUTE format('GRANT EXECUTE ON FUNCTION'
                       ' {{ns}}.process_heartbeat(text, text, text, text, bigint, text, double precision),'
                       ' {{ns}}.process_gone(text) TO %I', p_grantee);
    END IF;
    -- Workers record the consumers they have handlers for.
    IF p_access = 'worker' THEN
        EXECUTE format('GRANT EXECUTE ON FUNCTION {{ns}}.process_handles(text, jsonb) TO %I', p_grantee);
    END IF;
END
$$;
