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
-- Partitions. Maps partition key p_key of an event of asset
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
CREATE OR REPLACE FUNCTION {{ns}}.partition_map(
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
