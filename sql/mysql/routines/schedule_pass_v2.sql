-- One scheduler pass (schedule_consumers says what it does) over at most p_limit consumers
-- (of p_dag_ids, a JSON array, or of all when NULL), waiting up to p_wait_seconds for a
-- consumer another pass holds when p_dag_ids is given. Returns one result set, one row per
-- run created, in the order they were created (dag_run_id, dag_id, run_id, seq, run_after,
-- created_at, event_ids as a JSON array, triggering_event_id: the newest claimed row, state,
-- partition_key). Run it at READ COMMITTED, in a transaction of its own (assetq.schedule
-- does); AQ900 (claim guard) means the pass was rolled back and is safe to retry.
DELIMITER $$
DROP PROCEDURE IF EXISTS {{ns}}.schedule_pass_v2
$$
CREATE PROCEDURE {{ns}}.schedule_pass_v2(
    IN p_limit        INT,
    IN p_dag_ids      JSON,
    IN p_wait_seconds DOUBLE
)
MODIFIES SQL DATA
BEGIN
    CALL {{ns}}.schedule_consumers(p_limit, p_dag_ids, p_wait_seconds);
    SELECT r.dag_run_id, r.dag_id, r.run_id, r.seq, r.run_after, r.created_at, r.event_ids,
           r.triggering_event_id, r.state, r.partition_key
      FROM {{ns}}._assetq_run r
     ORDER BY r.dag_run_id;
    CALL {{ns}}.drop_pass_tables();
END
$$
DELIMITER ;
