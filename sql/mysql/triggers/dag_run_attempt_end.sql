-- Attempt history: records the attempt a run's update ends in dag_run_attempt (revision
-- 0003_run_attempts): an update that ends a claimed attempt, the run running under a lease
-- and now in another state, or claimed again as a later attempt after its lease expired. A
-- claim, a heartbeat and a run moved by hand record nothing. Every routine that ends an
-- attempt sets updated_at to its time; an expired attempt ended when its lease did. The
-- error is the run's (the handler's traceback, "timed out after 30s", "cancelled: reason");
-- none for a success. A second end of the same attempt (cannot happen through the routines)
-- keeps the first.
DELIMITER $$
DROP TRIGGER IF EXISTS {{ns}}.dag_run_attempt_end
$$
CREATE TRIGGER {{ns}}.dag_run_attempt_end
    AFTER UPDATE ON {{ns}}.dag_run
    FOR EACH ROW
BEGIN
    IF OLD.state = 'running' AND OLD.lease_until IS NOT NULL
       AND (NEW.state <> 'running' OR NEW.attempt <> OLD.attempt) THEN
        INSERT INTO {{ns}}.dag_run_attempt
               (dag_run_id, attempt, worker, started_at, ended_at, outcome, error)
        VALUES (OLD.id, OLD.attempt, OLD.worker, OLD.started_at,
                CASE WHEN NEW.state = 'running' THEN OLD.lease_until
                     ELSE COALESCE(NEW.updated_at, UTC_TIMESTAMP(6)) END,
                CASE NEW.state WHEN 'running' THEN 'expired' WHEN 'queued' THEN 'failed'
                               ELSE NEW.state END,
                CASE WHEN NEW.state = 'running'
                     THEN CONCAT('the lease expired; attempt ', NEW.attempt, ' was claimed by ',
                                 COALESCE(NEW.worker, '?'))
                     WHEN NEW.state = 'success' THEN NULL
                     ELSE NEW.error END)
        ON DUPLICATE KEY UPDATE attempt = attempt;
    END IF;
END
$$
DELIMITER ;
