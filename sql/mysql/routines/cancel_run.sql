-- Cancels run p_run_id of consumer p_dag_id: a queued run, or a running one at once, whoever
-- holds it, becomes cancelled, a final state: never claimed, not counted in max_active_runs.
-- Its holder is fenced like a worker whose lease was lost (I8): its next heartbeat or
-- completion is refused (AQ010) and nothing it wrote in its completion's transaction commits.
-- Its events stay consumed by this run (retry_run queues it again with them). error records
-- "cancelled" and p_reason. AQ008 for a run already final (success, failed, cancelled),
-- AQ006 for an unknown run. Returns the run (the complete_run columns, no output events).
DELIMITER $$
DROP PROCEDURE IF EXISTS {{ns}}.cancel_run
$$
CREATE PROCEDURE {{ns}}.cancel_run(
    IN p_dag_id TEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin,
    IN p_run_id TEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin,
    IN p_reason TEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin
)
MODIFIES SQL DATA
BEGIN
    DECLARE v_id      BIGINT;
    DECLARE v_state   VARCHAR(20) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin;
    DECLARE v_attempt INT;
    DECLARE v_lease   DATETIME(6);
    DECLARE v_worker  VARCHAR(250) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin;
    DECLARE v_now     DATETIME(6);
    DECLARE v_message VARCHAR(128) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin;

    CALL {{ns}}.lock_run(p_dag_id, p_run_id, v_id, v_state, v_attempt, v_lease, v_worker);
    IF v_state NOT IN ('queued', 'running') THEN
        SET v_message = LEFT(CONCAT('[AQ008] run ', QUOTE(LEFT(p_run_id, 60)), ' is ', v_state,
                                    ': only a queued or running run can be cancelled'), 128);
        SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = v_message;
    END IF;
    SET v_now = UTC_TIMESTAMP(6);
    UPDATE {{ns}}.dag_run
       SET state = 'cancelled', ended_at = v_now, updated_at = v_now, lease_until = NULL,
           not_before = NULL, deadline = NULL,
           error = LEFT(CONCAT('cancelled', COALESCE(CONCAT(': ', p_reason), '')), 4000)
     WHERE id = v_id;
    SELECT r.id AS dag_run_id, r.dag_id, r.run_id, r.seq, r.state, r.run_after, r.created_at,
           r.started_at, r.ended_at, r.triggering_event_id, r.event_count, r.attempt, r.worker,
           r.lease_until, r.not_before, r.error, '[]' AS output_event_ids, r.partition_key
      FROM {{ns}}.dag_run r
     WHERE r.id = v_id;
END
$$
DELIMITER ;
