-- Liveness. Deletes loop p_process_id's row: the loop stopped
-- cleanly. Idempotent (no row, nothing done). Its consumers (process_handles) go with it.
CREATE OR REPLACE FUNCTION {{ns}}.process_gone(p_process_id text) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM {{ns}}.process_liveness l WHERE l.process_id = p_process_id;
    DELETE FROM {{ns}}.process_dag p WHERE p.process_id = p_process_id;
END
$$;

ALTER FUNCTION {{ns}}.process_gone(text)
    SECURITY DEFINER SET search_path = pg_catalog, pg_temp;
