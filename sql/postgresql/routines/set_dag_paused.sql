-- Pauses or unpauses a consumer. Events that commit while it is paused are not queued for it.
CREATE OR REPLACE FUNCTION {{ns}}.set_dag_paused(p_dag_id text, p_paused boolean) RETURNS void
LANGUAGE plpgsql AS $$
#variable_conflict use_column
BEGIN
    UPDATE {{ns}}.dag SET is_paused = p_paused, updated_at = clock_timestamp()
     WHERE dag_id = p_dag_id;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'unknown dag %', quote_nullable(p_dag_id) USING ERRCODE = 'AQ003';
    END IF;
END
$$;
