-- Migration 0010_liveness (down): back to 0009_partitions. The liveness table and its
-- procedures go (MySQL revokes the privileges on a dropped routine); grant_access and
-- revoke_access get their 0009 bodies back, their grants saved before and given back after.
-- Re-runnable, as the up script.
--
-- {{ns}} is replaced by the backquoted namespace when the file is loaded.

SET @assetq_saved_sql_mode = @@SESSION.sql_mode,
    SESSION sql_mode = 'STRICT_TRANS_TABLES,STRICT_ALL_TABLES,NO_ZERO_IN_DATE,NO_ZERO_DATE,ERROR_FOR_DIVISION_BY_ZERO,NO_ENGINE_SUBSTITUTION';

-- The grants on the routines created again below, saved before any is dropped.
CREATE TABLE IF NOT EXISTS {{ns}}._assetq_0010_grants (
    routine_name VARCHAR(64) NOT NULL,
    grantee_user VARCHAR(128) NOT NULL,
    grantee_host VARCHAR(255) NOT NULL,
    privileges   VARCHAR(64) NOT NULL,
    PRIMARY KEY (routine_name, grantee_user, grantee_host)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

DELIMITER $$

-- Saves the routine privileges accounts hold on the routines this script drops and creates
-- again. An installer that may not read mysql.procs_priv (error 1142) saves nothing: it could
-- not give them back either.
DROP PROCEDURE IF EXISTS {{ns}}._assetq_save_grants $$
CREATE PROCEDURE {{ns}}._assetq_save_grants()
MODIFIES SQL DATA
SQL SECURITY INVOKER
BEGIN
    DECLARE CONTINUE HANDLER FOR 1142 BEGIN END;
    -- IGNORE only skips grants saved by an earlier, interrupted run: the table has no
    -- foreign key or check whose failure it could hide.
    INSERT IGNORE INTO {{ns}}._assetq_0010_grants
           (routine_name, grantee_user, grantee_host, privileges)
    SELECT p.Routine_name, p.User, p.Host, p.Proc_priv
      FROM mysql.procs_priv p
     WHERE p.Db = DATABASE()
       AND p.Routine_type = 'PROCEDURE'
       AND p.Routine_name IN ('grant_access', 'revoke_access')
       AND p.Proc_priv <> '';
END $$

-- Gives the saved privileges back on the routines that exist now, to the accounts that still
-- exist.
-- MySQL 8 / MariaDB: a MariaDB role is stored with host '' and is named without a host in
-- GRANT; MySQL 8 has no such accounts.
DROP PROCEDURE IF EXISTS {{ns}}._assetq_restore_grants $$
CREATE PROCEDURE {{ns}}._assetq_restore_grants()
MODIFIES SQL DATA
SQL SECURITY INVOKER
BEGIN
    DECLARE v_done    BOOLEAN DEFAULT FALSE;
    DECLARE v_routine VARCHAR(64) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin;
    DECLARE v_user    VARCHAR(128) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin;
    DECLARE v_host    VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin;
    DECLARE v_privs   VARCHAR(64) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin;
    DECLARE v_list    VARCHAR(64) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin;
    DECLARE v_found   BIGINT;
    DECLARE c_grants CURSOR FOR
        SELECT g.routine_name, g.grantee_user, g.grantee_host, g.privileges
          FROM {{ns}}._assetq_0010_grants g
         ORDER BY 1, 2, 3;
    DECLARE CONTINUE HANDLER FOR NOT FOUND SET v_done = TRUE;

    OPEN c_grants;
    grant_loop: LOOP
        FETCH c_grants INTO v_routine, v_user, v_host, v_privs;
        IF v_done THEN
            LEAVE grant_loop;
        END IF;
        SELECT COUNT(*) INTO v_found FROM information_schema.ROUTINES r
         WHERE r.ROUTINE_SCHEMA = DATABASE() AND r.ROUTINE_NAME = v_routine
           AND r.ROUTINE_TYPE = 'PROCEDURE';
        IF v_found > 0 THEN
            -- GRANT would create a missing account on MariaDB: only existing ones.
            SELECT COUNT(*) INTO v_found FROM mysql.user u
             WHERE u.User = v_user AND u.Host = v_host;
        END IF;
        SET v_list = CONCAT_WS(', ',
                               IF(FIND_IN_SET('Execute', v_privs) > 0, 'EXECUTE', NULL),
                               IF(FIND_IN_SET('Alter Routine', v_privs) > 0, 'ALTER ROUTINE', NULL));
        IF v_found > 0 AND v_list <> '' THEN
            SET @assetq_grant = CONCAT('GRANT ', v_list, ' ON PROCEDURE `', DATABASE(), '`.`',
                                       v_routine, '` TO ', QUOTE(v_user),
                                       IF(v_host = '', '', CONCAT('@', QUOTE(v_host))),
                                       IF(FIND_IN_SET('Grant', v_privs) > 0, ' WITH GRANT OPTION', ''));
            PREPARE assetq_grant FROM @assetq_grant;
            EXECUTE assetq_grant;
            DEALLOCATE PREPARE assetq_grant;
        END IF;
    END LOOP;
    CLOSE c_grants;
END $$

DELIMITER ;

CALL {{ns}}._assetq_save_grants();

DROP PROCEDURE IF EXISTS {{ns}}.process_gone;
DROP PROCEDURE IF EXISTS {{ns}}.process_heartbeat;
DROP TABLE IF EXISTS {{ns}}.process_liveness;

DELIMITER $$

-- Least privilege. Four kinds of access, granted to existing accounts by grant_access:
--   producer   EXECUTE on register_event and register_events: can register events only;
--   scheduler  EXECUTE on schedule_pass, set_run_state and retry_run: can run scheduler
--              passes, move the runs they created through their states and retry failed
--              runs, nothing else;
--   worker     EXECUTE on claim_runs, heartbeat_run and complete_run (migration
--              0006_work_queue): can claim runs, renew their leases and complete them, with
--              their output events, nothing else;
--   reader     SELECT on the namespace: can read every table and view, never write.
-- Every kind also gets SELECT on the version table (assetq checks the installed revision).
-- Producers, schedulers and workers get no right on any table: the routines run with their
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

    IF p_access IS NULL OR p_access NOT IN ('producer', 'scheduler', 'worker', 'reader') THEN
        SET v_message = LEFT(CONCAT('[AQ002] unknown access ', COALESCE(QUOTE(LEFT(p_access, 40)), 'NULL'),
                                    ': use producer, scheduler, worker or reader'), 128);
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
       AND r.ROUTINE_NAME IN ('register_event', 'register_events', 'schedule_pass', 'set_run_state',
                              'retry_run', 'claim_runs', 'heartbeat_run', 'complete_run');
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
        SET @assetq_grant = CONCAT('GRANT EXECUTE ON PROCEDURE ', v_ns, '.set_run_state TO ', v_account);
        PREPARE assetq_grant FROM @assetq_grant;
        EXECUTE assetq_grant;
        SET @assetq_grant = CONCAT('GRANT EXECUTE ON PROCEDURE ', v_ns, '.retry_run TO ', v_account);
        PREPARE assetq_grant FROM @assetq_grant;
        EXECUTE assetq_grant;
    ELSEIF p_access = 'worker' THEN
        SET @assetq_grant = CONCAT('GRANT EXECUTE ON PROCEDURE ', v_ns, '.claim_runs TO ', v_account);
        PREPARE assetq_grant FROM @assetq_grant;
        EXECUTE assetq_grant;
        SET @assetq_grant = CONCAT('GRANT EXECUTE ON PROCEDURE ', v_ns, '.heartbeat_run TO ', v_account);
        PREPARE assetq_grant FROM @assetq_grant;
        EXECUTE assetq_grant;
        SET @assetq_grant = CONCAT('GRANT EXECUTE ON PROCEDURE ', v_ns, '.complete_run TO ', v_account);
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
    SET @assetq_grant = CONCAT('REVOKE EXECUTE ON PROCEDURE ', v_ns, '.set_run_state FROM ', v_account);
    PREPARE assetq_grant FROM @assetq_grant;
    EXECUTE assetq_grant;
    SET @assetq_grant = CONCAT('REVOKE EXECUTE ON PROCEDURE ', v_ns, '.retry_run FROM ', v_account);
    PREPARE assetq_grant FROM @assetq_grant;
    EXECUTE assetq_grant;
    SET @assetq_grant = CONCAT('REVOKE EXECUTE ON PROCEDURE ', v_ns, '.claim_runs FROM ', v_account);
    PREPARE assetq_grant FROM @assetq_grant;
    EXECUTE assetq_grant;
    SET @assetq_grant = CONCAT('REVOKE EXECUTE ON PROCEDURE ', v_ns, '.heartbeat_run FROM ', v_account);
    PREPARE assetq_grant FROM @assetq_grant;
    EXECUTE assetq_grant;
    SET @assetq_grant = CONCAT('REVOKE EXECUTE ON PROCEDURE ', v_ns, '.complete_run FROM ', v_account);
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

CALL {{ns}}._assetq_restore_grants();
DROP TABLE IF EXISTS {{ns}}._assetq_0010_grants;
DROP PROCEDURE IF EXISTS {{ns}}._assetq_restore_grants;
DROP PROCEDURE IF EXISTS {{ns}}._assetq_save_grants;

SET SESSION sql_mode = @assetq_saved_sql_mode;
