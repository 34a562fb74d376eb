CREATE OR REPLACE FUNCTION {{ns}}.declare_dag(
    p_dag_id             text,
    p_condition          jsonb,
    p_clauses            jsonb,
    p_paused             boolean DEFAULT NULL,
    p_max_active_runs    integer DEFAULT NULL,
    p_max_events_per_run integer DEFAULT NULL,
    p_queue_while_paused boolean DEFAULT NULL,
    p_max_attempts       integer DEFAULT NULL,
    p_retry_delay_seconds     double precision DEFAULT NULL,
    p_max_retry_delay_seconds double precision DEFAULT NULL
) RETURNS void
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_clause_nos integer[];
    v_kinds      text[];
    v_values     text[];
BEGIN
    IF p_dag_id IS NULL OR p_dag_id !~ '^[A-Za-z0-9_.-]+$' OR length(p_dag_id) > 250 THEN
        RAISE EXCEPTION 'invalid dag id %: use 1 to 250 letters, digits, "_", "." or "-"',
                quote_nullable(p_dag_id)
            USING ERRCODE = 'AQ002';
    END IF;
    IF p_max_active_runs < 1 OR p_max_events_per_run < 1 THEN
        RAISE EXCEPTION 'max_active_runs and max_events_per_run must be positive or NULL, got % and %',
                quote_nullable(p_max_active_runs), quote_nullable(p_max_events_per_run)
            USING ERRCODE = 'AQ002';
    END IF;
    -- Retries: NULL means the default, one attempt and no delay.
    -- NOT (x >= 0) also refuses NaN.
    IF p_max_attempts < 1 OR p_max_attempts > 1000
       OR NOT (coalesce(p_retry_delay_seconds, 0) >= 0 AND coalesce(p_retry_delay_seconds, 0) <= 604800)
       OR NOT (coalesce(p_max_retry_delay_seconds, 1) > 0 AND coalesce(p_max_retry_delay_seconds, 1) <= 604800)
       OR p_max_retry_delay_seconds < p_retry_delay_seconds
    THEN
        RAISE EXCEPTION 'max_attempts must be 1 to 1000, retry_delay 0 to 604800 seconds and max_retry_delay above 0, at least retry_delay and at most 604800 seconds; got %, % and %',
                quote_nullable(p_max_attempts), quote_nullable(p_retry_delay_seconds),
                quote_nullable(p_max_retry_delay_seconds)
            USING ERRCODE = 'AQ002';
    END IF;
    IF p_condition IS NULL THEN
        RAISE EXCEPTION 'condition of dag % is missing', p_dag_id USING ERRCODE = 'AQ004';
    END IF;
    IF jsonb_typeof(p_clauses) IS DISTINCT FROM 'array' OR jsonb_array_length(p_clauses) = 0
       OR EXISTS (SELECT 1 FROM jsonb_array_elements(p_clauses) c
                   WHERE jsonb_typeof(c) <> 'array' OR jsonb_array_length(c) = 0)
    THEN
        RAISE EXCEPTION 'condition clauses of dag % must be a non-empty array of non-empty arrays', p_dag_id
            USING ERRCODE = 'AQ004';
    END IF;

    -- Members as (clause, kind, value); kind 'any' for a plain string.
    SELECT array_agg(c.ord::integer ORDER BY c.ord),
           array_agg(CASE jsonb_typeof(n)
                         WHEN 'string' THEN 'any'
                         WHEN 'object' THEN (SELECT min(k) FROM jsonb_object_keys(n) k)
                     END ORDER BY c.ord),
           array_agg(CASE jsonb_typeof(n)
                         WHEN 'string' THEN n #>> '{}'
                         -- A string only, as on MySQL: {"name": 5} is not the asset "5".
                         WHEN 'object' THEN (SELECT min(v.value #>> '{}') FROM jsonb_each(n) v
                                              WHERE jsonb_typeof(v.value) = 'string')
                     END ORDER BY c.ord)
      INTO v_clause_nos, v_kinds, v_values
      FROM jsonb_array_elements(p_clauses) WITH ORDINALITY AS c(clause, ord),
           jsonb_array_elements(c.clause) n
     WHERE jsonb_typeof(n) <> 'object' OR (SELECT count(*) FROM jsonb_object_keys(n)) = 1;
    IF coalesce(cardinality(v_kinds), 0) <> (SELECT sum(jsonb_array_length(c)) FROM jsonb_array_elements(p_clauses) c)
       OR EXISTS (SELECT 1 FROM unnest(v_kinds, v_values) AS m(kind, value)
                   WHERE m.kind IS NULL OR m.kind NOT IN ('any', 'name', 'uri', 'alias')
                      OR m.value IS NULL OR m.value = '' OR length(m.value) > 512)
    THEN
        RAISE EXCEPTION 'condition clauses of dag % may hold only asset names or uris (1 to 512 characters), {"name": ...}, {"uri": ...} or {"alias": ...}', p_dag_id
            USING ERRCODE = 'AQ004';
    END IF;

    -- Lock (or create) the consumer row first: every later statement runs under it.
    INSERT INTO {{ns}}.dag AS d (dag_id, condition, is_paused, max_active_runs,
                                 max_events_per_run, queue_while_paused, max_attempts,
                                 retry_delay_seconds, max_retry_delay_seconds)
    VALUES (p_dag_id, p_condition, coalesce(p_paused, false), p_max_active_runs,
            p_max_events_per_run, coalesce(p_queue_while_paused, false),
            coalesce(p_max_attempts, 1), coalesce(p_retry_delay_seconds, 0),
            p_max_retry_delay_seconds)
    ON CONFLICT (dag_id) DO UPDATE
       SET condition = EXCLUDED.condition,
           is_paused = coalesce(p_paused, d.is_paused),
           max_active_runs = EXCLUDED.max_active_runs,
           max_events_per_run = EXCLUDED.max_events_per_run,
           queue_while_paused = EXCLUDED.queue_while_paused,
           max_attempts = EXCLUDED.max_attempts,
           retry_delay_seconds = EXCLUDED.retry_delay_seconds,
           max_retry_delay_seconds = EXCLUDED.max_retry_delay_seconds,
           updated_at = clock_timestamp();

    -- Create what does not exist yet, sorted, so concurrent declarations lock in one order.
    INSERT INTO {{ns}}.asset (name, uri, declared)
    SELECT DISTINCT m.value, CASE WHEN m.kind = 'uri' THEN m.value END, false
      FROM unnest(v_kinds, v_values) AS m(kind, value)
     WHERE m.kind <> 'alias'
       AND NOT EXISTS (SELECT 1 FROM {{ns}}.asset a
                        WHERE (m.kind IN ('any', 'name') AND a.name = m.value)
                           OR (m.kind IN ('any', 'uri') AND a.uri = m.value)
                           OR (m.kind = 'uri' AND a.name = m.value))
     ORDER BY 1
    ON CONFLICT DO NOTHING;
    INSERT INTO {{ns}}.asset_alias (name)
    SELECT DISTINCT m.value
      FROM unnest(v_kinds, v_values) AS m(kind, value)
     WHERE m.kind = 'alias'
     ORDER BY 1
    ON CONFLICT (name) DO NOTHING;

    DELETE FROM {{ns}}.dag_condition_clause WHERE dag_id = p_dag_id;
    DELETE FROM {{ns}}.dag_condition_alias WHERE dag_id = p_dag_id;
    -- Resolution: "x" by name then uri; {"name"} by name; {"uri"} by uri then by name (the
    -- asset created above for it is named by the uri).
    INSERT INTO {{ns}}.dag_condition_clause (dag_id, clause_no, asset_id)
    SELECT DISTINCT p_dag_id, m.clause_no,
           CASE m.kind
               WHEN 'any' THEN {{ns}}.resolve_asset(m.value)
               WHEN 'name' THEN (SELECT a.id FROM {{ns}}.asset a WHERE a.name = m.value)
               ELSE coalesce((SELECT a.id FROM {{ns}}.asset a WHERE a.uri = m.value),
                             (SELECT a.id FROM {{ns}}.asset a WHERE a.name = m.value))
           END
      FROM unnest(v_clause_nos, v_kinds, v_values) AS m(clause_no, kind, value)
     WHERE m.kind <> 'alias';
    INSERT INTO {{ns}}.dag_condition_alias (dag_id, clause_no, alias_id)
    SELECT DISTINCT p_dag_id, m.clause_no, al.id
      FROM unnest(v_clause_nos, v_kinds, v_values) AS m(clause_no, kind, value)
      JOIN {{ns}}.asset_alias al ON al.name = m.value
     WHERE m.kind = 'alias';

    DELETE FROM {{ns}}.dag_schedule_asset_reference r
     WHERE r.dag_id = p_dag_id
       AND NOT EXISTS (SELECT 1 FROM {{ns}}.dag_condition_clause c
                        WHERE c.dag_id = p_dag_id AND c.asset_id = r.asset_id);
    -- A new asset of a partitioned consumer maps by identity until set_dag_partitions says
    -- otherwise: its events are never queued without a key.
    INSERT INTO {{ns}}.dag_schedule_asset_reference (asset_id, dag_id, partition_mapping,
                                                     partition_require)
    SELECT DISTINCT c.asset_id, p_dag_id,
           CASE WHEN d.partitioning IS NOT NULL THEN 'identity' END,
           CASE WHEN d.partitioning IS NOT NULL THEN 'any' END
      FROM {{ns}}.dag_condition_clause c
      JOIN {{ns}}.dag d ON d.dag_id = c.dag_id
     WHERE c.dag_id = p_dag_id
    ON CONFLICT DO NOTHING;

    -- Rows queued for assets the consumer no longer depends on would never count towards its
    -- condition: they go. (A producer whose statement read the old references before this
    -- commits may still queue one; the next run consumes it with the others.)
    DELETE FROM {{ns}}.asset_dag_run_queue q
     WHERE q.target_dag_id = p_dag_id
       AND NOT EXISTS (SELECT 1 FROM {{ns}}.dag_clause_members(p_dag_id) m
                        WHERE m.asset_id = q.asset_id);
    -- And their partition rows.
    DELETE FROM {{ns}}.asset_partition_queue p
     WHERE p.target_dag_id = p_dag_id
       AND NOT EXISTS (SELECT 1 FROM {{ns}}.asset_dag_run_queue q
                        WHERE q.target_dag_id = p.target_dag_id
                          AND q.asset_event_id = p.asset_event_id);
END
$$;
