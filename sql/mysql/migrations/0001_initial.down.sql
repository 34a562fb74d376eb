-- Migration 0001_initial (down): removes everything 0001_initial.up.sql created, and nothing
-- else. alembic's version table and the namespace itself are removed by assetq.uninstall.
-- Every statement can run twice: MySQL commits each DDL statement on its own.

DROP TRIGGER IF EXISTS {{ns}}.asset_event_fan_out;
DROP TRIGGER IF EXISTS {{ns}}.dag_add_lock_row;
DROP PROCEDURE IF EXISTS {{ns}}.schedule_pass;
DROP PROCEDURE IF EXISTS {{ns}}.set_dag_paused;
DROP PROCEDURE IF EXISTS {{ns}}.declare_dag;
DROP PROCEDURE IF EXISTS {{ns}}.declare_asset;
DROP PROCEDURE IF EXISTS {{ns}}.register_event;
DROP PROCEDURE IF EXISTS {{ns}}.resolve_asset;
DROP TABLE IF EXISTS {{ns}}.dagrun_asset_event;
DROP TABLE IF EXISTS {{ns}}.dag_run;
DROP TABLE IF EXISTS {{ns}}.asset_dag_run_queue;
DROP TABLE IF EXISTS {{ns}}.asset_event;
DROP TABLE IF EXISTS {{ns}}.dag_condition_clause;
DROP TABLE IF EXISTS {{ns}}.dag_schedule_asset_reference;
DROP TABLE IF EXISTS {{ns}}.dag_lock;
DROP TABLE IF EXISTS {{ns}}.dag;
DROP TABLE IF EXISTS {{ns}}.asset;
