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
