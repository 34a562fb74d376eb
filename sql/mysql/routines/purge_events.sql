-- Retention, step 2: examines the next p_batch_size events whose timestamp is before
-- p_older_than, in (timestamp, id) order after the cursor (p_after_timestamp, p_after_id;
-- NULL: from the start), and deletes those that are consumed: no queue row (nobody still
-- waits for them) and no link (the runs that consumed them were purged, or there were none).
-- Returns one result set (deleted, examined, last_timestamp, last_id): the cursor for the
-- next batch; fewer examined than p_batch_size means the end. The cursor moves past events
-- it keeps, so a long-queued event is examined once per purge, not once per batch.
--
-- Never deletes a queued event: the test below (the queue has no foreign key to
-- asset_event). An event's queue rows are written by the statement that inserts
-- it and commit with it, so the test's snapshot, which sees the event, sees all of them that
-- are left, and none is added later (the comment in the body on the foreign key refusing
-- a DELETE (1451) predates 0013, which kept the body as it was). Run it at READ COMMITTED (assetq.purge does): the window and
-- the test are plain reads (INSERT ... SELECT reads without locks at READ COMMITTED); only
-- the events that passed the test are then locked, SKIP LOCKED, so the batch never waits
-- for a producer or a scheduler and never locks an event a scheduler is consuming
-- (tests/test_purge.py holds a batch open and runs both meanwhile).
-- the link table has no foreign keys: a pass takes no lock on an event
-- it links, but it links only the events of queue rows it deletes, and the test's one
-- snapshot saw no queue row of the event (a pass still open holds its deleted rows, which
-- the snapshot still sees; a committed one wrote its links in the same commit); queue rows
-- are written only with their event. So no link can come to an event the test passed.
DELIMITER $$
DROP PROCEDURE IF EXISTS {{ns}}.purge_events
$$
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
END
$$
DELIMITER ;
