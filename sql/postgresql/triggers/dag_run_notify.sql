CREATE OR REPLACE TRIGGER dag_run_notify
    AFTER INSERT ON {{ns}}.dag_run
    REFERENCING NEW TABLE AS new_runs
    FOR EACH STATEMENT EXECUTE FUNCTION {{ns}}.dag_run_notify();
