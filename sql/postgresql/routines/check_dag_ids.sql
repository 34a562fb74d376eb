-- AQ002 unless p_dag_ids is NULL or a JSON array of strings (dag ids): the consumer filter
-- of claims and passes.
CREATE OR REPLACE FUNCTION {{ns}}.check_dag_ids(p_dag_ids jsonb)
RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    IF p_dag_ids IS NOT NULL
       AND (jsonb_typeof(p_dag_ids) <> 'array'
            OR EXISTS (SELECT 1 FROM jsonb_array_elements(p_dag_ids) x WHERE jsonb_typeof(x) <> 'string'))
    THEN
        RAISE EXCEPTION 'dag_ids must be a JSON array of dag ids or NULL' USING ERRCODE = 'AQ002';
    END IF;
END
$$;
