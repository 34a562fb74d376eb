-- An item may carry "aliases", a JSON array of 1 to 100 alias names (1 to 512 characters;
-- null or absent: none). Before the events are
-- inserted, each alias is created if new and resolved to its item's asset, so the fan-out
-- already queues the event for the alias's consumers; each created event records the aliases
-- it came through. A retry (an idempotency key that met an existing event) records nothing new.
--
-- Registers a batch of events in the caller's transaction, in one round trip, and returns one
-- result set with one row per item in input order (item_no, event_id, asset_id,
-- event_timestamp, created, error_code, error_message), with register_event_v2's guarantees
-- for each. p_events is a JSON
-- array of at most 10,000 objects {"asset": name or uri, "extra", "source_dag_id",
-- "source_task_id", "source_run_id", "source_map_index", "idempotency_key", "aliases",
-- "partition_key"}; only "asset" is required. The events of one batch share one timestamp.
--
-- All or nothing, and a failed call leaves the caller's transaction as it was. Every item is
-- checked and every asset resolved before anything is written: one unknown asset (AQ001) or
-- extra that is not an object, or bad aliases (AQ002) fails the call with nothing inserted. A
-- key reused with another extra (AQ005), or a value the table refuses, fails it after some
-- rows were inserted: the call's work runs under a savepoint of its own, taken here, inside
-- the call's one round trip, and rolled back to before the error is raised again (the client
-- used to send SAVEPOINT and RELEASE around the call: two round trips more). A deadlock
-- (1213) has already rolled the whole transaction back, savepoint included: ROLLBACK TO
-- SAVEPOINT then fails with 1305, which is ignored, so the caller gets the deadlock, as
-- complete_run_v2 does. The same name, parameters and result columns as PostgreSQL's
-- register_events_v2, which reports its errors in error_code and error_message (a raised
-- error aborts the caller's transaction there); here they are raised, and always NULL. Items with the same
-- asset and idempotency key are one event, as retries would be: the first creates it (unless
-- it exists already), the others return it with created = 0. MySQL has no statement-level
-- triggers: the row-level trigger fans out each event of the batch.
--
-- Under autocommit each statement of a procedure commits on its own, so the row-by-row path
-- is atomic only inside a transaction: the Python layer opens one on an autocommit
-- connection.
--
-- The work is done by insert_event_batch, through which complete_run registers a run's
-- output events too; this procedure returns its rows. register_events, 0.1.0's, calls this.
DELIMITER $$
DROP PROCEDURE IF EXISTS {{ns}}.register_events_v2
$$
CREATE PROCEDURE {{ns}}.register_events_v2(IN p_events JSON)
MODIFIES SQL DATA
BEGIN
    DECLARE v_first_id  BIGINT;
    DECLARE v_timestamp DATETIME(6);
    DECLARE EXIT HANDLER FOR SQLEXCEPTION
    BEGIN
        BEGIN
            DECLARE CONTINUE HANDLER FOR 1305 BEGIN END;
            ROLLBACK TO SAVEPOINT assetq_register_events;
            RELEASE SAVEPOINT assetq_register_events;
        END;
        RESIGNAL;
    END;

    -- First, before anything that can fail: the handler rolls back to this point only.
    SAVEPOINT assetq_register_events;
    CALL {{ns}}.insert_event_batch(p_events, v_first_id, v_timestamp);
    BEGIN
        -- 1305 under autocommit: the savepoint ended with its own statement.
        DECLARE CONTINUE HANDLER FOR 1305 BEGIN END;
        RELEASE SAVEPOINT assetq_register_events;
    END;
    IF v_first_id IS NULL THEN
        SELECT b.item_no, b.event_id, b.asset_id, b.event_timestamp, b.created,
               NULL AS error_code, NULL AS error_message
          FROM {{ns}}._assetq_batch b
         ORDER BY b.item_no;
    ELSE
        SELECT b.item_no, v_first_id + b.item_no - 1 AS event_id, b.asset_id,
               v_timestamp AS event_timestamp, TRUE AS created,
               NULL AS error_code, NULL AS error_message
          FROM {{ns}}._assetq_batch b
         ORDER BY b.item_no;
    END IF;
    DROP TEMPORARY TABLE IF EXISTS {{ns}}._assetq_batch;
END
$$
DELIMITER ;
