-- Statements assetq.migrate and assetq.routines send around migrations: online upgrades,
-- version skew, and the routines re-created from their files by checksum (routine_catalogue).
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
 WHERE table_schema = {{database}} AND table_name = '{{prefix}}assetq_alembic_version'

-- schema_revision --
-- The installed revision(s), read from the version table (migrate.current_revision, which
-- reads it without importing alembic; schema_state reads it with the marker).
SELECT version_num AS revision FROM {{ns}}.assetq_alembic_version

-- schema_state --
-- The first API call's check (migrate.check_schema): the installed revision and the marker
-- in one statement. A namespace without assetq fails it with 1146 (1049: no database), which
-- rolls back this statement only and is NotInstalled.
SELECT 1 AS installed, v.version_num AS revision,
       (SELECT t.table_comment FROM information_schema.tables t
         WHERE t.table_schema = {{database}}
           AND t.table_name = '{{prefix}}assetq_alembic_version') AS marker
  FROM {{ns}}.assetq_alembic_version v

-- definitions --
-- Every routine, trigger and view of the namespace with its definition as the server keeps
-- it (assetq.routines keeps its checksum in routine_catalogue when it creates one; doctor
-- and repair compare, to tell an object changed by hand). Routines: type, parameters,
-- return type, security, determinism, data access, comment and body (ROUTINE_DEFINITION:
-- the body as written); triggers: timing, event, table, level and body (ACTION_STATEMENT);
-- views: security, check option and the text the server rewrote. The definer and sql_mode
-- are not compared: an install by another account, from another session, is still the
-- file's. visible: whether the account may read the body at all: MySQL/MariaDB show a
-- routine's body only to its definer and to accounts that may read mysql.proc (MySQL 8:
-- SHOW_ROUTINE), NULL to the others, and such a definition cannot be compared. With a table
-- prefix: the objects named with it, by their names without it.
SELECT 'routine' AS kind, SUBSTRING(r.routine_name, CHAR_LENGTH('{{prefix}}') + 1) AS name,
       CONCAT_WS('\n', r.routine_type,
                 (SELECT GROUP_CONCAT(CONCAT_WS(' ', p.parameter_mode, p.parameter_name,
                                                p.dtd_identifier)
                                      ORDER BY p.ordinal_position SEPARATOR ', ')
                    FROM information_schema.parameters p
                   WHERE p.specific_schema = r.routine_schema
                     AND p.specific_name = r.routine_name AND p.ordinal_position > 0),
                 r.dtd_identifier, r.security_type, r.is_deterministic, r.sql_data_access,
                 r.routine_comment, r.routine_definition) AS definition,
       CAST(NULL AS CHAR) AS owner_table, r.routine_definition IS NOT NULL AS visible
  FROM information_schema.routines r
 WHERE r.routine_schema = {{database}} AND LEFT(r.routine_name, CHAR_LENGTH('{{prefix}}')) = '{{prefix}}'
UNION ALL
SELECT 'trigger', SUBSTRING(t.trigger_name, CHAR_LENGTH('{{prefix}}') + 1),
       CONCAT_WS('\n', t.action_timing, t.event_manipulation, t.event_object_table,
                 t.action_orientation, t.action_statement),
       SUBSTRING(t.event_object_table, CHAR_LENGTH('{{prefix}}') + 1),
       t.action_statement IS NOT NULL
  FROM information_schema.triggers t
 WHERE t.trigger_schema = {{database}} AND LEFT(t.trigger_name, CHAR_LENGTH('{{prefix}}')) = '{{prefix}}'
UNION ALL
SELECT 'view', SUBSTRING(v.table_name, CHAR_LENGTH('{{prefix}}') + 1),
       CONCAT_WS('\n', v.security_type, v.check_option, v.view_definition), NULL,
       COALESCE(v.view_definition, '') <> ''
  FROM information_schema.views v
 WHERE v.table_schema = {{database}} AND LEFT(v.table_name, CHAR_LENGTH('{{prefix}}')) = '{{prefix}}'

-- read_sql_mode --
-- routines.sync: the session's sql_mode, put back after the objects are created under
-- strict_sql_mode.
SELECT @@SESSION.sql_mode AS sql_mode

