-- Workers: a run is work that exactly one worker holds at a time.
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
--
-- Timeouts: an attempt claimed here gets a deadline, the claim's time plus the consumer's
-- timeout_seconds, or p_timeout_seconds (the worker's default) for a consumer that declares
-- none; NULL for neither. Its lease never runs past it (nor does any heartbeat's), so the run
-- comes back to the claim index at its deadline: a running candidate past its deadline is
-- ended here as a failure, "timed out after 30s", retried or failed by fail_attempt (the
-- consumer's max_attempts and retry delay), and is not claimed now. So the timeout holds
-- with its worker dead or stopped too; a live worker ends the attempt itself at the deadline
-- (complete_run as failed). Returns each run's deadline, and whether its consumer caps its
-- active runs (max_active_runs): then the run's end lets the consumer's next run be created.
CREATE OR REPLACE FUNCTION {{ns}}.claim_runs_v2(
    p_worker          text,
    p_limit           integer DEFAULT 1,
    p_lease_seconds   double precision DEFAULT 60,
    p_dag_ids         jsonb DEFAULT NULL,
    p_timeout_seconds double precision DEFAULT NULL
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
    started_at          timestamptz,
    partition_key       varchar,
    deadline            timestamptz,
    capped              boolean
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
    v_running bigint[];
    v_gone    bigint[];
    v_late    record;
    v_ended   text[];
BEGIN
    PERFORM {{ns}}.check_claim(p_worker, p_limit, p_lease_seconds, p_dag_ids, p_timeout_seconds);
    v_now := clock_timestamp();
    v_until := v_now + make_interval(secs => p_lease_seconds);
    LOOP
        SELECT array_agg(x.id), array_agg(x.id) FILTER (WHERE x.state = 'running')
          INTO v_ids, v_running
          FROM (SELECT r.id, r.state
                  FROM {{ns}}.dag_run r
                 WHERE r.not_before <= v_now
                   AND (p_dag_ids IS NULL
                        OR r.dag_id IN (SELECT jsonb_array_elements_text(p_dag_ids)))
                 ORDER BY r.not_before, r.id
                 LIMIT p_limit - v_taken
                   FOR NO KEY UPDATE OF r SKIP LOCKED) x;
        EXIT WHEN v_ids IS NULL;

        -- Only a running candidate (its lease expired, or its deadline came) may have timed
        -- out or be on its last attempt: the usual claim, of queued runs only, skips this.
        -- The candidates are locked, so their states are the ones just read; the ones ended
        -- here leave the claim's ids.
        v_failed := 0;
        IF v_running IS NOT NULL THEN
            v_gone := '{}';
            FOR v_late IN
                SELECT r.id, r.deadline, r.started_at FROM {{ns}}.dag_run r
                 WHERE r.id = ANY (v_running) AND r.deadline <= v_now
            LOOP
                PERFORM {{ns}}.fail_attempt(
                    v_late.id,
                    format('timed out after %ss',
                           CAST(extract(epoch FROM v_late.deadline - v_late.started_at) AS double precision)),
                    v_now);
                v_gone := v_gone || v_late.id;
            END LOOP;
            WITH f AS (
                UPDATE {{ns}}.dag_run r
                   SET state = 'failed', ended_at = v_now, updated_at = v_now, not_before = NULL,
                       lease_until = NULL, deadline = NULL,
                       error = format('the lease of attempt %s (worker %s) expired at %s and no attempt is left (max_attempts %s)',
                                      r.attempt, r.worker, r.lease_until, d.max_attempts)
                  FROM {{ns}}.dag d
                 WHERE r.id = ANY (v_running) AND r.id <> ALL (v_gone) AND d.dag_id = r.dag_id
                   AND r.attempt >= d.max_attempts
                RETURNING r.id, r.dag_id)
            SELECT v_gone || coalesce(array_agg(f.id), '{}'), array_agg(DISTINCT f.dag_id)
              INTO v_gone, v_ended
              FROM f;
            -- A failed run frees its capped consumer's place (fail_attempt does it for the
            -- timed-out ones).
            PERFORM {{ns}}.run_ended(x) FROM unnest(v_ended) AS x;
            IF cardinality(v_gone) > 0 THEN
                v_failed := cardinality(v_gone);
                v_ids := ARRAY(SELECT i FROM unnest(v_ids) AS i WHERE i <> ALL (v_gone));
            END IF;
        END IF;

        -- By id alone: a condition on state here let the planner read the runs through
        -- dag_run_dag_state_idx instead, every queued and running run for each claim
        -- (PostgreSQL 18, whose skip scan makes that index look cheap).
        RETURN QUERY
        WITH c AS (
            -- The deadline: no timeout makes it NULL, and least() ignores a NULL: the lease.
            UPDATE {{ns}}.dag_run r
               SET state = 'running', attempt = r.attempt + 1, worker = p_worker,
                   deadline = t.deadline, lease_until = least(v_until, t.deadline),
                   not_before = least(v_until, t.deadline), started_at = v_now, updated_at = v_now
              FROM {{ns}}.dag d
             CROSS JOIN LATERAL (
                   SELECT v_now + make_interval(secs => coalesce(d.timeout_seconds, p_timeout_seconds))
                          AS deadline) t
             WHERE r.id = ANY (v_ids) AND d.dag_id = r.dag_id
            RETURNING r.id, r.dag_id, r.run_id, r.seq, r.run_after, r.created_at,
                      r.triggering_event_id, r.state, r.attempt, r.worker, r.lease_until,
                      r.started_at, r.partition_key, r.deadline,
                      d.max_active_runs IS NOT NULL AS capped)
        SELECT c.id, c.dag_id, c.run_id, c.seq, c.run_after, c.created_at,
               ARRAY(SELECT l.asset_event_id FROM {{ns}}.dagrun_asset_event l
                      WHERE l.dag_run_id = c.id ORDER BY 1),
               c.triggering_event_id, c.state, c.attempt, c.worker, c.lease_until, c.started_at,
               c.partition_key, c.deadline, c.capped
          FROM c
         ORDER BY c.id;
        GET DIAGNOSTICS v_claimed = ROW_COUNT;
        v_taken := v_taken + v_claimed;
        EXIT WHEN v_failed = 0 OR v_taken >= p_limit;
    END LOOP;
END
$$;

ALTER FUNCTION {{ns}}.claim_runs_v2(text, integer, double precision, jsonb, double precision)
    SECURITY DEFINER SET search_path = pg_catalog, pg_temp;

-- Generic plans: planned once per session, not per claim.
ALTER FUNCTION {{ns}}.claim_runs_v2(text, integer, double precision, jsonb, double precision)
    SET plan_cache_mode = force_generic_plan;
