-- Liveness. Replaces the consumers loop p_process_id has handlers for (process_dag) with
-- p_dag_ids, a JSON array of dag ids, so that status and doctor can tell a consumer whose
-- runs no live worker can execute. Returns one result set (unknown_dag_id): the ids among
-- them that name no declared consumer (the worker warns about each, or refuses to start
-- when strict); they are recorded all the same: a consumer declared later is one the
-- worker can run.
-- A worker calls it with every liveness heartbeat, in the heartbeat's short transaction (a
-- liveness row purged while its process was hung comes back with its consumers): rows
-- already there are not written again (INSERT IGNORE on the key), so an unchanged set
-- writes nothing. AQ002 for a missing process id or a p_dag_ids that is not an array of
-- dag ids.
DELIMITER $$
DROP PROCEDURE IF EXISTS {{ns}}.process_handles
$$
CREATE PROCEDURE {{ns}}.process_handles(
    IN p_process_id TEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin,
    IN p_dag_ids    JSON
)
MODIFIES SQL DATA
BEGIN
    DECLARE v_kind    VARCHAR(32) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin DEFAULT 'NULL';
    DECLARE v_bad     BIGINT DEFAULT 0;
    DECLARE v_message VARCHAR(128) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin;

    IF p_process_id IS NULL OR p_process_id = '' THEN
        SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = '[AQ002] process_handles needs a process id';
    END IF;
    -- IFs, not one condition: MariaDB may evaluate JSON_TYPE of invalid text and fail
    -- (see register_events).
    IF p_dag_ids IS NOT NULL THEN
        SET v_kind = 'invalid JSON';
        IF JSON_VALID(p_dag_ids) THEN
            SET v_kind = JSON_TYPE(p_dag_ids);
        END IF;
    END IF;
    IF v_kind = 'ARRAY' THEN
        SELECT COUNT(*) INTO v_bad
          FROM JSON_TABLE(p_dag_ids, '$[*]' COLUMNS (item JSON PATH '$')) AS j
         WHERE COALESCE(JSON_TYPE(j.item), 'NULL') <> 'STRING'
            OR CHAR_LENGTH(JSON_UNQUOTE(j.item)) NOT BETWEEN 1 AND 250;
    END IF;
    IF v_kind <> 'ARRAY' OR v_bad > 0 THEN
        SET v_message = LEFT(CONCAT('[AQ002] dag_ids must be a JSON array of dag ids (1 to 250 characters), got ',
                                    COALESCE(LEFT(p_dag_ids, 40), 'NULL')), 128);
        SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = v_message;
    END IF;
    DELETE FROM {{ns}}.process_dag
     WHERE process_id = p_process_id
       AND NOT JSON_CONTAINS(p_dag_ids, JSON_QUOTE(dag_id));
    INSERT IGNORE INTO {{ns}}.process_dag (process_id, dag_id)
    SELECT DISTINCT p_process_id, j.id
      FROM JSON_TABLE(p_dag_ids, '$[*]' COLUMNS (
               id VARCHAR(250) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin PATH '$')) AS j;
    SELECT DISTINCT j.id AS unknown_dag_id
      FROM JSON_TABLE(p_dag_ids, '$[*]' COLUMNS (
               id VARCHAR(250) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin PATH '$')) AS j
     WHERE NOT EXISTS (SELECT 1 FROM {{ns}}.dag d WHERE d.dag_id = j.id)
     ORDER BY j.id;
END
$$
DELIMITER ;
