-- Statements assetq.migrate sends around its migrations (online upgrades, version skew).
-- Each starts with a "-- name --" line and a one-line description, as in queries.sql.
-- {{ns}} is the quoted namespace; {{marker}} a string literal assetq.migrate builds from
-- revision ids (letters, digits, underscores) only.

-- read_lock_timeout --
-- The session's lock timeouts, put back after assetq's steps (the connection goes back to a
-- pool).
SELECT @@SESSION.lock_wait_timeout AS lock_wait_timeout,
       @@SESSION.innodb_lock_wait_timeout AS innodb_lock_wait_timeout

-- set_lock_timeout --
-- Metadata locks (lock_wait_timeout: an ALTER, CREATE/DROP TRIGGER waiting for a table that
-- an open transaction uses; default a year) and row locks (innodb_lock_wait_timeout). While a
-- DDL statement waits for its exclusive metadata lock every new statement on that table
-- waits behind it: with this timeout it gives up (1205) and is retried instead. Both take
-- whole seconds.
SET SESSION lock_wait_timeout = :lock_wait_timeout,
            innodb_lock_wait_timeout = :innodb_lock_wait_timeout

-- write_compat_marker --
-- Record in the schema itself which packages work against it: a package older than this
-- schema cannot know the revision, but reads this (read_compat_marker). A comment change is
-- metadata only (instant), on a table only migrations use.
ALTER TABLE {{ns}}.assetq_alembic_version COMMENT = {{marker}}

-- read_compat_marker --
-- The marker write_compat_marker left (empty before assetq wrote one).
SELECT table_comment AS marker
  FROM information_schema.tables
 WHERE table_schema = :namespace AND table_name = 'assetq_alembic_version'

-- schema_state --
-- The first API call's check (migrate.check_schema): the installed revision and the marker
-- in one statement. A namespace without assetq fails it with 1146 (1049: no database), which
-- rolls back this statement only and is NotInstalled.
SELECT 1 AS installed, v.version_num AS revision,
       (SELECT t.table_comment FROM information_schema.tables t
         WHERE t.table_schema = :namespace AND t.table_name = 'assetq_alembic_version') AS marker
  FROM {{ns}}.assetq_alembic_version v

-- definitions --
-- Every routine, trigger and view of the namespace with its definition as the server keeps
-- it (doctor compares them with a reference install of the same revision in a scratch
-- database). Routines: type, parameters, return type, security, determinism, data access,
-- comment and body (ROUTINE_DEFINITION: the body as written, NULL to an account that may
-- not see it); triggers: timing, event, table, level and body (ACTION_STATEMENT); views:
-- security, check option and the text the server rewrote (names qualified with the
-- database, which the comparison replaces). The definer and sql_mode are not compared: an
-- install by another account, from another session, is still the revision's.
SELECT 'routine' AS kind, r.routine_name AS name,
       CONCAT_WS('\n', r.routine_type,
                 (SELECT GROUP_CONCAT(CONCAT_WS(' ', p.parameter_mode, p.parameter_name,
                                                p.dtd_identifier)
                                      ORDER BY p.ordinal_position SEPARATOR ', ')
                    FROM information_schema.parameters p
                   WHERE p.specific_schema = r.routine_schema
                     AND p.specific_name = r.routine_name AND p.ordinal_position > 0),
                 r.dtd_identifier, r.security_type, r.is_deterministic, r.sql_data_access,
                 r.routine_comment, r.routine_definition) AS definition,
       CAST(NULL AS CHAR) AS owner_table
  FROM information_schema.routines r
 WHERE r.routine_schema = :namespace
UNION ALL
SELECT 'trigger', t.trigger_name,
       CONCAT_WS('\n', t.action_timing, t.event_manipulation, t.event_object_table,
                 t.action_orientation, t.action_statement),
       t.event_object_table
  FROM information_schema.triggers t
 WHERE t.trigger_schema = :namespace
UNION ALL
SELECT 'view', v.table_name, CONCAT_WS('\n', v.security_type, v.check_option, v.view_definition),
       NULL
  FROM information_schema.views v
 WHERE v.table_schema = :namespace
