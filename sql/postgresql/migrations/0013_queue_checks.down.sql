-- Migration 0013_queue_checks (down): the queue gets its two foreign keys back (the cascade
-- from dag included), and delete_dag its 0012_link_checks body, which leaves the queue rows
-- to that cascade and runs at any isolation level.
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
