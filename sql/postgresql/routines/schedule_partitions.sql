-- The part of a scheduler pass for one partitioned consumer,
-- called by schedule_pass with the consumer's row locked: its condition is evaluated per
-- partition key, and a run is created for each key whose queued events satisfy it.
--
-- The keys evaluated are those of the rows not yet examined (the arrivals since the key was
-- last found unsatisfied): at most 1,000 of them per pass, oldest arrival first, through
-- asset_partition_queue_new_idx; each key's rows are read through asset_partition_queue_key_idx.
-- So a pass costs what arrived and what it creates, never every pending key (100,000 keys
-- waiting for an upstream asset cost nothing until an event for one of them arrives); the
-- limit bounds how long one pass holds the consumer (a first pass over fresh arrivals costs
-- about a millisecond per key on MariaDB), and the next passes take the rest.
--
-- A key's claim is all its queued rows; with max_events_per_run = N and more rows queued, its
-- N oldest when they satisfy the condition, otherwise witnesses and the oldest others, N in
-- all (as for an unpartitioned consumer: a cap never starves a key). An asset of the
-- condition counts as present for the key when the rows hold as many distinct upstream keys
-- (source_key) of it as partition_required says (one, or all sub-partitions of a roll-up);
-- the condition holds when every clause has a present member (condition_holds).
--   * holds, and the consumer is below max_active_runs: a run for the key consumes exactly the
--     claim (I3, I4 as for any run), with partition_key = the key and the key's next
--     generation (1 + the highest of its runs still stored: purge_runs may restart it). A key
--     left with rows has one of them marked not examined again, so the next pass looks at it;
--   * holds, at the cap: the pass stops here, every key from this one on left as it was;
--   * does not hold: the rows of the key read here are marked examined: a row committed
--     meanwhile stays not examined, and the next pass evaluates its key with it (late
--     commits, by reference as everywhere else).
CREATE OR REPLACE FUNCTION {{ns}}.schedule_partitions(
    p_dag_id     text,
    p_max_active integer,
    p_max_events integer,
    p_now        timestamptz
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
    partition_key       varchar
)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_key       text;
    v_active    bigint := 0;
    v_ids       bigint[];
    v_assets    bigint[];
    v_sources   text[];
    v_times     timestamptz[];
    v_n         integer;
    v_take      integer;
    v_events    bigint[];
    v_seq       bigint;
    v_gen       integer;
    v_run_pk    bigint;
    v_deleted   bigint;
    v_orphans   bigint[];
    v_claim     integer[];
    v_have      bigint[];
    v_try       bigint[];
    v_taken     integer[];
    v_asset     bigint;
    v_last      integer;
