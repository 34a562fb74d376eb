-- Statements assetq.migrate and assetq.routines send around migrations: online upgrades,
-- version skew, and the routines re-created from their files by checksum (routine_catalogue).
-- Each starts with a "-- name --" line and a one-line description, as in queries.sql.
-- {{ns}} is the quoted namespace; {{marker}} a string literal assetq.migrate builds from
-- revision ids (letters, digits, underscores) only.

-- read_lock_timeout --
-- The lock timeout in force now, to put back after assetq's steps in a caller's transaction.
SELECT current_setting('lock_timeout') AS lock_timeout

-- set_lock_timeout --
-- Until the transaction ends (set_config's is_local): a migration statement waiting longer
-- than this for a lock fails with 55P03 and is retried, instead of queueing every producer
-- behind its request (an ALTER waiting behind one open producer transaction blocked every
-- new producer for as long as that transaction lasted).
SELECT set_config('lock_timeout', :value, true) AS lock_timeout

-- write_compat_marker --
-- Record in the schema itself which packages work against it: a package older than this
-- schema cannot know the revision, but reads this (read_compat_marker).
COMMENT ON TABLE {{ns}}.assetq_alembic_version IS {{marker}}

-- read_compat_marker --
-- The marker write_compat_marker left (NULL before assetq wrote one).
SELECT obj_description(c.oid, 'pg_class') AS marker
  FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
 WHERE n.nspname = :namespace AND c.relname = 'assetq_alembic_version'

-- step_tables --
-- The namespace's tables, to lock before one upgrade step (lock_step_tables).
SELECT c.relname AS name
  FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
 WHERE n.nspname = :namespace AND c.relkind IN ('r', 'p')

-- lock_step_tables --
-- First statement of an upgrade step: every table at once, in the order a producer takes
-- them ({{tables}}, built by assetq.migrate from step_tables). A step that locked its tables
-- one statement at a time held the first (an index on the queue) while waiting for the next
-- (asset_event), which a producer held while waiting for the first: under steady traffic the
-- step met its lock timeout again and again (0002 -> 0003: 40 attempts and counting). Locking
-- up front, in the producers' order, waits at most the lock timeout and then never again.
LOCK TABLE {{tables}} IN ACCESS EXCLUSIVE MODE

-- definitions --
-- Every routine, trigger and view of the namespace with its full definition as the server
-- prints it (assetq.routines keeps its checksum in routine_catalogue when it creates one;
-- doctor and repair compare, to tell an object changed by hand). Routines by name and
-- argument types (overloads differ).
SELECT 'routine' AS kind, p.proname || '(' || pg_get_function_identity_arguments(p.oid) || ')' AS name,
       pg_get_functiondef(p.oid) AS definition, CAST(NULL AS text) AS owner_table,
       true AS visible
  FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
 WHERE n.nspname = :namespace AND p.prokind = 'f'
UNION ALL
SELECT 'trigger', CAST(t.tgname AS text), pg_get_triggerdef(t.oid), CAST(c.relname AS text),
       true
  FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid
  JOIN pg_namespace n ON n.oid = c.relnamespace
 WHERE n.nspname = :namespace AND NOT t.tgisinternal
UNION ALL
SELECT 'view', CAST(c.relname AS text), pg_get_viewdef(c.oid), NULL, true
  FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
 WHERE n.nspname = :namespace AND c.relkind = 'v'

-- schema_state --
-- The first API call's check (migrate.check_schema), in one statement that never fails (a
-- SELECT of a missing version table would abort the caller's transaction): whether the
-- version table exists, and its marker, which names the installed revision (write_compat_marker
-- rewrites it after every install, upgrade and downgrade). schema_revision reads the table
-- itself for a schema whose marker does not name it.
SELECT c.oid IS NOT NULL AS installed, obj_description(c.oid, 'pg_class') AS marker,
       CAST(NULL AS text) AS revision
  FROM (SELECT 1) AS one
  LEFT JOIN (pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace)
    ON n.nspname = :namespace AND c.relname = 'assetq_alembic_version' AND c.relkind = 'r'

-- schema_revision --
-- The installed revision(s), read from the version table (schema_state found it exists;
-- migrate.current_revision, which reads it without importing alembic).
SELECT version_num AS revision FROM {{ns}}.assetq_alembic_version

-- catalogue_rows --
-- assetq.routines: what the namespace's routine_catalogue says each object was created from.
SELECT kind, name, checksum, package_version, definition_checksum FROM {{ns}}.routine_catalogue

-- catalogue_record --
-- assetq.routines: object :name of kind :kind was just created from a file with :checksum by
-- package :package_version, and the server printed its definition as :definition_checksum.
INSERT INTO {{ns}}.routine_catalogue AS c
       (kind, name, checksum, package_version, definition_checksum, applied_at)
VALUES (:kind, :name, :checksum, :package_version, :definition_checksum, clock_timestamp())
ON CONFLICT (kind, name) DO UPDATE
   SET checksum = EXCLUDED.checksum, package_version = EXCLUDED.package_version,
       definition_checksum = EXCLUDED.definition_checksum, applied_at = EXCLUDED.applied_at

-- revoke_public --
-- assetq.routines, after creating functions: PostgreSQL lets PUBLIC execute every new
-- function; only the owner, and the roles given access (grant_access), may execute assetq's.
-- CREATE OR REPLACE keeps a function's grants, so only a new one needs this; it is idempotent.
-- (Trigger functions are not checked when their trigger fires.)
REVOKE EXECUTE ON ALL FUNCTIONS IN SCHEMA {{ns}} FROM PUBLIC

-- read_function_bodies --
-- assetq.routines: check_function_bodies now, put back after the routines are created.
SELECT current_setting('check_function_bodies') AS value

-- set_function_bodies --
-- assetq.routines: off while routines are created, as pg_dump does, so that a LANGUAGE sql
-- function may be created before a function it calls (files are created in name order);
-- every function is created within the same transaction, and each is called by the tests.
SELECT set_config('check_function_bodies', :value, true)

-- drop_routine --
-- The baseline's downgrade: function {{name}} (one file of routines/) goes.
DROP FUNCTION IF EXISTS {{ns}}.{{name}} CASCADE

-- drop_trigger --
-- The baseline's downgrade: trigger {{name}} on {{table}} (one file of triggers/) goes.
DROP TRIGGER IF EXISTS {{name}} ON {{ns}}.{{table}}

-- drop_view --
-- The baseline's downgrade: view {{name}} (one file of views/) goes.
DROP VIEW IF EXISTS {{ns}}.{{name}}

-- granted_access --
-- assetq.routines, after it created a routine that was missing or a table step ran: which
-- roles hold which kind of access (grant_access), read from the privileges of one routine
-- or table each kind always has, so that grant_access gives each of them again, and a
-- routine or table that is new to the namespace reaches the roles of its kind.
SELECT k.access, r.rolname AS grantee, CAST(NULL AS text) AS host
  FROM (VALUES ('producer', 'register_events'), ('scheduler', 'schedule_pass'),
               ('worker', 'claim_runs')) AS k(access, marker)
  JOIN pg_proc p ON p.proname = k.marker
  JOIN pg_namespace n ON n.oid = p.pronamespace AND n.nspname = :namespace
 CROSS JOIN LATERAL aclexplode(p.proacl) a
  JOIN pg_roles r ON r.oid = a.grantee
 WHERE a.privilege_type = 'EXECUTE' AND a.grantee <> p.proowner
UNION
SELECT 'reader', r.rolname, NULL
  FROM pg_class c
  JOIN pg_namespace n ON n.oid = c.relnamespace AND n.nspname = :namespace
 CROSS JOIN LATERAL aclexplode(c.relacl) a
  JOIN pg_roles r ON r.oid = a.grantee
 WHERE c.relname = 'dag' AND a.privilege_type = 'SELECT' AND a.grantee <> c.relowner
 ORDER BY 1, 2

-- catalogue_complete --
-- assetq.routines: object :name of kind :kind, created from its file by statements printed
-- offline (assetq sql), gets the checksum of its definition as the server prints it; the
-- row is otherwise left as it was.
UPDATE {{ns}}.routine_catalogue SET definition_checksum = :definition_checksum
 WHERE kind = :kind AND name = :name AND definition_checksum IS NULL

-- adopt_version --
-- migrate.adopt_development: the version table of a development schema at
-- 0015_batch_lookups (whose tables are the baseline's) says 0001_baseline from now on.
UPDATE {{ns}}.assetq_alembic_version SET version_num = '0001_baseline'
 WHERE version_num = '0015_batch_lookups'
