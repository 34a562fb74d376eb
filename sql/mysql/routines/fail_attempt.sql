-- Ends the running attempt of run p_id, which the caller has locked, as a failure with error
-- p_error (its first 4000 characters) at p_now: while the consumer's max_attempts has
-- attempts left the run is queued again, claimable after the retry delay
-- (retry_delay_seconds, doubled for each attempt already failed when max_retry_delay_seconds
-- is set, up to it), otherwise it fails for good, which frees a place under max_active_runs.
-- The one place the retry policy is written: complete_run (a handler's failure) and
-- claim_runs_v2 (a timed-out attempt) call it. The run's new state in p_state.
DELIMITER $$
DROP PROCEDURE IF EXISTS {{ns}}.fail_attempt
$$
CREATE PROCEDURE {{ns}}.fail_attempt(
    IN  p_id    BIGINT,
    IN  p_error LONGTEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin,
    IN  p_now   DATETIME(6),
    OUT p_state VARCHAR(20) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin
)
MODIFIES SQL DATA
BEGIN
    DECLARE v_dag_id  VARCHAR(250) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin;
    DECLARE v_attempt INT;
    DECLARE v_max     INT;
    DECLARE v_delay   DOUBLE;
    DECLARE v_cap     DOUBLE;

    -- The consumer's retry options: a plain read, never the dag row's lock (a declare_dag in
    -- flight holds it); the run's lock is enough.
    SELECT r.dag_id, r.attempt INTO v_dag_id, v_attempt FROM {{ns}}.dag_run r WHERE r.id = p_id;
    SELECT d.max_attempts, d.retry_delay_seconds, d.max_retry_delay_seconds
      INTO v_max, v_delay, v_cap
      FROM {{ns}}.dag d
     WHERE d.dag_id = v_dag_id;
    IF v_attempt < v_max THEN
        IF v_cap IS NOT NULL THEN
            SET v_delay = LEAST(v_delay * POW(2, LEAST(v_attempt - 1, 60)), v_cap);
        END IF;
        UPDATE {{ns}}.dag_run
           SET state = 'queued', updated_at = p_now, lease_until = NULL, deadline = NULL,
               not_before = p_now + INTERVAL CAST(ROUND(v_delay * 1000000) AS SIGNED) MICROSECOND,
               error = LEFT(p_error, 4000)
         WHERE id = p_id;
        SET p_state = 'queued';
    ELSE
        UPDATE {{ns}}.dag_run
           SET state = 'failed', ended_at = p_now, updated_at = p_now, lease_until = NULL,
               deadline = NULL, not_before = NULL, error = LEFT(p_error, 4000)
         WHERE id = p_id;
        SET p_state = 'failed';
    END IF;
END
$$
DELIMITER ;
