-- Claims at most p_limit runs for worker p_worker (claim_into says how) and returns them as
-- one result set (dag_run_id, dag_id, run_id, seq, run_after, created_at, event_ids as a JSON
-- array, triggering_event_id, state, attempt, worker, lease_until, started_at,
-- partition_key, deadline, capped), running. Run it in a short transaction of its own at
-- READ COMMITTED (assetq.claim_runs does). AQ002 for bad arguments.
DELIMITER $$
DROP PROCEDURE IF EXISTS {{ns}}.claim_runs_v2
$$
CREATE PROCEDURE {{ns}}.claim_runs_v2(
    IN p_worker          TEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin,
    IN p_limit           INT,
    IN p_lease_seconds   DOUBLE,
    IN p_dag_ids         JSON,
    IN p_timeout_seconds DOUBLE
)
MODIFIES SQL DATA
BEGIN
    CALL {{ns}}.claim_into(p_worker, p_limit, p_lease_seconds, p_dag_ids, p_timeout_seconds);
    SELECT c.dag_run_id, c.dag_id, c.run_id, c.seq, c.run_after, c.created_at, c.event_ids,
           c.triggering_event_id, c.state, c.attempt, c.worker, c.lease_until, c.started_at,
           c.partition_key, c.deadline, c.capped
      FROM {{ns}}._assetq_claimed c
     ORDER BY c.dag_run_id;
    CALL {{ns}}.drop_claim_tables();
END
$$
DELIMITER ;
