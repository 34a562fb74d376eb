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
    DECLARE v_found   BIGINT;
    DECLARE v_message VARCHAR(128) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin;
    -- The lock row first, as declare_dag does; a locking read also sees a consumer created
    -- after the caller's snapshot. Not ROW_COUNT() of the UPDATE: with the CLIENT_FOUND_ROWS
    -- flag (SQLAlchemy sets it) it counts matched rows, without it changed rows.
    SELECT COUNT(*) INTO v_found FROM {{ns}}.dag_lock l WHERE l.dag_id = p_dag_id FOR UPDATE;
    IF v_found = 0 THEN
        SET v_message = LEFT(CONCAT('[AQ003] unknown dag ', COALESCE(QUOTE(LEFT(p_dag_id, 64)), 'NULL')), 128);
        SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = v_message;
    END IF;
    UPDATE {{ns}}.dag SET is_paused = p_paused, updated_at = UTC_TIMESTAMP(6)
     WHERE dag_id = p_dag_id;
END
$$
DELIMITER ;
