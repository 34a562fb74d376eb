-- Sets the partitioning of consumer p_dag_id, as PostgreSQL's
-- set_dag_partitions does (see there for p_partitions); the Python layer calls it right after
-- declare_dag, in the same transaction. The consumer's lock row is taken first, as a pass
-- takes it. The same partitioning for the same condition as before writes nothing. Otherwise
-- the dag row is locked FOR UPDATE, which waits for the producers in flight (they hold a
-- shared lock on it) and holds new ones back until the caller commits; its reference rows get
-- their mappings, and its queued events are mapped again (AQ011 if one cannot be), each key
-- evaluated afresh by the next pass. AQ002 for a malformed item, an asset that is not in the
-- condition or an asset named twice; AQ003 for an unknown consumer.
DELIMITER $$
DROP PROCEDURE IF EXISTS {{ns}}.set_dag_partitions
$$
CREATE PROCEDURE {{ns}}.set_dag_partitions(
    IN p_dag_id     TEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin,
    IN p_partitions JSON
)
MODIFIES SQL DATA
BEGIN
    DECLARE v_exists    BIGINT;
    DECLARE v_bad       BIGINT;
    DECLARE v_condition JSON;
    DECLARE v_old       JSON;
    DECLARE v_new       JSON;
    DECLARE v_cap       INT;
    DECLARE v_kind      VARCHAR(32) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin;
    DECLARE v_name      VARCHAR(1024) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin;
    DECLARE v_asset_id  BIGINT;
    DECLARE v_message   VARCHAR(128) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin;

    CALL {{ns}}.lock_dag(p_dag_id);  -- its lock row, or AQ003
    SELECT d.`condition`, d.partitioning, d.max_events_per_run INTO v_condition, v_old, v_cap
      FROM {{ns}}.dag d WHERE d.dag_id = p_dag_id;

    DROP TEMPORARY TABLE IF EXISTS {{ns}}._assetq_partition_spec;
    CREATE TEMPORARY TABLE {{ns}}._assetq_partition_spec (
        ord         INT NOT NULL PRIMARY KEY,
        item_type   VARCHAR(32) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL,
        asset_type  VARCHAR(32) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL,
        asset       VARCHAR(1024) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL,
        mapping     VARCHAR(32) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL,
        requirement VARCHAR(32) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL,
        static_keys LONGTEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL,
        asset_id    BIGINT NULL,
        KEY (asset_id)
    ) ENGINE = InnoDB;
    IF p_partitions IS NOT NULL THEN
        SET v_kind = 'invalid JSON';
        IF JSON_VALID(p_partitions) THEN
            SET v_kind = JSON_TYPE(p_partitions);
        END IF;
        IF v_kind <> 'OBJECT' OR COALESCE(JSON_TYPE(JSON_EXTRACT(p_partitions, '$.assets')), 'ARRAY') <> 'ARRAY' THEN
            SET v_message = LEFT(CONCAT('[AQ002] partitions of dag ', p_dag_id,
                                        ' must be NULL or {"assets": [...]}'), 128);
            SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = v_message;
        END IF;
        INSERT INTO {{ns}}._assetq_partition_spec
               (ord, item_type, asset_type, asset, mapping, requirement, static_keys)
        SELECT j.ord, JSON_TYPE(j.item), JSON_TYPE(j.asset_json), j.asset, j.mapping,
               IF(j.mapping = 'identity', 'any', COALESCE(j.requirement, 'all')),
               CASE WHEN j.static_keys IS NULL OR JSON_TYPE(j.static_keys) = 'NULL' THEN NULL
                    ELSE j.static_keys END
          FROM JSON_TABLE(p_partitions, '$.assets[*]' COLUMNS (
                   ord         FOR ORDINALITY,
                   item        JSON PATH '$',
                   asset_json  JSON PATH '$.asset',
                   asset       VARCHAR(1024) PATH '$.asset',
                   mapping     VARCHAR(32) PATH '$.mapping',
                   requirement VARCHAR(32) PATH '$.require',
                   static_keys JSON PATH '$.keys')) AS j;
        SET v_bad = NULL;
        SELECT MIN(x.ord) INTO v_bad
          FROM {{ns}}._assetq_partition_spec x
         WHERE x.item_type <> 'OBJECT' OR COALESCE(x.asset_type, '') <> 'STRING'
            OR COALESCE(x.mapping, '') NOT IN ('identity', 'hour_to_day', 'day_to_week', 'day_to_month', 'static')
            OR x.requirement NOT IN ('all', 'any')
            OR (x.mapping = 'static') <> (COALESCE(JSON_TYPE(x.static_keys), '') = 'ARRAY')
            OR (x.mapping = 'static' AND JSON_LENGTH(x.static_keys) = 0);
        IF v_bad IS NULL THEN
            SELECT MIN(x.ord) INTO v_bad
              FROM {{ns}}._assetq_partition_spec x,
                   JSON_TABLE(x.static_keys, '$[*]' COLUMNS (
                       pair     JSON PATH '$',
                       up_json  JSON PATH '$[0]',
                       to_json  JSON PATH '$[1]',
                       upstream VARCHAR(1024) PATH '$[0]',
                       target   VARCHAR(1024) PATH '$[1]')) AS k
             WHERE x.mapping = 'static'
               AND (COALESCE(JSON_TYPE(k.pair), '') <> 'ARRAY' OR JSON_LENGTH(k.pair) <> 2
                    OR COALESCE(JSON_TYPE(k.up_json), '') <> 'STRING'
                    OR COALESCE(JSON_TYPE(k.to_json), '') <> 'STRING'
                    OR CHAR_LENGTH(k.upstream) NOT BETWEEN 1 AND 250
                    OR CHAR_LENGTH(k.target) NOT BETWEEN 1 AND 250
                    OR CHAR_LENGTH(k.upstream) <> CHAR_LENGTH(RTRIM(k.upstream))
                    OR CHAR_LENGTH(k.target) <> CHAR_LENGTH(RTRIM(k.target)));
        END IF;
        IF v_bad IS NOT NULL THEN
            SET v_message = LEFT(CONCAT('[AQ002] partition mapping ', v_bad, ' of dag ', p_dag_id,
                                        ' must be {"asset", "mapping", "require", "keys"}: see docs/semantics.md'), 128);
            SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = v_message;
        END IF;
        -- Each asset by name, then by uri; it must be a (direct) member of the condition, once.
        SET v_bad = 0;
        resolve_loop: LOOP
            SET v_name = NULL;
            SELECT x.ord, x.asset INTO v_bad, v_name
              FROM {{ns}}._assetq_partition_spec x WHERE x.ord > v_bad ORDER BY x.ord LIMIT 1;
            IF v_name IS NULL THEN
                LEAVE resolve_loop;
            END IF;
            SET v_asset_id = NULL;
            SELECT a.id INTO v_asset_id FROM {{ns}}.asset a WHERE a.name = v_name;
            IF v_asset_id IS NULL THEN
                SELECT a.id INTO v_asset_id FROM {{ns}}.asset a WHERE a.uri = v_name;
            END IF;
            SELECT COUNT(*) INTO v_exists
              FROM {{ns}}.dag_schedule_asset_reference r
             WHERE r.dag_id = p_dag_id AND r.asset_id = v_asset_id;
            IF v_exists = 0 THEN
                SET v_bad = NULL;
            ELSE
                SELECT COUNT(*) INTO v_exists
                  FROM {{ns}}._assetq_partition_spec x WHERE x.asset_id = v_asset_id;
            END IF;
            IF v_bad IS NULL OR v_exists > 0 THEN
                SET v_message = LEFT(CONCAT('[AQ002] partition mapping of asset ', QUOTE(LEFT(v_name, 40)),
                                            ' for dag ', p_dag_id,
                                            ': the asset must be in its condition (not through an alias), once'), 128);
                SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = v_message;
            END IF;
            UPDATE {{ns}}._assetq_partition_spec SET asset_id = v_asset_id WHERE ord = v_bad;
        END LOOP;
        -- With the condition and the cap it was declared for: a change of either evaluates
        -- every key afresh (a key a smaller cap could not satisfy may run now).
        SET v_new = JSON_OBJECT('partitions', JSON_EXTRACT(p_partitions, '$'),
                                'condition', JSON_EXTRACT(v_condition, '$'),
                                'max_events_per_run', v_cap);
    END IF;
    IF (v_new IS NULL AND v_old IS NULL) OR JSON_EXTRACT(v_new, '$') <=> JSON_EXTRACT(v_old, '$') THEN
        DROP TEMPORARY TABLE IF EXISTS {{ns}}._assetq_partition_spec;
    ELSE
        SELECT COUNT(*) INTO v_exists FROM {{ns}}.dag d WHERE d.dag_id = p_dag_id FOR UPDATE;

        UPDATE {{ns}}.dag_schedule_asset_reference r
          LEFT JOIN {{ns}}._assetq_partition_spec x ON x.asset_id = r.asset_id
           SET r.partition_mapping = IF(v_new IS NULL, NULL, COALESCE(x.mapping, 'identity')),
               r.partition_require = IF(v_new IS NULL, NULL, COALESCE(x.requirement, 'any'))
         WHERE r.dag_id = p_dag_id;

        DELETE FROM {{ns}}.dag_partition_static_key WHERE dag_id = p_dag_id;
        INSERT INTO {{ns}}.dag_partition_static_key (dag_id, asset_id, upstream_key, target_key)
        SELECT p_dag_id, x.asset_id, k.upstream, k.target
          FROM {{ns}}._assetq_partition_spec x,
               JSON_TABLE(x.static_keys, '$[*]' COLUMNS (
                   upstream VARCHAR(250) PATH '$[0]',
                   target   VARCHAR(250) PATH '$[1]')) AS k
         WHERE x.mapping = 'static';
        DROP TEMPORARY TABLE IF EXISTS {{ns}}._assetq_partition_spec;

        UPDATE {{ns}}.dag SET partitioning = v_new, updated_at = UTC_TIMESTAMP(6)
         WHERE dag_id = p_dag_id;

        DELETE FROM {{ns}}.asset_partition_queue WHERE target_dag_id = p_dag_id;
        IF v_new IS NOT NULL THEN
            BEGIN
                DECLARE v_done     BOOLEAN DEFAULT FALSE;
                DECLARE v_event_id BIGINT;
                DECLARE v_created  DATETIME(6);
                DECLARE v_key      VARCHAR(250) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin;
                DECLARE v_mapping  VARCHAR(20) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin;
                DECLARE v_target   VARCHAR(250) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin;
                DECLARE v_source   VARCHAR(250) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin;
                DECLARE c_rows CURSOR FOR
                    SELECT q.asset_event_id, q.asset_id, q.created_at, e.partition_key,
                           COALESCE(r.partition_mapping, 'identity')
                      FROM {{ns}}.asset_dag_run_queue q
                      JOIN {{ns}}.asset_event e ON e.id = q.asset_event_id
                      LEFT JOIN {{ns}}.dag_schedule_asset_reference r
                             ON r.asset_id = q.asset_id AND r.dag_id = q.target_dag_id
                     WHERE q.target_dag_id = p_dag_id
                     ORDER BY q.asset_event_id
                      -- A locking read: it sees the rows of the producers the lock on the dag
                      -- row waited for, which a plain read at REPEATABLE READ (the default)
                      -- would not, and their events would go unmapped.
                      LOCK IN SHARE MODE;
                DECLARE CONTINUE HANDLER FOR NOT FOUND SET v_done = TRUE;
                OPEN c_rows;
                row_loop: LOOP
                    FETCH c_rows INTO v_event_id, v_asset_id, v_created, v_key, v_mapping;
                    IF v_done THEN
                        LEAVE row_loop;
                    END IF;
                    CALL {{ns}}.partition_map(p_dag_id, v_asset_id, v_mapping, v_key, v_target, v_source);
                    INSERT INTO {{ns}}.asset_partition_queue
                           (target_dag_id, asset_event_id, partition_key, asset_id, source_key, created_at)
                    VALUES (p_dag_id, v_event_id, v_target, v_asset_id, v_source, v_created);
                END LOOP;
                CLOSE c_rows;
            END;
        END IF;
    END IF;
END
$$
DELIMITER ;
