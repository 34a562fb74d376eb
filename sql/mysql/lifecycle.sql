-- Statements of the install's own clean-up on MySQL/MariaDB (assetq.migrate._remove_created).
-- Each starts with a "-- name --" line and a one-line description, as in queries.sql.
-- {{name}} is the quoted name of one object that the failed install created, read back from
-- information_schema. PostgreSQL has no such file: an install there is one transaction, and a
-- failed one leaves nothing to remove.

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
