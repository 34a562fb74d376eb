-- The baseline's downgrade (migrations/versions/0001_baseline.py): every table of tables.sql,
-- after assetq.migrate has dropped each routine of routines/ (the triggers and the view go
-- with their tables: CASCADE). The version table goes last, in assetq.migrate.
DROP TABLE IF EXISTS {{ns}}.routine_catalogue CASCADE;
DROP TABLE IF EXISTS {{ns}}.process_liveness CASCADE;
DROP TABLE IF EXISTS {{ns}}.asset_partition_queue CASCADE;
DROP TABLE IF EXISTS {{ns}}.dag_partition_static_key CASCADE;
DROP TABLE IF EXISTS {{ns}}.dag_condition_alias CASCADE;
DROP TABLE IF EXISTS {{ns}}.asset_event_alias CASCADE;
DROP TABLE IF EXISTS {{ns}}.asset_alias_asset CASCADE;
DROP TABLE IF EXISTS {{ns}}.asset_alias CASCADE;
DROP TABLE IF EXISTS {{ns}}.dagrun_asset_event CASCADE;
DROP TABLE IF EXISTS {{ns}}.dag_run CASCADE;
DROP TABLE IF EXISTS {{ns}}.asset_dag_run_queue CASCADE;
DROP TABLE IF EXISTS {{ns}}.asset_event CASCADE;
DROP TABLE IF EXISTS {{ns}}.dag_condition_clause CASCADE;
DROP TABLE IF EXISTS {{ns}}.dag_schedule_asset_reference CASCADE;
DROP TABLE IF EXISTS {{ns}}.dag CASCADE;
DROP TABLE IF EXISTS {{ns}}.asset CASCADE;
