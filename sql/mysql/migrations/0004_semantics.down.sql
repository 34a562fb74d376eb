-- Migration 0004_semantics (down): removes what 0004_semantics.up.sql added and puts back the
-- 0001-0003 definitions of the trigger, view and routines it replaced. Events, queues and
-- runs stay; what only 0004 knows goes with its tables and columns: aliases (queue rows an
-- alias brought stay queued), caps, the queue_while_paused option, undeclared marks, run
-- metadata. Accounts keep their grants on the routines created again here (saved first, as
-- in the up script); set_run_state, delete_dag and delete_asset are dropped with theirs.
-- Re-runnable: DDL commits statement by statement.

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

DROP PROCEDURE IF EXISTS {{ns}}.delete_asset;
DROP PROCEDURE IF EXISTS {{ns}}.delete_dag;
DROP PROCEDURE IF EXISTS {{ns}}.set_run_state;

-- The definitions of 0001 to 0003, unchanged.

-- Fan-out (I1, I2): one queue row per unpaused consumer of the event's asset, written by the
-- inserting statement itself, so an event and its queue rows commit or roll back together,
-- whoever inserts the event. AFTER INSERT: only then is the event's AUTO_INCREMENT id known.
-- MySQL has no statement-level triggers, so this runs once per inserted event.
DROP TRIGGER IF EXISTS {{ns}}.asset_event_fan_out;
CREATE TRIGGER {{ns}}.asset_event_fan_out
    AFTER INSERT ON {{ns}}.asset_event
    FOR EACH ROW
    INSERT INTO {{ns}}.asset_dag_run_queue (target_dag_id, asset_event_id, asset_id, created_at)
    SELECT r.dag_id, NEW.id, NEW.asset_id, NEW.`timestamp`
      FROM {{ns}}.dag_schedule_asset_reference r
      JOIN {{ns}}.dag d ON d.dag_id = r.dag_id
     WHERE r.asset_id = NEW.asset_id
       AND NOT d.is_paused;

DELIMITER $$

-- Registers a batch of events in the caller's transaction, in one round trip, and returns one
-- result set with one row per item in input order (item_no, event_id, asset_id,
-- event_timestamp, created), with register_event's guarantees for each. p_events is a JSON
-- array of at most 10,000 objects {"asset": name or uri, "extra", "source_dag_id",
-- "source_task_id", "source_run_id", "source_map_index", "idempotency_key"}; only "asset" is
-- required. The events of one batch share one timestamp.
--
-- All or nothing, once the caller rolls back on error (as after any routine error here).
-- Every item is checked and every asset resolved before anything is written: one unknown asset
-- (AQ001) or extra that is not an object (AQ002) fails the call with nothing inserted. A key
-- reused with another extra (AQ005), or a value the table refuses, fails it after some rows
-- may have been inserted in the caller's transaction. Items with the same asset and
-- idempotency key are one event, as retries would be: the first creates it (unless it exists
-- already), the others return it with created = 0. MySQL has no statement-level triggers: the
-- row-level trigger fans out each event of the batch.
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
    DROP TEMPORARY TABLE IF EXISTS {{ns}}._assetq_batch;
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
        asset_id         BIGINT NULL,
        event_id         BIGINT NULL,
        event_timestamp  DATETIME(6) NULL,
        created          BOOLEAN NULL,
        KEY (asset(255))
    ) ENGINE = InnoDB;
    INSERT INTO {{ns}}._assetq_batch
           (item_no, item_type, asset, extra, source_dag_id, source_task_id, source_run_id,
            source_map_index, idempotency_key)
    SELECT j.item_no, JSON_TYPE(j.item), j.asset,
           CASE WHEN j.extra IS NULL OR JSON_TYPE(j.extra) = 'NULL' THEN '{}' ELSE j.extra END,
           j.source_dag_id, j.source_task_id, j.source_run_id,
           COALESCE(j.source_map_index, -1), j.idempotency_key
      FROM JSON_TABLE(p_events, '$[*]' COLUMNS (
               item_no          FOR ORDINALITY,
               item             JSON PATH '$',
               asset            VARCHAR(1024) PATH '$.asset',
               extra            JSON PATH '$.extra',
               source_dag_id    VARCHAR(1024) PATH '$.source_dag_id',
               source_task_id   VARCHAR(1024) PATH '$.source_task_id',
               source_run_id    VARCHAR(1024) PATH '$.source_run_id',
               source_map_index INT PATH '$.source_map_index',
               idempotency_key  VARCHAR(1024) PATH '$.idempotency_key')) AS j;

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
    DROP TEMPORARY TABLE IF EXISTS {{ns}}._assetq_batch;
