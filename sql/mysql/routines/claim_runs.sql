-- Claims as claim_runs_v2 does with no default timeout (p_timeout_seconds NULL): the
-- routine of assetq 0.1.0's workers, kept for them while they are in the compatibility window
-- (docs/operations.md). Its result set is claim_runs_v2's, whose last column (the deadline)
-- they do not read. A consumer's own timeout holds for their claims too.
DELIMITER $$
DROP PROCEDURE IF EXISTS {{ns}}.claim_runs
$$
CREATE PROCEDURE {{ns}}.claim_runs(
    IN p_worker        TEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin,
    IN p_limit         INT,
    IN p_lease_seconds DOUBLE,
    IN p_dag_ids       JSON
)
MODIFIES SQL DATA
BEGIN
    CALL {{ns}}.claim_runs_v2(p_worker, p_limit, p_lease_seconds, p_dag_ids, NULL);
END
$$
DELIMITER ;
