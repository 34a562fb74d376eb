-- Sets the partitioning of consumer p_dag_id; the Python layer
-- calls it right after declare_dag, in the same transaction. p_partitions is NULL for an
-- unpartitioned consumer, or {"assets": [{"asset": name or uri, "mapping": "identity" |
-- "hour_to_day" | "day_to_week" | "day_to_month" | "static", "require": "all" | "any",
-- "keys": [[upstream key, consumer key], ...] (static only)}, ...]}, one item per asset of the
-- condition whose mapping is not identity (the others map by identity). "require" (default
-- "all") says whether a consumer key needs every upstream key that maps to it or any one.
--
-- The same partitioning for the same condition as before writes nothing. Otherwise the
-- consumer's row is locked FOR UPDATE first, which waits for the producers in flight (they
-- hold KEY SHARE on it) and holds new ones back until the caller commits; its reference rows
-- get their mappings, and its queued events are mapped again (AQ011 if one cannot be: the
-- declaration fails, nothing is written), each key evaluated afresh by the next pass.
-- AQ002 for a malformed item, an asset that is not in the condition (aliases map by
-- identity) or an asset named twice; AQ003 for an unknown consumer.
CREATE OR REPLACE FUNCTION {{ns}}.set_dag_partitions(p_dag_id text, p_partitions jsonb) RETURNS void
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_condition jsonb;
    v_old       jsonb;
    v_new       jsonb;
    v_cap       integer;
    v_created   timestamptz;
    v_bad       record;
    v_items     jsonb := coalesce(p_partitions -> 'assets', '[]'::jsonb);
    v_asset_ids bigint[];
    v_mappings  text[];
    v_requires  text[];
    v_keys      jsonb[];
