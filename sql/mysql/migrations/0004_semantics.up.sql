-- Migration 0004_semantics (up): the scheduling semantics Airflow users rely on.
-- Frozen once released: later changes go into new migrations. docs/semantics.md explains
-- each item from the user's side.
--
--   * asset aliases: events registered through aliases, consumers scheduled on aliases, and
--     the aliases each event came through;
--   * references by name or by uri to assets nobody has declared yet (declared = false);
--   * consumers that keep queueing while paused (queue_while_paused); a re-declared consumer
--     drops the queued rows of assets it no longer depends on;
--   * max_active_runs, run states and set_run_state; max_events_per_run;
--   * run metadata: the triggering (newest) event and the number of events consumed;
--   * delete_dag and delete_asset;
--   * dag_queue_status shows active runs against the cap.
--
-- Accounts keep the rights they had. MySQL revokes the privileges on a routine when it is
-- dropped, so the EXECUTE (and ALTER ROUTINE) grants on every routine this migration creates
-- again are saved in a table first and given back at the end; accounts that could run
-- schedule_pass may now also run set_run_state. Readers hold SELECT on the whole namespace,
-- which covers the new tables.
--
-- {{ns}} is replaced by the backquoted namespace when the file is loaded. Re-runnable, as
-- every MySQL script of assetq: DDL commits statement by statement, so an upgrade that
-- stopped half-way is finished by running the script again (the saved grants are kept in a
-- table, not a temporary one, for that reason).

SET @assetq_saved_sql_mode = @@SESSION.sql_mode,
    SESSION sql_mode = 'STRICT_TRANS_TABLES,STRICT_ALL_TABLES,NO_ZERO_IN_DATE,NO_ZERO_DATE,ERROR_FOR_DIVISION_BY_ZERO,NO_ENGINE_SUBSTITUTION';

