-- Liveness. Records that loop p_process_id is alive now (database
-- clock): inserts its row on the first call, then moves last_seen_at (started_at stays).
-- One statement, so it is atomic on its own; the loops call it in a short transaction of its
-- own, never inside a pass or a run. AQ002 for a bad kind or interval; the lengths are the
-- columns'.
CREATE OR REPLACE FUNCTION {{ns}}.process_heartbeat(
    p_process_id        text,
    p_kind              text,
    p_name              text,
    p_host              text,
    p_pid               bigint,
    p_version           text,
    p_interval_seconds  double precision
) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    IF p_kind IS NULL OR p_kind NOT IN ('scheduler', 'worker') THEN
        RAISE EXCEPTION 'unknown process kind %: use scheduler or worker', quote_nullable(p_kind)
            USING ERRCODE = 'AQ002';
    END IF;
    IF p_interval_seconds IS NULL OR NOT (p_interval_seconds > 0 AND p_interval_seconds <= 604800) THEN
        RAISE EXCEPTION 'liveness interval must be above 0 and at most 604800 seconds, got %',
                quote_nullable(p_interval_seconds)
            USING ERRCODE = 'AQ002';
    END IF;
    IF p_process_id IS NULL OR p_process_id = '' OR p_host IS NULL OR p_pid IS NULL OR p_version IS NULL THEN
        RAISE EXCEPTION 'a heartbeat needs a process id, host, pid and version'
            USING ERRCODE = 'AQ002';
    END IF;
    INSERT INTO {{ns}}.process_liveness AS l
           (process_id, kind, name, host, pid, version, interval_seconds, started_at, last_seen_at)
    VALUES (p_process_id, p_kind, p_name, p_host, p_pid, p_version, p_interval_seconds,
            clock_timestamp(), clock_timestamp())
    ON CONFLICT (process_id) DO UPDATE
       SET kind = EXCLUDED.kind, name = EXCLUDED.name, host = EXCLUDED.host, pid = EXCLUDED.pid,
           version = EXCLUDED.version, interval_seconds = EXCLUDED.interval_seconds,
           last_seen_at = EXCLUDED.last_seen_at;
END
$$;

ALTER FUNCTION {{ns}}.process_heartbeat(text, text, text, text, bigint, text, double precision)
    SECURITY DEFINER SET search_path = pg_catalog, pg_temp;
