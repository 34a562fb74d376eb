-- Migration 0014_link_keys (down): the link table gets its event index back, its unique key
-- dagrun_asset_event_once goes back to (dag_id, asset_event_id), and delete_asset and
-- delete_dag get their 0013_queue_checks bodies (the links by the event index, and by dag_id
-- by the dag-first key).
--
-- Online: each index is built in place (ALGORITHM=INPLACE, LOCK=NONE) while passes and
-- producers write, the unique key dropped and added again under its name in one statement.
-- Each routine's old body goes in once the index it names is there: delete_asset's after the
-- event index, delete_dag's after the key is turned back (its new body, through the runs,
-- is right with either). Neither is granted to a role; a call while one is re-created fails
-- with 1305: retry.
--
-- {{ns}} is replaced by the backquoted namespace when the file is loaded. Re-runnable: each
-- index step runs only while its index is as 0014 left it.

SET @assetq_saved_sql_mode = @@SESSION.sql_mode,
    SESSION sql_mode = 'STRICT_TRANS_TABLES,STRICT_ALL_TABLES,NO_ZERO_IN_DATE,NO_ZERO_DATE,ERROR_FOR_DIVISION_BY_ZERO,NO_ENGINE_SUBSTITUTION';

DELIMITER $$

-- Runs ALTER TABLE <p_table> <p_clause> when index p_index of p_table starts with column
-- p_first, or, with p_first NULL, when p_table has no index p_index: each step of the script
-- runs only in the state it starts from, so the script can be run again after any of them.
-- MySQL 8 / MariaDB: neither has ADD/DROP INDEX IF [NOT] EXISTS in both; the helper asks
-- information_schema, builds the statement from the names it was given (already prefixed
-- when the namespace has a table prefix) and is dropped again at the end.
DROP PROCEDURE IF EXISTS {{ns}}._assetq_alter_if_index $$
CREATE PROCEDURE {{ns}}._assetq_alter_if_index(
    IN p_table  TEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin,
    IN p_index  TEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin,
    IN p_first  TEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin,
    IN p_clause TEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin
)
MODIFIES SQL DATA
SQL SECURITY INVOKER
BEGIN
    DECLARE v_first TEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin;
    SELECT MAX(s.COLUMN_NAME) INTO v_first FROM information_schema.STATISTICS s
     WHERE s.TABLE_SCHEMA = DATABASE() AND s.TABLE_NAME = p_table
       AND s.INDEX_NAME = p_index AND s.SEQ_IN_INDEX = 1;
    IF v_first <=> p_first THEN
        -- Inside a routine DATABASE() is the routine's own database: the namespace.
        SET @assetq_ddl = CONCAT('ALTER TABLE `', DATABASE(), '`.`', p_table, '` ', p_clause);
        PREPARE assetq_ddl FROM @assetq_ddl;
        EXECUTE assetq_ddl;
        DEALLOCATE PREPARE assetq_ddl;
    END IF;
END $$

DELIMITER ;

CALL {{ns}}._assetq_alter_if_index('dagrun_asset_event', 'dagrun_asset_event_event_idx', NULL,
                                   'ADD KEY dagrun_asset_event_event_idx (asset_event_id), ALGORITHM=INPLACE, LOCK=NONE');

DELIMITER $$

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
    -- The links of its events, by hand (no foreign keys on the link table since
    -- 0012_link_checks), after the queue rows: that delete, a locking read, waited for every
    -- pass holding one of them (a pass deletes the rows it claims and holds them to its
    -- commit), and this one, a locking read too, reads those passes' committed links. A pass
    -- that claims one of them later finds it deleted by us: its delete waits for our commit,
    -- deletes fewer rows than it claimed, and the claim guard (AQ900) rolls it back before it
    -- links anything.
    DELETE l
      FROM {{ns}}.asset_event e FORCE INDEX (asset_event_idempotency_key)
      STRAIGHT_JOIN {{ns}}.dagrun_asset_event l FORCE INDEX (dagrun_asset_event_event_idx)
         ON l.asset_event_id = e.id
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

DELIMITER ;

CALL {{ns}}._assetq_alter_if_index('dagrun_asset_event', 'dagrun_asset_event_once', 'asset_event_id',
                                   'DROP INDEX dagrun_asset_event_once, ADD UNIQUE KEY dagrun_asset_event_once (dag_id, asset_event_id), ALGORITHM=INPLACE, LOCK=NONE');
DROP PROCEDURE IF EXISTS {{ns}}._assetq_alter_if_index;

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

SET SESSION sql_mode = @assetq_saved_sql_mode;
