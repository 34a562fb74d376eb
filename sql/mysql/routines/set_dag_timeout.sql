-- Sets consumer p_dag_id's timeout to p_timeout_seconds (NULL: none; above 0, at most 604800):
-- an attempt claimed from now on that runs longer ends as failed ("timed out after 30s") and
-- is retried by max_attempts like any failure (claim_runs_v2). assetq.declare_dag calls it
-- after declare_dag, in the same transaction. AQ002 for a bad timeout, AQ003 for an unknown
-- consumer.
DELIMITER $$
DROP PROCEDURE IF EXISTS {{ns}}.set_dag_timeout
$$
CREATE PROCEDURE {{ns}}.set_dag_timeout(
    IN p_dag_id          TEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin,
    IN p_timeout_seconds DOUBLE
)
MODIFIES SQL DATA
BEGIN
    DECLARE v_message VARCHAR(128) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin;

    IF p_timeout_seconds IS NOT NULL AND NOT (p_timeout_seconds > 0 AND p_timeout_seconds <= 604800) THEN
        SET v_message = LEFT(CONCAT('[AQ002] timeout must be above 0 and at most 604800 seconds, got ',
                                    p_timeout_seconds), 128);
        SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = v_message;
    END IF;
    -- The lock row first, as declare_dag does (lock_dag, AQ003 for an unknown consumer).
    CALL {{ns}}.lock_dag(p_dag_id);
    UPDATE {{ns}}.dag SET timeout_seconds = p_timeout_seconds WHERE dag_id = p_dag_id;
END
$$
DELIMITER ;