END $$

-- Declares an asset (idempotent) and returns its id as one result set (asset_id). An existing
-- asset keeps its id; a given uri or extra replaces the stored one.
DROP PROCEDURE IF EXISTS {{ns}}.declare_asset $$
CREATE PROCEDURE {{ns}}.declare_asset(
    IN p_name  TEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin,
    IN p_uri   TEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin,
    IN p_extra JSON
)
MODIFIES SQL DATA
BEGIN
    DECLARE v_id      BIGINT;
    DECLARE v_kind    VARCHAR(32) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin;
    DECLARE v_message VARCHAR(128) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin;

    SET v_kind = CASE WHEN p_extra IS NULL THEN 'OBJECT'
                      WHEN JSON_VALID(p_extra) THEN JSON_TYPE(p_extra)
                      ELSE 'invalid JSON' END;
    IF v_kind <> 'OBJECT' THEN
        SET v_message = CONCAT('[AQ002] asset extra must be a JSON object, got ', v_kind);
        SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = v_message;
    END IF;
    -- The uri stays out of this INSERT: ON DUPLICATE KEY UPDATE fires on a conflict with ANY
    -- unique key, so a uri that belongs to another asset would update that other asset. Here
    -- only the name can conflict; id = LAST_INSERT_ID(id) makes LAST_INSERT_ID() the
    -- existing row's id on a conflict (MySQL 8 / MariaDB: no RETURNING on MySQL).
    INSERT INTO {{ns}}.asset (name, extra)
    VALUES (p_name, COALESCE(p_extra, JSON_OBJECT()))
    ON DUPLICATE KEY UPDATE extra = COALESCE(p_extra, extra), id = LAST_INSERT_ID(id);
    SET v_id = LAST_INSERT_ID();
    -- By key: a uri owned by another asset fails with a duplicate-key error, as PostgreSQL's
    -- unique violation does, instead of touching the other asset.
    IF p_uri IS NOT NULL THEN
        UPDATE {{ns}}.asset SET uri = p_uri WHERE id = v_id;
    END IF;
    SELECT v_id AS asset_id;
END $$


