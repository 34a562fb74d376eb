-- A worker's claim after a scheduler pass over its own consumers p_dag_ids, in one call and
-- one transaction (schedule_consumers, then claim_into): the runs the pass makes are claimed
-- before anyone else sees them. The pass waits up to p_wait_seconds for a consumer another
-- pass holds, and then claims the run that pass committed. Arguments as claim_runs_v2; its
-- result set, and made: whether this call's pass made the run. Run it at READ COMMITTED in
-- a transaction of its own; AQ900 (claim guard) means it was rolled back and is safe to
-- retry. PostgreSQL's commits this transaction without waiting for the disk; here every
-- commit follows the server's innodb_flush_log_at_trx_commit (a global setting), this one
-- too.
DELIMITER $$
DROP PROCEDURE IF EXISTS {{ns}}.schedule_and_claim
$$
CREATE PROCEDURE {{ns}}.schedule_and_claim(
    IN p_worker          TEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin,
    IN p_limit           INT,
    IN p_lease_seconds   DOUBLE,
    IN p_dag_ids         JSON,
    IN p_timeout_seconds DOUBLE,
    IN p_wait_seconds    DOUBLE
)
MODIFIES SQL DATA
BEGIN
    CALL {{ns}}.schedule_consumers(100, p_dag_ids, p_wait_seconds);
    CALL {{ns}}.claim_into(p_worker, p_limit, p_lease_seconds, p_dag_ids, p_timeout_seconds);
    -- MySQL 8 / MariaDB: one temporary table per reference, so the pass's runs are looked up
    -- in a subquery that names _assetq_run once.
    SELECT c.dag_run_id, c.dag_id, c.run_id, c.seq, c.run_after, c.created_at, c.event_ids,
           c.triggering_event_id, c.state, c.attempt, c.worker, c.lease_until, c.started_at,
           c.partition_key, c.deadline, c.capped,
           c.dag_run_id IN (SELECT r.dag_run_id FROM {{ns}}._assetq_run r) AS made
      FROM {{ns}}._assetq_claimed c
     ORDER BY c.dag_run_id;
    CALL {{ns}}.drop_claim_tables();
    CALL {{ns}}.drop_pass_tables();
END
$$
DELIMITER ;
