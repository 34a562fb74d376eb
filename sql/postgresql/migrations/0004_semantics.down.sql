-- Migration 0004_semantics (down): removes what 0004_semantics.up.sql added and puts back the
-- 0003 definitions of the routines it replaced. Grants roles held on schedule_pass are kept;
-- the view is re-created (ALTER cannot drop its new columns): a reader role loses SELECT on it
-- and needs `assetq grant reader` again.

DROP FUNCTION IF EXISTS {{ns}}.delete_asset(text);
DROP FUNCTION IF EXISTS {{ns}}.delete_dag(text);
DROP FUNCTION IF EXISTS {{ns}}.set_run_state(text, text, text);

DROP TABLE IF EXISTS pg_temp._assetq_0004_grants;
CREATE TEMPORARY TABLE _assetq_0004_grants AS
SELECT DISTINCT pg_catalog.pg_get_userbyid(a.grantee) AS grantee
  FROM pg_catalog.pg_proc p, pg_catalog.aclexplode(p.proacl) a
 WHERE p.oid = '{{ns}}.schedule_pass(integer)'::regprocedure
   AND a.privilege_type = 'EXECUTE' AND a.grantee <> p.proowner AND a.grantee <> 0;
DROP FUNCTION {{ns}}.schedule_pass(integer);
DROP FUNCTION {{ns}}.declare_dag(text, jsonb, jsonb, boolean, integer, integer, boolean);
DROP FUNCTION IF EXISTS {{ns}}.condition_holds(text, bigint[]);
DROP FUNCTION IF EXISTS {{ns}}.dag_clause_members(text);
DROP VIEW {{ns}}.dag_queue_status;

CREATE OR REPLACE FUNCTION {{ns}}.asset_event_fan_out() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO {{ns}}.asset_dag_run_queue (target_dag_id, asset_event_id, asset_id, created_at)
    SELECT r.dag_id, e.id, e.asset_id, e."timestamp"
      FROM new_events e
      JOIN {{ns}}.dag_schedule_asset_reference r ON r.asset_id = e.asset_id
      JOIN {{ns}}.dag d ON d.dag_id = r.dag_id
     WHERE NOT d.is_paused;
    RETURN NULL;
