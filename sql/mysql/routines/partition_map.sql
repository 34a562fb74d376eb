-- Partitions. Maps partition key p_key of an event of asset
-- p_asset_id to partitioned consumer p_dag_id's key under p_mapping (target_key), and gives
-- the key as the mapping counts it (source_key), as PostgreSQL's partition_map does:
--   identity      the key itself;
--   hour_to_day   'YYYY-MM-DDTHH' (optionally ':00' or ':00:00', optionally 'Z' or '+00:00':
--                 hours of UTC) -> 'YYYY-MM-DD'; source_key 'YYYY-MM-DDTHH';
--   day_to_week   'YYYY-MM-DD' -> its ISO week 'IYYY-Www' (e.g. 2026-W49);
--   day_to_month  'YYYY-MM-DD' -> 'YYYY-MM';
--   static        the consumer's dag_partition_static_key row for the asset and key.
-- An event without a key, or whose key does not parse or has no static row, signals AQ011:
-- the registration fails and nothing is written (never a silent skip). Days are checked by
-- arithmetic, not by STR_TO_DATE, whose warning strict mode would turn into another error.
-- MySQL 8 / MariaDB: a procedure with OUT parameters, not a function (see resolve_asset).
DELIMITER $$
DROP PROCEDURE IF EXISTS {{ns}}.partition_map
$$
CREATE PROCEDURE {{ns}}.partition_map(
    IN  p_dag_id   VARCHAR(250) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin,
    IN  p_asset_id BIGINT,
    IN  p_mapping  VARCHAR(20) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin,
    IN  p_key      VARCHAR(250) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin,
    OUT target_key VARCHAR(250) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin,
    OUT source_key VARCHAR(250) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin
)
READS SQL DATA
BEGIN
    DECLARE v_day     VARCHAR(10) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin;
    DECLARE v_year    INT;
    DECLARE v_month   INT;
    DECLARE v_dom     INT;
    DECLARE v_name    VARCHAR(512) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin;
    DECLARE v_message VARCHAR(128) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin;
    SET target_key = NULL, source_key = NULL;
    -- A key ending with a space, or holding a line break, maps to nothing, as on PostgreSQL:
    -- the binary collation compares 'k ' and 'k' as equal (PAD SPACE), and REGEXP's $ also
    -- matches before a final line break.
    IF p_key IS NOT NULL AND CHAR_LENGTH(p_key) = CHAR_LENGTH(RTRIM(p_key))
       AND INSTR(p_key, CHAR(10)) = 0 THEN
        IF p_mapping = 'identity' THEN
            SET target_key = p_key, source_key = p_key;
        ELSEIF p_mapping = 'static' THEN
            BEGIN
                -- No row is not an error here, and must not reach a caller's NOT FOUND handler.
                DECLARE CONTINUE HANDLER FOR NOT FOUND BEGIN END;
                SELECT s.target_key INTO target_key
                  FROM {{ns}}.dag_partition_static_key s
                 WHERE s.dag_id = p_dag_id AND s.asset_id = p_asset_id AND s.upstream_key = p_key;
            END;
            IF target_key IS NOT NULL THEN
                SET source_key = p_key;
            END IF;
        ELSE
            IF p_mapping = 'hour_to_day'
               AND p_key REGEXP '^[0-9]{4}-[0-9]{2}-[0-9]{2}T([01][0-9]|2[0-3])(:00(:00)?)?(Z|[+]00:00)?$' THEN
                SET v_day = LEFT(p_key, 10);
            ELSEIF p_mapping IN ('day_to_week', 'day_to_month') AND p_key REGEXP '^[0-9]{4}-[0-9]{2}-[0-9]{2}$' THEN
                SET v_day = p_key;
            END IF;
            IF v_day IS NOT NULL THEN
                SET v_year = CAST(LEFT(v_day, 4) AS UNSIGNED),
                    v_month = CAST(SUBSTRING(v_day, 6, 2) AS UNSIGNED),
                    v_dom = CAST(SUBSTRING(v_day, 9, 2) AS UNSIGNED);
                IF v_year >= 1 AND v_month BETWEEN 1 AND 12 AND v_dom >= 1
                   AND v_dom <= CASE WHEN v_month IN (4, 6, 9, 11) THEN 30
                                     WHEN v_month <> 2 THEN 31
                                     WHEN (v_year % 4 = 0 AND v_year % 100 <> 0) OR v_year % 400 = 0 THEN 29
                                     ELSE 28
                                 END
                THEN
                    SET target_key = CASE p_mapping
                                         WHEN 'hour_to_day' THEN v_day
                                         WHEN 'day_to_week' THEN DATE_FORMAT(CAST(v_day AS DATE), '%x-W%v')
                                         ELSE LEFT(v_day, 7)
                                     END,
                        source_key = IF(p_mapping = 'hour_to_day', LEFT(p_key, 13), v_day);
                END IF;
            END IF;
        END IF;
    END IF;
    IF target_key IS NULL THEN
        SELECT a.name INTO v_name FROM {{ns}}.asset a WHERE a.id = p_asset_id;
        IF p_key IS NULL THEN
            SET v_message = LEFT(CONCAT('[AQ011] consumer ', p_dag_id, ' is partitioned: the event of asset ',
                                        QUOTE(LEFT(v_name, 40)), ' needs a partition key'), 128);
        ELSE
            SET v_message = LEFT(CONCAT('[AQ011] partition key ', QUOTE(LEFT(p_key, 30)), ' of asset ',
                                        QUOTE(LEFT(v_name, 24)), ' maps to no partition of consumer ',
                                        p_dag_id, ' (', p_mapping, ')'), 128);
        END IF;
        SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = v_message;
    END IF;
END
$$
DELIMITER ;
