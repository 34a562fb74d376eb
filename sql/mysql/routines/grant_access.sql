-- Least privilege. Four kinds of access, granted to existing accounts by grant_access:
--   producer   EXECUTE on register_event(_v2) and register_events(_v2): can register
--              events only;
--   scheduler  EXECUTE on schedule_pass(_v2), set_run_state, retry_run and cancel_run: can run
--              scheduler passes, move the runs they created through their states, retry
--              failed runs and cancel runs, nothing else;
--   worker     EXECUTE on claim_runs(_v2), schedule_and_claim, heartbeat_run(_v2),
--              complete_run(_v2) and schedule_pass(_v2): can claim runs (after a pass of
--              their own consumers: schedule_and_claim), renew their leases and complete
--              them, with their output events, and run the pass that creates a capped
--              consumer's next run when one of its runs ends (no notifications on MySQL),
--              nothing else;
--   reader     SELECT on the namespace: can read every table and view, never write.
-- Schedulers and workers may also record that they are alive (process_heartbeat and
-- process_gone); producers and readers may not. Workers may also record the consumers they
-- have handlers for (process_handles).
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
DELIMITER $$
DROP PROCEDURE IF EXISTS {{ns}}.grant_access
$$
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
    DECLARE v_routines TEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin DEFAULT '';
    DECLARE v_routine TEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin;
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
    -- The kind's routines, one GRANT each, in this order; each name a literal of its own,
    -- which a table prefix's rendering prefixes (assetq.sqlfiles.render).
    IF p_access = 'producer' THEN
        SET v_routines = CONCAT_WS(' ', 'register_event', 'register_event_v2', 'register_events',
                                   'register_events_v2');
    ELSEIF p_access = 'scheduler' THEN
        SET v_routines = CONCAT_WS(' ', 'schedule_pass', 'schedule_pass_v2', 'set_run_state', 'retry_run',
                                   'cancel_run');
    ELSEIF p_access = 'worker' THEN
        -- schedule_pass(_v2) too: with no notifications here, the worker that ends a run of a
        -- capped consumer runs the pass that creates its next run (assetq.run_worker).
        SET v_routines = CONCAT_WS(' ', 'claim_runs', 'claim_runs_v2', 'schedule_and_claim', 'heartbeat_run',
                                   'heartbeat_run_v2', 'complete_run', 'complete_run_v2', 'schedule_pass',
                                   'schedule_pass_v2');
    ELSE
        SET @assetq_grant = CONCAT('GRANT SELECT ON ', v_ns, '.* TO ', v_account);
        PREPARE assetq_grant FROM @assetq_grant;
        EXECUTE assetq_grant;
    END IF;
    -- Schedulers and workers record that they are alive.
    IF p_access IN ('scheduler', 'worker') THEN
        SET v_routines = CONCAT_WS(' ', v_routines, 'process_heartbeat', 'process_gone');
    END IF;
    -- Workers record the consumers they have handlers for.
    IF p_access = 'worker' THEN
        SET v_routines = CONCAT_WS(' ', v_routines, 'process_handles');
    END IF;
    WHILE v_routines <> '' DO
        SET v_routine = SUBSTRING_INDEX(v_routines, ' ', 1);
        SET v_routines = SUBSTRING(v_routines, CHAR_LENGTH(v_routine) + 2);
        SET @assetq_grant = CONCAT('GRANT EXECUTE ON PROCEDURE ', v_ns, '.`', v_routine, '` TO ', v_account);
        PREPARE assetq_grant FROM @assetq_grant;
        EXECUTE assetq_grant;
    END WHILE;
    DEALLOCATE PREPARE assetq_grant;
END
$$
DELIMITER ;
