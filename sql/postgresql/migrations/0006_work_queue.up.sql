-- Migration 0006_work_queue (up): runs as work (issue 12). docs/workers.md explains it from
-- the user's side; the functions' comments say how each guarantee is kept.
--
--   * a run is claimed by one worker at a time (claim_runs), under a lease on the database's
--     clock that heartbeat_run renews; every later call names the claim's attempt and is
--     refused (AQ010) once the run is held at another attempt or finished (I8);
--   * complete_run finishes an attempt in the caller's transaction: success commits with the
--     caller's own writes and the run's output events (I9); a failure is retried after the
--     consumer's retry delay while it has attempts left (dag.max_attempts,
--     retry_delay_seconds, max_retry_delay_seconds: new declare_dag parameters);
--   * a run whose lease expired is claimable again, as a new attempt; on its last attempt it
--     is failed by the next claim, or by the next pass of its consumer at its cap (I10);
--   * retry_run gives a failed run one more attempt; set_run_state refuses to move a run a
--     worker holds; purge_runs keeps queued and running runs;
--   * dag_queue_status shows running runs, leases, retries and failures; grant_access has a
--     worker kind (claim, heartbeat, complete) and the scheduler kind may retry runs;
--   * workers are woken (PostgreSQL) by a notification when runs are created.
--
-- declare_dag gets new parameters, so it is dropped and created again (no role is granted
-- it); so is set_run_state, whose result gets the new columns, and the roles that could
-- execute it get the new one. schedule_pass, purge_runs, grant_access and revoke_access keep
-- their signatures and are replaced in place, which keeps their grants; CREATE OR REPLACE resets a
-- function's SECURITY DEFINER and search_path, so they are set again below. Every change here
-- is online: new columns without a rewrite (constant defaults), an UPDATE of queued runs only,
-- indexes on dag_run.
--
-- {{ns}} is replaced by the quoted namespace when the file is loaded.

ALTER TABLE {{ns}}.dag
    ADD COLUMN max_attempts integer NOT NULL DEFAULT 1,
    ADD COLUMN retry_delay_seconds double precision NOT NULL DEFAULT 0,
    ADD COLUMN max_retry_delay_seconds double precision,
    ADD CONSTRAINT dag_max_attempts_check CHECK (max_attempts BETWEEN 1 AND 1000),
    ADD CONSTRAINT dag_retry_delay_check
        CHECK (retry_delay_seconds >= 0 AND max_retry_delay_seconds >= retry_delay_seconds);

ALTER TABLE {{ns}}.dag_run
    ADD COLUMN attempt integer NOT NULL DEFAULT 0,
    ADD COLUMN worker varchar(250),
    ADD COLUMN lease_until timestamptz,
    ADD COLUMN not_before timestamptz,
    ADD COLUMN error text,
    ADD CONSTRAINT dag_run_attempt_check CHECK (attempt >= 0);

-- Runs queued before this revision are claimable at once; running ones were moved by hand
-- (set_run_state) and stay with whoever moved them.
UPDATE {{ns}}.dag_run SET not_before = created_at WHERE state = 'queued';

-- The claim's index: claimable runs by when they may be claimed; finished runs are not in it.
CREATE INDEX dag_run_claim_idx ON {{ns}}.dag_run (not_before, id) WHERE not_before IS NOT NULL;
-- runs(state=...) across consumers, newest first.
CREATE INDEX dag_run_state_idx ON {{ns}}.dag_run (state, id);

DROP FUNCTION {{ns}}.declare_dag(text, jsonb, jsonb, boolean, integer, integer, boolean);

