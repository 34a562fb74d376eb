-- Puts failed or cancelled run p_run_id of consumer p_dag_id back in the queue, claimable
-- now, with the same events and run id; its next claim is the next attempt (the count goes
-- on), and it is given one more attempt whatever max_attempts says. AQ008 unless the run is
-- failed or cancelled, AQ006 for an unknown run. It may put the consumer one run over max_active_runs. Returns one
-- result set: the run (the complete_run columns, no output events).
DELIMITER $$
DROP PROCEDURE IF EXISTS {{ns}}.retry_run
$$
CREATE PROCEDURE {{ns}}.retry_run(
    IN p_dag_id TEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin,
    IN p_run_id TEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin
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
    IF v_state NOT IN ('failed', 'cancelled') THEN
        SET v_message = LEFT(CONCAT('[AQ008] run ', QUOTE(LEFT(p_run_id, 60)), ' is ', v_state,
                                    ': only a failed or cancelled run can be retried'), 128);
        SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = v_message;
    END IF;
    SET v_now = UTC_TIMESTAMP(6);
    UPDATE {{ns}}.dag_run
       SET state = 'queued', ended_at = NULL, lease_until = NULL, deadline = NULL,
           not_before = v_now, updated_at = v_now
     WHERE id = v_id;
    SELECT r.id AS dag_run_id, r.dag_id, r.run_id, r.seq, r.state, r.run_after, r.created_at,
           r.started_at, r.ended_at, r.triggering_event_id, r.event_count, r.attempt, r.worker,
           r.lease_until, r.not_before, r.error, '[]' AS output_event_ids, r.partition_key
      FROM {{ns}}.dag_run r
     WHERE r.id = v_id;
END
$$
DELIMITER ;
