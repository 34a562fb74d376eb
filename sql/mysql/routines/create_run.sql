-- A run of consumer p_dag_id that consumes exactly the rows in _assetq_claim (I3, I4), for
-- partition p_partition_key (NULL for an unpartitioned consumer), created at p_now: the one
-- step schedule_pass and schedule_partitions share, called with the consumer's lock row
-- held. It takes the consumer's next seq (its lock row's last_run_seq, which only a pass
-- holding that row advances, so a consumer's runs of one pass are numbered in a row) and, for
-- a partition, the key's next generation (1 + the highest of its runs still stored); the
-- triggering event is the newest claimed row (created_at, then id). The run goes into the
-- pass's _assetq_run, its event ids as a JSON array. AQ900 (claim guard) when a claimed row
-- is gone or the ids were cut: the pass is rolled back.
DELIMITER $$
DROP PROCEDURE IF EXISTS {{ns}}.create_run
$$
CREATE PROCEDURE {{ns}}.create_run(
    IN p_dag_id        VARCHAR(250) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin,
    IN p_now           DATETIME(6),
    IN p_partition_key VARCHAR(250) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin
)
MODIFIES SQL DATA
BEGIN
    DECLARE v_claimed   BIGINT;
    DECLARE v_run_after DATETIME(6);
    DECLARE v_oldest    DATETIME(6);
    DECLARE v_newest_id BIGINT;
    DECLARE v_trigger   BIGINT;
    DECLARE v_seq       BIGINT;
    DECLARE v_gen       INT;
    DECLARE v_run_id    VARCHAR(250) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin;
    DECLARE v_run_pk    BIGINT;
    DECLARE v_deleted   BIGINT;
    DECLARE v_event_ids LONGTEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin;
    DECLARE v_message   VARCHAR(128) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin;
    DECLARE v_saved_gcl BIGINT UNSIGNED DEFAULT @@SESSION.group_concat_max_len;

    SELECT COUNT(*), MAX(k.created_at), MIN(k.created_at), MAX(k.asset_event_id)
      INTO v_claimed, v_run_after, v_oldest, v_newest_id
      FROM {{ns}}._assetq_claim k;
    -- When every claimed row has one timestamp (a single row, or one batch) the triggering
    -- event is the highest id, counted above; otherwise it is looked up.
    IF v_oldest = v_run_after THEN
        SET v_trigger = v_newest_id;
    ELSE
        SELECT k.asset_event_id INTO v_trigger
          FROM {{ns}}._assetq_claim k
         ORDER BY k.created_at DESC, k.asset_event_id DESC
         LIMIT 1;
    END IF;
    UPDATE {{ns}}.dag_lock SET last_run_seq = last_run_seq + 1, last_scheduled_at = p_now
     WHERE dag_id = p_dag_id;
    SELECT l.last_run_seq INTO v_seq FROM {{ns}}.dag_lock l WHERE l.dag_id = p_dag_id;
    IF p_partition_key IS NOT NULL THEN
        SELECT COALESCE(MAX(r.partition_generation), 0) + 1 INTO v_gen
          FROM {{ns}}.dag_run r WHERE r.dag_id = p_dag_id AND r.partition_key = p_partition_key;
    END IF;
    SET v_run_id = CONCAT('asset_triggered__', DATE_FORMAT(v_run_after, '%Y-%m-%dT%H:%i:%s.%f'),
                          '+00:00__', v_seq);
    -- not_before: claimable by workers (claim_runs) from now on.
    INSERT INTO {{ns}}.dag_run (dag_id, run_id, seq, run_after, created_at, triggering_event_id,
                                event_count, not_before, partition_key, partition_generation)
    VALUES (p_dag_id, v_run_id, v_seq, v_run_after, p_now, v_trigger, v_claimed, p_now,
            p_partition_key, v_gen);
    -- MySQL 8 / MariaDB: no RETURNING on MySQL.
    SET v_run_pk = LAST_INSERT_ID();

    -- Delete exactly the claimed rows (I3), one primary-key lookup per claimed id:
    -- STRAIGHT_JOIN makes the claim table drive the join. A plan that range-scans the
    -- consumer's queue instead waits on producers' uncommitted rows, even at READ COMMITTED.
    -- FORCE INDEX (PRIMARY): with the queue's indexes by consumer,
    -- MariaDB 10.11 chose a ref scan of asset_dag_run_queue_order_idx over the consumer's rows
    -- (index only, which it costs below the primary key's eq_ref) for a consumer with few
    -- queued rows, and the pass waited for producers. The claim guard (I4): if any claimed row
    -- is gone, someone else consumed it (or delete_asset deleted it with its event); abort the
    -- whole pass. Before the links: once the rows are held, delete_asset waits for this pass
    -- before it deletes their events, so a link never meets a deleted event.
    DELETE q
      FROM {{ns}}._assetq_claim k
      STRAIGHT_JOIN {{ns}}.asset_dag_run_queue q FORCE INDEX (PRIMARY)
        ON q.target_dag_id = p_dag_id AND q.asset_event_id = k.asset_event_id;
    SET v_deleted = ROW_COUNT();
    IF v_deleted <> v_claimed THEN
        SET v_message = LEFT(CONCAT('[AQ900] claim guard: dag ', p_dag_id, ' claimed ', v_claimed,
                                    ' queue rows', IF(p_partition_key IS NULL, '', ' of a partition'),
                                    ' but deleted ', v_deleted), 128);
        SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = v_message;
    END IF;

    INSERT INTO {{ns}}.dagrun_asset_event (dag_run_id, asset_event_id, dag_id)
    SELECT v_run_pk, k.asset_event_id, p_dag_id FROM {{ns}}._assetq_claim k;

    -- The run's ids as JSON text for the result. GROUP_CONCAT is cut silently at
    -- group_concat_max_len (1024 by default on MySQL): raised for this one statement to 1 GiB,
    -- the largest value both engines accept in strict mode and the most a packet can carry
    -- anyway, and the result is checked against the claim all the same. MySQL 8 / MariaDB:
    -- JSON_ARRAYAGG takes no ORDER BY on MySQL and is cut at group_concat_max_len on MariaDB;
    -- GROUP_CONCAT behaves the same on both.
    SET SESSION group_concat_max_len = 1073741824;
    SELECT CONCAT('[', GROUP_CONCAT(k.asset_event_id ORDER BY k.asset_event_id SEPARATOR ','), ']')
      INTO v_event_ids
      FROM {{ns}}._assetq_claim k;
    SET SESSION group_concat_max_len = v_saved_gcl;
    IF NOT (JSON_LENGTH(v_event_ids) <=> v_claimed) THEN
        SET v_message = LEFT(CONCAT('[AQ900] claim guard: event ids of dag ', p_dag_id,
                                    ' were truncated'), 128);
        SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = v_message;
    END IF;

    INSERT INTO {{ns}}._assetq_run
           (dag_run_id, dag_id, run_id, seq, run_after, created_at, event_ids,
            triggering_event_id, state, partition_key)
    VALUES (v_run_pk, p_dag_id, v_run_id, v_seq, v_run_after, p_now, v_event_ids,
            v_trigger, 'queued', p_partition_key);
END
$$
DELIMITER ;
