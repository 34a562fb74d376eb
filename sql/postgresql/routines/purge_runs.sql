-- Retention, step 1: deletes at most p_batch_size runs created before p_older_than, oldest
-- first, with their links. Returns how many were deleted. Run each batch in a short
-- transaction of its own (assetq.purge does). A run locked by someone else is skipped, not
-- waited for (SKIP LOCKED), and left for a later batch.
--
-- The links are deleted by hand, in the same statement (no foreign keys on the link
-- table): the runs locked once, their links, then the runs. Nobody adds a
-- link to a run it finds: links are written only in the pass that creates their run, in the
-- same transaction, and the candidates are committed, finished runs.
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