CREATE FUNCTION {{ns}}.declare_dag(
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
    -- Retries (migration 0006_work_queue): NULL means the default, one attempt and no delay.
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
        SELECT d.dag_id, d.max_active_runs, d.max_events_per_run, d.max_attempts
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
        -- First, a run whose last attempt's lease expired is failed (I10: a worker that died on
        -- its last attempt must not hold the cap for good; claim_runs does the same). Rows a
        -- worker is completing right now are skipped, not waited for.
        IF v_dag.max_active_runs IS NOT NULL THEN
            UPDATE {{ns}}.dag_run r
               SET state = 'failed', ended_at = v_now, updated_at = v_now, not_before = NULL,
                   lease_until = NULL,
                   error = format('the lease of attempt %s (worker %s) expired at %s and no attempt is left (max_attempts %s)',
                                  r.attempt, r.worker, r.lease_until, v_dag.max_attempts)
             WHERE r.id IN (SELECT x.id FROM {{ns}}.dag_run x
                             WHERE x.dag_id = v_dag.dag_id AND x.state = 'running'
                               AND x.not_before <= v_now AND x.attempt >= v_dag.max_attempts
                               FOR NO KEY UPDATE SKIP LOCKED);
        END IF;
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

        -- not_before: claimable by workers (claim_runs) from now on.
        INSERT INTO {{ns}}.dag_run AS r (dag_id, run_id, seq, run_after, created_at,
                                         triggering_event_id, event_count, not_before)
        VALUES (v_dag.dag_id,
                'asset_triggered__'
                    || to_char(v_run_after AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US')
                    || '+00:00__' || v_seq,
                v_seq, v_run_after, v_now, v_trigger, cardinality(v_events), v_now)
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
    event_count         integer,
    attempt             integer,
    worker              varchar,
    lease_until         timestamptz,
    not_before          timestamptz,
    error               text
)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_id      bigint;
    v_old     text;
    v_worker  text;
    v_attempt integer;
    v_lease   timestamptz;
BEGIN
    IF p_state IS NULL OR p_state NOT IN ('queued', 'running', 'success', 'failed') THEN
        RAISE EXCEPTION 'unknown run state %: use queued, running, success or failed', quote_nullable(p_state)
            USING ERRCODE = 'AQ008';
    END IF;
    SELECT r.id, r.state, r.worker, r.attempt, r.lease_until
      INTO v_id, v_old, v_worker, v_attempt, v_lease
      FROM {{ns}}.dag_run r
     WHERE r.dag_id = p_dag_id AND r.run_id = p_run_id
       FOR NO KEY UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'unknown run % of dag %', quote_nullable(p_run_id), quote_nullable(p_dag_id)
            USING ERRCODE = 'AQ006';
    END IF;
    -- A run a worker holds (claimed by claim_runs: running under a lease) is finished by that
    -- worker's complete_run, fenced by its attempt (I8): moving it here would let a second
    -- party finish a run someone holds. A run moved to running by hand has no lease.
    IF v_old = 'running' AND v_lease IS NOT NULL AND v_old <> p_state THEN
        RAISE EXCEPTION 'run % of dag % is held by worker % (attempt %): its worker completes it (assetq.complete_run)',
                p_run_id, p_dag_id, quote_literal(v_worker), v_attempt
            USING ERRCODE = 'AQ008',
                  HINT = 'If the worker died, the run is claimed again when its lease expires.';
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
               updated_at = clock_timestamp(),
               -- Leaving queued by hand: no worker may claim it any more.
               not_before = NULL,
               lease_until = NULL
         WHERE r.id = v_id;
    END IF;
    RETURN QUERY
    SELECT r.id, r.dag_id, r.run_id, r.seq, r.state, r.run_after, r.created_at, r.started_at,
           r.ended_at, r.triggering_event_id, r.event_count, r.attempt, r.worker, r.lease_until,
           r.not_before, r.error
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
                       -- Never a run someone may still work on (issue 12): a long run's worker
                       -- would find it gone.
                       AND o.state IN ('success', 'failed')
                     ORDER BY o.created_at
                     LIMIT p_batch_size
                       FOR UPDATE SKIP LOCKED);
    GET DIAGNOSTICS deleted = ROW_COUNT;
    RETURN NEXT;
END
$$;

