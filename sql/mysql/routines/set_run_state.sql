-- Moves run p_run_id of consumer p_dag_id to state p_state and returns it as one result set
-- (the get_run columns). Allowed: queued -> running, success or failed; running -> success
-- or failed. Moving a run to the state it is in changes nothing (a retry is harmless).
-- Anything else, or a state that is none of the four, raises AQ008; an unknown run AQ006.
-- started_at is set on entering running, ended_at on entering success or failed, updated_at
-- on every change. A run in success or failed no longer counts against max_active_runs.
-- It locks the run row only: never the consumer, so it never waits for a scheduler pass.
--
-- Workers: the result has the run's attempt, worker, lease,
-- not_before and error too. A run a worker holds (claimed by claim_runs: running under a
-- lease) is finished by that worker's complete_run, fenced by its attempt (I8): moving it
-- here raises AQ008 (if the worker died, the run is claimed again when its lease expires). A
-- run moved out of queued by hand is no longer claimable (not_before NULL) and has no lease,
-- so it is not held, whatever worker and attempt it kept from an earlier attempt.
DELIMITER $$
DROP PROCEDURE IF EXISTS {{ns}}.set_run_state
$$
CREATE PROCEDURE {{ns}}.set_run_state(
    IN p_dag_id TEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin,
    IN p_run_id TEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin,
    IN p_state  TEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin
)
MODIFIES SQL DATA
BEGIN
    DECLARE v_id      BIGINT;
    DECLARE v_old     VARCHAR(20) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin;
    DECLARE v_attempt INT;
    DECLARE v_lease   DATETIME(6);
    DECLARE v_worker  VARCHAR(250) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin;
    DECLARE v_now     DATETIME(6);
    DECLARE v_message VARCHAR(128) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin;

    -- NOT LIKE '% ': the PAD SPACE collation would take 'queued ' for 'queued'.
    IF p_state IS NULL OR p_state NOT IN ('queued', 'running', 'success', 'failed')
       OR p_state LIKE '% ' THEN
        SET v_message = LEFT(CONCAT('[AQ008] unknown run state ', COALESCE(QUOTE(LEFT(p_state, 40)), 'NULL'),
                                    ': use queued, running, success or failed'), 128);
        SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = v_message;
    END IF;
    CALL {{ns}}.lock_run(p_dag_id, p_run_id, v_id, v_old, v_attempt, v_lease, v_worker);
    IF v_old = 'running' AND v_lease IS NOT NULL AND v_old <> p_state THEN
        SET v_message = LEFT(CONCAT('[AQ008] run ', QUOTE(LEFT(p_run_id, 60)), ' is held by worker ',
                                    QUOTE(LEFT(v_worker, 40)), ' (attempt ', v_attempt,
                                    '): its worker completes it (assetq.complete_run)'), 128);
        SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = v_message;
    END IF;
    IF v_old <> p_state THEN
        IF NOT ((v_old = 'queued' AND p_state IN ('running', 'success', 'failed'))
                OR (v_old = 'running' AND p_state IN ('success', 'failed'))) THEN
            SET v_message = LEFT(CONCAT('[AQ008] run ', QUOTE(LEFT(p_run_id, 60)), ' is ', v_old,
                                        ': it cannot move to ', p_state), 128);
            SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = v_message;
        END IF;
        SET v_now = UTC_TIMESTAMP(6);
        UPDATE {{ns}}.dag_run
           SET state = p_state,
               started_at = IF(p_state = 'running', v_now, started_at),
               ended_at = IF(p_state IN ('success', 'failed'), v_now, ended_at),
               updated_at = v_now,
               -- Leaving queued by hand: no worker may claim it any more.
               not_before = NULL,
               lease_until = NULL
         WHERE id = v_id;
    END IF;
    SELECT r.id AS dag_run_id, r.dag_id, r.run_id, r.seq, r.state, r.run_after, r.created_at,
           r.started_at, r.ended_at, r.triggering_event_id, r.event_count, r.attempt, r.worker,
           r.lease_until, r.not_before, r.error, r.partition_key
      FROM {{ns}}.dag_run r
     WHERE r.id = v_id;
END
$$
DELIMITER ;
