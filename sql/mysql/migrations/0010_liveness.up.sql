-- Migration 0010_liveness (up): a liveness table of the schedulers and workers that run
-- (issue 15 item 5). The same revision as sql/postgresql/migrations/0010_liveness.up.sql,
-- with the same table, routines, parameters and error codes:
--
--   * process_liveness: one row per running scheduler or worker loop;
--   * process_heartbeat inserts or refreshes a loop's row, process_gone deletes it at a
--     clean stop; both run with their definer's rights, like the other granted routines;
--   * grant_access gives them to the scheduler and worker kinds, revoke_access takes them
--     away; accounts that hold either kind already get them here. Readers hold SELECT on
--     the whole namespace, which covers the new table.
--
-- What differs from PostgreSQL: grant_access and revoke_access are dropped and created
-- again (no CREATE OR REPLACE PROCEDURE), and MySQL revokes the privileges on a routine when
-- it is dropped, so the grants on them are saved first and given back at the end, as in
-- 0006 and 0009.
--
-- Additive: no existing table, routine signature or result changes. Online: a new table
-- and new procedures; a grant_access or revoke_access call while they are re-created fails
-- with 1305 (retry).
--
-- {{ns}} is replaced by the backquoted namespace when the file is loaded. Re-runnable, as
-- every MySQL script of assetq: DDL commits statement by statement, so an upgrade that
-- stopped half-way is finished by running the script again (the saved grants are kept in a
-- table, not a temporary one, for that reason).

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
    -- The scheduler kind's accounts (EXECUTE on schedule_pass) and the worker kind's (on
    -- claim_runs) may record that they are alive from now on: an upgrade keeps what a kind
    -- of access means (as 0006 gave retry_run to the scheduler kind).
    INSERT IGNORE INTO {{ns}}._assetq_0010_grants
           (routine_name, grantee_user, grantee_host, privileges)
    SELECT r.routine_name, p.User, p.Host, 'Execute'
      FROM mysql.procs_priv p,
           (SELECT 'process_heartbeat' AS routine_name UNION ALL SELECT 'process_gone') r
     WHERE p.Db = DATABASE()
       AND p.Routine_type = 'PROCEDURE'
       AND p.Routine_name IN ('schedule_pass', 'claim_runs')
       AND FIND_IN_SET('Execute', p.Proc_priv) > 0;
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

