-- The body of register_events (see there for what it guarantees), without its result set:
-- inserts the batch p_events in the caller's transaction and leaves one row per item in the
-- session temporary table _assetq_batch, which the caller reads and drops. register_events
-- and complete_run (a run's output events) both call it, so a run's events are registered
-- exactly as a producer's batch. MySQL 8 / MariaDB: a SELECT in a procedure called from
-- another one still sends its rows to the client, so complete_run cannot CALL
-- register_events: its CALL would return two result sets (tests/test_mysql_facts.py).
DELIMITER $$
DROP PROCEDURE IF EXISTS {{ns}}.insert_event_batch
$$
CREATE PROCEDURE {{ns}}.insert_event_batch(
    IN  p_events    JSON,
    OUT p_first_id  BIGINT,
    OUT p_timestamp DATETIME(6)
)
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
    DECLARE v_part      VARCHAR(1024) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin;
    DECLARE v_old_part  VARCHAR(250) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin;
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
        partition_key    VARCHAR(1024) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL,
        partition_type   VARCHAR(32) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL,
        asset_id         BIGINT NULL,
        event_id         BIGINT NULL,
        event_timestamp  DATETIME(6) NULL,
        created          BOOLEAN NULL,
        KEY (asset(255))
    ) ENGINE = InnoDB;
    INSERT INTO {{ns}}._assetq_batch
           (item_no, item_type, asset, extra, source_dag_id, source_task_id, source_run_id,
            source_map_index, idempotency_key, aliases, partition_key, partition_type)
    SELECT j.item_no, JSON_TYPE(j.item), j.asset,
           CASE WHEN j.extra IS NULL OR JSON_TYPE(j.extra) = 'NULL' THEN '{}' ELSE j.extra END,
           j.source_dag_id, j.source_task_id, j.source_run_id,
           COALESCE(j.source_map_index, -1), j.idempotency_key,
           CASE WHEN j.aliases IS NULL OR JSON_TYPE(j.aliases) = 'NULL' THEN NULL ELSE j.aliases END,
           j.partition_key, JSON_TYPE(j.partition_json)
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
               aliases          JSON PATH '$.aliases',
               partition_key    VARCHAR(1024) PATH '$.partition_key',
               partition_json   JSON PATH '$.partition_key')) AS j;

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

    -- Partition keys: a string of 1 to 250 characters, or none.
    SELECT b.item_no INTO v_bad
      FROM {{ns}}._assetq_batch b
     WHERE b.partition_type IS NOT NULL AND b.partition_type <> 'NULL'
       AND (b.partition_type <> 'STRING' OR CHAR_LENGTH(b.partition_key) NOT BETWEEN 1 AND 250
            OR CHAR_LENGTH(b.partition_key) <> CHAR_LENGTH(RTRIM(b.partition_key)))
     ORDER BY b.item_no LIMIT 1;
    IF v_bad IS NOT NULL THEN
        SET v_message = CONCAT('[AQ002] partition_key must be a string of 1 to 250 characters,',
                               ' not ending with a space (event ', v_bad, ' of the batch)');
        SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = v_message;
    END IF;
    UPDATE {{ns}}._assetq_batch SET partition_key = NULL WHERE partition_type = 'NULL';

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
        -- Then the row found, by its primary key, with a shared lock (a record lock, no gap):
        -- it waits for a delete_asset that holds the row, and an asset deleted meanwhile is
        -- unknown. MySQL 9.7 checks foreign keys in its SQL layer (innodb_native_foreign_keys
        -- = OFF): an INSERT that had waited for the deleter went in after its commit, events
        -- of an asset that no longer exists (tests/test_semantics_lifecycle.py).
        SET v_bad = NULL;
        SELECT 1 INTO v_bad FROM {{ns}}.asset a WHERE a.id = v_asset_id LOCK IN SHARE MODE;
        IF v_bad IS NULL THEN
            SET v_message = LEFT(CONCAT('[AQ001] unknown asset ', COALESCE(QUOTE(LEFT(v_name, 48)), 'NULL'),
                                        ' (event ', v_item_no, ' of the batch): it was deleted meanwhile'), 128);
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
                    source_map_index, idempotency_key, `timestamp`, partition_key)
            SELECT b.asset_id, b.extra, b.source_dag_id, b.source_task_id, b.source_run_id,
                   b.source_map_index, b.idempotency_key, v_timestamp, b.partition_key
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
               b.source_map_index, b.idempotency_key, b.partition_key
          INTO v_asset_id, v_extra, v_dag_id, v_task_id, v_run_id, v_map_index, v_key, v_part
          FROM {{ns}}._assetq_batch b WHERE b.item_no = v_item_no;
        SET v_old_extra = NULL;
        BEGIN
            DECLARE CONTINUE HANDLER FOR 1062
                SELECT e.id, e.`timestamp`, e.extra, e.partition_key
                  INTO v_event_id, v_old_timestamp, v_old_extra, v_old_part
                  FROM {{ns}}.asset_event e
                 WHERE e.asset_id = v_asset_id AND e.idempotency_key = v_key
                  LOCK IN SHARE MODE;
            INSERT INTO {{ns}}.asset_event
                   (asset_id, extra, source_dag_id, source_task_id, source_run_id,
                    source_map_index, idempotency_key, `timestamp`, partition_key)
            VALUES (v_asset_id, v_extra, v_dag_id, v_task_id, v_run_id, v_map_index, v_key,
                    v_timestamp, v_part);
        END;
        IF v_old_extra IS NULL THEN
            UPDATE {{ns}}._assetq_batch
               SET event_id = LAST_INSERT_ID(), event_timestamp = v_timestamp, created = TRUE
             WHERE item_no = v_item_no;
        ELSEIF JSON_EXTRACT(v_old_extra, '$') <=> JSON_EXTRACT(v_extra, '$')
               AND v_old_part <=> v_part THEN
            UPDATE {{ns}}._assetq_batch
               SET event_id = v_event_id, event_timestamp = v_old_timestamp, created = FALSE
             WHERE item_no = v_item_no;
        ELSE
            SET v_message = LEFT(CONCAT('[AQ005] idempotency key ', QUOTE(LEFT(v_key, 24)),
                                        ' was already used for event ', v_event_id,
                                        ' with a different extra or partition (event ', v_item_no,
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

    -- The result, for the caller to read (register_events returns it as it is):
    -- _assetq_batch holds the items, with event_id, event_timestamp and created filled in
    -- by the row-by-row path; p_first_id is the fast path's first id (item n got
    -- p_first_id + n - 1, created, at p_timestamp), NULL after the row-by-row path.
    SET p_first_id = v_first_id, p_timestamp = v_timestamp;
    DROP TEMPORARY TABLE IF EXISTS {{ns}}._assetq_batch_alias, {{ns}}._assetq_alias_name,
                                   {{ns}}._assetq_alias_pair;
END
$$
DELIMITER ;