CREATE OR REPLACE VIEW {{ns}}.dag_queue_status AS
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
         WHERE r.dag_id = d.dag_id AND r.state IN ('queued', 'running')) AS active_runs,
       w.running_runs,
       w.oldest_lease_until,
       w.expired_leases,
       w.retrying_runs,
       (SELECT count(*)
          FROM {{ns}}.dag_run r
         WHERE r.dag_id = d.dag_id AND r.state = 'failed') AS failed_runs,
       d.max_attempts
  FROM {{ns}}.dag d
  CROSS JOIN LATERAL (
        SELECT count(*) FILTER (WHERE r.state = 'running') AS running_runs,
               min(r.lease_until) AS oldest_lease_until,
               count(*) FILTER (WHERE r.state = 'running' AND r.lease_until < now()) AS expired_leases,
               count(*) FILTER (WHERE r.attempt > CASE r.state WHEN 'running' THEN 1 ELSE 0 END)
                   AS retrying_runs
          FROM {{ns}}.dag_run r
         WHERE r.dag_id = d.dag_id AND r.state IN ('queued', 'running')) w
  LEFT JOIN (SELECT q.target_dag_id,
                    count(*) AS queued_events,
                    min(q.created_at) AS oldest_queued_at
               FROM {{ns}}.asset_dag_run_queue q
              GROUP BY q.target_dag_id) q
    ON q.target_dag_id = d.dag_id;


-- Workers (migration 0006_work_queue): a run is work that exactly one worker holds at a time.
-- docs/workers.md explains the protocol from the user's side.
--
-- A run's attempt counts its claims. not_before is when the run may next be claimed: for a
-- queued run when it was created (or when its retry is due), for a running one the end of
-- its lease (then another worker may claim it, as a new attempt), NULL for a finished run or
-- one moved by hand (set_run_state), which no worker claims. One index on it serves every
-- claim: finished runs are not in it, so a claim costs what it takes, never the history.
-- Every call after a claim names the claim's attempt and is refused (AQ010, lease lost)
-- unless the run is still running at that attempt (I8): a worker whose lease expired may
-- still finish while nobody has claimed the run again, never after.

-- Claims at most p_limit runs for worker p_worker (oldest not_before first; within the
-- consumers p_dag_ids, a JSON array, or all when NULL) and returns them, running, with a lease
-- of p_lease_seconds on the database's clock. Run it in a short transaction of its own at READ
-- COMMITTED (assetq.claim_runs does). FOR NO KEY UPDATE SKIP LOCKED: concurrent claimers
-- take different runs and never wait for each other, and a row locked by a pass or a
-- completion is simply not taken now. The candidates are read with the limit in the locking
-- query itself (a FOR loop over a cursor would lock a batch of rows beyond those it uses, and
-- other claimers would skip them). A running run whose lease expired on its last attempt is
-- failed here instead of claimed (I10), and the search goes on for the limit.
CREATE FUNCTION {{ns}}.claim_runs(
    p_worker        text,
    p_limit         integer DEFAULT 1,
    p_lease_seconds double precision DEFAULT 60,
    p_dag_ids       jsonb DEFAULT NULL
) RETURNS TABLE (
    dag_run_id          bigint,
    dag_id              varchar,
    run_id              varchar,
    seq                 bigint,
    run_after           timestamptz,
    created_at          timestamptz,
    event_ids           bigint[],
    triggering_event_id bigint,
    state               varchar,
    attempt             integer,
    worker              varchar,
    lease_until         timestamptz,
    started_at          timestamptz
)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_now     timestamptz;
    v_until   timestamptz;
    v_ids     bigint[];
    v_taken   integer := 0;
    v_claimed integer;
    v_failed  integer;
    v_expired boolean;
