-- Liveness. Deletes loop p_process_id's row: the loop stopped
-- cleanly. Idempotent (no row, nothing done). No result set. Its consumers
-- (process_handles) go with it.
DELIMITER $$
DROP PROCEDURE IF EXISTS {{ns}}.process_gone
$$
CREATE PROCEDURE {{ns}}.process_gone(
    IN p_process_id TEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin
)
MODIFIES SQL DATA
BEGIN
    DELETE FROM {{ns}}.process_liveness WHERE process_id = p_process_id;
    DELETE FROM {{ns}}.process_dag WHERE process_id = p_process_id;
END
$$
DELIMITER ;
