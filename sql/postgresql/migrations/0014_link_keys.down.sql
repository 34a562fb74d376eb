-- Migration 0014_link_keys (down): the link table's unique key goes back to (dag_id,
-- asset_event_id), the event index comes back, and delete_dag gets its 0013_queue_checks
-- body (its links by dag_id, by the dag-first unique key).
--
-- Both indexes are built inside the revision's transaction (not CONCURRENTLY), under SHARE
-- locks of the link table: passes, which insert links, wait while they build; producers and
-- readers of the links go on until the catalog-only constraint swap, whose ACCESS EXCLUSIVE
-- lock is held to the commit that follows it.
--
-- {{ns}} is replaced by the quoted namespace when the file is loaded.

CREATE INDEX dagrun_asset_event_event_idx ON {{ns}}.dagrun_asset_event (asset_event_id);
CREATE UNIQUE INDEX dagrun_asset_event_once_turned
    ON {{ns}}.dagrun_asset_event (dag_id, asset_event_id);
ALTER TABLE {{ns}}.dagrun_asset_event
    DROP CONSTRAINT dagrun_asset_event_once,
    ADD CONSTRAINT dagrun_asset_event_once UNIQUE USING INDEX dagrun_asset_event_once_turned;

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
