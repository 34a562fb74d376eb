CREATE OR REPLACE TRIGGER asset_dag_run_queue_notify
    AFTER INSERT ON {{ns}}.asset_dag_run_queue
    REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION {{ns}}.asset_dag_run_queue_notify();
