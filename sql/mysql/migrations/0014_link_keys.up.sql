-- Migration 0014_link_keys (up): the link table's unique key is turned around, event first,
-- and its event index goes; delete_dag deletes its links through the dag's runs. The same
-- revision as sql/postgresql/migrations/0014_link_keys.up.sql, with the same behaviour:
--
--   * dagrun_asset_event_once, I4 (an event is linked at most once per consumer), is UNIQUE
--     (asset_event_id, dag_id) instead of (dag_id, asset_event_id): the same uniqueness,
--     still enforced by the database, and it serves every lookup by event (purge_events'
--     "still linked?" test, delete_asset's link delete, now hinted to it), so
--     dagrun_asset_event_event_idx is dropped: one index entry fewer for every link a pass
--     inserts. dagrun_asset_event_run_idx and the primary key stay;
--   * delete_dag, whose link delete was the one statement that used the dag-first order,
--     deletes the links through the consumer's runs (their dag_id index, then the links'
--     primary key), the runs it has just locked FOR UPDATE: the locking order (lock row,
--     runs, links) is unchanged.
--
-- Online: the unique key is dropped and added again under its own name in one statement, in
-- place (ALGORITHM=INPLACE, LOCK=NONE, under the revision's lock timeout for the table's
-- metadata lock): passes go on inserting links while the new index builds (time grows with
-- the links, the history), the old key checking them until the new one replaces it at the
-- end of the statement; the event index is then dropped in place (catalog only). Each
-- routine's new body goes in while the indexes it names are there: delete_dag's (the primary
-- key) before the key is turned, delete_asset's (the turned key) after it and before the
-- event index, which its old body names, is dropped. Both are granted to no role and are
-- dropped and created again (a call while one is re-created fails with 1305: retry).
--
-- {{ns}} is replaced by the backquoted namespace when the file is loaded. Re-runnable, as
-- every MySQL script of assetq: each index step runs only while its index is as it was.

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
    -- Its links through those runs, by the runs' dag_id index and the links' primary key: no
    -- index of the links leads with dag_id since 0014_link_keys. A multiple-table DELETE
    -- reads the runs, which we hold FOR UPDATE already.
    DELETE l
      FROM {{ns}}.dag_run r FORCE INDEX (dag_run_dag_state_idx)
      STRAIGHT_JOIN {{ns}}.dagrun_asset_event l FORCE INDEX (PRIMARY) ON l.dag_run_id = r.id
     WHERE r.dag_id = p_dag_id;
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

-- MySQL 8 / MariaDB: both accept the drop and the add of one index name in one statement in
-- place, and ADD UNIQUE KEY names both the index and the constraint, as CONSTRAINT ... UNIQUE
-- in schema.sql does.
CALL {{ns}}._assetq_alter_if_index('dagrun_asset_event', 'dagrun_asset_event_once', 'dag_id',
                                   'DROP INDEX dagrun_asset_event_once, ADD UNIQUE KEY dagrun_asset_event_once (asset_event_id, dag_id), ALGORITHM=INPLACE, LOCK=NONE');

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
      STRAIGHT_JOIN {{ns}}.dagrun_asset_event l FORCE INDEX (dagrun_asset_event_once)
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

CALL {{ns}}._assetq_alter_if_index('dagrun_asset_event', 'dagrun_asset_event_event_idx', 'asset_event_id',
                                   'DROP INDEX dagrun_asset_event_event_idx, ALGORITHM=INPLACE, LOCK=NONE');
DROP PROCEDURE IF EXISTS {{ns}}._assetq_alter_if_index;

SET SESSION sql_mode = @assetq_saved_sql_mode;
