-- An item may carry "aliases", a JSON array of 1 to 100 alias names (1 to 512 characters;
-- null or absent: none). Before the events are
-- inserted, each alias is created if new and resolved to its item's asset, so the fan-out
-- already queues the event for the alias's consumers; each created event records the aliases
-- it came through. A retry (an idempotency key that met an existing event) records nothing new.
--
-- Registers a batch of events in the caller's transaction, in one round trip, and returns one
-- result set with one row per item in input order (item_no, event_id, asset_id,
-- event_timestamp, created), with register_event's guarantees for each. p_events is a JSON
-- array of at most 10,000 objects {"asset": name or uri, "extra", "source_dag_id",
-- "source_task_id", "source_run_id", "source_map_index", "idempotency_key", "aliases",
-- "partition_key"}; only "asset" is required. The events of one batch share one timestamp.
--
-- All or nothing, once the caller rolls back on error (as after any routine error here).
-- Every item is checked and every asset resolved before anything is written: one unknown asset
-- (AQ001) or extra that is not an object, or bad aliases (AQ002) fails the call with nothing
-- inserted. A key reused with another extra (AQ005), or a value the table refuses, fails it
-- after some rows may have been inserted in the caller's transaction. Items with the same
-- asset and idempotency key are one event, as retries would be: the first creates it (unless
-- it exists already), the others return it with created = 0. MySQL has no statement-level
-- triggers: the row-level trigger fans out each event of the batch.
--
-- Under autocommit each statement of a procedure commits on its own, so the row-by-row path
-- is atomic only inside a transaction: the Python layer opens one on an autocommit
-- connection.
--
-- The work is done by insert_event_batch, through which complete_run registers a run's
-- output events too; this procedure returns its rows.
DELIMITER $$
DROP PROCEDURE IF EXISTS {{ns}}.register_events
$$
CREATE PROCEDURE {{ns}}.register_events(IN p_events JSON)
MODIFIES SQL DATA
BEGIN
    DECLARE v_first_id  BIGINT;
    DECLARE v_timestamp DATETIME(6);
    CALL {{ns}}.insert_event_batch(p_events, v_first_id, v_timestamp);
    IF v_first_id IS NULL THEN
        SELECT b.item_no, b.event_id, b.asset_id, b.event_timestamp, b.created
          FROM {{ns}}._assetq_batch b
         ORDER BY b.item_no;
    ELSE
        SELECT b.item_no, v_first_id + b.item_no - 1 AS event_id, b.asset_id,
               v_timestamp AS event_timestamp, TRUE AS created
          FROM {{ns}}._assetq_batch b
         ORDER BY b.item_no;
    END IF;
    DROP TEMPORARY TABLE IF EXISTS {{ns}}._assetq_batch;
END
$$
DELIMITER ;
