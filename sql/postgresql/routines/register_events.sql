-- Registers a batch of events in the caller's transaction, in one round trip, and returns one
-- row per item in input order (item_no 1, 2, ...), with register_event's guarantees for each.
-- p_events is a JSON array of at most 10,000 objects {"asset": name or uri, "extra",
-- "source_dag_id", "source_task_id", "source_run_id", "source_map_index", "idempotency_key",
-- "aliases", "partition_key"}; only "asset" is required. "aliases" is a JSON array of 1 to 100 alias names: each
-- alias is created if new and resolved to the item's asset before the events are inserted (so
-- the fan-out queues the event for the alias's consumers), and each created event records the
-- aliases it came through; a retry that met an existing event records nothing new. The events of one batch share one timestamp.
--
-- All or nothing. Every item is checked and every asset resolved before anything is written:
-- one unknown asset (AQ001) or extra that is not an object (AQ002) fails the whole call and
-- nothing is inserted. A key reused with another extra (AQ005), or a value the table refuses,
-- fails the call after the insert, which goes with it. Items with the same asset and
-- idempotency key are one event, as retries would be: the first creates it (unless it exists
-- already), the others return it with created = false.
--
-- One multi-row INSERT, so the statement-level trigger fans the whole batch out with one join.
-- Its ids are taken from the table's identity sequence beforehand, in input order: each item
-- knows its row by id, whatever order RETURNING would report rows in, and an item whose id is
-- missing afterwards is exactly one whose key met an existing event.
CREATE OR REPLACE FUNCTION {{ns}}.register_events(p_events jsonb)
RETURNS TABLE (
    item_no         integer,
    event_id        bigint,
    asset_id        bigint,
    event_timestamp timestamptz,
    created         boolean
)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_count     integer;
    v_now       timestamptz;
    v_ids       bigint[];
    v_assets    text[];
    v_asset_ids bigint[];
    v_extras    jsonb[];
    v_dag_ids   text[];
    v_task_ids  text[];
    v_run_ids   text[];
    v_indexes   integer[];
    v_keys      text[];
    v_aliases   jsonb[];
    v_parts     text[];
    v_bad       record;
