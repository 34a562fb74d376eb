-- Renews the lease of run p_run_id of consumer p_dag_id held at attempt p_attempt to
-- p_lease_seconds from now (database clock) and returns the new end as one result set
-- (lease_until). AQ010 (lease lost) when the run is no longer running at that attempt:
-- another worker claimed it after the lease expired, or it was finished; nothing is written.
-- AQ006 for an unknown run, AQ002 for a bad lease. Run it in a short transaction of its own
-- (assetq.heartbeat does).
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
    DECLARE v_id      BIGINT;
    DECLARE v_state   VARCHAR(20) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin;
    DECLARE v_attempt INT;
    DECLARE v_lease   DATETIME(6);
    DECLARE v_now     DATETIME(6);
    DECLARE v_until   DATETIME(6);
    DECLARE v_message VARCHAR(128) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin;

    IF p_lease_seconds IS NULL OR NOT (p_lease_seconds > 0 AND p_lease_seconds <= 604800) THEN
        SET v_message = LEFT(CONCAT('[AQ002] lease must be above 0 and at most 604800 seconds, got ',
                                    COALESCE(p_lease_seconds, 'NULL')), 128);
        SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = v_message;
    END IF;
    -- A locking read: it sees the run whatever the caller's snapshot, and holds it.
    SELECT r.id, r.state, r.attempt, r.lease_until INTO v_id, v_state, v_attempt, v_lease
      FROM {{ns}}.dag_run r
     WHERE r.dag_id = p_dag_id AND r.run_id = p_run_id
       FOR UPDATE;
    IF v_id IS NULL THEN
        SET v_message = LEFT(CONCAT('[AQ006] unknown run ', COALESCE(QUOTE(LEFT(p_run_id, 60)), 'NULL'),
                                    ' of dag ', COALESCE(QUOTE(LEFT(p_dag_id, 40)), 'NULL')), 128);
        SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = v_message;
    END IF;
    -- Held means running under a lease at this attempt: a run moved to running by hand
    -- (set_run_state) has none, and no claim of an earlier attempt holds it. The facts
    -- first, the names last: a message is cut at 128 characters.
    IF v_state <> 'running' OR NOT (v_attempt <=> p_attempt) OR v_lease IS NULL THEN
        SET v_message = LEFT(CONCAT('[AQ010] lease lost: the run is ', v_state,
                                    IF(v_state = 'running' AND v_lease IS NULL, ' with no lease', ''),
                                    ' at attempt ', v_attempt,
                                    ', not running at attempt ', COALESCE(p_attempt, 'NULL'),
                                    '; stop working on run ', QUOTE(LEFT(p_run_id, 60)),
                                    ' of dag ', QUOTE(LEFT(p_dag_id, 40))), 128);
        SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = v_message;
    END IF;
    SET v_now = UTC_TIMESTAMP(6);
    SET v_until = v_now + INTERVAL CAST(ROUND(p_lease_seconds * 1000000) AS SIGNED) MICROSECOND;
    UPDATE {{ns}}.dag_run
       SET lease_until = v_until, not_before = v_until, updated_at = v_now
     WHERE id = v_id;
    SELECT v_until AS lease_until;
END
$$
DELIMITER ;
