-- Retention, step 1: deletes at most p_batch_size runs created before p_older_than, oldest
-- first, with their links (ON DELETE CASCADE). Returns one result set (deleted). Run each
-- batch at READ COMMITTED in a short transaction of its own (assetq.purge does). A run locked
-- by someone else is skipped, not waited for (SKIP LOCKED), and left for a later batch.
-- Only finished runs (success, failed) are deleted: a queued or
-- running run may still be worked on, and its worker would find it gone.
-- The links go by hand, just before their runs (no foreign keys on the link
-- table): those of the runs locked, by key. Nobody adds a link to a run it finds:
-- links are written only in the pass that creates their run, in the same transaction, and
-- the candidates are committed, finished runs.
DELIMITER $$
DROP PROCEDURE IF EXISTS {{ns}}.purge_runs
$$
CREATE PROCEDURE {{ns}}.purge_runs(IN p_older_than DATETIME(6), IN p_batch_size INT)
MODIFIES SQL DATA
BEGIN
    DECLARE v_deleted  BIGINT;
    DECLARE v_want     BIGINT;
    DECLARE v_read     BIGINT;
    DECLARE v_locked   BIGINT;
    DECLARE v_after_ts DATETIME(6) DEFAULT NULL;
    DECLARE v_after_id BIGINT DEFAULT 0;
    DECLARE v_message  VARCHAR(128) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin;
    IF p_older_than IS NULL OR p_batch_size IS NULL OR p_batch_size < 1 THEN
        SET v_message = '[AQ002] purge_runs needs a cutoff and a positive batch size';
        SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = v_message;
    END IF;
    DROP TEMPORARY TABLE IF EXISTS {{ns}}._assetq_purge_candidate, {{ns}}._assetq_purge;
    CREATE TEMPORARY TABLE {{ns}}._assetq_purge_candidate (
        pos        BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY,
        id         BIGINT NOT NULL,
        created_at DATETIME(6) NOT NULL
    ) ENGINE = InnoDB;
    CREATE TEMPORARY TABLE {{ns}}._assetq_purge (
        id BIGINT NOT NULL PRIMARY KEY
    ) ENGINE = InnoDB;
    -- The batch: finished runs by a plain read in (created_at, id) order, then locked by key
    -- and tested again as locked (a run may have been retried meanwhile), SKIP LOCKED; the
    -- next ones after those another purge holds, until the batch is full or none is left.
    -- Not one locking read by age, as on PostgreSQL: MySQL 8 / MariaDB: a locking read
    -- through an index keeps the rows its WHERE refused locked too, to the end of the batch
    -- (see claim_runs), and the workers of the active runs it passed over would wait.
    SET v_want = p_batch_size;
    fill_loop: LOOP
        DELETE FROM {{ns}}._assetq_purge_candidate;
        INSERT INTO {{ns}}._assetq_purge_candidate (id, created_at)
        SELECT r.id, r.created_at
          FROM {{ns}}.dag_run r FORCE INDEX (dag_run_created_idx)
         WHERE r.created_at < p_older_than
           AND (v_after_ts IS NULL OR r.created_at > v_after_ts
                OR (r.created_at = v_after_ts AND r.id > v_after_id))
           AND r.state IN ('success', 'failed')
         ORDER BY r.created_at, r.id
         LIMIT v_want;
        SET v_read = ROW_COUNT();
        IF v_read = 0 THEN
            LEAVE fill_loop;
        END IF;
        INSERT INTO {{ns}}._assetq_purge (id)
        SELECT r.id
          FROM {{ns}}._assetq_purge_candidate c FORCE INDEX (PRIMARY)
          STRAIGHT_JOIN {{ns}}.dag_run r FORCE INDEX (PRIMARY) ON r.id = c.id
         WHERE r.state IN ('success', 'failed')
           FOR UPDATE SKIP LOCKED;
        SET v_locked = ROW_COUNT();
        IF v_locked = v_read OR v_read < v_want THEN
            LEAVE fill_loop;
        END IF;
        SET v_want = v_want - v_locked;
        SELECT c.created_at, c.id INTO v_after_ts, v_after_id
          FROM {{ns}}._assetq_purge_candidate c ORDER BY c.pos DESC LIMIT 1;
    END LOOP;
    -- By key. MySQL 8 / MariaDB: a DELETE cannot read its own table in a subquery.
    SELECT COUNT(*) INTO v_deleted FROM {{ns}}._assetq_purge;
    DELETE l
      FROM {{ns}}._assetq_purge k
      STRAIGHT_JOIN {{ns}}.dagrun_asset_event l FORCE INDEX (PRIMARY) ON l.dag_run_id = k.id;
    DELETE r
      FROM {{ns}}._assetq_purge k
      STRAIGHT_JOIN {{ns}}.dag_run r FORCE INDEX (PRIMARY) ON r.id = k.id;
    DROP TEMPORARY TABLE IF EXISTS {{ns}}._assetq_purge_candidate, {{ns}}._assetq_purge;
    SELECT v_deleted AS deleted;
END
$$
DELIMITER ;
