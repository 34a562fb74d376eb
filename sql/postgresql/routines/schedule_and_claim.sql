-- A worker woken by a producer's notification ('queued'): a scheduler pass over its own
-- consumers p_dag_ids, then its claim, in one statement (one round trip, one transaction):
-- the run the pass makes is claimed before anyone else sees it, instead of a scheduler's
-- pass, its commit and notification, and then the worker's claim (two hops). The pass waits
-- up to p_wait_seconds for a consumer another pass (a scheduler woken by the same
-- notification) holds, and then claims the run that pass committed (schedule_runs). The
-- pass's first run is inserted claimed, unless older runs of these consumers are claimable
-- (they are claimed first, by claim_runs_v2, which also takes what the limit leaves).
-- Arguments and result as claim_runs_v2, and made: whether this call's pass made the run.
-- Run it at READ COMMITTED in a transaction of its own; AQ900 (claim guard) means it was rolled back and is safe to retry.
--
-- Its transaction commits without waiting for the disk (synchronous_commit off, set for it
-- alone): the worker runs the handler a flush sooner. What a crash can take is this
-- transaction whole, the claim with the run its pass made: the events are queued again and
-- the next pass makes their run again. Nothing that depends on the claim outlives it: the
-- write-ahead log is flushed in order, so the durable commit of the attempt's completion, of
-- a heartbeat or of any transaction that saw the claim flushes it first; a handler whose
-- claim was lost cannot complete (AQ010, lease lost) and its writes roll back.
CREATE OR REPLACE FUNCTION {{ns}}.schedule_and_claim(
    p_worker          text,
    p_limit           integer DEFAULT 1,
    p_lease_seconds   double precision DEFAULT 60,
    p_dag_ids         jsonb DEFAULT NULL,
    p_timeout_seconds double precision DEFAULT NULL,
    p_wait_seconds    double precision DEFAULT 0.25
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
    capped              boolean,
    made                boolean
)
LANGUAGE plpgsql AS $$
DECLARE
    v_made    bigint[];
    v_run     record;
    v_started timestamptz;
    v_claimed integer := 0;
    v_queued  boolean := false;
BEGIN
    PERFORM {{ns}}.check_claim(p_worker, p_limit, p_lease_seconds, p_dag_ids, p_timeout_seconds);
    -- The pass's runs notify no worker (dag_run_notify): this claim takes them. Those it
    -- leaves (more runs than p_limit, or older runs claimed first) are notified below.
    -- The commit does not wait for the disk (for this transaction alone; see above).
    -- (One statement for both: each costs the hop tens of microseconds after an idle gap.)
    PERFORM set_config('synchronous_commit', 'off', true),
            set_config('assetq.claiming_runs', {{database}}, true);
    -- The pass's first run is claimed as it is made (schedule_runs' p_worker): one write of
    -- the run instead of its insert and then the claim's update; schedule_runs leaves it to
    -- claim_runs_v2 below when older runs of these consumers are claimable (oldest first).
    v_made := '{}';
    FOR v_run IN
        SELECT * FROM {{ns}}.schedule_runs(100, p_dag_ids, p_wait_seconds, p_worker,
                                           p_lease_seconds, p_timeout_seconds)
    LOOP
        v_made := v_made || v_run.dag_run_id;
        IF v_run.state <> 'running' THEN
            v_queued := true;
            CONTINUE;
        END IF;
        -- The run claimed as the pass made it, as claim_runs_v2 returns a claim. Its claim
        -- time is when it was made; the pass went on after it (its links, other consumers).
        -- Past a few milliseconds its clock starts again now, as claim_runs_v2's would after
        -- the pass: the attempt's deadline and lease are never shortened by the pass.
        v_started := clock_timestamp();
        IF v_started - v_run.created_at > interval '5 milliseconds' THEN
            v_run.deadline := v_started + (v_run.deadline - v_run.created_at);
            v_run.lease_until := least(v_started + make_interval(secs => p_lease_seconds),
                                       v_run.deadline);
            UPDATE {{ns}}.dag_run r
               SET started_at = v_started, updated_at = v_started, deadline = v_run.deadline,
                   lease_until = v_run.lease_until, not_before = v_run.lease_until
             WHERE r.id = v_run.dag_run_id;
        ELSE
            v_started := v_run.created_at;
        END IF;
        dag_run_id := v_run.dag_run_id;
        dag_id := v_run.dag_id;
        run_id := v_run.run_id;
        seq := v_run.seq;
        run_after := v_run.run_after;
        created_at := v_run.created_at;
        event_ids := v_run.event_ids;
        triggering_event_id := v_run.triggering_event_id;
        state := v_run.state;
        attempt := 1;
        worker := p_worker;
        lease_until := v_run.lease_until;
        started_at := v_started;
        partition_key := v_run.partition_key;
        deadline := v_run.deadline;
        capped := v_run.capped;
        made := true;
        RETURN NEXT;
        v_claimed := v_claimed + 1;
    END LOOP;
    PERFORM set_config('assetq.claiming_runs', '', true);
    IF v_claimed < p_limit THEN
        RETURN QUERY
        SELECT c.*, c.dag_run_id = ANY (v_made)
          FROM {{ns}}.claim_runs_v2(p_worker, p_limit - v_claimed, p_lease_seconds, p_dag_ids,
                                    p_timeout_seconds) c;
        -- It may also have ended a run the pass made and claimed whose deadline passed
        -- meanwhile (a timeout shorter than the pass): queued again for its retry.
        v_queued := v_queued OR cardinality(v_made) > 0;
    END IF;
    -- A run the pass made can be left queued only then: looked for (one more statement of
    -- the hop) only when it can be.
    IF v_queued
       AND EXISTS (SELECT 1 FROM {{ns}}.dag_run r WHERE r.id = ANY (v_made) AND r.state = 'queued')
    THEN
        PERFORM pg_notify({{database}}, 'runs');
    END IF;
END
$$;

ALTER FUNCTION {{ns}}.schedule_and_claim(text, integer, double precision, jsonb, double precision,
                                         double precision)
    SECURITY DEFINER SET search_path = pg_catalog, pg_temp;
