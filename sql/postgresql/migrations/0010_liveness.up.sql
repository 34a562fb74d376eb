-- Migration 0010_liveness (up): a liveness table of the schedulers and workers that run
-- (issue 15 item 5), which `assetq status` shows, flagging those not heard from for three of
-- their intervals as stale.
--
--   * process_liveness: one row per running scheduler or worker loop (its made-up process
--     id, kind, worker name, host, pid, package version, heartbeat interval, when it
--     started and when it was last seen, by the database's clock);
--   * process_heartbeat inserts or refreshes a loop's row, process_gone deletes it at a
--     clean stop; both run with the owner's rights, like the other granted routines;
--   * grant_access gives them to the scheduler and worker kinds, revoke_access takes them
--     away; roles that hold either kind already get them here, and readers get SELECT on
--     the new table, so nobody needs to grant again.
--
-- Additive: no existing table, routine signature or result changes; grant_access and
-- revoke_access keep their signatures (CREATE OR REPLACE keeps their grants). A package of
-- 0009 or before never calls the new routines: its loops simply do not show in status.
-- Online: a new table and new functions; the existing ones are replaced in place.
--
-- {{ns}} is replaced by the quoted namespace when the file is loaded.

-- Liveness (migration 0010_liveness): one row per scheduler or worker loop that runs, so that
-- status can show who is alive. process_id is made up by the loop when it starts (uuid4
-- hex); kind is 'scheduler' or 'worker'; name is a worker's name (its runs' worker column
-- starts with it), NULL for a scheduler; host, pid and version (the assetq package's) say
-- where it runs and what; interval_seconds is how often it promises to heartbeat;
-- started_at is its first heartbeat and last_seen_at its latest, both by the database's
-- clock. A loop that stops cleanly deletes its row (process_gone); a killed one leaves it
-- behind, and status calls it stale once last_seen_at is three intervals old. purge deletes
-- rows last seen before its cutoff. No foreign key and no index but the key: one row per
-- process, written by that process only.
CREATE TABLE {{ns}}.process_liveness (
    process_id        varchar(64) PRIMARY KEY,
    kind              varchar(20) NOT NULL,
    name              varchar(250),
    host              varchar(255) NOT NULL,
    pid               bigint NOT NULL,
    version           varchar(64) NOT NULL,
    interval_seconds  double precision NOT NULL,
    started_at        timestamptz NOT NULL,
    last_seen_at      timestamptz NOT NULL,
    CONSTRAINT process_liveness_kind_check CHECK (kind IN ('scheduler', 'worker')),
    CONSTRAINT process_liveness_interval_check CHECK (interval_seconds > 0)
);

-- Readers of the namespace (grant_access 'reader' gave SELECT on every table that existed
-- then) can read the new table too.
DO $$
DECLARE
    v_grantee text;
BEGIN
    FOR v_grantee IN
        SELECT DISTINCT pg_catalog.pg_get_userbyid(a.grantee)
          FROM pg_catalog.pg_class c, pg_catalog.aclexplode(c.relacl) a
         WHERE c.oid = '{{ns}}.asset'::regclass
           AND a.privilege_type = 'SELECT' AND a.grantee <> c.relowner AND a.grantee <> 0
    LOOP
        EXECUTE format('GRANT SELECT ON {{ns}}.process_liveness TO %I', v_grantee);
    END LOOP;
END
$$;

-- Liveness (migration 0010_liveness). Records that loop p_process_id is alive now (database
-- clock): inserts its row on the first call, then moves last_seen_at (started_at stays).
-- One statement, so it is atomic on its own; the loops call it in a short transaction of its
-- own, never inside a pass or a run. AQ002 for a bad kind or interval; the lengths are the
-- columns'.
CREATE FUNCTION {{ns}}.process_heartbeat(
    p_process_id        text,
    p_kind              text,
    p_name              text,
    p_host              text,
    p_pid               bigint,
    p_version           text,
    p_interval_seconds  double precision
) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    IF p_kind IS NULL OR p_kind NOT IN ('scheduler', 'worker') THEN
        RAISE EXCEPTION 'unknown process kind %: use scheduler or worker', quote_nullable(p_kind)
            USING ERRCODE = 'AQ002';
    END IF;
    IF p_interval_seconds IS NULL OR NOT (p_interval_seconds > 0 AND p_interval_seconds <= 604800) THEN
        RAISE EXCEPTION 'liveness interval must be above 0 and at most 604800 seconds, got %',
                quote_nullable(p_interval_seconds)
            USING ERRCODE = 'AQ002';
    END IF;
    IF p_process_id IS NULL OR p_process_id = '' OR p_host IS NULL OR p_pid IS NULL OR p_version IS NULL THEN
        RAISE EXCEPTION 'a heartbeat needs a process id, host, pid and version'
            USING ERRCODE = 'AQ002';
    END IF;
    INSERT INTO {{ns}}.process_liveness AS l
           (process_id, kind, name, host, pid, version, interval_seconds, started_at, last_seen_at)
    VALUES (p_process_id, p_kind, p_name, p_host, p_pid, p_version, p_interval_seconds,
            clock_timestamp(), clock_timestamp())
    ON CONFLICT (process_id) DO UPDATE
       SET kind = EXCLUDED.kind, name = EXCLUDED.name, host = EXCLUDED.host, pid = EXCLUDED.pid,
           version = EXCLUDED.version, interval_seconds = EXCLUDED.interval_seconds,
           last_seen_at = EXCLUDED.last_seen_at;
END
$$;

-- Liveness (migration 0010_liveness). Deletes loop p_process_id's row: the loop stopped
-- cleanly. Idempotent (no row, nothing done).
CREATE FUNCTION {{ns}}.process_gone(p_process_id text) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM {{ns}}.process_liveness l WHERE l.process_id = p_process_id;
END
$$;

ALTER FUNCTION {{ns}}.process_heartbeat(text, text, text, text, bigint, text, double precision)
    SECURITY DEFINER SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION {{ns}}.process_gone(text)
    SECURITY DEFINER SET search_path = pg_catalog, pg_temp;
-- PostgreSQL lets PUBLIC execute every new function: only the owner and the roles given
-- access may execute these.
REVOKE EXECUTE ON FUNCTION {{ns}}.process_heartbeat(text, text, text, text, bigint, text, double precision),
                           {{ns}}.process_gone(text) FROM PUBLIC;

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
                       ' {{ns}}.register_events(jsonb) TO %I', p_grantee);
    ELSIF p_access = 'scheduler' THEN
        EXECUTE format('GRANT EXECUTE ON FUNCTION {{ns}}.schedule_pass(integer),'
                       ' {{ns}}.set_run_state(text, text, text),'
                       ' {{ns}}.retry_run(text, text) TO %I', p_grantee);
    ELSIF p_access = 'worker' THEN
        EXECUTE format('GRANT EXECUTE ON FUNCTION'
                       ' {{ns}}.claim_runs(text, integer, double precision, jsonb),'
                       ' {{ns}}.heartbeat_run(text, text, integer, double precision),'
                       ' {{ns}}.complete_run(text, text, integer, text, text, jsonb) TO %I', p_grantee);
    ELSE
        EXECUTE format('GRANT SELECT ON ALL TABLES IN SCHEMA {{ns}} TO %I', p_grantee);
    END IF;
    -- Schedulers and workers record that they are alive (migration 0010_liveness).
    IF p_access IN ('scheduler', 'worker') THEN
        EXECUTE format('GRANT EXECUTE ON FUNCTION'
                       ' {{ns}}.process_heartbeat(text, text, text, text, bigint, text, double precision),'
                       ' {{ns}}.process_gone(text) TO %I', p_grantee);
    END IF;
