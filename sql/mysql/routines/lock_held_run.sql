-- The fence of a worker's call (I8; heartbeat_run, complete_run): run p_run_id of consumer
-- p_dag_id locked (lock_run), and its key in p_id when attempt p_attempt still holds it.
-- Held means running under a lease at this attempt: a run moved to running by hand
-- (set_run_state) has none, and no claim of an earlier attempt holds it. Otherwise AQ010
-- (lease lost), whose message ends with p_then, what the caller must do now ("stop working
-- on"), before the run's names: the facts first, the names last, since a message is cut at
-- 128 characters.
DELIMITER $$
DROP PROCEDURE IF EXISTS {{ns}}.lock_held_run
$$
CREATE PROCEDURE {{ns}}.lock_held_run(
    IN  p_dag_id  TEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin,
    IN  p_run_id  TEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin,
    IN  p_attempt INT,
    IN  p_then    TEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin,
    OUT p_id      BIGINT
)
MODIFIES SQL DATA
BEGIN
    DECLARE v_state   VARCHAR(20) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin;
    DECLARE v_attempt INT;
    DECLARE v_lease   DATETIME(6);
    DECLARE v_worker  VARCHAR(250) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin;
    DECLARE v_message VARCHAR(128) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin;

    CALL {{ns}}.lock_run(p_dag_id, p_run_id, p_id, v_state, v_attempt, v_lease, v_worker);
    IF v_state <> 'running' OR NOT (v_attempt <=> p_attempt) OR v_lease IS NULL THEN
        SET v_message = LEFT(CONCAT('[AQ010] lease lost: the run is ', v_state,
                                    IF(v_state = 'running' AND v_lease IS NULL, ' with no lease', ''),
                                    ' at attempt ', v_attempt,
                                    ', not running at attempt ', COALESCE(p_attempt, 'NULL'),
                                    '; ', p_then, ' run ', QUOTE(LEFT(p_run_id, 60)),
                                    ' of dag ', QUOTE(LEFT(p_dag_id, 40))), 128);
        SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = v_message;
    END IF;
END
$$
DELIMITER ;