END
$$;

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

    SELECT array_agg(i.item ->> 'asset' ORDER BY i.ord),
           array_agg(coalesce(nullif(i.item -> 'extra', 'null'::jsonb), '{}'::jsonb) ORDER BY i.ord),
           array_agg(i.item ->> 'source_dag_id' ORDER BY i.ord),
           array_agg(i.item ->> 'source_task_id' ORDER BY i.ord),
           array_agg(i.item ->> 'source_run_id' ORDER BY i.ord),
           array_agg(coalesce((i.item ->> 'source_map_index')::integer, -1) ORDER BY i.ord),
           array_agg(i.item ->> 'idempotency_key' ORDER BY i.ord)
      INTO v_assets, v_extras, v_dag_ids, v_task_ids, v_run_ids, v_indexes, v_keys
      FROM jsonb_array_elements(p_events) WITH ORDINALITY AS i(item, ord);

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

    -- asset_event_id_seq is the identity sequence of asset_event.id (PostgreSQL's name for it).
    v_ids := ARRAY(SELECT nextval('{{ns}}.asset_event_id_seq') FROM generate_series(1, v_count) ORDER BY 1);
    v_now := clock_timestamp();

    INSERT INTO {{ns}}.asset_event AS e
           (id, asset_id, extra, source_dag_id, source_task_id, source_run_id, source_map_index,
            idempotency_key, "timestamp")
    SELECT t.id, t.asset_id, t.extra, t.dag_id, t.task_id, t.run_id, t.map_index, t.key, v_now
      FROM unnest(v_ids, v_asset_ids, v_extras, v_dag_ids, v_task_ids, v_run_ids, v_indexes, v_keys)
           WITH ORDINALITY AS t(id, asset_id, extra, dag_id, task_id, run_id, map_index, key, ord)
     ORDER BY t.ord
    ON CONFLICT (asset_id, idempotency_key) DO NOTHING;

    -- An item whose own id was not inserted met an event with its key: a committed one (ON
    -- CONFLICT waited for its transaction) or an earlier item of this batch.
    SELECT t.ord, t.key, e.id INTO v_bad
      FROM unnest(v_ids, v_asset_ids, v_extras, v_keys) WITH ORDINALITY AS t(id, asset_id, extra, key, ord)
      JOIN {{ns}}.asset_event e ON e.asset_id = t.asset_id AND e.idempotency_key = t.key
     WHERE e.id <> t.id AND e.extra IS DISTINCT FROM t.extra
     ORDER BY t.ord
     LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION 'idempotency key % was already used for event % of this asset with a different extra (event % of the batch)',
                quote_literal(v_bad.key), v_bad.id, v_bad.ord
            USING ERRCODE = 'AQ005',
                  HINT = 'Reuse a key only to retry the very same registration.';
    END IF;

    RETURN QUERY
    SELECT t.ord::integer, e.id, e.asset_id, e."timestamp", e.id = t.id
      FROM unnest(v_ids, v_asset_ids, v_keys) WITH ORDINALITY AS t(id, asset_id, key, ord)
      JOIN {{ns}}.asset_event e
        ON e.id = CASE WHEN t.key IS NULL THEN t.id
                       ELSE (SELECT k.id FROM {{ns}}.asset_event k
                              WHERE k.asset_id = t.asset_id AND k.idempotency_key = t.key) END
     ORDER BY t.ord;
END
$$;

CREATE OR REPLACE FUNCTION {{ns}}.declare_asset(p_name text, p_uri text DEFAULT NULL, p_extra jsonb DEFAULT NULL)
RETURNS bigint
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_id bigint;
BEGIN
    IF p_extra IS NOT NULL AND jsonb_typeof(p_extra) <> 'object' THEN
        RAISE EXCEPTION 'asset extra must be a JSON object, got %', jsonb_typeof(p_extra)
            USING ERRCODE = 'AQ002';
    END IF;
    INSERT INTO {{ns}}.asset AS a (name, uri, extra)
    VALUES (p_name, p_uri, coalesce(p_extra, '{}'::jsonb))
    ON CONFLICT (name) DO UPDATE
       SET uri = coalesce(EXCLUDED.uri, a.uri),
           extra = CASE WHEN p_extra IS NULL THEN a.extra ELSE EXCLUDED.extra END
    RETURNING a.id INTO v_id;
    RETURN v_id;
END
$$;

CREATE FUNCTION {{ns}}.declare_dag(
    p_dag_id    text,
    p_condition jsonb,
    p_clauses   jsonb,
    p_paused    boolean DEFAULT NULL
) RETURNS void
LANGUAGE plpgsql AS $$
#variable_conflict use_column
BEGIN
    IF p_dag_id IS NULL OR p_dag_id !~ '^[A-Za-z0-9_.-]+$' OR length(p_dag_id) > 250 THEN
        RAISE EXCEPTION 'invalid dag id %: use 1 to 250 letters, digits, "_", "." or "-"',
                quote_nullable(p_dag_id)
            USING ERRCODE = 'AQ002';
    END IF;
    IF p_condition IS NULL THEN
        RAISE EXCEPTION 'condition of dag % is missing', p_dag_id USING ERRCODE = 'AQ004';
    END IF;
    IF jsonb_typeof(p_clauses) IS DISTINCT FROM 'array' OR jsonb_array_length(p_clauses) = 0
       OR EXISTS (SELECT 1 FROM jsonb_array_elements(p_clauses) c
                   WHERE jsonb_typeof(c) <> 'array' OR jsonb_array_length(c) = 0
                      OR EXISTS (SELECT 1 FROM jsonb_array_elements(c) n
                                  WHERE jsonb_typeof(n) <> 'string' OR n #>> '{}' = ''
                                     OR length(n #>> '{}') > 512))
    THEN
        RAISE EXCEPTION 'condition clauses of dag % must be a non-empty array of non-empty arrays of asset names (1 to 512 characters)', p_dag_id
            USING ERRCODE = 'AQ004';
    END IF;

    -- Lock (or create) the consumer row first: every later statement runs under it.
    INSERT INTO {{ns}}.dag AS d (dag_id, condition, is_paused)
    VALUES (p_dag_id, p_condition, coalesce(p_paused, false))
    ON CONFLICT (dag_id) DO UPDATE
       SET condition = EXCLUDED.condition,
           is_paused = coalesce(p_paused, d.is_paused),
           updated_at = clock_timestamp();

    INSERT INTO {{ns}}.asset (name)
    SELECT DISTINCT n
      FROM jsonb_array_elements(p_clauses) c, jsonb_array_elements_text(c) n
     WHERE NOT EXISTS (SELECT 1 FROM {{ns}}.asset a WHERE a.name = n OR a.uri = n)
    ORDER BY n
    ON CONFLICT (name) DO NOTHING;

    DELETE FROM {{ns}}.dag_condition_clause WHERE dag_id = p_dag_id;
    INSERT INTO {{ns}}.dag_condition_clause (dag_id, clause_no, asset_id)
    SELECT DISTINCT p_dag_id, c.ord, {{ns}}.resolve_asset(n)
      FROM jsonb_array_elements(p_clauses) WITH ORDINALITY AS c(clause, ord),
           jsonb_array_elements_text(c.clause) n;

    DELETE FROM {{ns}}.dag_schedule_asset_reference r
     WHERE r.dag_id = p_dag_id
       AND NOT EXISTS (SELECT 1 FROM {{ns}}.dag_condition_clause c
                        WHERE c.dag_id = p_dag_id AND c.asset_id = r.asset_id);
    INSERT INTO {{ns}}.dag_schedule_asset_reference (asset_id, dag_id)
    SELECT DISTINCT c.asset_id, p_dag_id
      FROM {{ns}}.dag_condition_clause c
     WHERE c.dag_id = p_dag_id
    ON CONFLICT DO NOTHING;
END
$$;

CREATE FUNCTION {{ns}}.schedule_pass(p_limit integer DEFAULT 100)
RETURNS TABLE (
    dag_run_id  bigint,
    dag_id      varchar,
    run_id      varchar,
    seq         bigint,
    run_after   timestamptz,
    created_at  timestamptz,
    event_ids   bigint[]
)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_dag_id    varchar;
    v_events    bigint[];
    v_assets    bigint[];
    v_run_after timestamptz;
    v_seq       bigint;
    v_deleted   bigint;
    v_now       timestamptz;
    v_run_pk    bigint;
BEGIN
    IF p_limit IS NULL OR p_limit < 1 THEN
        RAISE EXCEPTION 'limit must be a positive integer, got %', quote_nullable(p_limit)
            USING ERRCODE = 'AQ002';
    END IF;

    -- FOR NO KEY UPDATE, not FOR UPDATE: every in-flight producer holds a KEY SHARE lock on
    -- the consumer row through the queue's foreign key. FOR UPDATE conflicts with it, so the
    -- pass would skip every busy consumer (measured: p99 latency 40 ms -> 2.7 s).
    -- SKIP LOCKED: concurrent passes split the consumers between them instead of waiting (I5).
    FOR v_dag_id IN
        SELECT d.dag_id
          FROM {{ns}}.dag d
         WHERE d.dag_id IN (SELECT q.target_dag_id FROM {{ns}}.asset_dag_run_queue q)
           AND NOT d.is_paused
         ORDER BY d.last_scheduled_at NULLS FIRST, d.dag_id
         LIMIT p_limit
           FOR NO KEY UPDATE OF d SKIP LOCKED
    LOOP
        v_now := clock_timestamp();
        -- The claim. This statement's snapshot is taken after the lock above, so it sees
        -- every row committed so far, including those of a pass that held this consumer a
        -- moment ago (and deleted its rows). A row committed after this read is simply not
        -- in the claim and waits for the next pass: selection is by reference, never by time.
        SELECT array_agg(q.asset_event_id ORDER BY q.asset_event_id),
               array_agg(DISTINCT q.asset_id),
               max(q.created_at)
          INTO v_events, v_assets, v_run_after
          FROM {{ns}}.asset_dag_run_queue q
         WHERE q.target_dag_id = v_dag_id;

        -- I6: every clause of the condition needs an asset among the claimed rows.
        IF v_events IS NULL
           OR NOT EXISTS (SELECT 1 FROM {{ns}}.dag_condition_clause c WHERE c.dag_id = v_dag_id)
           OR EXISTS (SELECT 1
                        FROM {{ns}}.dag_condition_clause c
                       WHERE c.dag_id = v_dag_id
                       GROUP BY c.clause_no
                      HAVING NOT bool_or(c.asset_id = ANY (v_assets)))
        THEN
            UPDATE {{ns}}.dag d SET last_scheduled_at = v_now WHERE d.dag_id = v_dag_id;
            CONTINUE;
        END IF;

        UPDATE {{ns}}.dag d
           SET last_run_seq = d.last_run_seq + 1, last_scheduled_at = v_now
         WHERE d.dag_id = v_dag_id
        RETURNING d.last_run_seq INTO v_seq;

        INSERT INTO {{ns}}.dag_run AS r (dag_id, run_id, seq, run_after, created_at)
        VALUES (v_dag_id,
                'asset_triggered__'
                    || to_char(v_run_after AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US')
                    || '+00:00__' || v_seq,
                v_seq, v_run_after, v_now)
        RETURNING r.id, r.dag_id, r.run_id, r.seq, r.run_after, r.created_at
             INTO v_run_pk, dag_id, run_id, seq, run_after, created_at;

        INSERT INTO {{ns}}.dagrun_asset_event (dag_run_id, asset_event_id, dag_id)
        SELECT v_run_pk, e, v_dag_id FROM unnest(v_events) AS e;

        -- Delete exactly the claimed rows, by primary key (I3). The claim guard (I4): if any
        -- claimed row is gone, someone else consumed it; abort the whole pass.
        DELETE FROM {{ns}}.asset_dag_run_queue q
         WHERE q.target_dag_id = v_dag_id
           AND q.asset_event_id = ANY (v_events);
        GET DIAGNOSTICS v_deleted = ROW_COUNT;
        IF v_deleted <> cardinality(v_events) THEN
            RAISE EXCEPTION 'claim guard: dag % claimed % queue rows but deleted %',
                    v_dag_id, cardinality(v_events), v_deleted
                USING ERRCODE = 'AQ900',
                      HINT = 'The pass was rolled back; it is safe to run it again.';
        END IF;

        dag_run_id := v_run_pk;
        event_ids := v_events;
        RETURN NEXT;
    END LOOP;
END
$$;

CREATE VIEW {{ns}}.dag_queue_status AS
SELECT d.dag_id,
       d.is_paused,
       coalesce(q.queued_events, 0) AS queued_events,
       q.oldest_queued_at,
       CAST(extract(epoch FROM now() - q.oldest_queued_at) AS double precision)
           AS oldest_queued_age_seconds,
       (SELECT count(*)
          FROM {{ns}}.dag_run r
         WHERE r.dag_id = d.dag_id AND r.created_at > now() - interval '1 hour') AS runs_last_hour,
       (SELECT max(r.created_at) FROM {{ns}}.dag_run r WHERE r.dag_id = d.dag_id) AS last_run_at,
       d.last_run_seq AS runs_total,
       d.last_scheduled_at
  FROM {{ns}}.dag d
  LEFT JOIN (SELECT q.target_dag_id,
                    count(*) AS queued_events,
                    min(q.created_at) AS oldest_queued_at
               FROM {{ns}}.asset_dag_run_queue q
              GROUP BY q.target_dag_id) q
    ON q.target_dag_id = d.dag_id;


-- Retention, step 1: deletes at most p_batch_size runs created before p_older_than, oldest

CREATE OR REPLACE FUNCTION {{ns}}.grant_access(p_access text, p_grantee text, p_host text DEFAULT NULL)
RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    IF p_access IS NULL OR p_access NOT IN ('producer', 'scheduler', 'reader') THEN
        RAISE EXCEPTION 'unknown access %: use producer, scheduler or reader', quote_nullable(p_access)
            USING ERRCODE = 'AQ002';
    END IF;
    IF p_host IS NOT NULL THEN
        RAISE EXCEPTION 'a PostgreSQL role has no host: got %', quote_literal(p_host)
            USING ERRCODE = 'AQ002';
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_roles r WHERE r.rolname = p_grantee) THEN
        RAISE EXCEPTION 'role % does not exist', quote_nullable(p_grantee)
            USING ERRCODE = 'AQ002',
                  HINT = 'Create it first, e.g. CREATE ROLE name LOGIN PASSWORD ''...''.';
    END IF;
    EXECUTE format('GRANT USAGE ON SCHEMA {{ns}} TO %I', p_grantee);
    EXECUTE format('GRANT SELECT ON {{ns}}.assetq_alembic_version TO %I', p_grantee);
    IF p_access = 'producer' THEN
        EXECUTE format('GRANT EXECUTE ON FUNCTION'
                       ' {{ns}}.register_event(text, jsonb, text, text, text, integer, text),'
                       ' {{ns}}.register_events(jsonb) TO %I', p_grantee);
    ELSIF p_access = 'scheduler' THEN
        EXECUTE format('GRANT EXECUTE ON FUNCTION {{ns}}.schedule_pass(integer) TO %I', p_grantee);
    ELSE
        EXECUTE format('GRANT SELECT ON ALL TABLES IN SCHEMA {{ns}} TO %I', p_grantee);
    END IF;
END
$$;

-- Takes every kind of access grant_access gave p_grantee away again. Idempotent.
CREATE OR REPLACE FUNCTION {{ns}}.revoke_access(p_grantee text, p_host text DEFAULT NULL)
RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    IF p_host IS NOT NULL THEN
        RAISE EXCEPTION 'a PostgreSQL role has no host: got %', quote_literal(p_host)
            USING ERRCODE = 'AQ002';
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_roles r WHERE r.rolname = p_grantee) THEN
        RAISE EXCEPTION 'role % does not exist', quote_nullable(p_grantee) USING ERRCODE = 'AQ002';
    END IF;
    EXECUTE format('REVOKE EXECUTE ON FUNCTION'
                   ' {{ns}}.register_event(text, jsonb, text, text, text, integer, text),'
                   ' {{ns}}.register_events(jsonb), {{ns}}.schedule_pass(integer) FROM %I',
                   p_grantee);
    EXECUTE format('REVOKE SELECT ON ALL TABLES IN SCHEMA {{ns}} FROM %I', p_grantee);
    EXECUTE format('REVOKE USAGE ON SCHEMA {{ns}} FROM %I', p_grantee);
END
$$;

ALTER FUNCTION {{ns}}.register_events(jsonb)
    SECURITY DEFINER SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION {{ns}}.schedule_pass(integer)
    SECURITY DEFINER SET search_path = pg_catalog, pg_temp;
REVOKE EXECUTE ON FUNCTION {{ns}}.schedule_pass(integer), {{ns}}.declare_dag(text, jsonb, jsonb, boolean)
    FROM PUBLIC;
DO $$
DECLARE
    v_grantee text;
BEGIN
    FOR v_grantee IN SELECT g.grantee FROM _assetq_0004_grants g LOOP
        EXECUTE format('GRANT EXECUTE ON FUNCTION {{ns}}.schedule_pass(integer) TO %I', v_grantee);
    END LOOP;
END
$$;
DROP TABLE pg_temp._assetq_0004_grants;

DROP INDEX IF EXISTS {{ns}}.dag_run_dag_state_idx;
ALTER TABLE {{ns}}.dag_run
    DROP COLUMN triggering_event_id,
    DROP COLUMN event_count,
    DROP COLUMN started_at,
    DROP COLUMN ended_at,
    DROP COLUMN updated_at;
DROP TABLE IF EXISTS {{ns}}.dag_condition_alias;
DROP TABLE IF EXISTS {{ns}}.asset_event_alias;
DROP TABLE IF EXISTS {{ns}}.asset_alias_asset;
DROP TABLE IF EXISTS {{ns}}.asset_alias;
ALTER TABLE {{ns}}.asset DROP COLUMN declared;
ALTER TABLE {{ns}}.dag
    DROP COLUMN max_active_runs,
    DROP COLUMN max_events_per_run,
    DROP COLUMN queue_while_paused;
