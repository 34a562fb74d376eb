-- One scheduler pass (I3-I6) over at most p_limit consumers (of p_dag_ids, a JSON array, or
-- all when NULL): schedule_runs (see there for what a pass does and guarantees) with no
-- claim. Returns the runs created. Run it at READ COMMITTED in a transaction of its own;
-- AQ900 (claim guard) means the pass was rolled back and is safe to retry.
CREATE OR REPLACE FUNCTION {{ns}}.schedule_pass_v2(
    p_limit        integer DEFAULT 100,
    p_dag_ids      jsonb DEFAULT NULL,
    p_wait_seconds double precision DEFAULT 0
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
    partition_key       varchar
)
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM {{ns}}.check_dag_ids(p_dag_ids);
    RETURN QUERY
    SELECT p.dag_run_id, p.dag_id, p.run_id, p.seq, p.run_after, p.created_at, p.event_ids,
           p.triggering_event_id, p.state, p.partition_key
      FROM {{ns}}.schedule_runs(p_limit, p_dag_ids, p_wait_seconds, NULL, NULL, NULL) p;
END
$$;

ALTER FUNCTION {{ns}}.schedule_pass_v2(integer, jsonb, double precision)
    SECURITY DEFINER SET search_path = pg_catalog, pg_temp;