BEGIN
    IF p_max_active IS NOT NULL THEN
        SELECT count(*) INTO v_active FROM {{ns}}.dag_run r
         WHERE r.dag_id = p_dag_id AND r.state IN ('queued', 'running');
    END IF;

    FOR v_key IN
        SELECT a.partition_key
          FROM (SELECT p.partition_key, p.asset_event_id
                  FROM {{ns}}.asset_partition_queue p
                 WHERE p.target_dag_id = p_dag_id AND NOT p.examined
                 ORDER BY p.asset_event_id
                 LIMIT 1000) a
         GROUP BY a.partition_key
         ORDER BY min(a.asset_event_id)
    LOOP
        -- The key's rows in queue order, each with its queue row. One whose queue row is gone
        -- (delete_asset, a re-declaration, committed meanwhile) is dropped and the key read
        -- again. All of them, with a cap too: when the N oldest do not satisfy the condition,
        -- the others may (the witness search below).
        LOOP
            SELECT array_agg(o.asset_event_id ORDER BY o.created_at, o.asset_event_id),
                   array_agg(o.asset_id ORDER BY o.created_at, o.asset_event_id),
                   array_agg(o.source_key ORDER BY o.created_at, o.asset_event_id),
                   array_agg(o.created_at ORDER BY o.created_at, o.asset_event_id),
                   array_agg(o.asset_event_id) FILTER (WHERE NOT o.queued)
              INTO v_ids, v_assets, v_sources, v_times, v_orphans
              FROM (SELECT p.asset_event_id, p.asset_id, p.source_key, p.created_at,
                           EXISTS (SELECT 1 FROM {{ns}}.asset_dag_run_queue q
                                    WHERE q.target_dag_id = p.target_dag_id
                                      AND q.asset_event_id = p.asset_event_id) AS queued
                      FROM {{ns}}.asset_partition_queue p
                     WHERE p.target_dag_id = p_dag_id AND p.partition_key = v_key
                     ORDER BY p.created_at, p.asset_event_id) o;
            EXIT WHEN v_orphans IS NULL;
            DELETE FROM {{ns}}.asset_partition_queue p
             WHERE p.target_dag_id = p_dag_id AND p.asset_event_id = ANY (v_orphans);
        END LOOP;
        v_n := coalesce(cardinality(v_ids), 0);
        CONTINUE WHEN v_n = 0;
        -- The claim, as positions in v_ids: all rows, or with max_events_per_run = N and more
        -- rows queued, the N oldest when they satisfy the condition; otherwise, when the
        -- key's whole queue does, witnesses plus the oldest other rows, N in all (as for an
        -- unpartitioned consumer, docs/semantics.md §5: a cap never starves a key).
        v_claim := NULL;
        IF p_max_events IS NOT NULL AND v_n > p_max_events THEN
            IF {{ns}}.condition_holds(p_dag_id,
                                      {{ns}}.partition_present(p_dag_id, v_key,
                                                               v_assets[1:p_max_events],
                                                               v_sources[1:p_max_events])) THEN
                v_claim := ARRAY(SELECT generate_series(1, p_max_events));
            END IF;
        END IF;
        IF v_claim IS NULL
           AND NOT {{ns}}.condition_holds(p_dag_id,
                                          {{ns}}.partition_present(p_dag_id, v_key, v_assets, v_sources))
        THEN
            -- Not met: the key's rows read here are examined; a row committed meanwhile is
            -- not, and the next pass evaluates its key with it.
            UPDATE {{ns}}.asset_partition_queue p
               SET examined = true
             WHERE p.target_dag_id = p_dag_id AND NOT p.examined AND p.asset_event_id = ANY (v_ids);
            CONTINUE;
        END IF;
        IF v_claim IS NULL AND (p_max_events IS NULL OR v_n <= p_max_events) THEN
            v_claim := ARRAY(SELECT generate_series(1, v_n));
        ELSIF v_claim IS NULL THEN
            -- Witnesses: rows in queue order, each taken when its asset is in a clause no
            -- complete asset hits yet and it brings an upstream key the asset still needs;
            -- an asset with as many as partition_required is complete. Then the complete
            -- assets, the last completed first, are dropped while the others still satisfy
            -- the condition, with their rows: a minimal set. declare_dag refused a cap below
            -- what they can need, so they fit in N.
            v_have := '{}';
            v_taken := '{}';
            FOR i IN 1..v_n LOOP
                v_asset := v_assets[i];
                CONTINUE WHEN v_asset = ANY (v_have);
                CONTINUE WHEN NOT EXISTS (
                    SELECT 1 FROM {{ns}}.dag_clause_members(p_dag_id) m
                     WHERE m.asset_id = v_asset
                       AND NOT EXISTS (SELECT 1 FROM {{ns}}.dag_clause_members(p_dag_id) h
                                        WHERE h.clause_no = m.clause_no AND h.asset_id = ANY (v_have)));
                CONTINUE WHEN EXISTS (SELECT 1 FROM unnest(v_taken) AS t(pos)
                                       WHERE v_assets[t.pos] = v_asset AND v_sources[t.pos] = v_sources[i]);
                v_taken := v_taken || i;
                IF (SELECT count(DISTINCT v_sources[t.pos]) FROM unnest(v_taken) AS t(pos)
                     WHERE v_assets[t.pos] = v_asset)
                   >= (SELECT {{ns}}.partition_required(p_dag_id, v_asset, r.partition_mapping,
                                                        r.partition_require, v_key)
                         FROM (SELECT 1) one
                         LEFT JOIN {{ns}}.dag_schedule_asset_reference r
                                ON r.dag_id = p_dag_id AND r.asset_id = v_asset)
                THEN
                    v_have := v_have || v_asset;
                    EXIT WHEN {{ns}}.condition_holds(p_dag_id, v_have);
                END IF;
            END LOOP;
            FOR i IN REVERSE cardinality(v_have)..1 LOOP
                v_try := v_have[1:i - 1] || v_have[i + 1:];
                IF {{ns}}.condition_holds(p_dag_id, v_try) THEN
                    v_have := v_try;
                END IF;
            END LOOP;
            v_taken := ARRAY(SELECT t.pos FROM unnest(v_taken) AS t(pos)
                              WHERE v_assets[t.pos] = ANY (v_have));
            v_claim := ARRAY(SELECT c.pos
                               FROM (SELECT t.pos FROM unnest(v_taken) AS t(pos)
                                     UNION
                                     (SELECT g.pos FROM generate_series(1, v_n) AS g(pos)
                                       WHERE g.pos <> ALL (v_taken)
                                       ORDER BY g.pos
                                       LIMIT greatest(p_max_events - cardinality(v_taken), 0))) c
                              ORDER BY c.pos);
        END IF;
        v_take := cardinality(v_claim);
        v_last := v_claim[v_take];  -- queue order: the newest claimed row, the trigger
        EXIT WHEN p_max_active IS NOT NULL AND v_active >= p_max_active;

        v_events := ARRAY(SELECT v_ids[c.pos] FROM unnest(v_claim) AS c(pos) ORDER BY 1);
        UPDATE {{ns}}.dag d
           SET last_run_seq = d.last_run_seq + 1, last_scheduled_at = p_now
         WHERE d.dag_id = p_dag_id
        RETURNING d.last_run_seq INTO v_seq;
        SELECT coalesce(max(r.partition_generation), 0) + 1 INTO v_gen
          FROM {{ns}}.dag_run r
         WHERE r.dag_id = p_dag_id AND r.partition_key = v_key;

        INSERT INTO {{ns}}.dag_run AS r (dag_id, run_id, seq, run_after, created_at,
                                         triggering_event_id, event_count, not_before,
                                         partition_key, partition_generation)
        VALUES (p_dag_id,
                'asset_triggered__'
                    || to_char(v_times[v_last] AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US')
                    || '+00:00__' || v_seq,
                v_seq, v_times[v_last], p_now, v_ids[v_last], v_take, p_now, v_key, v_gen)
        RETURNING r.id, r.dag_id, r.run_id, r.seq, r.run_after, r.created_at, r.state, r.partition_key
             INTO v_run_pk, dag_id, run_id, seq, run_after, created_at, state, partition_key;

        -- Exactly the claimed rows, by primary key, with the claim guard (I3, I4), and their
        -- asset_partition_queue rows.
        DELETE FROM {{ns}}.asset_dag_run_queue q
         WHERE q.target_dag_id = p_dag_id AND q.asset_event_id = ANY (v_events);
        GET DIAGNOSTICS v_deleted = ROW_COUNT;
        DELETE FROM {{ns}}.asset_partition_queue p
         WHERE p.target_dag_id = p_dag_id AND p.asset_event_id = ANY (v_events);
        IF v_deleted <> v_take THEN
            RAISE EXCEPTION 'claim guard: dag % claimed % queue rows of partition % but deleted %',
                    p_dag_id, v_take, quote_literal(v_key), v_deleted
                USING ERRCODE = 'AQ900',
                      HINT = 'The pass was rolled back; it is safe to run it again.';
        END IF;
        INSERT INTO {{ns}}.dagrun_asset_event (dag_run_id, asset_event_id, dag_id)
        SELECT v_run_pk, e, p_dag_id FROM unnest(v_events) AS e;

        -- With N, a key left with rows is looked at again by the next pass: its oldest row
        -- left is marked not examined.
        IF v_n > v_take THEN
            UPDATE {{ns}}.asset_partition_queue p
               SET examined = false
             WHERE p.target_dag_id = p_dag_id
               AND p.asset_event_id = (SELECT v_ids[g.pos] FROM generate_series(1, v_n) AS g(pos)
                                        WHERE g.pos <> ALL (v_claim) ORDER BY g.pos LIMIT 1);
        END IF;
        v_active := v_active + 1;

        dag_run_id := v_run_pk;
        event_ids := v_events;
        triggering_event_id := v_ids[v_last];
        RETURN NEXT;
    END LOOP;
    UPDATE {{ns}}.dag d SET last_scheduled_at = p_now WHERE d.dag_id = p_dag_id;
END
$$;
