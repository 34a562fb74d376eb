-- Migration 0013_queue_checks (up): the queue loses its two foreign keys; delete_dag
-- deletes its consumer's queue rows itself.
--
-- asset_dag_run_queue had a foreign key to dag (ON DELETE CASCADE) and one to asset_event
-- (no cascade: a queued event could not be deleted). Each is a per-row query on every queue
-- row a producer writes, 8 of its 9 checks at 4 consumers; without them one event per
-- transaction is 1.13x faster at 1 client and 1.05x at 8, a batch of 1,000 events 1.52x (4
-- consumers, durable commits, against 0012 side by side: python benchmarks/revisions.py),
-- for rows the routines already make sure of:
--   * queue rows are written only by the fan-out trigger, in the statement that inserts
--     their event, for consumer rows it locks FOR KEY SHARE (the lock the check took);
--   * the cascade from dag is now delete_dag's own delete, after its FOR UPDATE of the dag
--     row has waited for the producers holding it; delete_dag now runs only at READ
--     COMMITTED (AQ002), where that delete's snapshot has their rows;
--   * no queued event is deleted: purge_events deletes only events without a queue row, as
--     it did, and delete_asset deletes its events' queue rows first, as it did.
-- The indexes stay (asset_dag_run_queue_event_idx serves purge_events' test).
--
-- Online: dropping a foreign key changes the catalog only (no scan), under a short exclusive
-- lock of the queue and of the two tables it referenced, taken with the revision's lock
-- timeout; delete_dag is replaced in place in the same transaction (a call in progress
-- finishes on the old body, with the cascade still there). It is granted to no role, and
-- CREATE OR REPLACE keeps its (default) security and settings.
--
-- {{ns}} is replaced by the quoted namespace when the file is loaded.

ALTER TABLE {{ns}}.asset_dag_run_queue
    DROP CONSTRAINT IF EXISTS asset_dag_run_queue_target_dag_id_fkey,
    DROP CONSTRAINT IF EXISTS asset_dag_run_queue_asset_event_id_fkey;

CREATE OR REPLACE FUNCTION {{ns}}.delete_dag(p_dag_id text) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    IF current_setting('transaction_isolation') <> 'read committed' THEN
        RAISE EXCEPTION 'delete_dag runs only at READ COMMITTED (this transaction is %)',
                current_setting('transaction_isolation')
            USING ERRCODE = 'AQ002',
                  HINT = 'Delete the consumer in a READ COMMITTED transaction (PostgreSQL''s default).';
    END IF;
    PERFORM 1 FROM {{ns}}.dag d WHERE d.dag_id = p_dag_id FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'unknown dag %', quote_nullable(p_dag_id) USING ERRCODE = 'AQ003';
    END IF;
    PERFORM 1 FROM {{ns}}.dag_run r WHERE r.dag_id = p_dag_id FOR UPDATE;
    DELETE FROM {{ns}}.dagrun_asset_event l WHERE l.dag_id = p_dag_id;
    DELETE FROM {{ns}}.asset_dag_run_queue q WHERE q.target_dag_id = p_dag_id;
    DELETE FROM {{ns}}.dag d WHERE d.dag_id = p_dag_id;
END
$$;