-- Declares or re-declares a consumer. p_condition is the condition as declared (kept for
-- reading back); p_clauses its conjunctive normal form, a JSON array of clauses, each a
-- non-empty array of asset names or uris. Assets named here that do not exist are created
-- (as Airflow does when a DAG file declares an asset). The whole replacement happens in the
-- caller's transaction, under the consumer's lock row: a scheduler pass sees the old
-- condition or the new one, never a mix. p_paused NULL keeps the current state (new
-- consumers start unpaused). Rows already queued stay queued and are consumed by the
-- consumer's next run. Returns no result set.
--
-- While it runs it holds the dag row, so producers of this consumer wait for it (their
-- foreign-key check takes a shared lock on that row); PostgreSQL's NO KEY lock avoids that.
DROP PROCEDURE IF EXISTS {{ns}}.declare_dag $$
CREATE PROCEDURE {{ns}}.declare_dag(
    IN p_dag_id    TEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin,
    IN p_condition JSON,
    IN p_clauses   JSON,
    IN p_paused    BOOLEAN
)
MODIFIES SQL DATA
BEGIN
    DECLARE v_bad     BIGINT;
    DECLARE v_pos     BIGINT DEFAULT 0;
    DECLARE v_name    VARCHAR(512) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin;
    DECLARE v_id      BIGINT;
    DECLARE v_message VARCHAR(128) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin;

    IF p_dag_id IS NULL OR NOT (p_dag_id REGEXP '^[A-Za-z0-9_.-]+$')
       OR CHAR_LENGTH(p_dag_id) > 250 THEN
        SET v_message = LEFT(CONCAT('[AQ002] invalid dag id ', COALESCE(QUOTE(LEFT(p_dag_id, 40)), 'NULL'),
                                    ': use 1 to 250 letters, digits, "_", "." or "-"'), 128);
        SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = v_message;
    END IF;
    IF p_condition IS NULL OR JSON_VALID(p_condition) = 0 THEN
        SET v_message = LEFT(CONCAT('[AQ004] condition of dag ', p_dag_id,
                                    ' is missing or not JSON'), 128);
        SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = v_message;
    END IF;
    IF p_clauses IS NULL OR NOT JSON_VALID(p_clauses) THEN
        SET v_bad = 1;
    ELSEIF JSON_TYPE(p_clauses) <> 'ARRAY' OR JSON_LENGTH(p_clauses) = 0 THEN
        SET v_bad = 1;
    ELSE
        -- MySQL 8 / MariaDB: JSON_TABLE with NESTED PATH is in both (MySQL >= 8.0.4,
        -- MariaDB >= 10.6). An empty clause yields one row with NULL item.
        SELECT COUNT(*) INTO v_bad
          FROM JSON_TABLE(p_clauses, '$[*]' COLUMNS (
                   clause JSON PATH '$',
                   NESTED PATH '$[*]' COLUMNS (
                       item JSON PATH '$',
                       name VARCHAR(1024) PATH '$'))) AS c
         WHERE c.clause IS NULL OR JSON_TYPE(c.clause) <> 'ARRAY' OR JSON_LENGTH(c.clause) = 0
            OR c.item IS NULL OR JSON_TYPE(c.item) <> 'STRING'
            OR c.name IS NULL OR CHAR_LENGTH(c.name) NOT BETWEEN 1 AND 512;
    END IF;
    IF v_bad > 0 THEN
        SET v_message = LEFT(CONCAT('[AQ004] condition clauses of dag ', p_dag_id,
                                    ' must be a non-empty array of non-empty arrays of asset names'), 128);
        SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = v_message;
    END IF;

    -- The consumer's lock row first, as a scheduler pass takes it: every later statement
    -- runs under it (a new consumer gets its row, already locked, from the trigger on dag).
    SELECT COUNT(*) INTO v_bad FROM {{ns}}.dag_lock l WHERE l.dag_id = p_dag_id FOR UPDATE;

    INSERT INTO {{ns}}.dag (dag_id, `condition`, is_paused)
    VALUES (p_dag_id, p_condition, COALESCE(p_paused, FALSE))
    ON DUPLICATE KEY UPDATE `condition` = p_condition,
                            is_paused = COALESCE(p_paused, is_paused),
                            updated_at = UTC_TIMESTAMP(6);

    -- Resolve every distinct name (name first, then uri), creating the missing assets, one
    -- name at a time in a temporary table. Plain reads and keyed inserts only: an
    -- INSERT ... SELECT from asset would, at REPEATABLE READ, take shared gap locks on asset's
    -- indexes and deadlock concurrent declarations.
    DROP TEMPORARY TABLE IF EXISTS {{ns}}._assetq_declare_name;
    CREATE TEMPORARY TABLE {{ns}}._assetq_declare_name (
        pos      BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY,
        name     VARCHAR(512) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
        asset_id BIGINT NULL,
        UNIQUE KEY (name)
    ) ENGINE = InnoDB;
    INSERT INTO {{ns}}._assetq_declare_name (name)
    SELECT DISTINCT c.name
      FROM JSON_TABLE(p_clauses, '$[*]' COLUMNS (
               NESTED PATH '$[*]' COLUMNS (name VARCHAR(512) PATH '$'))) AS c
     ORDER BY c.name;
    name_loop: LOOP
        SET v_name = NULL;
        SELECT n.pos, n.name INTO v_pos, v_name
          FROM {{ns}}._assetq_declare_name n WHERE n.pos > v_pos ORDER BY n.pos LIMIT 1;
        IF v_name IS NULL THEN
            LEAVE name_loop;
        END IF;
        SET v_id = NULL;
        SELECT a.id INTO v_id FROM {{ns}}.asset a WHERE a.name = v_name;
        IF v_id IS NULL THEN
            SELECT a.id INTO v_id FROM {{ns}}.asset a WHERE a.uri = v_name;
        END IF;
        IF v_id IS NULL THEN
            -- A concurrent declaration may have created it since our read: then the
            -- duplicate key hands back its id.
            INSERT INTO {{ns}}.asset (name) VALUES (v_name)
            ON DUPLICATE KEY UPDATE id = LAST_INSERT_ID(id);
            SET v_id = LAST_INSERT_ID();
        END IF;
        UPDATE {{ns}}._assetq_declare_name SET asset_id = v_id WHERE pos = v_pos;
    END LOOP;

    DELETE FROM {{ns}}.dag_condition_clause WHERE dag_id = p_dag_id;
    INSERT INTO {{ns}}.dag_condition_clause (dag_id, clause_no, asset_id)
    SELECT DISTINCT p_dag_id, c.clause_no, n.asset_id
      FROM JSON_TABLE(p_clauses, '$[*]' COLUMNS (
               clause_no FOR ORDINALITY,
               NESTED PATH '$[*]' COLUMNS (name VARCHAR(512) PATH '$'))) AS c
      JOIN {{ns}}._assetq_declare_name n ON n.name = c.name;
    DROP TEMPORARY TABLE IF EXISTS {{ns}}._assetq_declare_name;

    DELETE FROM {{ns}}.dag_schedule_asset_reference
     WHERE dag_id = p_dag_id
       AND asset_id NOT IN (SELECT c.asset_id FROM {{ns}}.dag_condition_clause c
                             WHERE c.dag_id = p_dag_id);
    INSERT INTO {{ns}}.dag_schedule_asset_reference (asset_id, dag_id)
    SELECT DISTINCT c.asset_id, c.dag_id
      FROM {{ns}}.dag_condition_clause c
     WHERE c.dag_id = p_dag_id
       AND NOT EXISTS (SELECT 1 FROM {{ns}}.dag_schedule_asset_reference r
                        WHERE r.asset_id = c.asset_id AND r.dag_id = c.dag_id);
