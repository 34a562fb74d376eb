-- The first step of every call on one run (heartbeat_run, complete_run, retry_run,
-- set_run_state): run p_run_id of consumer p_dag_id locked FOR UPDATE, with what the caller
-- decides on: its key, state, attempt, lease and worker. AQ006 for an unknown run. A locking
-- read: it sees the run whatever the caller's snapshot, and holds it to the caller's end.
DELIMITER $$
DROP PROCEDURE IF EXISTS {{ns}}.lock_run
$$
CREATE PROCEDURE {{ns}}.lock_run(
    IN  p_dag_id  TEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin,
    IN  p_run_id  TEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin,
    OUT p_id      BIGINT,
    OUT p_state   VARCHAR(20) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin,
    OUT p_attempt INT,
    OUT p_lease   DATETIME(6),
    OUT p_worker  VARCHAR(250) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin
)
MODIFIES SQL DATA
BEGIN
    DECLARE v_message VARCHAR(128) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin;
    SET p_id = NULL;
    SELECT r.id, r.state, r.attempt, r.lease_until, r.worker
      INTO p_id, p_state, p_attempt, p_lease, p_worker
      FROM {{ns}}.dag_run r
     WHERE r.dag_id = p_dag_id AND r.run_id = p_run_id
       FOR UPDATE;
    IF p_id IS NULL THEN
        SET v_message = LEFT(CONCAT('[AQ006] unknown run ', COALESCE(QUOTE(LEFT(p_run_id, 60)), 'NULL'),
                                    ' of dag ', COALESCE(QUOTE(LEFT(p_dag_id, 40)), 'NULL')), 128);
        SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = v_message;
    END IF;
END
$$
DELIMITER ;
