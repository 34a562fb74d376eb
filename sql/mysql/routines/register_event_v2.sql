-- Registers one event in the caller's transaction and returns it as one result set
-- (event_id, asset_id, event_timestamp, created, error_code, error_message), in one round
-- trip. With an idempotency key, a retry (same asset, same key) returns the original event
-- with created = 0 and queues nothing; the same key with a different extra raises AQ005.
--
-- The same name, parameters and result columns as PostgreSQL's register_event_v2, which
-- reports its errors in error_code and error_message because a raised error aborts the
-- caller's transaction there. Here an error is raised (error_code and error_message are always
-- NULL): it undoes the failed statement only, and the one statement that writes is the
-- INSERT (its fan-out trigger inside it), so a failed call leaves the caller's transaction as
-- it was without a savepoint (tests/test_savepoints.py). register_event, 0.1.0's, calls this.
DELIMITER $$
DROP PROCEDURE IF EXISTS {{ns}}.register_event_v2
$$
CREATE PROCEDURE {{ns}}.register_event_v2(
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
    DECLARE v_locked    BIGINT;
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
    -- The usual case, a name, inline: a nested CALL costs more than the lookup. A locking
    -- read (MySQL 8 / MariaDB: LOCK IN SHARE MODE works on both): it waits for a delete_asset
    -- that holds the row and then finds it gone (AQ001 below). MySQL 9.7 checks foreign keys
    -- in its SQL layer (innodb_native_foreign_keys = OFF), and an INSERT that had waited for
    -- the deleter went in after its commit, an event of an asset that no longer exists
    -- (tests/test_semantics_lifecycle.py); the shared lock is the one InnoDB's own check took.
    SELECT a.id INTO v_asset_id FROM {{ns}}.asset a WHERE a.name = p_asset LOCK IN SHARE MODE;
    IF v_asset_id IS NULL THEN
        CALL {{ns}}.resolve_asset(p_asset, v_asset_id);  -- by uri, or AQ001
        -- The row found by its uri, locked the same way by its primary key (a plain read
        -- first: a locking read that misses would leave a gap lock on the uri index).
        SET v_locked = NULL;
        SELECT a.id INTO v_locked FROM {{ns}}.asset a WHERE a.id = v_asset_id LOCK IN SHARE MODE;
        IF v_locked IS NULL THEN
            SET v_message = LEFT(CONCAT('[AQ001] unknown asset ', QUOTE(LEFT(p_asset, 64)),
                                        ': it was deleted meanwhile'), 128);
            SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = v_message;
        END IF;
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
               v_timestamp AS event_timestamp, FALSE AS created,
               NULL AS error_code, NULL AS error_message;
    ELSE
        SELECT LAST_INSERT_ID() AS event_id, v_asset_id AS asset_id,
               v_timestamp AS event_timestamp, TRUE AS created,
               NULL AS error_code, NULL AS error_message;
    END IF;
END
$$
DELIMITER ;
