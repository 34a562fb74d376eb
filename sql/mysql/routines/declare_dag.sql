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
-- Retries: a run gets p_max_attempts claims (1 to 1000; NULL: 1);
-- after a failed attempt with attempts left it is claimable again p_retry_delay_seconds
-- later (0 to 604800; NULL: 0), doubled for each further failed attempt up to
-- p_max_retry_delay_seconds when that is set (above 0, at least the delay, at most 604800).
-- Anything else raises AQ002.
--
-- The whole replacement happens in the caller's transaction, under the consumer's lock row: a
-- scheduler pass sees the old condition or the new one, never a mix. The rows the fan-out
-- reads are changed in the order it reads them: references, then alias clauses, each in
-- key order, only those that change; the dag row last. A producer in flight for the consumer
-- then either finishes first or waits for the caller's commit, and neither deadlocks with the
-- declaration. (A producer transaction that registers events of several of the consumer's
-- assets can still deadlock with it, at REPEATABLE READ: error 1213, rolled back whole, safe
-- to retry.)
DELIMITER $$
DROP PROCEDURE IF EXISTS {{ns}}.declare_dag
$$
CREATE PROCEDURE {{ns}}.declare_dag(
    IN p_dag_id             TEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin,
    IN p_condition          JSON,
    IN p_clauses            JSON,
    IN p_paused             BOOLEAN,
    IN p_max_active_runs    INT,
    IN p_max_events_per_run INT,
    IN p_queue_while_paused BOOLEAN,
    IN p_max_attempts       INT,
    IN p_retry_delay_seconds     DOUBLE,
    IN p_max_retry_delay_seconds DOUBLE
)
MODIFIES SQL DATA
BEGIN
    DECLARE v_bad     BIGINT;
    DECLARE v_exists  BIGINT;
    DECLARE v_partitioned BOOLEAN;
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
    -- Retries: NULL means the default, one attempt and no delay.
    IF p_max_attempts < 1 OR p_max_attempts > 1000
       OR NOT (COALESCE(p_retry_delay_seconds, 0) >= 0 AND COALESCE(p_retry_delay_seconds, 0) <= 604800)
       OR NOT (COALESCE(p_max_retry_delay_seconds, 1) > 0 AND COALESCE(p_max_retry_delay_seconds, 1) <= 604800)
       OR p_max_retry_delay_seconds < p_retry_delay_seconds
    THEN
        SET v_message = LEFT(CONCAT('[AQ002] max_attempts must be 1 to 1000, retry_delay 0 to 604800 s and',
                                    ' max_retry_delay above 0, at least retry_delay and at most 604800 s; got ',
                                    COALESCE(p_max_attempts, 'NULL'), ', ',
                                    COALESCE(p_retry_delay_seconds, 'NULL'), ' and ',
                                    COALESCE(p_max_retry_delay_seconds, 'NULL')), 128);
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
                                max_events_per_run, queue_while_paused, max_attempts,
                                retry_delay_seconds, max_retry_delay_seconds)
        VALUES (p_dag_id, p_condition, COALESCE(p_paused, FALSE), p_max_active_runs,
                p_max_events_per_run, COALESCE(p_queue_while_paused, FALSE),
                COALESCE(p_max_attempts, 1), COALESCE(p_retry_delay_seconds, 0),
                p_max_retry_delay_seconds)
        ON DUPLICATE KEY UPDATE `condition` = p_condition,
                                is_paused = COALESCE(p_paused, is_paused),
                                max_active_runs = p_max_active_runs,
                                max_events_per_run = p_max_events_per_run,
                                queue_while_paused = COALESCE(p_queue_while_paused, FALSE),
                                max_attempts = COALESCE(p_max_attempts, 1),
                                retry_delay_seconds = COALESCE(p_retry_delay_seconds, 0),
                                max_retry_delay_seconds = p_max_retry_delay_seconds,
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
            -- A new asset of a partitioned consumer maps by identity until set_dag_partitions
            -- says otherwise: its events are never queued
            -- without a key. A plain read: this declaration holds the consumer's lock row.
            SET v_partitioned = FALSE;
            SELECT d.partitioning IS NOT NULL INTO v_partitioned
              FROM {{ns}}.dag d WHERE d.dag_id = p_dag_id;
            INSERT INTO {{ns}}.dag_schedule_asset_reference
                   (asset_id, dag_id, partition_mapping, partition_require)
            VALUES (v_id, p_dag_id, IF(v_partitioned, 'identity', NULL), IF(v_partitioned, 'any', NULL));
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
               max_attempts = COALESCE(p_max_attempts, 1),
               retry_delay_seconds = COALESCE(p_retry_delay_seconds, 0),
               max_retry_delay_seconds = p_max_retry_delay_seconds,
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
        -- And their partition rows.
        DELETE p
          FROM {{ns}}.asset_partition_queue p
          LEFT JOIN {{ns}}.asset_dag_run_queue q
                 ON q.target_dag_id = p.target_dag_id AND q.asset_event_id = p.asset_event_id
         WHERE p.target_dag_id = p_dag_id AND q.asset_event_id IS NULL;
    END IF;
END
$$
DELIMITER ;
