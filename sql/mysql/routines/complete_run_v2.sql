-- Finishes attempt p_attempt of run p_run_id of consumer p_dag_id, in the caller's
-- transaction (I9): with p_state 'success' the run succeeds and the events p_events (a JSON
-- array, as register_events takes it, or NULL) are registered and fanned out, so the caller's
-- own writes, the success and the output events commit together or not at all. With
-- 'failed' the error p_error is recorded and the run retried or failed for good
-- (fail_attempt, the retry policy). Success and a final failure free a place under
-- max_active_runs. Returns one result set: the run (the set_run_state columns) with
-- output_event_ids, the ids of the output events in input order as a JSON array. AQ010
-- (lease lost, nothing written) unless the run is running at that attempt, and for a success
-- past the attempt's deadline (its timeout); p_started_at, the claim's started_at, fences the
-- claim itself (lock_claim; NULL: the attempt alone); AQ008 for another state; AQ002 for
-- events with a failure; register_events' own errors for bad events.
--
-- The events go through insert_event_batch, the body of register_events: a CALL of
-- register_events itself would send its result set to the client as a second one. The run
-- row is locked first (lock_claim, a locking read: the caller's snapshot may be older than
-- the claim), then the events are inserted, then the run is updated.
--
-- A failed call leaves the caller's transaction as it was:
-- its work runs under a savepoint, rolled back to before the error is raised again, so a
-- caller that commits anyway after an error (an output event refused after others were
-- inserted) commits no output event without the run's success (I9). PostgreSQL aborts the
-- caller's transaction instead, which comes to the same. A deadlock (1213) has already rolled
-- the whole transaction back, savepoint included: ROLLBACK TO SAVEPOINT then fails with 1305,
-- which is ignored, so the caller gets the deadlock, which it retries, not 1305
-- (tests/test_work_outputs.py). Under autocommit, with no transaction, every statement
-- commits on its own and there is no savepoint to go back to (the Python layer opens a
-- transaction for the call).
DELIMITER $$
DROP PROCEDURE IF EXISTS {{ns}}.complete_run_v2
$$
CREATE PROCEDURE {{ns}}.complete_run_v2(
    IN p_dag_id     TEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin,
    IN p_run_id     TEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin,
    IN p_attempt    INT,
    IN p_state      TEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin,
    IN p_error      LONGTEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin,
    IN p_events     JSON,
    IN p_started_at DATETIME(6)
)
MODIFIES SQL DATA
BEGIN
    DECLARE v_id        BIGINT;
    DECLARE v_now       DATETIME(6);
    DECLARE v_deadline  DATETIME(6);
    DECLARE v_state     VARCHAR(20) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin;
    DECLARE v_events    BOOLEAN DEFAULT FALSE;
    DECLARE v_count     BIGINT;
    DECLARE v_first_id  BIGINT;
    DECLARE v_timestamp DATETIME(6);
    DECLARE v_out       LONGTEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin DEFAULT '[]';
    DECLARE v_message   VARCHAR(128) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin;
    DECLARE v_saved_gcl BIGINT UNSIGNED DEFAULT @@SESSION.group_concat_max_len;
    -- RESIGNAL raises the error that started the handler, whatever the statements before it
    -- did; group_concat_max_len is not left raised on the connection.
    DECLARE EXIT HANDLER FOR SQLEXCEPTION
    BEGIN
        BEGIN
            DECLARE CONTINUE HANDLER FOR 1305 BEGIN END;
            ROLLBACK TO SAVEPOINT assetq_complete_run;
            RELEASE SAVEPOINT assetq_complete_run;
        END;
        SET SESSION group_concat_max_len = v_saved_gcl;
        RESIGNAL;
    END;

    -- First, before anything that can fail: the handler rolls back to this point only.
    SAVEPOINT assetq_complete_run;
    -- NOT LIKE '% ': the PAD SPACE collation would take 'success ' for 'success'.
    IF p_state IS NULL OR p_state NOT IN ('success', 'failed') OR p_state LIKE '% ' THEN
        SET v_message = LEFT(CONCAT('[AQ008] a run is completed as success or failed, got ',
                                    COALESCE(QUOTE(LEFT(p_state, 40)), 'NULL')), 128);
        SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = v_message;
    END IF;
    -- Events unless NULL or an empty array; anything else is register_events' to judge.
    -- IFs, not one condition: MariaDB may evaluate JSON_TYPE of invalid text and fail.
    IF p_events IS NOT NULL THEN
        SET v_events = TRUE;
        IF JSON_VALID(p_events) THEN
            IF JSON_TYPE(p_events) = 'ARRAY' THEN
                SET v_events = JSON_LENGTH(p_events) > 0;
            END IF;
        END IF;
    END IF;
    IF p_state = 'failed' AND v_events THEN
        SET v_message = '[AQ002] a failed run produces no events';
        SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = v_message;
    END IF;
    CALL {{ns}}.lock_claim(p_dag_id, p_run_id, p_attempt, p_started_at, 'roll back: nothing was written for',
                           v_id);
    SET v_now = UTC_TIMESTAMP(6);
    IF p_state = 'success' THEN
        -- Past its deadline the attempt has timed out (claim_runs_v2): its success is refused
        -- as a lost lease is, whatever the caller wrote rolls back; a failure is still taken.
        SELECT r.deadline INTO v_deadline FROM {{ns}}.dag_run r WHERE r.id = v_id;
        IF v_deadline <= v_now THEN
            SET v_message = LEFT(CONCAT('[AQ010] lease lost: attempt ', p_attempt, ' timed out; roll back run ',
                                        QUOTE(LEFT(p_run_id, 60)), ' of dag ', QUOTE(LEFT(p_dag_id, 40))), 128);
            SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = v_message;
        END IF;
        IF v_events THEN
            CALL {{ns}}.insert_event_batch(p_events, v_first_id, v_timestamp);
            SELECT COUNT(*) INTO v_count FROM {{ns}}._assetq_batch;
            SET SESSION group_concat_max_len = 1073741824;
            IF v_first_id IS NULL THEN
                SELECT CONCAT('[', GROUP_CONCAT(b.event_id ORDER BY b.item_no SEPARATOR ','), ']')
                  INTO v_out
                  FROM {{ns}}._assetq_batch b;
            ELSE
                SELECT CONCAT('[', GROUP_CONCAT(v_first_id + b.item_no - 1 ORDER BY b.item_no SEPARATOR ','), ']')
                  INTO v_out
                  FROM {{ns}}._assetq_batch b;
            END IF;
            SET SESSION group_concat_max_len = v_saved_gcl;
            DROP TEMPORARY TABLE IF EXISTS {{ns}}._assetq_batch;
            IF NOT (JSON_LENGTH(v_out) <=> v_count) THEN
                SET v_message = '[AQ900] claim guard: the output event ids were truncated';
                SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = v_message;
            END IF;
        END IF;
        UPDATE {{ns}}.dag_run
           SET state = 'success', ended_at = v_now, updated_at = v_now, lease_until = NULL,
               not_before = NULL, deadline = NULL
         WHERE id = v_id;
    ELSE
        CALL {{ns}}.fail_attempt(v_id, p_error, v_now, v_state);
    END IF;
    BEGIN
        -- 1305 under autocommit: the savepoint ended with its own statement.
        DECLARE CONTINUE HANDLER FOR 1305 BEGIN END;
        RELEASE SAVEPOINT assetq_complete_run;
    END;
    SELECT r.id AS dag_run_id, r.dag_id, r.run_id, r.seq, r.state, r.run_after, r.created_at,
           r.started_at, r.ended_at, r.triggering_event_id, r.event_count, r.attempt, r.worker,
           r.lease_until, r.not_before, r.error, v_out AS output_event_ids, r.partition_key
      FROM {{ns}}.dag_run r
     WHERE r.id = v_id;
END
$$
DELIMITER ;
