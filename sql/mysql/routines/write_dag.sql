-- declare_dag's write of the consumer's own row, its settings as declared (see there for
-- each parameter's NULL): inserted for a new consumer (the trigger on dag adds its lock
-- row), updated for an existing one or one a concurrent declaration inserted since the
-- caller's probe of the lock row. One statement for both, so the two cannot drift. On an
-- existing row it locks that row alone, as an UPDATE by key does: a duplicate of the
-- primary key takes an exclusive record lock, no gap lock (only a secondary unique key's
-- duplicate would take a next-key lock; dag has none).
DELIMITER $$
DROP PROCEDURE IF EXISTS {{ns}}.write_dag
$$
CREATE PROCEDURE {{ns}}.write_dag(
    IN p_dag_id             TEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin,
    IN p_condition          JSON,
    IN p_paused             BOOLEAN,
    IN p_max_active_runs    INT,
    IN p_max_events_per_run INT,
    IN p_queue_while_paused BOOLEAN,
    IN p_max_attempts       INT,
    IN p_retry_delay_seconds     DOUBLE,
    IN p_max_retry_delay_seconds DOUBLE
)
MODIFIES SQL DATA
BEGIN
    INSERT INTO {{ns}}.dag (dag_id, `condition`, is_paused, max_active_runs,
                            max_events_per_run, queue_while_paused, max_attempts,
                            retry_delay_seconds, max_retry_delay_seconds)
    VALUES (p_dag_id, p_condition, COALESCE(p_paused, FALSE), p_max_active_runs,
            p_max_events_per_run, COALESCE(p_queue_while_paused, FALSE),
            COALESCE(p_max_attempts, 1), COALESCE(p_retry_delay_seconds, 0),
            p_max_retry_delay_seconds)
    ON DUPLICATE KEY UPDATE `condition` = p_condition,
                            is_paused = COALESCE(p_paused, is_paused),
                            max_active_runs = p_max_active_runs,
                            max_events_per_run = p_max_events_per_run,
                            queue_while_paused = COALESCE(p_queue_while_paused, FALSE),
                            max_attempts = COALESCE(p_max_attempts, 1),
                            retry_delay_seconds = COALESCE(p_retry_delay_seconds, 0),
                            max_retry_delay_seconds = p_max_retry_delay_seconds,
                            updated_at = UTC_TIMESTAMP(6);
END
$$
DELIMITER ;
