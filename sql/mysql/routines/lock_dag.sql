-- The first step of every call on one consumer (delete_dag, set_dag_paused,
-- set_dag_partitions): consumer p_dag_id's lock row locked FOR UPDATE, the row a scheduler
-- pass holds from its claim to its commit, so the caller waits for a pass in flight and
-- every later pass skips the consumer (SKIP LOCKED) until the caller's end. AQ003 for an
-- unknown consumer. A locking read: it also sees a consumer created after the caller's
-- snapshot.
DELIMITER $$
DROP PROCEDURE IF EXISTS {{ns}}.lock_dag
$$
CREATE PROCEDURE {{ns}}.lock_dag(IN p_dag_id TEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin)
MODIFIES SQL DATA
BEGIN
    DECLARE v_found   BIGINT;
    DECLARE v_message VARCHAR(128) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin;
    SELECT COUNT(*) INTO v_found FROM {{ns}}.dag_lock l WHERE l.dag_id = p_dag_id FOR UPDATE;
    IF v_found = 0 THEN
        SET v_message = LEFT(CONCAT('[AQ003] unknown dag ', COALESCE(QUOTE(LEFT(p_dag_id, 64)), 'NULL')), 128);
        SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = v_message;
    END IF;
END
$$
DELIMITER ;