-- set_sql_mode --
-- routines.sync: the session's sql_mode back as it was.
SET SESSION sql_mode = :sql_mode

-- repair_grants_table --
-- routines.sync, MySQL proper (MariaDB replaces with CREATE OR REPLACE, which keeps them):
-- the grants of the routines it drops and creates again, kept in the namespace until they
-- are given back. MySQL revokes a routine's grants on DROP PROCEDURE (mysql.procs_priv) and
-- has no CREATE OR REPLACE PROCEDURE, and DDL commits statement by statement: a sync that
-- stopped between the DROP and the GRANT leaves them here, and the next one (install,
-- upgrade or repair) gives them back.
CREATE TABLE IF NOT EXISTS {{ns}}._assetq_repair_grants (
    routine_type VARCHAR(9) NOT NULL,
    routine_name VARCHAR(64) NOT NULL,
    grantee_user VARCHAR(128) NOT NULL,
    grantee_host VARCHAR(255) NOT NULL,
    privileges   VARCHAR(64) NOT NULL,
    PRIMARY KEY (routine_type, routine_name, grantee_user, grantee_host)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin

-- repair_grants_table_exists --
-- routines.sync: 1 when an earlier sync left grants to give back.
SELECT COUNT(*) FROM information_schema.tables
 WHERE table_schema = {{database}} AND table_name = '{{prefix}}_assetq_repair_grants'

-- repair_save_grants --
-- routines.sync: the privileges accounts hold on routine :routine (its name with the
-- namespace's table prefix, if any), saved before it is dropped. IGNORE only skips grants an
-- interrupted sync saved already (the table has no foreign key or check whose failure it
-- could hide). An account that may not read mysql.procs_priv gets 1142 here, before anything
-- is dropped: the sync refuses (AQ124) rather than lose the grants. mysql.user too, which
-- repair_grant_statements reads to give them back: found by MySQL 9.7, where an account that
-- could read only mysql.procs_priv had its routines dropped and created again, and then
-- failed (1142 on mysql.user) with their grants not given back (tests/test_repair.py).
INSERT IGNORE INTO {{ns}}._assetq_repair_grants
       (routine_type, routine_name, grantee_user, grantee_host, privileges)
SELECT p.Routine_type, p.Routine_name, p.User, p.Host, p.Proc_priv
  FROM mysql.procs_priv p
 WHERE p.Db = {{database}} AND p.Routine_name = CONCAT('{{prefix}}', :routine)
   AND p.Proc_priv <> ''
   AND EXISTS (SELECT 1 FROM mysql.user u WHERE u.User = p.User AND u.Host = p.Host)

-- repair_grant_statements --
-- routines.sync: the GRANT giving back each saved privilege, on the routines that exist
-- again, to the accounts that still exist (GRANT would create a missing account on MariaDB).
-- A MariaDB role is stored with host '' and is named without a host in GRANT.
SELECT CONCAT('GRANT ',
              CONCAT_WS(', ', IF(FIND_IN_SET('Execute', g.privileges) > 0, 'EXECUTE', NULL),
                        IF(FIND_IN_SET('Alter Routine', g.privileges) > 0, 'ALTER ROUTINE', NULL)),
              ' ON ', g.routine_type, ' ', '{{ns}}', '.`', REPLACE(g.routine_name, '`', '``'),
              '` TO ', QUOTE(g.grantee_user),
              IF(g.grantee_host = '', '', CONCAT('@', QUOTE(g.grantee_host))),
              IF(FIND_IN_SET('Grant', g.privileges) > 0, ' WITH GRANT OPTION', '')) AS statement
  FROM {{ns}}._assetq_repair_grants g
 WHERE (FIND_IN_SET('Execute', g.privileges) > 0 OR FIND_IN_SET('Alter Routine', g.privileges) > 0)
   AND EXISTS (SELECT 1 FROM information_schema.routines r
                WHERE r.routine_schema = {{database}} AND r.routine_name = g.routine_name
                  AND r.routine_type = g.routine_type)
   AND EXISTS (SELECT 1 FROM mysql.user u
                WHERE u.User = g.grantee_user AND u.Host = g.grantee_host)
 ORDER BY g.routine_type, g.routine_name, g.grantee_user, g.grantee_host

-- repair_drop_grants_table --
-- routines.sync: every saved grant was given back (or its routine or account is gone).
DROP TABLE IF EXISTS {{ns}}._assetq_repair_grants

-- repair_lock_table --
-- routines.sync, MySQL proper: a trigger of {{table}} is dropped and created again with the
-- table locked for writing, so no row is inserted in between without it (MySQL has no
-- CREATE OR REPLACE TRIGGER; a producer's INSERT waits, at most its lock timeout, and then
-- fires the new trigger: tests/test_repair.py). The lock waits at most the sync's lock
-- timeout for producers' open transactions.
LOCK TABLES {{ns}}.{{table}} WRITE

-- unlock_tables --
-- routines.sync: the end of the trigger swap.
UNLOCK TABLES

-- catalogue_rows --
-- assetq.routines: what the namespace's routine_catalogue says each object was created from.
SELECT kind, name, checksum, package_version, definition_checksum FROM {{ns}}.routine_catalogue

-- catalogue_record --
-- assetq.routines: object :name of kind :kind was just created from a file with :checksum by
-- package :package_version, and the server printed its definition as :definition_checksum.
INSERT INTO {{ns}}.routine_catalogue
       (kind, name, checksum, package_version, definition_checksum, applied_at)
VALUES (:kind, :name, :checksum, :package_version, :definition_checksum, UTC_TIMESTAMP(6))
ON DUPLICATE KEY UPDATE
       checksum = :checksum, package_version = :package_version,
       definition_checksum = :definition_checksum, applied_at = UTC_TIMESTAMP(6)

-- strict_sql_mode --
-- assetq.routines: the sql_mode every routine and trigger is created under (MySQL stores it
-- with each): strict, so a too-long value is an error instead of a silent truncation,
-- whatever the installing session's own sql_mode is.
SET SESSION sql_mode = 'STRICT_TRANS_TABLES,STRICT_ALL_TABLES,NO_ZERO_IN_DATE,NO_ZERO_DATE,ERROR_FOR_DIVISION_BY_ZERO,NO_ENGINE_SUBSTITUTION'

-- drop_routine --
-- The baseline's downgrade: procedure {{name}} (one file of routines/) goes.
DROP PROCEDURE IF EXISTS {{ns}}.{{name}}

-- drop_trigger --
-- The baseline's downgrade: trigger {{name}} (one file of triggers/) goes.
DROP TRIGGER IF EXISTS {{ns}}.{{name}}

-- drop_view --
-- The baseline's downgrade: view {{name}} (one file of views/) goes.
DROP VIEW IF EXISTS {{ns}}.{{name}}

-- granted_access --
-- assetq.routines, after it created a routine that was missing or a table step ran: which
-- accounts hold which kind of access (grant_access), read from the privileges of one routine
-- or table each kind always has, so that grant_access gives each of them again, and a
-- routine or table that is new to the namespace reaches the accounts of its kind. A MariaDB
-- role has host ''. The names are plain literals: with a table prefix the rendering gives
-- each its prefix ('dag' becomes 'assetq_dag'; sqlfiles.render), so writing the prefix here
-- too named the table with the prefix twice, found no account, and a prefixed reader lost SELECT on the
-- tables an upgrade added (tests/test_table_prefix.py).
SELECT DISTINCT CASE p.Routine_name WHEN 'register_events' THEN 'producer'
                                   WHEN 'schedule_pass' THEN 'scheduler'
                                   ELSE 'worker' END AS access,
       p.User AS grantee, p.Host AS host
  FROM mysql.procs_priv p
 WHERE p.Db = {{database}} AND FIND_IN_SET('Execute', p.Proc_priv) > 0
   AND p.Routine_name IN ('register_events', 'schedule_pass', 'claim_runs')
UNION
SELECT 'reader', d.User, d.Host FROM mysql.db d
 WHERE d.Db = {{database}} AND d.Select_priv = 'Y' AND '{{prefix}}' = ''
UNION
SELECT 'reader', t.User, t.Host FROM mysql.tables_priv t
 WHERE t.Db = {{database}} AND t.Table_name = 'dag'
   AND FIND_IN_SET('Select', t.Table_priv) > 0
 ORDER BY 1, 2, 3

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
