-- Every statement the Python layer sends to MySQL/MariaDB, by name.
-- Each query starts with a "-- name --" line and a one-line description; parameters are
-- SQLAlchemy binds (:name); {{ns}} is the backquoted namespace (a MySQL database).
-- sql/postgresql/queries.sql has the same names with the same parameters and result columns.
--
-- CALL takes arguments by position only (MySQL has no named arguments): the order is the
-- procedure's parameter order in schema.sql. A CALL that returns a result set leaves one more
-- (its status) behind; the dialect drains it before the connection is used again.

-- register_event --
-- Register one event in the caller's transaction; the trigger fans it out.
CALL {{ns}}.register_event(:asset, :extra, :source_dag_id, :source_task_id, :source_run_id,
                           :source_map_index, :idempotency_key)

-- register_events --
-- Register a batch of events (a JSON array) in the caller's transaction; one row per item.
CALL {{ns}}.register_events(:events)

-- declare_asset --
-- Create an asset, or update the uri/extra of an existing one; returns its id.
CALL {{ns}}.declare_asset(:name, :uri, :extra)

-- declare_dag --
-- Create or replace a consumer and its compiled condition.
CALL {{ns}}.declare_dag(:dag_id, :condition, :clauses, :paused)

-- set_dag_paused --
-- Pause or unpause a consumer.
CALL {{ns}}.set_dag_paused(:dag_id, :paused)

-- scheduler_transaction --
-- First statement of a scheduler pass's transaction: the pass must run at READ COMMITTED
-- (see schedule_pass in schema.sql), whatever the session's default level is.
SET TRANSACTION ISOLATION LEVEL READ COMMITTED

-- schedule_pass --
-- One scheduler pass over at most :limit consumers; returns the runs it created.
CALL {{ns}}.schedule_pass(:limit)

-- create_namespace --
-- Create the database that holds every assetq object (kept as it is when it exists).
CREATE DATABASE IF NOT EXISTS {{ns}} CHARACTER SET utf8mb4 COLLATE utf8mb4_bin

-- lock_namespace --
-- Serialize installs and uninstalls of one namespace. A named lock, not a row lock: every
-- DDL statement commits, which would release a row lock half-way. It belongs to the session
-- and is released by unlock_namespace. Names are limited to 64 characters; two namespaces
-- that share a long prefix merely share the lock.
SELECT GET_LOCK(LEFT(CONCAT('assetq:', :namespace), 64), 600) AS locked

-- unlock_namespace --
-- Release the lock taken by lock_namespace.
SELECT RELEASE_LOCK(LEFT(CONCAT('assetq:', :namespace), 64)) AS released

-- namespace_exists --
-- 1 when the namespace exists.
SELECT COUNT(*) AS n FROM information_schema.SCHEMATA WHERE SCHEMA_NAME = :namespace

-- version_table_exists --
-- 1 when alembic's version table exists in the namespace.
SELECT COUNT(*) AS n
  FROM information_schema.TABLES
 WHERE TABLE_SCHEMA = :namespace AND TABLE_NAME = 'assetq_alembic_version' AND TABLE_TYPE = 'BASE TABLE'

-- drop_version_table --
-- Remove alembic's version table after a downgrade to base.
DROP TABLE IF EXISTS {{ns}}.assetq_alembic_version

-- namespace_object_count --
-- How many objects (tables, views, routines, triggers, events) are left in the namespace,
-- plus one when the namespace is the connection's own database: a user with a single
-- database installs assetq into it, and uninstall must never drop that database.
SELECT (SELECT COUNT(*) FROM information_schema.TABLES WHERE TABLE_SCHEMA = :namespace)
     + (SELECT COUNT(*) FROM information_schema.ROUTINES WHERE ROUTINE_SCHEMA = :namespace)
     + (SELECT COUNT(*) FROM information_schema.TRIGGERS WHERE TRIGGER_SCHEMA = :namespace)
     + (SELECT COUNT(*) FROM information_schema.EVENTS WHERE EVENT_SCHEMA = :namespace)
     + (CASE WHEN DATABASE() = :namespace THEN 1 ELSE 0 END) AS n

-- drop_namespace --
-- Drop the (empty) database. MySQL has no RESTRICT: DROP DATABASE drops whatever is inside,
-- so assetq.uninstall runs this only after namespace_object_count found nothing.
DROP DATABASE IF EXISTS {{ns}}