BEGIN
    IF p_worker IS NULL OR p_worker = '' OR length(p_worker) > 250 THEN
        RAISE EXCEPTION 'worker must be a name of 1 to 250 characters, got %', quote_nullable(left(p_worker, 60))
            USING ERRCODE = 'AQ002';
    END IF;
    IF p_limit IS NULL OR p_limit < 1 OR p_limit > 1000 THEN
        RAISE EXCEPTION 'limit must be 1 to 1000, got %', quote_nullable(p_limit)
            USING ERRCODE = 'AQ002';
    END IF;
    -- NOT (... > 0): NaN is refused too.
    IF p_lease_seconds IS NULL OR NOT (p_lease_seconds > 0 AND p_lease_seconds <= 604800) THEN
        RAISE EXCEPTION 'lease must be above 0 and at most 604800 seconds, got %', quote_nullable(p_lease_seconds)
            USING ERRCODE = 'AQ002';
    END IF;
    IF p_dag_ids IS NOT NULL
       AND (jsonb_typeof(p_dag_ids) <> 'array'
            OR EXISTS (SELECT 1 FROM jsonb_array_elements(p_dag_ids) x WHERE jsonb_typeof(x) <> 'string'))
    THEN
        RAISE EXCEPTION 'dag_ids must be a JSON array of dag ids or NULL' USING ERRCODE = 'AQ002';
    END IF;
    v_now := clock_timestamp();
    v_until := v_now + make_interval(secs => p_lease_seconds);
    LOOP
        SELECT array_agg(x.id), coalesce(bool_or(x.state = 'running'), false)
          INTO v_ids, v_expired
          FROM (SELECT r.id, r.state
                  FROM {{ns}}.dag_run r
                 WHERE r.not_before <= v_now
                   AND (p_dag_ids IS NULL
                        OR r.dag_id IN (SELECT jsonb_array_elements_text(p_dag_ids)))
                 ORDER BY r.not_before, r.id
                 LIMIT p_limit - v_taken
                   FOR NO KEY UPDATE OF r SKIP LOCKED) x;
        EXIT WHEN v_ids IS NULL;

        -- Only a running candidate (its lease expired) may be on its last attempt: the
        -- usual claim, of queued runs only, skips this statement.
        v_failed := 0;
        IF v_expired THEN
            UPDATE {{ns}}.dag_run r
               SET state = 'failed', ended_at = v_now, updated_at = v_now, not_before = NULL,
                   lease_until = NULL,
                   error = format('the lease of attempt %s (worker %s) expired at %s and no attempt is left (max_attempts %s)',
                                  r.attempt, r.worker, r.lease_until, d.max_attempts)
              FROM {{ns}}.dag d
             WHERE r.id = ANY (v_ids) AND d.dag_id = r.dag_id
               AND r.state = 'running' AND r.attempt >= d.max_attempts;
            GET DIAGNOSTICS v_failed = ROW_COUNT;
        END IF;

        RETURN QUERY
        WITH c AS (
            UPDATE {{ns}}.dag_run r
               SET state = 'running', attempt = r.attempt + 1, worker = p_worker,
                   lease_until = v_until, not_before = v_until, started_at = v_now,
                   updated_at = v_now
             WHERE r.id = ANY (v_ids) AND r.state IN ('queued', 'running')
            RETURNING r.id, r.dag_id, r.run_id, r.seq, r.run_after, r.created_at,
                      r.triggering_event_id, r.state, r.attempt, r.worker, r.lease_until,
                      r.started_at)
        SELECT c.id, c.dag_id, c.run_id, c.seq, c.run_after, c.created_at,
               ARRAY(SELECT l.asset_event_id FROM {{ns}}.dagrun_asset_event l
                      WHERE l.dag_run_id = c.id ORDER BY 1),
               c.triggering_event_id, c.state, c.attempt, c.worker, c.lease_until, c.started_at
          FROM c
         ORDER BY c.id;
        GET DIAGNOSTICS v_claimed = ROW_COUNT;
        v_taken := v_taken + v_claimed;
        EXIT WHEN v_failed = 0 OR v_taken >= p_limit;
    END LOOP;
END
$$;

-- Renews the lease of run p_run_id of consumer p_dag_id held at attempt p_attempt to
-- p_lease_seconds from now (database clock) and returns the new end. AQ010 (lease lost) when
-- the run is no longer running at that attempt: another worker claimed it after the lease
-- expired, or it was finished; nothing is written. AQ006 for an unknown run.
CREATE FUNCTION {{ns}}.heartbeat_run(
    p_dag_id        text,
    p_run_id        text,
    p_attempt       integer,
    p_lease_seconds double precision
) RETURNS TABLE (lease_until timestamptz)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_id      bigint;
    v_state   text;
    v_attempt integer;
    v_lease   timestamptz;
    v_until   timestamptz;
