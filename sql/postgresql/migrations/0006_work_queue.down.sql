-- Migration 0006_work_queue (down): back to 0005. Runs keep their state; what only workers
-- knew (attempts, leases, errors, not_before) is dropped, and the consumers' retry options.
-- Functions that kept their signatures are replaced by their 0005 bodies, which keeps their
-- grants; SECURITY DEFINER and search_path are set again.

DROP TRIGGER dag_run_notify ON {{ns}}.dag_run;
DROP FUNCTION {{ns}}.dag_run_notify();
DROP FUNCTION {{ns}}.claim_runs(text, integer, double precision, jsonb);
DROP FUNCTION {{ns}}.heartbeat_run(text, text, integer, double precision);
DROP FUNCTION {{ns}}.complete_run(text, text, integer, text, text, jsonb);
DROP FUNCTION {{ns}}.retry_run(text, text);
DROP FUNCTION {{ns}}.declare_dag(text, jsonb, jsonb, boolean, integer, integer, boolean, integer,
                                 double precision, double precision);

-- The view names the new columns: it goes before them, and comes back as it was.
DROP VIEW {{ns}}.dag_queue_status;

CREATE FUNCTION {{ns}}.declare_dag(
    p_dag_id             text,
    p_condition          jsonb,
    p_clauses            jsonb,
    p_paused             boolean DEFAULT NULL,
    p_max_active_runs    integer DEFAULT NULL,
    p_max_events_per_run integer DEFAULT NULL,
    p_queue_while_paused boolean DEFAULT NULL
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
                         WHEN 'object' THEN (SELECT min(v.value) FROM jsonb_each_text(n) v)
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
                                 max_events_per_run, queue_while_paused)
    VALUES (p_dag_id, p_condition, coalesce(p_paused, false), p_max_active_runs,
            p_max_events_per_run, coalesce(p_queue_while_paused, false))
    ON CONFLICT (dag_id) DO UPDATE
       SET condition = EXCLUDED.condition,
           is_paused = coalesce(p_paused, d.is_paused),
           max_active_runs = EXCLUDED.max_active_runs,
           max_events_per_run = EXCLUDED.max_events_per_run,
           queue_while_paused = EXCLUDED.queue_while_paused,
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
    INSERT INTO {{ns}}.dag_schedule_asset_reference (asset_id, dag_id)
    SELECT DISTINCT c.asset_id, p_dag_id
      FROM {{ns}}.dag_condition_clause c
     WHERE c.dag_id = p_dag_id
    ON CONFLICT DO NOTHING;

    -- Rows queued for assets the consumer no longer depends on would never count towards its
    -- condition: they go. (A producer whose statement read the old references before this
    -- commits may still queue one; the next run consumes it with the others.)
    DELETE FROM {{ns}}.asset_dag_run_queue q
     WHERE q.target_dag_id = p_dag_id
       AND NOT EXISTS (SELECT 1 FROM {{ns}}.dag_clause_members(p_dag_id) m
                        WHERE m.asset_id = q.asset_id);
END
$$;

CREATE OR REPLACE FUNCTION {{ns}}.schedule_pass(p_limit integer DEFAULT 100)
RETURNS TABLE (
    dag_run_id          bigint,
    dag_id              varchar,
    run_id              varchar,
    seq                 bigint,
    run_after           timestamptz,
    created_at          timestamptz,
    event_ids           bigint[],
    triggering_event_id bigint,
    state               varchar
)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_dag       record;
    v_ids       bigint[];
    v_assets    bigint[];
    v_times     timestamptz[];
    v_claim     integer[];
    v_chosen    bigint[];
    v_witness   integer[];
    v_try       bigint[];
    v_pick      bigint;
    v_clause    integer;
    v_events    bigint[];
    v_run_after timestamptz;
    v_trigger   bigint;
    v_seq       bigint;
    v_deleted   bigint;
    v_now       timestamptz;
    v_run_pk    bigint;
    v_n         integer;