-- The grants on the routines created again below, saved before any is dropped.
CREATE TABLE IF NOT EXISTS {{ns}}._assetq_0004_grants (
    routine_name VARCHAR(64) NOT NULL,
    grantee_user VARCHAR(128) NOT NULL,
    grantee_host VARCHAR(255) NOT NULL,
    privileges   VARCHAR(64) NOT NULL,
    PRIMARY KEY (routine_name, grantee_user, grantee_host)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

DELIMITER $$

-- Runs ALTER TABLE <p_table> <p_clause> when the column, index or constraint p_name of
-- p_table (p_kind 'column', 'index' or 'constraint') is there (p_present) or is missing
-- (NOT p_present), so that every change below can run twice.
-- MySQL 8 / MariaDB: ADD COLUMN IF NOT EXISTS, CREATE INDEX IF NOT EXISTS and their DROP ...
-- IF EXISTS forms are MariaDB-only; the helper asks information_schema instead, and is
-- dropped again at the end.
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
    IF p_kind = 'column' THEN
        SELECT COUNT(*) INTO v_found FROM information_schema.COLUMNS c
         WHERE c.TABLE_SCHEMA = DATABASE() AND c.TABLE_NAME = p_table AND c.COLUMN_NAME = p_name;
    ELSEIF p_kind = 'index' THEN
        SELECT COUNT(*) INTO v_found FROM information_schema.STATISTICS s
         WHERE s.TABLE_SCHEMA = DATABASE() AND s.TABLE_NAME = p_table AND s.INDEX_NAME = p_name;
    ELSE
        SELECT COUNT(*) INTO v_found FROM information_schema.TABLE_CONSTRAINTS t
         WHERE t.CONSTRAINT_SCHEMA = DATABASE() AND t.TABLE_NAME = p_table
           AND t.CONSTRAINT_NAME = p_name;
    END IF;
    IF (v_found > 0) = p_present THEN
        -- Inside a routine DATABASE() is the routine's own database: the namespace.
        SET @assetq_ddl = CONCAT('ALTER TABLE `', DATABASE(), '`.`', p_table, '` ', p_clause);
        PREPARE assetq_ddl FROM @assetq_ddl;
        EXECUTE assetq_ddl;
        DEALLOCATE PREPARE assetq_ddl;
    END IF;
END $$

-- Saves the routine privileges accounts hold on the routines this script drops and creates
-- again. An installer that may not read mysql.procs_priv (error 1142) saves nothing: it
-- could not give them back either.
DROP PROCEDURE IF EXISTS {{ns}}._assetq_save_grants $$
CREATE PROCEDURE {{ns}}._assetq_save_grants()
MODIFIES SQL DATA
SQL SECURITY INVOKER
BEGIN
    DECLARE CONTINUE HANDLER FOR 1142 BEGIN END;
    -- IGNORE only skips grants saved by an earlier, interrupted run: the table has no
    -- foreign key or check whose failure it could hide.
    INSERT IGNORE INTO {{ns}}._assetq_0004_grants
           (routine_name, grantee_user, grantee_host, privileges)
    SELECT p.Routine_name, p.User, p.Host, p.Proc_priv
      FROM mysql.procs_priv p
     WHERE p.Db = DATABASE()
       AND p.Routine_type = 'PROCEDURE'
       AND p.Routine_name IN ('register_events', 'declare_asset', 'declare_dag', 'schedule_pass',
                              'set_run_state', 'delete_dag', 'delete_asset',
                              'grant_access', 'revoke_access')
       AND p.Proc_priv <> '';
END $$

-- Gives the saved privileges back on the routines that exist now, to the accounts that still
-- exist. An account that could run schedule_pass may now also run set_run_state (scheduler
-- access, as grant_access gives it from this revision on).
-- MySQL 8 / MariaDB: a MariaDB role is stored with host '' and is named without a host in
-- GRANT; MySQL 8 has no such accounts.
DROP PROCEDURE IF EXISTS {{ns}}._assetq_restore_grants $$
CREATE PROCEDURE {{ns}}._assetq_restore_grants()
MODIFIES SQL DATA
SQL SECURITY INVOKER
BEGIN
    DECLARE v_done    BOOLEAN DEFAULT FALSE;
    DECLARE v_routine VARCHAR(64) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin;
    DECLARE v_user    VARCHAR(128) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin;
    DECLARE v_host    VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin;
    DECLARE v_privs   VARCHAR(64) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin;
    DECLARE v_list    VARCHAR(64) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin;
    DECLARE v_found   BIGINT;
    DECLARE c_grants CURSOR FOR
        SELECT g.routine_name, g.grantee_user, g.grantee_host, g.privileges
          FROM {{ns}}._assetq_0004_grants g
        UNION ALL
        SELECT 'set_run_state', g.grantee_user, g.grantee_host, 'Execute'
          FROM {{ns}}._assetq_0004_grants g
         WHERE g.routine_name = 'schedule_pass' AND FIND_IN_SET('Execute', g.privileges) > 0
         ORDER BY 1, 2, 3;
    DECLARE CONTINUE HANDLER FOR NOT FOUND SET v_done = TRUE;

    OPEN c_grants;
    grant_loop: LOOP
        FETCH c_grants INTO v_routine, v_user, v_host, v_privs;
        IF v_done THEN
            LEAVE grant_loop;
        END IF;
        SELECT COUNT(*) INTO v_found FROM information_schema.ROUTINES r
         WHERE r.ROUTINE_SCHEMA = DATABASE() AND r.ROUTINE_NAME = v_routine
           AND r.ROUTINE_TYPE = 'PROCEDURE';
        IF v_found > 0 THEN
            -- GRANT would create a missing account on MariaDB: only existing ones.
            SELECT COUNT(*) INTO v_found FROM mysql.user u
             WHERE u.User = v_user AND u.Host = v_host;
        END IF;
        SET v_list = CONCAT_WS(', ',
                               IF(FIND_IN_SET('Execute', v_privs) > 0, 'EXECUTE', NULL),
                               IF(FIND_IN_SET('Alter Routine', v_privs) > 0, 'ALTER ROUTINE', NULL));
        IF v_found > 0 AND v_list <> '' THEN
            SET @assetq_grant = CONCAT('GRANT ', v_list, ' ON PROCEDURE `', DATABASE(), '`.`',
                                       v_routine, '` TO ', QUOTE(v_user),
                                       IF(v_host = '', '', CONCAT('@', QUOTE(v_host))),
                                       IF(FIND_IN_SET('Grant', v_privs) > 0, ' WITH GRANT OPTION', ''));
            PREPARE assetq_grant FROM @assetq_grant;
            EXECUTE assetq_grant;
            DEALLOCATE PREPARE assetq_grant;
        END IF;
    END LOOP;
    CLOSE c_grants;
END $$

DELIMITER ;

CALL {{ns}}._assetq_save_grants();


-- Consumers: their caps (NULL: none) and whether events keep queueing while paused.
CALL {{ns}}._assetq_alter_if(FALSE, 'dag', 'column', 'max_active_runs',
                             'ADD COLUMN max_active_runs INT NULL');
CALL {{ns}}._assetq_alter_if(FALSE, 'dag', 'column', 'max_events_per_run',
                             'ADD COLUMN max_events_per_run INT NULL');
CALL {{ns}}._assetq_alter_if(FALSE, 'dag', 'column', 'queue_while_paused',
                             'ADD COLUMN queue_while_paused BOOLEAN NOT NULL DEFAULT FALSE');
CALL {{ns}}._assetq_alter_if(FALSE, 'dag', 'constraint', 'dag_max_active_runs_check',
                             'ADD CONSTRAINT dag_max_active_runs_check CHECK (max_active_runs >= 1)');
CALL {{ns}}._assetq_alter_if(FALSE, 'dag', 'constraint', 'dag_max_events_per_run_check',
                             'ADD CONSTRAINT dag_max_events_per_run_check CHECK (max_events_per_run >= 1)');

-- false for an asset that exists only because a consumer condition referenced it: the first
-- declare_asset that names it by its uri may still give it its real name.
CALL {{ns}}._assetq_alter_if(FALSE, 'asset', 'column', 'declared',
                             'ADD COLUMN declared BOOLEAN NOT NULL DEFAULT TRUE');

CREATE TABLE IF NOT EXISTS {{ns}}.asset_alias (
    id          BIGINT NOT NULL AUTO_INCREMENT,
    name        VARCHAR(512) NOT NULL,
    created_at  DATETIME(6) NOT NULL DEFAULT (UTC_TIMESTAMP(6)),
    PRIMARY KEY (id),
    CONSTRAINT asset_alias_name_key UNIQUE (name),
    CONSTRAINT asset_alias_name_not_empty CHECK (CHAR_LENGTH(name) > 0)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

-- Alias alias_id has resolved to asset asset_id: an event of the asset was registered
-- through the alias. From then on the alias's consumers get every event of the asset.
CREATE TABLE IF NOT EXISTS {{ns}}.asset_alias_asset (
    alias_id    BIGINT NOT NULL,
    asset_id    BIGINT NOT NULL,
    created_at  DATETIME(6) NOT NULL DEFAULT (UTC_TIMESTAMP(6)),
    PRIMARY KEY (alias_id, asset_id),
    KEY asset_alias_asset_asset_idx (asset_id),
    CONSTRAINT asset_alias_asset_alias_id_fkey FOREIGN KEY (alias_id)
        REFERENCES {{ns}}.asset_alias (id) ON DELETE CASCADE,
    CONSTRAINT asset_alias_asset_asset_id_fkey FOREIGN KEY (asset_id)
        REFERENCES {{ns}}.asset (id) ON DELETE CASCADE
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

-- The aliases an event was registered through.
CREATE TABLE IF NOT EXISTS {{ns}}.asset_event_alias (
    asset_event_id  BIGINT NOT NULL,
    alias_id        BIGINT NOT NULL,
    PRIMARY KEY (asset_event_id, alias_id),
    KEY asset_event_alias_alias_idx (alias_id),
    CONSTRAINT asset_event_alias_asset_event_id_fkey FOREIGN KEY (asset_event_id)
        REFERENCES {{ns}}.asset_event (id) ON DELETE CASCADE,
    CONSTRAINT asset_event_alias_alias_id_fkey FOREIGN KEY (alias_id)
        REFERENCES {{ns}}.asset_alias (id)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

-- Alias members of a consumer's CNF clauses (asset members are in dag_condition_clause).
-- Clause clause_no holds when a claimed row's asset is a member, or an alias member has
-- resolved to it. The fan-out reads it by alias.
CREATE TABLE IF NOT EXISTS {{ns}}.dag_condition_alias (
    dag_id      VARCHAR(250) NOT NULL,
    clause_no   INT NOT NULL,
    alias_id    BIGINT NOT NULL,
    PRIMARY KEY (dag_id, clause_no, alias_id),
    KEY dag_condition_alias_alias_idx (alias_id),
    CONSTRAINT dag_condition_alias_dag_id_fkey FOREIGN KEY (dag_id)
        REFERENCES {{ns}}.dag (dag_id) ON DELETE CASCADE,
    CONSTRAINT dag_condition_alias_alias_id_fkey FOREIGN KEY (alias_id)
        REFERENCES {{ns}}.asset_alias (id)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

-- triggering_event_id: the newest event the run consumed (no foreign key: purge and
-- delete_asset may delete the event, the run keeps the id). event_count: how many it consumed.
CALL {{ns}}._assetq_alter_if(FALSE, 'dag_run', 'column', 'triggering_event_id',
                             'ADD COLUMN triggering_event_id BIGINT NULL');
CALL {{ns}}._assetq_alter_if(FALSE, 'dag_run', 'column', 'event_count',
                             'ADD COLUMN event_count INT NOT NULL DEFAULT 0');
CALL {{ns}}._assetq_alter_if(FALSE, 'dag_run', 'column', 'started_at',
                             'ADD COLUMN started_at DATETIME(6) NULL');
CALL {{ns}}._assetq_alter_if(FALSE, 'dag_run', 'column', 'ended_at',
                             'ADD COLUMN ended_at DATETIME(6) NULL');
CALL {{ns}}._assetq_alter_if(FALSE, 'dag_run', 'column', 'updated_at',
                             'ADD COLUMN updated_at DATETIME(6) NULL');
-- Active runs of a consumer (max_active_runs), and runs(dag_id, state=...).
CALL {{ns}}._assetq_alter_if(FALSE, 'dag_run', 'index', 'dag_run_dag_state_idx',
                             'ADD INDEX dag_run_dag_state_idx (dag_id, state)');


-- Fan-out (I1, I2), now also for consumers that depend on the asset through an alias it has
-- resolved to, and for paused consumers that queue while paused: one queue row per consumer,
-- even when it references the asset both directly and through an alias (UNION).
--
-- Every row it queues through is read with a shared lock (LOCK IN SHARE MODE): the reference
-- and alias-clause rows and the dag rows. On a dag row that is the lock the queue's
-- foreign-key check takes anyway, taken by the read so that a consumer deleted meanwhile
-- (delete_dag) is waited for and then skipped instead of failing the producer's foreign-key
-- check. On the reference and alias-clause rows it makes a re-declare that drops the asset
-- wait for the producers in flight, and the producers after it see the new definition: no
-- event is queued for a consumer that no longer depends on its asset. A trigger's reads are
-- locking reads anyway, except at READ COMMITTED under an INSERT ... SELECT (a batch
-- registration), where InnoDB would read them without locks: hence the explicit clauses.
-- delete_dag and declare_dag change a consumer's reference rows, then its alias-clause rows,
-- each in key order, then its dag row.
--
-- The asset's alias resolutions are looked up first (one index dive, with the shared lock the
-- alias query below takes on them anyway). An asset no alias has resolved to, the usual case,
-- takes the short statement: its reference rows in key order, each followed by its consumer's
-- dag row, as in 0003 but with the explicit locks. Interleaving is safe there: a declaration
-- or deletion holds the rows of one consumer only, and the producer reaches that consumer's
-- dag row only through its reference row, so it never holds a dag row such a writer waits
-- for while waiting for that writer. An asset with resolutions takes the UNION: every
-- reference and alias-clause row first (the derived table, materialized before the join),
-- then the dag rows, so a producer holding a consumer's dag row never waits for one of its
-- alias-clause rows. One queue row per consumer even when it references the asset both
-- directly and through an alias. The index hints keep the optimizer from scanning a small
-- table through a join buffer, which would lock the rows of every consumer.
-- MySQL 8 / MariaDB: a locking clause covers the tables of its own query block only, so each
-- block of the UNION has its own (in parentheses, as both require).
--
-- Replacing the trigger under traffic (an online upgrade, I1). MySQL has no CREATE OR REPLACE
-- TRIGGER: it is dropped and created again with the event table locked for writing, as
-- 0009_partitions and repair do, so no event is inserted in between without its queue rows;
-- a producer waits for the swap, bounded by the lock timeout, then fires the new trigger.
-- (As first released, this script dropped and created it unlocked: under traffic 1 or 2
-- events in a few hundred got no queue row. The schema this script leaves is the same.)
--
-- The lock alone is not enough on MariaDB 10.11: a CALL already running when the trigger is
-- replaced (every producer that waited for the lock) fires the new trigger with only the
-- tables the old one read opened for it, and the new one's first read of a table the old one
-- never read, asset_alias_asset, fails with error 1146 ("Table '...aa' doesn't exist"; as in
-- MariaDB's MDEV-26048). A raw INSERT that waited, and a CALL that begins after the swap, are
-- not affected (tests/test_online_upgrade.py); MySQL re-parses a stored program's statement
-- when its tables change (since 5.6, WL#4179). So the fan-out goes in with two swaps. Here a
-- bridge: the fan-out with one difference, which lets such a CALL through on the short path,
-- reading only what the 0003 trigger read (no alias has resolved to an asset yet: only the
-- routines created below resolve aliases; on a re-run the trigger replaced here already
-- reads asset_alias_asset). At the end of this script, long after every CALL that began
-- before the first swap has ended, the fan-out itself replaces the bridge, whose tables cover
-- its own. Both swaps are SQL that MySQL 8 accepts too: LOCK TABLES, then DROP and CREATE
-- TRIGGER on the locked table.
LOCK TABLES {{ns}}.asset_event WRITE;
DELIMITER $$
DROP TRIGGER IF EXISTS {{ns}}.asset_event_fan_out $$
CREATE TRIGGER {{ns}}.asset_event_fan_out
    AFTER INSERT ON {{ns}}.asset_event
    FOR EACH ROW
BEGIN
    DECLARE v_resolutions BIGINT DEFAULT 0;
    -- The bridge's one difference: a CALL that began before this swap may not reach
    -- asset_alias_asset (1146, see above); it finds no resolution and takes the short path.
    BEGIN
        DECLARE CONTINUE HANDLER FOR 1146 BEGIN END;
        SELECT COUNT(*) INTO v_resolutions
          FROM {{ns}}.asset_alias_asset aa FORCE INDEX (asset_alias_asset_asset_idx)
         WHERE aa.asset_id = NEW.asset_id
          LOCK IN SHARE MODE;
    END;
    IF v_resolutions = 0 THEN
        INSERT INTO {{ns}}.asset_dag_run_queue (target_dag_id, asset_event_id, asset_id, created_at)
        SELECT d.dag_id, NEW.id, NEW.asset_id, NEW.`timestamp`
          FROM {{ns}}.dag_schedule_asset_reference r FORCE INDEX (PRIMARY)
          STRAIGHT_JOIN {{ns}}.dag d FORCE INDEX (PRIMARY) ON d.dag_id = r.dag_id
         WHERE r.asset_id = NEW.asset_id
           AND (NOT d.is_paused OR d.queue_while_paused)
          LOCK IN SHARE MODE;
    ELSE
        INSERT INTO {{ns}}.asset_dag_run_queue (target_dag_id, asset_event_id, asset_id, created_at)
        SELECT d.dag_id, NEW.id, NEW.asset_id, NEW.`timestamp`
          FROM ((SELECT r.dag_id
                   FROM {{ns}}.dag_schedule_asset_reference r
                  WHERE r.asset_id = NEW.asset_id
                   LOCK IN SHARE MODE)
                UNION
                (SELECT ca.dag_id
                   FROM {{ns}}.asset_alias_asset aa FORCE INDEX (asset_alias_asset_asset_idx)
                   STRAIGHT_JOIN {{ns}}.dag_condition_alias ca FORCE INDEX (dag_condition_alias_alias_idx)
                      ON ca.alias_id = aa.alias_id
                  WHERE aa.asset_id = NEW.asset_id
                   LOCK IN SHARE MODE)) t
          STRAIGHT_JOIN {{ns}}.dag d FORCE INDEX (PRIMARY) ON d.dag_id = t.dag_id
         WHERE NOT d.is_paused OR d.queue_while_paused
          LOCK IN SHARE MODE;
    END IF;
END $$
DELIMITER ;
UNLOCK TABLES;


DELIMITER $$

-- register_events, as in 0002, plus aliases: an item may carry "aliases", a JSON array of 1 to
-- 100 alias names (1 to 512 characters; null or absent: none). Before the events are
-- inserted, each alias is created if new and resolved to its item's asset, so the fan-out
-- already queues the event for the alias's consumers; each created event records the aliases
-- it came through. A retry (an idempotency key that met an existing event) records nothing new.
--
-- Registers a batch of events in the caller's transaction, in one round trip, and returns one
-- result set with one row per item in input order (item_no, event_id, asset_id,
-- event_timestamp, created), with register_event's guarantees for each. p_events is a JSON
-- array of at most 10,000 objects {"asset": name or uri, "extra", "source_dag_id",
-- "source_task_id", "source_run_id", "source_map_index", "idempotency_key", "aliases"}; only
-- "asset" is required. The events of one batch share one timestamp.
--
-- All or nothing, once the caller rolls back on error (as after any routine error here).
-- Every item is checked and every asset resolved before anything is written: one unknown asset
-- (AQ001) or extra that is not an object, or bad aliases (AQ002) fails the call with nothing
-- inserted. A key reused with another extra (AQ005), or a value the table refuses, fails it
-- after some rows may have been inserted in the caller's transaction. Items with the same
-- asset and idempotency key are one event, as retries would be: the first creates it (unless
-- it exists already), the others return it with created = 0. MySQL has no statement-level
-- triggers: the row-level trigger fans out each event of the batch.
--
-- Under autocommit each statement of a procedure commits on its own, so the row-by-row path
-- below is atomic only inside a transaction: the Python layer opens one on an autocommit
-- connection.
DROP PROCEDURE IF EXISTS {{ns}}.register_events $$
CREATE PROCEDURE {{ns}}.register_events(IN p_events JSON)
MODIFIES SQL DATA
BEGIN
    DECLARE v_count     INT;
    DECLARE v_item_no   INT DEFAULT 0;
    DECLARE v_bad       INT;
    DECLARE v_kind      VARCHAR(32) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin;
    DECLARE v_name      VARCHAR(1024) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin;
    DECLARE v_asset_id  BIGINT;
    DECLARE v_extra     JSON;
    DECLARE v_dag_id    VARCHAR(1024) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin;
    DECLARE v_task_id   VARCHAR(1024) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin;
    DECLARE v_run_id    VARCHAR(1024) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin;
    DECLARE v_map_index INT;
    DECLARE v_key       VARCHAR(1024) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin;
    DECLARE v_event_id  BIGINT;
    DECLARE v_first_id  BIGINT;
    DECLARE v_timestamp DATETIME(6);
    DECLARE v_old_extra JSON;
    DECLARE v_old_timestamp DATETIME(6);
    DECLARE v_duplicate BOOLEAN;
    DECLARE v_aliases   BOOLEAN DEFAULT FALSE;
    DECLARE v_pos       BIGINT DEFAULT 0;
    DECLARE v_alias_id  BIGINT;
    DECLARE v_message   VARCHAR(128) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin;

    -- IF, not a CASE as in register_event: in this routine MariaDB 10.11 evaluated the CASE's
    -- JSON_TYPE on invalid text although its JSON_VALID branch was false, and failed with
    -- error 4037 instead of AQ002 (tests/test_direct_sql.py, batch-invalid-json).
    SET v_kind = 'invalid JSON';
    IF p_events IS NULL THEN
        SET v_kind = 'NULL';
    ELSEIF JSON_VALID(p_events) THEN
        SET v_kind = JSON_TYPE(p_events);
    END IF;
    IF v_kind <> 'ARRAY' THEN
        SET v_message = CONCAT('[AQ002] events must be a JSON array, got ', v_kind);
        SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = v_message;
    END IF;
    SET v_count = JSON_LENGTH(p_events);
    IF v_count > 10000 THEN
        SET v_message = CONCAT('[AQ002] a batch holds at most 10000 events, got ', v_count,
                               ': split it into several calls in one transaction');
        SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = v_message;
    END IF;

    -- The items, parsed once. A session temporary table (a failed call's is dropped by the
    -- next). Text columns are wider than the event table's: a value too long reaches the
    -- INSERT, which refuses it in strict mode (1406), instead of being cut short here.
    DROP TEMPORARY TABLE IF EXISTS {{ns}}._assetq_batch, {{ns}}._assetq_batch_alias,
                                   {{ns}}._assetq_alias_name, {{ns}}._assetq_alias_pair;
    CREATE TEMPORARY TABLE {{ns}}._assetq_batch (
        item_no          INT NOT NULL PRIMARY KEY,
        item_type        VARCHAR(32) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL,
        asset            VARCHAR(1024) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL,
        extra            LONGTEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL,
        source_dag_id    VARCHAR(1024) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL,
        source_task_id   VARCHAR(1024) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL,
        source_run_id    VARCHAR(1024) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL,
        source_map_index INT NULL,
        idempotency_key  VARCHAR(1024) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL,
        aliases          LONGTEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL,
        asset_id         BIGINT NULL,
        event_id         BIGINT NULL,
        event_timestamp  DATETIME(6) NULL,
        created          BOOLEAN NULL,
        KEY (asset(255))
    ) ENGINE = InnoDB;
    INSERT INTO {{ns}}._assetq_batch
           (item_no, item_type, asset, extra, source_dag_id, source_task_id, source_run_id,
            source_map_index, idempotency_key, aliases)
    SELECT j.item_no, JSON_TYPE(j.item), j.asset,
           CASE WHEN j.extra IS NULL OR JSON_TYPE(j.extra) = 'NULL' THEN '{}' ELSE j.extra END,
           j.source_dag_id, j.source_task_id, j.source_run_id,
           COALESCE(j.source_map_index, -1), j.idempotency_key,
           CASE WHEN j.aliases IS NULL OR JSON_TYPE(j.aliases) = 'NULL' THEN NULL ELSE j.aliases END
      FROM JSON_TABLE(p_events, '$[*]' COLUMNS (
               item_no          FOR ORDINALITY,
               item             JSON PATH '$',
               asset            VARCHAR(1024) PATH '$.asset',
               extra            JSON PATH '$.extra',
               source_dag_id    VARCHAR(1024) PATH '$.source_dag_id',
               source_task_id   VARCHAR(1024) PATH '$.source_task_id',
               source_run_id    VARCHAR(1024) PATH '$.source_run_id',
               source_map_index INT PATH '$.source_map_index',
               idempotency_key  VARCHAR(1024) PATH '$.idempotency_key',
               aliases          JSON PATH '$.aliases')) AS j;

    SET v_bad = NULL;
    SELECT b.item_no, b.item_type INTO v_bad, v_kind
      FROM {{ns}}._assetq_batch b WHERE b.item_type <> 'OBJECT' ORDER BY b.item_no LIMIT 1;
    IF v_bad IS NOT NULL THEN
        SET v_message = CONCAT('[AQ002] event ', v_bad, ' of the batch must be a JSON object, got ', v_kind);
        SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = v_message;
    END IF;
    SELECT b.item_no, JSON_TYPE(b.extra) INTO v_bad, v_kind
      FROM {{ns}}._assetq_batch b WHERE JSON_TYPE(b.extra) <> 'OBJECT' ORDER BY b.item_no LIMIT 1;
    IF v_bad IS NOT NULL THEN
        SET v_message = CONCAT('[AQ002] event extra must be a JSON object, got ', v_kind,
                               ' (event ', v_bad, ' of the batch)');
        SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = v_message;
    END IF;

    -- Aliases: an array of 1 to 100 names of 1 to 512 characters. The names are read as JSON
    -- and measured unquoted, so a name too long is refused, never cut short. One scan tells
    -- whether any item has aliases; a batch without (the usual case) skips every alias step.
    SELECT COUNT(*) > 0 INTO v_aliases FROM {{ns}}._assetq_batch b WHERE b.aliases IS NOT NULL;
    IF v_aliases THEN
        SELECT b.item_no INTO v_bad
          FROM {{ns}}._assetq_batch b
         WHERE b.aliases IS NOT NULL
           AND (JSON_TYPE(b.aliases) <> 'ARRAY' OR JSON_LENGTH(b.aliases) NOT BETWEEN 1 AND 100)
         ORDER BY b.item_no LIMIT 1;
    END IF;
    IF v_aliases AND v_bad IS NULL THEN
        SELECT MIN(b.item_no) INTO v_bad
          FROM {{ns}}._assetq_batch b,
               JSON_TABLE(b.aliases, '$[*]' COLUMNS (alias JSON PATH '$')) AS x
         WHERE b.aliases IS NOT NULL
           AND (COALESCE(JSON_TYPE(x.alias), 'NULL') <> 'STRING'
                OR CHAR_LENGTH(JSON_UNQUOTE(x.alias)) NOT BETWEEN 1 AND 512);
    END IF;
    IF v_bad IS NOT NULL THEN
        SET v_message = LEFT(CONCAT('[AQ002] aliases must be a JSON array of 1 to 100 alias names of 1 to 512',
                                    ' characters (event ', v_bad, ' of the batch)'), 128);
        SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = v_message;
    END IF;

    -- Every asset first, each distinct one once (name, then uri), in item order, so the first
    -- unknown one in the batch is the one reported and nothing has been inserted yet. Plain
    -- reads, as in register_event: an UPDATE ... JOIN or INSERT ... SELECT reading asset would
    -- take shared next-key locks there at REPEATABLE READ, and a lookup that misses (a uri) would
    -- leave a gap lock that blocks declaring new assets until the caller commits.
    resolve_loop: LOOP
        SET v_name = NULL, v_bad = NULL;
        SELECT b.item_no, b.asset INTO v_bad, v_name
          FROM {{ns}}._assetq_batch b
         WHERE b.item_no > v_item_no AND b.asset_id IS NULL
         ORDER BY b.item_no LIMIT 1;
        IF v_bad IS NULL THEN
            LEAVE resolve_loop;
        END IF;
        SET v_item_no = v_bad, v_asset_id = NULL;
        SELECT a.id INTO v_asset_id FROM {{ns}}.asset a WHERE a.name = v_name;
        IF v_asset_id IS NULL THEN
            SELECT a.id INTO v_asset_id FROM {{ns}}.asset a WHERE a.uri = v_name;
        END IF;
        IF v_asset_id IS NULL THEN
            SET v_message = LEFT(CONCAT('[AQ001] unknown asset ', COALESCE(QUOTE(LEFT(v_name, 48)), 'NULL'),
                                        ' (event ', v_item_no, ' of the batch): declare it first'), 128);
            SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = v_message;
        END IF;
        UPDATE {{ns}}._assetq_batch SET asset_id = v_asset_id WHERE asset = v_name;
    END LOOP;

    -- Aliases, created if new and resolved to their item's asset before the events are
    -- inserted, so that the fan-out sees the resolution. Sorted, so concurrent batches lock in
    -- one order. Plain reads first: a resolution that exists already (the usual case) costs
    -- a lookup and takes no lock; only a missing one is inserted (a duplicate key, from a
    -- concurrent producer, is ignored by its handler, not by INSERT IGNORE, which would hide a
    -- foreign-key failure too).
    -- MySQL 8 / MariaDB: MySQL cannot open one temporary table twice in a statement, hence one
    -- temporary table per step.
    IF v_aliases THEN
        CREATE TEMPORARY TABLE {{ns}}._assetq_batch_alias (
            item_no INT NOT NULL,
            name    VARCHAR(512) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
            PRIMARY KEY (item_no, name)
        ) ENGINE = InnoDB;
        CREATE TEMPORARY TABLE {{ns}}._assetq_alias_name (
            pos      BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY,
            name     VARCHAR(512) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
            alias_id BIGINT NULL,
            UNIQUE KEY (name)
        ) ENGINE = InnoDB;
        CREATE TEMPORARY TABLE {{ns}}._assetq_alias_pair (
            pos      BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY,
            alias_id BIGINT NOT NULL,
            asset_id BIGINT NOT NULL,
            UNIQUE KEY (alias_id, asset_id)
        ) ENGINE = InnoDB;
        INSERT INTO {{ns}}._assetq_batch_alias (item_no, name)
        SELECT DISTINCT b.item_no, JSON_UNQUOTE(x.alias)
          FROM {{ns}}._assetq_batch b,
               JSON_TABLE(b.aliases, '$[*]' COLUMNS (alias JSON PATH '$')) AS x
         WHERE b.aliases IS NOT NULL;
        INSERT INTO {{ns}}._assetq_alias_name (name)
        SELECT DISTINCT ba.name FROM {{ns}}._assetq_batch_alias ba ORDER BY ba.name;

        alias_loop: LOOP
            SET v_name = NULL;
            SELECT n.pos, n.name INTO v_pos, v_name
              FROM {{ns}}._assetq_alias_name n WHERE n.pos > v_pos ORDER BY n.pos LIMIT 1;
            IF v_name IS NULL THEN
                LEAVE alias_loop;
            END IF;
            SET v_alias_id = NULL;
            SELECT al.id INTO v_alias_id FROM {{ns}}.asset_alias al WHERE al.name = v_name;
            IF v_alias_id IS NULL THEN
                -- Created meanwhile by a concurrent producer: the duplicate key hands back its id.
                INSERT INTO {{ns}}.asset_alias (name) VALUES (v_name)
                ON DUPLICATE KEY UPDATE id = LAST_INSERT_ID(id);
                SET v_alias_id = LAST_INSERT_ID();
            END IF;
            UPDATE {{ns}}._assetq_alias_name SET alias_id = v_alias_id WHERE pos = v_pos;
        END LOOP;

        INSERT INTO {{ns}}._assetq_alias_pair (alias_id, asset_id)
        SELECT DISTINCT n.alias_id, b.asset_id
          FROM {{ns}}._assetq_batch_alias ba
          JOIN {{ns}}._assetq_alias_name n ON n.name = ba.name
          JOIN {{ns}}._assetq_batch b ON b.item_no = ba.item_no
         ORDER BY n.alias_id, b.asset_id;
        SET v_pos = 0;
        pair_loop: LOOP
            SET v_alias_id = NULL;
            SELECT p.pos, p.alias_id, p.asset_id INTO v_pos, v_alias_id, v_asset_id
              FROM {{ns}}._assetq_alias_pair p WHERE p.pos > v_pos ORDER BY p.pos LIMIT 1;
            IF v_alias_id IS NULL THEN
                LEAVE pair_loop;
            END IF;
            -- A SELECT ... INTO, not IF EXISTS (SELECT ...): InnoDB reads a subquery in a
            -- routine's IF condition with shared locks, at any isolation level, and that lock
            -- would deadlock with delete_asset.
            SELECT COUNT(*) INTO v_bad
              FROM {{ns}}.asset_alias_asset aa
             WHERE aa.alias_id = v_alias_id AND aa.asset_id = v_asset_id;
            IF v_bad = 0 THEN
                -- The asset row first, with the shared lock the foreign-key check of the insert
                -- takes anyway: InnoDB checks it only after writing the new row, and
                -- delete_asset, which locks the asset and then deletes its resolutions, would
                -- deadlock with a producer holding the new row. An asset deleted since it was
                -- looked up is unknown.
                SET v_bad = NULL;
                SELECT 1 INTO v_bad FROM {{ns}}.asset a WHERE a.id = v_asset_id LOCK IN SHARE MODE;
                IF v_bad IS NULL THEN
                    SET v_message = '[AQ001] unknown asset: it was deleted while the event was being registered';
                    SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = v_message;
                END IF;
                BEGIN
                    DECLARE CONTINUE HANDLER FOR 1062 BEGIN END;
                    INSERT INTO {{ns}}.asset_alias_asset (alias_id, asset_id, created_at)
                    VALUES (v_alias_id, v_asset_id, UTC_TIMESTAMP(6));
                END;
            END IF;
        END LOOP;
    END IF;

    -- One timestamp for the whole batch: taken once, copied to every queue row by the trigger.
    SET v_timestamp = UTC_TIMESTAMP(6), v_duplicate = FALSE;

    -- The fast path: one multi-row INSERT ... SELECT. MySQL 8 has no RETURNING, so the items' ids
    -- come from LAST_INSERT_ID() (the first id of the statement) and the item order, which is
    -- exact only where InnoDB documents the ids of one INSERT ... SELECT as consecutive: at
    -- innodb_autoinc_lock_mode 0 or 1 (MariaDB's default) the statement holds the table's AUTO-INC
    -- lock to its end (other inserts of events wait for the statement, its per-row triggers
    -- included, but not for the transaction). A duplicate idempotency key (a retry, or two items
    -- sharing a key) fails the statement with 1062; InnoDB rolls the statement back, its trigger
    -- rows included, and the batch goes the slow path. The 1062 check waits for a concurrent
    -- registration with the same key to commit or roll back, like PostgreSQL's ON CONFLICT.
    IF @@GLOBAL.innodb_autoinc_lock_mode <= 1 THEN
        BEGIN
            DECLARE CONTINUE HANDLER FOR 1062 SET v_duplicate = TRUE;
            INSERT INTO {{ns}}.asset_event
                   (asset_id, extra, source_dag_id, source_task_id, source_run_id,
                    source_map_index, idempotency_key, `timestamp`)
            SELECT b.asset_id, b.extra, b.source_dag_id, b.source_task_id, b.source_run_id,
                   b.source_map_index, b.idempotency_key, v_timestamp
              FROM {{ns}}._assetq_batch b
             ORDER BY b.item_no;
        END;
        -- LAST_INSERT_ID() is the id of the statement's first row; item n has that + n - 1.
        SET v_first_id = IF(v_duplicate, NULL, LAST_INSERT_ID());
    ELSE
        -- MySQL 8's default, interleaved: the ids of one statement may have gaps.
        SET v_duplicate = TRUE;
    END IF;

    -- The slow path: one INSERT per event, exactly as register_event (see there), with its
    -- duplicate handling; the row-level trigger fans out per row either way.
    SET v_item_no = 0;
    WHILE v_duplicate AND v_item_no < v_count DO
        SET v_item_no = v_item_no + 1;
        SELECT b.asset_id, b.extra, b.source_dag_id, b.source_task_id, b.source_run_id,
               b.source_map_index, b.idempotency_key
          INTO v_asset_id, v_extra, v_dag_id, v_task_id, v_run_id, v_map_index, v_key
          FROM {{ns}}._assetq_batch b WHERE b.item_no = v_item_no;
        SET v_old_extra = NULL;
        BEGIN
            DECLARE CONTINUE HANDLER FOR 1062
                SELECT e.id, e.`timestamp`, e.extra INTO v_event_id, v_old_timestamp, v_old_extra
                  FROM {{ns}}.asset_event e
                 WHERE e.asset_id = v_asset_id AND e.idempotency_key = v_key
                  LOCK IN SHARE MODE;
            INSERT INTO {{ns}}.asset_event
                   (asset_id, extra, source_dag_id, source_task_id, source_run_id,
                    source_map_index, idempotency_key, `timestamp`)
            VALUES (v_asset_id, v_extra, v_dag_id, v_task_id, v_run_id, v_map_index, v_key,
                    v_timestamp);
        END;
        IF v_old_extra IS NULL THEN
            UPDATE {{ns}}._assetq_batch
               SET event_id = LAST_INSERT_ID(), event_timestamp = v_timestamp, created = TRUE
             WHERE item_no = v_item_no;
        ELSEIF JSON_EXTRACT(v_old_extra, '$') <=> JSON_EXTRACT(v_extra, '$') THEN
            UPDATE {{ns}}._assetq_batch
               SET event_id = v_event_id, event_timestamp = v_old_timestamp, created = FALSE
             WHERE item_no = v_item_no;
        ELSE
            SET v_message = LEFT(CONCAT('[AQ005] idempotency key ', QUOTE(LEFT(v_key, 24)),
                                        ' was already used for event ', v_event_id,
                                        ' with a different extra (event ', v_item_no,
                                        ' of the batch)'), 128);
            SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = v_message;
        END IF;
    END WHILE;

    -- The aliases of the events this call created (not of an event a retry met).
    IF v_aliases THEN
        IF v_first_id IS NOT NULL THEN
            UPDATE {{ns}}._assetq_batch
               SET event_id = v_first_id + item_no - 1, created = TRUE
             WHERE aliases IS NOT NULL;
        END IF;
        INSERT INTO {{ns}}.asset_event_alias (asset_event_id, alias_id)
        SELECT DISTINCT b.event_id, n.alias_id
          FROM {{ns}}._assetq_batch b
          JOIN {{ns}}._assetq_batch_alias ba ON ba.item_no = b.item_no
          JOIN {{ns}}._assetq_alias_name n ON n.name = ba.name
         WHERE b.created
         ORDER BY b.event_id, n.alias_id;
    END IF;

    IF v_first_id IS NULL THEN
        SELECT b.item_no, b.event_id, b.asset_id, b.event_timestamp, b.created
          FROM {{ns}}._assetq_batch b
         ORDER BY b.item_no;
    ELSE
        SELECT b.item_no, v_first_id + b.item_no - 1 AS event_id, b.asset_id,
               v_timestamp AS event_timestamp, TRUE AS created
          FROM {{ns}}._assetq_batch b
         ORDER BY b.item_no;
    END IF;
    DROP TEMPORARY TABLE IF EXISTS {{ns}}._assetq_batch, {{ns}}._assetq_batch_alias,
                                   {{ns}}._assetq_alias_name, {{ns}}._assetq_alias_pair;
END $$


-- Declares an asset (idempotent) and returns its id as one result set (asset_id). An existing
-- asset keeps its id; a given uri or extra replaces the stored one, and it counts as declared.
-- When no asset has the name yet but a consumer referenced the uri before anyone declared it
-- (an undeclared asset with that uri, or named by it without a uri), that asset takes the
-- name: it keeps its id, so the consumers that referenced it get its events. A uri that
-- belongs to another asset is refused (AQ002), nothing written.
DROP PROCEDURE IF EXISTS {{ns}}.declare_asset $$
CREATE PROCEDURE {{ns}}.declare_asset(
    IN p_name  TEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin,
    IN p_uri   TEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin,
    IN p_extra JSON
)
MODIFIES SQL DATA
BEGIN
    DECLARE v_id       BIGINT;
    DECLARE v_uri_id   BIGINT;
    DECLARE v_uri_name VARCHAR(512) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin;
    DECLARE v_declared BOOLEAN;
    DECLARE v_kind     VARCHAR(32) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin;
    DECLARE v_message  VARCHAR(128) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin;

    SET v_kind = CASE WHEN p_extra IS NULL THEN 'OBJECT'
                      WHEN JSON_VALID(p_extra) THEN JSON_TYPE(p_extra)
                      ELSE 'invalid JSON' END;
    IF v_kind <> 'OBJECT' THEN
        SET v_message = CONCAT('[AQ002] asset extra must be a JSON object, got ', v_kind);
        SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = v_message;
    END IF;
    IF p_uri IS NOT NULL THEN
        -- The asset that holds the uri, or an undeclared one named by it. Plain reads: a
        -- locking read that misses would leave a gap lock on the index, and two declarations
        -- of new assets would deadlock on it. The row found is then locked by key (a record
        -- lock) and read again: its latest version decides.
        SELECT a.id INTO v_uri_id FROM {{ns}}.asset a WHERE a.uri = p_uri;
        IF v_uri_id IS NULL THEN
            SELECT a.id INTO v_uri_id
              FROM {{ns}}.asset a
             WHERE a.name = p_uri AND a.uri IS NULL AND NOT a.declared AND a.name <> p_name;
        END IF;
        IF v_uri_id IS NOT NULL THEN
            SELECT a.name, a.declared INTO v_uri_name, v_declared
              FROM {{ns}}.asset a WHERE a.id = v_uri_id
               FOR UPDATE;
        END IF;
        IF v_uri_name <> p_name THEN
            SELECT a.id INTO v_id FROM {{ns}}.asset a WHERE a.name = p_name;
            IF v_declared OR v_id IS NOT NULL THEN
                SET v_message = LEFT(CONCAT('[AQ002] uri ', QUOTE(LEFT(p_uri, 48)),
                                            ' already belongs to asset ', QUOTE(LEFT(v_uri_name, 48))), 128);
                SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = v_message;
            END IF;
            -- The undeclared asset takes the name, keeping its id.
            UPDATE {{ns}}.asset
               SET name = p_name, uri = p_uri, extra = COALESCE(p_extra, extra), declared = TRUE
             WHERE id = v_uri_id;
            SET v_id = v_uri_id;
        END IF;
    END IF;
    IF v_id IS NULL THEN
        -- The uri stays out of this INSERT: ON DUPLICATE KEY UPDATE fires on a conflict with
        -- ANY unique key, so a uri that belongs to another asset would update that other
        -- asset. Here only the name can conflict; id = LAST_INSERT_ID(id) makes
        -- LAST_INSERT_ID() the existing row's id on a conflict (MySQL 8 / MariaDB: no
        -- RETURNING on MySQL).
        INSERT INTO {{ns}}.asset (name, extra, declared)
        VALUES (p_name, COALESCE(p_extra, JSON_OBJECT()), TRUE)
        ON DUPLICATE KEY UPDATE extra = COALESCE(p_extra, extra), declared = TRUE,
                                id = LAST_INSERT_ID(id);
        SET v_id = LAST_INSERT_ID();
        -- By key: the uri is free or already this asset's (checked above); one taken
        -- meanwhile fails with a duplicate-key error, never touching the other asset.
        IF p_uri IS NOT NULL THEN
            UPDATE {{ns}}.asset SET uri = p_uri WHERE id = v_id;
        END IF;
    END IF;
    SELECT v_id AS asset_id;
END $$


-- Declares or re-declares a consumer. p_condition is the condition as declared (kept for
-- reading back); p_clauses its conjunctive normal form, a JSON array of clauses, each a
-- non-empty array of members: "x" (an asset by name, else by uri), {"name": "x"},
-- {"uri": "x"} (by uri, else by name) or {"alias": "x"}. Assets and aliases named here that
-- do not exist are created (an asset referenced by uri gets the uri as its name too, as in
-- Airflow), marked undeclared. p_paused NULL keeps the current state (new consumers start
-- unpaused); p_max_active_runs and p_max_events_per_run NULL mean no cap (AQ002 below 1);
-- p_queue_while_paused NULL means false. Queued rows of assets the consumer no longer
-- depends on are deleted; the others stay and are consumed by its next run. Returns no
-- result set.
--
-- The whole replacement happens in the caller's transaction, under the consumer's lock row: a
-- scheduler pass sees the old condition or the new one, never a mix. The rows the fan-out
-- reads are changed in the order it reads them: references, then alias clauses, each in
-- key order, only those that change; the dag row last. A producer in flight for the consumer
-- then either finishes first or waits for the caller's commit, and neither deadlocks with the
-- declaration. (A producer transaction that registers events of several of the consumer's
-- assets can still deadlock with it, at REPEATABLE READ: error 1213, rolled back whole, safe
-- to retry.)
DROP PROCEDURE IF EXISTS {{ns}}.declare_dag $$
CREATE PROCEDURE {{ns}}.declare_dag(
    IN p_dag_id             TEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin,
    IN p_condition          JSON,
    IN p_clauses            JSON,
    IN p_paused             BOOLEAN,
    IN p_max_active_runs    INT,
    IN p_max_events_per_run INT,
    IN p_queue_while_paused BOOLEAN
)
MODIFIES SQL DATA
BEGIN
    DECLARE v_bad     BIGINT;
    DECLARE v_exists  BIGINT;
    DECLARE v_pos     BIGINT DEFAULT 0;
    DECLARE v_kind    VARCHAR(8) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin;
    DECLARE v_name    VARCHAR(512) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin;
    DECLARE v_id      BIGINT;
    DECLARE v_row     INT;
    DECLARE v_clause  INT;
    DECLARE v_new     BOOLEAN;
    DECLARE v_pos_kind   INT DEFAULT 0;
    DECLARE v_pos_key    BIGINT DEFAULT 0;
    DECLARE v_pos_clause INT DEFAULT 0;
    DECLARE v_message VARCHAR(128) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin;

    IF p_dag_id IS NULL OR NOT (p_dag_id REGEXP '^[A-Za-z0-9_.-]+$')
       OR CHAR_LENGTH(p_dag_id) > 250 THEN
        SET v_message = LEFT(CONCAT('[AQ002] invalid dag id ', COALESCE(QUOTE(LEFT(p_dag_id, 40)), 'NULL'),
                                    ': use 1 to 250 letters, digits, "_", "." or "-"'), 128);
        SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = v_message;
    END IF;
    IF p_max_active_runs < 1 OR p_max_events_per_run < 1 THEN
        SET v_message = LEFT(CONCAT('[AQ002] max_active_runs and max_events_per_run must be positive or NULL, got ',
                                    COALESCE(p_max_active_runs, 'NULL'), ' and ',
                                    COALESCE(p_max_events_per_run, 'NULL')), 128);
        SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = v_message;
    END IF;
    IF p_condition IS NULL OR JSON_VALID(p_condition) = 0 THEN
        SET v_message = LEFT(CONCAT('[AQ004] condition of dag ', p_dag_id,
                                    ' is missing or not JSON'), 128);
        SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = v_message;
    END IF;

    -- The members as (clause_no, kind, value): kind 'any' for a plain string, else the one key
    -- of the object. Values are read as JSON and measured unquoted, so one too long is
    -- refused, never cut short.
    DROP TEMPORARY TABLE IF EXISTS {{ns}}._assetq_declare_member, {{ns}}._assetq_declare_name;
    CREATE TEMPORARY TABLE {{ns}}._assetq_declare_member (
        clause_no INT NOT NULL,
        kind      VARCHAR(8) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL,
        value     VARCHAR(512) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL,
        KEY (kind, value)
    ) ENGINE = InnoDB;
    CREATE TEMPORARY TABLE {{ns}}._assetq_declare_name (
        pos       BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY,
        kind      VARCHAR(8) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
        value     VARCHAR(512) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
        target_id BIGINT NULL,
        UNIQUE KEY (kind, value)
    ) ENGINE = InnoDB;
    IF p_clauses IS NULL OR NOT JSON_VALID(p_clauses) THEN
        SET v_bad = 1;
    ELSEIF JSON_TYPE(p_clauses) <> 'ARRAY' OR JSON_LENGTH(p_clauses) = 0 THEN
        SET v_bad = 1;
    ELSE
        -- MySQL 8 / MariaDB: JSON_TABLE with NESTED PATH is in both (MySQL >= 8.0.4,
        -- MariaDB >= 10.6). A clause that is empty or not an array yields one row with NULL
        -- item: its member is invalid.
        INSERT INTO {{ns}}._assetq_declare_member (clause_no, kind, value)
        SELECT m.clause_no, m.kind,
               CASE WHEN CHAR_LENGTH(m.value) BETWEEN 1 AND 512 THEN m.value END
          FROM (SELECT c.clause_no,
                       CASE WHEN c.item IS NULL OR c.clause IS NULL
                                 OR JSON_TYPE(c.clause) <> 'ARRAY' THEN NULL
                            WHEN JSON_TYPE(c.item) = 'STRING' THEN 'any'
                            WHEN JSON_TYPE(c.item) <> 'OBJECT' OR JSON_LENGTH(c.item) <> 1 THEN NULL
                            WHEN JSON_TYPE(JSON_EXTRACT(c.item, '$.name')) = 'STRING' THEN 'name'
                            WHEN JSON_TYPE(JSON_EXTRACT(c.item, '$.uri')) = 'STRING' THEN 'uri'
                            WHEN JSON_TYPE(JSON_EXTRACT(c.item, '$.alias')) = 'STRING' THEN 'alias'
                       END AS kind,
                       CASE WHEN JSON_TYPE(c.item) = 'STRING' THEN JSON_UNQUOTE(c.item)
                            WHEN JSON_TYPE(c.item) = 'OBJECT' THEN
                                 COALESCE(JSON_UNQUOTE(JSON_EXTRACT(c.item, '$.name')),
                                          JSON_UNQUOTE(JSON_EXTRACT(c.item, '$.uri')),
                                          JSON_UNQUOTE(JSON_EXTRACT(c.item, '$.alias')))
                       END AS value
                  FROM JSON_TABLE(p_clauses, '$[*]' COLUMNS (
                           clause_no FOR ORDINALITY,
                           clause    JSON PATH '$',
                           NESTED PATH '$[*]' COLUMNS (item JSON PATH '$'))) AS c) m;
        SELECT COUNT(*) INTO v_bad
          FROM {{ns}}._assetq_declare_member m
         WHERE m.kind IS NULL OR m.value IS NULL;
    END IF;
    IF v_bad > 0 THEN
        SET v_message = LEFT(CONCAT('[AQ004] condition clauses of dag ', p_dag_id,
                                    ' must be non-empty arrays of asset names or uris,',
                                    ' {"name"}, {"uri"} or {"alias"} (1 to 512 characters)'), 128);
        SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = v_message;
    END IF;

    -- The consumer's lock row first, as a scheduler pass takes it: every later statement
    -- runs under it (a new consumer gets its row, already locked, from the trigger on dag).
    SELECT COUNT(*) INTO v_exists FROM {{ns}}.dag_lock l WHERE l.dag_id = p_dag_id FOR UPDATE;

    -- Resolve every distinct member, creating the missing assets (undeclared) and aliases,
    -- one at a time: plain reads and keyed inserts only. An INSERT ... SELECT from asset
    -- would, at REPEATABLE READ, take shared gap locks on asset's indexes and deadlock
    -- concurrent declarations. A concurrent declaration may create one after our read: the
    -- duplicate key then hands back its id.
    INSERT INTO {{ns}}._assetq_declare_name (kind, value)
    SELECT DISTINCT m.kind, m.value FROM {{ns}}._assetq_declare_member m ORDER BY m.kind, m.value;
    name_loop: LOOP
        SET v_name = NULL;
        SELECT n.pos, n.kind, n.value INTO v_pos, v_kind, v_name
          FROM {{ns}}._assetq_declare_name n WHERE n.pos > v_pos ORDER BY n.pos LIMIT 1;
        IF v_name IS NULL THEN
            LEAVE name_loop;
        END IF;
        SET v_id = NULL;
        IF v_kind = 'alias' THEN
            SELECT al.id INTO v_id FROM {{ns}}.asset_alias al WHERE al.name = v_name;
            IF v_id IS NULL THEN
                INSERT INTO {{ns}}.asset_alias (name) VALUES (v_name)
                ON DUPLICATE KEY UPDATE id = LAST_INSERT_ID(id);
                SET v_id = LAST_INSERT_ID();
            END IF;
        ELSE
            IF v_kind IN ('any', 'name') THEN
                SELECT a.id INTO v_id FROM {{ns}}.asset a WHERE a.name = v_name;
            END IF;
            IF v_id IS NULL AND v_kind IN ('any', 'uri') THEN
                SELECT a.id INTO v_id FROM {{ns}}.asset a WHERE a.uri = v_name;
            END IF;
            IF v_id IS NULL AND v_kind = 'uri' THEN
                SELECT a.id INTO v_id FROM {{ns}}.asset a WHERE a.name = v_name;
            END IF;
            IF v_id IS NULL THEN
                INSERT INTO {{ns}}.asset (name, uri, declared)
                VALUES (v_name, IF(v_kind = 'uri', v_name, NULL), FALSE)
                ON DUPLICATE KEY UPDATE id = LAST_INSERT_ID(id);
                SET v_id = LAST_INSERT_ID();
            END IF;
        END IF;
        UPDATE {{ns}}._assetq_declare_name SET target_id = v_id WHERE pos = v_pos;
    END LOOP;

    -- The rows the fan-out reads: the references (kind 1, by asset) and alias clauses (kind 2,
    -- by alias, clause), the current ones read with shared locks (they see the latest
    -- committed rows, and a producer's shared locks do not conflict with them), the new ones
    -- from the members. Only rows that change are touched.
    DROP TEMPORARY TABLE IF EXISTS {{ns}}._assetq_declare_row;
    CREATE TEMPORARY TABLE {{ns}}._assetq_declare_row (
        kind      TINYINT NOT NULL,
        key_id    BIGINT NOT NULL,
        clause_no INT NOT NULL,
        old_row   BOOLEAN NOT NULL DEFAULT FALSE,
        new_row   BOOLEAN NOT NULL DEFAULT FALSE,
        PRIMARY KEY (kind, key_id, clause_no)
    ) ENGINE = InnoDB;
    IF v_exists > 0 THEN
        -- By the dag_id index: on a small table the optimizer would rather scan the primary
        -- key, locking the references of every consumer.
        INSERT INTO {{ns}}._assetq_declare_row (kind, key_id, clause_no, old_row)
        SELECT 1, r.asset_id, 0, TRUE
          FROM {{ns}}.dag_schedule_asset_reference r
               FORCE INDEX (dag_schedule_asset_reference_dag_idx)
         WHERE r.dag_id = p_dag_id
          LOCK IN SHARE MODE;
        INSERT INTO {{ns}}._assetq_declare_row (kind, key_id, clause_no, old_row)
        SELECT 2, ca.alias_id, ca.clause_no, TRUE
          FROM {{ns}}.dag_condition_alias ca
         WHERE ca.dag_id = p_dag_id
          LOCK IN SHARE MODE;
    END IF;
    INSERT INTO {{ns}}._assetq_declare_row (kind, key_id, clause_no, new_row)
    SELECT DISTINCT IF(m.kind = 'alias', 2, 1), n.target_id, IF(m.kind = 'alias', m.clause_no, 0), TRUE
      FROM {{ns}}._assetq_declare_member m
      JOIN {{ns}}._assetq_declare_name n ON n.kind = m.kind AND n.value = m.value
    ON DUPLICATE KEY UPDATE new_row = TRUE;

    -- A new consumer's row first: the rows below refer to it. Nobody queues for it yet.
    IF v_exists = 0 THEN
        INSERT INTO {{ns}}.dag (dag_id, `condition`, is_paused, max_active_runs,
                                max_events_per_run, queue_while_paused)
        VALUES (p_dag_id, p_condition, COALESCE(p_paused, FALSE), p_max_active_runs,
                p_max_events_per_run, COALESCE(p_queue_while_paused, FALSE))
        ON DUPLICATE KEY UPDATE `condition` = p_condition,
                                is_paused = COALESCE(p_paused, is_paused),
                                max_active_runs = p_max_active_runs,
                                max_events_per_run = p_max_events_per_run,
                                queue_while_paused = COALESCE(p_queue_while_paused, FALSE),
                                updated_at = UTC_TIMESTAMP(6);
    END IF;

    -- One keyed statement per changed row, in the order a producer's fan-out reads them:
    -- references by asset, then alias clauses by alias. A producer waits at most at one of
    -- them, holding only locks that come before it, which this loop has passed already.
    SET v_pos = 0;
    row_loop: LOOP
        SET v_row = NULL;
        SELECT w.kind, w.key_id, w.clause_no, w.new_row INTO v_row, v_id, v_clause, v_new
          FROM {{ns}}._assetq_declare_row w
         WHERE w.old_row <> w.new_row
           AND (w.kind > v_pos_kind
                OR (w.kind = v_pos_kind AND w.key_id > v_pos_key)
                OR (w.kind = v_pos_kind AND w.key_id = v_pos_key AND w.clause_no > v_pos_clause))
         ORDER BY w.kind, w.key_id, w.clause_no
         LIMIT 1;
        IF v_row IS NULL THEN
            LEAVE row_loop;
        END IF;
        SET v_pos_kind = v_row, v_pos_key = v_id, v_pos_clause = v_clause;
        IF v_row = 1 AND v_new THEN
            INSERT INTO {{ns}}.dag_schedule_asset_reference (asset_id, dag_id) VALUES (v_id, p_dag_id);
        ELSEIF v_row = 1 THEN
            DELETE FROM {{ns}}.dag_schedule_asset_reference WHERE asset_id = v_id AND dag_id = p_dag_id;
        ELSEIF v_new THEN
            INSERT INTO {{ns}}.dag_condition_alias (dag_id, clause_no, alias_id)
            VALUES (p_dag_id, v_clause, v_id);
        ELSE
            DELETE FROM {{ns}}.dag_condition_alias
             WHERE dag_id = p_dag_id AND clause_no = v_clause AND alias_id = v_id;
        END IF;
    END LOOP;

    -- An existing consumer's row last: it waits for the producers in flight for it, which
    -- by now wait for nothing this declaration holds.
    IF v_exists > 0 THEN
        UPDATE {{ns}}.dag
           SET `condition` = p_condition,
               is_paused = COALESCE(p_paused, is_paused),
               max_active_runs = p_max_active_runs,
               max_events_per_run = p_max_events_per_run,
               queue_while_paused = COALESCE(p_queue_while_paused, FALSE),
               updated_at = UTC_TIMESTAMP(6)
         WHERE dag_id = p_dag_id;
        DELETE FROM {{ns}}.dag_condition_clause WHERE dag_id = p_dag_id;
    END IF;
    INSERT INTO {{ns}}.dag_condition_clause (dag_id, clause_no, asset_id)
    SELECT DISTINCT p_dag_id, m.clause_no, n.target_id
      FROM {{ns}}._assetq_declare_member m
      JOIN {{ns}}._assetq_declare_name n ON n.kind = m.kind AND n.value = m.value
     WHERE m.kind <> 'alias';
    DROP TEMPORARY TABLE IF EXISTS {{ns}}._assetq_declare_member, {{ns}}._assetq_declare_name,
                                   {{ns}}._assetq_declare_row;

    -- Rows queued for assets the consumer no longer depends on (neither a member nor resolved
    -- by one of its aliases) would never count towards its condition: they go. The alias test
    -- is a point lookup per row, so it waits only on a resolution of that very asset. A
    -- producer of a dropped asset has finished (the loop waited for it) or will not queue.
    IF v_exists > 0 THEN
        DELETE FROM {{ns}}.asset_dag_run_queue
         WHERE target_dag_id = p_dag_id
           AND asset_id NOT IN (SELECT r.asset_id FROM {{ns}}.dag_condition_clause r
                                 WHERE r.dag_id = p_dag_id)
           AND NOT EXISTS (SELECT 1
                             FROM {{ns}}.dag_condition_alias ca
                             JOIN {{ns}}.asset_alias_asset aa
                               ON aa.alias_id = ca.alias_id
                              AND aa.asset_id = {{ns}}.asset_dag_run_queue.asset_id
                            WHERE ca.dag_id = p_dag_id);
    END IF;
END $$


-- One scheduler pass (I3-I6). Takes at most p_limit unpaused consumers with queued rows,
-- least recently examined first, each by its lock row FOR UPDATE SKIP LOCKED, and for each:
-- skips it while it has max_active_runs active runs (queued or running: its queue is left
-- whole); claims its committed queue rows (all of them, or with max_events_per_run the
-- oldest that satisfy the condition, see below), evaluates the condition on exactly those
-- rows, and when it holds creates one run, links exactly the claimed events and deletes
-- exactly the claimed rows by key. Returns one result set, one row per run created
-- (dag_run_id, dag_id, run_id, seq, run_after, created_at, event_ids as a JSON array,
-- triggering_event_id: the newest claimed row, state).
--
-- A clause holds when a claimed row's asset is one of its asset members or has been resolved
-- by one of its alias members; an alias that has resolved to nothing yet satisfies nothing,
-- and its clause still counts.
--
-- max_events_per_run = N with more than N rows queued: if the whole queue does not satisfy
-- the condition, no run. Otherwise the claim is built so the consumer is never starved: for
-- each clause in order not yet hit, the queued member asset whose oldest row is oldest
-- (greedy); then each chosen asset, newest choice first, is dropped if the others still hit
-- every clause; the claim is the oldest row of each chosen asset plus the oldest other rows,
-- N in all (more only if the chosen assets alone are more than N). When the oldest N rows
-- satisfy the condition, that is exactly them.
--
-- Run it at READ COMMITTED, in a transaction of its own (assetq.schedule does). At READ
-- COMMITTED every plain read below takes a fresh snapshot, after the lock, and locks nothing.
-- At REPEATABLE READ the snapshot can be older than the lock: a pass would claim rows another
-- pass consumed meanwhile (measured: 2,804 duplicate links in 5,000 events). The check after
-- the lock refuses such a pass with AQ900 instead; its INSERT ... SELECT reads would also
-- take shared gap locks that hold producers back. AQ900 (claim guard) means the pass was
-- rolled back and is safe to retry.
DROP PROCEDURE IF EXISTS {{ns}}.schedule_pass $$
CREATE PROCEDURE {{ns}}.schedule_pass(IN p_limit INT)
MODIFIES SQL DATA
BEGIN
    DECLARE v_pos        BIGINT DEFAULT 0;
    DECLARE v_taken      INT DEFAULT 0;
    DECLARE v_dag_id     VARCHAR(250) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin;
    DECLARE v_locked_seq BIGINT;
    DECLARE v_seen_seq   BIGINT;
    DECLARE v_paused     BOOLEAN;
    DECLARE v_max_active BIGINT;
    DECLARE v_max_events BIGINT;
    DECLARE v_aliased    BOOLEAN;
    DECLARE v_members    BOOLEAN;
    DECLARE v_temps      BOOLEAN DEFAULT FALSE;
    DECLARE v_active     BIGINT;
    DECLARE v_queued     BIGINT;
    DECLARE v_take       BIGINT;
    DECLARE v_clause     INT;
    DECLARE v_next       INT;
    DECLARE v_hit        BIGINT;
    DECLARE v_pick       BIGINT;
    DECLARE v_pick_no    BIGINT;
    DECLARE v_claimed    BIGINT;
    DECLARE v_deleted    BIGINT;
    DECLARE v_run_after  DATETIME(6);
    DECLARE v_oldest     DATETIME(6);
    DECLARE v_newest_id  BIGINT;
    DECLARE v_trigger    BIGINT;
    DECLARE v_clauses    BIGINT;
    DECLARE v_met        BIGINT;
    DECLARE v_now        DATETIME(6);
    DECLARE v_run_pk     BIGINT;
    DECLARE v_run_id     VARCHAR(250) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin;
    DECLARE v_event_ids  LONGTEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin;
    DECLARE v_message    VARCHAR(128) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin;
    DECLARE v_saved_gcl  BIGINT UNSIGNED DEFAULT @@SESSION.group_concat_max_len;

    IF p_limit IS NULL OR p_limit < 1 THEN
        SET v_message = CONCAT('[AQ002] limit must be a positive integer, got ',
                               COALESCE(p_limit, 'NULL'));
        SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = v_message;
    END IF;

    -- Session temporary tables: the claimed ids are held in a table, never in a
    -- GROUP_CONCAT / JSON_ARRAYAGG string, which is silently cut at group_concat_max_len.
    -- Temporary tables do not end the caller's transaction. InnoDB, not MEMORY: a consumer
    -- with a huge backlog must not hit max_heap_table_size. Tables left by a failed pass on
    -- this connection are dropped here. Created only once a consumer with alias members or
    -- max_events_per_run needs them (a pass over consumers with neither creates none):
    --   _assetq_member  the consumer's clause members (clause_no, asset_id); an alias member
    --                   that has resolved to nothing gives asset_id NULL, so its clause counts
    --   _assetq_queue   with max_events_per_run: the consumer's queue, each row ranked among
    --                   its asset's rows (1: the oldest), witness rows marked
    --   _assetq_chosen  with max_events_per_run: the witness assets, in the order chosen
    -- MySQL 8 / MariaDB: MySQL cannot open one temporary table twice in a statement, so no
    -- statement below names the same temporary table twice.
    DROP TEMPORARY TABLE IF EXISTS {{ns}}._assetq_candidate, {{ns}}._assetq_claim, {{ns}}._assetq_run,
                                   {{ns}}._assetq_member, {{ns}}._assetq_queue, {{ns}}._assetq_chosen;
    CREATE TEMPORARY TABLE {{ns}}._assetq_candidate (
        pos    BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY,
        dag_id VARCHAR(250) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL
    ) ENGINE = InnoDB;
    CREATE TEMPORARY TABLE {{ns}}._assetq_claim (
        asset_event_id BIGINT NOT NULL PRIMARY KEY,
        asset_id       BIGINT NOT NULL,
        created_at     DATETIME(6) NOT NULL
    ) ENGINE = InnoDB;
    CREATE TEMPORARY TABLE {{ns}}._assetq_run (
        dag_run_id          BIGINT NOT NULL PRIMARY KEY,
        dag_id              VARCHAR(250) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
        run_id              VARCHAR(250) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
        seq                 BIGINT NOT NULL,
        run_after           DATETIME(6) NOT NULL,
        created_at          DATETIME(6) NOT NULL,
        event_ids           LONGTEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
        triggering_event_id BIGINT NOT NULL,
        state               VARCHAR(20) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL
    ) ENGINE = InnoDB;

    -- Candidates: unpaused consumers with queued rows, least recently examined first (NULL
    -- sorts first in MySQL's ascending order). A plain read that locks nothing; each
    -- candidate is locked on its own below. One locking statement with ORDER BY ... LIMIT
    -- could lock every candidate before sorting and keep the ones past the limit locked.
    -- MySQL 8 / MariaDB: MariaDB has no FOR UPDATE OF <table>, so a locking join would
    -- lock the dag rows too; the lock statement below reads dag_lock alone.
    INSERT INTO {{ns}}._assetq_candidate (dag_id)
    SELECT l.dag_id
      FROM {{ns}}.dag_lock l
      JOIN {{ns}}.dag d ON d.dag_id = l.dag_id
     WHERE NOT d.is_paused
       AND EXISTS (SELECT 1 FROM {{ns}}.asset_dag_run_queue q WHERE q.target_dag_id = l.dag_id)
     ORDER BY l.last_scheduled_at, l.dag_id;

    candidate_loop: WHILE v_taken < p_limit DO
        SET v_dag_id = NULL;
        SELECT c.pos, c.dag_id INTO v_pos, v_dag_id
          FROM {{ns}}._assetq_candidate c WHERE c.pos > v_pos ORDER BY c.pos LIMIT 1;
        IF v_dag_id IS NULL THEN
            LEAVE candidate_loop;
        END IF;

        -- The consumer's lock row; SKIP LOCKED: concurrent passes split the consumers
        -- between them instead of waiting (I5). The dag row is never locked (see dag_lock).
        SET v_locked_seq = NULL;
        SELECT l.last_run_seq INTO v_locked_seq
          FROM {{ns}}.dag_lock l WHERE l.dag_id = v_dag_id
           FOR UPDATE SKIP LOCKED;
        IF v_locked_seq IS NULL THEN
            ITERATE candidate_loop;
        END IF;
        SET v_taken = v_taken + 1;

        -- Our snapshot must not predate the last run created for this consumer: a pass that
        -- commits a run bumps last_run_seq with the deletion of the rows it consumed. A plain
        -- read here (a fresh snapshot at READ COMMITTED) sees the locked value; at REPEATABLE
        -- READ it may see an older one, and the claim would hold rows already consumed.
        SELECT l.last_run_seq INTO v_seen_seq FROM {{ns}}.dag_lock l WHERE l.dag_id = v_dag_id;
        IF v_seen_seq <> v_locked_seq THEN
            SET v_message = LEFT(CONCAT('[AQ900] claim guard: snapshot of dag ', v_dag_id,
                                        ' predates its lock; run the pass at READ COMMITTED'), 128);
            SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = v_message;
        END IF;

        -- A consumer deleted since the candidate read has no lock row: skipped above. Whether
        -- it has alias members comes with its row (a plain read: its condition changes only
        -- under the lock this pass holds).
        SELECT d.is_paused, d.max_active_runs, d.max_events_per_run,
               EXISTS (SELECT 1 FROM {{ns}}.dag_condition_alias ca WHERE ca.dag_id = d.dag_id)
          INTO v_paused, v_max_active, v_max_events, v_aliased
          FROM {{ns}}.dag d WHERE d.dag_id = v_dag_id;
        IF v_paused THEN
            -- Paused since the candidate read: like a consumer another pass holds.
            SET v_taken = v_taken - 1;
            ITERATE candidate_loop;
        END IF;
        SET v_now = UTC_TIMESTAMP(6);

        -- At its cap: no run, the queue stays whole. Runs become active only in a pass holding
        -- this lock, so the count can only be too high (a run finishing meanwhile), never too
        -- low: the next pass sees it.
        IF v_max_active IS NOT NULL THEN
            SELECT COUNT(*) INTO v_active
              FROM {{ns}}.dag_run r
             WHERE r.dag_id = v_dag_id AND r.state IN ('queued', 'running');
            IF v_active >= v_max_active THEN
                UPDATE {{ns}}.dag_lock SET last_scheduled_at = v_now WHERE dag_id = v_dag_id;
                ITERATE candidate_loop;
            END IF;
        END IF;

        -- The condition's members, read once for this consumer into _assetq_member when it
        -- has alias members or max_events_per_run. Otherwise (the usual case) its clauses are
        -- its asset members alone, counted and matched in dag_condition_clause directly.
        SET v_members = v_aliased OR v_max_events IS NOT NULL;
        IF v_members THEN
            IF NOT v_temps THEN
                CREATE TEMPORARY TABLE {{ns}}._assetq_member (
                    clause_no INT NOT NULL,
                    asset_id  BIGINT NULL,
                    KEY (asset_id),
                    KEY (clause_no)
                ) ENGINE = InnoDB;
                CREATE TEMPORARY TABLE {{ns}}._assetq_queue (
                    asset_event_id BIGINT NOT NULL PRIMARY KEY,
                    asset_id       BIGINT NOT NULL,
                    created_at     DATETIME(6) NOT NULL,
                    asset_rank     BIGINT NOT NULL,
                    witness        BOOLEAN NOT NULL DEFAULT FALSE,
                    KEY (asset_id)
                ) ENGINE = InnoDB;
                CREATE TEMPORARY TABLE {{ns}}._assetq_chosen (
                    pick_no  BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY,
                    asset_id BIGINT NOT NULL,
                    UNIQUE KEY (asset_id)
                ) ENGINE = InnoDB;
                SET v_temps = TRUE;
            END IF;
            DELETE FROM {{ns}}._assetq_member;
            INSERT INTO {{ns}}._assetq_member (clause_no, asset_id)
            SELECT c.clause_no, c.asset_id
              FROM {{ns}}.dag_condition_clause c
             WHERE c.dag_id = v_dag_id
            UNION ALL
            SELECT ca.clause_no, aa.asset_id
              FROM {{ns}}.dag_condition_alias ca
              LEFT JOIN {{ns}}.asset_alias_asset aa ON aa.alias_id = ca.alias_id
             WHERE ca.dag_id = v_dag_id;
            SELECT COUNT(DISTINCT m.clause_no) INTO v_clauses FROM {{ns}}._assetq_member m;
        ELSE
            SELECT COUNT(DISTINCT c.clause_no) INTO v_clauses
              FROM {{ns}}.dag_condition_clause c WHERE c.dag_id = v_dag_id;
        END IF;

        -- The claim: a plain read of the consumer's committed queue rows, taken after the
        -- lock, so it sees every row committed so far, including the deletions of a pass that
        -- held this consumer a moment ago. A row committed after this read is not in the
        -- claim and waits for the next pass: selection is by reference, never by time (I3).
        -- An uncommitted producer row is neither read nor waited for.
        DELETE FROM {{ns}}._assetq_claim;
        IF v_max_events IS NULL THEN
            INSERT INTO {{ns}}._assetq_claim (asset_event_id, asset_id, created_at)
            SELECT q.asset_event_id, q.asset_id, q.created_at
              FROM {{ns}}.asset_dag_run_queue q
             WHERE q.target_dag_id = v_dag_id;
        ELSE
            -- The same read, in queue order (created_at, asset_event_id), each row ranked
            -- among its asset's rows. The selection below works on this copy only.
            DELETE FROM {{ns}}._assetq_queue;
            DELETE FROM {{ns}}._assetq_chosen;
            INSERT INTO {{ns}}._assetq_queue (asset_event_id, asset_id, created_at, asset_rank)
            SELECT q.asset_event_id, q.asset_id, q.created_at,
                   ROW_NUMBER() OVER (PARTITION BY q.asset_id
                                      ORDER BY q.created_at, q.asset_event_id)
              FROM {{ns}}.asset_dag_run_queue q
             WHERE q.target_dag_id = v_dag_id;
            SELECT COUNT(*) INTO v_queued FROM {{ns}}._assetq_queue;
            SET v_met = 0;
            IF v_queued > v_max_events THEN
                SELECT COUNT(DISTINCT m.clause_no) INTO v_met
                  FROM {{ns}}._assetq_member m
                 WHERE m.asset_id IN (SELECT q.asset_id FROM {{ns}}._assetq_queue q);
            END IF;
            IF v_queued <= v_max_events THEN
                INSERT INTO {{ns}}._assetq_claim (asset_event_id, asset_id, created_at)
                SELECT q.asset_event_id, q.asset_id, q.created_at FROM {{ns}}._assetq_queue q;
            ELSEIF v_clauses > 0 AND v_met = v_clauses THEN
                -- Greedy witnesses, clause by clause.
                SET v_clause = 0;
                clause_loop: LOOP
                    SET v_next = NULL;
                    SELECT MIN(m.clause_no) INTO v_next
                      FROM {{ns}}._assetq_member m WHERE m.clause_no > v_clause;
                    IF v_next IS NULL THEN
                        LEAVE clause_loop;
                    END IF;
                    SET v_clause = v_next;
                    SELECT COUNT(*) INTO v_hit
                      FROM {{ns}}._assetq_chosen c
                      JOIN {{ns}}._assetq_member m ON m.asset_id = c.asset_id
                     WHERE m.clause_no = v_clause;
                    IF v_hit = 0 THEN
                        SET v_pick = NULL;
                        SELECT q.asset_id INTO v_pick
                          FROM {{ns}}._assetq_queue q
                          JOIN {{ns}}._assetq_member m ON m.asset_id = q.asset_id
                         WHERE m.clause_no = v_clause AND q.asset_rank = 1
                         ORDER BY q.created_at, q.asset_event_id
                         LIMIT 1;
                        INSERT INTO {{ns}}._assetq_chosen (asset_id) VALUES (v_pick);
                    END IF;
                END LOOP;
                -- Prune, newest choice first: what is left is a minimal set of assets.
                SELECT MAX(c.pick_no) + 1 INTO v_pick_no FROM {{ns}}._assetq_chosen c;
                prune_loop: LOOP
                    SET v_pick = NULL;
                    SELECT c.pick_no, c.asset_id INTO v_pick_no, v_pick
                      FROM {{ns}}._assetq_chosen c
                     WHERE c.pick_no < v_pick_no
                     ORDER BY c.pick_no DESC
                     LIMIT 1;
                    IF v_pick IS NULL THEN
                        LEAVE prune_loop;
                    END IF;
                    SELECT COUNT(DISTINCT m.clause_no) INTO v_met
                      FROM {{ns}}._assetq_chosen c
                      JOIN {{ns}}._assetq_member m ON m.asset_id = c.asset_id
                     WHERE c.asset_id <> v_pick;
                    IF v_met = v_clauses THEN
                        DELETE FROM {{ns}}._assetq_chosen WHERE asset_id = v_pick;
                    END IF;
                END LOOP;
                -- The oldest row of each chosen asset, then the oldest others, N in all.
                UPDATE {{ns}}._assetq_queue q
                  JOIN {{ns}}._assetq_chosen c ON c.asset_id = q.asset_id
                   SET q.witness = TRUE
                 WHERE q.asset_rank = 1;
                SELECT GREATEST(COUNT(*), v_max_events) INTO v_take FROM {{ns}}._assetq_chosen;
                INSERT INTO {{ns}}._assetq_claim (asset_event_id, asset_id, created_at)
                SELECT q.asset_event_id, q.asset_id, q.created_at
                  FROM {{ns}}._assetq_queue q
                 ORDER BY q.witness DESC, q.created_at, q.asset_event_id
                 LIMIT v_take;
            END IF;
        END IF;
        SELECT COUNT(*), MAX(k.created_at), MIN(k.created_at), MAX(k.asset_event_id)
          INTO v_claimed, v_run_after, v_oldest, v_newest_id
          FROM {{ns}}._assetq_claim k;

        -- I6: every clause of the condition needs an asset among the claimed rows.
        IF v_members THEN
            SELECT COUNT(DISTINCT m.clause_no) INTO v_met
              FROM {{ns}}._assetq_member m
             WHERE m.asset_id IN (SELECT k.asset_id FROM {{ns}}._assetq_claim k);
        ELSE
            SELECT COUNT(DISTINCT c.clause_no) INTO v_met
              FROM {{ns}}.dag_condition_clause c
             WHERE c.dag_id = v_dag_id
               AND c.asset_id IN (SELECT k.asset_id FROM {{ns}}._assetq_claim k);
        END IF;

        IF v_claimed = 0 OR v_clauses = 0 OR v_met < v_clauses THEN
            UPDATE {{ns}}.dag_lock SET last_scheduled_at = v_now WHERE dag_id = v_dag_id;
        ELSE
            UPDATE {{ns}}.dag_lock
               SET last_run_seq = v_locked_seq + 1, last_scheduled_at = v_now
             WHERE dag_id = v_dag_id;
            -- The triggering event: the newest claimed row (created_at, then id). When every
            -- claimed row has one timestamp (a single row, or one batch) that is the highest
            -- id, counted above; otherwise it is looked up.
            IF v_oldest = v_run_after THEN
                SET v_trigger = v_newest_id;
            ELSE
                SELECT k.asset_event_id INTO v_trigger
                  FROM {{ns}}._assetq_claim k
                 ORDER BY k.created_at DESC, k.asset_event_id DESC
                 LIMIT 1;
            END IF;
            SET v_run_id = CONCAT('asset_triggered__',
                                  DATE_FORMAT(v_run_after, '%Y-%m-%dT%H:%i:%s.%f'),
                                  '+00:00__', v_locked_seq + 1);
            INSERT INTO {{ns}}.dag_run (dag_id, run_id, seq, run_after, created_at,
                                        triggering_event_id, event_count)
            VALUES (v_dag_id, v_run_id, v_locked_seq + 1, v_run_after, v_now, v_trigger, v_claimed);
            -- MySQL 8 / MariaDB: no RETURNING on MySQL.
            SET v_run_pk = LAST_INSERT_ID();

            -- Delete exactly the claimed rows (I3), one primary-key lookup per claimed id:
            -- STRAIGHT_JOIN makes the claim table drive the join. A plan that range-scans the
            -- consumer's queue instead waits on producers' uncommitted rows, even at READ
            -- COMMITTED. The claim guard (I4): if any claimed row is gone, someone else
            -- consumed it (or delete_asset deleted it with its event); abort the whole pass.
            -- Before the links: once the rows are held, delete_asset waits for this pass
            -- before it deletes their events, so a link never meets a deleted event.
            DELETE q
              FROM {{ns}}._assetq_claim k
              STRAIGHT_JOIN {{ns}}.asset_dag_run_queue q
                ON q.target_dag_id = v_dag_id AND q.asset_event_id = k.asset_event_id;
            SET v_deleted = ROW_COUNT();
            IF v_deleted <> v_claimed THEN
                SET v_message = LEFT(CONCAT('[AQ900] claim guard: dag ', v_dag_id, ' claimed ',
                                            v_claimed, ' queue rows but deleted ', v_deleted), 128);
                SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = v_message;
            END IF;

            INSERT INTO {{ns}}.dagrun_asset_event (dag_run_id, asset_event_id, dag_id)
            SELECT v_run_pk, k.asset_event_id, v_dag_id FROM {{ns}}._assetq_claim k;

            -- The run's ids as JSON text for the result. GROUP_CONCAT is cut silently at
            -- group_concat_max_len (1024 by default on MySQL): raised for this one statement
            -- to 1 GiB, the largest value both engines accept in strict mode and the most a
            -- packet can carry anyway, and the result is checked against the claim all the same.
            -- MySQL 8 / MariaDB: JSON_ARRAYAGG takes no ORDER BY on MySQL and is cut at
            -- group_concat_max_len on MariaDB; GROUP_CONCAT behaves the same on both.
            SET SESSION group_concat_max_len = 1073741824;
            SELECT CONCAT('[', GROUP_CONCAT(k.asset_event_id ORDER BY k.asset_event_id SEPARATOR ','), ']')
              INTO v_event_ids
              FROM {{ns}}._assetq_claim k;
            SET SESSION group_concat_max_len = v_saved_gcl;
            IF NOT (JSON_LENGTH(v_event_ids) <=> v_claimed) THEN
                SET v_message = LEFT(CONCAT('[AQ900] claim guard: event ids of dag ', v_dag_id,
                                            ' were truncated'), 128);
                SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = v_message;
            END IF;

            INSERT INTO {{ns}}._assetq_run
                   (dag_run_id, dag_id, run_id, seq, run_after, created_at, event_ids,
                    triggering_event_id, state)
            VALUES (v_run_pk, v_dag_id, v_run_id, v_locked_seq + 1, v_run_after, v_now, v_event_ids,
                    v_trigger, 'queued');
        END IF;
    END WHILE candidate_loop;

    SELECT r.dag_run_id, r.dag_id, r.run_id, r.seq, r.run_after, r.created_at, r.event_ids,
           r.triggering_event_id, r.state
      FROM {{ns}}._assetq_run r
     ORDER BY r.dag_run_id;
    DROP TEMPORARY TABLE IF EXISTS {{ns}}._assetq_candidate, {{ns}}._assetq_claim, {{ns}}._assetq_run,
                                   {{ns}}._assetq_member, {{ns}}._assetq_queue, {{ns}}._assetq_chosen;
END $$


-- Moves run p_run_id of consumer p_dag_id to state p_state and returns it as one result set
-- (the get_run columns). Allowed: queued -> running, success or failed; running -> success
-- or failed. Moving a run to the state it is in changes nothing (a retry is harmless).
-- Anything else, or a state that is none of the four, raises AQ008; an unknown run AQ006.
-- started_at is set on entering running, ended_at on entering success or failed, updated_at
-- on every change. A run in success or failed no longer counts against max_active_runs.
-- It locks the run row only: never the consumer, so it never waits for a scheduler pass.
DROP PROCEDURE IF EXISTS {{ns}}.set_run_state $$
CREATE PROCEDURE {{ns}}.set_run_state(
    IN p_dag_id TEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin,
    IN p_run_id TEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin,
    IN p_state  TEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin
)
MODIFIES SQL DATA
BEGIN
    DECLARE v_id      BIGINT;
    DECLARE v_old     VARCHAR(20) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin;
    DECLARE v_now     DATETIME(6);
    DECLARE v_message VARCHAR(128) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin;

    -- NOT LIKE '% ': the PAD SPACE collation would take 'queued ' for 'queued'.
    IF p_state IS NULL OR p_state NOT IN ('queued', 'running', 'success', 'failed')
       OR p_state LIKE '% ' THEN
        SET v_message = LEFT(CONCAT('[AQ008] unknown run state ', COALESCE(QUOTE(LEFT(p_state, 40)), 'NULL'),
                                    ': use queued, running, success or failed'), 128);
        SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = v_message;
    END IF;
    -- A locking read: it sees the run whatever the caller's snapshot, and holds it.
    SELECT r.id, r.state INTO v_id, v_old
      FROM {{ns}}.dag_run r
     WHERE r.dag_id = p_dag_id AND r.run_id = p_run_id
       FOR UPDATE;
    IF v_id IS NULL THEN
        SET v_message = LEFT(CONCAT('[AQ006] unknown run ', COALESCE(QUOTE(LEFT(p_run_id, 60)), 'NULL'),
                                    ' of dag ', COALESCE(QUOTE(LEFT(p_dag_id, 40)), 'NULL')), 128);
        SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = v_message;
    END IF;
    IF v_old <> p_state THEN
        IF NOT ((v_old = 'queued' AND p_state IN ('running', 'success', 'failed'))
                OR (v_old = 'running' AND p_state IN ('success', 'failed'))) THEN
            SET v_message = LEFT(CONCAT('[AQ008] run ', QUOTE(LEFT(p_run_id, 60)), ' is ', v_old,
                                        ': it cannot move to ', p_state), 128);
            SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = v_message;
        END IF;
        SET v_now = UTC_TIMESTAMP(6);
        UPDATE {{ns}}.dag_run
           SET state = p_state,
               started_at = IF(p_state = 'running', v_now, started_at),
               ended_at = IF(p_state IN ('success', 'failed'), v_now, ended_at),
               updated_at = v_now
         WHERE id = v_id;
    END IF;
    SELECT r.id AS dag_run_id, r.dag_id, r.run_id, r.seq, r.state, r.run_after, r.created_at,
           r.started_at, r.ended_at, r.triggering_event_id, r.event_count
      FROM {{ns}}.dag_run r
     WHERE r.id = v_id;
END $$


-- Removes consumer p_dag_id with its queue rows, condition, runs and their links, and its
-- lock row (cascades). Returns no result set; AQ003 for an unknown consumer. Waits for a
-- scheduler pass that holds it (its lock row, first). Then its reference and alias-clause
-- rows go before its dag row, the order in which the fan-out reads them: a producer in
-- flight for this consumer finishes first (its queue rows are deleted with the consumer), a
-- later one waits and then finds no consumer to queue for. Neither fails.
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


-- Removes asset p_asset (a name or uri) with its events: their queue rows (consumers that
-- depended on it through an alias lose the pending ones), their links (runs that consumed
-- them keep their other events and their event_count) and alias resolutions. Returns one
-- result set (deleted_events). AQ001 for an unknown asset; AQ007 while a consumer condition
-- names the asset: re-declare those consumers first. The asset row is locked first, so
-- producers registering for it finish before (their events are deleted too) or fail after
-- with a foreign-key error that assetq reports as an unknown asset.
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

DELIMITER ;


-- dag_queue_status, with two more columns at the end:
--   max_active_runs  the consumer's cap (NULL: none)
--   active_runs      its runs in state queued or running
-- MySQL 8 / MariaDB: no LATERAL on MariaDB, hence the grouped derived table and the
-- correlated subqueries.
CREATE OR REPLACE SQL SECURITY DEFINER VIEW {{ns}}.dag_queue_status AS
SELECT d.dag_id,
       d.is_paused,
       COALESCE(q.queued_events, 0) AS queued_events,
       q.oldest_queued_at,
       TIMESTAMPDIFF(MICROSECOND, q.oldest_queued_at, UTC_TIMESTAMP(6)) / 1000000
           AS oldest_queued_age_seconds,
       (SELECT COUNT(*)
          FROM {{ns}}.dag_run r
         WHERE r.dag_id = d.dag_id
           AND r.created_at > UTC_TIMESTAMP(6) - INTERVAL 1 HOUR) AS runs_last_hour,
       (SELECT MAX(r.created_at) FROM {{ns}}.dag_run r WHERE r.dag_id = d.dag_id) AS last_run_at,
       l.last_run_seq AS runs_total,
       l.last_scheduled_at,
       d.max_active_runs,
       (SELECT COUNT(*)
          FROM {{ns}}.dag_run r
         WHERE r.dag_id = d.dag_id AND r.state IN ('queued', 'running')) AS active_runs
  FROM {{ns}}.dag d
  JOIN {{ns}}.dag_lock l ON l.dag_id = d.dag_id
  LEFT JOIN (SELECT q.target_dag_id,
                    COUNT(*) AS queued_events,
                    MIN(q.created_at) AS oldest_queued_at
               FROM {{ns}}.asset_dag_run_queue q
              GROUP BY q.target_dag_id) q
    ON q.target_dag_id = d.dag_id;


DELIMITER $$

-- Least privilege. Three kinds of access, granted to existing accounts by grant_access:
--   producer   EXECUTE on register_event and register_events: can register events only;
--   scheduler  EXECUTE on schedule_pass and set_run_state: can run scheduler passes and move
--              the runs they created through their states, nothing else;
--   reader     SELECT on the namespace: can read every table and view, never write.
-- Every kind also gets SELECT on the version table (assetq checks the installed revision).
-- Producers and schedulers get no right on any table: the routines run with their
-- definer's rights (SQL SECURITY DEFINER, MySQL's default, which doctor checks), so the
-- definer must be an account that exists and may write the namespace: grant_access refuses
-- otherwise, since every call would fail (error 1449 for a missing definer).
--
-- grant_access runs with the caller's rights (SQL SECURITY INVOKER): only an account that
-- may grant these privileges can use it, and it must be able to read mysql.user. p_host is
-- the account's host (NULL: '%'). Idempotent. AQ002 for an unknown kind or account.
-- MySQL 8 / MariaDB: GRANT never creates the account here: MariaDB would create a missing
-- one without a password unless sql_mode has NO_AUTO_CREATE_USER, a mode MySQL 8 no longer
-- knows, hence the explicit check.
DROP PROCEDURE IF EXISTS {{ns}}.grant_access $$
CREATE PROCEDURE {{ns}}.grant_access(
    IN p_access  TEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin,
    IN p_grantee TEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin,
    IN p_host    TEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin
)
MODIFIES SQL DATA
SQL SECURITY INVOKER
BEGIN
    DECLARE v_host    TEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin DEFAULT COALESCE(p_host, '%');
    DECLARE v_account TEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin;
    DECLARE v_ns      TEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin;
    DECLARE v_definer TEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin;
    DECLARE v_found   BIGINT;
    DECLARE v_message VARCHAR(128) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin;

    IF p_access IS NULL OR p_access NOT IN ('producer', 'scheduler', 'reader') THEN
        SET v_message = LEFT(CONCAT('[AQ002] unknown access ', COALESCE(QUOTE(LEFT(p_access, 40)), 'NULL'),
                                    ': use producer, scheduler or reader'), 128);
        SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = v_message;
    END IF;
    SELECT COUNT(*) INTO v_found FROM mysql.user u WHERE u.User = p_grantee AND u.Host = v_host;
    IF v_found = 0 THEN
        SET v_message = LEFT(CONCAT('[AQ002] account ', COALESCE(QUOTE(LEFT(p_grantee, 40)), 'NULL'), '@',
                                    QUOTE(LEFT(v_host, 40)), ' does not exist: CREATE USER it first'), 128);
        SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = v_message;
    END IF;
    -- The definer of the granted routines (all created by one installer).
    SELECT MIN(r.DEFINER) INTO v_definer
      FROM information_schema.ROUTINES r
     WHERE r.ROUTINE_SCHEMA = DATABASE()
       AND r.ROUTINE_NAME IN ('register_event', 'register_events', 'schedule_pass', 'set_run_state');
    SELECT COUNT(*) INTO v_found
      FROM mysql.user u
     WHERE CONCAT(u.User, '@', u.Host) = v_definer;
    IF v_found = 0 THEN
        SET v_message = LEFT(CONCAT('[AQ002] the routines'' definer ', COALESCE(v_definer, 'NULL'),
                                    ' does not exist: every call would fail; reinstall as an existing account'), 128);
        SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = v_message;
    END IF;

    SET v_account = CONCAT(QUOTE(p_grantee), '@', QUOTE(v_host));
    SET v_ns = CONCAT('`', DATABASE(), '`');
    SET @assetq_grant = CONCAT('GRANT SELECT ON ', v_ns, '.assetq_alembic_version TO ', v_account);
    PREPARE assetq_grant FROM @assetq_grant;
    EXECUTE assetq_grant;
    IF p_access = 'producer' THEN
        SET @assetq_grant = CONCAT('GRANT EXECUTE ON PROCEDURE ', v_ns, '.register_event TO ', v_account);
        PREPARE assetq_grant FROM @assetq_grant;
        EXECUTE assetq_grant;
        SET @assetq_grant = CONCAT('GRANT EXECUTE ON PROCEDURE ', v_ns, '.register_events TO ', v_account);
        PREPARE assetq_grant FROM @assetq_grant;
        EXECUTE assetq_grant;
    ELSEIF p_access = 'scheduler' THEN
        SET @assetq_grant = CONCAT('GRANT EXECUTE ON PROCEDURE ', v_ns, '.schedule_pass TO ', v_account);
        PREPARE assetq_grant FROM @assetq_grant;
        EXECUTE assetq_grant;
        SET @assetq_grant = CONCAT('GRANT EXECUTE ON PROCEDURE ', v_ns, '.set_run_state TO ', v_account);
        PREPARE assetq_grant FROM @assetq_grant;
        EXECUTE assetq_grant;
    ELSE
        SET @assetq_grant = CONCAT('GRANT SELECT ON ', v_ns, '.* TO ', v_account);
        PREPARE assetq_grant FROM @assetq_grant;
        EXECUTE assetq_grant;
    END IF;
    DEALLOCATE PREPARE assetq_grant;
END $$


-- Takes every kind of access grant_access gave the account away again. Idempotent: a
-- privilege the account does not hold is skipped (errors 1141, 1147, 1403: no such grant).
DROP PROCEDURE IF EXISTS {{ns}}.revoke_access $$
CREATE PROCEDURE {{ns}}.revoke_access(
    IN p_grantee TEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin,
    IN p_host    TEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin
)
MODIFIES SQL DATA
SQL SECURITY INVOKER
BEGIN
    DECLARE v_host    TEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin DEFAULT COALESCE(p_host, '%');
    DECLARE v_account TEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin;
    DECLARE v_ns      TEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin;
    DECLARE v_found   BIGINT;
    DECLARE v_message VARCHAR(128) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin;
    DECLARE CONTINUE HANDLER FOR 1141, 1147, 1403 BEGIN END;

    SELECT COUNT(*) INTO v_found FROM mysql.user u WHERE u.User = p_grantee AND u.Host = v_host;
    IF v_found = 0 THEN
        SET v_message = LEFT(CONCAT('[AQ002] account ', COALESCE(QUOTE(LEFT(p_grantee, 40)), 'NULL'), '@',
                                    QUOTE(LEFT(v_host, 40)), ' does not exist'), 128);
        SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = v_message;
    END IF;
    SET v_account = CONCAT(QUOTE(p_grantee), '@', QUOTE(v_host));
    SET v_ns = CONCAT('`', DATABASE(), '`');
    SET @assetq_grant = CONCAT('REVOKE EXECUTE ON PROCEDURE ', v_ns, '.register_event FROM ', v_account);
    PREPARE assetq_grant FROM @assetq_grant;
    EXECUTE assetq_grant;
    SET @assetq_grant = CONCAT('REVOKE EXECUTE ON PROCEDURE ', v_ns, '.register_events FROM ', v_account);
    PREPARE assetq_grant FROM @assetq_grant;
    EXECUTE assetq_grant;
    SET @assetq_grant = CONCAT('REVOKE EXECUTE ON PROCEDURE ', v_ns, '.schedule_pass FROM ', v_account);
    PREPARE assetq_grant FROM @assetq_grant;
    EXECUTE assetq_grant;
    SET @assetq_grant = CONCAT('REVOKE EXECUTE ON PROCEDURE ', v_ns, '.set_run_state FROM ', v_account);
    PREPARE assetq_grant FROM @assetq_grant;
    EXECUTE assetq_grant;
    SET @assetq_grant = CONCAT('REVOKE SELECT ON ', v_ns, '.* FROM ', v_account);
    PREPARE assetq_grant FROM @assetq_grant;
    EXECUTE assetq_grant;
    SET @assetq_grant = CONCAT('REVOKE SELECT ON ', v_ns, '.assetq_alembic_version FROM ', v_account);
    PREPARE assetq_grant FROM @assetq_grant;
    EXECUTE assetq_grant;
    DEALLOCATE PREPARE assetq_grant;
END $$

DELIMITER ;

-- The fan-out (see the bridge, after the dag_run columns), in place of the bridge.
LOCK TABLES {{ns}}.asset_event WRITE;
DELIMITER $$
DROP TRIGGER IF EXISTS {{ns}}.asset_event_fan_out $$
CREATE TRIGGER {{ns}}.asset_event_fan_out
    AFTER INSERT ON {{ns}}.asset_event
    FOR EACH ROW
BEGIN
    DECLARE v_resolutions BIGINT;
    SELECT COUNT(*) INTO v_resolutions
      FROM {{ns}}.asset_alias_asset aa FORCE INDEX (asset_alias_asset_asset_idx)
     WHERE aa.asset_id = NEW.asset_id
      LOCK IN SHARE MODE;
    IF v_resolutions = 0 THEN
        INSERT INTO {{ns}}.asset_dag_run_queue (target_dag_id, asset_event_id, asset_id, created_at)
        SELECT d.dag_id, NEW.id, NEW.asset_id, NEW.`timestamp`
          FROM {{ns}}.dag_schedule_asset_reference r FORCE INDEX (PRIMARY)
          STRAIGHT_JOIN {{ns}}.dag d FORCE INDEX (PRIMARY) ON d.dag_id = r.dag_id
         WHERE r.asset_id = NEW.asset_id
           AND (NOT d.is_paused OR d.queue_while_paused)
          LOCK IN SHARE MODE;
    ELSE
        INSERT INTO {{ns}}.asset_dag_run_queue (target_dag_id, asset_event_id, asset_id, created_at)
        SELECT d.dag_id, NEW.id, NEW.asset_id, NEW.`timestamp`
          FROM ((SELECT r.dag_id
                   FROM {{ns}}.dag_schedule_asset_reference r
                  WHERE r.asset_id = NEW.asset_id
                   LOCK IN SHARE MODE)
                UNION
                (SELECT ca.dag_id
                   FROM {{ns}}.asset_alias_asset aa FORCE INDEX (asset_alias_asset_asset_idx)
                   STRAIGHT_JOIN {{ns}}.dag_condition_alias ca FORCE INDEX (dag_condition_alias_alias_idx)
                      ON ca.alias_id = aa.alias_id
                  WHERE aa.asset_id = NEW.asset_id
                   LOCK IN SHARE MODE)) t
          STRAIGHT_JOIN {{ns}}.dag d FORCE INDEX (PRIMARY) ON d.dag_id = t.dag_id
         WHERE NOT d.is_paused OR d.queue_while_paused
          LOCK IN SHARE MODE;
    END IF;
END $$
DELIMITER ;
UNLOCK TABLES;

CALL {{ns}}._assetq_restore_grants();
DROP TABLE IF EXISTS {{ns}}._assetq_0004_grants;
DROP PROCEDURE IF EXISTS {{ns}}._assetq_restore_grants;
DROP PROCEDURE IF EXISTS {{ns}}._assetq_save_grants;
DROP PROCEDURE IF EXISTS {{ns}}._assetq_alter_if;

SET SESSION sql_mode = @assetq_saved_sql_mode;
