-- Migration 0012_link_checks (down): the link table gets its two foreign keys back (with
-- their cascades), and delete_dag, delete_asset and purge_runs their 0011_runs_per_pass
-- bodies, which leave the links to those cascades.
--
-- Links whose run or event is gone (a DELETE by hand under 0012 that left them) are deleted
-- first: the cascade would have deleted them, and the keys could not be added over them.
--
-- Not online: MySQL 8 / MariaDB add a foreign key in place only with foreign_key_checks off,
-- which would not check the existing links; with the checks, as here, the link table is
-- copied (ALGORITHM=COPY), and passes, which write links, wait for the copy (time grows with
-- the link history). Producers do not write links and go on.
--
-- {{ns}} is replaced by the backquoted namespace when the file is loaded. Re-runnable: each
-- key is added only while it is missing (the helper _assetq_alter_if, as in 0009).

SET @assetq_saved_sql_mode = @@SESSION.sql_mode,
    SESSION sql_mode = 'STRICT_TRANS_TABLES,STRICT_ALL_TABLES,NO_ZERO_IN_DATE,NO_ZERO_DATE,ERROR_FOR_DIVISION_BY_ZERO,NO_ENGINE_SUBSTITUTION';

-- By key, driven by the links (MySQL 8 / MariaDB: a multiple-table DELETE, no subquery on
-- the table deleted from).
DELETE l
  FROM {{ns}}.dagrun_asset_event l
  LEFT JOIN {{ns}}.asset_event e ON e.id = l.asset_event_id
  LEFT JOIN {{ns}}.dag_run r ON r.id = l.dag_run_id AND r.dag_id = l.dag_id
 WHERE e.id IS NULL OR r.id IS NULL;

DELIMITER $$

-- Runs ALTER TABLE <p_table> <p_clause> when the constraint p_name of p_table is missing.
-- MySQL 8 / MariaDB: ADD CONSTRAINT has no IF NOT EXISTS form in MySQL; the helper asks
-- information_schema instead, and is dropped again at the end.
DROP PROCEDURE IF EXISTS {{ns}}._assetq_alter_if $$
CREATE PROCEDURE {{ns}}._assetq_alter_if(
    IN p_present BOOLEAN,
    IN p_table   TEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin,
    IN p_kind    TEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin,
    IN p_name    TEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin,
    IN p_clause  TEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin
)
MODIFIES SQL DATA
SQL SECURITY INVOKER
BEGIN
    DECLARE v_found BIGINT;
    SELECT COUNT(*) INTO v_found FROM information_schema.TABLE_CONSTRAINTS t
     WHERE t.CONSTRAINT_SCHEMA = DATABASE() AND t.TABLE_NAME = p_table
       AND t.CONSTRAINT_NAME = p_name;
    IF (v_found > 0) = p_present THEN
        -- Inside a routine DATABASE() is the routine's own database: the namespace.
        SET @assetq_ddl = CONCAT('ALTER TABLE `', DATABASE(), '`.`', p_table, '` ', p_clause);
        PREPARE assetq_ddl FROM @assetq_ddl;
        EXECUTE assetq_ddl;
        DEALLOCATE PREPARE assetq_ddl;
    END IF;
END $$

DELIMITER ;

CALL {{ns}}._assetq_alter_if(FALSE, 'dagrun_asset_event', 'constraint', 'dagrun_asset_event_asset_event_id_fkey',
                             'ADD CONSTRAINT dagrun_asset_event_asset_event_id_fkey FOREIGN KEY (asset_event_id) REFERENCES {{ns}}.asset_event (id) ON DELETE CASCADE');
CALL {{ns}}._assetq_alter_if(FALSE, 'dagrun_asset_event', 'constraint', 'dagrun_asset_event_run_fkey',
                             'ADD CONSTRAINT dagrun_asset_event_run_fkey FOREIGN KEY (dag_run_id, dag_id) REFERENCES {{ns}}.dag_run (id, dag_id) ON DELETE CASCADE');
DROP PROCEDURE IF EXISTS {{ns}}._assetq_alter_if;

DELIMITER $$

DROP PROCEDURE IF EXISTS {{ns}}.delete_dag $$
CREATE PROCEDURE {{ns}}.delete_dag(IN p_dag_id TEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin)
MODIFIES SQL DATA
BEGIN
    DECLARE v_found   BIGINT;
    DECLARE v_message VARCHAR(128) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin;
    SELECT COUNT(*) INTO v_found FROM {{ns}}.dag_lock l WHERE l.dag_id = p_dag_id FOR UPDATE;
    IF v_found = 0 THEN
        SET v_message = LEFT(CONCAT('[AQ003] unknown dag ', COALESCE(QUOTE(LEFT(p_dag_id, 64)), 'NULL')), 128);
        SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = v_message;
    END IF;
    -- By the dag_id index: on a small table the optimizer would rather scan the primary key,
    -- locking the references of every consumer. MySQL 8 / MariaDB: MySQL takes no index hint
    -- in a single-table DELETE; the multiple-table form takes one on both.
    DELETE r
      FROM {{ns}}.dag_schedule_asset_reference r
           FORCE INDEX (dag_schedule_asset_reference_dag_idx)
     WHERE r.dag_id = p_dag_id;
    -- The alias clauses by alias, the order of the fan-out's reads (their key is by clause):
    -- read with shared locks, which producers' do not conflict with, then deleted by key,
    -- driven by the list.
    DROP TEMPORARY TABLE IF EXISTS {{ns}}._assetq_delete_alias;
    CREATE TEMPORARY TABLE {{ns}}._assetq_delete_alias (
        alias_id  BIGINT NOT NULL,
        clause_no INT NOT NULL,
        PRIMARY KEY (alias_id, clause_no)
    ) ENGINE = InnoDB;
    INSERT INTO {{ns}}._assetq_delete_alias (alias_id, clause_no)
    SELECT ca.alias_id, ca.clause_no
      FROM {{ns}}.dag_condition_alias ca
     WHERE ca.dag_id = p_dag_id
      LOCK IN SHARE MODE;
    DELETE ca
      FROM {{ns}}._assetq_delete_alias k
      STRAIGHT_JOIN {{ns}}.dag_condition_alias ca
         ON ca.dag_id = p_dag_id AND ca.clause_no = k.clause_no AND ca.alias_id = k.alias_id;
    DROP TEMPORARY TABLE IF EXISTS {{ns}}._assetq_delete_alias;
    DELETE FROM {{ns}}.dag WHERE dag_id = p_dag_id;
