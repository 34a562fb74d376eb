-- How many distinct upstream keys (source_key) of asset p_asset_id consumer key p_key needs
-- under mapping p_mapping: 1 for identity or partition_require 'any'; with 'all', 24 hours
-- of a day, 7 days of an ISO week, the days of a month, or every upstream key a static
-- mapping maps to p_key.
CREATE OR REPLACE FUNCTION {{ns}}.partition_required(
    p_dag_id   text,
    p_asset_id bigint,
    p_mapping  text,
    p_require  text,
    p_key      text
) RETURNS bigint
LANGUAGE plpgsql STABLE AS $$
BEGIN
    IF p_mapping IS NULL OR p_mapping = 'identity' OR p_require IS DISTINCT FROM 'all' THEN
        RETURN 1;
    ELSIF p_mapping = 'hour_to_day' THEN
        RETURN 24;
    ELSIF p_mapping = 'day_to_week' THEN
        RETURN 7;
    ELSIF p_mapping = 'day_to_month' THEN
        RETURN extract(day FROM {{ns}}.partition_day(p_key || '-01') + interval '1 month' - interval '1 day');
    END IF;
    RETURN (SELECT count(*) FROM {{ns}}.dag_partition_static_key s
             WHERE s.dag_id = p_dag_id AND s.asset_id = p_asset_id AND s.target_key = p_key);
END
$$;
