-- Migration 0009_partitions (up): partitioned assets (issue 17).
--
--   * events carry an optional partition_key (register_events' items take "partition_key");
--   * a consumer may be partitioned (dag.partitioning, set by set_dag_partitions right after
--     declare_dag): each asset of its condition maps its events' keys to the consumer's keys
--     (dag_schedule_asset_reference.partition_mapping: identity, hour_to_day, day_to_week,
--     day_to_month or static, dag_partition_static_key), and its condition is evaluated per
--     key: schedule_pass hands it to schedule_partitions, which creates a run per key whose
--     events satisfy it (dag_run.partition_key, partition_generation; at most one run per
--     consumer, key and generation, a unique constraint);
--   * the fan-out writes a row of asset_partition_queue beside each queue row of a partitioned
--     consumer, with its key (partition_map; AQ011 for an event it cannot map), and a pass
--     evaluates only the keys of rows no pass has examined yet: it costs what arrived.
-- schedule_pass, set_run_state, claim_runs, complete_run and retry_run return the run's
-- partition_key too: a function's result cannot change in place, so they are dropped and
-- created again, their grants saved before and given back after (as in 0004_semantics).
--
-- Additive for the previous package (0008): its calls keep their signatures, and the new
-- result column is one it does not read. An old package's declare_dag leaves a consumer's
-- partitioning as it was (its new assets map by identity).
--
-- {{ns}} is replaced by the quoted namespace when the file is loaded.

-- Tables. Every new column may be NULL, so adding it rewrites nothing; no CHECK reads the
-- existing rows. The one index on existing rows is dag_run's (a run per key and generation).
ALTER TABLE {{ns}}.asset_event ADD COLUMN partition_key varchar(250);
ALTER TABLE {{ns}}.dag ADD COLUMN partitioning jsonb;
ALTER TABLE {{ns}}.dag_schedule_asset_reference
    ADD COLUMN partition_mapping varchar(20),
    ADD COLUMN partition_require varchar(3),
    ADD CONSTRAINT dag_schedule_asset_reference_mapping_check
        CHECK (partition_mapping IN ('identity', 'hour_to_day', 'day_to_week', 'day_to_month', 'static')),
    ADD CONSTRAINT dag_schedule_asset_reference_require_check CHECK (partition_require IN ('all', 'any'));
ALTER TABLE {{ns}}.dag_run
    ADD COLUMN partition_key varchar(250),
    ADD COLUMN partition_generation integer,
    ADD CONSTRAINT dag_run_partition_key UNIQUE (dag_id, partition_key, partition_generation);

-- Partitions (migration 0009_partitions). A static mapping of a partitioned consumer: an
-- event of asset asset_id with partition key upstream_key counts towards the consumer's key
-- target_key. With partition_require 'all', a target key needs an event for every upstream
-- key that maps to it.
CREATE TABLE {{ns}}.dag_partition_static_key (
    dag_id        varchar(250) NOT NULL,
    asset_id      bigint NOT NULL,
    upstream_key  varchar(250) NOT NULL,
    target_key    varchar(250) NOT NULL,
    PRIMARY KEY (dag_id, asset_id, upstream_key),
    CONSTRAINT dag_partition_static_key_reference_fkey FOREIGN KEY (asset_id, dag_id)
        REFERENCES {{ns}}.dag_schedule_asset_reference (asset_id, dag_id) ON DELETE CASCADE
);
CREATE INDEX dag_partition_static_key_target_idx
    ON {{ns}}.dag_partition_static_key (dag_id, asset_id, target_key);

-- The queue rows of partitioned consumers, with their keys: one row beside each of their
-- asset_dag_run_queue rows, written by the same fan-out and deleted by whoever deletes the
-- queue row (the pass, declare_dag, delete_asset, delete_dag's cascade). Not a foreign key to
-- the queue: its check on every queue row any pass deletes, partitioned or not, cost more than
-- the delete itself (measured with EXPLAIN ANALYZE: 20,000 trigger calls, 54-92 ms against
-- 11-24 ms for the delete). A row whose queue row is gone is never claimed: the pass reads a
-- key's rows joined with the queue, and drops those it finds alone.
-- partition_key is the consumer's key the event maps to, source_key the event's own key as
-- its mapping counts it (an hour of a day, a day of a week). examined: a pass has evaluated
-- the row's key since the row arrived and found its condition not met; a pass evaluates only
-- the keys of rows not yet examined, so it costs what arrived, never every pending key.
CREATE TABLE {{ns}}.asset_partition_queue (
    target_dag_id   varchar(250) NOT NULL,
    asset_event_id  bigint NOT NULL,
    partition_key   varchar(250) NOT NULL,
    asset_id        bigint NOT NULL,
    source_key      varchar(250) NOT NULL,
    created_at      timestamptz NOT NULL,
    examined        boolean NOT NULL DEFAULT false,
    PRIMARY KEY (target_dag_id, asset_event_id),
    CONSTRAINT asset_partition_queue_dag_fkey FOREIGN KEY (target_dag_id)
        REFERENCES {{ns}}.dag (dag_id) ON DELETE CASCADE
);
-- A key's rows in queue order; the rows not yet examined, in arrival order.
CREATE INDEX asset_partition_queue_key_idx
    ON {{ns}}.asset_partition_queue (target_dag_id, partition_key, created_at, asset_event_id);
CREATE INDEX asset_partition_queue_new_idx
    ON {{ns}}.asset_partition_queue (target_dag_id, asset_event_id) WHERE NOT examined;
-- The fan-out's probe for partitioned consumers of an event's asset: usually empty.
CREATE INDEX dag_schedule_asset_reference_partitioned_idx
    ON {{ns}}.dag_schedule_asset_reference (asset_id) WHERE partition_mapping IS NOT NULL;

-- Readers of the namespace (grant_access 'reader' gave SELECT on every table that existed
-- then) can read the new tables too.
DO $$
DECLARE
    v_grantee text;
BEGIN
    FOR v_grantee IN
        SELECT DISTINCT pg_catalog.pg_get_userbyid(a.grantee)
          FROM pg_catalog.pg_class c, pg_catalog.aclexplode(c.relacl) a
         WHERE c.oid = '{{ns}}.asset'::regclass
           AND a.privilege_type = 'SELECT' AND a.grantee <> c.relowner AND a.grantee <> 0
    LOOP
        EXECUTE format('GRANT SELECT ON {{ns}}.dag_partition_static_key,'
                       ' {{ns}}.asset_partition_queue TO %I', v_grantee);
    END LOOP;
END
$$;

-- New functions.

-- Declares or re-declares a consumer. p_condition is the condition as declared (kept for
-- reading back); p_clauses its conjunctive normal form, a JSON array of clauses, each a
-- non-empty array of members: "x" (an asset by name, else by uri), {"name": "x"},
-- {"uri": "x"} or {"alias": "x"}. Assets and aliases named here that do not exist are created
-- (an asset referenced by uri gets the uri as its name too, as in Airflow), marked
-- undeclared. The whole replacement happens in the caller's transaction, under the
-- consumer's row lock: a scheduler pass sees the old condition or the new one, never a mix.
-- p_paused NULL keeps the current state (new consumers start unpaused). p_max_active_runs and
-- p_max_events_per_run NULL mean no cap. Queued rows of assets the consumer no longer depends
-- on are deleted; the others stay and are consumed by its next run.
-- Partitions (migration 0009_partitions). Maps partition key p_key of an event of asset
-- p_asset_id to partitioned consumer p_dag_id's key under p_mapping, and gives the key as the
-- mapping counts it (source_key):
--   identity      the key itself;
--   hour_to_day   'YYYY-MM-DDTHH' (optionally ':00' or ':00:00', optionally 'Z' or '+00:00':
--                 hours of UTC) -> 'YYYY-MM-DD'; source_key 'YYYY-MM-DDTHH';
--   day_to_week   'YYYY-MM-DD' -> its ISO week 'IYYY-Www' (e.g. 2026-W49);
--   day_to_month  'YYYY-MM-DD' -> 'YYYY-MM';
--   static        the consumer's dag_partition_static_key row for the asset and key.
-- An event without a key, or whose key does not parse or has no static row, raises AQ011:
-- the registration fails and nothing is written (never a silent skip).
CREATE FUNCTION {{ns}}.partition_map(
    p_dag_id     text,
    p_asset_id   bigint,
    p_mapping    text,
    p_key        text,
    OUT target_key text,
    OUT source_key text
)
LANGUAGE plpgsql STABLE AS $$
DECLARE
    v_day  text;
    v_date date;
BEGIN
    -- A key ending with a space maps to nothing, on both engines: MySQL compares 'k ' and 'k'
    -- as equal (PAD SPACE collation), PostgreSQL does not.
    IF p_key IS NOT NULL AND right(p_key, 1) <> ' ' THEN
        IF p_mapping = 'identity' THEN
            target_key := p_key;
            source_key := p_key;
            RETURN;
        ELSIF p_mapping = 'static' THEN
            SELECT s.target_key INTO target_key
              FROM {{ns}}.dag_partition_static_key s
             WHERE s.dag_id = p_dag_id AND s.asset_id = p_asset_id AND s.upstream_key = p_key;
            IF FOUND THEN
                source_key := p_key;
                RETURN;
            END IF;
        ELSE
            IF p_mapping = 'hour_to_day'
               AND p_key ~ '^[0-9]{4}-[0-9]{2}-[0-9]{2}T([01][0-9]|2[0-3])(:00(:00)?)?(Z|\+00:00)?$' THEN
                v_day := left(p_key, 10);
            ELSIF p_mapping IN ('day_to_week', 'day_to_month') AND p_key ~ '^[0-9]{4}-[0-9]{2}-[0-9]{2}$' THEN
                v_day := p_key;
            END IF;
            v_date := {{ns}}.partition_day(v_day);
            IF v_date IS NOT NULL THEN
                target_key := CASE p_mapping
                                  WHEN 'hour_to_day' THEN v_day
                                  WHEN 'day_to_week' THEN to_char(v_date, 'IYYY-"W"IW')
                                  ELSE left(v_day, 7)
                              END;
                source_key := CASE WHEN p_mapping = 'hour_to_day' THEN left(p_key, 13) ELSE v_day END;
                RETURN;
            END IF;
        END IF;
    END IF;
    IF p_key IS NULL THEN
        RAISE EXCEPTION 'consumer % is partitioned: the event of asset % needs a partition key',
                p_dag_id, quote_literal((SELECT a.name FROM {{ns}}.asset a WHERE a.id = p_asset_id))
            USING ERRCODE = 'AQ011',
                  HINT = 'Register it with partition_key, or declare the consumer unpartitioned.';
    END IF;
    RAISE EXCEPTION 'partition key % of asset % maps to no partition of consumer % (mapping %)',
            quote_literal(p_key), quote_literal((SELECT a.name FROM {{ns}}.asset a WHERE a.id = p_asset_id)),
            p_dag_id, p_mapping
        USING ERRCODE = 'AQ011',
              HINT = CASE WHEN p_mapping = 'static' THEN 'Add the key to the consumer''s static mapping.'
                          WHEN p_mapping = 'hour_to_day' THEN 'Hour keys are UTC, written YYYY-MM-DDTHH.'
                          ELSE 'Day keys are written YYYY-MM-DD.' END;
END
$$;

-- The date of p_day when it is a real day written 'YYYY-MM-DD' (years 1 to 9999), NULL
-- otherwise: never an error for a key that does not parse.
CREATE FUNCTION {{ns}}.partition_day(p_day text) RETURNS date
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    v_year  integer;
    v_month integer;
    v_dom   integer;
BEGIN
    IF p_day IS NULL OR p_day !~ '^[0-9]{4}-[0-9]{2}-[0-9]{2}$' THEN
        RETURN NULL;
    END IF;
    v_year := substr(p_day, 1, 4)::integer;
    v_month := substr(p_day, 6, 2)::integer;
    v_dom := substr(p_day, 9, 2)::integer;
    IF v_year < 1 OR v_month NOT BETWEEN 1 AND 12 OR v_dom < 1
       OR v_dom > extract(day FROM make_date(v_year, v_month, 1) + interval '1 month' - interval '1 day')
    THEN
        RETURN NULL;
    END IF;
    RETURN make_date(v_year, v_month, v_dom);
END
$$;

-- How many distinct upstream keys (source_key) of asset p_asset_id consumer key p_key needs
-- under mapping p_mapping: 1 for identity or partition_require 'any'; with 'all', 24 hours
-- of a day, 7 days of an ISO week, the days of a month, or every upstream key a static
-- mapping maps to p_key.
CREATE FUNCTION {{ns}}.partition_required(
    p_dag_id   text,
    p_asset_id bigint,
    p_mapping  text,
    p_require  text,
    p_key      text
) RETURNS bigint
LANGUAGE plpgsql STABLE AS $$
BEGIN
    IF p_mapping IS NULL OR p_mapping = 'identity' OR p_require IS DISTINCT FROM 'all' THEN
        RETURN 1;
    ELSIF p_mapping = 'hour_to_day' THEN
        RETURN 24;
    ELSIF p_mapping = 'day_to_week' THEN
        RETURN 7;
    ELSIF p_mapping = 'day_to_month' THEN
        RETURN extract(day FROM {{ns}}.partition_day(p_key || '-01') + interval '1 month' - interval '1 day');
    END IF;
    RETURN (SELECT count(*) FROM {{ns}}.dag_partition_static_key s
             WHERE s.dag_id = p_dag_id AND s.asset_id = p_asset_id AND s.target_key = p_key);
END
$$;

-- The assets present for key p_key of partitioned consumer p_dag_id among the rows given as
-- parallel arrays (asset, upstream key): those with at least partition_required distinct
-- upstream keys (migration 0009_partitions).
CREATE FUNCTION {{ns}}.partition_present(
    p_dag_id  text,
    p_key     text,
    p_assets  bigint[],
    p_sources text[]
) RETURNS bigint[]
LANGUAGE sql STABLE AS $$
    SELECT coalesce(array_agg(s.asset_id), '{}')
      FROM (SELECT c.asset_id, count(DISTINCT c.source_key) AS n
              FROM unnest(p_assets, p_sources) AS c(asset_id, source_key)
             GROUP BY c.asset_id) s
      LEFT JOIN {{ns}}.dag_schedule_asset_reference r
             ON r.dag_id = p_dag_id AND r.asset_id = s.asset_id
     WHERE s.n >= {{ns}}.partition_required(p_dag_id, s.asset_id, r.partition_mapping,
                                             r.partition_require, p_key)
$$;

-- Sets the partitioning of consumer p_dag_id (migration 0009_partitions); the Python layer
-- calls it right after declare_dag, in the same transaction. p_partitions is NULL for an
-- unpartitioned consumer, or {"assets": [{"asset": name or uri, "mapping": "identity" |
-- "hour_to_day" | "day_to_week" | "day_to_month" | "static", "require": "all" | "any",
-- "keys": [[upstream key, consumer key], ...] (static only)}, ...]}, one item per asset of the
-- condition whose mapping is not identity (the others map by identity). "require" (default
-- "all") says whether a consumer key needs every upstream key that maps to it or any one.
--
-- The same partitioning for the same condition as before writes nothing. Otherwise the
-- consumer's row is locked FOR UPDATE first, which waits for the producers in flight (they
-- hold KEY SHARE on it) and holds new ones back until the caller commits; its reference rows
-- get their mappings, and its queued events are mapped again (AQ011 if one cannot be: the
-- declaration fails, nothing is written), each key evaluated afresh by the next pass.
-- AQ002 for a malformed item, an asset that is not in the condition (aliases map by
-- identity) or an asset named twice; AQ003 for an unknown consumer.
CREATE FUNCTION {{ns}}.set_dag_partitions(p_dag_id text, p_partitions jsonb) RETURNS void
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_condition jsonb;
    v_old       jsonb;
    v_new       jsonb;
    v_cap       integer;
    v_created   timestamptz;
    v_bad       record;
    v_items     jsonb := coalesce(p_partitions -> 'assets', '[]'::jsonb);
    v_asset_ids bigint[];
    v_mappings  text[];
    v_requires  text[];
    v_keys      jsonb[];
BEGIN
    SELECT d.condition, d.partitioning, d.max_events_per_run, d.created_at
      INTO v_condition, v_old, v_cap, v_created
      FROM {{ns}}.dag d WHERE d.dag_id = p_dag_id;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'unknown dag %', quote_nullable(p_dag_id) USING ERRCODE = 'AQ003';
    END IF;
    IF p_partitions IS NOT NULL THEN
        IF jsonb_typeof(p_partitions) <> 'object' OR jsonb_typeof(v_items) <> 'array' THEN
            RAISE EXCEPTION 'partitions of dag % must be NULL or {"assets": [...]}', p_dag_id
                USING ERRCODE = 'AQ002';
        END IF;
        SELECT i.ord INTO v_bad
          FROM jsonb_array_elements(v_items) WITH ORDINALITY AS i(item, ord)
         WHERE jsonb_typeof(i.item) <> 'object'
            OR jsonb_typeof(i.item -> 'asset') IS DISTINCT FROM 'string'
            OR coalesce(i.item ->> 'mapping', '')
                   NOT IN ('identity', 'hour_to_day', 'day_to_week', 'day_to_month', 'static')
            OR coalesce(i.item ->> 'require', 'all') NOT IN ('all', 'any')
            OR (i.item ->> 'mapping' = 'static') <> (jsonb_typeof(i.item -> 'keys') IS NOT DISTINCT FROM 'array')
            OR (i.item ->> 'mapping' = 'static'
                AND (jsonb_array_length(i.item -> 'keys') = 0
                     OR EXISTS (SELECT 1 FROM jsonb_array_elements(i.item -> 'keys') k
                                 WHERE jsonb_typeof(k) <> 'array' OR jsonb_array_length(k) <> 2
                                    OR jsonb_typeof(k -> 0) <> 'string' OR jsonb_typeof(k -> 1) <> 'string'
                                    OR k ->> 0 = '' OR k ->> 1 = ''
                                    OR right(k ->> 0, 1) = ' ' OR right(k ->> 1, 1) = ' '
                                    OR length(k ->> 0) > 250 OR length(k ->> 1) > 250)
                     OR (SELECT count(DISTINCT k ->> 0) FROM jsonb_array_elements(i.item -> 'keys') k)
                        <> jsonb_array_length(i.item -> 'keys')))
         ORDER BY i.ord
         LIMIT 1;
        IF FOUND THEN
            RAISE EXCEPTION 'partition mapping % of dag % must be {"asset", "mapping": identity, hour_to_day, day_to_week, day_to_month or static, "require": all or any, "keys" (static only: distinct [upstream key, key] pairs of 1 to 250 characters, not ending with a space)}',
                    v_bad.ord, p_dag_id
                USING ERRCODE = 'AQ002';
        END IF;
        SELECT array_agg(coalesce((SELECT a.id FROM {{ns}}.asset a WHERE a.name = i.item ->> 'asset'),
                                  (SELECT a.id FROM {{ns}}.asset a WHERE a.uri = i.item ->> 'asset'))
                         ORDER BY i.ord),
               array_agg(i.item ->> 'mapping' ORDER BY i.ord),
               array_agg(CASE WHEN i.item ->> 'mapping' = 'identity' THEN 'any'
                              ELSE coalesce(i.item ->> 'require', 'all') END ORDER BY i.ord),
               array_agg(i.item -> 'keys' ORDER BY i.ord)
          INTO v_asset_ids, v_mappings, v_requires, v_keys
          FROM jsonb_array_elements(v_items) WITH ORDINALITY AS i(item, ord);
        SELECT m.ord, v_items -> (m.ord::integer - 1) ->> 'asset' AS asset INTO v_bad
          FROM unnest(v_asset_ids) WITH ORDINALITY AS m(asset_id, ord)
         WHERE NOT EXISTS (SELECT 1 FROM {{ns}}.dag_schedule_asset_reference r
                            WHERE r.dag_id = p_dag_id AND r.asset_id = m.asset_id)
            OR (SELECT count(*) FROM unnest(v_asset_ids) AS o(asset_id) WHERE o.asset_id = m.asset_id) > 1
         ORDER BY m.ord
         LIMIT 1;
        IF FOUND THEN
            RAISE EXCEPTION 'partition mapping of asset % for dag %: the asset must be in its condition (not through an alias), once',
                    quote_literal(v_bad.asset), p_dag_id
                USING ERRCODE = 'AQ002';
        END IF;
        -- With the condition and the cap it was declared for: a change of either evaluates
        -- every key afresh (a key a smaller cap could not satisfy may run now).
        v_new := jsonb_build_object('partitions', p_partitions, 'condition', v_condition,
                                    'max_events_per_run', v_cap);
    END IF;
    IF v_new IS NOT DISTINCT FROM v_old THEN
        RETURN;
    END IF;

    PERFORM 1 FROM {{ns}}.dag d WHERE d.dag_id = p_dag_id FOR UPDATE;
    -- The queued events are mapped again from this statement's snapshot: above READ
    -- COMMITTED that is the transaction's, older than the producers the lock just waited
    -- for, whose events would keep their old mapping or get none. A consumer created in this
    -- very transaction has no such producers.
    IF current_setting('transaction_isolation') <> 'read committed' AND v_created < now() THEN
        RAISE EXCEPTION 'the partitioning of consumer % can change only at READ COMMITTED (this transaction is %)',
                p_dag_id, current_setting('transaction_isolation')
            USING ERRCODE = 'AQ002',
                  HINT = 'Declare it in a READ COMMITTED transaction (PostgreSQL''s default).';
    END IF;

    UPDATE {{ns}}.dag_schedule_asset_reference r
       SET partition_mapping = CASE WHEN v_new IS NOT NULL THEN coalesce(m.mapping, 'identity') END,
           partition_require = CASE WHEN v_new IS NOT NULL THEN coalesce(m.require, 'any') END
      FROM (SELECT x.asset_id, s.mapping, s.require
              FROM {{ns}}.dag_schedule_asset_reference x
              LEFT JOIN unnest(v_asset_ids, v_mappings, v_requires) AS s(asset_id, mapping, require)
                     ON s.asset_id = x.asset_id
             WHERE x.dag_id = p_dag_id) m
     WHERE r.dag_id = p_dag_id AND r.asset_id = m.asset_id;

    DELETE FROM {{ns}}.dag_partition_static_key s WHERE s.dag_id = p_dag_id;
    INSERT INTO {{ns}}.dag_partition_static_key (dag_id, asset_id, upstream_key, target_key)
    SELECT p_dag_id, s.asset_id, k ->> 0, k ->> 1
      FROM unnest(v_asset_ids, v_mappings, v_keys) AS s(asset_id, mapping, keys),
           jsonb_array_elements(s.keys) k
     WHERE s.mapping = 'static';

    UPDATE {{ns}}.dag d
       SET partitioning = v_new, updated_at = clock_timestamp()
     WHERE d.dag_id = p_dag_id;

    DELETE FROM {{ns}}.asset_partition_queue p WHERE p.target_dag_id = p_dag_id;
    IF v_new IS NOT NULL THEN
        INSERT INTO {{ns}}.asset_partition_queue
               (target_dag_id, asset_event_id, partition_key, asset_id, source_key, created_at)
        SELECT q.target_dag_id, q.asset_event_id, m.target_key, q.asset_id, m.source_key, q.created_at
          FROM {{ns}}.asset_dag_run_queue q
          JOIN {{ns}}.asset_event e ON e.id = q.asset_event_id
          LEFT JOIN {{ns}}.dag_schedule_asset_reference r
                 ON r.asset_id = q.asset_id AND r.dag_id = q.target_dag_id
          CROSS JOIN LATERAL {{ns}}.partition_map(q.target_dag_id, q.asset_id,
                                                  coalesce(r.partition_mapping, 'identity'),
                                                  e.partition_key) m
         WHERE q.target_dag_id = p_dag_id;
    END IF;
END
$$;

-- The part of a scheduler pass for one partitioned consumer (migration 0009_partitions),
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
CREATE FUNCTION {{ns}}.schedule_partitions(
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

-- The fan-out, registration, declaration and deletion of assets, in place (same signatures).

CREATE OR REPLACE FUNCTION {{ns}}.asset_event_fan_out() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    v_aliased boolean := false;
BEGIN
    INSERT INTO {{ns}}.asset_dag_run_queue (target_dag_id, asset_event_id, asset_id, created_at)
    SELECT d.dag_id, e.id, e.asset_id, e."timestamp"
      FROM new_events e
      JOIN {{ns}}.dag_schedule_asset_reference r ON r.asset_id = e.asset_id
      JOIN {{ns}}.dag d ON d.dag_id = r.dag_id
     WHERE NOT d.is_paused OR d.queue_while_paused
       FOR KEY SHARE OF d, r;

    -- Through aliases: usually no alias has resolved to these assets and this is one index
    -- probe. A consumer with the alias in two clauses, or that also references the asset
    -- directly, already has its row: ON CONFLICT skips the second.
    IF EXISTS (SELECT 1 FROM new_events e
                 JOIN {{ns}}.asset_alias_asset aa ON aa.asset_id = e.asset_id) THEN
        INSERT INTO {{ns}}.asset_dag_run_queue (target_dag_id, asset_event_id, asset_id, created_at)
        SELECT d.dag_id, e.id, e.asset_id, e."timestamp"
          FROM new_events e
          JOIN {{ns}}.asset_alias_asset aa ON aa.asset_id = e.asset_id
          JOIN {{ns}}.dag_condition_alias ca ON ca.alias_id = aa.alias_id
          JOIN {{ns}}.dag d ON d.dag_id = ca.dag_id
         WHERE NOT d.is_paused OR d.queue_while_paused
           FOR KEY SHARE OF d, ca
        ON CONFLICT DO NOTHING;
        v_aliased := true;
    END IF;

    -- Partitioned consumers (migration 0009_partitions): each of their new queue rows gets its
    -- row in asset_partition_queue, with the consumer's key the event maps to (partition_map
    -- raises AQ011 for an event it cannot map: the registration fails, nothing is written).
    -- Read back from the queue rows this statement wrote, so it is exactly those. Usually no
    -- consumer of these assets is partitioned and this is one probe of an empty index; through
    -- an alias the consumers are looked at too (identity mapping).
    IF v_aliased OR EXISTS (SELECT 1 FROM new_events e
                              JOIN {{ns}}.dag_schedule_asset_reference r ON r.asset_id = e.asset_id
                             WHERE r.partition_mapping IS NOT NULL) THEN
        INSERT INTO {{ns}}.asset_partition_queue
               (target_dag_id, asset_event_id, partition_key, asset_id, source_key, created_at)
        SELECT q.target_dag_id, q.asset_event_id, m.target_key, q.asset_id, m.source_key, q.created_at
          FROM new_events e
          JOIN {{ns}}.asset_dag_run_queue q ON q.asset_event_id = e.id
          JOIN {{ns}}.dag d ON d.dag_id = q.target_dag_id
          LEFT JOIN {{ns}}.dag_schedule_asset_reference r
                 ON r.asset_id = q.asset_id AND r.dag_id = q.target_dag_id
          CROSS JOIN LATERAL {{ns}}.partition_map(q.target_dag_id, q.asset_id,
                                                  coalesce(r.partition_mapping, 'identity'),
                                                  e.partition_key) m
         WHERE d.partitioning IS NOT NULL;
    END IF;
    RETURN NULL;
END
$$;

CREATE OR REPLACE FUNCTION {{ns}}.register_events(p_events jsonb)
RETURNS TABLE (
    item_no         integer,
    event_id        bigint,
    asset_id        bigint,
    event_timestamp timestamptz,
    created         boolean
)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_count     integer;
    v_now       timestamptz;
    v_ids       bigint[];
    v_assets    text[];
    v_asset_ids bigint[];
    v_extras    jsonb[];
    v_dag_ids   text[];
    v_task_ids  text[];
    v_run_ids   text[];
    v_indexes   integer[];
    v_keys      text[];
    v_aliases   jsonb[];
    v_parts     text[];
    v_bad       record;
BEGIN
    IF jsonb_typeof(p_events) IS DISTINCT FROM 'array' THEN
        RAISE EXCEPTION 'events must be a JSON array, got %', coalesce(jsonb_typeof(p_events), 'NULL')
            USING ERRCODE = 'AQ002';
    END IF;
    v_count := jsonb_array_length(p_events);
    IF v_count > 10000 THEN
        RAISE EXCEPTION 'a batch holds at most 10000 events, got %', v_count
            USING ERRCODE = 'AQ002',
                  HINT = 'Split it: several calls in one transaction are atomic together.';
    END IF;
    IF v_count = 0 THEN
        RETURN;
    END IF;

    SELECT i.ord, jsonb_typeof(i.item) AS item_type, jsonb_typeof(i.item -> 'extra') AS extra_type
      INTO v_bad
      FROM jsonb_array_elements(p_events) WITH ORDINALITY AS i(item, ord)
     WHERE jsonb_typeof(i.item) <> 'object'
        OR jsonb_typeof(i.item -> 'extra') NOT IN ('object', 'null')
     ORDER BY i.ord
     LIMIT 1;
    IF FOUND THEN
        IF v_bad.item_type <> 'object' THEN
            RAISE EXCEPTION 'event % of the batch must be a JSON object, got %', v_bad.ord, v_bad.item_type
                USING ERRCODE = 'AQ002';
        END IF;
        RAISE EXCEPTION 'event extra must be a JSON object, got % (event % of the batch)',
                v_bad.extra_type, v_bad.ord
            USING ERRCODE = 'AQ002';
    END IF;

    SELECT i.ord INTO v_bad
      FROM jsonb_array_elements(p_events) WITH ORDINALITY AS i(item, ord)
     WHERE jsonb_typeof(i.item -> 'aliases') <> 'null'
       AND (jsonb_typeof(i.item -> 'aliases') <> 'array'
            OR jsonb_array_length(i.item -> 'aliases') NOT BETWEEN 1 AND 100
            OR EXISTS (SELECT 1 FROM jsonb_array_elements(i.item -> 'aliases') x
                        WHERE jsonb_typeof(x) <> 'string' OR x #>> '{}' = ''
                           OR length(x #>> '{}') > 512))
     ORDER BY i.ord
     LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION 'aliases must be a JSON array of 1 to 100 alias names of 1 to 512 characters (event % of the batch)',
                v_bad.ord
            USING ERRCODE = 'AQ002';
    END IF;

    SELECT array_agg(i.item ->> 'asset' ORDER BY i.ord),
           array_agg(coalesce(nullif(i.item -> 'extra', 'null'::jsonb), '{}'::jsonb) ORDER BY i.ord),
           array_agg(i.item ->> 'source_dag_id' ORDER BY i.ord),
           array_agg(i.item ->> 'source_task_id' ORDER BY i.ord),
           array_agg(i.item ->> 'source_run_id' ORDER BY i.ord),
           array_agg(coalesce((i.item ->> 'source_map_index')::integer, -1) ORDER BY i.ord),
           array_agg(i.item ->> 'idempotency_key' ORDER BY i.ord),
           array_agg(nullif(i.item -> 'aliases', 'null'::jsonb) ORDER BY i.ord)
      INTO v_assets, v_extras, v_dag_ids, v_task_ids, v_run_ids, v_indexes, v_keys, v_aliases
      FROM jsonb_array_elements(p_events) WITH ORDINALITY AS i(item, ord);

    -- Partition keys (migration 0009_partitions): a string of 1 to 250 characters, or none.
    SELECT i.ord INTO v_bad
      FROM jsonb_array_elements(p_events) WITH ORDINALITY AS i(item, ord)
     WHERE jsonb_typeof(i.item -> 'partition_key') NOT IN ('string', 'null')
        OR i.item ->> 'partition_key' = '' OR length(i.item ->> 'partition_key') > 250
        OR right(i.item ->> 'partition_key', 1) = ' '
     ORDER BY i.ord
     LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION 'partition_key must be a string of 1 to 250 characters, not ending with a space (event % of the batch)', v_bad.ord
            USING ERRCODE = 'AQ002';
    END IF;
    v_parts := ARRAY(SELECT i.item ->> 'partition_key'
                       FROM jsonb_array_elements(p_events) WITH ORDINALITY AS i(item, ord)
                      ORDER BY i.ord);

    -- Each distinct asset is looked up once: by name, then by uri, as resolve_asset does.
    SELECT array_agg(r.id ORDER BY n.ord)
      INTO v_asset_ids
      FROM unnest(v_assets) WITH ORDINALITY AS n(asset, ord)
      LEFT JOIN (
            SELECT d.asset,
                   coalesce((SELECT a.id FROM {{ns}}.asset a WHERE a.name = d.asset),
                            (SELECT a.id FROM {{ns}}.asset a WHERE a.uri = d.asset)) AS id
              FROM (SELECT DISTINCT u.asset FROM unnest(v_assets) AS u(asset)) d
           ) r ON r.asset = n.asset;

    SELECT n.ord, n.asset INTO v_bad
      FROM unnest(v_assets, v_asset_ids) WITH ORDINALITY AS n(asset, id, ord)
     WHERE n.id IS NULL
     ORDER BY n.ord
     LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION 'unknown asset % (event % of the batch)', quote_nullable(v_bad.asset), v_bad.ord
            USING ERRCODE = 'AQ001',
                  HINT = 'Declare the asset first (assetq.declare_asset) or name it in a consumer condition.';
    END IF;

    -- Aliases: created if new and resolved to their item's asset before the insert, so that
    -- the fan-out below sees the resolution. Sorted, so concurrent batches lock in one order.
    IF EXISTS (SELECT 1 FROM unnest(v_aliases) AS x(a) WHERE x.a IS NOT NULL) THEN
        INSERT INTO {{ns}}.asset_alias (name)
        SELECT DISTINCT n
          FROM unnest(v_aliases) AS x(a), jsonb_array_elements_text(x.a) n
         ORDER BY n
        ON CONFLICT (name) DO NOTHING;
        INSERT INTO {{ns}}.asset_alias_asset (alias_id, asset_id)
        SELECT DISTINCT al.id, t.asset_id
          FROM unnest(v_asset_ids, v_aliases) AS t(asset_id, a),
               jsonb_array_elements_text(t.a) n
          JOIN {{ns}}.asset_alias al ON al.name = n
         ORDER BY 1, 2
        ON CONFLICT DO NOTHING;
    END IF;

    -- asset_event_id_seq is the identity sequence of asset_event.id (PostgreSQL's name for it).
    v_ids := ARRAY(SELECT nextval('{{ns}}.asset_event_id_seq') FROM generate_series(1, v_count) ORDER BY 1);
    v_now := clock_timestamp();

    INSERT INTO {{ns}}.asset_event AS e
           (id, asset_id, extra, source_dag_id, source_task_id, source_run_id, source_map_index,
            idempotency_key, "timestamp", partition_key)
    SELECT t.id, t.asset_id, t.extra, t.dag_id, t.task_id, t.run_id, t.map_index, t.key, v_now,
           t.part
      FROM unnest(v_ids, v_asset_ids, v_extras, v_dag_ids, v_task_ids, v_run_ids, v_indexes, v_keys,
                  v_parts)
           WITH ORDINALITY AS t(id, asset_id, extra, dag_id, task_id, run_id, map_index, key, part, ord)
     ORDER BY t.ord
    ON CONFLICT (asset_id, idempotency_key) DO NOTHING;

    -- An item whose own id was not inserted met an event with its key: a committed one (ON
    -- CONFLICT waited for its transaction) or an earlier item of this batch. A retry must
    -- repeat the extra and the partition key.
    SELECT t.ord, t.key, e.id INTO v_bad
      FROM unnest(v_ids, v_asset_ids, v_extras, v_keys, v_parts)
           WITH ORDINALITY AS t(id, asset_id, extra, key, part, ord)
      JOIN {{ns}}.asset_event e ON e.asset_id = t.asset_id AND e.idempotency_key = t.key
     WHERE e.id <> t.id
       AND (e.extra IS DISTINCT FROM t.extra OR e.partition_key IS DISTINCT FROM t.part)
     ORDER BY t.ord
     LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION 'idempotency key % was already used for event % of this asset with a different extra (event % of the batch)',
                quote_literal(v_bad.key), v_bad.id, v_bad.ord
            USING ERRCODE = 'AQ005',
                  HINT = 'Reuse a key only to retry the very same registration.';
    END IF;

    -- The aliases of the events this call created (an item's own id exists only if it was).
    IF EXISTS (SELECT 1 FROM unnest(v_aliases) AS x(a) WHERE x.a IS NOT NULL) THEN
        INSERT INTO {{ns}}.asset_event_alias (asset_event_id, alias_id)
        SELECT DISTINCT e.id, al.id
          FROM unnest(v_ids, v_aliases) AS t(id, a)
          JOIN {{ns}}.asset_event e ON e.id = t.id,
               jsonb_array_elements_text(t.a) n
          JOIN {{ns}}.asset_alias al ON al.name = n
        ON CONFLICT DO NOTHING;
    END IF;

    RETURN QUERY
    SELECT t.ord::integer, e.id, e.asset_id, e."timestamp", e.id = t.id
      FROM unnest(v_ids, v_asset_ids, v_keys) WITH ORDINALITY AS t(id, asset_id, key, ord)
      JOIN {{ns}}.asset_event e
        ON e.id = CASE WHEN t.key IS NULL THEN t.id
                       ELSE (SELECT k.id FROM {{ns}}.asset_event k
                              WHERE k.asset_id = t.asset_id AND k.idempotency_key = t.key) END
     ORDER BY t.ord;
END
$$;

CREATE OR REPLACE FUNCTION {{ns}}.declare_dag(
    p_dag_id             text,
    p_condition          jsonb,
    p_clauses            jsonb,
    p_paused             boolean DEFAULT NULL,
    p_max_active_runs    integer DEFAULT NULL,
    p_max_events_per_run integer DEFAULT NULL,
    p_queue_while_paused boolean DEFAULT NULL,
    p_max_attempts       integer DEFAULT NULL,
    p_retry_delay_seconds     double precision DEFAULT NULL,
    p_max_retry_delay_seconds double precision DEFAULT NULL
) RETURNS void
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_clause_nos integer[];
    v_kinds      text[];
    v_values     text[];
BEGIN
    IF p_dag_id IS NULL OR p_dag_id !~ '^[A-Za-z0-9_.-]+$' OR length(p_dag_id) > 250 THEN
        RAISE EXCEPTION 'invalid dag id %: use 1 to 250 letters, digits, "_", "." or "-"',
                quote_nullable(p_dag_id)
            USING ERRCODE = 'AQ002';
    END IF;
    IF p_max_active_runs < 1 OR p_max_events_per_run < 1 THEN
        RAISE EXCEPTION 'max_active_runs and max_events_per_run must be positive or NULL, got % and %',
                quote_nullable(p_max_active_runs), quote_nullable(p_max_events_per_run)
            USING ERRCODE = 'AQ002';
    END IF;
    -- Retries (migration 0006_work_queue): NULL means the default, one attempt and no delay.
    -- NOT (x >= 0) also refuses NaN.
    IF p_max_attempts < 1 OR p_max_attempts > 1000
       OR NOT (coalesce(p_retry_delay_seconds, 0) >= 0 AND coalesce(p_retry_delay_seconds, 0) <= 604800)
       OR NOT (coalesce(p_max_retry_delay_seconds, 1) > 0 AND coalesce(p_max_retry_delay_seconds, 1) <= 604800)
       OR p_max_retry_delay_seconds < p_retry_delay_seconds
    THEN
        RAISE EXCEPTION 'max_attempts must be 1 to 1000, retry_delay 0 to 604800 seconds and max_retry_delay above 0, at least retry_delay and at most 604800 seconds; got %, % and %',
                quote_nullable(p_max_attempts), quote_nullable(p_retry_delay_seconds),
                quote_nullable(p_max_retry_delay_seconds)
            USING ERRCODE = 'AQ002';
    END IF;
    IF p_condition IS NULL THEN
        RAISE EXCEPTION 'condition of dag % is missing', p_dag_id USING ERRCODE = 'AQ004';
    END IF;
    IF jsonb_typeof(p_clauses) IS DISTINCT FROM 'array' OR jsonb_array_length(p_clauses) = 0
       OR EXISTS (SELECT 1 FROM jsonb_array_elements(p_clauses) c
                   WHERE jsonb_typeof(c) <> 'array' OR jsonb_array_length(c) = 0)
    THEN
        RAISE EXCEPTION 'condition clauses of dag % must be a non-empty array of non-empty arrays', p_dag_id
            USING ERRCODE = 'AQ004';
    END IF;

    -- Members as (clause, kind, value); kind 'any' for a plain string.
    SELECT array_agg(c.ord::integer ORDER BY c.ord),
           array_agg(CASE jsonb_typeof(n)
                         WHEN 'string' THEN 'any'
                         WHEN 'object' THEN (SELECT min(k) FROM jsonb_object_keys(n) k)
                     END ORDER BY c.ord),
           array_agg(CASE jsonb_typeof(n)
                         WHEN 'string' THEN n #>> '{}'
                         WHEN 'object' THEN (SELECT min(v.value) FROM jsonb_each_text(n) v)
                     END ORDER BY c.ord)
      INTO v_clause_nos, v_kinds, v_values
      FROM jsonb_array_elements(p_clauses) WITH ORDINALITY AS c(clause, ord),
           jsonb_array_elements(c.clause) n
     WHERE jsonb_typeof(n) <> 'object' OR (SELECT count(*) FROM jsonb_object_keys(n)) = 1;
    IF coalesce(cardinality(v_kinds), 0) <> (SELECT sum(jsonb_array_length(c)) FROM jsonb_array_elements(p_clauses) c)
       OR EXISTS (SELECT 1 FROM unnest(v_kinds, v_values) AS m(kind, value)
                   WHERE m.kind IS NULL OR m.kind NOT IN ('any', 'name', 'uri', 'alias')
                      OR m.value IS NULL OR m.value = '' OR length(m.value) > 512)
    THEN
        RAISE EXCEPTION 'condition clauses of dag % may hold only asset names or uris (1 to 512 characters), {"name": ...}, {"uri": ...} or {"alias": ...}', p_dag_id
            USING ERRCODE = 'AQ004';
    END IF;

    -- Lock (or create) the consumer row first: every later statement runs under it.
    INSERT INTO {{ns}}.dag AS d (dag_id, condition, is_paused, max_active_runs,
                                 max_events_per_run, queue_while_paused, max_attempts,
                                 retry_delay_seconds, max_retry_delay_seconds)
    VALUES (p_dag_id, p_condition, coalesce(p_paused, false), p_max_active_runs,
            p_max_events_per_run, coalesce(p_queue_while_paused, false),
            coalesce(p_max_attempts, 1), coalesce(p_retry_delay_seconds, 0),
            p_max_retry_delay_seconds)
    ON CONFLICT (dag_id) DO UPDATE
       SET condition = EXCLUDED.condition,
           is_paused = coalesce(p_paused, d.is_paused),
           max_active_runs = EXCLUDED.max_active_runs,
           max_events_per_run = EXCLUDED.max_events_per_run,
           queue_while_paused = EXCLUDED.queue_while_paused,
           max_attempts = EXCLUDED.max_attempts,
           retry_delay_seconds = EXCLUDED.retry_delay_seconds,
           max_retry_delay_seconds = EXCLUDED.max_retry_delay_seconds,
           updated_at = clock_timestamp();

    -- Create what does not exist yet, sorted, so concurrent declarations lock in one order.
    INSERT INTO {{ns}}.asset (name, uri, declared)
    SELECT DISTINCT m.value, CASE WHEN m.kind = 'uri' THEN m.value END, false
      FROM unnest(v_kinds, v_values) AS m(kind, value)
     WHERE m.kind <> 'alias'
       AND NOT EXISTS (SELECT 1 FROM {{ns}}.asset a
                        WHERE (m.kind IN ('any', 'name') AND a.name = m.value)
                           OR (m.kind IN ('any', 'uri') AND a.uri = m.value)
                           OR (m.kind = 'uri' AND a.name = m.value))
     ORDER BY 1
    ON CONFLICT DO NOTHING;
    INSERT INTO {{ns}}.asset_alias (name)
    SELECT DISTINCT m.value
      FROM unnest(v_kinds, v_values) AS m(kind, value)
     WHERE m.kind = 'alias'
     ORDER BY 1
    ON CONFLICT (name) DO NOTHING;

    DELETE FROM {{ns}}.dag_condition_clause WHERE dag_id = p_dag_id;
    DELETE FROM {{ns}}.dag_condition_alias WHERE dag_id = p_dag_id;
    -- Resolution: "x" by name then uri; {"name"} by name; {"uri"} by uri then by name (the
    -- asset created above for it is named by the uri).
    INSERT INTO {{ns}}.dag_condition_clause (dag_id, clause_no, asset_id)
    SELECT DISTINCT p_dag_id, m.clause_no,
           CASE m.kind
               WHEN 'any' THEN {{ns}}.resolve_asset(m.value)
               WHEN 'name' THEN (SELECT a.id FROM {{ns}}.asset a WHERE a.name = m.value)
               ELSE coalesce((SELECT a.id FROM {{ns}}.asset a WHERE a.uri = m.value),
                             (SELECT a.id FROM {{ns}}.asset a WHERE a.name = m.value))
           END
      FROM unnest(v_clause_nos, v_kinds, v_values) AS m(clause_no, kind, value)
     WHERE m.kind <> 'alias';
    INSERT INTO {{ns}}.dag_condition_alias (dag_id, clause_no, alias_id)
    SELECT DISTINCT p_dag_id, m.clause_no, al.id
      FROM unnest(v_clause_nos, v_kinds, v_values) AS m(clause_no, kind, value)
      JOIN {{ns}}.asset_alias al ON al.name = m.value
     WHERE m.kind = 'alias';

    DELETE FROM {{ns}}.dag_schedule_asset_reference r
     WHERE r.dag_id = p_dag_id
       AND NOT EXISTS (SELECT 1 FROM {{ns}}.dag_condition_clause c
                        WHERE c.dag_id = p_dag_id AND c.asset_id = r.asset_id);
    -- A new asset of a partitioned consumer maps by identity until set_dag_partitions says
    -- otherwise (migration 0009_partitions): its events are never queued without a key.
    INSERT INTO {{ns}}.dag_schedule_asset_reference (asset_id, dag_id, partition_mapping,
                                                     partition_require)
    SELECT DISTINCT c.asset_id, p_dag_id,
           CASE WHEN d.partitioning IS NOT NULL THEN 'identity' END,
           CASE WHEN d.partitioning IS NOT NULL THEN 'any' END
      FROM {{ns}}.dag_condition_clause c
      JOIN {{ns}}.dag d ON d.dag_id = c.dag_id
     WHERE c.dag_id = p_dag_id
    ON CONFLICT DO NOTHING;

    -- Rows queued for assets the consumer no longer depends on would never count towards its
    -- condition: they go. (A producer whose statement read the old references before this
    -- commits may still queue one; the next run consumes it with the others.)
    DELETE FROM {{ns}}.asset_dag_run_queue q
     WHERE q.target_dag_id = p_dag_id
       AND NOT EXISTS (SELECT 1 FROM {{ns}}.dag_clause_members(p_dag_id) m
                        WHERE m.asset_id = q.asset_id);
    -- And their partition rows (migration 0009_partitions).
    DELETE FROM {{ns}}.asset_partition_queue p
     WHERE p.target_dag_id = p_dag_id
       AND NOT EXISTS (SELECT 1 FROM {{ns}}.asset_dag_run_queue q
                        WHERE q.target_dag_id = p.target_dag_id
                          AND q.asset_event_id = p.asset_event_id);
END
$$;

CREATE OR REPLACE FUNCTION {{ns}}.delete_asset(p_asset text)
RETURNS TABLE (deleted_events bigint)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_id   bigint;
    v_dags text;
BEGIN
    v_id := {{ns}}.resolve_asset(p_asset);
    PERFORM 1 FROM {{ns}}.asset a WHERE a.id = v_id FOR UPDATE;
    SELECT string_agg(quote_literal(x.dag_id), ', ' ORDER BY x.dag_id) INTO v_dags
      FROM (SELECT DISTINCT c.dag_id FROM {{ns}}.dag_condition_clause c
             WHERE c.asset_id = v_id ORDER BY c.dag_id LIMIT 5) x;
    IF v_dags IS NOT NULL THEN
        RAISE EXCEPTION 'asset % is in the condition of dag %', quote_literal(p_asset), v_dags
            USING ERRCODE = 'AQ007',
                  HINT = 'Re-declare (or delete) those consumers without it first.';
    END IF;
    DELETE FROM {{ns}}.asset_dag_run_queue q WHERE q.asset_id = v_id;
    -- Their partition rows (migration 0009_partitions): no index by asset, a scan of the
    -- partitioned consumers' queue rows; deleting an asset is rare.
    DELETE FROM {{ns}}.asset_partition_queue p WHERE p.asset_id = v_id;
    DELETE FROM {{ns}}.asset_event e WHERE e.asset_id = v_id;
    GET DIAGNOSTICS deleted_events = ROW_COUNT;
    -- No reference row names it either: references are the conditions' assets, checked above.
    DELETE FROM {{ns}}.asset a WHERE a.id = v_id;
    RETURN NEXT;
END
$$;

-- The roles that may execute the functions dropped and created again below, saved first
-- (DROP FUNCTION takes their grants with it).
CREATE TEMPORARY TABLE _assetq_0009_grants ON COMMIT DROP AS
SELECT p.proname::text AS routine, pg_catalog.pg_get_userbyid(a.grantee) AS grantee
  FROM pg_catalog.pg_proc p, pg_catalog.aclexplode(p.proacl) a
 WHERE p.pronamespace = '{{ns}}'::regnamespace
   AND p.proname IN ('schedule_pass', 'set_run_state', 'claim_runs', 'complete_run', 'retry_run')
   AND a.privilege_type = 'EXECUTE' AND a.grantee <> p.proowner AND a.grantee <> 0;

DROP FUNCTION {{ns}}.schedule_pass(integer), {{ns}}.set_run_state(text, text, text), {{ns}}.claim_runs(text, integer, double precision, jsonb), {{ns}}.complete_run(text, text, integer, text, text, jsonb), {{ns}}.retry_run(text, text);

CREATE FUNCTION {{ns}}.schedule_pass(p_limit integer DEFAULT 100)
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
#variable_conflict use_column
DECLARE
    v_dag       record;
    v_ids       bigint[];
    v_assets    bigint[];
    v_times     timestamptz[];
    v_claim     integer[];
    v_chosen    bigint[];
    v_wids      bigint[];
    v_wtimes    timestamptz[];
    v_pick_id   bigint;
    v_pick_time timestamptz;
    v_cap       integer;
    v_try       bigint[];
    v_pick      bigint;
    v_clause    integer;
    v_events    bigint[];
    v_run_after timestamptz;
    v_trigger   bigint;
    v_seq       bigint;
    v_deleted   bigint;
    v_now       timestamptz;
    v_run_pk    bigint;
    v_n         integer;
BEGIN
    IF p_limit IS NULL OR p_limit < 1 THEN
        RAISE EXCEPTION 'limit must be a positive integer, got %', quote_nullable(p_limit)
            USING ERRCODE = 'AQ002';
    END IF;

    -- I10: a run whose last attempt's lease expired is failed by the next pass (and by the
    -- next claim), whatever its consumer's state: at most 100 per pass, oldest lease first,
    -- found through dag_run_lease_idx (running runs only); rows a worker is completing right
    -- now are skipped, not waited for.
    -- = ANY (ARRAY(...)), not IN (...): as a join, planning the statement probed the ends of
    -- dag_run's id index (the planner's estimate of a merge join), reads of the run history
    -- that varied with its visibility map (migration 0008_claim_plans).
    UPDATE {{ns}}.dag_run r
       SET state = 'failed', ended_at = clock_timestamp(), updated_at = clock_timestamp(),
           not_before = NULL, lease_until = NULL,
           error = format('the lease of attempt %s (worker %s) expired at %s and no attempt is left (max_attempts %s)',
                          r.attempt, r.worker, r.lease_until, d.max_attempts)
      FROM {{ns}}.dag d
     WHERE d.dag_id = r.dag_id
       AND r.id = ANY (ARRAY(SELECT x.id
                               FROM {{ns}}.dag_run x
                               JOIN {{ns}}.dag xd ON xd.dag_id = x.dag_id
                              WHERE x.state = 'running' AND x.not_before <= clock_timestamp()
                                AND x.attempt >= xd.max_attempts
                              ORDER BY x.not_before
                              LIMIT 100
                                FOR NO KEY UPDATE OF x SKIP LOCKED));

    -- FOR NO KEY UPDATE, not FOR UPDATE: every in-flight producer holds a KEY SHARE lock on
    -- the consumer row through the queue's foreign key. FOR UPDATE conflicts with it, so the
    -- pass would skip every busy consumer (measured: p99 latency 40 ms -> 2.7 s).
    -- SKIP LOCKED: concurrent passes split the consumers between them instead of waiting (I5).
    FOR v_dag IN
        SELECT d.dag_id, d.max_active_runs, d.max_events_per_run, d.max_attempts,
               d.partitioning IS NOT NULL AS partitioned
          FROM {{ns}}.dag d
         WHERE NOT d.is_paused
           -- A probe of each consumer's queue by key. OFFSET 0 keeps the planner from
           -- turning it into a join, which read the whole queue (a hash of every queued
           -- row) on every pass: a pass must not cost the backlog (issue 16). A partitioned
           -- consumer has work only when a row arrived that no pass has examined yet
           -- (migration 0009_partitions): its keys waiting for other assets cost nothing.
           AND CASE WHEN d.partitioning IS NULL
                    THEN EXISTS (SELECT 1 FROM {{ns}}.asset_dag_run_queue q
                                  WHERE q.target_dag_id = d.dag_id OFFSET 0)
                    ELSE EXISTS (SELECT 1 FROM {{ns}}.asset_partition_queue p
                                  WHERE p.target_dag_id = d.dag_id AND NOT p.examined OFFSET 0)
               END
         ORDER BY d.last_scheduled_at NULLS FIRST, d.dag_id
         LIMIT p_limit
           FOR NO KEY UPDATE OF d SKIP LOCKED
    LOOP
        v_now := clock_timestamp();

        -- At its cap: no run, the queue stays whole. Runs become active only in a pass holding
        -- this lock, so the count can only be too high (a run finishing meanwhile), never too low.
        -- First, a run whose last attempt's lease expired is failed (I10: a worker that died on
        -- its last attempt must not hold the cap for good; claim_runs does the same). Rows a
        -- worker is completing right now are skipped, not waited for.
        IF v_dag.max_active_runs IS NOT NULL THEN
            UPDATE {{ns}}.dag_run r
               SET state = 'failed', ended_at = v_now, updated_at = v_now, not_before = NULL,
                   lease_until = NULL,
                   error = format('the lease of attempt %s (worker %s) expired at %s and no attempt is left (max_attempts %s)',
                                  r.attempt, r.worker, r.lease_until, v_dag.max_attempts)
             WHERE r.id = ANY (ARRAY(SELECT x.id FROM {{ns}}.dag_run x
                                      WHERE x.dag_id = v_dag.dag_id AND x.state = 'running'
                                        AND x.not_before <= v_now AND x.attempt >= v_dag.max_attempts
                                        FOR NO KEY UPDATE SKIP LOCKED));
        END IF;
        IF v_dag.max_active_runs IS NOT NULL
           AND (SELECT count(*) FROM {{ns}}.dag_run r
                 WHERE r.dag_id = v_dag.dag_id AND r.state IN ('queued', 'running'))
               >= v_dag.max_active_runs
        THEN
            UPDATE {{ns}}.dag d SET last_scheduled_at = v_now WHERE d.dag_id = v_dag.dag_id;
            CONTINUE;
        END IF;

        -- A partitioned consumer: a run per partition key whose events satisfy the condition.
        IF v_dag.partitioned THEN
            RETURN QUERY
            SELECT * FROM {{ns}}.schedule_partitions(v_dag.dag_id, v_dag.max_active_runs,
                                                     v_dag.max_events_per_run, v_now);
            CONTINUE;
        END IF;

        -- The claim. This statement's snapshot is taken after the lock above, so it sees
        -- every row committed so far, including those of a pass that held this consumer a
        -- moment ago (and deleted its rows). A row committed after this read is simply not
        -- in the claim and waits for the next pass: selection is by reference, never by time.
        -- Uncapped, the claim is the whole queue. Capped at N = max_events_per_run, only the
        -- N + 1 oldest rows are read, in queue order through asset_dag_run_queue_order_idx:
        -- a capped run costs what it consumes, never the backlog behind it (issue 16).
        v_cap := v_dag.max_events_per_run;
        IF v_cap IS NULL THEN
            SELECT array_agg(q.asset_event_id ORDER BY q.created_at, q.asset_event_id),
                   array_agg(q.asset_id ORDER BY q.created_at, q.asset_event_id),
                   array_agg(q.created_at ORDER BY q.created_at, q.asset_event_id)
              INTO v_ids, v_assets, v_times
              FROM {{ns}}.asset_dag_run_queue q
             WHERE q.target_dag_id = v_dag.dag_id;
        ELSE
            SELECT array_agg(o.asset_event_id ORDER BY o.created_at, o.asset_event_id),
                   array_agg(o.asset_id ORDER BY o.created_at, o.asset_event_id),
                   array_agg(o.created_at ORDER BY o.created_at, o.asset_event_id)
              INTO v_ids, v_assets, v_times
              FROM (SELECT q.asset_event_id, q.asset_id, q.created_at
                      FROM {{ns}}.asset_dag_run_queue q
                     WHERE q.target_dag_id = v_dag.dag_id
                     ORDER BY q.created_at, q.asset_event_id
                     LIMIT v_cap + 1) o;
        END IF;
        v_n := coalesce(cardinality(v_ids), 0);

        -- Nothing queued, or no clause to satisfy: no run.
        IF v_n = 0
           OR NOT EXISTS (SELECT 1 FROM {{ns}}.dag_condition_clause c WHERE c.dag_id = v_dag.dag_id
                          UNION ALL
                          SELECT 1 FROM {{ns}}.dag_condition_alias ca WHERE ca.dag_id = v_dag.dag_id)
        THEN
            UPDATE {{ns}}.dag d SET last_scheduled_at = v_now WHERE d.dag_id = v_dag.dag_id;
            CONTINUE;
        END IF;

        v_claim := NULL;
        v_wids := '{}';
        v_wtimes := '{}';
        IF v_cap IS NULL OR v_n <= v_cap THEN
            -- The whole queue. I6: every clause of the condition needs a member among the
            -- claimed rows' assets. Written out here rather than calling condition_holds:
            -- PL/pgSQL keeps this plan, a SQL function is planned again on every call, and
            -- this runs for every consumer.
            IF EXISTS (SELECT 1
                         FROM (SELECT c.clause_no, c.asset_id
                                 FROM {{ns}}.dag_condition_clause c
                                WHERE c.dag_id = v_dag.dag_id
                               UNION ALL
                               SELECT ca.clause_no, aa.asset_id
                                 FROM {{ns}}.dag_condition_alias ca
                                 LEFT JOIN {{ns}}.asset_alias_asset aa ON aa.alias_id = ca.alias_id
                                WHERE ca.dag_id = v_dag.dag_id) m
                        GROUP BY m.clause_no
                       HAVING NOT coalesce(bool_or(m.asset_id = ANY (v_assets)), false))
            THEN
                UPDATE {{ns}}.dag d SET last_scheduled_at = v_now WHERE d.dag_id = v_dag.dag_id;
                CONTINUE;
            END IF;
        ELSIF {{ns}}.condition_holds(v_dag.dag_id, v_assets[1:v_cap]) THEN
            v_claim := ARRAY(SELECT generate_series(1, v_cap));  -- the N oldest rows
        ELSE
            -- The N oldest rows do not satisfy the condition. Greedy witnesses over the whole
            -- queue, by index (asset_dag_run_queue_asset_idx): for each clause not yet hit,
            -- the member asset whose oldest queued row is the oldest, and that row. A clause
            -- with no queued member: the whole queue does not satisfy the condition, no run.
            v_chosen := '{}';
            v_pick := 0;
            FOR v_clause IN
                SELECT DISTINCT m.clause_no FROM {{ns}}.dag_clause_members(v_dag.dag_id) m ORDER BY 1
            LOOP
                CONTINUE WHEN EXISTS (SELECT 1 FROM {{ns}}.dag_clause_members(v_dag.dag_id) m
                                       WHERE m.clause_no = v_clause AND m.asset_id = ANY (v_chosen));
                SELECT m.asset_id, o.asset_event_id, o.created_at INTO v_pick, v_pick_id, v_pick_time
                  FROM (SELECT DISTINCT x.asset_id
                          FROM {{ns}}.dag_clause_members(v_dag.dag_id) x
                         WHERE x.clause_no = v_clause AND x.asset_id IS NOT NULL) m
                  CROSS JOIN LATERAL (
                        SELECT q.asset_event_id, q.created_at
                          FROM {{ns}}.asset_dag_run_queue q
                         WHERE q.target_dag_id = v_dag.dag_id AND q.asset_id = m.asset_id
                         ORDER BY q.created_at, q.asset_event_id
                         LIMIT 1) o
                 ORDER BY o.created_at, o.asset_event_id
                 LIMIT 1;
                EXIT WHEN v_pick IS NULL;
                v_chosen := v_chosen || v_pick;
                v_wids := v_wids || v_pick_id;
                v_wtimes := v_wtimes || v_pick_time;
            END LOOP;
            IF v_pick IS NULL THEN
                UPDATE {{ns}}.dag d SET last_scheduled_at = v_now WHERE d.dag_id = v_dag.dag_id;
                CONTINUE;
            END IF;
            -- Prune, newest choice first: what is left is a minimal set of assets.
            FOR i IN REVERSE cardinality(v_chosen)..1 LOOP
                v_try := v_chosen[1:i - 1] || v_chosen[i + 1:];
                IF {{ns}}.condition_holds(v_dag.dag_id, v_try) THEN
                    v_chosen := v_try;
                    v_wids := v_wids[1:i - 1] || v_wids[i + 1:];
                    v_wtimes := v_wtimes[1:i - 1] || v_wtimes[i + 1:];
                END IF;
            END LOOP;
            -- The witness rows, then the oldest others, N in all (more only if the witnesses
            -- alone are more). The others come from the N oldest rows read above: at most N
            -- minus the witnesses are needed, and that many are among them.
            v_claim := ARRAY(SELECT u.pos
                               FROM unnest(v_ids) WITH ORDINALITY AS u(id, pos)
                              WHERE u.id <> ALL (v_wids)
                              ORDER BY u.pos
                              LIMIT greatest(v_cap - cardinality(v_wids), 0));
        END IF;

        -- The claimed rows. The newest (latest timestamp, then highest id) is the triggering
        -- event; the whole queue and the N oldest rows are in queue order, so it is the last.
        IF v_claim IS NULL THEN
            v_events := ARRAY(SELECT u.id FROM unnest(v_ids) AS u(id) ORDER BY u.id);
            v_run_after := v_times[v_n];
            v_trigger := v_ids[v_n];
        ELSIF cardinality(v_wids) = 0 THEN
            v_events := ARRAY(SELECT v_ids[p] FROM unnest(v_claim) AS p ORDER BY 1);
            v_run_after := v_times[v_claim[cardinality(v_claim)]];
            v_trigger := v_ids[v_claim[cardinality(v_claim)]];
        ELSE
            SELECT array_agg(c.id ORDER BY c.id),
                   (array_agg(c.t ORDER BY c.t DESC, c.id DESC))[1],
                   (array_agg(c.id ORDER BY c.t DESC, c.id DESC))[1]
              INTO v_events, v_run_after, v_trigger
              FROM (SELECT v_ids[p] AS id, v_times[p] AS t FROM unnest(v_claim) AS p
                    UNION
                    SELECT w.id, w.t FROM unnest(v_wids, v_wtimes) AS w(id, t)) c;
        END IF;


        UPDATE {{ns}}.dag d
           SET last_run_seq = d.last_run_seq + 1, last_scheduled_at = v_now
         WHERE d.dag_id = v_dag.dag_id
        RETURNING d.last_run_seq INTO v_seq;

        -- not_before: claimable by workers (claim_runs) from now on.
        INSERT INTO {{ns}}.dag_run AS r (dag_id, run_id, seq, run_after, created_at,
                                         triggering_event_id, event_count, not_before)
        VALUES (v_dag.dag_id,
                'asset_triggered__'
                    || to_char(v_run_after AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US')
                    || '+00:00__' || v_seq,
                v_seq, v_run_after, v_now, v_trigger, cardinality(v_events), v_now)
        RETURNING r.id, r.dag_id, r.run_id, r.seq, r.run_after, r.created_at, r.state
             INTO v_run_pk, dag_id, run_id, seq, run_after, created_at, state;

        -- Delete exactly the claimed rows, by primary key (I3). The claim guard (I4): if any
        -- claimed row is gone, someone else consumed it (or delete_asset removed its event);
        -- abort the whole pass. Before the links: a link to an event deleted meanwhile would
        -- fail its foreign key, an error no retry is made for; the guard's AQ900 is retried.
        DELETE FROM {{ns}}.asset_dag_run_queue q
         WHERE q.target_dag_id = v_dag.dag_id
           AND q.asset_event_id = ANY (v_events);
        GET DIAGNOSTICS v_deleted = ROW_COUNT;
        IF v_deleted <> cardinality(v_events) THEN
            RAISE EXCEPTION 'claim guard: dag % claimed % queue rows but deleted %',
                    v_dag.dag_id, cardinality(v_events), v_deleted
                USING ERRCODE = 'AQ900',
                      HINT = 'The pass was rolled back; it is safe to run it again.';
        END IF;

        INSERT INTO {{ns}}.dagrun_asset_event (dag_run_id, asset_event_id, dag_id)
        SELECT v_run_pk, e, v_dag.dag_id FROM unnest(v_events) AS e;

        dag_run_id := v_run_pk;
        event_ids := v_events;
        triggering_event_id := v_trigger;
        partition_key := NULL;
        RETURN NEXT;
    END LOOP;
END
$$;

CREATE FUNCTION {{ns}}.set_run_state(p_dag_id text, p_run_id text, p_state text)
RETURNS TABLE (
    dag_run_id          bigint,
    dag_id              varchar,
    run_id              varchar,
    seq                 bigint,
    state               varchar,
    run_after           timestamptz,
    created_at          timestamptz,
    started_at          timestamptz,
    ended_at            timestamptz,
    triggering_event_id bigint,
    event_count         integer,
    attempt             integer,
    worker              varchar,
    lease_until         timestamptz,
    not_before          timestamptz,
    error               text,
    partition_key       varchar
)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_id      bigint;
    v_old     text;
    v_worker  text;
    v_attempt integer;
    v_lease   timestamptz;
BEGIN
    IF p_state IS NULL OR p_state NOT IN ('queued', 'running', 'success', 'failed') THEN
        RAISE EXCEPTION 'unknown run state %: use queued, running, success or failed', quote_nullable(p_state)
            USING ERRCODE = 'AQ008';
    END IF;
    SELECT r.id, r.state, r.worker, r.attempt, r.lease_until
      INTO v_id, v_old, v_worker, v_attempt, v_lease
      FROM {{ns}}.dag_run r
     WHERE r.dag_id = p_dag_id AND r.run_id = p_run_id
       FOR NO KEY UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'unknown run % of dag %', quote_nullable(p_run_id), quote_nullable(p_dag_id)
            USING ERRCODE = 'AQ006';
    END IF;
    -- A run a worker holds (claimed by claim_runs: running under a lease) is finished by that
    -- worker's complete_run, fenced by its attempt (I8): moving it here would let a second
    -- party finish a run someone holds. A run moved to running by hand has no lease.
    IF v_old = 'running' AND v_lease IS NOT NULL AND v_old <> p_state THEN
        RAISE EXCEPTION 'run % of dag % is held by worker % (attempt %): its worker completes it (assetq.complete_run)',
                p_run_id, p_dag_id, quote_literal(v_worker), v_attempt
            USING ERRCODE = 'AQ008',
                  HINT = 'If the worker died, the run is claimed again when its lease expires.';
    END IF;
    IF v_old <> p_state THEN
        IF NOT ((v_old = 'queued' AND p_state IN ('running', 'success', 'failed'))
                OR (v_old = 'running' AND p_state IN ('success', 'failed'))) THEN
            RAISE EXCEPTION 'run % of dag % is %: it cannot move to %', p_run_id, p_dag_id, v_old, p_state
                USING ERRCODE = 'AQ008',
                      HINT = 'Runs move queued -> running -> success or failed; success and failed are final.';
        END IF;
        UPDATE {{ns}}.dag_run r
           SET state = p_state,
               started_at = CASE WHEN p_state = 'running' THEN clock_timestamp() ELSE r.started_at END,
               ended_at = CASE WHEN p_state IN ('success', 'failed') THEN clock_timestamp() ELSE r.ended_at END,
               updated_at = clock_timestamp(),
               -- Leaving queued by hand: no worker may claim it any more.
               not_before = NULL,
               lease_until = NULL
         WHERE r.id = v_id;
    END IF;
    RETURN QUERY
    SELECT r.id, r.dag_id, r.run_id, r.seq, r.state, r.run_after, r.created_at, r.started_at,
           r.ended_at, r.triggering_event_id, r.event_count, r.attempt, r.worker, r.lease_until,
           r.not_before, r.error, r.partition_key
      FROM {{ns}}.dag_run r
     WHERE r.id = v_id;
END
$$;

CREATE FUNCTION {{ns}}.claim_runs(
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
BEGIN
    IF p_worker IS NULL OR p_worker = '' OR length(p_worker) > 250 THEN
        RAISE EXCEPTION 'worker must be a name of 1 to 250 characters, got %', quote_nullable(left(p_worker, 60))
            USING ERRCODE = 'AQ002';
    END IF;
    IF p_limit IS NULL OR p_limit < 1 OR p_limit > 1000 THEN
        RAISE EXCEPTION 'limit must be 1 to 1000, got %', quote_nullable(p_limit)
            USING ERRCODE = 'AQ002';
    END IF;
    -- NOT (... > 0): NaN is refused too.
    IF p_lease_seconds IS NULL OR NOT (p_lease_seconds > 0 AND p_lease_seconds <= 604800) THEN
        RAISE EXCEPTION 'lease must be above 0 and at most 604800 seconds, got %', quote_nullable(p_lease_seconds)
            USING ERRCODE = 'AQ002';
    END IF;
    IF p_dag_ids IS NOT NULL
       AND (jsonb_typeof(p_dag_ids) <> 'array'
            OR EXISTS (SELECT 1 FROM jsonb_array_elements(p_dag_ids) x WHERE jsonb_typeof(x) <> 'string'))
    THEN
        RAISE EXCEPTION 'dag_ids must be a JSON array of dag ids or NULL' USING ERRCODE = 'AQ002';
    END IF;
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

        -- Only a running candidate (its lease expired) may be on its last attempt: the
        -- usual claim, of queued runs only, skips this statement. The candidates are locked,
        -- so their states are the ones just read; the failed ones leave the claim's ids.
        v_failed := 0;
        IF v_running IS NOT NULL THEN
            WITH f AS (
                UPDATE {{ns}}.dag_run r
                   SET state = 'failed', ended_at = v_now, updated_at = v_now, not_before = NULL,
                       lease_until = NULL,
                       error = format('the lease of attempt %s (worker %s) expired at %s and no attempt is left (max_attempts %s)',
                                      r.attempt, r.worker, r.lease_until, d.max_attempts)
                  FROM {{ns}}.dag d
                 WHERE r.id = ANY (v_running) AND d.dag_id = r.dag_id
                   AND r.attempt >= d.max_attempts
                RETURNING r.id)
            SELECT array_agg(f.id) INTO v_gone FROM f;
            IF v_gone IS NOT NULL THEN
                v_failed := cardinality(v_gone);
                v_ids := ARRAY(SELECT i FROM unnest(v_ids) AS i WHERE i <> ALL (v_gone));
            END IF;
        END IF;

        -- By id alone: a condition on state here let the planner read the runs through
        -- dag_run_dag_state_idx instead, every queued and running run for each claim
        -- (PostgreSQL 18, whose skip scan makes that index look cheap; migration
        -- 0008_claim_plans).
        RETURN QUERY
        WITH c AS (
            UPDATE {{ns}}.dag_run r
               SET state = 'running', attempt = r.attempt + 1, worker = p_worker,
                   lease_until = v_until, not_before = v_until, started_at = v_now,
                   updated_at = v_now
             WHERE r.id = ANY (v_ids)
            RETURNING r.id, r.dag_id, r.run_id, r.seq, r.run_after, r.created_at,
                      r.triggering_event_id, r.state, r.attempt, r.worker, r.lease_until,
                      r.started_at, r.partition_key)
        SELECT c.id, c.dag_id, c.run_id, c.seq, c.run_after, c.created_at,
               ARRAY(SELECT l.asset_event_id FROM {{ns}}.dagrun_asset_event l
                      WHERE l.dag_run_id = c.id ORDER BY 1),
               c.triggering_event_id, c.state, c.attempt, c.worker, c.lease_until, c.started_at,
               c.partition_key
          FROM c
         ORDER BY c.id;
        GET DIAGNOSTICS v_claimed = ROW_COUNT;
        v_taken := v_taken + v_claimed;
        EXIT WHEN v_failed = 0 OR v_taken >= p_limit;
    END LOOP;
END
$$;

CREATE FUNCTION {{ns}}.complete_run(
    p_dag_id  text,
    p_run_id  text,
    p_attempt integer,
    p_state   text,
    p_error   text DEFAULT NULL,
    p_events  jsonb DEFAULT NULL
) RETURNS TABLE (
    dag_run_id          bigint,
    dag_id              varchar,
    run_id              varchar,
    seq                 bigint,
    state               varchar,
    run_after           timestamptz,
    created_at          timestamptz,
    started_at          timestamptz,
    ended_at            timestamptz,
    triggering_event_id bigint,
    event_count         integer,
    attempt             integer,
    worker              varchar,
    lease_until         timestamptz,
    not_before          timestamptz,
    error               text,
    output_event_ids    bigint[],
    partition_key       varchar
)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_id        bigint;
    v_state     text;
    v_attempt   integer;
    v_lease     timestamptz;
    v_max       integer;
    v_delay     double precision;
    v_cap       double precision;
    v_now       timestamptz;
    v_out       bigint[];
BEGIN
    IF p_state IS NULL OR p_state NOT IN ('success', 'failed') THEN
        RAISE EXCEPTION 'a run is completed as success or failed, got %', quote_nullable(p_state)
            USING ERRCODE = 'AQ008';
    END IF;
    IF p_state = 'failed' AND p_events IS NOT NULL AND p_events <> '[]'::jsonb THEN
        RAISE EXCEPTION 'a failed run produces no events' USING ERRCODE = 'AQ002';
    END IF;
    SELECT r.id, r.state, r.attempt, r.lease_until, d.max_attempts, d.retry_delay_seconds,
           d.max_retry_delay_seconds
      INTO v_id, v_state, v_attempt, v_lease, v_max, v_delay, v_cap
      FROM {{ns}}.dag_run r
      JOIN {{ns}}.dag d ON d.dag_id = r.dag_id
     WHERE r.dag_id = p_dag_id AND r.run_id = p_run_id
       FOR NO KEY UPDATE OF r;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'unknown run % of dag %', quote_nullable(p_run_id), quote_nullable(p_dag_id)
            USING ERRCODE = 'AQ006';
    END IF;
    IF v_state <> 'running' OR v_attempt IS DISTINCT FROM p_attempt OR v_lease IS NULL THEN
        RAISE EXCEPTION 'lease lost: run % of dag % is % at attempt %, not running at attempt %',
                p_run_id, p_dag_id, v_state, v_attempt, coalesce(CAST(p_attempt AS text), 'NULL')
            USING ERRCODE = 'AQ010',
                  HINT = 'Roll back: another worker holds it now, or it was finished; nothing was written.';
    END IF;
    v_now := clock_timestamp();
    IF p_state = 'success' THEN
        IF p_events IS NOT NULL AND p_events <> '[]'::jsonb THEN
            SELECT array_agg(e.event_id ORDER BY e.item_no) INTO v_out
              FROM {{ns}}.register_events(p_events) e;
        END IF;
        UPDATE {{ns}}.dag_run r
           SET state = 'success', ended_at = v_now, updated_at = v_now, lease_until = NULL,
               not_before = NULL
         WHERE r.id = v_id;
    ELSIF v_attempt < v_max THEN
        IF v_cap IS NOT NULL THEN
            v_delay := least(v_delay * power(2::double precision, least(v_attempt - 1, 60)), v_cap);
        END IF;
        UPDATE {{ns}}.dag_run r
           SET state = 'queued', updated_at = v_now, lease_until = NULL,
               not_before = v_now + make_interval(secs => v_delay), error = left(p_error, 4000)
         WHERE r.id = v_id;
    ELSE
        UPDATE {{ns}}.dag_run r
           SET state = 'failed', ended_at = v_now, updated_at = v_now, lease_until = NULL,
               not_before = NULL, error = left(p_error, 4000)
         WHERE r.id = v_id;
    END IF;
    RETURN QUERY
    SELECT r.id, r.dag_id, r.run_id, r.seq, r.state, r.run_after, r.created_at, r.started_at,
           r.ended_at, r.triggering_event_id, r.event_count, r.attempt, r.worker, r.lease_until,
           r.not_before, r.error, coalesce(v_out, '{}'), r.partition_key
      FROM {{ns}}.dag_run r
     WHERE r.id = v_id;
END
$$;

CREATE FUNCTION {{ns}}.retry_run(p_dag_id text, p_run_id text)
RETURNS TABLE (
    dag_run_id          bigint,
    dag_id              varchar,
    run_id              varchar,
    seq                 bigint,
    state               varchar,
    run_after           timestamptz,
    created_at          timestamptz,
    started_at          timestamptz,
    ended_at            timestamptz,
    triggering_event_id bigint,
    event_count         integer,
    attempt             integer,
    worker              varchar,
    lease_until         timestamptz,
    not_before          timestamptz,
    error               text,
    output_event_ids    bigint[],
    partition_key       varchar
)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_id    bigint;
    v_state text;
BEGIN
    SELECT r.id, r.state INTO v_id, v_state
      FROM {{ns}}.dag_run r
     WHERE r.dag_id = p_dag_id AND r.run_id = p_run_id
       FOR NO KEY UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'unknown run % of dag %', quote_nullable(p_run_id), quote_nullable(p_dag_id)
            USING ERRCODE = 'AQ006';
    END IF;
    IF v_state <> 'failed' THEN
        RAISE EXCEPTION 'run % of dag % is %: only a failed run can be retried', p_run_id, p_dag_id, v_state
            USING ERRCODE = 'AQ008';
    END IF;
    UPDATE {{ns}}.dag_run r
       SET state = 'queued', ended_at = NULL, lease_until = NULL, not_before = clock_timestamp(),
           updated_at = clock_timestamp()
     WHERE r.id = v_id;
    RETURN QUERY
    SELECT r.id, r.dag_id, r.run_id, r.seq, r.state, r.run_after, r.created_at, r.started_at,
           r.ended_at, r.triggering_event_id, r.event_count, r.attempt, r.worker, r.lease_until,
           r.not_before, r.error, CAST('{}' AS bigint[]), r.partition_key
      FROM {{ns}}.dag_run r
     WHERE r.id = v_id;
END
$$;

ALTER FUNCTION {{ns}}.schedule_pass(integer)
    SECURITY DEFINER SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION {{ns}}.set_run_state(text, text, text)
    SECURITY DEFINER SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION {{ns}}.claim_runs(text, integer, double precision, jsonb)
    SECURITY DEFINER SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION {{ns}}.complete_run(text, text, integer, text, text, jsonb)
    SECURITY DEFINER SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION {{ns}}.retry_run(text, text)
    SECURITY DEFINER SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION {{ns}}.register_events(jsonb)
    SECURITY DEFINER SET search_path = pg_catalog, pg_temp;
ALTER FUNCTION {{ns}}.claim_runs(text, integer, double precision, jsonb)
    SET plan_cache_mode = force_generic_plan;

REVOKE EXECUTE ON FUNCTION
    {{ns}}.partition_map(text, bigint, text, text),
    {{ns}}.partition_day(text),
    {{ns}}.partition_required(text, bigint, text, text, text),
    {{ns}}.partition_present(text, text, bigint[], text[]),
    {{ns}}.set_dag_partitions(text, jsonb),
    {{ns}}.schedule_partitions(text, integer, integer, timestamptz),
    {{ns}}.schedule_pass(integer),
    {{ns}}.set_run_state(text, text, text),
    {{ns}}.claim_runs(text, integer, double precision, jsonb),
    {{ns}}.complete_run(text, text, integer, text, text, jsonb),
    {{ns}}.retry_run(text, text)
    FROM PUBLIC;

-- Only the owner, and the roles given access, may execute them; those roles get their grants
-- back.
DO $$
DECLARE
    v_grant record;
BEGIN
    FOR v_grant IN SELECT g.routine, g.grantee FROM pg_temp._assetq_0009_grants g LOOP
        EXECUTE format('GRANT EXECUTE ON FUNCTION %s TO %I',
                       CASE v_grant.routine
            WHEN 'schedule_pass' THEN '{{ns}}.schedule_pass(integer)'
            WHEN 'set_run_state' THEN '{{ns}}.set_run_state(text, text, text)'
            WHEN 'claim_runs' THEN '{{ns}}.claim_runs(text, integer, double precision, jsonb)'
            WHEN 'complete_run' THEN '{{ns}}.complete_run(text, text, integer, text, text, jsonb)'
            WHEN 'retry_run' THEN '{{ns}}.retry_run(text, text)'
                       END, v_grant.grantee);
    END LOOP;
END
$$;
