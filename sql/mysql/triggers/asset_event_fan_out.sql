-- Fan-out (I1, I2), now also for consumers that depend on the asset through an alias it has
-- resolved to, and for paused consumers that queue while paused: one queue row per consumer,
-- even when it references the asset both directly and through an alias (UNION).
--
-- Every row it queues through is read with a shared lock (LOCK IN SHARE MODE): the reference
-- and alias-clause rows and the dag rows. On a dag row that is the lock the queue's
-- foreign-key check takes anyway, taken by the read so that a consumer deleted meanwhile
-- (delete_dag) is waited for and then skipped instead of failing the producer's foreign-key
-- check. On the reference and alias-clause rows it makes a re-declare that drops the asset
-- wait for the producers in flight, and the producers after it see the new definition: no
-- event is queued for a consumer that no longer depends on its asset. A trigger's reads are
-- locking reads anyway, except at READ COMMITTED under an INSERT ... SELECT (a batch
-- registration), where InnoDB would read them without locks: hence the explicit clauses.
-- delete_dag and declare_dag change a consumer's reference rows, then its alias-clause rows,
-- each in key order, then its dag row.
--
-- The asset's alias resolutions are looked up first (one index dive, with the shared lock the
-- alias query below takes on them anyway). An asset no alias has resolved to, the usual case,
-- takes the short statement: its reference rows in key order, each followed by its consumer's
-- dag row, with the explicit locks. Interleaving is safe there: a declaration
-- or deletion holds the rows of one consumer only, and the producer reaches that consumer's
-- dag row only through its reference row, so it never holds a dag row such a writer waits
-- for while waiting for that writer. An asset with resolutions takes the UNION: every
-- reference and alias-clause row first (the derived table, materialized before the join),
-- then the dag rows, so a producer holding a consumer's dag row never waits for one of its
-- alias-clause rows. One queue row per consumer even when it references the asset both
-- directly and through an alias. The index hints keep the optimizer from scanning a small
-- table through a join buffer, which would lock the rows of every consumer.
-- MySQL 8 / MariaDB: a locking clause covers the tables of its own query block only, so each
-- block of the UNION has its own (in parentheses, as both require).
DELIMITER $$
DROP TRIGGER IF EXISTS {{ns}}.asset_event_fan_out
$$
CREATE TRIGGER {{ns}}.asset_event_fan_out
    AFTER INSERT ON {{ns}}.asset_event
    FOR EACH ROW
BEGIN
    DECLARE v_resolutions BIGINT;
    DECLARE v_partitioned BIGINT;
    SELECT COUNT(*) INTO v_resolutions
      FROM {{ns}}.asset_alias_asset aa FORCE INDEX (asset_alias_asset_asset_idx)
     WHERE aa.asset_id = NEW.asset_id
      LOCK IN SHARE MODE;
    IF v_resolutions = 0 THEN
        INSERT INTO {{ns}}.asset_dag_run_queue (target_dag_id, asset_event_id, asset_id, created_at)
        SELECT d.dag_id, NEW.id, NEW.asset_id, NEW.`timestamp`
          FROM {{ns}}.dag_schedule_asset_reference r FORCE INDEX (PRIMARY)
          STRAIGHT_JOIN {{ns}}.dag d FORCE INDEX (PRIMARY) ON d.dag_id = r.dag_id
         WHERE r.asset_id = NEW.asset_id
           AND (NOT d.is_paused OR d.queue_while_paused)
          LOCK IN SHARE MODE;
    ELSE
        INSERT INTO {{ns}}.asset_dag_run_queue (target_dag_id, asset_event_id, asset_id, created_at)
        SELECT d.dag_id, NEW.id, NEW.asset_id, NEW.`timestamp`
          FROM ((SELECT r.dag_id
                   FROM {{ns}}.dag_schedule_asset_reference r
                  WHERE r.asset_id = NEW.asset_id
                   LOCK IN SHARE MODE)
                UNION
                (SELECT ca.dag_id
                   FROM {{ns}}.asset_alias_asset aa FORCE INDEX (asset_alias_asset_asset_idx)
                   STRAIGHT_JOIN {{ns}}.dag_condition_alias ca FORCE INDEX (dag_condition_alias_alias_idx)
                      ON ca.alias_id = aa.alias_id
                  WHERE aa.asset_id = NEW.asset_id
                   LOCK IN SHARE MODE)) t
          STRAIGHT_JOIN {{ns}}.dag d FORCE INDEX (PRIMARY) ON d.dag_id = t.dag_id
         WHERE NOT d.is_paused OR d.queue_while_paused
          LOCK IN SHARE MODE;
    END IF;

    -- Partitioned consumers: each of their new queue rows gets its
    -- row in asset_partition_queue, with the consumer's key the event maps to (partition_map
    -- signals AQ011 for an event it cannot map: the registration fails, nothing is written).
    -- Read back from the queue rows written above, so it is exactly those. Usually no consumer
    -- of the asset is partitioned: one look at its reference rows, read above already; through
    -- an alias the consumers are looked at too (identity mapping).
    SELECT COUNT(*) INTO v_partitioned
      FROM {{ns}}.dag_schedule_asset_reference r FORCE INDEX (PRIMARY)
     WHERE r.asset_id = NEW.asset_id AND r.partition_mapping IS NOT NULL;
    IF v_partitioned > 0 OR v_resolutions > 0 THEN
        CALL {{ns}}.partition_fan_out(NEW.id, NEW.asset_id, NEW.partition_key, NEW.`timestamp`);
    END IF;
END
$$
DELIMITER ;
