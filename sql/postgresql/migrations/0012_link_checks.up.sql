-- Migration 0012_link_checks (up): the link table loses its two foreign keys; the routines
-- that delete runs or events delete their links themselves.
--
-- dagrun_asset_event had a foreign key to asset_event (ON DELETE CASCADE) and one to dag_run
-- (dag_run_id, dag_id; ON DELETE CASCADE). A pass consuming a 100,000-event backlog spent
-- 1.9 s of 3.3 s in their checks (auto_explain with log_triggers: 100,000 calls each), for
-- rows the pass had just made sure of: links are written only by schedule_pass and
-- schedule_partitions, in the transaction that inserts their run, for the events of queue
-- rows the pass deletes by key (and a queued event cannot be deleted: the queue's own foreign
-- key to asset_event has no cascade). Without them that pass is 2.5x faster, a pass of 100
-- runs of 1,000 events 2.6x (interleaved, median of 6 rounds each).
--
-- What the cascades did is now done by the deleting routines, each of which says next to its
-- delete why no pass can add a link behind it:
--   * delete_dag locks the dag row first (waits for a pass holding it), then its runs, then
--     deletes its links by dag_id, then the dag row (the rest still cascades from it);
--   * delete_asset deletes the links of the asset's events after their queue rows (that
--     delete waits for every pass holding one of them);
--   * purge_runs deletes the links of the runs it locked, in the same statement.
-- purge_events deletes only events without links (unchanged). The unique key
-- dagrun_asset_event_once and every index stay; dag_run_id_dag_key (the composite key's
-- target) stays too, so the down script needs no new index.
--
-- Online: dropping a foreign key changes the catalog only (no scan), under a short exclusive
-- lock of the link table and the two tables it referenced, taken with the revision's lock
-- timeout; the three functions are replaced in place in the same transaction (a call in
-- progress finishes on the old body). None of them is granted to a role, and CREATE OR
-- REPLACE keeps their (default) security and settings.
--
-- {{ns}} is replaced by the quoted namespace when the file is loaded.

ALTER TABLE {{ns}}.dagrun_asset_event
    DROP CONSTRAINT IF EXISTS dagrun_asset_event_asset_event_id_fkey,
    DROP CONSTRAINT IF EXISTS dagrun_asset_event_run_fkey;

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
    WITH doomed AS (
        SELECT o.id
          FROM {{ns}}.dag_run o
         WHERE o.created_at < p_older_than
           -- Never a run someone may still work on (issue 12): a long run's worker would
           -- find it gone.
           AND o.state IN ('success', 'failed')
         ORDER BY o.created_at
         LIMIT p_batch_size
           FOR UPDATE SKIP LOCKED
    ), links AS (
        DELETE FROM {{ns}}.dagrun_asset_event l
         WHERE l.dag_run_id IN (SELECT d.id FROM doomed d)
    )
    DELETE FROM {{ns}}.dag_run r
     WHERE r.id IN (SELECT d.id FROM doomed d);
    GET DIAGNOSTICS deleted = ROW_COUNT;
    RETURN NEXT;
END
$$;