BEGIN
    IF jsonb_typeof(p_events) IS DISTINCT FROM 'array' THEN
        RAISE EXCEPTION 'events must be a JSON array, got %', coalesce(jsonb_typeof(p_events), 'NULL')
            USING ERRCODE = 'AQ002';
    END IF;
    v_count := jsonb_array_length(p_events);
    IF v_count > 10000 THEN
        RAISE EXCEPTION 'a batch holds at most 10000 events, got %', v_count
            USING ERRCODE = 'AQ002',
                  HINT = 'Split it: several calls in one transaction are atomic together.';
    END IF;
    IF v_count = 0 THEN
        RETURN;
    END IF;

    SELECT i.ord, jsonb_typeof(i.item) AS item_type, jsonb_typeof(i.item -> 'extra') AS extra_type
      INTO v_bad
      FROM jsonb_array_elements(p_events) WITH ORDINALITY AS i(item, ord)
     WHERE jsonb_typeof(i.item) <> 'object'
        OR jsonb_typeof(i.item -> 'extra') NOT IN ('object', 'null')
     ORDER BY i.ord
     LIMIT 1;
    IF FOUND THEN
        IF v_bad.item_type <> 'object' THEN
            RAISE EXCEPTION 'event % of the batch must be a JSON object, got %', v_bad.ord, v_bad.item_type
                USING ERRCODE = 'AQ002';
        END IF;
        RAISE EXCEPTION 'event extra must be a JSON object, got % (event % of the batch)',
                v_bad.extra_type, v_bad.ord
            USING ERRCODE = 'AQ002';
    END IF;

    SELECT i.ord INTO v_bad
      FROM jsonb_array_elements(p_events) WITH ORDINALITY AS i(item, ord)
     WHERE jsonb_typeof(i.item -> 'aliases') <> 'null'
       AND (jsonb_typeof(i.item -> 'aliases') <> 'array'
            OR jsonb_array_length(i.item -> 'aliases') NOT BETWEEN 1 AND 100
            OR EXISTS (SELECT 1 FROM jsonb_array_elements(i.item -> 'aliases') x
                        WHERE jsonb_typeof(x) <> 'string' OR x #>> '{}' = ''
                           OR length(x #>> '{}') > 512))
     ORDER BY i.ord
     LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION 'aliases must be a JSON array of 1 to 100 alias names of 1 to 512 characters (event % of the batch)',
                v_bad.ord
            USING ERRCODE = 'AQ002';
    END IF;

    SELECT array_agg(i.item ->> 'asset' ORDER BY i.ord),
           array_agg(coalesce(nullif(i.item -> 'extra', 'null'::jsonb), '{}'::jsonb) ORDER BY i.ord),
           array_agg(i.item ->> 'source_dag_id' ORDER BY i.ord),
           array_agg(i.item ->> 'source_task_id' ORDER BY i.ord),
           array_agg(i.item ->> 'source_run_id' ORDER BY i.ord),
           array_agg(coalesce((i.item ->> 'source_map_index')::integer, -1) ORDER BY i.ord),
           array_agg(i.item ->> 'idempotency_key' ORDER BY i.ord),
           array_agg(nullif(i.item -> 'aliases', 'null'::jsonb) ORDER BY i.ord)
      INTO v_assets, v_extras, v_dag_ids, v_task_ids, v_run_ids, v_indexes, v_keys, v_aliases
      FROM jsonb_array_elements(p_events) WITH ORDINALITY AS i(item, ord);

    -- Partition keys: a string of 1 to 250 characters, or none.
    SELECT i.ord INTO v_bad
      FROM jsonb_array_elements(p_events) WITH ORDINALITY AS i(item, ord)
     WHERE jsonb_typeof(i.item -> 'partition_key') NOT IN ('string', 'null')
        OR i.item ->> 'partition_key' = '' OR length(i.item ->> 'partition_key') > 250
        OR right(i.item ->> 'partition_key', 1) = ' '
     ORDER BY i.ord
     LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION 'partition_key must be a string of 1 to 250 characters, not ending with a space (event % of the batch)', v_bad.ord
            USING ERRCODE = 'AQ002';
    END IF;
    v_parts := ARRAY(SELECT i.item ->> 'partition_key'
                       FROM jsonb_array_elements(p_events) WITH ORDINALITY AS i(item, ord)
                      ORDER BY i.ord);

    -- Each distinct asset is looked up once: by name, then by uri, as resolve_asset does.
    SELECT array_agg(r.id ORDER BY n.ord)
      INTO v_asset_ids
      FROM unnest(v_assets) WITH ORDINALITY AS n(asset, ord)
      LEFT JOIN (
            SELECT d.asset,
                   coalesce((SELECT a.id FROM {{ns}}.asset a WHERE a.name = d.asset),
                            (SELECT a.id FROM {{ns}}.asset a WHERE a.uri = d.asset)) AS id
              FROM (SELECT DISTINCT u.asset FROM unnest(v_assets) AS u(asset)) d
           ) r ON r.asset = n.asset;

    SELECT n.ord, n.asset INTO v_bad
      FROM unnest(v_assets, v_asset_ids) WITH ORDINALITY AS n(asset, id, ord)
     WHERE n.id IS NULL
     ORDER BY n.ord
     LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION 'unknown asset % (event % of the batch)', quote_nullable(v_bad.asset), v_bad.ord
            USING ERRCODE = 'AQ001',
                  HINT = 'Declare the asset first (assetq.declare_asset) or name it in a consumer condition.';
    END IF;

    -- Aliases: created if new and resolved to their item's asset before the insert, so that
    -- the fan-out below sees the resolution. Sorted, so concurrent batches lock in one order.
    IF EXISTS (SELECT 1 FROM unnest(v_aliases) AS x(a) WHERE x.a IS NOT NULL) THEN
        INSERT INTO {{ns}}.asset_alias (name)
        SELECT DISTINCT n
          FROM unnest(v_aliases) AS x(a), jsonb_array_elements_text(x.a) n
         ORDER BY n
        ON CONFLICT (name) DO NOTHING;
        INSERT INTO {{ns}}.asset_alias_asset (alias_id, asset_id)
        SELECT DISTINCT al.id, t.asset_id
          FROM unnest(v_asset_ids, v_aliases) AS t(asset_id, a),
               jsonb_array_elements_text(t.a) n
          JOIN {{ns}}.asset_alias al ON al.name = n
         ORDER BY 1, 2
        ON CONFLICT DO NOTHING;
    END IF;

    -- asset_event_id_seq is the identity sequence of asset_event.id (PostgreSQL's name for it).
    v_ids := ARRAY(SELECT nextval('{{ns}}.asset_event_id_seq') FROM generate_series(1, v_count) ORDER BY 1);
    v_now := clock_timestamp();

    INSERT INTO {{ns}}.asset_event AS e
           (id, asset_id, extra, source_dag_id, source_task_id, source_run_id, source_map_index,
            idempotency_key, "timestamp", partition_key)
    SELECT t.id, t.asset_id, t.extra, t.dag_id, t.task_id, t.run_id, t.map_index, t.key, v_now,
           t.part
      FROM unnest(v_ids, v_asset_ids, v_extras, v_dag_ids, v_task_ids, v_run_ids, v_indexes, v_keys,
                  v_parts)
           WITH ORDINALITY AS t(id, asset_id, extra, dag_id, task_id, run_id, map_index, key, part, ord)
     ORDER BY t.ord
    ON CONFLICT (asset_id, idempotency_key) DO NOTHING;

    -- An item whose own id was not inserted met an event with its key: a committed one (ON
    -- CONFLICT waited for its transaction) or an earlier item of this batch. A retry must
    -- repeat the extra and the partition key.
    SELECT t.ord, t.key, e.id INTO v_bad
      FROM unnest(v_ids, v_asset_ids, v_extras, v_keys, v_parts)
           WITH ORDINALITY AS t(id, asset_id, extra, key, part, ord)
     CROSS JOIN LATERAL (SELECT k.id, k.extra, k.partition_key
                           FROM {{ns}}.asset_event k
                          WHERE t.key IS NOT NULL
                            AND k.asset_id = t.asset_id AND k.idempotency_key = t.key
                          LIMIT 1) e  -- by index, item by item (see the result below)
     WHERE e.id <> t.id
       AND (e.extra IS DISTINCT FROM t.extra OR e.partition_key IS DISTINCT FROM t.part)
     ORDER BY t.ord
     LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION 'idempotency key % was already used for event % of this asset with a different extra (event % of the batch)',
                quote_literal(v_bad.key), v_bad.id, v_bad.ord
            USING ERRCODE = 'AQ005',
                  HINT = 'Reuse a key only to retry the very same registration.';
    END IF;

    -- The aliases of the events this call created (an item's own id exists only if it was).
    IF EXISTS (SELECT 1 FROM unnest(v_aliases) AS x(a) WHERE x.a IS NOT NULL) THEN
        INSERT INTO {{ns}}.asset_event_alias (asset_event_id, alias_id)
        SELECT DISTINCT e.id, al.id
          FROM unnest(v_ids, v_aliases) AS t(id, a)
          JOIN {{ns}}.asset_event e ON e.id = t.id,
               jsonb_array_elements_text(t.a) n
          JOIN {{ns}}.asset_alias al ON al.name = n
        ON CONFLICT DO NOTHING;
    END IF;

    -- One row per item, each found by index: an item without
    -- an idempotency key is the row this call inserted (nothing can conflict with it: its id,
    -- asset and timestamp are the call's own), an item with one is looked up by its key,
    -- whichever call inserted it. LIMIT 1 (the key is unique) keeps the lookup a subquery
    -- per item: without it PostgreSQL flattens the join and may hash it over the event
    -- history. Until 0015 one join of the batch with asset_event, which PostgreSQL planned
    -- as such a hash join: a batch cost the history, not its size.
    RETURN QUERY
    SELECT t.ord::integer, coalesce(k.id, t.id), t.asset_id, coalesce(k."timestamp", v_now),
           k.id IS NULL OR k.id = t.id
      FROM unnest(v_ids, v_asset_ids, v_keys) WITH ORDINALITY AS t(id, asset_id, key, ord)
      LEFT JOIN LATERAL (SELECT e.id, e."timestamp"
                           FROM {{ns}}.asset_event e
                          WHERE t.key IS NOT NULL
                            AND e.asset_id = t.asset_id AND e.idempotency_key = t.key
                          LIMIT 1) k ON true
     WHERE t.key IS NULL OR k.id IS NOT NULL
     ORDER BY t.ord;
END
$$;

ALTER FUNCTION {{ns}}.register_events(jsonb)
    SECURITY DEFINER SET search_path = pg_catalog, pg_temp;
