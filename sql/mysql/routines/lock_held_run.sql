-- The fence of assetq 0.1.0's workers' calls (heartbeat_run, complete_run): lock_claim with no
-- claim time, the attempt alone.
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
    CALL {{ns}}.lock_claim(p_dag_id, p_run_id, p_attempt, NULL, p_then, p_id);
END
$$
DELIMITER ;
