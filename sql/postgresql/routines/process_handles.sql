-- Liveness. Replaces the consumers loop p_process_id has handlers for (process_dag) with
-- p_dag_ids, a JSON array of dag ids, so that status and doctor can tell a consumer whose
-- runs no live worker can execute. Returns the ids among them that name no declared
-- consumer (the worker warns about each, or refuses to start when strict); they are
-- recorded all the same: a consumer declared later is one the worker can run.
-- A worker calls it with every liveness heartbeat, in the heartbeat's short transaction (a
-- liveness row purged while its process was hung comes back with its consumers): rows
-- already there are not written again, so an unchanged set costs two index probes per
-- consumer and no write. AQ002 for a missing process id or a p_dag_ids that is not an
-- array of dag ids.
CREATE OR REPLACE FUNCTION {{ns}}.process_handles(p_process_id text, p_dag_ids jsonb)
RETURNS TABLE(unknown_dag_id text)
LANGUAGE plpgsql AS $$
BEGIN
    IF p_process_id IS NULL OR p_process_id = '' THEN
        RAISE EXCEPTION 'process_handles needs a process id' USING ERRCODE = 'AQ002';
    END IF;
    IF p_dag_ids IS NULL OR jsonb_typeof(p_dag_ids) <> 'array'
       OR EXISTS (SELECT 1
                    FROM jsonb_array_elements(p_dag_ids) AS j(item)
                   WHERE jsonb_typeof(j.item) <> 'string'
                      OR length(j.item #>> '{}') NOT BETWEEN 1 AND 250) THEN
        RAISE EXCEPTION 'dag_ids must be a JSON array of dag ids (1 to 250 characters), got %',
                left(coalesce(p_dag_ids::text, 'NULL'), 100)
            USING ERRCODE = 'AQ002';
    END IF;
    DELETE FROM {{ns}}.process_dag p
     WHERE p.process_id = p_process_id
       AND NOT EXISTS (SELECT 1 FROM jsonb_array_elements_text(p_dag_ids) AS j(id)
                        WHERE j.id = p.dag_id);
    INSERT INTO {{ns}}.process_dag (process_id, dag_id)
    SELECT DISTINCT p_process_id, j.id FROM jsonb_array_elements_text(p_dag_ids) AS j(id)
    ON CONFLICT DO NOTHING;
    RETURN QUERY
    SELECT DISTINCT j.id
      FROM jsonb_array_elements_text(p_dag_ids) AS j(id)
     WHERE NOT EXISTS (SELECT 1 FROM {{ns}}.dag d WHERE d.dag_id = j.id)
     ORDER BY j.id;
END
$$;

ALTER FUNCTION {{ns}}.process_handles(text, jsonb)
    SECURITY DEFINER SET search_path = pg_catalog, pg_temp;
