-- The partitioned part of the fan-out, called by the trigger on
-- asset_event for an event whose asset has a partitioned consumer (or has alias resolutions):
-- one asset_partition_queue row beside each queue row the trigger wrote for a partitioned
-- consumer, read back by the event's id. No temporary table: it runs inside a trigger.
DELIMITER $$
DROP PROCEDURE IF EXISTS {{ns}}.partition_fan_out
$$
CREATE PROCEDURE {{ns}}.partition_fan_out(
    IN p_event_id  BIGINT,
    IN p_asset_id  BIGINT,
    IN p_key       VARCHAR(250) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin,
    IN p_timestamp DATETIME(6)
)
MODIFIES SQL DATA
BEGIN
    DECLARE v_done    BOOLEAN DEFAULT FALSE;
    DECLARE v_dag_id  VARCHAR(250) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin;
    DECLARE v_mapping VARCHAR(20) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin;
    DECLARE v_target  VARCHAR(250) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin;
    DECLARE v_source  VARCHAR(250) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin;
    DECLARE c_rows CURSOR FOR
        SELECT q.target_dag_id, COALESCE(r.partition_mapping, 'identity')
          FROM {{ns}}.asset_dag_run_queue q FORCE INDEX (asset_dag_run_queue_event_idx)
          STRAIGHT_JOIN {{ns}}.dag d FORCE INDEX (PRIMARY) ON d.dag_id = q.target_dag_id
          LEFT JOIN {{ns}}.dag_schedule_asset_reference r FORCE INDEX (PRIMARY)
                 ON r.asset_id = q.asset_id AND r.dag_id = q.target_dag_id
         WHERE q.asset_event_id = p_event_id AND d.partitioning IS NOT NULL
         ORDER BY q.target_dag_id;
    DECLARE CONTINUE HANDLER FOR NOT FOUND SET v_done = TRUE;
    OPEN c_rows;
    row_loop: LOOP
        FETCH c_rows INTO v_dag_id, v_mapping;
        IF v_done THEN
            LEAVE row_loop;
        END IF;
        CALL {{ns}}.partition_map(v_dag_id, p_asset_id, v_mapping, p_key, v_target, v_source);
        INSERT INTO {{ns}}.asset_partition_queue
               (target_dag_id, asset_event_id, partition_key, asset_id, source_key, created_at)
        VALUES (v_dag_id, p_event_id, v_target, p_asset_id, v_source, p_timestamp);
    END LOOP;
    CLOSE c_rows;
END
$$
DELIMITER ;
