-- assetq on MySQL 8.0+ / MariaDB 10.6+: the whole current schema (tables, routines, triggers).
--
-- A fresh install executes this file; an existing install is upgraded by replaying
-- migrations/NNNN_*.up.sql. tests/test_migrations.py proves both give the same schema, so any
-- change here needs a new migration, and the reverse.
--
-- {{ns}} is replaced by the backquoted namespace (a MySQL database, default `assetq`) when the
-- file is loaded. Every object is qualified with it, so nothing depends on the connection's
-- default database. The file runs unchanged through the mysql client too: assetq's loader
-- (sqlfiles.split_script) splits it exactly as the client does, DELIMITER lines included.
--
-- Only the common subset of MySQL 8.0 and MariaDB 10.6 is used. Where the two differ, a
-- comment marked "MySQL 8 / MariaDB:" says what was avoided and why.
--
-- Every statement can run twice (CREATE TABLE IF NOT EXISTS, DROP ... IF EXISTS before each
-- routine and trigger): MySQL commits every DDL statement on its own, so an install that
-- stopped half-way is finished by running the script again.
--
-- Timestamps are DATETIME(6) holding UTC, written with UTC_TIMESTAMP(6), never NOW(6) or
-- CURRENT_TIMESTAMP: those follow the session's time_zone, and a DATETIME keeps no zone, so a
-- session at '+05:00' would store times five hours off. With UTC_TIMESTAMP nothing assetq
-- stores or returns depends on the session's time_zone.
--
-- Text columns are utf8mb4 with the binary collation utf8mb4_bin: names compare case- and
-- accent-sensitively, as on PostgreSQL. utf8mb4_bin is a PAD SPACE collation on both engines,
-- so values that differ only in trailing spaces compare equal ('a' = 'a '). MySQL 8 /
-- MariaDB: the NO PAD binary collations differ (utf8mb4_0900_bin / utf8mb4_nopad_bin), there
-- is none in the common subset. Length limits are the PostgreSQL schema's.

-- The routines below run with the sql_mode in force when they are created (MySQL stores it
-- with each routine and trigger). Strict mode makes a too-long value an error instead of a
-- silent truncation, whatever the installing session's own sql_mode is. The installer's mode
-- is restored at the end of the file.
SET @assetq_saved_sql_mode = @@SESSION.sql_mode,
    SESSION sql_mode = 'STRICT_TRANS_TABLES,STRICT_ALL_TABLES,NO_ZERO_IN_DATE,NO_ZERO_DATE,ERROR_FOR_DIVISION_BY_ZERO,NO_ENGINE_SUBSTITUTION';

