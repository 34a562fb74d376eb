-- Migration 0003_operations (down): removes what 0003_operations.up.sql created and gives
-- the routines back the rights they had at 0002: executed by PUBLIC, with the caller's rights.
-- Privileges grant_access gave to roles go with the objects they were on; USAGE on the
-- schema stays until the schema is dropped (revoke_access takes it away first).

GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA {{ns}} TO PUBLIC;
ALTER FUNCTION {{ns}}.schedule_pass(integer) SECURITY INVOKER RESET search_path;
ALTER FUNCTION {{ns}}.register_events(jsonb) SECURITY INVOKER RESET search_path;
ALTER FUNCTION {{ns}}.register_event(text, jsonb, text, text, text, integer, text)
    SECURITY INVOKER RESET search_path;

DROP FUNCTION IF EXISTS {{ns}}.revoke_access(text, text);
DROP FUNCTION IF EXISTS {{ns}}.grant_access(text, text, text);
DROP FUNCTION IF EXISTS {{ns}}.purge_events(timestamptz, integer, timestamptz, bigint);
DROP FUNCTION IF EXISTS {{ns}}.purge_runs(timestamptz, integer);
DROP VIEW IF EXISTS {{ns}}.dag_queue_status;
DROP INDEX IF EXISTS {{ns}}.dag_run_dag_created_idx;
DROP INDEX IF EXISTS {{ns}}.dag_run_created_idx;
DROP INDEX IF EXISTS {{ns}}.asset_event_timestamp_idx;
DROP INDEX IF EXISTS {{ns}}.asset_dag_run_queue_event_idx;
DROP TRIGGER IF EXISTS asset_dag_run_queue_notify ON {{ns}}.asset_dag_run_queue;
DROP FUNCTION IF EXISTS {{ns}}.asset_dag_run_queue_notify();
