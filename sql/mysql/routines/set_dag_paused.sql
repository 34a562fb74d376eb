-- Pauses or unpauses a consumer. Events that commit while it is paused are not queued for it.
-- Returns no result set.
DELIMITER $$
DROP PROCEDURE IF EXISTS {{ns}}.set_dag_paused
$$
CREATE PROCEDURE {{ns}}.set_dag_paused(
    IN p_dag_id TEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin,
    IN p_paused BOOLEAN
)
MODIFIES SQL DATA
BEGIN
    -- The lock row first, as declare_dag does (lock_dag, AQ003 for an unknown consumer).
    -- Not ROW_COUNT() of the UPDATE: with the CLIENT_FOUND_ROWS flag (SQLAlchemy sets it) it
    -- counts matched rows, without it changed rows.
    CALL {{ns}}.lock_dag(p_dag_id);
    UPDATE {{ns}}.dag SET is_paused = p_paused, updated_at = UTC_TIMESTAMP(6)
     WHERE dag_id = p_dag_id;
END
$$
DELIMITER ;
