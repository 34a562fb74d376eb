-- Statements of installs and uninstalls on MySQL/MariaDB that PostgreSQL needs no twin of
-- (assetq.migrate): the checks made before anything is created, the lock that serializes
-- installs across Galera nodes, and the clean-up of a failed install. Each starts with a
-- "-- name --" line and a one-line description, as in queries.sql. {{name}} is the quoted
-- name of one object that the failed install created, read back from information_schema.
-- PostgreSQL has no such file: an install there is one transaction (checked and serialized
-- by the transaction itself), and a failed one leaves nothing to remove.

-- foreign_key_checks_off --
-- Drop the failed install's tables in any order: they reference each other.
SET SESSION foreign_key_checks = 0

-- foreign_key_checks_on --
-- Back to the default once they are gone (the connection goes back to a pool).
SET SESSION foreign_key_checks = 1

-- drop_table --
-- A table the failed install created (its triggers go with it).
DROP TABLE IF EXISTS {{ns}}.{{name}}

-- drop_view --
-- A view the failed install created.
DROP VIEW IF EXISTS {{ns}}.{{name}}

-- drop_trigger --
-- A trigger the failed install created.
DROP TRIGGER IF EXISTS {{ns}}.{{name}}

-- drop_procedure --
-- A routine the failed install created, if it is a procedure.
DROP PROCEDURE IF EXISTS {{ns}}.{{name}}

-- drop_function --
-- A routine the failed install created, if it is a function.
DROP FUNCTION IF EXISTS {{ns}}.{{name}}

-- script_charset --
-- First statement of the SQL that `assetq sql` and `alembic upgrade --sql` print: routines keep
-- the client character set they were created with, and the mysql client's default (utf8mb3
-- on MariaDB 10.11) is not the utf8mb4 assetq's own installs use.
SET NAMES utf8mb4

-- install_settings --
-- What an install checks before it creates anything, as (name, value): with binary logging
-- on, creating a trigger needs SUPER unless log_bin_trust_function_creators is ON (error
-- 1419, after the tables were created), and binlog_format=STATEMENT makes InnoDB refuse the
-- writes of every scheduler pass (1665, at READ COMMITTED). Global values: the ones the
-- sessions of producers and schedulers start with.
SHOW GLOBAL VARIABLES
 WHERE Variable_name IN ('log_bin', 'binlog_format', 'log_bin_trust_function_creators')

-- account_has_super --
-- 1 when the connected account holds SUPER, the privilege both MySQL 8 and MariaDB ask of
-- whoever creates a trigger with binary logging on (MySQL 8's SET_USER_ID does not do).
-- USER_PRIVILEGES lists an account's own global privileges (every account's, to one that may
-- read mysql.user): the row of CURRENT_USER(), whose host part never holds an '@'.
SELECT COUNT(*) AS n
  FROM information_schema.USER_PRIVILEGES
 WHERE PRIVILEGE_TYPE = 'SUPER'
   AND GRANTEE = CONCAT('''',
                        SUBSTRING(CURRENT_USER(), 1,
                                  CHAR_LENGTH(CURRENT_USER())
                                  - CHAR_LENGTH(SUBSTRING_INDEX(CURRENT_USER(), '@', -1)) - 1),
                        '''@''', SUBSTRING_INDEX(CURRENT_USER(), '@', -1), '''')

-- current_account --
-- The account the server matched the login to, for the messages of refused installs.
SELECT CURRENT_USER() AS account

-- end_snapshot --
-- An installer's commit before it waits for the namespace lock (migrate_connection). MySQL 8+
-- reads information_schema from its data dictionary, InnoDB tables, inside the transaction's
-- snapshot at REPEATABLE READ: an installer that read the version table's marker before it
-- waited would, once it held the lock, still see the namespace as it was before the other
-- installer's commit, take it for a fresh one and refuse its objects as not assetq's (AQ122;
-- MySQL 9.7, tests/test_migrations.py). MariaDB's information_schema is not transactional.
-- The install's DDL commits the connection's transaction anyway, statement by statement.
COMMIT

-- galera_on --
-- Whether this session's writes replicate through Galera (no row on MySQL 8 or a plain
-- MariaDB: wsrep_on does not exist there).
SHOW VARIABLES LIKE 'wsrep_on'

-- install_lock_holder --
-- Who holds the cluster's install lock of a namespace: the node, connection and time the
-- holder wrote into the lock table's comment (no row when nobody holds it).
SELECT TABLE_COMMENT AS holder
  FROM information_schema.TABLES
 WHERE TABLE_SCHEMA = {{database}} AND TABLE_NAME = '{{prefix}}assetq_install_lock'

-- install_lock_me --
-- Who this installer is, written into the lock table's comment: the Galera node, this
-- connection, the time (UTC).
SELECT @@wsrep_node_name AS node, CONNECTION_ID() AS id, UTC_TIMESTAMP() AS now

-- take_install_lock --
-- Take the install lock of a namespace on a Galera cluster, where GET_LOCK is per node: a
-- CREATE TABLE (DDL: replicated in total order, TOI) that exactly one of any number of
-- installers on any nodes gets; every other one fails with 1050 (the table exists) and waits
-- until it is gone. {{holder}} is a string literal assetq.migrate builds from the node's
-- name, the connection id and the time (letters, digits, ' .:-_' only).
CREATE TABLE {{ns}}.assetq_install_lock (holder INT NOT NULL PRIMARY KEY)
  ENGINE = InnoDB COMMENT = {{holder}}

-- release_install_lock --
-- Release it (nothing when an uninstall dropped the namespace, lock table with it: on a
-- database that no longer exists DROP TABLE IF EXISTS is a note, not an error).
DROP TABLE IF EXISTS {{ns}}.assetq_install_lock
