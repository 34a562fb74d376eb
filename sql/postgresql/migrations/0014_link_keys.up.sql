-- Migration 0014_link_keys (up): the link table's unique key is turned around, event first,
-- and its event index goes; delete_dag deletes its links through the dag's runs.
--
-- dagrun_asset_event had three indexes, each entry written for every link a pass inserts:
-- the primary key (dag_run_id, asset_event_id), the unique key dagrun_asset_event_once
-- (dag_id, asset_event_id), which is I4 (an event is linked at most once per consumer), and
-- dagrun_asset_event_event_idx (asset_event_id). Inserting the links was about 55% of a pass
-- consuming a 100,000-event backlog. The unique key is now (asset_event_id, dag_id): the same
-- uniqueness, still enforced by the database, and it serves every lookup by event
-- (purge_events' "still linked?" test, delete_asset's link delete), so the event index is
-- dropped; such a pass is about 1.2x faster (measured on a copy of the schema). The one
-- statement that needed the dag-first order, delete_dag's link delete by dag_id, now goes
-- through the dag's runs (dag_run_dag_state_idx, then the links' primary key): the runs it
-- has just locked FOR UPDATE, so the locking order (dag row, runs, links) is unchanged.
--
-- Online, mostly: the new unique index is built inside the revision's transaction, not
-- CONCURRENTLY (which cannot run in one), under a SHARE lock of the link table taken with the
-- revision's lock timeout: while it builds (time grows with the links, the history), passes,
-- which insert links, wait; producers go on (they do not touch the table), and so do readers
-- of the links. The constraint swap after it is catalog only, but takes an ACCESS EXCLUSIVE
-- lock held to the commit, which then comes at once: readers of the links (claim_runs,
-- consumed_events) wait only for those last statements. delete_dag is replaced in place in
-- the same transaction (a call in progress finishes on the old body); it is granted to no
-- role, and CREATE OR REPLACE keeps its (default) security and settings. delete_asset and
-- purge_events are unchanged: they join the links by event, which the new key leads with.
--
-- {{ns}} is replaced by the quoted namespace when the file is loaded.

CREATE UNIQUE INDEX dagrun_asset_event_once_turned
    ON {{ns}}.dagrun_asset_event (asset_event_id, dag_id);
-- ADD ... USING INDEX renames the index to the constraint's name: dagrun_asset_event_once
-- again, as a fresh install names it.
ALTER TABLE {{ns}}.dagrun_asset_event
    DROP CONSTRAINT dagrun_asset_event_once,
    ADD CONSTRAINT dagrun_asset_event_once UNIQUE USING INDEX dagrun_asset_event_once_turned;
DROP INDEX {{ns}}.dagrun_asset_event_event_idx;

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
    -- Through its runs (dag_run_dag_state_idx, then the links' primary key): no index of the
    -- links leads with dag_id since 0014_link_keys. The runs are the ones locked just above.
    DELETE FROM {{ns}}.dagrun_asset_event l
     USING {{ns}}.dag_run r
     WHERE r.dag_id = p_dag_id AND l.dag_run_id = r.id;
    DELETE FROM {{ns}}.asset_dag_run_queue q WHERE q.target_dag_id = p_dag_id;
    DELETE FROM {{ns}}.dag d WHERE d.dag_id = p_dag_id;
END
$$;
