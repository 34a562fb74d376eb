-- Migration 0003_operations (up): what an operator needs to run assetq in production.
-- Frozen once released: later changes go into new migrations.
--
--   * scheduler wake-ups: a notification on the namespace's channel when events are queued;
--   * dag_queue_status, a read-only view per consumer for `assetq status` and dashboards;
--   * purge_runs / purge_events, retention in small batches, and the indexes they need;
--   * least privilege: the routines granted to roles run as their owner (SECURITY DEFINER,
--     pinned search_path), nobody else may execute anything (REVOKE ... FROM PUBLIC), and
--     grant_access / revoke_access give a role exactly one kind of access.
--
-- {{ns}} is replaced by the quoted namespace when the file is loaded.


-- Wake-ups (LISTEN/NOTIFY). A statement-level trigger on the queue: it fires once per
-- statement that queued rows, whoever inserted them (the fan-out trigger, a batch, a raw
-- INSERT). The channel is the namespace's name, the payload a constant: PostgreSQL delivers
-- identical notifications of one transaction once, so a producer sends at most one per
-- transaction however many events it registers, and it is delivered at commit (a rolled-back
-- producer wakes nobody). Listeners only learn "something was queued": the scheduler pass
-- finds out what, so a notification lost while no scheduler listens loses nothing (they
-- also poll).
CREATE FUNCTION {{ns}}.asset_dag_run_queue_notify() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    -- A statement trigger fires for an INSERT ... SELECT that inserted nothing too (an event
    -- of an asset nobody consumes): no wake-up for that.
    IF EXISTS (SELECT 1 FROM new_rows) THEN
        PERFORM pg_notify(TG_TABLE_SCHEMA, 'queued');
    END IF;
    RETURN NULL;
END
$$;

CREATE TRIGGER asset_dag_run_queue_notify
    AFTER INSERT ON {{ns}}.asset_dag_run_queue
    REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION {{ns}}.asset_dag_run_queue_notify();


-- Indexes for retention and status. Each one is read by key or by a short range, so purge
-- and status cost what they delete or show, never a scan of the history.
--
-- The queue by event: the foreign-key check of every event purge_events deletes (and its own
-- "still queued?" test) looks the event up here; without it each check scans the queue.
CREATE INDEX asset_dag_run_queue_event_idx ON {{ns}}.asset_dag_run_queue (asset_event_id);
-- Events by age, in the (timestamp, id) order purge_events walks them with its cursor.
CREATE INDEX asset_event_timestamp_idx ON {{ns}}.asset_event ("timestamp", id);
-- Runs by age, for purge_runs.
CREATE INDEX dag_run_created_idx ON {{ns}}.dag_run (created_at);
-- Runs of a consumer by age: "runs in the last hour" and "last run" of dag_queue_status.
CREATE INDEX dag_run_dag_created_idx ON {{ns}}.dag_run (dag_id, created_at);


-- One row per consumer, for `assetq status` and dashboards. Read-only (it aggregates).
--   queued_events              queue rows of the consumer: events it has not consumed yet
--   oldest_queued_at           timestamp of the oldest of them (NULL when none)
--   oldest_queued_age_seconds  how long that one has waited, by the server's clock
--   runs_last_hour             runs created in the last hour (runs purged are not counted)
--   last_run_at                when its newest run still in the history was created
--   runs_total                 runs ever created for it (its run sequence; purge keeps it)
--   last_scheduled_at          when a scheduler pass last examined it
-- The queue is grouped whole: it holds pending rows only, never history.
CREATE VIEW {{ns}}.dag_queue_status AS
SELECT d.dag_id,
       d.is_paused,
       coalesce(q.queued_events, 0) AS queued_events,
       q.oldest_queued_at,
       CAST(extract(epoch FROM now() - q.oldest_queued_at) AS double precision)
           AS oldest_queued_age_seconds,
       (SELECT count(*)
          FROM {{ns}}.dag_run r
         WHERE r.dag_id = d.dag_id AND r.created_at > now() - interval '1 hour') AS runs_last_hour,
       (SELECT max(r.created_at) FROM {{ns}}.dag_run r WHERE r.dag_id = d.dag_id) AS last_run_at,
       d.last_run_seq AS runs_total,
       d.last_scheduled_at
  FROM {{ns}}.dag d
  LEFT JOIN (SELECT q.target_dag_id,
                    count(*) AS queued_events,
                    min(q.created_at) AS oldest_queued_at
               FROM {{ns}}.asset_dag_run_queue q
              GROUP BY q.target_dag_id) q
    ON q.target_dag_id = d.dag_id;


