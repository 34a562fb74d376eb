-- The assets present for key p_key of partitioned consumer p_dag_id among the rows given as
-- parallel arrays (asset, upstream key): those with at least partition_required distinct
-- upstream keys.
CREATE OR REPLACE FUNCTION {{ns}}.partition_present(
    p_dag_id  text,
    p_key     text,
    p_assets  bigint[],
    p_sources text[]
) RETURNS bigint[]
LANGUAGE sql STABLE AS $$
    SELECT coalesce(array_agg(s.asset_id), '{}')
      FROM (SELECT c.asset_id, count(DISTINCT c.source_key) AS n
              FROM unnest(p_assets, p_sources) AS c(asset_id, source_key)
             GROUP BY c.asset_id) s
      LEFT JOIN {{ns}}.dag_schedule_asset_reference r
             ON r.dag_id = p_dag_id AND r.asset_id = s.asset_id
     WHERE s.n >= {{ns}}.partition_required(p_dag_id, s.asset_id, r.partition_mapping,
                                             r.partition_require, p_key)
$$;