END $$


-- One scheduler pass (I3-I6). Takes at most p_limit unpaused consumers with queued rows,
-- least recently examined first, each by its lock row FOR UPDATE SKIP LOCKED, and for each:
-- claims its committed queue rows, evaluates the condition on exactly those rows, and when it
-- holds creates one run, links exactly the claimed events and deletes exactly the claimed
-- rows by key. Returns one result set, one row per run created (dag_run_id, dag_id,
-- run_id, seq, run_after, created_at, event_ids as a JSON array).
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
    DECLARE v_claimed    BIGINT;
    DECLARE v_deleted    BIGINT;
    DECLARE v_run_after  DATETIME(6);
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
    -- this connection are dropped here.
    -- MySQL 8 / MariaDB: MySQL cannot open one temporary table twice in a statement, so no
    -- statement below names the same temporary table twice.
    DROP TEMPORARY TABLE IF EXISTS {{ns}}._assetq_candidate, {{ns}}._assetq_claim, {{ns}}._assetq_run;
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
        dag_run_id BIGINT NOT NULL PRIMARY KEY,
        dag_id     VARCHAR(250) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
        run_id     VARCHAR(250) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
        seq        BIGINT NOT NULL,
        run_after  DATETIME(6) NOT NULL,
        created_at DATETIME(6) NOT NULL,
        event_ids  LONGTEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL
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

        SELECT d.is_paused INTO v_paused FROM {{ns}}.dag d WHERE d.dag_id = v_dag_id;
        IF v_paused THEN
            -- Paused since the candidate read: like a consumer another pass holds.
            SET v_taken = v_taken - 1;
            ITERATE candidate_loop;
        END IF;
        SET v_now = UTC_TIMESTAMP(6);

        -- The claim: a plain read of the consumer's committed queue rows, taken after the
        -- lock, so it sees every row committed so far, including the deletions of a pass that
        -- held this consumer a moment ago. A row committed after this read is not in the
        -- claim and waits for the next pass: selection is by reference, never by time (I3).
        -- An uncommitted producer row is neither read nor waited for.
        DELETE FROM {{ns}}._assetq_claim;
        INSERT INTO {{ns}}._assetq_claim (asset_event_id, asset_id, created_at)
        SELECT q.asset_event_id, q.asset_id, q.created_at
          FROM {{ns}}.asset_dag_run_queue q
         WHERE q.target_dag_id = v_dag_id;
        SELECT COUNT(*), MAX(k.created_at) INTO v_claimed, v_run_after FROM {{ns}}._assetq_claim k;

        -- I6: every clause of the condition needs an asset among the claimed rows.
        SELECT COUNT(DISTINCT c.clause_no) INTO v_clauses
          FROM {{ns}}.dag_condition_clause c WHERE c.dag_id = v_dag_id;
        SELECT COUNT(DISTINCT c.clause_no) INTO v_met
          FROM {{ns}}.dag_condition_clause c
         WHERE c.dag_id = v_dag_id
           AND c.asset_id IN (SELECT k.asset_id FROM {{ns}}._assetq_claim k);

        IF v_claimed = 0 OR v_clauses = 0 OR v_met < v_clauses THEN
            UPDATE {{ns}}.dag_lock SET last_scheduled_at = v_now WHERE dag_id = v_dag_id;
        ELSE
            UPDATE {{ns}}.dag_lock
               SET last_run_seq = v_locked_seq + 1, last_scheduled_at = v_now
             WHERE dag_id = v_dag_id;
            SET v_run_id = CONCAT('asset_triggered__',
                                  DATE_FORMAT(v_run_after, '%Y-%m-%dT%H:%i:%s.%f'),
                                  '+00:00__', v_locked_seq + 1);
            INSERT INTO {{ns}}.dag_run (dag_id, run_id, seq, run_after, created_at)
            VALUES (v_dag_id, v_run_id, v_locked_seq + 1, v_run_after, v_now);
            -- MySQL 8 / MariaDB: no RETURNING on MySQL.
            SET v_run_pk = LAST_INSERT_ID();

            INSERT INTO {{ns}}.dagrun_asset_event (dag_run_id, asset_event_id, dag_id)
            SELECT v_run_pk, k.asset_event_id, v_dag_id FROM {{ns}}._assetq_claim k;

            -- Delete exactly the claimed rows (I3), one primary-key lookup per claimed id:
            -- STRAIGHT_JOIN makes the claim table drive the join. A plan that range-scans the
            -- consumer's queue instead waits on producers' uncommitted rows, even at READ
            -- COMMITTED. The claim guard (I4): if any claimed row is gone, someone else
            -- consumed it; abort the whole pass.
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
                   (dag_run_id, dag_id, run_id, seq, run_after, created_at, event_ids)
            VALUES (v_run_pk, v_dag_id, v_run_id, v_locked_seq + 1, v_run_after, v_now, v_event_ids);
        END IF;
    END WHILE candidate_loop;

    SELECT r.dag_run_id, r.dag_id, r.run_id, r.seq, r.run_after, r.created_at, r.event_ids
      FROM {{ns}}._assetq_run r
     ORDER BY r.dag_run_id;
    DROP TEMPORARY TABLE IF EXISTS {{ns}}._assetq_candidate, {{ns}}._assetq_claim, {{ns}}._assetq_run;