BEGIN
    IF p_lease_seconds IS NULL OR NOT (p_lease_seconds > 0 AND p_lease_seconds <= 604800) THEN
        RAISE EXCEPTION 'lease must be above 0 and at most 604800 seconds, got %', quote_nullable(p_lease_seconds)
            USING ERRCODE = 'AQ002';
    END IF;
    SELECT r.id, r.state, r.attempt, r.lease_until INTO v_id, v_state, v_attempt, v_lease
      FROM {{ns}}.dag_run r
     WHERE r.dag_id = p_dag_id AND r.run_id = p_run_id
       FOR NO KEY UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'unknown run % of dag %', quote_nullable(p_run_id), quote_nullable(p_dag_id)
            USING ERRCODE = 'AQ006';
    END IF;
    -- Held means running under a lease at this attempt: a run moved to running by hand
    -- (set_run_state) has none, and no claim of an earlier attempt holds it.
    IF v_state <> 'running' OR v_attempt IS DISTINCT FROM p_attempt OR v_lease IS NULL THEN
        RAISE EXCEPTION 'lease lost: run % of dag % is % at attempt %, not running at attempt %',
                p_run_id, p_dag_id, v_state, v_attempt, coalesce(CAST(p_attempt AS text), 'NULL')
            USING ERRCODE = 'AQ010',
                  HINT = 'Stop working on it: another worker holds it now, or it was finished.';
    END IF;
    v_until := clock_timestamp() + make_interval(secs => p_lease_seconds);
    UPDATE {{ns}}.dag_run r
       SET lease_until = v_until, not_before = v_until, updated_at = clock_timestamp()
     WHERE r.id = v_id;
    lease_until := v_until;
    RETURN NEXT;
END
$$;

-- Finishes attempt p_attempt of run p_run_id of consumer p_dag_id, in the caller's
-- transaction (I9): with p_state 'success' the run succeeds and the events p_events (a JSON
-- array, as register_events takes it, or NULL) are registered and fanned out, so the caller's
-- own writes, the success and the output events commit together or not at all. With
-- 'failed' the error p_error is recorded (its first 4000 characters); while the consumer's
-- max_attempts has attempts left the run is queued again, claimable after the retry delay
-- (retry_delay_seconds, doubled for each attempt already failed when max_retry_delay_seconds
-- is set, up to it), otherwise it fails for good. Success and a final failure free a place
-- under max_active_runs. Returns the run, with the ids of the output events in input order.
-- AQ010 (lease lost, nothing written) unless the run is running at that attempt; AQ008 for
-- another state; AQ002 for events with a failure; register_events' own errors for bad events.
CREATE FUNCTION {{ns}}.complete_run(
    p_dag_id  text,
    p_run_id  text,
    p_attempt integer,
    p_state   text,
    p_error   text DEFAULT NULL,
    p_events  jsonb DEFAULT NULL
) RETURNS TABLE (
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
    event_count         integer,
    attempt             integer,
    worker              varchar,
    lease_until         timestamptz,
    not_before          timestamptz,
    error               text,
    output_event_ids    bigint[]
)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_id        bigint;
    v_state     text;
    v_attempt   integer;
    v_lease     timestamptz;
    v_max       integer;
    v_delay     double precision;
    v_cap       double precision;
    v_now       timestamptz;
    v_out       bigint[];
