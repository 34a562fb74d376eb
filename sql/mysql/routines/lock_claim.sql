-- The fence of a worker's call (I8; heartbeat_run_v2, complete_run_v2): run p_run_id of
-- consumer p_dag_id locked (a locking read), and its key (p_id) when the claim that started
-- attempt p_attempt at p_started_at still holds it. Held means running under a lease at this
-- attempt, claimed at that moment: a run moved to running by hand (set_run_state) has no
-- lease, no claim of an earlier attempt holds it, and neither does a claim whose run was
-- made again with the same run id and attempt (a claim lost in a failover, its run made
-- again by the next pass: another claim, at another time). Otherwise AQ010 (lease lost),
-- with p_then, what the caller must do now; for a run that does not exist, AQ010 too when
-- p_started_at is given (the claim's run is gone), AQ006 (unknown run) without it.
-- p_started_at NULL: the attempt alone fences (the routines of assetq 0.1.0's workers).
DELIMITER $$
DROP PROCEDURE IF EXISTS {{ns}}.lock_claim
$$
CREATE PROCEDURE {{ns}}.lock_claim(
    IN  p_dag_id     TEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin,
    IN  p_run_id     TEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin,
    IN  p_attempt    INT,
    IN  p_started_at DATETIME(6),
    IN  p_then       TEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin,
    OUT p_id         BIGINT
)
MODIFIES SQL DATA
BEGIN
    DECLARE v_state   VARCHAR(20) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin;
    DECLARE v_attempt INT;
    DECLARE v_lease   DATETIME(6);
    DECLARE v_started DATETIME(6);
    DECLARE v_message VARCHAR(128) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin;

    SET p_id = NULL;
    SELECT r.id, r.state, r.attempt, r.lease_until, r.started_at
      INTO p_id, v_state, v_attempt, v_lease, v_started
      FROM {{ns}}.dag_run r
     WHERE r.dag_id = p_dag_id AND r.run_id = p_run_id
       FOR UPDATE;
    IF p_id IS NULL THEN
        SET v_message = LEFT(CONCAT(IF(p_started_at IS NULL, '[AQ006] unknown run ',
                                       CONCAT('[AQ010] lease lost: ', p_then, ' run ')),
                                    COALESCE(QUOTE(LEFT(p_run_id, 60)), 'NULL'), ' of dag ',
                                    COALESCE(QUOTE(LEFT(p_dag_id, 40)), 'NULL'),
                                    IF(p_started_at IS NULL, '', ': it no longer exists')), 128);
        SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = v_message;
    END IF;
    IF v_state <> 'running' OR NOT (v_attempt <=> p_attempt) OR v_lease IS NULL THEN
        SET v_message = LEFT(CONCAT('[AQ010] lease lost: the run is ', v_state,
                                    IF(v_state = 'running' AND v_lease IS NULL, ' with no lease', ''),
                                    ' at attempt ', v_attempt,
                                    ', not running at attempt ', COALESCE(p_attempt, 'NULL'),
                                    '; ', p_then, ' run ', QUOTE(LEFT(p_run_id, 60)),
                                    ' of dag ', QUOTE(LEFT(p_dag_id, 40))), 128);
        SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = v_message;
    END IF;
    IF p_started_at IS NOT NULL AND NOT (v_started <=> p_started_at) THEN
        SET v_message = LEFT(CONCAT('[AQ010] lease lost: attempt ', p_attempt,
                                    ' is another claim''s (claimed at ', v_started, '); ', p_then,
                                    ' run ', QUOTE(LEFT(p_run_id, 60)), ' of dag ',
                                    QUOTE(LEFT(p_dag_id, 40))), 128);
        SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = v_message;
    END IF;
END
$$
DELIMITER ;
