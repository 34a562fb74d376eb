-- Takes every kind of access grant_access gave the account away again. Idempotent: a
-- privilege the account does not hold is skipped (errors 1141, 1147, 1403: no such grant).
DELIMITER $$
DROP PROCEDURE IF EXISTS {{ns}}.revoke_access
$$
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
    DECLARE v_routines TEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin;
    DECLARE v_routine TEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin;
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
    -- Every kind's routines (see grant_access), one REVOKE each.
    SET v_routines = CONCAT_WS(' ', 'register_event', 'register_event_v2', 'register_events',
                               'register_events_v2', 'schedule_pass',
                               'schedule_pass_v2', 'set_run_state', 'retry_run', 'cancel_run',
                               'claim_runs', 'claim_runs_v2', 'schedule_and_claim', 'heartbeat_run',
                               'heartbeat_run_v2', 'complete_run', 'complete_run_v2',
                               'process_heartbeat', 'process_gone', 'process_handles');
    WHILE v_routines <> '' DO
        SET v_routine = SUBSTRING_INDEX(v_routines, ' ', 1);
        SET v_routines = SUBSTRING(v_routines, CHAR_LENGTH(v_routine) + 2);
        SET @assetq_grant = CONCAT('REVOKE EXECUTE ON PROCEDURE ', v_ns, '.`', v_routine, '` FROM ', v_account);
        PREPARE assetq_grant FROM @assetq_grant;
        EXECUTE assetq_grant;
    END WHILE;
    SET @assetq_grant = CONCAT('REVOKE SELECT ON ', v_ns, '.* FROM ', v_account);
    PREPARE assetq_grant FROM @assetq_grant;
    EXECUTE assetq_grant;
    SET @assetq_grant = CONCAT('REVOKE SELECT ON ', v_ns, '.assetq_alembic_version FROM ', v_account);
    PREPARE assetq_grant FROM @assetq_grant;
    EXECUTE assetq_grant;
    DEALLOCATE PREPARE assetq_grant;
END
$$
DELIMITER ;