END
$$;

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
                   ' {{ns}}.register_events(jsonb), {{ns}}.schedule_pass(integer),'
                   ' {{ns}}.set_run_state(text, text, text), {{ns}}.retry_run(text, text),'
                   ' {{ns}}.claim_runs(text, integer, double precision, jsonb),'
                   ' {{ns}}.heartbeat_run(text, text, integer, double precision),'
                   ' {{ns}}.complete_run(text, text, integer, text, text, jsonb),'
                   ' {{ns}}.process_heartbeat(text, text, text, text, bigint, text, double precision),'
                   ' {{ns}}.process_gone(text) FROM %I',
                   p_grantee);
    EXECUTE format('REVOKE SELECT ON ALL TABLES IN SCHEMA {{ns}} FROM %I', p_grantee);
    EXECUTE format('REVOKE USAGE ON SCHEMA {{ns}} FROM %I', p_grantee);
END
$$;


-- Roles that hold the scheduler kind (EXECUTE on schedule_pass) or the worker kind (EXECUTE
-- on claim_runs) may record that they are alive from now on: an upgrade keeps what a kind
-- of access means.
DO $$
DECLARE
    v_grantee text;
BEGIN
    FOR v_grantee IN
        SELECT DISTINCT pg_catalog.pg_get_userbyid(a.grantee)
          FROM pg_catalog.pg_proc p, pg_catalog.aclexplode(p.proacl) a
         WHERE p.oid IN ('{{ns}}.schedule_pass(integer)'::regprocedure,
                         '{{ns}}.claim_runs(text, integer, double precision, jsonb)'::regprocedure)
           AND a.privilege_type = 'EXECUTE' AND a.grantee <> p.proowner AND a.grantee <> 0
    LOOP
        EXECUTE format('GRANT EXECUTE ON FUNCTION'
                       ' {{ns}}.process_heartbeat(text, text, text, text, bigint, text, double precision),'
                       ' {{ns}}.process_gone(text) TO %I', v_grantee);
    END LOOP;
END
$$;