CREATE TABLE IF NOT EXISTS {{ns}}.asset (
    id          BIGINT NOT NULL AUTO_INCREMENT,
    name        VARCHAR(512) NOT NULL,
    uri         VARCHAR(512) NULL,
    -- MySQL 8 / MariaDB: MySQL 8 refuses a literal default on a JSON column; an expression
    -- default in parentheses works on both (MySQL >= 8.0.13).
    extra       JSON NOT NULL DEFAULT (JSON_OBJECT()),
    created_at  DATETIME(6) NOT NULL DEFAULT (UTC_TIMESTAMP(6)),
    PRIMARY KEY (id),
    CONSTRAINT asset_name_key UNIQUE (name),
    CONSTRAINT asset_uri_key UNIQUE (uri),
    -- CHAR_LENGTH, not <> '': with a PAD SPACE collation ' ' = '' is true.
    CONSTRAINT asset_name_not_empty CHECK (CHAR_LENGTH(name) > 0),
    CONSTRAINT asset_uri_not_empty CHECK (CHAR_LENGTH(uri) > 0),
    -- MySQL 8 / MariaDB: JSON is a binary type on MySQL and LONGTEXT with a JSON_VALID check
    -- on MariaDB; JSON_TYPE works on both.
    CONSTRAINT asset_extra_is_object CHECK (JSON_TYPE(extra) = 'OBJECT')
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

-- A consumer. The scheduler's own per-consumer state (run sequence, round-robin position) is
-- not here but in dag_lock: see there why the scheduler never writes this row.
CREATE TABLE IF NOT EXISTS {{ns}}.dag (
    dag_id      VARCHAR(250) NOT NULL,
    `condition` JSON NOT NULL,
    is_paused   BOOLEAN NOT NULL DEFAULT FALSE,
    created_at  DATETIME(6) NOT NULL DEFAULT (UTC_TIMESTAMP(6)),
    updated_at  DATETIME(6) NOT NULL DEFAULT (UTC_TIMESTAMP(6)),
    PRIMARY KEY (dag_id),
    -- ASCII classes, not [[:alnum:]]: MySQL's ICU regular expressions count any Unicode letter
    -- as alnum, MariaDB's PCRE does not. This is exactly what the Python layer accepts.
    CONSTRAINT dag_id_format CHECK (dag_id REGEXP '^[A-Za-z0-9_.-]+$')
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

-- The consumer's lock row: one per dag, created by the trigger on dag, referenced by nothing.
-- A scheduler pass locks this row (FOR UPDATE SKIP LOCKED), never the dag row: every producer
-- in flight holds a shared lock on the dag row through the queue's foreign key (MySQL has no
-- NO KEY lock mode), so a pass locking the dag row would skip every busy consumer, and a pass
-- writing it would wait for every producer. That is also why the run sequence and the
-- round-robin position live here: the pass updates them under its own lock. declare_dag and
-- set_dag_paused take this lock before they touch the dag row, so a pass sees a consumer's
-- old definition or its new one, never a mix.
--
-- last_scheduled_at is when a pass last examined the consumer: passes take consumers
-- oldest-examined first, so a consumer whose condition is never met cannot keep a
-- satisfiable one out of a pass with a small limit (round robin, no starvation).
CREATE TABLE IF NOT EXISTS {{ns}}.dag_lock (
    dag_id            VARCHAR(250) NOT NULL,
    last_run_seq      BIGINT NOT NULL DEFAULT 0,
    last_scheduled_at DATETIME(6) NULL,
    PRIMARY KEY (dag_id),
    CONSTRAINT dag_lock_dag_id_fkey FOREIGN KEY (dag_id)
        REFERENCES {{ns}}.dag (dag_id) ON DELETE CASCADE
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

-- Which consumers an event of an asset fans out to. Keyed by asset first: that is the
-- lookup the fan-out trigger does for every event.
CREATE TABLE IF NOT EXISTS {{ns}}.dag_schedule_asset_reference (
    asset_id    BIGINT NOT NULL,
    dag_id      VARCHAR(250) NOT NULL,
    created_at  DATETIME(6) NOT NULL DEFAULT (UTC_TIMESTAMP(6)),
    PRIMARY KEY (asset_id, dag_id),
    KEY dag_schedule_asset_reference_dag_idx (dag_id),
    CONSTRAINT dag_schedule_asset_reference_asset_id_fkey FOREIGN KEY (asset_id)
        REFERENCES {{ns}}.asset (id),
    CONSTRAINT dag_schedule_asset_reference_dag_id_fkey FOREIGN KEY (dag_id)
        REFERENCES {{ns}}.dag (dag_id) ON DELETE CASCADE
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

-- The compiled condition in conjunctive normal form: clause k of a consumer is the set of
-- assets whose rows have the same clause_no. The condition holds when every clause has at
-- least one asset among the claimed queue rows. Assets are never cascaded away from a clause
-- (no ON DELETE CASCADE): dropping an asset from an AND would make the condition fire early.
CREATE TABLE IF NOT EXISTS {{ns}}.dag_condition_clause (
    dag_id      VARCHAR(250) NOT NULL,
    clause_no   INT NOT NULL,
    asset_id    BIGINT NOT NULL,
    PRIMARY KEY (dag_id, clause_no, asset_id),
    KEY dag_condition_clause_asset_idx (asset_id),
    CONSTRAINT dag_condition_clause_dag_id_fkey FOREIGN KEY (dag_id)
        REFERENCES {{ns}}.dag (dag_id) ON DELETE CASCADE,
    CONSTRAINT dag_condition_clause_asset_id_fkey FOREIGN KEY (asset_id)
        REFERENCES {{ns}}.asset (id)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

CREATE TABLE IF NOT EXISTS {{ns}}.asset_event (
    id                BIGINT NOT NULL AUTO_INCREMENT,
    asset_id          BIGINT NOT NULL,
    extra             JSON NOT NULL DEFAULT (JSON_OBJECT()),
    source_dag_id     VARCHAR(250) NULL,
    source_task_id    VARCHAR(250) NULL,
    source_run_id     VARCHAR(250) NULL,
    source_map_index  INT NOT NULL DEFAULT -1,
    idempotency_key   VARCHAR(200) NULL,
    -- Not commit order (neither is any clock); the scheduler never relies on it (I3).
    `timestamp`       DATETIME(6) NOT NULL DEFAULT (UTC_TIMESTAMP(6)),
    PRIMARY KEY (id),
    -- Also the index that serves lookups and foreign-key checks by asset_id. NULL keys never
    -- conflict, as on PostgreSQL.
    CONSTRAINT asset_event_idempotency_key UNIQUE (asset_id, idempotency_key),
    CONSTRAINT asset_event_asset_id_fkey FOREIGN KEY (asset_id) REFERENCES {{ns}}.asset (id),
    CONSTRAINT asset_event_extra_is_object CHECK (JSON_TYPE(extra) = 'OBJECT'),
    CONSTRAINT asset_event_idempotency_key_not_empty CHECK (CHAR_LENGTH(idempotency_key) > 0)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

-- One row per (consumer, event) not yet consumed. created_at is the event's own timestamp,
-- copied by the trigger (I2). An event with queue rows cannot be deleted (no cascade from
-- asset_event): a queued event is never lost to a purge.
CREATE TABLE IF NOT EXISTS {{ns}}.asset_dag_run_queue (
    target_dag_id   VARCHAR(250) NOT NULL,
    asset_event_id  BIGINT NOT NULL,
    asset_id        BIGINT NOT NULL,
    created_at      DATETIME(6) NOT NULL,
    PRIMARY KEY (target_dag_id, asset_event_id),
    -- InnoDB needs an index on every foreign key; named here instead of generated.
    KEY asset_dag_run_queue_event_idx (asset_event_id),
    CONSTRAINT asset_dag_run_queue_target_dag_id_fkey FOREIGN KEY (target_dag_id)
        REFERENCES {{ns}}.dag (dag_id) ON DELETE CASCADE,
    CONSTRAINT asset_dag_run_queue_asset_event_id_fkey FOREIGN KEY (asset_event_id)
        REFERENCES {{ns}}.asset_event (id)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

CREATE TABLE IF NOT EXISTS {{ns}}.dag_run (
    id          BIGINT NOT NULL AUTO_INCREMENT,
    dag_id      VARCHAR(250) NOT NULL,
    run_id      VARCHAR(250) NOT NULL,
    seq         BIGINT NOT NULL,
    run_type    VARCHAR(50) NOT NULL DEFAULT 'asset_triggered',
    run_after   DATETIME(6) NOT NULL,
    state       VARCHAR(20) NOT NULL DEFAULT 'queued',
    created_at  DATETIME(6) NOT NULL DEFAULT (UTC_TIMESTAMP(6)),
    PRIMARY KEY (id),
    CONSTRAINT dag_run_run_id_key UNIQUE (dag_id, run_id),
    CONSTRAINT dag_run_seq_key UNIQUE (dag_id, seq),
    -- Target of the link table's composite foreign key: a link's dag_id is its run's dag_id.
    CONSTRAINT dag_run_id_dag_key UNIQUE (id, dag_id),
    CONSTRAINT dag_run_dag_id_fkey FOREIGN KEY (dag_id)
        REFERENCES {{ns}}.dag (dag_id) ON DELETE CASCADE,
    CONSTRAINT dag_run_type_check CHECK (run_type IN ('asset_triggered')),
    CONSTRAINT dag_run_state_check CHECK (state IN ('queued', 'running', 'success', 'failed'))
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

-- Which events a run consumed. The unique (dag_id, asset_event_id) is the exactly-once
-- guarantee written into the schema (I4): even a scheduler bug cannot link an event to two
-- runs of one consumer.
CREATE TABLE IF NOT EXISTS {{ns}}.dagrun_asset_event (
    dag_run_id      BIGINT NOT NULL,
    asset_event_id  BIGINT NOT NULL,
    dag_id          VARCHAR(250) NOT NULL,
    PRIMARY KEY (dag_run_id, asset_event_id),
    CONSTRAINT dagrun_asset_event_once UNIQUE (dag_id, asset_event_id),
    KEY dagrun_asset_event_event_idx (asset_event_id),
    KEY dagrun_asset_event_run_idx (dag_run_id, dag_id),
    CONSTRAINT dagrun_asset_event_asset_event_id_fkey FOREIGN KEY (asset_event_id)
        REFERENCES {{ns}}.asset_event (id) ON DELETE CASCADE,
    CONSTRAINT dagrun_asset_event_run_fkey FOREIGN KEY (dag_run_id, dag_id)
        REFERENCES {{ns}}.dag_run (id, dag_id) ON DELETE CASCADE
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;


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

-- Every consumer gets its lock row in the statement that creates it, however it is created.
DROP TRIGGER IF EXISTS {{ns}}.dag_add_lock_row;
CREATE TRIGGER {{ns}}.dag_add_lock_row
    AFTER INSERT ON {{ns}}.dag
    FOR EACH ROW
    INSERT INTO {{ns}}.dag_lock (dag_id) VALUES (NEW.dag_id);


-- Routines. Errors are SIGNALed with SQLSTATE 45000 and a message that starts with assetq's
-- code in brackets ("[AQ001] unknown asset 'x'"): the Python layer maps the code to the same
-- exception as on PostgreSQL. Messages are cut to 128 characters, MySQL's limit for
-- MESSAGE_TEXT. Parameters and variables name their character set and collation: they would
-- otherwise take the database's defaults, which in a user's own database may be latin1.
--
-- MySQL 8 / MariaDB: procedures, not stored functions. With binary logging on (MySQL 8's
-- default) creating a function needs SUPER or log_bin_trust_function_creators; procedures
-- do not. So resolve_asset returns its id through an OUT parameter.
--
-- No routine starts or ends a transaction: START TRANSACTION inside a procedure would silently
-- commit the caller's work. After an error, a procedure's earlier statements are still in the
-- caller's transaction: callers roll back (the Python layer always does).

DELIMITER $$

-- Looks an asset up by name, then by uri. Raises AQ001 when neither matches.
DROP PROCEDURE IF EXISTS {{ns}}.resolve_asset $$
CREATE PROCEDURE {{ns}}.resolve_asset(
    IN  p_asset    TEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin,
    OUT p_asset_id BIGINT
)
READS SQL DATA
BEGIN
    DECLARE v_message VARCHAR(128) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin;
    SET p_asset_id = NULL;
    SELECT a.id INTO p_asset_id FROM {{ns}}.asset a WHERE a.name = p_asset;
    IF p_asset_id IS NULL THEN
        SELECT a.id INTO p_asset_id FROM {{ns}}.asset a WHERE a.uri = p_asset;
        IF p_asset_id IS NULL THEN
            SET v_message = LEFT(CONCAT('[AQ001] unknown asset ', QUOTE(LEFT(p_asset, 64)),
                                        ': declare it first (assetq.declare_asset)'), 128);
            SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = v_message;
        END IF;
    END IF;
END $$


-- Registers one event in the caller's transaction and returns it as one result set
-- (event_id, asset_id, event_timestamp, created), in one round trip. With an idempotency key,
-- a retry (same asset, same key) returns the original event with created = 0 and queues
-- nothing; the same key with a different extra raises AQ005.
DROP PROCEDURE IF EXISTS {{ns}}.register_event $$
CREATE PROCEDURE {{ns}}.register_event(
    IN p_asset            TEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin,
    IN p_extra            JSON,
    IN p_source_dag_id    TEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin,
    IN p_source_task_id   TEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin,
    IN p_source_run_id    TEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin,
    IN p_source_map_index INT,
    IN p_idempotency_key  TEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin
)
MODIFIES SQL DATA
BEGIN
    DECLARE v_asset_id  BIGINT;
    DECLARE v_event_id  BIGINT;
    DECLARE v_timestamp DATETIME(6);
    DECLARE v_extra     JSON DEFAULT COALESCE(p_extra, JSON_OBJECT());
    DECLARE v_old_extra JSON;
    DECLARE v_duplicate BOOLEAN DEFAULT FALSE;
    DECLARE v_kind      VARCHAR(32) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin;
    DECLARE v_message   VARCHAR(128) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin;

    -- MySQL 8 / MariaDB: MySQL rejects invalid JSON text when it binds a JSON parameter
    -- (error 3140); MariaDB's JSON is text and accepts anything, hence JSON_VALID first. A
    -- CASE, not OR: JSON_TYPE of invalid text is an error in a strict-mode routine, and OR
    -- does not promise to stop at its first true operand.
    SET v_kind = CASE WHEN JSON_VALID(v_extra) THEN JSON_TYPE(v_extra) ELSE 'invalid JSON' END;
    IF v_kind <> 'OBJECT' THEN
        SET v_message = CONCAT('[AQ002] event extra must be a JSON object, got ', v_kind);
        SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = v_message;
    END IF;
    -- The usual case, a name, inline: a nested CALL costs more than the lookup.
    SELECT a.id INTO v_asset_id FROM {{ns}}.asset a WHERE a.name = p_asset;
    IF v_asset_id IS NULL THEN
        CALL {{ns}}.resolve_asset(p_asset, v_asset_id);  -- by uri, or AQ001
    END IF;
    SET v_timestamp = UTC_TIMESTAMP(6);

    -- Insert first, look up only on a duplicate key: no read-then-insert race, and no lock on
    -- a missing key. A handler for 1062 (duplicate key) alone, not INSERT IGNORE, which would
    -- also turn a foreign-key or check failure into a silent warning. The duplicate check
    -- waits for a concurrent registration with the same key to commit or roll back, like
    -- PostgreSQL's ON CONFLICT; the failed INSERT is undone, the transaction goes on.
    -- MySQL 8 / MariaDB: no RETURNING on MySQL; the new id comes from LAST_INSERT_ID().
    BEGIN
        DECLARE CONTINUE HANDLER FOR 1062 SET v_duplicate = TRUE;
        INSERT INTO {{ns}}.asset_event
               (asset_id, extra, source_dag_id, source_task_id, source_run_id,
                source_map_index, idempotency_key, `timestamp`)
        VALUES (v_asset_id, v_extra, p_source_dag_id, p_source_task_id, p_source_run_id,
                COALESCE(p_source_map_index, -1), p_idempotency_key, v_timestamp);
    END;

    IF v_duplicate THEN
        -- A locking read: at REPEATABLE READ the caller's snapshot may be older than the
        -- original's commit, and a plain read would not see it.
        -- MySQL 8 / MariaDB: FOR SHARE is MySQL-only; LOCK IN SHARE MODE works on both.
        SELECT e.id, e.`timestamp`, e.extra INTO v_event_id, v_timestamp, v_old_extra
          FROM {{ns}}.asset_event e
         WHERE e.asset_id = v_asset_id AND e.idempotency_key = p_idempotency_key
          LOCK IN SHARE MODE;
        -- MySQL 8 / MariaDB: JSON_EQUALS is MariaDB-only. JSON_EXTRACT(x, '$') is a
        -- normalized JSON value on both: MySQL compares two of them as JSON (key order and
        -- whitespace ignored); MariaDB re-serializes the text (whitespace ignored, key order
        -- kept). assetq's Python sends keys sorted, so its retries compare equal on both; a
        -- raw caller that reorders keys gets AQ005 on MariaDB, never a silent merge.
        IF NOT (JSON_EXTRACT(v_old_extra, '$') <=> JSON_EXTRACT(v_extra, '$')) THEN
            SET v_message = LEFT(CONCAT('[AQ005] idempotency key ', QUOTE(LEFT(p_idempotency_key, 40)),
                                        ' was already used for event ', v_event_id,
                                        ' of this asset with a different extra'), 128);
            SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = v_message;
        END IF;
        SELECT v_event_id AS event_id, v_asset_id AS asset_id,
               v_timestamp AS event_timestamp, FALSE AS created;
    ELSE
        SELECT LAST_INSERT_ID() AS event_id, v_asset_id AS asset_id,
               v_timestamp AS event_timestamp, TRUE AS created;
    END IF;
END $$



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


-- Pauses or unpauses a consumer. Events that commit while it is paused are not queued for it.
-- Returns no result set.
DROP PROCEDURE IF EXISTS {{ns}}.set_dag_paused $$
CREATE PROCEDURE {{ns}}.set_dag_paused(
    IN p_dag_id TEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin,
    IN p_paused BOOLEAN
)
MODIFIES SQL DATA
BEGIN
    DECLARE v_found   BIGINT;
    DECLARE v_message VARCHAR(128) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin;
    -- The lock row first, as declare_dag does; a locking read also sees a consumer created
    -- after the caller's snapshot. Not ROW_COUNT() of the UPDATE: with the CLIENT_FOUND_ROWS
    -- flag (SQLAlchemy sets it) it counts matched rows, without it changed rows.
    SELECT COUNT(*) INTO v_found FROM {{ns}}.dag_lock l WHERE l.dag_id = p_dag_id FOR UPDATE;
    IF v_found = 0 THEN
        SET v_message = LEFT(CONCAT('[AQ003] unknown dag ', COALESCE(QUOTE(LEFT(p_dag_id, 64)), 'NULL')), 128);
        SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = v_message;
    END IF;
    UPDATE {{ns}}.dag SET is_paused = p_paused, updated_at = UTC_TIMESTAMP(6)
     WHERE dag_id = p_dag_id;
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

SET SESSION sql_mode = @assetq_saved_sql_mode;


-- Operations (migration 0003_operations): the dag_queue_status view, retention
-- (purge_runs, purge_events) and least privilege (grant_access, revoke_access).

SET @assetq_saved_sql_mode = @@SESSION.sql_mode,
    SESSION sql_mode = 'STRICT_TRANS_TABLES,STRICT_ALL_TABLES,NO_ZERO_IN_DATE,NO_ZERO_DATE,ERROR_FOR_DIVISION_BY_ZERO,NO_ENGINE_SUBSTITUTION';

DELIMITER $$

-- Indexes for retention and status. Each is read by key or by a short range, so purge and
-- status cost what they delete or show, never a scan of the history. (The queue's index by
-- event, which the foreign-key check of a purged event needs, exists since 0001: InnoDB
-- needs one for every foreign key.)
--   asset_event_timestamp_idx  events by age, in the (timestamp, id) order of purge_events
--   dag_run_created_idx        runs by age, for purge_runs
--   dag_run_dag_created_idx    runs of a consumer by age, for dag_queue_status
-- MySQL 8 / MariaDB: CREATE INDEX IF NOT EXISTS is MariaDB-only, so a helper adds each index
-- unless information_schema already lists it, and is dropped again.
DROP PROCEDURE IF EXISTS {{ns}}._assetq_add_index $$
CREATE PROCEDURE {{ns}}._assetq_add_index(
    IN p_table TEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin,
    IN p_index TEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin,
    IN p_columns TEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin
)
MODIFIES SQL DATA
SQL SECURITY INVOKER
BEGIN
    IF NOT EXISTS (SELECT 1 FROM information_schema.STATISTICS s
                    WHERE s.TABLE_SCHEMA = DATABASE() AND s.TABLE_NAME = p_table
                      AND s.INDEX_NAME = p_index) THEN
        -- Inside a routine DATABASE() is the routine's own database: the namespace.
        SET @assetq_ddl = CONCAT('ALTER TABLE `', DATABASE(), '`.`', p_table,
                                 '` ADD INDEX `', p_index, '` (', p_columns, ')');
        PREPARE assetq_ddl FROM @assetq_ddl;
        EXECUTE assetq_ddl;
        DEALLOCATE PREPARE assetq_ddl;
    END IF;
END $$

DELIMITER ;

CALL {{ns}}._assetq_add_index('asset_event', 'asset_event_timestamp_idx', '`timestamp`, id');
CALL {{ns}}._assetq_add_index('dag_run', 'dag_run_created_idx', 'created_at');
CALL {{ns}}._assetq_add_index('dag_run', 'dag_run_dag_created_idx', 'dag_id, created_at');
DROP PROCEDURE IF EXISTS {{ns}}._assetq_add_index;


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

-- Retention, step 1: deletes at most p_batch_size runs created before p_older_than, oldest
-- first, with their links (ON DELETE CASCADE). Returns one result set (deleted). Run each
-- batch at READ COMMITTED in a short transaction of its own (assetq.purge does). A run locked
-- by someone else is skipped, not waited for (SKIP LOCKED), and left for a later batch.
DROP PROCEDURE IF EXISTS {{ns}}.purge_runs $$
CREATE PROCEDURE {{ns}}.purge_runs(IN p_older_than DATETIME(6), IN p_batch_size INT)
MODIFIES SQL DATA
BEGIN
    DECLARE v_deleted BIGINT;
    DECLARE v_message VARCHAR(128) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin;
    IF p_older_than IS NULL OR p_batch_size IS NULL OR p_batch_size < 1 THEN
        SET v_message = '[AQ002] purge_runs needs a cutoff and a positive batch size';
        SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = v_message;
    END IF;
    DROP TEMPORARY TABLE IF EXISTS {{ns}}._assetq_purge;
    CREATE TEMPORARY TABLE {{ns}}._assetq_purge (
        id BIGINT NOT NULL PRIMARY KEY
    ) ENGINE = InnoDB;
    -- Lock the batch first (nobody else locks old runs: this never waits), then delete it
    -- by key. MySQL 8 / MariaDB: a DELETE cannot read its own table in a subquery.
    INSERT INTO {{ns}}._assetq_purge (id)
    SELECT r.id
      FROM {{ns}}.dag_run r
     WHERE r.created_at < p_older_than
     ORDER BY r.created_at
     LIMIT p_batch_size
       FOR UPDATE SKIP LOCKED;
    SELECT COUNT(*) INTO v_deleted FROM {{ns}}._assetq_purge;
    DELETE r
      FROM {{ns}}._assetq_purge k
      STRAIGHT_JOIN {{ns}}.dag_run r ON r.id = k.id;
    DROP TEMPORARY TABLE IF EXISTS {{ns}}._assetq_purge;
    SELECT v_deleted AS deleted;
END $$


-- Retention, step 2: examines the next p_batch_size events whose timestamp is before
-- p_older_than, in (timestamp, id) order after the cursor (p_after_timestamp, p_after_id;
-- NULL: from the start), and deletes those that are consumed: no queue row (nobody still
-- waits for them) and no link (the runs that consumed them were purged, or there were none).
-- Returns one result set (deleted, examined, last_timestamp, last_id): the cursor for the
-- next batch; fewer examined than p_batch_size means the end. The cursor moves past events
-- it keeps, so a long-queued event is examined once per purge, not once per batch.
--
-- Never deletes a queued event: the test below, and behind it the foreign key from
-- asset_dag_run_queue, which has no cascade: deleting a queued event fails (1451) and the
-- caller rolls the batch back. Run it at READ COMMITTED (assetq.purge does): the window and
-- the test are plain reads (INSERT ... SELECT reads without locks at READ COMMITTED); only
-- the events that passed the test are then locked, SKIP LOCKED, so the batch never waits
-- for a producer or a scheduler and never locks an event a scheduler is consuming
-- (tests/test_purge.py holds a batch open and runs both meanwhile).
DROP PROCEDURE IF EXISTS {{ns}}.purge_events $$
CREATE PROCEDURE {{ns}}.purge_events(
    IN p_older_than      DATETIME(6),
    IN p_batch_size      INT,
    IN p_after_timestamp DATETIME(6),
    IN p_after_id        BIGINT
)
MODIFIES SQL DATA
BEGIN
    DECLARE v_after_ts   DATETIME(6) DEFAULT COALESCE(p_after_timestamp, '1000-01-01 00:00:00');
    DECLARE v_after_id   BIGINT DEFAULT COALESCE(p_after_id, 0);
    DECLARE v_examined   BIGINT;
    DECLARE v_deleted    BIGINT DEFAULT 0;
    DECLARE v_last_ts    DATETIME(6) DEFAULT p_after_timestamp;
    DECLARE v_last_id    BIGINT DEFAULT p_after_id;
    DECLARE v_message    VARCHAR(128) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin;
    IF p_older_than IS NULL OR p_batch_size IS NULL OR p_batch_size < 1 THEN
        SET v_message = '[AQ002] purge_events needs a cutoff and a positive batch size';
        SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = v_message;
    END IF;
    DROP TEMPORARY TABLE IF EXISTS {{ns}}._assetq_purge_window, {{ns}}._assetq_purge_candidate,
                                   {{ns}}._assetq_purge;
    CREATE TEMPORARY TABLE {{ns}}._assetq_purge_window (
        id BIGINT NOT NULL PRIMARY KEY,
        ts DATETIME(6) NOT NULL
    ) ENGINE = InnoDB;
    CREATE TEMPORARY TABLE {{ns}}._assetq_purge_candidate (
        id BIGINT NOT NULL PRIMARY KEY
    ) ENGINE = InnoDB;
    CREATE TEMPORARY TABLE {{ns}}._assetq_purge (
        id BIGINT NOT NULL PRIMARY KEY
    ) ENGINE = InnoDB;

    -- The window. MySQL 8 / MariaDB: the row comparison (a, b) > (x, y) is spelled out, the
    -- form both optimizers turn into a range of the (timestamp, id) index.
    INSERT INTO {{ns}}._assetq_purge_window (id, ts)
    SELECT e.id, e.`timestamp`
      FROM {{ns}}.asset_event e
     WHERE e.`timestamp` < p_older_than
       AND (e.`timestamp` > v_after_ts OR (e.`timestamp` = v_after_ts AND e.id > v_after_id))
     ORDER BY e.`timestamp`, e.id
     LIMIT p_batch_size;
    SELECT COUNT(*) INTO v_examined FROM {{ns}}._assetq_purge_window;

    IF v_examined > 0 THEN
        SELECT w.ts, w.id INTO v_last_ts, v_last_id
          FROM {{ns}}._assetq_purge_window w ORDER BY w.ts DESC, w.id DESC LIMIT 1;
        INSERT INTO {{ns}}._assetq_purge_candidate (id)
        SELECT w.id
          FROM {{ns}}._assetq_purge_window w
         WHERE NOT EXISTS (SELECT 1 FROM {{ns}}.asset_dag_run_queue q
                            WHERE q.asset_event_id = w.id)
           AND NOT EXISTS (SELECT 1 FROM {{ns}}.dagrun_asset_event l
                            WHERE l.asset_event_id = w.id);
        INSERT INTO {{ns}}._assetq_purge (id)
        SELECT e.id
          FROM {{ns}}._assetq_purge_candidate c
          STRAIGHT_JOIN {{ns}}.asset_event e ON e.id = c.id
           FOR UPDATE SKIP LOCKED;
        -- By key, without testing again: a DELETE reads other tables with locking reads,
        -- and the test would wait on every producer's uncommitted queue row it scans. No
        -- test is needed: while we hold an event, nobody can make a row refer to it (that
        -- takes a shared lock on it), and before, only a raw INSERT could have (queue rows
        -- are written with their event, links with the deletion of the queue row, both
        -- seen by the one snapshot of the test). Such a queue row makes the foreign key
        -- refuse the DELETE (1451): the batch rolls back and its retry keeps the event.
        DELETE e
          FROM {{ns}}._assetq_purge k
          STRAIGHT_JOIN {{ns}}.asset_event e ON e.id = k.id;
        SET v_deleted = ROW_COUNT();
    END IF;
    DROP TEMPORARY TABLE IF EXISTS {{ns}}._assetq_purge_window, {{ns}}._assetq_purge_candidate,
                                   {{ns}}._assetq_purge;
    SELECT v_deleted AS deleted, v_examined AS examined,
           v_last_ts AS last_timestamp, v_last_id AS last_id;
END $$


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

SET SESSION sql_mode = @assetq_saved_sql_mode;