-- Liveness (migration 0010_liveness): one row per scheduler or worker loop that runs, so that
-- status can show who is alive. process_id is made up by the loop when it starts (uuid4
-- hex); kind is 'scheduler' or 'worker'; name is a worker's name (its runs' worker column
-- starts with it), NULL for a scheduler; host, pid and version (the assetq package's) say
-- where it runs and what; interval_seconds is how often it promises to heartbeat;
-- started_at is its first heartbeat and last_seen_at its latest, both by the database's
-- clock (UTC). A loop that stops cleanly deletes its row (process_gone); a killed one leaves
-- it behind, and status calls it stale once last_seen_at is three intervals old. purge
-- deletes rows last seen before its cutoff. No foreign key and no index but the key: one
-- row per process, written by that process only.
CREATE TABLE IF NOT EXISTS {{ns}}.process_liveness (
    process_id        VARCHAR(64) NOT NULL,
    kind              VARCHAR(20) NOT NULL,
    name              VARCHAR(250) NULL,
    host              VARCHAR(255) NOT NULL,
    pid               BIGINT NOT NULL,
    version           VARCHAR(64) NOT NULL,
    interval_seconds  DOUBLE NOT NULL,
    started_at        DATETIME(6) NOT NULL,
    last_seen_at      DATETIME(6) NOT NULL,
    PRIMARY KEY (process_id),
    CONSTRAINT process_liveness_kind_check CHECK (kind IN ('scheduler', 'worker')),
    CONSTRAINT process_liveness_interval_check CHECK (interval_seconds > 0)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

DELIMITER $$

-- Liveness (migration 0010_liveness). Records that loop p_process_id is alive now (database
-- clock, UTC): inserts its row on the first call, then moves last_seen_at (started_at
-- stays). One statement, atomic under autocommit too; the loops call it in a short
-- transaction of its own, never inside a pass or a run. No result set. AQ002 for a bad kind
-- or interval; the lengths are the columns' (strict mode refuses longer values).
-- ON DUPLICATE KEY UPDATE, not REPLACE: REPLACE deletes the row first, and would lose
-- started_at.
DROP PROCEDURE IF EXISTS {{ns}}.process_heartbeat $$
CREATE PROCEDURE {{ns}}.process_heartbeat(
    IN p_process_id       TEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin,
    IN p_kind             TEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin,
    IN p_name             TEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin,
    IN p_host             TEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin,
    IN p_pid              BIGINT,
    IN p_version          TEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin,
    IN p_interval_seconds DOUBLE
)
MODIFIES SQL DATA
BEGIN
    DECLARE v_now     DATETIME(6);
    DECLARE v_message VARCHAR(128) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin;

    IF p_kind IS NULL OR p_kind NOT IN ('scheduler', 'worker') THEN
        SET v_message = LEFT(CONCAT('[AQ002] unknown process kind ', COALESCE(QUOTE(LEFT(p_kind, 40)), 'NULL'),
                                    ': use scheduler or worker'), 128);
        SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = v_message;
    END IF;
    IF p_interval_seconds IS NULL OR NOT (p_interval_seconds > 0 AND p_interval_seconds <= 604800) THEN
        SET v_message = LEFT(CONCAT('[AQ002] liveness interval must be above 0 and at most 604800 seconds, got ',
                                    COALESCE(p_interval_seconds, 'NULL')), 128);
        SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = v_message;
    END IF;
    IF p_process_id IS NULL OR p_process_id = '' OR p_host IS NULL OR p_pid IS NULL OR p_version IS NULL THEN
        SIGNAL SQLSTATE '45000'
            SET MESSAGE_TEXT = '[AQ002] a heartbeat needs a process id, host, pid and version';
    END IF;
    SET v_now = UTC_TIMESTAMP(6);
    INSERT INTO {{ns}}.process_liveness
           (process_id, kind, name, host, pid, version, interval_seconds, started_at, last_seen_at)
    VALUES (p_process_id, p_kind, p_name, p_host, p_pid, p_version, p_interval_seconds, v_now, v_now)
    ON DUPLICATE KEY UPDATE
           kind = p_kind, name = p_name, host = p_host, pid = p_pid, version = p_version,
           interval_seconds = p_interval_seconds, last_seen_at = v_now;
END $$


-- Liveness (migration 0010_liveness). Deletes loop p_process_id's row: the loop stopped
-- cleanly. Idempotent (no row, nothing done). No result set.
DROP PROCEDURE IF EXISTS {{ns}}.process_gone $$
CREATE PROCEDURE {{ns}}.process_gone(
    IN p_process_id TEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin
)
MODIFIES SQL DATA
BEGIN
    DELETE FROM {{ns}}.process_liveness WHERE process_id = p_process_id;
END $$


-- Least privilege. Four kinds of access, granted to existing accounts by grant_access:
--   producer   EXECUTE on register_event and register_events: can register events only;
--   scheduler  EXECUTE on schedule_pass, set_run_state and retry_run: can run scheduler
--              passes, move the runs they created through their states and retry failed
--              runs, nothing else;
--   worker     EXECUTE on claim_runs, heartbeat_run and complete_run (migration
--              0006_work_queue): can claim runs, renew their leases and complete them, with
--              their output events, nothing else;
--   reader     SELECT on the namespace: can read every table and view, never write.
-- Schedulers and workers may also record that they are alive (process_heartbeat and
-- process_gone, migration 0010_liveness); producers and readers may not.
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
    -- Schedulers and workers record that they are alive (migration 0010_liveness).
    IF p_access IN ('scheduler', 'worker') THEN
        SET @assetq_grant = CONCAT('GRANT EXECUTE ON PROCEDURE ', v_ns, '.process_heartbeat TO ', v_account);
        PREPARE assetq_grant FROM @assetq_grant;
        EXECUTE assetq_grant;
        SET @assetq_grant = CONCAT('GRANT EXECUTE ON PROCEDURE ', v_ns, '.process_gone TO ', v_account);
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
    SET @assetq_grant = CONCAT('REVOKE EXECUTE ON PROCEDURE ', v_ns, '.process_heartbeat FROM ', v_account);
    PREPARE assetq_grant FROM @assetq_grant;
    EXECUTE assetq_grant;
    SET @assetq_grant = CONCAT('REVOKE EXECUTE ON PROCEDURE ', v_ns, '.process_gone FROM ', v_account);
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
