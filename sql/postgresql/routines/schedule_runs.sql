-- One scheduler pass (I3-I6): the body of schedule_pass_v2 and, with p_worker, of
-- schedule_and_claim's pass, whose first run it claims as it makes it (below). Takes at most
-- p_limit unpaused consumers with queued rows (of the consumers p_dag_ids, a JSON array, or
-- of all when NULL), least recently examined first, each locked FOR NO KEY UPDATE SKIP
-- LOCKED, and for each:
-- skips it while it has max_active_runs active runs (its queue is left whole); claims its
-- committed queue rows (all of them, or with max_events_per_run the oldest that satisfy the
-- condition, see below); evaluates the condition on exactly those rows, and when it holds
-- creates a run, links exactly the claimed events and deletes exactly the claimed rows by
-- key. Returns the runs created. Run it at READ COMMITTED in a transaction of its own; AQ900
-- (claim guard) means the pass was rolled back and is safe to retry.
--
-- Runs per pass: an uncapped consumer gets one run (its whole
-- queue). A capped one gets runs one after another, each claimed as below from what the
-- previous one left, while a claim satisfies the condition and takes part of the queue only,
-- up to its share of the pass, p_limit / (the consumers the pass took), at least 1, and with
-- max_active_runs up to the cap. So the runs of unpartitioned consumers never exceed p_limit,
-- a backlog behind a capped consumer drains up to p_limit runs per pass instead of one, and
-- 100 consumers taken by a pass of 100 get one run each, as before.
--
-- max_events_per_run = N with more than N rows queued: if the oldest N rows satisfy the
-- condition, they are the claim. Otherwise, if the whole queue does, the claim is built so
-- the consumer is never starved: for each clause not yet hit, the queued member asset with the
-- oldest row (greedy); then each chosen asset, newest choice first, is dropped if the others
-- still hit every clause; the claim is the oldest row of each chosen asset plus the oldest
-- other rows, N in all. A declaration whose cap is below the condition's size (assetq's
-- Python refuses those) can get a run of more than N rows rather than none. A capped claim
-- reads the N + 1 oldest rows and, for the witnesses, each member asset's oldest row, all by
-- index: its cost does not grow with the backlog.
--
-- p_worker (schedule_and_claim's worker, else NULL): the first run the pass makes is inserted
-- claimed by p_worker, running at its first attempt with the deadline and lease of
-- claim_runs_v2 (p_lease_seconds, the consumer's timeout or p_timeout_seconds), unless a run
-- of the consumers p_dag_ids is claimable already (then claim_runs_v2 takes the oldest, and
-- this run is inserted queued as any other). Inserted claimed instead of inserted queued and
-- then updated by the claim: one write of the run instead of two (an
-- update writes a new version of the row and an entry in each of dag_run's indexes). Its
-- lease_until, deadline and capped are returned (NULL for every other run). Executed by
-- schedule_pass_v2 and schedule_and_claim only: no role is granted it, so no pass but a
-- worker's claims a run.
--
-- p_wait_seconds > 0 with p_dag_ids (a worker's pass, schedule_and_claim): when every one of
-- its consumers with queued rows is held by another pass, they are waited for, up to
-- p_wait_seconds, instead of skipped (see the loop below): when the holder commits, its run
-- is there for the claim.
CREATE OR REPLACE FUNCTION {{ns}}.schedule_runs(
    p_limit           integer,
    p_dag_ids         jsonb,
    p_wait_seconds    double precision,
    p_worker          text,
    p_lease_seconds   double precision,
    p_timeout_seconds double precision
)
RETURNS TABLE (
    dag_run_id          bigint,
    dag_id              varchar,
    run_id              varchar,
    seq                 bigint,
    run_after           timestamptz,
    created_at          timestamptz,
    event_ids           bigint[],
    triggering_event_id bigint,
    state               varchar,
    partition_key       varchar,
    lease_until         timestamptz,
    deadline            timestamptz,
    capped              boolean
)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_dag       {{ns}}.dag;
    v_ids       bigint[];
    v_assets    bigint[];
    v_times     timestamptz[];
    v_claim     integer[];
    v_chosen    bigint[];
    v_wids      bigint[];
    v_wtimes    timestamptz[];
    v_pick_id   bigint;
    v_pick_time timestamptz;
    v_cap       integer;
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
    v_taken     {{ns}}.dag[];
    v_share     integer;
    v_room      integer;
    v_made      integer;
    v_next      integer;
    v_from_t    timestamptz;
    v_from_id   bigint;
    v_lock_timeout text;
    v_wait      boolean;
    v_worker    text := p_worker;
    v_clock     timestamptz;
BEGIN
    IF p_limit IS NULL OR p_limit < 1 THEN
        RAISE EXCEPTION 'limit must be a positive integer, got %', quote_nullable(p_limit)
            USING ERRCODE = 'AQ002';
    END IF;
    -- p_dag_ids was checked by the caller (schedule_pass_v2, schedule_and_claim's check_claim).
    -- NOT (... >= 0): NaN is refused too. At most a minute: a worker waits for a pass.
    IF p_wait_seconds IS NULL OR NOT (p_wait_seconds >= 0 AND p_wait_seconds <= 60) THEN
        RAISE EXCEPTION 'wait must be 0 to 60 seconds, got %', quote_nullable(p_wait_seconds)
            USING ERRCODE = 'AQ002';
    END IF;

    -- I10: a run whose last attempt's lease expired is failed by the next pass (and by the
    -- next claim), whatever its consumer's state: at most 100 per pass, oldest lease first,
    -- found through dag_run_lease_idx (running runs only); rows a worker is completing right
    -- now are skipped, not waited for.
    -- = ANY (ARRAY(...)), not IN (...): as a join, planning the statement probed the ends of
    -- dag_run's id index (the planner's estimate of a merge join), reads of the run history
    -- that varied with its visibility map. A pass over some consumers (p_dag_ids: a worker's,
    -- schedule_and_claim) leaves it to the claim that follows, which fails its consumers'
    -- such runs, and to the schedulers' passes.
    IF p_dag_ids IS NULL THEN
        UPDATE {{ns}}.dag_run r
           SET state = 'failed', ended_at = clock_timestamp(), updated_at = clock_timestamp(),
               not_before = NULL, lease_until = NULL,
               error = format('the lease of attempt %s (worker %s) expired at %s and no attempt is left (max_attempts %s)',
                              r.attempt, r.worker, r.lease_until, d.max_attempts)
          FROM {{ns}}.dag d
         WHERE d.dag_id = r.dag_id
           AND r.id = ANY (ARRAY(SELECT x.id
                                   FROM {{ns}}.dag_run x
                                   JOIN {{ns}}.dag xd ON xd.dag_id = x.dag_id
                                  WHERE x.state = 'running' AND x.not_before <= clock_timestamp()
                                    AND x.attempt >= xd.max_attempts
                                  ORDER BY x.not_before
                                  LIMIT 100
                                    FOR NO KEY UPDATE OF x SKIP LOCKED));
    END IF;

    v_wait := p_wait_seconds > 0 AND p_dag_ids IS NOT NULL;
    LOOP
        -- FOR NO KEY UPDATE, not FOR UPDATE: every in-flight producer holds a KEY SHARE lock on
        -- the consumer row through the queue's foreign key. FOR UPDATE conflicts with it, so the
        -- pass would skip every busy consumer (measured: p99 latency 40 ms -> 2.7 s).
        -- SKIP LOCKED: concurrent passes split the consumers between them instead of waiting (I5).
        -- All of them are taken first, so that their number gives each its share of the pass;
        -- their rows as locked, which the loop below reads from the array (no query of its own).
        v_taken := ARRAY(
            SELECT d
              FROM {{ns}}.dag d
             WHERE NOT d.is_paused
               AND (p_dag_ids IS NULL OR d.dag_id IN (SELECT jsonb_array_elements_text(p_dag_ids)))
               -- A probe of each consumer's queue by key. OFFSET 0 keeps the planner from
               -- turning it into a join, which read the whole queue (a hash of every queued
               -- row) on every pass: a pass must not cost the backlog (issue 16). A partitioned
               -- consumer has work only when a row arrived that no pass has examined
               -- yet: its keys waiting for other assets cost nothing.
               AND CASE WHEN d.partitioning IS NULL
                        THEN EXISTS (SELECT 1 FROM {{ns}}.asset_dag_run_queue q
                                      WHERE q.target_dag_id = d.dag_id OFFSET 0)
                        ELSE EXISTS (SELECT 1 FROM {{ns}}.asset_partition_queue p
                                      WHERE p.target_dag_id = d.dag_id AND NOT p.examined OFFSET 0)
                   END
             ORDER BY d.last_scheduled_at NULLS FIRST, d.dag_id
             LIMIT p_limit
               FOR NO KEY UPDATE OF d SKIP LOCKED);

        -- A worker's pass (p_wait_seconds) that took nothing above: its consumers with queued
        -- rows that another pass holds (skipped above) are waited for, up to p_wait_seconds
        -- for each lock, and then taken as above (this transaction holds them: not skipped).
        -- The other's commit takes their queued rows: what this pass waited for is the run it
        -- made, for the claim that follows. Only a pass that holds no consumer waits, so two
        -- waiting passes never wait for each other.
        -- (Apart: as one expression, the probe's subquery was set up on every pass.)
        EXIT WHEN NOT v_wait OR cardinality(v_taken) > 0;
        EXIT WHEN NOT EXISTS (
                   SELECT 1
                     FROM {{ns}}.dag d
                    WHERE d.dag_id IN (SELECT jsonb_array_elements_text(p_dag_ids))
                      AND NOT d.is_paused
                      AND CASE WHEN d.partitioning IS NULL
                               THEN EXISTS (SELECT 1 FROM {{ns}}.asset_dag_run_queue q
                                             WHERE q.target_dag_id = d.dag_id OFFSET 0)
                               ELSE EXISTS (SELECT 1 FROM {{ns}}.asset_partition_queue p
                                             WHERE p.target_dag_id = d.dag_id AND NOT p.examined OFFSET 0)
                          END);
        v_wait := false;
        v_lock_timeout := current_setting('lock_timeout');
        PERFORM set_config('lock_timeout', CAST(ceil(p_wait_seconds * 1000) AS bigint) || 'ms', true);
        BEGIN
            PERFORM 1
               FROM {{ns}}.dag d
              WHERE d.dag_id IN (SELECT jsonb_array_elements_text(p_dag_ids))
              ORDER BY d.dag_id
                FOR NO KEY UPDATE OF d;
        EXCEPTION WHEN lock_not_available THEN
            NULL;
        END;
        PERFORM set_config('lock_timeout', v_lock_timeout, true);
    END LOOP;
    v_share := greatest(p_limit / greatest(cardinality(v_taken), 1), 1);

    <<consumers>>
    FOREACH v_dag IN ARRAY v_taken
    LOOP
        v_now := clock_timestamp();
        v_room := v_share;

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
             WHERE r.id = ANY (ARRAY(SELECT x.id FROM {{ns}}.dag_run x
                                      WHERE x.dag_id = v_dag.dag_id AND x.state = 'running'
                                        AND x.not_before <= v_now AND x.attempt >= v_dag.max_attempts
                                        FOR NO KEY UPDATE SKIP LOCKED));
        END IF;
        IF v_dag.max_active_runs IS NOT NULL THEN
            v_room := least(v_room, v_dag.max_active_runs
                                    - (SELECT count(*) FROM {{ns}}.dag_run r
                                        WHERE r.dag_id = v_dag.dag_id
                                          AND r.state IN ('queued', 'running')));
            IF v_room < 1 THEN
                UPDATE {{ns}}.dag d SET last_scheduled_at = v_now WHERE d.dag_id = v_dag.dag_id;
                CONTINUE consumers;
            END IF;
        END IF;

        -- A partitioned consumer: a run per partition key whose events satisfy the condition.
        IF v_dag.partitioning IS NOT NULL THEN
            RETURN QUERY
            SELECT p.*, CAST(NULL AS timestamptz), CAST(NULL AS timestamptz), CAST(NULL AS boolean)
              FROM {{ns}}.schedule_partitions(v_dag.dag_id, v_dag.max_active_runs,
                                              v_dag.max_events_per_run, v_now) p;
            CONTINUE consumers;
        END IF;

        v_cap := v_dag.max_events_per_run;
        v_made := 0;
        v_from_t := '-infinity';
        v_from_id := 0;
        <<runs>>
        LOOP
            -- The claim. This statement's snapshot is taken after the lock above, so it sees
            -- every row committed so far, including those of a pass that held this consumer a
            -- moment ago (and deleted its rows). A row committed after this read is simply not
            -- in the claim and waits for the next pass: selection is by reference, never by time.
            -- Uncapped, the claim is the whole queue. Capped at N = max_events_per_run, only the
            -- N + 1 oldest rows are read, in queue order through asset_dag_run_queue_order_idx:
            -- a capped run costs what it consumes, never the backlog behind it (issue 16).
            -- A later run of the same pass reads on from the oldest row the run before it read
            -- and left (v_from_t, v_from_id; the first run from the start): the rows before it
            -- are the ones this pass deleted, whose index entries are still there until it
            -- commits, and reading past them again would make a pass of R runs read R² of them.
            -- A row committed meanwhile with an older timestamp is left to the next pass.
            IF v_cap IS NULL THEN
                SELECT array_agg(q.asset_event_id ORDER BY q.created_at, q.asset_event_id),
                       array_agg(q.asset_id ORDER BY q.created_at, q.asset_event_id),
                       array_agg(q.created_at ORDER BY q.created_at, q.asset_event_id),
                       array_agg(q.asset_event_id ORDER BY q.asset_event_id)
                  INTO v_ids, v_assets, v_times, v_events
                  FROM {{ns}}.asset_dag_run_queue q
                 WHERE q.target_dag_id = v_dag.dag_id;
            ELSE
                SELECT array_agg(o.asset_event_id ORDER BY o.created_at, o.asset_event_id),
                       array_agg(o.asset_id ORDER BY o.created_at, o.asset_event_id),
                       array_agg(o.created_at ORDER BY o.created_at, o.asset_event_id),
                       array_agg(o.asset_event_id ORDER BY o.asset_event_id)
                  INTO v_ids, v_assets, v_times, v_events
                  FROM (SELECT q.asset_event_id, q.asset_id, q.created_at
                          FROM {{ns}}.asset_dag_run_queue q
                         WHERE q.target_dag_id = v_dag.dag_id
                           AND (q.created_at, q.asset_event_id) >= (v_from_t, v_from_id)
                         ORDER BY q.created_at, q.asset_event_id
                         LIMIT v_cap + 1) o;
            END IF;
            v_n := coalesce(cardinality(v_ids), 0);

            -- Nothing queued: no run.
            IF v_n = 0 THEN
                UPDATE {{ns}}.dag d SET last_scheduled_at = v_now WHERE d.dag_id = v_dag.dag_id;
                CONTINUE consumers;
            END IF;

            v_claim := NULL;
            v_wids := '{}';
            v_wtimes := '{}';
            IF v_cap IS NULL OR v_n <= v_cap THEN
                -- The whole queue. I6: the condition has a clause, and every clause a member
                -- among the claimed rows' assets (bool_and of no clause is NULL: no run).
                -- Written out here rather than calling condition_holds: PL/pgSQL keeps this
                -- plan, a SQL function is planned again on every call, and this runs for every
                -- consumer. One query for both checks: each statement costs a worker's first
                -- hop tens of microseconds after an idle gap.
                IF NOT coalesce((SELECT bool_and(g.hit)
                                   FROM (SELECT coalesce(bool_or(m.asset_id = ANY (v_assets)), false) AS hit
                                           FROM (SELECT c.clause_no, c.asset_id
                                                   FROM {{ns}}.dag_condition_clause c
                                                  WHERE c.dag_id = v_dag.dag_id
                                                 UNION ALL
                                                 SELECT ca.clause_no, aa.asset_id
                                                   FROM {{ns}}.dag_condition_alias ca
                                                   LEFT JOIN {{ns}}.asset_alias_asset aa ON aa.alias_id = ca.alias_id
                                                  WHERE ca.dag_id = v_dag.dag_id) m
                                          GROUP BY m.clause_no) g), false)
                THEN
                    UPDATE {{ns}}.dag d SET last_scheduled_at = v_now WHERE d.dag_id = v_dag.dag_id;
                    CONTINUE consumers;
                END IF;
            ELSIF NOT EXISTS (SELECT 1 FROM {{ns}}.dag_condition_clause c WHERE c.dag_id = v_dag.dag_id
                              UNION ALL
                              SELECT 1 FROM {{ns}}.dag_condition_alias ca WHERE ca.dag_id = v_dag.dag_id)
            THEN
                -- No clause to satisfy: no run (the witnesses below would find none to need).
                UPDATE {{ns}}.dag d SET last_scheduled_at = v_now WHERE d.dag_id = v_dag.dag_id;
                CONTINUE consumers;
            ELSIF {{ns}}.condition_holds(v_dag.dag_id, v_assets[1:v_cap]) THEN
                v_claim := ARRAY(SELECT generate_series(1, v_cap));  -- the N oldest rows
            ELSE
                -- The N oldest rows do not satisfy the condition. Greedy witnesses over the whole
                -- queue, by index (asset_dag_run_queue_asset_idx): for each clause not yet hit,
                -- the member asset whose oldest queued row is the oldest, and that row. A clause
                -- with no queued member: the whole queue does not satisfy the condition, no run.
                v_chosen := '{}';
                v_pick := 0;
                FOR v_clause IN
                    SELECT DISTINCT m.clause_no FROM {{ns}}.dag_clause_members(v_dag.dag_id) m ORDER BY 1
                LOOP
                    CONTINUE WHEN EXISTS (SELECT 1 FROM {{ns}}.dag_clause_members(v_dag.dag_id) m
                                           WHERE m.clause_no = v_clause AND m.asset_id = ANY (v_chosen));
                    SELECT m.asset_id, o.asset_event_id, o.created_at INTO v_pick, v_pick_id, v_pick_time
                      FROM (SELECT DISTINCT x.asset_id
                              FROM {{ns}}.dag_clause_members(v_dag.dag_id) x
                             WHERE x.clause_no = v_clause AND x.asset_id IS NOT NULL) m
                      CROSS JOIN LATERAL (
                            SELECT q.asset_event_id, q.created_at
                              FROM {{ns}}.asset_dag_run_queue q
                             WHERE q.target_dag_id = v_dag.dag_id AND q.asset_id = m.asset_id
                               AND (q.created_at, q.asset_event_id) >= (v_from_t, v_from_id)
                             ORDER BY q.created_at, q.asset_event_id
                             LIMIT 1) o
                     ORDER BY o.created_at, o.asset_event_id
                     LIMIT 1;
                    EXIT WHEN v_pick IS NULL;
                    v_chosen := v_chosen || v_pick;
                    v_wids := v_wids || v_pick_id;
                    v_wtimes := v_wtimes || v_pick_time;
                END LOOP;
                IF v_pick IS NULL THEN
                    UPDATE {{ns}}.dag d SET last_scheduled_at = v_now WHERE d.dag_id = v_dag.dag_id;
                    CONTINUE consumers;
                END IF;
                -- Prune, newest choice first: what is left is a minimal set of assets.
                FOR i IN REVERSE cardinality(v_chosen)..1 LOOP
                    v_try := v_chosen[1:i - 1] || v_chosen[i + 1:];
                    IF {{ns}}.condition_holds(v_dag.dag_id, v_try) THEN
                        v_chosen := v_try;
                        v_wids := v_wids[1:i - 1] || v_wids[i + 1:];
                        v_wtimes := v_wtimes[1:i - 1] || v_wtimes[i + 1:];
                    END IF;
                END LOOP;
                -- The witness rows, then the oldest others, N in all (more only if the witnesses
                -- alone are more). The others come from the N oldest rows read above: at most N
                -- minus the witnesses are needed, and that many are among them.
                v_claim := ARRAY(SELECT u.pos
                                   FROM unnest(v_ids) WITH ORDINALITY AS u(id, pos)
                                  WHERE u.id <> ALL (v_wids)
                                  ORDER BY u.pos
                                  LIMIT greatest(v_cap - cardinality(v_wids), 0));
            END IF;

            -- The claimed rows. The newest (latest timestamp, then highest id) is the triggering
            -- event; the whole queue and the N oldest rows are in queue order, so it is the last.
            IF v_claim IS NULL THEN
                -- v_events: the rows read, by id (the read above sorted them so).
                v_run_after := v_times[v_n];
                v_trigger := v_ids[v_n];
            ELSIF cardinality(v_wids) = 0 THEN
                v_events := ARRAY(SELECT v_ids[p] FROM unnest(v_claim) AS p ORDER BY 1);
                v_run_after := v_times[v_claim[cardinality(v_claim)]];
                v_trigger := v_ids[v_claim[cardinality(v_claim)]];
            ELSE
                SELECT array_agg(c.id ORDER BY c.id),
                       (array_agg(c.t ORDER BY c.t DESC, c.id DESC))[1],
                       (array_agg(c.id ORDER BY c.t DESC, c.id DESC))[1]
                  INTO v_events, v_run_after, v_trigger
                  FROM (SELECT v_ids[p] AS id, v_times[p] AS t FROM unnest(v_claim) AS p
                        UNION
                        SELECT w.id, w.t FROM unnest(v_wids, v_wtimes) AS w(id, t)) c;
            END IF;


            UPDATE {{ns}}.dag d
               SET last_run_seq = d.last_run_seq + 1, last_scheduled_at = v_now
             WHERE d.dag_id = v_dag.dag_id
            RETURNING d.last_run_seq INTO v_seq;

            -- The worker's claim takes older runs first: when a run of its consumers is
            -- claimable now (queued before, a retry that is due, an expired lease, or the run
            -- of the pass this one waited for), this one is inserted queued and claim_runs_v2
            -- claims the oldest. A statement of its own, after the locks and the wait: it
            -- sees what committed meanwhile. (The time in a variable: as a bound of the claim
            -- index, clock_timestamp() itself would make it read all of it. A scalar subquery
            -- with the claim's order: EXISTS dropped the ORDER BY and LIMIT, and its plan read
            -- the whole table once dag_run had a few thousand rows.)
            IF v_worker IS NOT NULL THEN
                v_clock := clock_timestamp();
                IF (SELECT x.id
                      FROM {{ns}}.dag_run x
                     WHERE x.not_before <= v_clock
                       AND (p_dag_ids IS NULL
                            OR x.dag_id IN (SELECT jsonb_array_elements_text(p_dag_ids)))
                     ORDER BY x.not_before, x.id
                     LIMIT 1) IS NOT NULL
                THEN
                    v_worker := NULL;
                END IF;
            END IF;
            IF v_worker IS NULL THEN
                -- Queued, claimable by workers (claim_runs) from now on (not_before).
                lease_until := NULL;
                deadline := NULL;
                capped := NULL;
            ELSE
                -- The first run, claimed by p_worker as it is made: its first attempt, with
                -- the deadline and lease claim_runs_v2 gives (see there), written once.
                deadline := v_now + make_interval(secs => coalesce(v_dag.timeout_seconds,
                                                                   p_timeout_seconds));
                lease_until := least(v_now + make_interval(secs => p_lease_seconds), deadline);
                capped := v_dag.max_active_runs IS NOT NULL;
            END IF;
            INSERT INTO {{ns}}.dag_run AS r (dag_id, run_id, seq, run_after, created_at,
                                             triggering_event_id, event_count, state, attempt,
                                             worker, deadline, lease_until, not_before,
                                             started_at, updated_at)
            VALUES (v_dag.dag_id,
                    'asset_triggered__'
                        || to_char(v_run_after AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US')
                        || '+00:00__' || v_seq,
                    v_seq, v_run_after, v_now, v_trigger, cardinality(v_events),
                    CASE WHEN v_worker IS NULL THEN 'queued' ELSE 'running' END,
                    CASE WHEN v_worker IS NULL THEN 0 ELSE 1 END,
                    v_worker, deadline, lease_until, coalesce(lease_until, v_now),
                    CASE WHEN v_worker IS NOT NULL THEN v_now END,
                    CASE WHEN v_worker IS NOT NULL THEN v_now END)
            RETURNING r.id, r.dag_id, r.run_id, r.seq, r.run_after, r.created_at, r.state
                 INTO v_run_pk, dag_id, run_id, seq, run_after, created_at, state;
            v_worker := NULL;  -- one run claimed at most

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
            partition_key := NULL;
            RETURN NEXT;

            -- Another run for this consumer while the claim left rows behind (it read N + 1)
            -- and the consumer has room in this pass (runs per pass).
            v_made := v_made + 1;
            EXIT runs WHEN v_cap IS NULL OR v_n <= v_cap OR v_made >= v_room;
            -- Where the next claim reads from: the oldest row read and not claimed (the N + 1st
            -- when the N oldest were the claim).
            IF cardinality(v_wids) = 0 THEN
                v_next := v_cap + 1;
            ELSE
                v_next := (SELECT u.pos FROM unnest(v_ids) WITH ORDINALITY AS u(id, pos)
                            WHERE u.id <> ALL (v_events) ORDER BY u.pos LIMIT 1);
                EXIT runs WHEN v_next IS NULL;
            END IF;
            v_from_t := v_times[v_next];
            v_from_id := v_ids[v_next];
        END LOOP runs;
    END LOOP consumers;
END
$$;
