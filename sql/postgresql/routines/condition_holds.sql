-- I6: consumer p_dag_id's condition holds on the assets p_assets when every clause has a
-- member among them (and there is at least one clause).
CREATE OR REPLACE FUNCTION {{ns}}.condition_holds(p_dag_id text, p_assets bigint[])
RETURNS boolean
LANGUAGE sql STABLE AS $$
    SELECT EXISTS (SELECT 1 FROM {{ns}}.dag_clause_members(p_dag_id))
       AND NOT EXISTS (SELECT 1
                         FROM {{ns}}.dag_clause_members(p_dag_id) m
                        GROUP BY m.clause_no
                       HAVING NOT coalesce(bool_or(m.asset_id = ANY (p_assets)), false))
$$;
