-- Every statement the Python layer sends to PostgreSQL, by name.
-- Each query starts with a "-- name --" line and a one-line description; parameters are
-- SQLAlchemy binds (:name); {{ns}} is the quoted namespace. sql/mysql/queries.sql has the
-- same names with the same parameters and result columns.

-- register_event --
-- Register one event in the caller's transaction; the trigger fans it out.
SELECT event_id, asset_id, event_timestamp, created
  FROM {{ns}}.register_event(
        p_asset => :asset,
        p_extra => CAST(:extra AS jsonb),
        p_source_dag_id => :source_dag_id,
        p_source_task_id => :source_task_id,
        p_source_run_id => :source_run_id,
        p_source_map_index => :source_map_index,
        p_idempotency_key => :idempotency_key)

-- register_events --
-- Register a batch of events (a JSON array) in the caller's transaction; one row per item.
SELECT item_no, event_id, asset_id, event_timestamp, created
  FROM {{ns}}.register_events(p_events => CAST(:events AS jsonb))

-- declare_asset --
-- Create an asset, or update the uri/extra of an existing one; returns its id.
SELECT {{ns}}.declare_asset(p_name => :name, p_uri => :uri, p_extra => CAST(:extra AS jsonb)) AS asset_id

-- declare_dag --
-- Create or replace a consumer and its compiled condition.
SELECT {{ns}}.declare_dag(
        p_dag_id => :dag_id,
        p_condition => CAST(:condition AS jsonb),
        p_clauses => CAST(:clauses AS jsonb),
        p_paused => :paused)

-- set_dag_paused --
-- Pause or unpause a consumer.
SELECT {{ns}}.set_dag_paused(p_dag_id => :dag_id, p_paused => :paused)

-- scheduler_transaction --
-- First statement of a scheduler pass's transaction: the pass must run at READ COMMITTED
-- (see schedule_pass in schema.sql), whatever the session's default level is.
SET TRANSACTION ISOLATION LEVEL READ COMMITTED

-- schedule_pass --
-- One scheduler pass over at most :limit consumers; returns the runs it created.
SELECT dag_run_id, dag_id, run_id, seq, run_after, created_at, event_ids
  FROM {{ns}}.schedule_pass(p_limit => :limit)

-- create_namespace --
-- Create the namespace that holds every assetq object.
CREATE SCHEMA IF NOT EXISTS {{ns}}

-- lock_namespace --
-- Serialize installs and uninstalls of one namespace (held until the transaction ends).
SELECT 1 AS locked FROM pg_advisory_xact_lock(hashtextextended('assetq:' || :namespace, 0))

-- unlock_namespace --
-- Nothing to do: the transaction-level lock of lock_namespace ends with the transaction.
SELECT 1 AS released

-- namespace_exists --
-- 1 when the namespace exists.
SELECT count(*) AS n FROM pg_namespace WHERE nspname = :namespace

-- version_table_exists --
-- 1 when alembic's version table exists in the namespace.
SELECT count(*) AS n
  FROM pg_class c JOIN pg_namespace s ON s.oid = c.relnamespace
 WHERE s.nspname = :namespace AND c.relname = 'assetq_alembic_version' AND c.relkind = 'r'

-- drop_version_table --
-- Remove alembic's version table after a downgrade to base.
DROP TABLE IF EXISTS {{ns}}.assetq_alembic_version

-- namespace_object_count --
-- How many objects (tables, routines, types) are left in the namespace.
SELECT (SELECT count(*) FROM pg_class c JOIN pg_namespace s ON s.oid = c.relnamespace
         WHERE s.nspname = :namespace)
     + (SELECT count(*) FROM pg_proc p JOIN pg_namespace s ON s.oid = p.pronamespace
         WHERE s.nspname = :namespace)
     + (SELECT count(*) FROM pg_type t JOIN pg_namespace s ON s.oid = t.typnamespace
         WHERE s.nspname = :namespace AND t.typtype NOT IN ('c', 'b')) AS n

-- drop_namespace --
-- Drop the (empty) namespace; RESTRICT so an object someone else put there is never dropped.
DROP SCHEMA IF EXISTS {{ns}} RESTRICT
