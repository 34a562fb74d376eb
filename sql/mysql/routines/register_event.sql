-- assetq 0.1.0's registration, kept for its packages while they are in the compatibility
-- window (docs/operations.md): register_event_v2 with the same parameters, whose result set
-- has two more columns (always NULL here), which 0.1.0 does not read.
DELIMITER $$
DROP PROCEDURE IF EXISTS {{ns}}.register_event
$$
CREATE PROCEDURE {{ns}}.register_event(
    IN p_asset            TEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin,
    IN p_extra            JSON,
    IN p_source_dag_id    TEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin,
    IN p_source_task_id   TEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin,
    IN p_source_run_id    TEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin,
    IN p_source_map_index INT,
    IN p_idempotency_key  TEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin
)
MODIFIES SQL DATA
BEGIN
    CALL {{ns}}.register_event_v2(p_asset, p_extra, p_source_dag_id, p_source_task_id,
                                  p_source_run_id, p_source_map_index, p_idempotency_key);
END
$$
DELIMITER ;
