-- I10: runs whose last attempt's lease expired are failed, so that a worker that died on its
-- last attempt holds no place for good. schedule_pass calls it first, with p_dag_id NULL: the
-- runs of any consumer, at most 100, oldest lease first, found through dag_run_lease_idx; and
-- for consumer p_dag_id (its max_attempts p_max_attempts) before it counts the consumer's
-- active runs against max_active_runs. claim_runs fails those it meets as it locks them.
--
-- First a plain read of the candidates: the usual answer is none, and costs no temporary
-- table. Then those rows locked by primary key SKIP LOCKED and tested again as locked (a
-- worker completing or renewing one now keeps it), each error written from the row as locked,
-- and failed by key. Not one locking read: through a secondary index it would keep every row
-- it read and refused locked to the end of the pass, live leases included, even at READ
-- COMMITTED. The consumers' max_attempts are read plainly: a dag row is never locked (see
-- dag_lock). Its temporary tables, dropped by schedule_pass:
--   _assetq_reap    the candidates, with their consumers' max_attempts
--   _assetq_reaped  those of them locked, with their errors
-- MySQL 8 / MariaDB: an UPDATE cannot read its own table in a subquery, and MySQL cannot open
-- one temporary table twice in a statement.
DELIMITER $$
DROP PROCEDURE IF EXISTS {{ns}}.fail_expired_runs
$$
CREATE PROCEDURE {{ns}}.fail_expired_runs(
    IN p_dag_id       VARCHAR(250) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin,
    IN p_max_attempts INT,
    IN p_now          DATETIME(6)
)
MODIFIES SQL DATA
BEGIN
    DECLARE v_expired BIGINT;

    IF p_dag_id IS NULL THEN
        SELECT COUNT(*) INTO v_expired
          FROM (SELECT r.id
                  FROM {{ns}}.dag_run r FORCE INDEX (dag_run_lease_idx)
                  STRAIGHT_JOIN {{ns}}.dag d FORCE INDEX (PRIMARY) ON d.dag_id = r.dag_id
                 WHERE r.state = 'running' AND r.not_before <= p_now AND r.attempt >= d.max_attempts
                 LIMIT 1) x;
    ELSE
        SELECT COUNT(*) INTO v_expired
          FROM {{ns}}.dag_run r
         WHERE r.dag_id = p_dag_id AND r.state = 'running' AND r.not_before <= p_now
           AND r.attempt >= p_max_attempts;
    END IF;
    IF v_expired > 0 THEN
        CREATE TEMPORARY TABLE IF NOT EXISTS {{ns}}._assetq_reap (
            id           BIGINT NOT NULL PRIMARY KEY,
            max_attempts INT NOT NULL
        ) ENGINE = InnoDB;
        CREATE TEMPORARY TABLE IF NOT EXISTS {{ns}}._assetq_reaped (
            id    BIGINT NOT NULL PRIMARY KEY,
            error TEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL
        ) ENGINE = InnoDB;
        DELETE FROM {{ns}}._assetq_reap;
        DELETE FROM {{ns}}._assetq_reaped;
        IF p_dag_id IS NULL THEN
            INSERT INTO {{ns}}._assetq_reap (id, max_attempts)
            SELECT r.id, d.max_attempts
              FROM {{ns}}.dag_run r FORCE INDEX (dag_run_lease_idx)
              STRAIGHT_JOIN {{ns}}.dag d FORCE INDEX (PRIMARY) ON d.dag_id = r.dag_id
             WHERE r.state = 'running' AND r.not_before <= p_now AND r.attempt >= d.max_attempts
             ORDER BY r.not_before
             LIMIT 100;
        ELSE
            INSERT INTO {{ns}}._assetq_reap (id, max_attempts)
            SELECT r.id, p_max_attempts
              FROM {{ns}}.dag_run r
             WHERE r.dag_id = p_dag_id AND r.state = 'running' AND r.not_before <= p_now
               AND r.attempt >= p_max_attempts;
        END IF;
        INSERT INTO {{ns}}._assetq_reaped (id, error)
        SELECT r.id,
               CONCAT('the lease of attempt ', r.attempt, ' (worker ', COALESCE(r.worker, ''),
                      ') expired at ',
                      COALESCE(DATE_FORMAT(r.lease_until, '%Y-%m-%d %H:%i:%s.%f'), ''),
                      '+00 and no attempt is left (max_attempts ', k.max_attempts, ')')
          FROM {{ns}}._assetq_reap k FORCE INDEX (PRIMARY)
          STRAIGHT_JOIN {{ns}}.dag_run r FORCE INDEX (PRIMARY) ON r.id = k.id
         WHERE r.state = 'running' AND r.not_before <= p_now AND r.attempt >= k.max_attempts
           FOR UPDATE SKIP LOCKED;
        UPDATE {{ns}}._assetq_reaped k
          STRAIGHT_JOIN {{ns}}.dag_run r FORCE INDEX (PRIMARY) ON r.id = k.id
           SET r.state = 'failed', r.ended_at = p_now, r.updated_at = p_now,
               r.not_before = NULL, r.lease_until = NULL, r.error = k.error;
    END IF;
END
$$
DELIMITER ;
