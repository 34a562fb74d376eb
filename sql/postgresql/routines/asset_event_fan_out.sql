-- Fan-out (I1, I2): one queue row per consumer of the event's asset (directly, or through an
-- alias the asset has resolved to) that is unpaused or queues while paused, written by the
-- inserting statement itself, so an event and its queue rows commit or roll back together,
-- whoever inserts the event. Statement-level with a transition table: a multi-row INSERT
-- fans out with one join instead of one query per row. Each dag row and each
-- reference row it queues through is locked FOR KEY SHARE. On the dag row it is what keeps
-- every queue row's consumer (the queue has no foreign keys):
-- delete_dag's FOR UPDATE waits for the producers holding it, then deletes the consumer's
-- queue rows, and a producer after it skips the deleted consumer. On the
-- reference row it makes a re-declare that drops the asset wait for the producers in flight,
-- and the producers after it see its new references: no event is queued for a consumer that
-- no longer depends on its asset (MySQL's fan-out locks the reference rows too). KEY SHARE
-- conflicts with neither a scheduler pass (NO KEY UPDATE) nor a re-declare that keeps the
-- asset; it waits only for deletes.
CREATE OR REPLACE FUNCTION {{ns}}.asset_event_fan_out() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    v_aliased boolean := false;
BEGIN
    INSERT INTO {{ns}}.asset_dag_run_queue (target_dag_id, asset_event_id, asset_id, created_at)
    SELECT d.dag_id, e.id, e.asset_id, e."timestamp"
      FROM new_events e
      JOIN {{ns}}.dag_schedule_asset_reference r ON r.asset_id = e.asset_id
      JOIN {{ns}}.dag d ON d.dag_id = r.dag_id
     WHERE NOT d.is_paused OR d.queue_while_paused
       FOR KEY SHARE OF d, r;

    -- Through aliases: usually no alias has resolved to these assets and this is one index
    -- probe. A consumer with the alias in two clauses, or that also references the asset
    -- directly, already has its row: ON CONFLICT skips the second.
    IF EXISTS (SELECT 1 FROM new_events e
                 JOIN {{ns}}.asset_alias_asset aa ON aa.asset_id = e.asset_id) THEN
        INSERT INTO {{ns}}.asset_dag_run_queue (target_dag_id, asset_event_id, asset_id, created_at)
        SELECT d.dag_id, e.id, e.asset_id, e."timestamp"
          FROM new_events e
          JOIN {{ns}}.asset_alias_asset aa ON aa.asset_id = e.asset_id
          JOIN {{ns}}.dag_condition_alias ca ON ca.alias_id = aa.alias_id
          JOIN {{ns}}.dag d ON d.dag_id = ca.dag_id
         WHERE NOT d.is_paused OR d.queue_while_paused
           FOR KEY SHARE OF d, ca
        ON CONFLICT DO NOTHING;
        v_aliased := true;
    END IF;

    -- Partitioned consumers: each of their new queue rows gets its
    -- row in asset_partition_queue, with the consumer's key the event maps to (partition_map
    -- raises AQ011 for an event it cannot map: the registration fails, nothing is written).
    -- Read back from the queue rows this statement wrote, so it is exactly those. Usually no
    -- consumer of these assets is partitioned and this is one probe of an empty index; through
    -- an alias the consumers are looked at too (identity mapping).
    IF v_aliased OR EXISTS (SELECT 1 FROM new_events e
                              JOIN {{ns}}.dag_schedule_asset_reference r ON r.asset_id = e.asset_id
                             WHERE r.partition_mapping IS NOT NULL) THEN
        INSERT INTO {{ns}}.asset_partition_queue
               (target_dag_id, asset_event_id, partition_key, asset_id, source_key, created_at)
        SELECT q.target_dag_id, q.asset_event_id, m.target_key, q.asset_id, m.source_key, q.created_at
          FROM new_events e
          JOIN {{ns}}.asset_dag_run_queue q ON q.asset_event_id = e.id
          JOIN {{ns}}.dag d ON d.dag_id = q.target_dag_id
          LEFT JOIN {{ns}}.dag_schedule_asset_reference r
                 ON r.asset_id = q.asset_id AND r.dag_id = q.target_dag_id
          CROSS JOIN LATERAL {{ns}}.partition_map(q.target_dag_id, q.asset_id,
                                                  coalesce(r.partition_mapping, 'identity'),
                                                  e.partition_key) m
         WHERE d.partitioning IS NOT NULL;
    END IF;
    RETURN NULL;
END
$$;
