-- Claims as claim_runs_v2 does with no default timeout (p_timeout_seconds NULL), and returns
-- its columns but the deadline: the routine of assetq 0.1.0's workers, kept for them while
-- they are in the compatibility window (docs/operations.md). A consumer's own timeout holds
-- for their claims too.
CREATE OR REPLACE FUNCTION {{ns}}.claim_runs(
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
    started_at          timestamptz,
    partition_key       varchar
)
LANGUAGE sql AS $$
    SELECT c.dag_run_id, c.dag_id, c.run_id, c.seq, c.run_after, c.created_at, c.event_ids,
           c.triggering_event_id, c.state, c.attempt, c.worker, c.lease_until, c.started_at,
           c.partition_key
      FROM {{ns}}.claim_runs_v2(p_worker, p_limit, p_lease_seconds, p_dag_ids, NULL) c
$$;

ALTER FUNCTION {{ns}}.claim_runs(text, integer, double precision, jsonb)
    SECURITY DEFINER SET search_path = pg_catalog, pg_temp;
