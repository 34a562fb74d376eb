-- AQ002 unless p_dag_ids is NULL or a JSON array of strings (dag ids): the consumer filter
-- of claims and passes.
-- MySQL 8 / MariaDB: IFs, not one condition: MariaDB may evaluate JSON_TYPE of invalid text
-- and fail (see register_events).
DELIMITER $$
DROP PROCEDURE IF EXISTS {{ns}}.check_dag_ids
$$
CREATE PROCEDURE {{ns}}.check_dag_ids(IN p_dag_ids JSON)
READS SQL DATA
BEGIN
    DECLARE v_kind    VARCHAR(20) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin;
    DECLARE v_bad     BIGINT DEFAULT 0;
    DECLARE v_message VARCHAR(128) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin;
    IF p_dag_ids IS NOT NULL THEN
        SET v_kind = 'invalid JSON';
        IF JSON_VALID(p_dag_ids) THEN
            SET v_kind = JSON_TYPE(p_dag_ids);
        END IF;
        IF v_kind = 'ARRAY' THEN
            SELECT COUNT(*) INTO v_bad
              FROM JSON_TABLE(p_dag_ids, '$[*]' COLUMNS (item JSON PATH '$')) AS j
             WHERE COALESCE(JSON_TYPE(j.item), 'NULL') <> 'STRING';
        END IF;
        IF v_kind <> 'ARRAY' OR v_bad > 0 THEN
            SET v_message = '[AQ002] dag_ids must be a JSON array of dag ids or NULL';
            SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = v_message;
        END IF;
    END IF;
END
$$
DELIMITER ;
