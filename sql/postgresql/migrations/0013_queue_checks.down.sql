-- Migration 0013_queue_checks (down): the queue gets its two foreign keys back (the cascade
-- from dag included), delete_dag its 0012_link_checks body, which leaves the queue rows to
-- that cascade and runs at any isolation level, and delete_asset its 0012 body (its queue
-- rows by asset_id).
--
-- Queue rows whose consumer or event is gone (a DELETE by hand under 0013 that left them) are
-- deleted first: the cascade would have deleted those of a consumer, and a key cannot be
-- validated over them. The keys are added NOT VALID and then validated: adding takes a short
-- lock of the three tables (no scan); the validation reads the queue under a lock that lets
-- producers and passes go on (SHARE UPDATE EXCLUSIVE on the queue, ROW SHARE on the others).
--
-- {{ns}} is replaced by the quoted namespace when the file is loaded.

DELETE FROM {{ns}}.asset_dag_run_queue q
 WHERE NOT EXISTS (SELECT 1 FROM {{ns}}.dag d WHERE d.dag_id = q.target_dag_id)
    OR NOT EXISTS (SELECT 1 FROM {{ns}}.asset_event e WHERE e.id = q.asset_event_id);

ALTER TABLE {{ns}}.asset_dag_run_queue
    DROP CONSTRAINT IF EXISTS asset_dag_run_queue_target_dag_id_fkey,
    DROP CONSTRAINT IF EXISTS asset_dag_run_queue_asset_event_id_fkey,
    ADD CONSTRAINT asset_dag_run_queue_target_dag_id_fkey FOREIGN KEY (target_dag_id)
        REFERENCES {{ns}}.dag (dag_id) ON DELETE CASCADE NOT VALID,
    ADD CONSTRAINT asset_dag_run_queue_asset_event_id_fkey FOREIGN KEY (asset_event_id)
        REFERENCES {{ns}}.asset_event (id) NOT VALID;
ALTER TABLE {{ns}}.asset_dag_run_queue VALIDATE CONSTRAINT asset_dag_run_queue_target_dag_id_fkey;
ALTER TABLE {{ns}}.asset_dag_run_queue VALIDATE CONSTRAINT asset_dag_run_queue_asset_event_id_fkey;

CREATE OR REPLACE FUNCTION {{ns}}.delete_dag(p_dag_id text) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM 1 FROM {{ns}}.dag d WHERE d.dag_id = p_dag_id FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'unknown dag %', quote_nullable(p_dag_id) USING ERRCODE = 'AQ003';
    END IF;
    PERFORM 1 FROM {{ns}}.dag_run r WHERE r.dag_id = p_dag_id FOR UPDATE;
    DELETE FROM {{ns}}.dagrun_asset_event l WHERE l.dag_id = p_dag_id;
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
    DELETE FROM {{ns}}.asset_dag_run_queue q WHERE q.asset_id = v_id;
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
