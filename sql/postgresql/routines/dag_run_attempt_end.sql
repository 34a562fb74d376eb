-- Attempt history: records the attempt a run's update ends in dag_run_attempt (revision
-- 0003_run_attempts). Called by the trigger dag_run_attempt_end only for an update that ends
-- a claimed attempt: the run was running under a lease and is now in another state, or was
-- claimed again as a later attempt after its lease expired (its WHEN clause: a claim, a
-- heartbeat and a run moved by hand call nothing). Every routine that ends an attempt sets
-- updated_at to its time; an expired attempt ended when its lease did. The error is the
-- run's (the handler's traceback, "timed out after 30s", "cancelled: reason"); none for a
-- success. A second end of the same attempt (cannot happen through the routines) keeps the
-- first.
CREATE OR REPLACE FUNCTION {{ns}}.dag_run_attempt_end() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO {{ns}}.dag_run_attempt (dag_run_id, attempt, worker, started_at, ended_at, outcome, error)
    VALUES (OLD.id, OLD.attempt, OLD.worker, OLD.started_at,
            CASE WHEN NEW.state = 'running' THEN OLD.lease_until
                 ELSE coalesce(NEW.updated_at, clock_timestamp()) END,
            CASE NEW.state WHEN 'running' THEN 'expired' WHEN 'queued' THEN 'failed' ELSE NEW.state END,
            CASE WHEN NEW.state = 'running'
                 THEN format('the lease expired; attempt %s was claimed by %s', NEW.attempt, NEW.worker)
                 WHEN NEW.state = 'success' THEN NULL
                 ELSE NEW.error END)
    ON CONFLICT (dag_run_id, attempt) DO NOTHING;
    RETURN NULL;
END
$$;
