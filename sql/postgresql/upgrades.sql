-- Statements assetq.migrate sends around its migrations (online upgrades, version skew).
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
