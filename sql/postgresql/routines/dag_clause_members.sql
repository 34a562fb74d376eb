-- The members of consumer p_dag_id's CNF clauses as (clause_no, asset_id): its asset members,
-- and the assets its alias members have resolved to. An alias that has resolved to nothing
-- yet gives (clause_no, NULL), so its clause is still there and still unsatisfied.
CREATE OR REPLACE FUNCTION {{ns}}.dag_clause_members(p_dag_id text)
RETURNS TABLE (clause_no integer, asset_id bigint)
LANGUAGE sql STABLE AS $$
    SELECT c.clause_no, c.asset_id
      FROM {{ns}}.dag_condition_clause c
     WHERE c.dag_id = p_dag_id
    UNION ALL
    SELECT ca.clause_no, aa.asset_id
      FROM {{ns}}.dag_condition_alias ca
      LEFT JOIN {{ns}}.asset_alias_asset aa ON aa.alias_id = ca.alias_id
     WHERE ca.dag_id = p_dag_id
$$;
