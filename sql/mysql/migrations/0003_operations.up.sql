-- Migration 0003_operations (up): what an operator needs to run assetq in production.
-- Frozen once released: later changes go into new migrations.
--
--   * dag_queue_status, a read-only view per consumer for `assetq status` and dashboards;
--   * purge_runs / purge_events, retention in small batches, and the indexes they need;
--   * least privilege: grant_access / revoke_access give an account exactly one kind of
--     access, through EXECUTE on routines that run with their definer's rights.
-- MySQL has no LISTEN/NOTIFY: schedulers poll, so there is no wake-up trigger here.
--
-- {{ns}} is replaced by the backquoted namespace when the file is loaded. Re-runnable, as
-- every MySQL script of assetq: DDL commits statement by statement.

SET @assetq_saved_sql_mode = @@SESSION.sql_mode,
    SESSION sql_mode = 'STRICT_TRANS_TABLES,STRICT_ALL_TABLES,NO_ZERO_IN_DATE,NO_ZERO_DATE,ERROR_FOR_DIVISION_BY_ZERO,NO_ENGINE_SUBSTITUTION';

DELIMITER $$

-- Indexes for retention and status. Each is read by key or by a short range, so purge and
-- status cost what they delete or show, never a scan of the history. (The queue's index by
-- event, which the foreign-key check of a purged event needs, exists since 0001: InnoDB
-- needs one for every foreign key.)
--   asset_event_timestamp_idx  events by age, in the (timestamp, id) order of purge_events
--   dag_run_created_idx        runs by age, for purge_runs
--   dag_run_dag_created_idx    runs of a consumer by age, for dag_queue_status
-- MySQL 8 / MariaDB: CREATE INDEX IF NOT EXISTS is MariaDB-only, so a helper adds each index
-- unless information_schema already lists it, and is dropped again.
DROP PROCEDURE IF EXISTS {{ns}}._assetq_add_index $$
CREATE PROCEDURE {{ns}}._assetq_add_index(
    IN p_table TEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin,
    IN p_index TEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin,
    IN p_columns TEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin
)
MODIFIES SQL DATA
SQL SECURITY INVOKER
BEGIN
    IF NOT EXISTS (SELECT 1 FROM information_schema.STATISTICS s
                    WHERE s.TABLE_SCHEMA = DATABASE() AND s.TABLE_NAME = p_table
                      AND s.INDEX_NAME = p_index) THEN
        -- Inside a routine DATABASE() is the routine's own database: the namespace.
        SET @assetq_ddl = CONCAT('ALTER TABLE `', DATABASE(), '`.`', p_table,
                                 '` ADD INDEX `', p_index, '` (', p_columns, ')');
        PREPARE assetq_ddl FROM @assetq_ddl;
        EXECUTE assetq_ddl;
        DEALLOCATE PREPARE assetq_ddl;
    END IF;
END $$

DELIMITER ;

CALL {{ns}}._assetq_add_index('asset_event', 'asset_event_timestamp_idx', '`timestamp`, id');
CALL {{ns}}._assetq_add_index('dag_run', 'dag_run_created_idx', 'created_at');
CALL {{ns}}._assetq_add_index('dag_run', 'dag_run_dag_created_idx', 'dag_id, created_at');
DROP PROCEDURE IF EXISTS {{ns}}._assetq_add_index;


-- One row per consumer, for `assetq status` and dashboards. Read-only (it aggregates).
--   queued_events              queue rows of the consumer: events it has not consumed yet
--   oldest_queued_at           timestamp of the oldest of them (NULL when none), UTC
--   oldest_queued_age_seconds  how long that one has waited, by the server's clock
--   runs_last_hour             runs created in the last hour (runs purged are not counted)
--   last_run_at                when its newest run still in the history was created, UTC
--   runs_total                 runs ever created for it (its run sequence; purge keeps it)
--   last_scheduled_at          when a scheduler pass last examined it, UTC
-- The queue is grouped whole: it holds pending rows only, never history. SQL SECURITY
-- DEFINER: a reader needs SELECT on the view only.
-- MySQL 8 / MariaDB: no LATERAL on MariaDB, hence the grouped derived table and the
-- correlated subqueries.
CREATE OR REPLACE SQL SECURITY DEFINER VIEW {{ns}}.dag_queue_status AS
SELECT d.dag_id,
       d.is_paused,
       COALESCE(q.queued_events, 0) AS queued_events,
       q.oldest_queued_at,
       TIMESTAMPDIFF(MICROSECOND, q.oldest_queued_at, UTC_TIMESTAMP(6)) / 1000000
           AS oldest_queued_age_seconds,
       (SELECT COUNT(*)
          FROM {{ns}}.dag_run r
         WHERE r.dag_id = d.dag_id
           AND r.created_at > UTC_TIMESTAMP(6) - INTERVAL 1 HOUR) AS runs_last_hour,
       (SELECT MAX(r.created_at) FROM {{ns}}.dag_run r WHERE r.dag_id = d.dag_id) AS last_run_at,
       l.last_run_seq AS runs_total,
       l.last_scheduled_at
  FROM {{ns}}.dag d
  JOIN {{ns}}.dag_lock l ON l.dag_id = d.dag_id
  LEFT JOIN (SELECT q.target_dag_id,
                    COUNT(*) AS queued_events,
                    MIN(q.created_at) AS oldest_queued_at
               FROM {{ns}}.asset_dag_run_queue q
              GROUP BY q.target_dag_id) q
    ON q.target_dag_id = d.dag_id;


