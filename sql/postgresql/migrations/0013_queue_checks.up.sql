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
-- The indexes stay (asset_dag_run_queue_event_idx serves purge_events' test). delete_asset
-- deletes its events' queue rows through its events and that index, as MySQL's does, instead
-- of by asset_id, which no queue index leads with: that delete read every consumer's queue.
--
-- Online: dropping a foreign key changes the catalog only (no scan), under a short exclusive
-- lock of the queue and of the two tables it referenced, taken with the revision's lock
-- timeout; delete_dag and delete_asset are replaced in place in the same transaction (a call
-- in progress finishes on the old body, with the cascade still there). Neither is granted to
-- a role, and CREATE OR REPLACE keeps their (default) security and settings.
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

CREATE OR REPLACE FUNCTION {{ns}}.delete_asset(p_asset text)
RETURNS TABLE (deleted_events bigint)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_id   bigint;
    v_dags text;
BEGIN
    v_id := {{ns}}.resolve_asset(p_asset);
    PERFORM 1 FROM {{ns}}.asset a WHERE a.id = v_id FOR UPDATE;
    SELECT string_agg(quote_literal(x.dag_id), ', ' ORDER BY x.dag_id) INTO v_dags
      FROM (SELECT DISTINCT c.dag_id FROM {{ns}}.dag_condition_clause c
             WHERE c.asset_id = v_id ORDER BY c.dag_id LIMIT 5) x;
    IF v_dags IS NOT NULL THEN
        RAISE EXCEPTION 'asset % is in the condition of dag %', quote_literal(p_asset), v_dags
            USING ERRCODE = 'AQ007',
                  HINT = 'Re-declare (or delete) those consumers without it first.';
    END IF;
    -- Its events' queue rows through its events (the asset's index) and the queue's event
    -- index, as MySQL's does: the queue has no index by asset, and a delete by asset_id read
    -- every consumer's queue (0013_queue_checks).
    DELETE FROM {{ns}}.asset_dag_run_queue q
     USING {{ns}}.asset_event e
     WHERE e.asset_id = v_id AND q.asset_event_id = e.id;
    -- Their partition rows (migration 0009_partitions): no index by asset, a scan of the
    -- partitioned consumers' queue rows; deleting an asset is rare.
    DELETE FROM {{ns}}.asset_partition_queue p WHERE p.asset_id = v_id;
    -- The links of its events, by hand (no foreign keys on the link table since
    -- 0012_link_checks), after the queue rows: that delete waited for every pass holding one
    -- of them (a pass deletes the rows it claims and holds them to its commit), and this
    -- statement's snapshot, taken after it, has those passes' links. A pass that claims one of
    -- them later finds it deleted by us: its delete waits for our commit, deletes fewer rows
    -- than it claimed, and the claim guard (AQ900) rolls it back before it links anything.
    DELETE FROM {{ns}}.dagrun_asset_event l
     USING {{ns}}.asset_event e
     WHERE e.asset_id = v_id AND l.asset_event_id = e.id;
    DELETE FROM {{ns}}.asset_event e WHERE e.asset_id = v_id;
    GET DIAGNOSTICS deleted_events = ROW_COUNT;
    -- No reference row names it either: references are the conditions' assets, checked above.
    DELETE FROM {{ns}}.asset a WHERE a.id = v_id;
    RETURN NEXT;
END
$$;
