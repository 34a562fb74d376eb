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
