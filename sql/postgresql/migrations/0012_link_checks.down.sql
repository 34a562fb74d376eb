-- Migration 0012_link_checks (down): the link table gets its two foreign keys back (with
-- their cascades), and delete_dag, delete_asset and purge_runs their 0011_runs_per_pass
-- bodies, which leave the links to those cascades.
--
-- Links whose run or event is gone (a DELETE by hand under 0012 that left them) are deleted
-- first: the cascade would have deleted them, and a key cannot be validated over them.
-- The keys are added NOT VALID and then validated: adding takes a short lock of the three
-- tables (no scan); the validation reads the links under a lock that lets producers and
-- passes go on (SHARE UPDATE EXCLUSIVE on the link table, ROW SHARE on the others).
--
-- {{ns}} is replaced by the quoted namespace when the file is loaded.

DELETE FROM {{ns}}.dagrun_asset_event l
 WHERE NOT EXISTS (SELECT 1 FROM {{ns}}.asset_event e WHERE e.id = l.asset_event_id)
    OR NOT EXISTS (SELECT 1 FROM {{ns}}.dag_run r
                    WHERE r.id = l.dag_run_id AND r.dag_id = l.dag_id);

ALTER TABLE {{ns}}.dagrun_asset_event
    DROP CONSTRAINT IF EXISTS dagrun_asset_event_asset_event_id_fkey,
    DROP CONSTRAINT IF EXISTS dagrun_asset_event_run_fkey,
    ADD CONSTRAINT dagrun_asset_event_asset_event_id_fkey FOREIGN KEY (asset_event_id)
        REFERENCES {{ns}}.asset_event (id) ON DELETE CASCADE NOT VALID,
    ADD CONSTRAINT dagrun_asset_event_run_fkey FOREIGN KEY (dag_run_id, dag_id)
        REFERENCES {{ns}}.dag_run (id, dag_id) ON DELETE CASCADE NOT VALID;
ALTER TABLE {{ns}}.dagrun_asset_event VALIDATE CONSTRAINT dagrun_asset_event_asset_event_id_fkey;
ALTER TABLE {{ns}}.dagrun_asset_event VALIDATE CONSTRAINT dagrun_asset_event_run_fkey;

CREATE OR REPLACE FUNCTION {{ns}}.delete_dag(p_dag_id text) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM {{ns}}.dag d WHERE d.dag_id = p_dag_id;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'unknown dag %', quote_nullable(p_dag_id) USING ERRCODE = 'AQ003';
    END IF;
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
    DELETE FROM {{ns}}.asset_event e WHERE e.asset_id = v_id;
    GET DIAGNOSTICS deleted_events = ROW_COUNT;
    -- No reference row names it either: references are the conditions' assets, checked above.
    DELETE FROM {{ns}}.asset a WHERE a.id = v_id;
    RETURN NEXT;
END
$$;

CREATE OR REPLACE FUNCTION {{ns}}.purge_runs(p_older_than timestamptz, p_batch_size integer)
RETURNS TABLE (deleted bigint)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
BEGIN
    IF p_older_than IS NULL OR p_batch_size IS NULL OR p_batch_size < 1 THEN
        RAISE EXCEPTION 'purge_runs needs a cutoff and a positive batch size, got % and %',
                quote_nullable(p_older_than), quote_nullable(p_batch_size)
            USING ERRCODE = 'AQ002';
    END IF;
    DELETE FROM {{ns}}.dag_run r
     WHERE r.id IN (SELECT o.id
                      FROM {{ns}}.dag_run o
                     WHERE o.created_at < p_older_than
                       -- Never a run someone may still work on (issue 12): a long run's worker
                       -- would find it gone.
                       AND o.state IN ('success', 'failed')
                     ORDER BY o.created_at
                     LIMIT p_batch_size
                       FOR UPDATE SKIP LOCKED);
    GET DIAGNOSTICS deleted = ROW_COUNT;
    RETURN NEXT;
END
$$;

