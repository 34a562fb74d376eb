-- Retention, step 2: examines the next p_batch_size events whose timestamp is before
-- p_older_than, in (timestamp, id) order after the cursor (p_after_timestamp, p_after_id;
-- NULL: from the start), and deletes those that are consumed: no queue row (nobody still
-- waits for them) and no link (the runs that consumed them were purged, or there were none).
-- Returns how many it deleted and examined, and the cursor for the next batch; fewer
-- examined than p_batch_size means the end. The cursor moves past events it keeps, so a
-- long-queued event (a paused consumer, an AND waiting for its other asset) is examined once
-- per purge, not once per batch.
--
-- Never deletes a queued event: the NOT EXISTS below (the queue has no foreign key to
-- asset_event). An event's queue rows are written by the statement
-- that inserts it and commit with it, so a snapshot that sees the event sees all of them
-- that are left, and none is added later. Never waits for producers or schedulers: the window is a plain read; only
-- events that pass the test are locked, SKIP LOCKED. Nobody else locks those: producers
-- insert new events, schedulers lock none (the link table has no foreign
-- keys). Nor can a pass link one after the test: a pass links only the events of
-- queue rows it deletes, and the test's one snapshot saw no queue row of the event (a pass
-- still open holds its deleted rows, which the snapshot still sees; a committed one wrote its
-- links in the same commit, which the snapshot sees); queue rows are written only with their
-- event.
CREATE OR REPLACE FUNCTION {{ns}}.purge_events(
    p_older_than      timestamptz,
    p_batch_size      integer,
    p_after_timestamp timestamptz DEFAULT NULL,
    p_after_id        bigint DEFAULT NULL
) RETURNS TABLE (deleted bigint, examined bigint, last_timestamp timestamptz, last_id bigint)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_ids bigint[];
    v_timestamps timestamptz[];
BEGIN
    IF p_older_than IS NULL OR p_batch_size IS NULL OR p_batch_size < 1 THEN
        RAISE EXCEPTION 'purge_events needs a cutoff and a positive batch size, got % and %',
                quote_nullable(p_older_than), quote_nullable(p_batch_size)
            USING ERRCODE = 'AQ002';
    END IF;
    SELECT array_agg(w.id ORDER BY w."timestamp", w.id),
           array_agg(w."timestamp" ORDER BY w."timestamp", w.id)
      INTO v_ids, v_timestamps
      FROM (SELECT e.id, e."timestamp"
              FROM {{ns}}.asset_event e
             WHERE e."timestamp" < p_older_than
               AND (e."timestamp", e.id) > (coalesce(p_after_timestamp, '-infinity'),
                                            coalesce(p_after_id, 0))
             ORDER BY e."timestamp", e.id
             LIMIT p_batch_size) w;
    examined := coalesce(cardinality(v_ids), 0);
    deleted := 0;
    IF examined = 0 THEN
        last_timestamp := p_after_timestamp;
        last_id := p_after_id;
        RETURN NEXT;
        RETURN;
    END IF;
    last_timestamp := v_timestamps[examined];
    last_id := v_ids[examined];

    DELETE FROM {{ns}}.asset_event e
     WHERE e.id IN (SELECT c.id
                      FROM {{ns}}.asset_event c
                     WHERE c.id = ANY (v_ids)
                       AND NOT EXISTS (SELECT 1 FROM {{ns}}.asset_dag_run_queue q
                                        WHERE q.asset_event_id = c.id)
                       AND NOT EXISTS (SELECT 1 FROM {{ns}}.dagrun_asset_event l
                                        WHERE l.asset_event_id = c.id)
                       FOR UPDATE SKIP LOCKED);
    GET DIAGNOSTICS deleted = ROW_COUNT;
    RETURN NEXT;
END
$$;