END $$

DELIMITER ;


-- One row per consumer, for `assetq status` and dashboards. Read-only (it aggregates).
--   queued_events              queue rows of the consumer: events it has not consumed yet
--   oldest_queued_at           timestamp of the oldest of them (NULL when none), UTC
--   oldest_queued_age_seconds  how long that one has waited, by the server's clock
--   runs_last_hour             runs created in the last hour (runs purged are not counted)
--   last_run_at                when its newest run still in the history was created, UTC
--   runs_total                 runs ever created for it (its run sequence; purge keeps it)
--   last_scheduled_at          when a scheduler pass last examined it, UTC
-- The queue is grouped whole: it holds pending rows only, never history. SQL SECURITY
-- DEFINER: a reader needs SELECT on the view only.
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
       l.last_scheduled_at
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
--   scheduler  EXECUTE on schedule_pass: can run scheduler passes only (assetq has no
--              routine that moves run states yet);
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
       AND r.ROUTINE_NAME IN ('register_event', 'register_events', 'schedule_pass');
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
    SET @assetq_grant = CONCAT('REVOKE SELECT ON ', v_ns, '.* FROM ', v_account);
    PREPARE assetq_grant FROM @assetq_grant;
    EXECUTE assetq_grant;
    SET @assetq_grant = CONCAT('REVOKE SELECT ON ', v_ns, '.assetq_alembic_version FROM ', v_account);
    PREPARE assetq_grant FROM @assetq_grant;
    EXECUTE assetq_grant;
    DEALLOCATE PREPARE assetq_grant;