BEGIN
    IF p_state IS NULL OR p_state NOT IN ('success', 'failed') THEN
        RAISE EXCEPTION 'a run is completed as success or failed, got %', quote_nullable(p_state)
            USING ERRCODE = 'AQ008';
    END IF;
    IF p_state = 'failed' AND p_events IS NOT NULL AND p_events <> '[]'::jsonb THEN
        RAISE EXCEPTION 'a failed run produces no events' USING ERRCODE = 'AQ002';
    END IF;
    SELECT r.id, r.state, r.attempt, r.lease_until, d.max_attempts, d.retry_delay_seconds,
           d.max_retry_delay_seconds
      INTO v_id, v_state, v_attempt, v_lease, v_max, v_delay, v_cap
      FROM {{ns}}.dag_run r
      JOIN {{ns}}.dag d ON d.dag_id = r.dag_id
     WHERE r.dag_id = p_dag_id AND r.run_id = p_run_id
       FOR NO KEY UPDATE OF r;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'unknown run % of dag %', quote_nullable(p_run_id), quote_nullable(p_dag_id)
            USING ERRCODE = 'AQ006';
    END IF;
    IF v_state <> 'running' OR v_attempt IS DISTINCT FROM p_attempt OR v_lease IS NULL THEN
        RAISE EXCEPTION 'lease lost: run % of dag % is % at attempt %, not running at attempt %',
                p_run_id, p_dag_id, v_state, v_attempt, coalesce(CAST(p_attempt AS text), 'NULL')
            USING ERRCODE = 'AQ010',
                  HINT = 'Roll back: another worker holds it now, or it was finished; nothing was written.';
    END IF;
    v_now := clock_timestamp();
    IF p_state = 'success' THEN
        IF p_events IS NOT NULL AND p_events <> '[]'::jsonb THEN
            SELECT array_agg(e.event_id ORDER BY e.item_no) INTO v_out
              FROM {{ns}}.register_events(p_events) e;
        END IF;
        UPDATE {{ns}}.dag_run r
           SET state = 'success', ended_at = v_now, updated_at = v_now, lease_until = NULL,
               not_before = NULL
         WHERE r.id = v_id;
    ELSIF v_attempt < v_max THEN
        IF v_cap IS NOT NULL THEN
            v_delay := least(v_delay * power(2::double precision, least(v_attempt - 1, 60)), v_cap);
        END IF;
        UPDATE {{ns}}.dag_run r
           SET state = 'queued', updated_at = v_now, lease_until = NULL,
               not_before = v_now + make_interval(secs => v_delay), error = left(p_error, 4000)
         WHERE r.id = v_id;
    ELSE
        UPDATE {{ns}}.dag_run r
           SET state = 'failed', ended_at = v_now, updated_at = v_now, lease_until = NULL,
               not_before = NULL, error = left(p_error, 4000)
         WHERE r.id = v_id;
    END IF;
    RETURN QUERY
    SELECT r.id, r.dag_id, r.run_id, r.seq, r.state, r.run_after, r.created_at, r.started_at,
           r.ended_at, r.triggering_event_id, r.event_count, r.attempt, r.worker, r.lease_until,
           r.not_before, r.error, coalesce(v_out, '{}')
      FROM {{ns}}.dag_run r
     WHERE r.id = v_id;
END
$$;

-- Puts failed run p_run_id of consumer p_dag_id back in the queue, claimable now, with the
-- same events and run id; its next claim is the next attempt (the count goes on), and it is
-- given one more attempt whatever max_attempts says. AQ008 unless the run is failed, AQ006
-- for an unknown run. It may put the consumer one run over max_active_runs. Returns the run
-- (the complete_run columns, no output events).
CREATE FUNCTION {{ns}}.retry_run(p_dag_id text, p_run_id text)
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
    event_count         integer,
    attempt             integer,
    worker              varchar,
    lease_until         timestamptz,
    not_before          timestamptz,
    error               text,
    output_event_ids    bigint[]
)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_id    bigint;
    v_state text;
BEGIN
    SELECT r.id, r.state INTO v_id, v_state
      FROM {{ns}}.dag_run r
     WHERE r.dag_id = p_dag_id AND r.run_id = p_run_id
       FOR NO KEY UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'unknown run % of dag %', quote_nullable(p_run_id), quote_nullable(p_dag_id)
            USING ERRCODE = 'AQ006';
    END IF;
    IF v_state <> 'failed' THEN
        RAISE EXCEPTION 'run % of dag % is %: only a failed run can be retried', p_run_id, p_dag_id, v_state
            USING ERRCODE = 'AQ008';
    END IF;
    UPDATE {{ns}}.dag_run r
       SET state = 'queued', ended_at = NULL, lease_until = NULL, not_before = clock_timestamp(),
           updated_at = clock_timestamp()
     WHERE r.id = v_id;
    RETURN QUERY
    SELECT r.id, r.dag_id, r.run_id, r.seq, r.state, r.run_after, r.created_at, r.started_at,
           r.ended_at, r.triggering_event_id, r.event_count, r.attempt, r.worker, r.lease_until,
           r.not_before, r.error, CAST('{}' AS bigint[])
      FROM {{ns}}.dag_run r
     WHERE r.id = v_id;
