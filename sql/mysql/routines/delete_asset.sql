-- Removes asset p_asset (a name or uri) with its events: their queue rows (consumers that
-- depended on it through an alias lose the pending ones), their links (runs that consumed
-- them keep their other events and their event_count) and alias resolutions. Returns one
-- result set (deleted_events). AQ001 for an unknown asset; AQ007 while a consumer condition
-- names the asset: re-declare those consumers first. The asset row is locked first, so
-- producers registering for it finish before (their events are deleted too) or fail after
-- with a foreign-key error that assetq reports as an unknown asset.
DELIMITER $$
DROP PROCEDURE IF EXISTS {{ns}}.delete_asset
$$
CREATE PROCEDURE {{ns}}.delete_asset(IN p_asset TEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin)
MODIFIES SQL DATA
BEGIN
    DECLARE v_id      BIGINT;
    DECLARE v_locked  BIGINT;
    DECLARE v_uses    BIGINT;
    DECLARE v_dags    TEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin;
    DECLARE v_deleted BIGINT;
    DECLARE v_message VARCHAR(128) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin;

    CALL {{ns}}.resolve_asset(p_asset, v_id);  -- by name, then uri, or AQ001
    SELECT a.id INTO v_locked FROM {{ns}}.asset a WHERE a.id = v_id FOR UPDATE;
    IF v_locked IS NULL THEN
        SET v_message = LEFT(CONCAT('[AQ001] unknown asset ', QUOTE(LEFT(p_asset, 64)),
                                    ': it was deleted meanwhile'), 128);
        SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = v_message;
    END IF;
    -- A locking read: a clause committed after the caller's snapshot counts too.
    SELECT COUNT(*) INTO v_uses
      FROM {{ns}}.dag_condition_clause c WHERE c.asset_id = v_id
      LOCK IN SHARE MODE;
    IF v_uses > 0 THEN
        SELECT GROUP_CONCAT(QUOTE(LEFT(x.dag_id, 40)) ORDER BY x.dag_id SEPARATOR ', ') INTO v_dags
          FROM (SELECT DISTINCT c.dag_id FROM {{ns}}.dag_condition_clause c
                 WHERE c.asset_id = v_id ORDER BY c.dag_id LIMIT 5) x;
        SET v_message = LEFT(CONCAT('[AQ007] asset ', QUOTE(LEFT(p_asset, 40)),
                                    ' is in the condition of dag ', COALESCE(v_dags, '?')), 128);
        SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = v_message;
    END IF;
    -- Everything by the asset's own index entries, which a producer adds only once its
    -- foreign-key check has passed (after this commits, it fails instead): the queue rows
    -- through the events (the queue has no index by asset, and a scan of it would lock every
    -- consumer's rows), the events, the alias resolutions, the references. The index hints
    -- keep the optimizer from scanning a small table by its primary key, which would lock
    -- (and wait for) the rows producers are inserting. MySQL 8 / MariaDB: MySQL takes no
    -- index hint in a single-table DELETE; the multiple-table form takes one on both.
    -- First the partition rows of those queue rows, the same way.
    DELETE p
      FROM {{ns}}.asset_event e FORCE INDEX (asset_event_idempotency_key)
      STRAIGHT_JOIN {{ns}}.asset_dag_run_queue q FORCE INDEX (asset_dag_run_queue_event_idx)
         ON q.asset_event_id = e.id
      STRAIGHT_JOIN {{ns}}.asset_partition_queue p FORCE INDEX (PRIMARY)
         ON p.target_dag_id = q.target_dag_id AND p.asset_event_id = q.asset_event_id
     WHERE e.asset_id = v_id;
    DELETE q
      FROM {{ns}}.asset_event e FORCE INDEX (asset_event_idempotency_key)
      STRAIGHT_JOIN {{ns}}.asset_dag_run_queue q FORCE INDEX (asset_dag_run_queue_event_idx)
         ON q.asset_event_id = e.id
     WHERE e.asset_id = v_id;
    -- The links of its events, by hand (no foreign keys on the link
    -- table), after the queue rows: that delete, a locking read, waited for every
    -- pass holding one of them (a pass deletes the rows it claims and holds them to its
    -- commit), and this one, a locking read too, reads those passes' committed links. A pass
    -- that claims one of them later finds it deleted by us: its delete waits for our commit,
    -- deletes fewer rows than it claimed, and the claim guard (AQ900) rolls it back before it
    -- links anything.
    DELETE l
      FROM {{ns}}.asset_event e FORCE INDEX (asset_event_idempotency_key)
      STRAIGHT_JOIN {{ns}}.dagrun_asset_event l FORCE INDEX (dagrun_asset_event_once)
         ON l.asset_event_id = e.id
     WHERE e.asset_id = v_id;
    DELETE e
      FROM {{ns}}.asset_event e FORCE INDEX (asset_event_idempotency_key)
     WHERE e.asset_id = v_id;
    SET v_deleted = ROW_COUNT();
    DELETE aa
      FROM {{ns}}.asset_alias_asset aa FORCE INDEX (asset_alias_asset_asset_idx)
     WHERE aa.asset_id = v_id;
    DELETE r
      FROM {{ns}}.dag_schedule_asset_reference r FORCE INDEX (PRIMARY)
     WHERE r.asset_id = v_id;
    DELETE FROM {{ns}}.asset WHERE id = v_id;
    SELECT v_deleted AS deleted_events;
END
$$
DELIMITER ;