BEGIN
    IF p_limit IS NULL OR p_limit < 1 THEN
        RAISE EXCEPTION 'limit must be a positive integer, got %', quote_nullable(p_limit)
            USING ERRCODE = 'AQ002';
    END IF;

    -- FOR NO KEY UPDATE, not FOR UPDATE: every in-flight producer holds a KEY SHARE lock on
    -- the consumer row through the queue's foreign key. FOR UPDATE conflicts with it, so the
    -- pass would skip every busy consumer (measured: p99 latency 40 ms -> 2.7 s).
    -- SKIP LOCKED: concurrent passes split the consumers between them instead of waiting (I5).
    FOR v_dag IN
        SELECT d.dag_id, d.max_active_runs, d.max_events_per_run
          FROM {{ns}}.dag d
         WHERE d.dag_id IN (SELECT q.target_dag_id FROM {{ns}}.asset_dag_run_queue q)
           AND NOT d.is_paused
         ORDER BY d.last_scheduled_at NULLS FIRST, d.dag_id
         LIMIT p_limit
           FOR NO KEY UPDATE OF d SKIP LOCKED
    LOOP
        v_now := clock_timestamp();

        -- At its cap: no run, the queue stays whole. Runs become active only in a pass holding
        -- this lock, so the count can only be too high (a run finishing meanwhile), never too low.
        IF v_dag.max_active_runs IS NOT NULL
           AND (SELECT count(*) FROM {{ns}}.dag_run r
                 WHERE r.dag_id = v_dag.dag_id AND r.state IN ('queued', 'running'))
               >= v_dag.max_active_runs
        THEN
            UPDATE {{ns}}.dag d SET last_scheduled_at = v_now WHERE d.dag_id = v_dag.dag_id;
            CONTINUE;
        END IF;

        -- The claim. This statement's snapshot is taken after the lock above, so it sees
        -- every row committed so far, including those of a pass that held this consumer a
        -- moment ago (and deleted its rows). A row committed after this read is simply not
        -- in the claim and waits for the next pass: selection is by reference, never by time.
        SELECT array_agg(q.asset_event_id ORDER BY q.created_at, q.asset_event_id),
               array_agg(q.asset_id ORDER BY q.created_at, q.asset_event_id),
               array_agg(q.created_at ORDER BY q.created_at, q.asset_event_id)
          INTO v_ids, v_assets, v_times
          FROM {{ns}}.asset_dag_run_queue q
         WHERE q.target_dag_id = v_dag.dag_id;
        v_n := coalesce(cardinality(v_ids), 0);

        -- I6: every clause of the condition needs a member among the claimed rows' assets.
        -- Written out here rather than calling condition_holds: PL/pgSQL keeps this plan, a
        -- SQL function is planned again on every call, and this runs for every consumer.
        IF v_n = 0
           OR NOT EXISTS (SELECT 1 FROM {{ns}}.dag_condition_clause c WHERE c.dag_id = v_dag.dag_id
                          UNION ALL
                          SELECT 1 FROM {{ns}}.dag_condition_alias ca WHERE ca.dag_id = v_dag.dag_id)
           OR EXISTS (SELECT 1
                        FROM (SELECT c.clause_no, c.asset_id
                                FROM {{ns}}.dag_condition_clause c
                               WHERE c.dag_id = v_dag.dag_id
                              UNION ALL
                              SELECT ca.clause_no, aa.asset_id
                                FROM {{ns}}.dag_condition_alias ca
                                LEFT JOIN {{ns}}.asset_alias_asset aa ON aa.alias_id = ca.alias_id
                               WHERE ca.dag_id = v_dag.dag_id) m
                       GROUP BY m.clause_no
                      HAVING NOT coalesce(bool_or(m.asset_id = ANY (v_assets)), false))
        THEN
            UPDATE {{ns}}.dag d SET last_scheduled_at = v_now WHERE d.dag_id = v_dag.dag_id;
            CONTINUE;
        END IF;

        IF v_dag.max_events_per_run IS NULL OR v_n <= v_dag.max_events_per_run THEN
            v_claim := NULL;  -- the whole queue
        ELSIF {{ns}}.condition_holds(v_dag.dag_id, v_assets[1:v_dag.max_events_per_run]) THEN
            v_claim := ARRAY(SELECT generate_series(1, v_dag.max_events_per_run));
        ELSE
            -- Greedy witnesses. v_assets is in queue order, so an asset's first position is
            -- its oldest row.
            v_chosen := '{}';
            FOR v_clause IN
                SELECT DISTINCT m.clause_no FROM {{ns}}.dag_clause_members(v_dag.dag_id) m ORDER BY 1
            LOOP
                CONTINUE WHEN EXISTS (SELECT 1 FROM {{ns}}.dag_clause_members(v_dag.dag_id) m
                                       WHERE m.clause_no = v_clause AND m.asset_id = ANY (v_chosen));
                SELECT u.asset INTO v_pick
                  FROM unnest(v_assets) WITH ORDINALITY AS u(asset, pos)
                 WHERE u.asset IN (SELECT m.asset_id FROM {{ns}}.dag_clause_members(v_dag.dag_id) m
                                    WHERE m.clause_no = v_clause)
                 ORDER BY u.pos
                 LIMIT 1;
                v_chosen := v_chosen || v_pick;
            END LOOP;
            -- Prune, newest choice first: what is left is a minimal set of assets.
            FOR i IN REVERSE cardinality(v_chosen)..1 LOOP
                v_try := v_chosen[1:i - 1] || v_chosen[i + 1:];
                IF {{ns}}.condition_holds(v_dag.dag_id, v_try) THEN
                    v_chosen := v_try;
                END IF;
            END LOOP;
            -- The oldest row of each chosen asset (its first position), then the oldest
            -- others, N in all.
            v_witness := ARRAY(SELECT array_position(v_assets, a) FROM unnest(v_chosen) AS a);
            SELECT array_agg(c.pos ORDER BY c.pos) INTO v_claim
              FROM (SELECT unnest(v_witness) AS pos
                    UNION ALL
                    (SELECT u.pos
                       FROM generate_series(1, v_n) AS u(pos)
                      WHERE u.pos <> ALL (v_witness)
                      ORDER BY u.pos
                      LIMIT greatest(v_dag.max_events_per_run - cardinality(v_witness), 0))) c;
        END IF;

        -- The claimed rows, in queue order: the last one is the newest, the triggering event.
        IF v_claim IS NULL THEN
            v_events := ARRAY(SELECT u.id FROM unnest(v_ids) AS u(id) ORDER BY u.id);
            v_run_after := v_times[v_n];
            v_trigger := v_ids[v_n];
        ELSE
            v_events := ARRAY(SELECT v_ids[p] FROM unnest(v_claim) AS p ORDER BY 1);
            v_run_after := v_times[v_claim[cardinality(v_claim)]];
            v_trigger := v_ids[v_claim[cardinality(v_claim)]];
        END IF;

        UPDATE {{ns}}.dag d
           SET last_run_seq = d.last_run_seq + 1, last_scheduled_at = v_now
         WHERE d.dag_id = v_dag.dag_id
        RETURNING d.last_run_seq INTO v_seq;

        INSERT INTO {{ns}}.dag_run AS r (dag_id, run_id, seq, run_after, created_at,
                                         triggering_event_id, event_count)
        VALUES (v_dag.dag_id,
                'asset_triggered__'
                    || to_char(v_run_after AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US')
                    || '+00:00__' || v_seq,
                v_seq, v_run_after, v_now, v_trigger, cardinality(v_events))
        RETURNING r.id, r.dag_id, r.run_id, r.seq, r.run_after, r.created_at, r.state
             INTO v_run_pk, dag_id, run_id, seq, run_after, created_at, state;

        -- Delete exactly the claimed rows, by primary key (I3). The claim guard (I4): if any
        -- claimed row is gone, someone else consumed it (or delete_asset removed its event);
        -- abort the whole pass. Before the links: a link to an event deleted meanwhile would
        -- fail its foreign key, an error no retry is made for; the guard's AQ900 is retried.
        DELETE FROM {{ns}}.asset_dag_run_queue q
         WHERE q.target_dag_id = v_dag.dag_id
           AND q.asset_event_id = ANY (v_events);
        GET DIAGNOSTICS v_deleted = ROW_COUNT;
        IF v_deleted <> cardinality(v_events) THEN
            RAISE EXCEPTION 'claim guard: dag % claimed % queue rows but deleted %',
                    v_dag.dag_id, cardinality(v_events), v_deleted
                USING ERRCODE = 'AQ900',
                      HINT = 'The pass was rolled back; it is safe to run it again.';
        END IF;

        INSERT INTO {{ns}}.dagrun_asset_event (dag_run_id, asset_event_id, dag_id)
        SELECT v_run_pk, e, v_dag.dag_id FROM unnest(v_events) AS e;

        dag_run_id := v_run_pk;
        event_ids := v_events;
        triggering_event_id := v_trigger;
        RETURN NEXT;
    END LOOP;
END
$$;

-- The roles that may execute set_run_state now, to give them the new one (its result gets
-- the new columns, so it is dropped and created again, and a dropped function takes its
-- grants with it).
DROP TABLE IF EXISTS pg_temp._assetq_0006_grants;
CREATE TEMPORARY TABLE _assetq_0006_grants AS
SELECT DISTINCT pg_catalog.pg_get_userbyid(a.grantee) AS grantee
  FROM pg_catalog.pg_proc p, pg_catalog.aclexplode(p.proacl) a
 WHERE p.oid = '{{ns}}.set_run_state(text, text, text)'::regprocedure
   AND a.privilege_type = 'EXECUTE' AND a.grantee <> p.proowner AND a.grantee <> 0;
DROP FUNCTION {{ns}}.set_run_state(text, text, text);
CREATE FUNCTION {{ns}}.set_run_state(p_dag_id text, p_run_id text, p_state text)
RETURNS TABLE (
    dag_run_id          bigint,
    dag_id              varchar,
    run_id              varchar,
    seq                 bigint,
    state               varchar,
    run_after           timestamptz,
    created_at          timestamptz,
    started_at          timestamptz,
    ended_at            timestamptz,
    triggering_event_id bigint,
    event_count         integer
)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_id  bigint;
    v_old text;
BEGIN
    IF p_state IS NULL OR p_state NOT IN ('queued', 'running', 'success', 'failed') THEN
        RAISE EXCEPTION 'unknown run state %: use queued, running, success or failed', quote_nullable(p_state)
            USING ERRCODE = 'AQ008';
    END IF;
    SELECT r.id, r.state INTO v_id, v_old
      FROM {{ns}}.dag_run r
     WHERE r.dag_id = p_dag_id AND r.run_id = p_run_id
       FOR NO KEY UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'unknown run % of dag %', quote_nullable(p_run_id), quote_nullable(p_dag_id)
            USING ERRCODE = 'AQ006';
    END IF;
    IF v_old <> p_state THEN
        IF NOT ((v_old = 'queued' AND p_state IN ('running', 'success', 'failed'))
                OR (v_old = 'running' AND p_state IN ('success', 'failed'))) THEN
            RAISE EXCEPTION 'run % of dag % is %: it cannot move to %', p_run_id, p_dag_id, v_old, p_state
                USING ERRCODE = 'AQ008',
                      HINT = 'Runs move queued -> running -> success or failed; success and failed are final.';
        END IF;
        UPDATE {{ns}}.dag_run r
           SET state = p_state,
               started_at = CASE WHEN p_state = 'running' THEN clock_timestamp() ELSE r.started_at END,
               ended_at = CASE WHEN p_state IN ('success', 'failed') THEN clock_timestamp() ELSE r.ended_at END,
               updated_at = clock_timestamp()
         WHERE r.id = v_id;
    END IF;
    RETURN QUERY
    SELECT r.id, r.dag_id, r.run_id, r.seq, r.state, r.run_after, r.created_at, r.started_at,
           r.ended_at, r.triggering_event_id, r.event_count
      FROM {{ns}}.dag_run r
     WHERE r.id = v_id;
END
$$;

CREATE OR REPLACE FUNCTION {{ns}}.purge_runs(p_older_than timestamptz, p_batch_size integer)
RETURNS TABLE (deleted bigint)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
BEGIN
    IF p_older_than IS NULL OR p_batch_size IS NULL OR p_batch_size < 1 THEN
        RAISE EXCEPTION 'purge_runs needs a cutoff and a positive batch size, got % and %',
                quote_nullable(p_older_than), quote_nullable(p_batch_size)
            USING ERRCODE = 'AQ002';
    END IF;
    DELETE FROM {{ns}}.dag_run r
     WHERE r.id IN (SELECT o.id
                      FROM {{ns}}.dag_run o
                     WHERE o.created_at < p_older_than
                     ORDER BY o.created_at
                     LIMIT p_batch_size
                       FOR UPDATE SKIP LOCKED);
    GET DIAGNOSTICS deleted = ROW_COUNT;
    RETURN NEXT;
END
$$;

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
        EXECUTE format('GRANT EXECUTE ON FUNCTION {{ns}}.schedule_pass(integer),'
                       ' {{ns}}.set_run_state(text, text, text) TO %I', p_grantee);
    ELSE
        EXECUTE format('GRANT SELECT ON ALL TABLES IN SCHEMA {{ns}} TO %I', p_grantee);
    END IF;
END
$$;

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
                   ' {{ns}}.register_events(jsonb), {{ns}}.schedule_pass(integer),'
                   ' {{ns}}.set_run_state(text, text, text) FROM %I',
                   p_grantee);
    EXECUTE format('REVOKE SELECT ON ALL TABLES IN SCHEMA {{ns}} FROM %I', p_grantee);
    EXECUTE format('REVOKE USAGE ON SCHEMA {{ns}} FROM %I', p_grantee);
