-- The baseline's downgrade (migrations/versions/0001_baseline.py): every table of tables.sql,
-- after assetq.migrate has dropped each routine, trigger and view of routines/, triggers/ and
-- views/. Children before parents (foreign keys). The version table goes last, in
-- assetq.migrate.
DROP TABLE IF EXISTS {{ns}}.routine_catalogue;
DROP TABLE IF EXISTS {{ns}}.process_liveness;
DROP TABLE IF EXISTS {{ns}}.asset_partition_queue;
DROP TABLE IF EXISTS {{ns}}.dag_partition_static_key;
DROP TABLE IF EXISTS {{ns}}.dag_condition_alias;
DROP TABLE IF EXISTS {{ns}}.asset_event_alias;
DROP TABLE IF EXISTS {{ns}}.asset_alias_asset;
DROP TABLE IF EXISTS {{ns}}.asset_alias;
DROP TABLE IF EXISTS {{ns}}.dagrun_asset_event;
DROP TABLE IF EXISTS {{ns}}.dag_run;
DROP TABLE IF EXISTS {{ns}}.asset_dag_run_queue;
DROP TABLE IF EXISTS {{ns}}.asset_event;
DROP TABLE IF EXISTS {{ns}}.dag_condition_clause;
DROP TABLE IF EXISTS {{ns}}.dag_schedule_asset_reference;
DROP TABLE IF EXISTS {{ns}}.dag_lock;
DROP TABLE IF EXISTS {{ns}}.dag;
DROP TABLE IF EXISTS {{ns}}.asset;
