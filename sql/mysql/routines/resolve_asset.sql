-- Looks an asset up by name, then by uri. Raises AQ001 when neither matches.
DELIMITER $$
DROP PROCEDURE IF EXISTS {{ns}}.resolve_asset
$$
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
END
$$
DELIMITER ;
