-- heartbeat_run_v2 with no claim time (the attempt alone fences): the routine of assetq
-- 0.1.0's workers, kept for them while they are in the compatibility window
-- (docs/operations.md).
DELIMITER $$
DROP PROCEDURE IF EXISTS {{ns}}.heartbeat_run
$$
CREATE PROCEDURE {{ns}}.heartbeat_run(
    IN p_dag_id        TEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin,
    IN p_run_id        TEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin,
    IN p_attempt       INT,
    IN p_lease_seconds DOUBLE
)
MODIFIES SQL DATA
BEGIN
    CALL {{ns}}.heartbeat_run_v2(p_dag_id, p_run_id, p_attempt, p_lease_seconds, NULL);
END
$$
DELIMITER ;