DELIMITER $$

-- Retention, step 1: deletes at most p_batch_size runs created before p_older_than, oldest
-- first, with their links (ON DELETE CASCADE). Returns one result set (deleted). Run each
-- batch at READ COMMITTED in a short transaction of its own (assetq.purge does). A run locked
-- by someone else is skipped, not waited for (SKIP LOCKED), and left for a later batch.
DROP PROCEDURE IF EXISTS {{ns}}.purge_runs $$
CREATE PROCEDURE {{ns}}.purge_runs(IN p_older_than DATETIME(6), IN p_batch_size INT)
MODIFIES SQL DATA
BEGIN
    DECLARE v_deleted BIGINT;
    DECLARE v_message VARCHAR(128) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin;
    IF p_older_than IS NULL OR p_batch_size IS NULL OR p_batch_size < 1 THEN
        SET v_message = '[AQ002] purge_runs needs a cutoff and a positive batch size';
        SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = v_message;
    END IF;
    DROP TEMPORARY TABLE IF EXISTS {{ns}}._assetq_purge;
    CREATE TEMPORARY TABLE {{ns}}._assetq_purge (
        id BIGINT NOT NULL PRIMARY KEY
    ) ENGINE = InnoDB;
    -- Lock the batch first (nobody else locks old runs: this never waits), then delete it
    -- by key. MySQL 8 / MariaDB: a DELETE cannot read its own table in a subquery.
    INSERT INTO {{ns}}._assetq_purge (id)
    SELECT r.id
      FROM {{ns}}.dag_run r
     WHERE r.created_at < p_older_than
     ORDER BY r.created_at
     LIMIT p_batch_size
       FOR UPDATE SKIP LOCKED;
    SELECT COUNT(*) INTO v_deleted FROM {{ns}}._assetq_purge;
    DELETE r
      FROM {{ns}}._assetq_purge k
      STRAIGHT_JOIN {{ns}}.dag_run r ON r.id = k.id;
    DROP TEMPORARY TABLE IF EXISTS {{ns}}._assetq_purge;
    SELECT v_deleted AS deleted;
END $$