-- Retention, step 1: deletes at most p_batch_size runs created before p_older_than, oldest
-- first, with their links (ON DELETE CASCADE). Returns how many were deleted. Run each batch
-- in a short transaction of its own (assetq.purge does). A run locked by someone else is
-- skipped, not waited for (SKIP LOCKED), and left for a later batch.
CREATE FUNCTION {{ns}}.purge_runs(p_older_than timestamptz, p_batch_size integer)
RETURNS TABLE (deleted bigint)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
BEGIN
    IF p_older_than IS NULL OR p_batch_size IS NULL OR p_batch_size < 1 THEN
        RAISE EXCEPTION 'purge_runs needs a cutoff and a positive batch size, got % and %',
                quote_nullable(p_older_than), quote_nullable(p_batch_size)
            USING ERRCODE = 'AQ002';
    END IF;
    DELETE FROM {{ns}}.dag_run r
     WHERE r.id IN (SELECT o.id
                      FROM {{ns}}.dag_run o
                     WHERE o.created_at < p_older_than
                     ORDER BY o.created_at
                     LIMIT p_batch_size
                       FOR UPDATE SKIP LOCKED);
    GET DIAGNOSTICS deleted = ROW_COUNT;
    RETURN NEXT;
END
$$;

-- Retention, step 2: examines the next p_batch_size events whose timestamp is before
-- p_older_than, in (timestamp, id) order after the cursor (p_after_timestamp, p_after_id;
-- NULL: from the start), and deletes those that are consumed: no queue row (nobody still
-- waits for them) and no link (the runs that consumed them were purged, or there were none).
-- Returns how many it deleted and examined, and the cursor for the next batch; fewer
-- examined than p_batch_size means the end. The cursor moves past events it keeps, so a
-- long-queued event (a paused consumer, an AND waiting for its other asset) is examined once
-- per purge, not once per batch.
--
-- Never deletes a queued event: the NOT EXISTS below, and behind it the foreign key from
-- asset_dag_run_queue, which has no cascade: deleting a queued event fails and rolls the
-- batch back. Never waits for producers or schedulers: the window is a plain read; only
-- events that pass the test are locked, SKIP LOCKED. Nobody else locks those: producers
-- insert new events, schedulers lock (KEY SHARE, through the link's foreign key) only events
-- they claimed, which are queued.
CREATE FUNCTION {{ns}}.purge_events(
    p_older_than      timestamptz,
    p_batch_size      integer,
    p_after_timestamp timestamptz DEFAULT NULL,
    p_after_id        bigint DEFAULT NULL
) RETURNS TABLE (deleted bigint, examined bigint, last_timestamp timestamptz, last_id bigint)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_ids bigint[];
    v_timestamps timestamptz[];
BEGIN
    IF p_older_than IS NULL OR p_batch_size IS NULL OR p_batch_size < 1 THEN
        RAISE EXCEPTION 'purge_events needs a cutoff and a positive batch size, got % and %',
                quote_nullable(p_older_than), quote_nullable(p_batch_size)
            USING ERRCODE = 'AQ002';
    END IF;
    SELECT array_agg(w.id ORDER BY w."timestamp", w.id),
           array_agg(w."timestamp" ORDER BY w."timestamp", w.id)
      INTO v_ids, v_timestamps
      FROM (SELECT e.id, e."timestamp"
              FROM {{ns}}.asset_event e
             WHERE e."timestamp" < p_older_than
               AND (e."timestamp", e.id) > (coalesce(p_after_timestamp, '-infinity'),
                                            coalesce(p_after_id, 0))
             ORDER BY e."timestamp", e.id
             LIMIT p_batch_size) w;
    examined := coalesce(cardinality(v_ids), 0);
    deleted := 0;
    IF examined = 0 THEN
        last_timestamp := p_after_timestamp;
        last_id := p_after_id;
        RETURN NEXT;
        RETURN;
    END IF;
    last_timestamp := v_timestamps[examined];
    last_id := v_ids[examined];

    DELETE FROM {{ns}}.asset_event e
     WHERE e.id IN (SELECT c.id
                      FROM {{ns}}.asset_event c
                     WHERE c.id = ANY (v_ids)
                       AND NOT EXISTS (SELECT 1 FROM {{ns}}.asset_dag_run_queue q
                                        WHERE q.asset_event_id = c.id)
                       AND NOT EXISTS (SELECT 1 FROM {{ns}}.dagrun_asset_event l
                                        WHERE l.asset_event_id = c.id)
                       FOR UPDATE SKIP LOCKED);
    GET DIAGNOSTICS deleted = ROW_COUNT;
    RETURN NEXT;
END
$$;


-- Least privilege. Three kinds of access, granted to existing roles by grant_access:
--   producer   register_event and register_events: can register events, nothing else;
--   scheduler  schedule_pass: can run scheduler passes, nothing else (assetq has no routine
--              that moves run states yet);
--   reader     SELECT on every table and view of the namespace: can read, never write.
-- Every kind also gets USAGE on the schema and SELECT on the version table (assetq checks
-- the installed revision). No kind gets any other right on a table: producers and
-- schedulers act only through the routines below, which run with their owner's rights
-- (SECURITY DEFINER). Their search_path is pinned to pg_catalog then pg_temp, so a caller
-- cannot slip an object of its own in front of a built-in; every assetq object they use is
-- schema-qualified already.
ALTER FUNCTION {{ns}}.register_event(text, jsonb, text, text, text, integer, text)
    SECURITY DEFINER SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION {{ns}}.register_events(jsonb)
    SECURITY DEFINER SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION {{ns}}.schedule_pass(integer)
    SECURITY DEFINER SET search_path = pg_catalog, pg_temp;

-- Gives the existing role p_grantee one kind of access (see above); p_host must be NULL (it
-- is MySQL's account host). Idempotent. Runs with the caller's rights: the caller must own
-- assetq's objects (or hold them WITH GRANT OPTION). AQ002 for an unknown kind or role.
CREATE FUNCTION {{ns}}.grant_access(p_access text, p_grantee text, p_host text DEFAULT NULL)
RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    IF p_access IS NULL OR p_access NOT IN ('producer', 'scheduler', 'reader') THEN
        RAISE EXCEPTION 'unknown access %: use producer, scheduler or reader', quote_nullable(p_access)
            USING ERRCODE = 'AQ002';
    END IF;
    IF p_host IS NOT NULL THEN
        RAISE EXCEPTION 'a PostgreSQL role has no host: got %', quote_literal(p_host)
            USING ERRCODE = 'AQ002';
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_roles r WHERE r.rolname = p_grantee) THEN
        RAISE EXCEPTION 'role % does not exist', quote_nullable(p_grantee)
            USING ERRCODE = 'AQ002',
                  HINT = 'Create it first, e.g. CREATE ROLE name LOGIN PASSWORD ''...''.';
    END IF;
    EXECUTE format('GRANT USAGE ON SCHEMA {{ns}} TO %I', p_grantee);
    EXECUTE format('GRANT SELECT ON {{ns}}.assetq_alembic_version TO %I', p_grantee);
    IF p_access = 'producer' THEN
        EXECUTE format('GRANT EXECUTE ON FUNCTION'
                       ' {{ns}}.register_event(text, jsonb, text, text, text, integer, text),'
                       ' {{ns}}.register_events(jsonb) TO %I', p_grantee);
    ELSIF p_access = 'scheduler' THEN
        EXECUTE format('GRANT EXECUTE ON FUNCTION {{ns}}.schedule_pass(integer) TO %I', p_grantee);
    ELSE
        EXECUTE format('GRANT SELECT ON ALL TABLES IN SCHEMA {{ns}} TO %I', p_grantee);
    END IF;
END
$$;

-- Takes every kind of access grant_access gave p_grantee away again. Idempotent.
CREATE FUNCTION {{ns}}.revoke_access(p_grantee text, p_host text DEFAULT NULL)
RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    IF p_host IS NOT NULL THEN
        RAISE EXCEPTION 'a PostgreSQL role has no host: got %', quote_literal(p_host)
            USING ERRCODE = 'AQ002';
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_roles r WHERE r.rolname = p_grantee) THEN
        RAISE EXCEPTION 'role % does not exist', quote_nullable(p_grantee) USING ERRCODE = 'AQ002';
    END IF;
    EXECUTE format('REVOKE EXECUTE ON FUNCTION'
                   ' {{ns}}.register_event(text, jsonb, text, text, text, integer, text),'
                   ' {{ns}}.register_events(jsonb), {{ns}}.schedule_pass(integer) FROM %I',
                   p_grantee);
    EXECUTE format('REVOKE SELECT ON ALL TABLES IN SCHEMA {{ns}} FROM %I', p_grantee);
    EXECUTE format('REVOKE USAGE ON SCHEMA {{ns}} FROM %I', p_grantee);
END
$$;

-- PostgreSQL lets PUBLIC execute every new function: only the owner, and the roles given
-- access, may execute assetq's. (Trigger functions are not checked when the trigger fires.)
-- A later migration that creates a function repeats this.
REVOKE EXECUTE ON ALL FUNCTIONS IN SCHEMA {{ns}} FROM PUBLIC;
