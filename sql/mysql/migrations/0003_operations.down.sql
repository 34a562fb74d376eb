-- Migration 0003_operations (down): removes what 0003_operations.up.sql created. Privileges
-- grant_access gave to accounts on these objects are removed by the server with them, except
-- SELECT on the whole namespace and on the version table (revoke_access takes those away;
-- uninstall drops the namespace). Re-runnable: DDL commits statement by statement.

DROP PROCEDURE IF EXISTS {{ns}}.revoke_access;
DROP PROCEDURE IF EXISTS {{ns}}.grant_access;
DROP PROCEDURE IF EXISTS {{ns}}.purge_events;
DROP PROCEDURE IF EXISTS {{ns}}.purge_runs;
DROP VIEW IF EXISTS {{ns}}.dag_queue_status;

DELIMITER $$

-- MySQL 8 / MariaDB: DROP INDEX IF EXISTS is MariaDB-only: a helper drops each index that
-- information_schema lists, and is dropped again.
DROP PROCEDURE IF EXISTS {{ns}}._assetq_drop_index $$
CREATE PROCEDURE {{ns}}._assetq_drop_index(
    IN p_table TEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin,
    IN p_index TEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin
)
MODIFIES SQL DATA
SQL SECURITY INVOKER
BEGIN
    IF EXISTS (SELECT 1 FROM information_schema.STATISTICS s
                WHERE s.TABLE_SCHEMA = DATABASE() AND s.TABLE_NAME = p_table
                  AND s.INDEX_NAME = p_index) THEN
        SET @assetq_ddl = CONCAT('ALTER TABLE `', DATABASE(), '`.`', p_table,
                                 '` DROP INDEX `', p_index, '`');
        PREPARE assetq_ddl FROM @assetq_ddl;
        EXECUTE assetq_ddl;
        DEALLOCATE PREPARE assetq_ddl;
    END IF;
END $$

DELIMITER ;

CALL {{ns}}._assetq_drop_index('dag_run', 'dag_run_dag_created_idx');
CALL {{ns}}._assetq_drop_index('dag_run', 'dag_run_created_idx');
CALL {{ns}}._assetq_drop_index('asset_event', 'asset_event_timestamp_idx');
DROP PROCEDURE IF EXISTS {{ns}}._assetq_drop_index;
