-- A worker woken by a producer's notification ('queued'): a scheduler pass over its own
-- consumers p_dag_ids, then its claim, in one statement (one round trip, one transaction):
-- the run the pass makes is claimed before anyone else sees it, instead of a scheduler's
-- pass, its commit and notification, and then the worker's claim (two hops). The pass waits
-- up to p_wait_seconds for a consumer another pass (a scheduler woken by the same
-- notification) holds, and then claims the run that pass committed (schedule_pass_v2).
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
    v_made bigint[];
BEGIN
    -- The pass's runs notify no worker (dag_run_notify): this claim takes them. Those it
    -- leaves (more runs than p_limit, or older runs claimed first) are notified below.
    -- The commit does not wait for the disk (for this transaction alone; see above).
    PERFORM set_config('synchronous_commit', 'off', true);
    PERFORM set_config('assetq.claiming_runs', {{database}}, true);
    v_made := ARRAY(SELECT p.dag_run_id FROM {{ns}}.schedule_pass_v2(100, p_dag_ids, p_wait_seconds) p);
    PERFORM set_config('assetq.claiming_runs', '', true);
    RETURN QUERY
    SELECT c.*, c.dag_run_id = ANY (v_made)
      FROM {{ns}}.claim_runs_v2(p_worker, p_limit, p_lease_seconds, p_dag_ids,
                                p_timeout_seconds) c;
    IF cardinality(v_made) > 0
       AND EXISTS (SELECT 1 FROM {{ns}}.dag_run r WHERE r.id = ANY (v_made) AND r.state = 'queued')
    THEN
        PERFORM pg_notify({{database}}, 'runs');
    END IF;
END
$$;

ALTER FUNCTION {{ns}}.schedule_and_claim(text, integer, double precision, jsonb, double precision,
                                         double precision)
    SECURITY DEFINER SET search_path = pg_catalog, pg_temp;
