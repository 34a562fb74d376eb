-- heartbeat_run_v2 with no claim time (the attempt alone fences): the routine of assetq
-- 0.1.0's workers, kept for them while they are in the compatibility window
-- (docs/operations.md).
CREATE OR REPLACE FUNCTION {{ns}}.heartbeat_run(
    p_dag_id        text,
    p_run_id        text,
    p_attempt       integer,
    p_lease_seconds double precision
) RETURNS TABLE (lease_until timestamptz)
LANGUAGE sql AS $$
    SELECT h.lease_until
      FROM {{ns}}.heartbeat_run_v2(p_dag_id, p_run_id, p_attempt, p_lease_seconds, NULL) h
$$;

ALTER FUNCTION {{ns}}.heartbeat_run(text, text, integer, double precision)
    SECURITY DEFINER SET search_path = pg_catalog, pg_temp;
