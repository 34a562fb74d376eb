-- Declares an asset (idempotent) and returns its id as one result set (asset_id). An existing
-- asset keeps its id; a given uri or extra replaces the stored one, and it counts as declared.
-- When no asset has the name yet but a consumer referenced the uri before anyone declared it
-- (an undeclared asset with that uri, or named by it without a uri), that asset takes the
-- name: it keeps its id, so the consumers that referenced it get its events. A uri that
-- belongs to another asset is refused (AQ002), nothing written.
DELIMITER $$
DROP PROCEDURE IF EXISTS {{ns}}.declare_asset
$$
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
END
$$
DELIMITER ;