END $$

DELIMITER ;


-- What 0004 added to the tables, after every routine that used it is gone.
DROP TABLE IF EXISTS {{ns}}.dag_condition_alias;
DROP TABLE IF EXISTS {{ns}}.asset_event_alias;
DROP TABLE IF EXISTS {{ns}}.asset_alias_asset;
DROP TABLE IF EXISTS {{ns}}.asset_alias;
CALL {{ns}}._assetq_alter_if(TRUE, 'dag_run', 'index', 'dag_run_dag_state_idx',
                             'DROP INDEX dag_run_dag_state_idx');
CALL {{ns}}._assetq_alter_if(TRUE, 'dag_run', 'column', 'updated_at', 'DROP COLUMN updated_at');
CALL {{ns}}._assetq_alter_if(TRUE, 'dag_run', 'column', 'ended_at', 'DROP COLUMN ended_at');
CALL {{ns}}._assetq_alter_if(TRUE, 'dag_run', 'column', 'started_at', 'DROP COLUMN started_at');
CALL {{ns}}._assetq_alter_if(TRUE, 'dag_run', 'column', 'event_count', 'DROP COLUMN event_count');
CALL {{ns}}._assetq_alter_if(TRUE, 'dag_run', 'column', 'triggering_event_id',
                             'DROP COLUMN triggering_event_id');
CALL {{ns}}._assetq_alter_if(TRUE, 'asset', 'column', 'declared', 'DROP COLUMN declared');
-- MySQL 8 / MariaDB: a column a CHECK constraint uses cannot be dropped before the constraint
-- on MySQL; DROP CONSTRAINT (not DROP CHECK, MySQL-only) works on both (MySQL >= 8.0.19).
CALL {{ns}}._assetq_alter_if(TRUE, 'dag', 'constraint', 'dag_max_events_per_run_check',
                             'DROP CONSTRAINT dag_max_events_per_run_check');
CALL {{ns}}._assetq_alter_if(TRUE, 'dag', 'constraint', 'dag_max_active_runs_check',
                             'DROP CONSTRAINT dag_max_active_runs_check');
CALL {{ns}}._assetq_alter_if(TRUE, 'dag', 'column', 'queue_while_paused', 'DROP COLUMN queue_while_paused');
CALL {{ns}}._assetq_alter_if(TRUE, 'dag', 'column', 'max_events_per_run', 'DROP COLUMN max_events_per_run');
CALL {{ns}}._assetq_alter_if(TRUE, 'dag', 'column', 'max_active_runs', 'DROP COLUMN max_active_runs');

CALL {{ns}}._assetq_restore_grants();
DROP TABLE IF EXISTS {{ns}}._assetq_0004_grants;
DROP PROCEDURE IF EXISTS {{ns}}._assetq_restore_grants;
DROP PROCEDURE IF EXISTS {{ns}}._assetq_save_grants;
DROP PROCEDURE IF EXISTS {{ns}}._assetq_alter_if;

SET SESSION sql_mode = @assetq_saved_sql_mode;