END $$

DROP PROCEDURE IF EXISTS {{ns}}.delete_asset $$
CREATE PROCEDURE {{ns}}.delete_asset(IN p_asset TEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin)
MODIFIES SQL DATA
BEGIN
    DECLARE v_id      BIGINT;
    DECLARE v_locked  BIGINT;
    DECLARE v_uses    BIGINT;
    DECLARE v_dags    TEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin;
    DECLARE v_deleted BIGINT;
    DECLARE v_message VARCHAR(128) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin;

    CALL {{ns}}.resolve_asset(p_asset, v_id);  -- by name, then uri, or AQ001
    SELECT a.id INTO v_locked FROM {{ns}}.asset a WHERE a.id = v_id FOR UPDATE;
    IF v_locked IS NULL THEN
        SET v_message = LEFT(CONCAT('[AQ001] unknown asset ', QUOTE(LEFT(p_asset, 64)),
                                    ': it was deleted meanwhile'), 128);
        SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = v_message;
    END IF;
    -- A locking read: a clause committed after the caller's snapshot counts too.
    SELECT COUNT(*) INTO v_uses
      FROM {{ns}}.dag_condition_clause c WHERE c.asset_id = v_id
      LOCK IN SHARE MODE;
    IF v_uses > 0 THEN
        SELECT GROUP_CONCAT(QUOTE(LEFT(x.dag_id, 40)) ORDER BY x.dag_id SEPARATOR ', ') INTO v_dags
          FROM (SELECT DISTINCT c.dag_id FROM {{ns}}.dag_condition_clause c
                 WHERE c.asset_id = v_id ORDER BY c.dag_id LIMIT 5) x;
        SET v_message = LEFT(CONCAT('[AQ007] asset ', QUOTE(LEFT(p_asset, 40)),
                                    ' is in the condition of dag ', COALESCE(v_dags, '?')), 128);
        SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = v_message;
    END IF;
    -- Everything by the asset's own index entries, which a producer adds only once its
    -- foreign-key check has passed (after this commits, it fails instead): the queue rows
    -- through the events (the queue has no index by asset, and a scan of it would lock every
    -- consumer's rows), the events, the alias resolutions, the references. The index hints
    -- keep the optimizer from scanning a small table by its primary key, which would lock
    -- (and wait for) the rows producers are inserting. MySQL 8 / MariaDB: MySQL takes no
    -- index hint in a single-table DELETE; the multiple-table form takes one on both.
    -- First the partition rows of those queue rows (migration 0009_partitions), the same way.
    DELETE p
      FROM {{ns}}.asset_event e FORCE INDEX (asset_event_idempotency_key)
      STRAIGHT_JOIN {{ns}}.asset_dag_run_queue q FORCE INDEX (asset_dag_run_queue_event_idx)
         ON q.asset_event_id = e.id
      STRAIGHT_JOIN {{ns}}.asset_partition_queue p FORCE INDEX (PRIMARY)
         ON p.target_dag_id = q.target_dag_id AND p.asset_event_id = q.asset_event_id
     WHERE e.asset_id = v_id;
    DELETE q
      FROM {{ns}}.asset_event e FORCE INDEX (asset_event_idempotency_key)
      STRAIGHT_JOIN {{ns}}.asset_dag_run_queue q FORCE INDEX (asset_dag_run_queue_event_idx)
         ON q.asset_event_id = e.id
     WHERE e.asset_id = v_id;
    DELETE e
      FROM {{ns}}.asset_event e FORCE INDEX (asset_event_idempotency_key)
     WHERE e.asset_id = v_id;
    SET v_deleted = ROW_COUNT();
    DELETE aa
      FROM {{ns}}.asset_alias_asset aa FORCE INDEX (asset_alias_asset_asset_idx)
     WHERE aa.asset_id = v_id;
    DELETE r
      FROM {{ns}}.dag_schedule_asset_reference r FORCE INDEX (PRIMARY)
     WHERE r.asset_id = v_id;
    DELETE FROM {{ns}}.asset WHERE id = v_id;
    SELECT v_deleted AS deleted_events;
END $$

DROP PROCEDURE IF EXISTS {{ns}}.purge_runs $$
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
    DELETE r
      FROM {{ns}}._assetq_purge k
      STRAIGHT_JOIN {{ns}}.dag_run r FORCE INDEX (PRIMARY) ON r.id = k.id;
    DROP TEMPORARY TABLE IF EXISTS {{ns}}._assetq_purge_candidate, {{ns}}._assetq_purge;
    SELECT v_deleted AS deleted;
END $$

DELIMITER ;

SET SESSION sql_mode = @assetq_saved_sql_mode;