BEGIN
    SELECT d.condition, d.partitioning, d.max_events_per_run, d.created_at
      INTO v_condition, v_old, v_cap, v_created
      FROM {{ns}}.dag d WHERE d.dag_id = p_dag_id;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'unknown dag %', quote_nullable(p_dag_id) USING ERRCODE = 'AQ003';
    END IF;
    IF p_partitions IS NOT NULL THEN
        IF jsonb_typeof(p_partitions) <> 'object' OR jsonb_typeof(v_items) <> 'array' THEN
            RAISE EXCEPTION 'partitions of dag % must be NULL or {"assets": [...]}', p_dag_id
                USING ERRCODE = 'AQ002';
        END IF;
        SELECT i.ord INTO v_bad
          FROM jsonb_array_elements(v_items) WITH ORDINALITY AS i(item, ord)
         WHERE jsonb_typeof(i.item) <> 'object'
            OR jsonb_typeof(i.item -> 'asset') IS DISTINCT FROM 'string'
            OR coalesce(i.item ->> 'mapping', '')
                   NOT IN ('identity', 'hour_to_day', 'day_to_week', 'day_to_month', 'static')
            OR coalesce(i.item ->> 'require', 'all') NOT IN ('all', 'any')
            OR (i.item ->> 'mapping' = 'static') <> (jsonb_typeof(i.item -> 'keys') IS NOT DISTINCT FROM 'array')
            OR (i.item ->> 'mapping' = 'static'
                AND (jsonb_array_length(i.item -> 'keys') = 0
                     OR EXISTS (SELECT 1 FROM jsonb_array_elements(i.item -> 'keys') k
                                 WHERE jsonb_typeof(k) <> 'array' OR jsonb_array_length(k) <> 2
                                    OR jsonb_typeof(k -> 0) <> 'string' OR jsonb_typeof(k -> 1) <> 'string'
                                    OR k ->> 0 = '' OR k ->> 1 = ''
                                    OR right(k ->> 0, 1) = ' ' OR right(k ->> 1, 1) = ' '
                                    OR length(k ->> 0) > 250 OR length(k ->> 1) > 250)
                     OR (SELECT count(DISTINCT k ->> 0) FROM jsonb_array_elements(i.item -> 'keys') k)
                        <> jsonb_array_length(i.item -> 'keys')))
         ORDER BY i.ord
         LIMIT 1;
        IF FOUND THEN
            RAISE EXCEPTION 'partition mapping % of dag % must be {"asset", "mapping": identity, hour_to_day, day_to_week, day_to_month or static, "require": all or any, "keys" (static only: distinct [upstream key, key] pairs of 1 to 250 characters, not ending with a space)}',
                    v_bad.ord, p_dag_id
                USING ERRCODE = 'AQ002';
        END IF;
        SELECT array_agg(coalesce((SELECT a.id FROM {{ns}}.asset a WHERE a.name = i.item ->> 'asset'),
                                  (SELECT a.id FROM {{ns}}.asset a WHERE a.uri = i.item ->> 'asset'))
                         ORDER BY i.ord),
               array_agg(i.item ->> 'mapping' ORDER BY i.ord),
               array_agg(CASE WHEN i.item ->> 'mapping' = 'identity' THEN 'any'
                              ELSE coalesce(i.item ->> 'require', 'all') END ORDER BY i.ord),
               array_agg(i.item -> 'keys' ORDER BY i.ord)
          INTO v_asset_ids, v_mappings, v_requires, v_keys
          FROM jsonb_array_elements(v_items) WITH ORDINALITY AS i(item, ord);
        SELECT m.ord, v_items -> (m.ord::integer - 1) ->> 'asset' AS asset INTO v_bad
          FROM unnest(v_asset_ids) WITH ORDINALITY AS m(asset_id, ord)
         WHERE NOT EXISTS (SELECT 1 FROM {{ns}}.dag_schedule_asset_reference r
                            WHERE r.dag_id = p_dag_id AND r.asset_id = m.asset_id)
            OR (SELECT count(*) FROM unnest(v_asset_ids) AS o(asset_id) WHERE o.asset_id = m.asset_id) > 1
         ORDER BY m.ord
         LIMIT 1;
        IF FOUND THEN
            RAISE EXCEPTION 'partition mapping of asset % for dag %: the asset must be in its condition (not through an alias), once',
                    quote_literal(v_bad.asset), p_dag_id
                USING ERRCODE = 'AQ002';
        END IF;
        -- With the condition and the cap it was declared for: a change of either evaluates
        -- every key afresh (a key a smaller cap could not satisfy may run now).
        v_new := jsonb_build_object('partitions', p_partitions, 'condition', v_condition,
                                    'max_events_per_run', v_cap);
    END IF;
    IF v_new IS NOT DISTINCT FROM v_old THEN
        RETURN;
    END IF;

    PERFORM 1 FROM {{ns}}.dag d WHERE d.dag_id = p_dag_id FOR UPDATE;
    -- The queued events are mapped again from this statement's snapshot: above READ
    -- COMMITTED that is the transaction's, older than the producers the lock just waited
    -- for, whose events would keep their old mapping or get none. A consumer created in this
    -- very transaction has no such producers.
    IF current_setting('transaction_isolation') <> 'read committed' AND v_created < now() THEN
        RAISE EXCEPTION 'the partitioning of consumer % can change only at READ COMMITTED (this transaction is %)',
                p_dag_id, current_setting('transaction_isolation')
            USING ERRCODE = 'AQ002',
                  HINT = 'Declare it in a READ COMMITTED transaction (PostgreSQL''s default).';
    END IF;

    UPDATE {{ns}}.dag_schedule_asset_reference r
       SET partition_mapping = CASE WHEN v_new IS NOT NULL THEN coalesce(m.mapping, 'identity') END,
           partition_require = CASE WHEN v_new IS NOT NULL THEN coalesce(m.require, 'any') END
      FROM (SELECT x.asset_id, s.mapping, s.require
              FROM {{ns}}.dag_schedule_asset_reference x
              LEFT JOIN unnest(v_asset_ids, v_mappings, v_requires) AS s(asset_id, mapping, require)
                     ON s.asset_id = x.asset_id
             WHERE x.dag_id = p_dag_id) m
     WHERE r.dag_id = p_dag_id AND r.asset_id = m.asset_id;

    DELETE FROM {{ns}}.dag_partition_static_key s WHERE s.dag_id = p_dag_id;
    INSERT INTO {{ns}}.dag_partition_static_key (dag_id, asset_id, upstream_key, target_key)
    SELECT p_dag_id, s.asset_id, k ->> 0, k ->> 1
      FROM unnest(v_asset_ids, v_mappings, v_keys) AS s(asset_id, mapping, keys),
           jsonb_array_elements(s.keys) k
     WHERE s.mapping = 'static';

    UPDATE {{ns}}.dag d
       SET partitioning = v_new, updated_at = clock_timestamp()
     WHERE d.dag_id = p_dag_id;

    DELETE FROM {{ns}}.asset_partition_queue p WHERE p.target_dag_id = p_dag_id;
    IF v_new IS NOT NULL THEN
        INSERT INTO {{ns}}.asset_partition_queue
               (target_dag_id, asset_event_id, partition_key, asset_id, source_key, created_at)
        SELECT q.target_dag_id, q.asset_event_id, m.target_key, q.asset_id, m.source_key, q.created_at
          FROM {{ns}}.asset_dag_run_queue q
          JOIN {{ns}}.asset_event e ON e.id = q.asset_event_id
          LEFT JOIN {{ns}}.dag_schedule_asset_reference r
                 ON r.asset_id = q.asset_id AND r.dag_id = q.target_dag_id
          CROSS JOIN LATERAL {{ns}}.partition_map(q.target_dag_id, q.asset_id,
                                                  coalesce(r.partition_mapping, 'identity'),
                                                  e.partition_key) m
         WHERE q.target_dag_id = p_dag_id;
    END IF;
END
$$;
