CREATE OR REPLACE TRIGGER dag_run_notify
    AFTER INSERT ON {{ns}}.dag_run
    FOR EACH STATEMENT EXECUTE FUNCTION {{ns}}.dag_run_notify();
