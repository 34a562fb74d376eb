-- Migration 0013_queue_checks (down): the queue gets its two foreign keys back (the cascade
-- from dag included), and delete_dag its 0012_link_checks body, which leaves the queue rows
-- to that cascade. The keys go back first: the new body is right with them too, so no
-- delete_dag runs without its queue delete or the cascade between the script's statements.
--
-- Queue rows whose consumer or event is gone (a DELETE by hand under 0013 that left them) are
-- deleted first: the cascade would have deleted those of a consumer, and the keys could not
-- be added over them.
--
-- Not online: MySQL 8 / MariaDB add a foreign key in place only with foreign_key_checks off,
-- which would not check the existing rows; with the checks, as here, the queue is copied
-- (ALGORITHM=COPY), and producers and passes, which write it, wait for the copy (time grows
-- with the queue, not the history).
--
-- {{ns}} is replaced by the backquoted namespace when the file is loaded. Re-runnable: each
-- key is added only while it is missing (the helper _assetq_alter_if, as in 0009).

SET @assetq_saved_sql_mode = @@SESSION.sql_mode,
    SESSION sql_mode = 'STRICT_TRANS_TABLES,STRICT_ALL_TABLES,NO_ZERO_IN_DATE,NO_ZERO_DATE,ERROR_FOR_DIVISION_BY_ZERO,NO_ENGINE_SUBSTITUTION';

-- By key, driven by the queue (MySQL 8 / MariaDB: a multiple-table DELETE, no subquery on
-- the table deleted from).
DELETE q
  FROM {{ns}}.asset_dag_run_queue q
  LEFT JOIN {{ns}}.dag d ON d.dag_id = q.target_dag_id
  LEFT JOIN {{ns}}.asset_event e ON e.id = q.asset_event_id
 WHERE d.dag_id IS NULL OR e.id IS NULL;

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

CALL {{ns}}._assetq_alter_if(FALSE, 'asset_dag_run_queue', 'constraint', 'asset_dag_run_queue_target_dag_id_fkey',
                             'ADD CONSTRAINT asset_dag_run_queue_target_dag_id_fkey FOREIGN KEY (target_dag_id) REFERENCES {{ns}}.dag (dag_id) ON DELETE CASCADE');
CALL {{ns}}._assetq_alter_if(FALSE, 'asset_dag_run_queue', 'constraint', 'asset_dag_run_queue_asset_event_id_fkey',
                             'ADD CONSTRAINT asset_dag_run_queue_asset_event_id_fkey FOREIGN KEY (asset_event_id) REFERENCES {{ns}}.asset_event (id)');
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
    SELECT COUNT(*) INTO v_found
      FROM {{ns}}.dag_run r FORCE INDEX (dag_run_dag_state_idx)
     WHERE r.dag_id = p_dag_id
       FOR UPDATE;
    DELETE l
      FROM {{ns}}.dagrun_asset_event l FORCE INDEX (dagrun_asset_event_once)
     WHERE l.dag_id = p_dag_id;
    DELETE FROM {{ns}}.dag WHERE dag_id = p_dag_id;
END $$

DELIMITER ;

SET SESSION sql_mode = @assetq_saved_sql_mode;
