-- complete_run_v2 with no claim time (the attempt alone fences): the routine of assetq
-- 0.1.0's workers, kept for them while they are in the compatibility window
-- (docs/operations.md).
DELIMITER $$
DROP PROCEDURE IF EXISTS {{ns}}.complete_run
$$
CREATE PROCEDURE {{ns}}.complete_run(
    IN p_dag_id  TEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin,
    IN p_run_id  TEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin,
    IN p_attempt INT,
    IN p_state   TEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin,
    IN p_error   LONGTEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin,
    IN p_events  JSON
)
MODIFIES SQL DATA
BEGIN
    CALL {{ns}}.complete_run_v2(p_dag_id, p_run_id, p_attempt, p_state, p_error, p_events, NULL);
END
$$
DELIMITER ;
