-- Migration 0002_batch_registration (up): register_events, many events in one round trip.
-- Frozen once released: later changes go into new migrations.
--
-- {{ns}} is replaced by the backquoted namespace when the file is loaded. Re-runnable (DROP ...
-- IF EXISTS first), as every MySQL script of assetq: DDL commits statement by statement.

-- The routine runs with the sql_mode in force when it is created: strict, as in 0001.
SET @assetq_saved_sql_mode = @@SESSION.sql_mode,
    SESSION sql_mode = 'STRICT_TRANS_TABLES,STRICT_ALL_TABLES,NO_ZERO_IN_DATE,NO_ZERO_DATE,ERROR_FOR_DIVISION_BY_ZERO,NO_ENGINE_SUBSTITUTION';

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

DELIMITER ;

SET SESSION sql_mode = @assetq_saved_sql_mode;
