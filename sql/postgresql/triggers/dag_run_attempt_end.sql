-- Attempt history: a run's update that ends a claimed attempt records it
-- (routines/dag_run_attempt_end.sql says which). The WHEN clause keeps every other update of
-- dag_run (claims, heartbeats, passes) from calling the function at all.
CREATE OR REPLACE TRIGGER dag_run_attempt_end
    AFTER UPDATE ON {{ns}}.dag_run
    FOR EACH ROW
    WHEN (OLD.state = 'running' AND OLD.lease_until IS NOT NULL
          AND (NEW.state <> 'running' OR NEW.attempt <> OLD.attempt))
    EXECUTE FUNCTION {{ns}}.dag_run_attempt_end();