END
$$;

DROP INDEX {{ns}}.dag_run_claim_idx;
DROP INDEX {{ns}}.dag_run_state_idx;
ALTER TABLE {{ns}}.dag_run
    DROP CONSTRAINT dag_run_attempt_check,
    DROP COLUMN attempt,
    DROP COLUMN worker,
    DROP COLUMN lease_until,
    DROP COLUMN not_before,
    DROP COLUMN error;
ALTER TABLE {{ns}}.dag
    DROP CONSTRAINT dag_max_attempts_check,
    DROP CONSTRAINT dag_retry_delay_check,
    DROP COLUMN max_attempts,
    DROP COLUMN retry_delay_seconds,
    DROP COLUMN max_retry_delay_seconds;

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
       d.last_scheduled_at,
       d.max_active_runs,
       (SELECT count(*)
          FROM {{ns}}.dag_run r
         WHERE r.dag_id = d.dag_id AND r.state IN ('queued', 'running')) AS active_runs
  FROM {{ns}}.dag d
  LEFT JOIN (SELECT q.target_dag_id,
                    count(*) AS queued_events,
                    min(q.created_at) AS oldest_queued_at
               FROM {{ns}}.asset_dag_run_queue q
              GROUP BY q.target_dag_id) q
    ON q.target_dag_id = d.dag_id;


ALTER FUNCTION {{ns}}.schedule_pass(integer)
    SECURITY DEFINER SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION {{ns}}.set_run_state(text, text, text)
    SECURITY DEFINER SET search_path = pg_catalog, pg_temp;

DO $$
DECLARE
    v_grantee text;
BEGIN
    FOR v_grantee IN SELECT g.grantee FROM pg_temp._assetq_0006_grants g LOOP
        EXECUTE format('GRANT EXECUTE ON FUNCTION {{ns}}.set_run_state(text, text, text) TO %I', v_grantee);
    END LOOP;
END
$$;
DROP TABLE pg_temp._assetq_0006_grants;

REVOKE EXECUTE ON ALL FUNCTIONS IN SCHEMA {{ns}} FROM PUBLIC;
