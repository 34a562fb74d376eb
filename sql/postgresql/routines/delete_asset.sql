-- Removes asset p_asset (a name or uri) with its events: their queue rows (consumers that
-- depended on it through an alias lose the pending ones), their links (runs that consumed
-- them keep their other events and their event_count) and alias resolutions. Refused with
-- AQ007 while a consumer condition names the asset: re-declare those consumers first. The
-- asset row is locked first, so producers registering for it finish before (their events are
-- deleted too) or fail after with a foreign-key error that assetq reports as unknown asset.
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
    -- every consumer's queue.
    DELETE FROM {{ns}}.asset_dag_run_queue q
     USING {{ns}}.asset_event e
     WHERE e.asset_id = v_id AND q.asset_event_id = e.id;
    -- Their partition rows: no index by asset, a scan of the
    -- partitioned consumers' queue rows; deleting an asset is rare.
    DELETE FROM {{ns}}.asset_partition_queue p WHERE p.asset_id = v_id;
    -- The links of its events, by hand (no foreign keys on the link
    -- table), after the queue rows: that delete waited for every pass holding one
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