-- Retention, step 2: examines the next p_batch_size events whose timestamp is before
-- p_older_than, in (timestamp, id) order after the cursor (p_after_timestamp, p_after_id;
-- NULL: from the start), and deletes those that are consumed: no queue row (nobody still
-- waits for them) and no link (the runs that consumed them were purged, or there were none).
-- Returns one result set (deleted, examined, last_timestamp, last_id): the cursor for the
-- next batch; fewer examined than p_batch_size means the end. The cursor moves past events
-- it keeps, so a long-queued event is examined once per purge, not once per batch.
--
-- Never deletes a queued event: the test below, and behind it the foreign key from
-- asset_dag_run_queue, which has no cascade: deleting a queued event fails (1451) and the
-- caller rolls the batch back. Run it at READ COMMITTED (assetq.purge does): the window and
-- the test are plain reads (INSERT ... SELECT reads without locks at READ COMMITTED); only
-- the events that passed the test are then locked, SKIP LOCKED, so the batch never waits
-- for a producer or a scheduler and never locks an event a scheduler is consuming
-- (tests/test_purge.py holds a batch open and runs both meanwhile).
DROP PROCEDURE IF EXISTS {{ns}}.purge_events $$
CREATE PROCEDURE {{ns}}.purge_events(
    IN p_older_than      DATETIME(6),
    IN p_batch_size      INT,
    IN p_after_timestamp DATETIME(6),
    IN p_after_id        BIGINT
)
MODIFIES SQL DATA
BEGIN
    DECLARE v_after_ts   DATETIME(6) DEFAULT COALESCE(p_after_timestamp, '1000-01-01 00:00:00');
    DECLARE v_after_id   BIGINT DEFAULT COALESCE(p_after_id, 0);
    DECLARE v_examined   BIGINT;
    DECLARE v_deleted    BIGINT DEFAULT 0;
    DECLARE v_last_ts    DATETIME(6) DEFAULT p_after_timestamp;
    DECLARE v_last_id    BIGINT DEFAULT p_after_id;
    DECLARE v_message    VARCHAR(128) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin;
    IF p_older_than IS NULL OR p_batch_size IS NULL OR p_batch_size < 1 THEN
        SET v_message = '[AQ002] purge_events needs a cutoff and a positive batch size';
        SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = v_message;
    END IF;
    DROP TEMPORARY TABLE IF EXISTS {{ns}}._assetq_purge_window, {{ns}}._assetq_purge_candidate,
                                   {{ns}}._assetq_purge;
    CREATE TEMPORARY TABLE {{ns}}._assetq_purge_window (
        id BIGINT NOT NULL PRIMARY KEY,
        ts DATETIME(6) NOT NULL
    ) ENGINE = InnoDB;
    CREATE TEMPORARY TABLE {{ns}}._assetq_purge_candidate (
        id BIGINT NOT NULL PRIMARY KEY
    ) ENGINE = InnoDB;
    CREATE TEMPORARY TABLE {{ns}}._assetq_purge (
        id BIGINT NOT NULL PRIMARY KEY
    ) ENGINE = InnoDB;

    -- The window. MySQL 8 / MariaDB: the row comparison (a, b) > (x, y) is spelled out, the
    -- form both optimizers turn into a range of the (timestamp, id) index.
    INSERT INTO {{ns}}._assetq_purge_window (id, ts)
    SELECT e.id, e.`timestamp`
      FROM {{ns}}.asset_event e
     WHERE e.`timestamp` < p_older_than
       AND (e.`timestamp` > v_after_ts OR (e.`timestamp` = v_after_ts AND e.id > v_after_id))
     ORDER BY e.`timestamp`, e.id
     LIMIT p_batch_size;
    SELECT COUNT(*) INTO v_examined FROM {{ns}}._assetq_purge_window;

    IF v_examined > 0 THEN
        SELECT w.ts, w.id INTO v_last_ts, v_last_id
          FROM {{ns}}._assetq_purge_window w ORDER BY w.ts DESC, w.id DESC LIMIT 1;
        INSERT INTO {{ns}}._assetq_purge_candidate (id)
        SELECT w.id
          FROM {{ns}}._assetq_purge_window w
         WHERE NOT EXISTS (SELECT 1 FROM {{ns}}.asset_dag_run_queue q
                            WHERE q.asset_event_id = w.id)
           AND NOT EXISTS (SELECT 1 FROM {{ns}}.dagrun_asset_event l
                            WHERE l.asset_event_id = w.id);
        INSERT INTO {{ns}}._assetq_purge (id)
        SELECT e.id
          FROM {{ns}}._assetq_purge_candidate c
          STRAIGHT_JOIN {{ns}}.asset_event e ON e.id = c.id
           FOR UPDATE SKIP LOCKED;
        -- By key, without testing again: a DELETE reads other tables with locking reads,
        -- and the test would wait on every producer's uncommitted queue row it scans. No
        -- test is needed: while we hold an event, nobody can make a row refer to it (that
        -- takes a shared lock on it), and before, only a raw INSERT could have (queue rows
        -- are written with their event, links with the deletion of the queue row, both
        -- seen by the one snapshot of the test). Such a queue row makes the foreign key
        -- refuse the DELETE (1451): the batch rolls back and its retry keeps the event.
        DELETE e
          FROM {{ns}}._assetq_purge k
          STRAIGHT_JOIN {{ns}}.asset_event e ON e.id = k.id;
        SET v_deleted = ROW_COUNT();
    END IF;
    DROP TEMPORARY TABLE IF EXISTS {{ns}}._assetq_purge_window, {{ns}}._assetq_purge_candidate,
                                   {{ns}}._assetq_purge;
    SELECT v_deleted AS deleted, v_examined AS examined,
           v_last_ts AS last_timestamp, v_last_id AS last_id;
END $$


-- Least privilege. Three kinds of access, granted to existing accounts by grant_access:
--   producer   EXECUTE on register_event and register_events: can register events only;
--   scheduler  EXECUTE on schedule_pass: can run scheduler passes only (assetq has no
--              routine that moves run states yet);
--   reader     SELECT on the namespace: can read every table and view, never write.
-- Every kind also gets SELECT on the version table (assetq checks the installed revision).
-- Producers and schedulers get no right on any table: the routines run with their
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

    IF p_access IS NULL OR p_access NOT IN ('producer', 'scheduler', 'reader') THEN
        SET v_message = LEFT(CONCAT('[AQ002] unknown access ', COALESCE(QUOTE(LEFT(p_access, 40)), 'NULL'),
                                    ': use producer, scheduler or reader'), 128);
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
       AND r.ROUTINE_NAME IN ('register_event', 'register_events', 'schedule_pass');
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
    SET @assetq_grant = CONCAT('REVOKE SELECT ON ', v_ns, '.* FROM ', v_account);
    PREPARE assetq_grant FROM @assetq_grant;
    EXECUTE assetq_grant;
    SET @assetq_grant = CONCAT('REVOKE SELECT ON ', v_ns, '.assetq_alembic_version FROM ', v_account);
    PREPARE assetq_grant FROM @assetq_grant;
    EXECUTE assetq_grant;
    DEALLOCATE PREPARE assetq_grant;
END $$

DELIMITER ;

SET SESSION sql_mode = @assetq_saved_sql_mode;
