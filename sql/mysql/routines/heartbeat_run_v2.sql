-- Renews the lease of run p_run_id of consumer p_dag_id held at attempt p_attempt to
-- p_lease_seconds from now (database clock) and returns the new end as one result set
-- (lease_until). AQ010 (lease lost) when the run is no longer running at that attempt:
-- another worker claimed it after the lease expired, or it was finished or cancelled; nothing
-- is written. The lease never runs past the attempt's deadline (its timeout, claim_runs_v2):
-- a heartbeat at or after it is refused (AQ010, timed out), and the next claim ends the
-- attempt. p_started_at, the claim's started_at, fences the claim itself (lock_claim; NULL:
-- the attempt alone).
-- AQ006 for an unknown run, AQ002 for a bad lease. Run it in a short transaction of its own
-- (assetq.heartbeat does).
DELIMITER $$
DROP PROCEDURE IF EXISTS {{ns}}.heartbeat_run_v2
$$
CREATE PROCEDURE {{ns}}.heartbeat_run_v2(
    IN p_dag_id        TEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin,
    IN p_run_id        TEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin,
    IN p_attempt       INT,
    IN p_lease_seconds DOUBLE,
    IN p_started_at    DATETIME(6)
)
MODIFIES SQL DATA
BEGIN
    DECLARE v_id      BIGINT;
    DECLARE v_now     DATETIME(6);
    DECLARE v_until   DATETIME(6);
    DECLARE v_end     DATETIME(6);
    DECLARE v_message VARCHAR(128) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin;

    IF p_lease_seconds IS NULL OR NOT (p_lease_seconds > 0 AND p_lease_seconds <= 604800) THEN
        SET v_message = LEFT(CONCAT('[AQ002] lease must be above 0 and at most 604800 seconds, got ',
                                    COALESCE(p_lease_seconds, 'NULL')), 128);
        SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = v_message;
    END IF;
    CALL {{ns}}.lock_claim(p_dag_id, p_run_id, p_attempt, p_started_at, 'stop working on', v_id);
    SET v_now = UTC_TIMESTAMP(6);
    SELECT r.deadline INTO v_end FROM {{ns}}.dag_run r WHERE r.id = v_id;
    IF v_end <= v_now THEN
        SET v_message = LEFT(CONCAT('[AQ010] lease lost: attempt ', p_attempt, ' timed out; stop working on run ',
                                    QUOTE(LEFT(p_run_id, 60)), ' of dag ', QUOTE(LEFT(p_dag_id, 40))), 128);
        SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = v_message;
    END IF;
    -- LEAST is NULL with no deadline: then the whole lease.
    SET v_until = v_now + INTERVAL CAST(ROUND(p_lease_seconds * 1000000) AS SIGNED) MICROSECOND;
    SET v_until = COALESCE(LEAST(v_until, v_end), v_until);
    UPDATE {{ns}}.dag_run
       SET lease_until = v_until, not_before = v_until, updated_at = v_now
     WHERE id = v_id;
    SELECT v_until AS lease_until;
END
$$
DELIMITER ;