END
$$;

-- Workers are woken when runs are created (PostgreSQL): a notification on the namespace's
-- channel with payload 'runs' (producers' notifications say 'queued'; each loop reads only
-- its own). Sent by the scheduler pass's transaction, never by a producer's, so producers
-- pay nothing for it.
CREATE FUNCTION {{ns}}.dag_run_notify() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM new_runs) THEN
        PERFORM pg_notify(TG_TABLE_SCHEMA, 'runs');
    END IF;
    RETURN NULL;
END
$$;

CREATE TRIGGER dag_run_notify
    AFTER INSERT ON {{ns}}.dag_run
    REFERENCING NEW TABLE AS new_runs
    FOR EACH STATEMENT EXECUTE FUNCTION {{ns}}.dag_run_notify();

CREATE OR REPLACE FUNCTION {{ns}}.grant_access(p_access text, p_grantee text, p_host text DEFAULT NULL)
RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    IF p_access IS NULL OR p_access NOT IN ('producer', 'scheduler', 'worker', 'reader') THEN
        RAISE EXCEPTION 'unknown access %: use producer, scheduler, worker or reader', quote_nullable(p_access)
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
                       ' {{ns}}.set_run_state(text, text, text),'
                       ' {{ns}}.retry_run(text, text) TO %I', p_grantee);
    ELSIF p_access = 'worker' THEN
        EXECUTE format('GRANT EXECUTE ON FUNCTION'
                       ' {{ns}}.claim_runs(text, integer, double precision, jsonb),'
                       ' {{ns}}.heartbeat_run(text, text, integer, double precision),'
                       ' {{ns}}.complete_run(text, text, integer, text, text, jsonb) TO %I', p_grantee);
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
                   ' {{ns}}.set_run_state(text, text, text), {{ns}}.retry_run(text, text),'
                   ' {{ns}}.claim_runs(text, integer, double precision, jsonb),'
                   ' {{ns}}.heartbeat_run(text, text, integer, double precision),'
                   ' {{ns}}.complete_run(text, text, integer, text, text, jsonb) FROM %I',
                   p_grantee);
    EXECUTE format('REVOKE SELECT ON ALL TABLES IN SCHEMA {{ns}} FROM %I', p_grantee);
    EXECUTE format('REVOKE USAGE ON SCHEMA {{ns}} FROM %I', p_grantee);
END
$$;

ALTER FUNCTION {{ns}}.schedule_pass(integer)
    SECURITY DEFINER SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION {{ns}}.set_run_state(text, text, text)
    SECURITY DEFINER SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION {{ns}}.claim_runs(text, integer, double precision, jsonb)
    SECURITY DEFINER SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION {{ns}}.heartbeat_run(text, text, integer, double precision)
    SECURITY DEFINER SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION {{ns}}.complete_run(text, text, integer, text, text, jsonb)
    SECURITY DEFINER SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION {{ns}}.retry_run(text, text)
    SECURITY DEFINER SET search_path = pg_catalog, pg_temp;

DO $$
DECLARE
    v_grantee text;
BEGIN
    -- The roles that could move run states are the scheduler kind's (grant_access), and that
    -- kind may now also retry failed runs: an upgrade keeps what a kind of access means.
    FOR v_grantee IN SELECT g.grantee FROM pg_temp._assetq_0006_grants g LOOP
        EXECUTE format('GRANT EXECUTE ON FUNCTION {{ns}}.set_run_state(text, text, text),'
                       ' {{ns}}.retry_run(text, text) TO %I', v_grantee);
    END LOOP;
END
$$;
DROP TABLE pg_temp._assetq_0006_grants;

REVOKE EXECUTE ON ALL FUNCTIONS IN SCHEMA {{ns}} FROM PUBLIC;
