-- Migration 0013_queue_checks (up): the queue loses its two foreign keys; delete_dag deletes
-- its consumer's queue rows itself. The same revision as
-- sql/postgresql/migrations/0013_queue_checks.up.sql, with the same behaviour:
--
--   * asset_dag_run_queue has no foreign key to dag (it had ON DELETE CASCADE) or to
--     asset_event (no cascade) any more. Queue rows are written only by the fan-out trigger,
--     in the statement that inserts their event, for consumers whose reference (or
--     alias-clause) and dag rows it reads with a shared lock; purge_events deletes only
--     events without a queue row and delete_asset deletes its events' queue rows first, as
--     before. Its indexes stay (asset_dag_run_queue_event_idx serves purge_events and
--     delete_asset);
--   * delete_dag deletes the consumer's queue rows after its reference and alias-clause
--     rows, whose delete waited for every producer in flight that read them.
--
-- Online: a foreign key is dropped in place, catalog only, while producers and passes write
-- (ALGORITHM=INPLACE, LOCK=NONE, under the revision's lock timeout for the table's metadata
-- lock); delete_dag, granted to no role, is dropped and created again (a call while it is
-- re-created fails with 1305: retry). delete_dag's new body goes in first: it deletes the
-- queue rows itself, which is harmless while the cascade is still there, so no delete_dag
-- runs without one or the other between the script's statements (each DDL commits).
--
-- {{ns}} is replaced by the backquoted namespace when the file is loaded. Re-runnable, as
-- every MySQL script of assetq: each key is dropped only while it is there.

SET @assetq_saved_sql_mode = @@SESSION.sql_mode,
    SESSION sql_mode = 'STRICT_TRANS_TABLES,STRICT_ALL_TABLES,NO_ZERO_IN_DATE,NO_ZERO_DATE,ERROR_FOR_DIVISION_BY_ZERO,NO_ENGINE_SUBSTITUTION';

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
    -- Its queue rows by hand too (the queue has no foreign keys since 0013_queue_checks),
    -- after its reference and alias-clause rows: their delete waited for every producer in
    -- flight that read them (the fan-out reads them with a shared lock), and this delete, a
    -- locking read, reads those producers' committed rows; a later producer finds no
    -- reference to queue through.
    DELETE q
      FROM {{ns}}.asset_dag_run_queue q FORCE INDEX (PRIMARY)
     WHERE q.target_dag_id = p_dag_id;
    DELETE FROM {{ns}}.dag WHERE dag_id = p_dag_id;
END $$

DELIMITER ;

DELIMITER $$

-- Drops foreign key p_name of table p_table when it is there, in place (catalog only).
-- MySQL 8 / MariaDB: DROP FOREIGN KEY IF EXISTS is MariaDB-only, and DROP CONSTRAINT for a
-- foreign key needs MySQL 8.0.19; the helper asks information_schema, builds the statement
-- from the names it was given (already prefixed when the namespace has a table prefix) and
-- is dropped again at the end.
DROP PROCEDURE IF EXISTS {{ns}}._assetq_drop_foreign_key $$
CREATE PROCEDURE {{ns}}._assetq_drop_foreign_key(
    IN p_table TEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin,
    IN p_name  TEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin
)
MODIFIES SQL DATA
SQL SECURITY INVOKER
BEGIN
    DECLARE v_found BIGINT;
    SELECT COUNT(*) INTO v_found FROM information_schema.TABLE_CONSTRAINTS t
     WHERE t.CONSTRAINT_SCHEMA = DATABASE() AND t.TABLE_NAME = p_table
       AND t.CONSTRAINT_NAME = p_name AND t.CONSTRAINT_TYPE = 'FOREIGN KEY';
    IF v_found > 0 THEN
        -- Inside a routine DATABASE() is the routine's own database: the namespace.
        SET @assetq_ddl = CONCAT('ALTER TABLE `', DATABASE(), '`.`', p_table,
                                 '` DROP FOREIGN KEY `', p_name, '`, ALGORITHM=INPLACE, LOCK=NONE');
        PREPARE assetq_ddl FROM @assetq_ddl;
        EXECUTE assetq_ddl;
        DEALLOCATE PREPARE assetq_ddl;
    END IF;
END $$

DELIMITER ;

CALL {{ns}}._assetq_drop_foreign_key('asset_dag_run_queue', 'asset_dag_run_queue_target_dag_id_fkey');
CALL {{ns}}._assetq_drop_foreign_key('asset_dag_run_queue', 'asset_dag_run_queue_asset_event_id_fkey');
DROP PROCEDURE IF EXISTS {{ns}}._assetq_drop_foreign_key;

SET SESSION sql_mode = @assetq_saved_sql_mode;
