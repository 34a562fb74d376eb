-- Migration 0001_initial (down): removes everything 0001_initial.up.sql created, and nothing
-- else. alembic's version table and the namespace itself are removed by assetq.uninstall.

DROP TRIGGER IF EXISTS asset_event_fan_out ON {{ns}}.asset_event;
DROP FUNCTION IF EXISTS {{ns}}.schedule_pass(integer);
DROP FUNCTION IF EXISTS {{ns}}.set_dag_paused(text, boolean);
DROP FUNCTION IF EXISTS {{ns}}.declare_dag(text, jsonb, jsonb, boolean);
DROP FUNCTION IF EXISTS {{ns}}.declare_asset(text, text, jsonb);
DROP FUNCTION IF EXISTS {{ns}}.register_event(text, jsonb, text, text, text, integer, text);
DROP FUNCTION IF EXISTS {{ns}}.resolve_asset(text);
DROP FUNCTION IF EXISTS {{ns}}.asset_event_fan_out();
DROP TABLE IF EXISTS {{ns}}.dagrun_asset_event;
DROP TABLE IF EXISTS {{ns}}.dag_run;
DROP TABLE IF EXISTS {{ns}}.asset_dag_run_queue;
DROP TABLE IF EXISTS {{ns}}.asset_event;
DROP TABLE IF EXISTS {{ns}}.dag_condition_clause;
DROP TABLE IF EXISTS {{ns}}.dag_schedule_asset_reference;
DROP TABLE IF EXISTS {{ns}}.dag;
DROP TABLE IF EXISTS {{ns}}.asset;
