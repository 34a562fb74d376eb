-- One scheduler pass over every consumer, skipping those another pass holds: schedule_pass_v2
-- with no consumer filter and no wait. The scheduler's routine (assetq.schedule).
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
    state               varchar,
    partition_key       varchar
)
LANGUAGE sql AS $$
    SELECT p.dag_run_id, p.dag_id, p.run_id, p.seq, p.run_after, p.created_at, p.event_ids,
           p.triggering_event_id, p.state, p.partition_key
      FROM {{ns}}.schedule_pass_v2(p_limit, NULL, 0) p
$$;

ALTER FUNCTION {{ns}}.schedule_pass(integer)
    SECURITY DEFINER SET search_path = pg_catalog, pg_temp;
