-- Liveness. Records that loop p_process_id is alive now (database
-- clock, UTC): inserts its row on the first call, then moves last_seen_at (started_at
-- stays). One statement, atomic under autocommit too; the loops call it in a short
-- transaction of its own, never inside a pass or a run. No result set. AQ002 for a bad kind
-- or interval; the lengths are the columns' (strict mode refuses longer values).
-- ON DUPLICATE KEY UPDATE, not REPLACE: REPLACE deletes the row first, and would lose
-- started_at.
DELIMITER $$
DROP PROCEDURE IF EXISTS {{ns}}.process_heartbeat
$$
CREATE PROCEDURE {{ns}}.process_heartbeat(
    IN p_process_id       TEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin,
    IN p_kind             TEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin,
    IN p_name             TEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin,
    IN p_host             TEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin,
    IN p_pid              BIGINT,
    IN p_version          TEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin,
    IN p_interval_seconds DOUBLE
)
MODIFIES SQL DATA
BEGIN
    DECLARE v_now     DATETIME(6);
    DECLARE v_message VARCHAR(128) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin;

    IF p_kind IS NULL OR p_kind NOT IN ('scheduler', 'worker') THEN
        SET v_message = LEFT(CONCAT('[AQ002] unknown process kind ', COALESCE(QUOTE(LEFT(p_kind, 40)), 'NULL'),
                                    ': use scheduler or worker'), 128);
        SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = v_message;
    END IF;
    IF p_interval_seconds IS NULL OR NOT (p_interval_seconds > 0 AND p_interval_seconds <= 604800) THEN
        SET v_message = LEFT(CONCAT('[AQ002] liveness interval must be above 0 and at most 604800 seconds, got ',
                                    COALESCE(p_interval_seconds, 'NULL')), 128);
        SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = v_message;
    END IF;
    IF p_process_id IS NULL OR p_process_id = '' OR p_host IS NULL OR p_pid IS NULL OR p_version IS NULL THEN
        SIGNAL SQLSTATE '45000'
            SET MESSAGE_TEXT = '[AQ002] a heartbeat needs a process id, host, pid and version';
    END IF;
    SET v_now = UTC_TIMESTAMP(6);
    INSERT INTO {{ns}}.process_liveness
           (process_id, kind, name, host, pid, version, interval_seconds, started_at, last_seen_at)
    VALUES (p_process_id, p_kind, p_name, p_host, p_pid, p_version, p_interval_seconds, v_now, v_now)
    ON DUPLICATE KEY UPDATE
           kind = p_kind, name = p_name, host = p_host, pid = p_pid, version = p_version,
           interval_seconds = p_interval_seconds, last_seen_at = v_now;
END
$$
DELIMITER ;
