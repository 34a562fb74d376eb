-- assetq on MySQL 8.0+ / MariaDB 10.6+: the whole current schema (tables, routines, triggers).
--
-- A fresh install executes this file; an existing install is upgraded by replaying
-- migrations/NNNN_*.up.sql. tests/test_migrations.py proves both give the same schema, so any
-- change here needs a new migration, and the reverse.
--
-- {{ns}} is replaced by the backquoted namespace (a MySQL database, default `assetq`) when the
-- file is loaded. Every object is qualified with it, so nothing depends on the connection's
-- default database. The file runs unchanged through the mysql client too: assetq's loader
-- (sqlfiles.split_script) splits it exactly as the client does, DELIMITER lines included.
--
-- Only the common subset of MySQL 8.0 and MariaDB 10.6 is used. Where the two differ, a
-- comment marked "MySQL 8 / MariaDB:" says what was avoided and why.
--
-- Every statement can run twice (CREATE TABLE IF NOT EXISTS, DROP ... IF EXISTS before each
-- routine and trigger): MySQL commits every DDL statement on its own, so an install that
-- stopped half-way is finished by running the script again.
--
-- Timestamps are DATETIME(6) holding UTC, written with UTC_TIMESTAMP(6), never NOW(6) or
-- CURRENT_TIMESTAMP: those follow the session's time_zone, and a DATETIME keeps no zone, so a
-- session at '+05:00' would store times five hours off. With UTC_TIMESTAMP nothing assetq
-- stores or returns depends on the session's time_zone.
--
-- Text columns are utf8mb4 with the binary collation utf8mb4_bin: names compare case- and
-- accent-sensitively, as on PostgreSQL. utf8mb4_bin is a PAD SPACE collation on both engines,
-- so values that differ only in trailing spaces compare equal ('a' = 'a '). MySQL 8 /
-- MariaDB: the NO PAD binary collations differ (utf8mb4_0900_bin / utf8mb4_nopad_bin), there
-- is none in the common subset. Length limits are the PostgreSQL schema's.

-- The routines below run with the sql_mode in force when they are created (MySQL stores it
-- with each routine and trigger). Strict mode makes a too-long value an error instead of a
-- silent truncation, whatever the installing session's own sql_mode is. The installer's mode
-- is restored at the end of the file.
SET @assetq_saved_sql_mode = @@SESSION.sql_mode,
    SESSION sql_mode = 'STRICT_TRANS_TABLES,STRICT_ALL_TABLES,NO_ZERO_IN_DATE,NO_ZERO_DATE,ERROR_FOR_DIVISION_BY_ZERO,NO_ENGINE_SUBSTITUTION';

CREATE TABLE IF NOT EXISTS {{ns}}.asset (
    id          BIGINT NOT NULL AUTO_INCREMENT,
    name        VARCHAR(512) NOT NULL,
    uri         VARCHAR(512) NULL,
    -- MySQL 8 / MariaDB: MySQL 8 refuses a literal default on a JSON column; an expression
    -- default in parentheses works on both (MySQL >= 8.0.13).
    extra       JSON NOT NULL DEFAULT (JSON_OBJECT()),
    created_at  DATETIME(6) NOT NULL DEFAULT (UTC_TIMESTAMP(6)),
    -- false for an asset that exists only because a consumer condition referenced it: the
    -- first declare_asset that names it by its uri may still give it its real name.
    declared    BOOLEAN NOT NULL DEFAULT TRUE,
    PRIMARY KEY (id),
    CONSTRAINT asset_name_key UNIQUE (name),
    CONSTRAINT asset_uri_key UNIQUE (uri),
    -- CHAR_LENGTH, not <> '': with a PAD SPACE collation ' ' = '' is true.
    CONSTRAINT asset_name_not_empty CHECK (CHAR_LENGTH(name) > 0),
    CONSTRAINT asset_uri_not_empty CHECK (CHAR_LENGTH(uri) > 0),
    -- MySQL 8 / MariaDB: JSON is a binary type on MySQL and LONGTEXT with a JSON_VALID check
    -- on MariaDB; JSON_TYPE works on both.
    CONSTRAINT asset_extra_is_object CHECK (JSON_TYPE(extra) = 'OBJECT')
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

-- A consumer. The scheduler's own per-consumer state (run sequence, round-robin position) is
-- not here but in dag_lock: see there why the scheduler never writes this row.
-- max_active_runs / max_events_per_run: its caps (NULL: none); queue_while_paused: events
-- keep queueing for it while it is paused. max_attempts, retry_delay_seconds and
-- max_retry_delay_seconds: how many claims a run gets and the delay before a retry (see
-- declare_dag).
CREATE TABLE IF NOT EXISTS {{ns}}.dag (
    dag_id             VARCHAR(250) NOT NULL,
    `condition`        JSON NOT NULL,
    is_paused          BOOLEAN NOT NULL DEFAULT FALSE,
    created_at         DATETIME(6) NOT NULL DEFAULT (UTC_TIMESTAMP(6)),
    updated_at         DATETIME(6) NOT NULL DEFAULT (UTC_TIMESTAMP(6)),
    max_active_runs    INT NULL,
    max_events_per_run INT NULL,
    queue_while_paused BOOLEAN NOT NULL DEFAULT FALSE,
    max_attempts       INT NOT NULL DEFAULT 1,
    retry_delay_seconds     DOUBLE NOT NULL DEFAULT 0,
    max_retry_delay_seconds DOUBLE NULL,
    PRIMARY KEY (dag_id),
    CONSTRAINT dag_max_active_runs_check CHECK (max_active_runs >= 1),
    CONSTRAINT dag_max_events_per_run_check CHECK (max_events_per_run >= 1),
    CONSTRAINT dag_max_attempts_check CHECK (max_attempts BETWEEN 1 AND 1000),
    CONSTRAINT dag_retry_delay_check
        CHECK (retry_delay_seconds >= 0 AND max_retry_delay_seconds >= retry_delay_seconds),
    -- ASCII classes, not [[:alnum:]]: MySQL's ICU regular expressions count any Unicode letter
    -- as alnum, MariaDB's PCRE does not. This is exactly what the Python layer accepts.
    CONSTRAINT dag_id_format CHECK (dag_id REGEXP '^[A-Za-z0-9_.-]+$'),
    -- Partitions (migration 0009_partitions): NULL for an unpartitioned consumer; otherwise
    -- the declared mappings with the condition they were declared for (set_dag_partitions),
    -- and the consumer's condition is evaluated per partition key.
    partitioning       JSON NULL
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

-- The consumer's lock row: one per dag, created by the trigger on dag, referenced by nothing.
-- A scheduler pass locks this row (FOR UPDATE SKIP LOCKED), never the dag row: every producer
-- in flight holds a shared lock on the dag row, which the fan-out reads (MySQL has no
-- NO KEY lock mode), so a pass locking the dag row would skip every busy consumer, and a pass
-- writing it would wait for every producer. That is also why the run sequence and the
-- round-robin position live here: the pass updates them under its own lock. declare_dag and
-- set_dag_paused take this lock before they touch the dag row, so a pass sees a consumer's
-- old definition or its new one, never a mix.
--
-- last_scheduled_at is when a pass last examined the consumer: passes take consumers
-- oldest-examined first, so a consumer whose condition is never met cannot keep a
-- satisfiable one out of a pass with a small limit (round robin, no starvation).
CREATE TABLE IF NOT EXISTS {{ns}}.dag_lock (
    dag_id            VARCHAR(250) NOT NULL,
    last_run_seq      BIGINT NOT NULL DEFAULT 0,
    last_scheduled_at DATETIME(6) NULL,
    PRIMARY KEY (dag_id),
    CONSTRAINT dag_lock_dag_id_fkey FOREIGN KEY (dag_id)
        REFERENCES {{ns}}.dag (dag_id) ON DELETE CASCADE
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

-- Which consumers an event of an asset fans out to. Keyed by asset first: that is the
-- lookup the fan-out trigger does for every event.
CREATE TABLE IF NOT EXISTS {{ns}}.dag_schedule_asset_reference (
    asset_id    BIGINT NOT NULL,
    dag_id      VARCHAR(250) NOT NULL,
    created_at  DATETIME(6) NOT NULL DEFAULT (UTC_TIMESTAMP(6)),
    PRIMARY KEY (asset_id, dag_id),
    KEY dag_schedule_asset_reference_dag_idx (dag_id),
    CONSTRAINT dag_schedule_asset_reference_asset_id_fkey FOREIGN KEY (asset_id)
        REFERENCES {{ns}}.asset (id),
    CONSTRAINT dag_schedule_asset_reference_dag_id_fkey FOREIGN KEY (dag_id)
        REFERENCES {{ns}}.dag (dag_id) ON DELETE CASCADE,
    -- A partitioned consumer's mapping of the asset's partition keys to its own (migration
    -- 0009_partitions, see partition_map), and whether a key needs all of its upstream
    -- partitions or any; both NULL for an unpartitioned consumer.
    partition_mapping VARCHAR(20) NULL,
    partition_require VARCHAR(3) NULL,
    CONSTRAINT dag_schedule_asset_reference_mapping_check
        CHECK (partition_mapping IN ('identity', 'hour_to_day', 'day_to_week', 'day_to_month', 'static')),
    CONSTRAINT dag_schedule_asset_reference_require_check CHECK (partition_require IN ('all', 'any'))
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

-- The compiled condition in conjunctive normal form: clause k of a consumer is the set of
-- assets whose rows have the same clause_no. The condition holds when every clause has at
-- least one asset among the claimed queue rows. Assets are never cascaded away from a clause
-- (no ON DELETE CASCADE): dropping an asset from an AND would make the condition fire early.
CREATE TABLE IF NOT EXISTS {{ns}}.dag_condition_clause (
    dag_id      VARCHAR(250) NOT NULL,
    clause_no   INT NOT NULL,
    asset_id    BIGINT NOT NULL,
    PRIMARY KEY (dag_id, clause_no, asset_id),
    KEY dag_condition_clause_asset_idx (asset_id),
    CONSTRAINT dag_condition_clause_dag_id_fkey FOREIGN KEY (dag_id)
        REFERENCES {{ns}}.dag (dag_id) ON DELETE CASCADE,
    CONSTRAINT dag_condition_clause_asset_id_fkey FOREIGN KEY (asset_id)
        REFERENCES {{ns}}.asset (id)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

CREATE TABLE IF NOT EXISTS {{ns}}.asset_event (
    id                BIGINT NOT NULL AUTO_INCREMENT,
    asset_id          BIGINT NOT NULL,
    extra             JSON NOT NULL DEFAULT (JSON_OBJECT()),
    source_dag_id     VARCHAR(250) NULL,
    source_task_id    VARCHAR(250) NULL,
    source_run_id     VARCHAR(250) NULL,
    source_map_index  INT NOT NULL DEFAULT -1,
    idempotency_key   VARCHAR(200) NULL,
    -- Not commit order (neither is any clock); the scheduler never relies on it (I3).
    `timestamp`       DATETIME(6) NOT NULL DEFAULT (UTC_TIMESTAMP(6)),
    PRIMARY KEY (id),
    -- Also the index that serves lookups and foreign-key checks by asset_id. NULL keys never
    -- conflict, as on PostgreSQL.
    CONSTRAINT asset_event_idempotency_key UNIQUE (asset_id, idempotency_key),
    CONSTRAINT asset_event_asset_id_fkey FOREIGN KEY (asset_id) REFERENCES {{ns}}.asset (id),
    CONSTRAINT asset_event_extra_is_object CHECK (JSON_TYPE(extra) = 'OBJECT'),
    CONSTRAINT asset_event_idempotency_key_not_empty CHECK (CHAR_LENGTH(idempotency_key) > 0),
    -- The event's partition (migration 0009_partitions): NULL for an unpartitioned event. No
    -- CHECK that it is not empty (insert_event_batch refuses ''): adding one to an existing
    -- install would copy the whole event history (ALGORITHM=COPY).
    partition_key     VARCHAR(250) NULL
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

-- One row per (consumer, event) not yet consumed. created_at is the event's own timestamp,
-- copied by the trigger (I2).
--
-- No foreign keys (migration 0013_queue_checks), as on PostgreSQL: a queue row's consumer and
-- event are guaranteed by the routines, not checked per row. Queue rows are written only by
-- the fan-out trigger, in the statement that inserts their event, for consumer rows it reads
-- with a shared lock (the lock the check took); delete_dag deletes its reference and
-- alias-clause rows first, which waits for the producers holding them, then its queue rows,
-- and the producers after it find no consumer to queue for. A queued event is never deleted:
-- purge_events deletes only events without a queue row (an event's queue rows commit with
-- it), delete_asset deletes its events' queue rows first. A DELETE of consumers or events by
-- hand must delete their queue rows too (docs/guarantees.md).
CREATE TABLE IF NOT EXISTS {{ns}}.asset_dag_run_queue (
    target_dag_id   VARCHAR(250) NOT NULL,
    asset_event_id  BIGINT NOT NULL,
    asset_id        BIGINT NOT NULL,
    created_at      DATETIME(6) NOT NULL,
    PRIMARY KEY (target_dag_id, asset_event_id),
    -- The queue by event: purge_events' "still queued?" test and delete_asset (it served the
    -- foreign key to asset_event until 0013_queue_checks).
    KEY asset_dag_run_queue_event_idx (asset_event_id),
    -- A consumer's queue in queue order (a capped claim reads its N + 1 oldest rows), and each
    -- of its assets' oldest row (the witness search), by index (migration 0007_capped_claim).
    KEY asset_dag_run_queue_order_idx (target_dag_id, created_at, asset_event_id, asset_id),
    KEY asset_dag_run_queue_asset_idx (target_dag_id, asset_id, created_at, asset_event_id)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

-- A run. As work (migration 0006_work_queue, see claim_runs): attempt counts its claims,
-- worker holds or last held it, lease_until ends its lease, not_before is when it may next be
-- claimed (NULL: never, it is finished or was moved by hand), error is its last failed
-- attempt's. No CHECK (attempt >= 0): adding one to an existing install would copy the whole
-- table (MySQL 8 / MariaDB: ALGORITHM=COPY), so 0006 adds none; only claim_runs writes it.
CREATE TABLE IF NOT EXISTS {{ns}}.dag_run (
    id          BIGINT NOT NULL AUTO_INCREMENT,
    dag_id      VARCHAR(250) NOT NULL,
    run_id      VARCHAR(250) NOT NULL,
    seq         BIGINT NOT NULL,
    run_type    VARCHAR(50) NOT NULL DEFAULT 'asset_triggered',
    run_after   DATETIME(6) NOT NULL,
    state       VARCHAR(20) NOT NULL DEFAULT 'queued',
    created_at  DATETIME(6) NOT NULL DEFAULT (UTC_TIMESTAMP(6)),
    -- The newest event the run consumed (no foreign key: purge and delete_asset may delete
    -- the event, the run keeps the id), and how many it consumed.
    triggering_event_id BIGINT NULL,
    event_count INT NOT NULL DEFAULT 0,
    started_at  DATETIME(6) NULL,
    ended_at    DATETIME(6) NULL,
    updated_at  DATETIME(6) NULL,
    attempt     INT NOT NULL DEFAULT 0,
    worker      VARCHAR(250) NULL,
    lease_until DATETIME(6) NULL,
    not_before  DATETIME(6) NULL,
    error       TEXT NULL,
    PRIMARY KEY (id),
    -- Active runs of a consumer (max_active_runs), and runs(dag_id, state=...).
    KEY dag_run_dag_state_idx (dag_id, state),
    -- The claim's index: claimable runs by when they may be claimed (finished runs: NULL).
    KEY dag_run_claim_idx (not_before, id),
    -- runs(state=...) across consumers, newest first; the status view's active runs.
    KEY dag_run_state_idx (state, id),
    -- Running runs by the end of their lease: every pass fails those whose last attempt's
    -- lease expired (migration 0007_capped_claim). Not partial (MySQL has none): the other
    -- states are in it too, in ranges of their own a range on 'running' never reads.
    KEY dag_run_lease_idx (state, not_before),
    CONSTRAINT dag_run_run_id_key UNIQUE (dag_id, run_id),
    CONSTRAINT dag_run_seq_key UNIQUE (dag_id, seq),
    -- Was the target of the link table's composite foreign key (until 0012_link_checks); kept,
    -- so that putting the key back (0012's down script) needs no new index.
    CONSTRAINT dag_run_id_dag_key UNIQUE (id, dag_id),
    CONSTRAINT dag_run_dag_id_fkey FOREIGN KEY (dag_id)
        REFERENCES {{ns}}.dag (dag_id) ON DELETE CASCADE,
    CONSTRAINT dag_run_type_check CHECK (run_type IN ('asset_triggered')),
    CONSTRAINT dag_run_state_check CHECK (state IN ('queued', 'running', 'success', 'failed')),
    -- Partitions (migration 0009_partitions): the key a partitioned consumer's run is for, and
    -- its generation, 1 for the key's first run, 2 for the next (a re-delivered partition).
    -- At most one run per (consumer, key, generation), written into the schema. Both NULL for
    -- an unpartitioned consumer's run. No CHECK that they are NULL together: adding one to an
    -- existing install would copy the whole table; only schedule_partitions writes them.
    partition_key        VARCHAR(250) NULL,
    partition_generation INT NULL,
    CONSTRAINT dag_run_partition_key UNIQUE (dag_id, partition_key, partition_generation)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

-- Which events a run consumed. The unique (asset_event_id, dag_id) is the exactly-once
-- guarantee written into the schema (I4): even a scheduler bug cannot link an event to two
-- runs of one consumer. Event first (migration 0014_link_keys; it was (dag_id,
-- asset_event_id) with an event index beside it): the same uniqueness, and it serves every
-- lookup by event too, one index entry fewer for every link a pass inserts.
--
-- No foreign keys (migration 0012_link_checks), as on PostgreSQL: a link's run and event are
-- guaranteed by the routines, not checked per row (on PostgreSQL the two checks were 1.9 s of
-- a 3.3 s pass over a 100,000-event backlog; here such a pass is 1.3x faster without them).
-- Links are written only by schedule_pass and schedule_partitions, in the transaction that
-- inserts their run, for the events of queue rows the pass has just deleted by key (the claim
-- guard counts them); a queued event is never deleted (see the queue table). Every routine that deletes runs or events deletes their links
-- first (purge_runs, delete_dag, delete_asset; purge_events deletes only unlinked events),
-- and says next to it why no pass can add a link behind it. A DELETE of runs or events by
-- hand must delete their links too (docs/guarantees.md). The run index that served the key
-- to dag_run stays, for a link lookup by run (claim_runs, consumed_events); lookups by event
-- (purge_events, delete_asset) go by the unique key, which leads with the event since
-- 0014_link_keys (the event index that served them until then is gone).
CREATE TABLE IF NOT EXISTS {{ns}}.dagrun_asset_event (
    dag_run_id      BIGINT NOT NULL,
    asset_event_id  BIGINT NOT NULL,
    dag_id          VARCHAR(250) NOT NULL,
    PRIMARY KEY (dag_run_id, asset_event_id),
    CONSTRAINT dagrun_asset_event_once UNIQUE (asset_event_id, dag_id),
    KEY dagrun_asset_event_run_idx (dag_run_id, dag_id)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

-- Asset aliases (migration 0004_semantics): a producer registers an event "through" an
-- alias, which then resolves to the event's asset; consumers may depend on an alias.
CREATE TABLE IF NOT EXISTS {{ns}}.asset_alias (
    id          BIGINT NOT NULL AUTO_INCREMENT,
    name        VARCHAR(512) NOT NULL,
    created_at  DATETIME(6) NOT NULL DEFAULT (UTC_TIMESTAMP(6)),
    PRIMARY KEY (id),
    CONSTRAINT asset_alias_name_key UNIQUE (name),
    CONSTRAINT asset_alias_name_not_empty CHECK (CHAR_LENGTH(name) > 0)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

-- Alias alias_id has resolved to asset asset_id: an event of the asset was registered
-- through the alias. From then on the alias's consumers get every event of the asset.
CREATE TABLE IF NOT EXISTS {{ns}}.asset_alias_asset (
    alias_id    BIGINT NOT NULL,
    asset_id    BIGINT NOT NULL,
    created_at  DATETIME(6) NOT NULL DEFAULT (UTC_TIMESTAMP(6)),
    PRIMARY KEY (alias_id, asset_id),
    KEY asset_alias_asset_asset_idx (asset_id),
    CONSTRAINT asset_alias_asset_alias_id_fkey FOREIGN KEY (alias_id)
        REFERENCES {{ns}}.asset_alias (id) ON DELETE CASCADE,
    CONSTRAINT asset_alias_asset_asset_id_fkey FOREIGN KEY (asset_id)
        REFERENCES {{ns}}.asset (id) ON DELETE CASCADE
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

-- The aliases an event was registered through.
CREATE TABLE IF NOT EXISTS {{ns}}.asset_event_alias (
    asset_event_id  BIGINT NOT NULL,
    alias_id        BIGINT NOT NULL,
    PRIMARY KEY (asset_event_id, alias_id),
    KEY asset_event_alias_alias_idx (alias_id),
    CONSTRAINT asset_event_alias_asset_event_id_fkey FOREIGN KEY (asset_event_id)
        REFERENCES {{ns}}.asset_event (id) ON DELETE CASCADE,
    CONSTRAINT asset_event_alias_alias_id_fkey FOREIGN KEY (alias_id)
        REFERENCES {{ns}}.asset_alias (id)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

-- Alias members of a consumer's CNF clauses (asset members are in dag_condition_clause).
-- Clause clause_no holds when a claimed row's asset is a member, or an alias member has
-- resolved to it. The fan-out reads it by alias.
CREATE TABLE IF NOT EXISTS {{ns}}.dag_condition_alias (
    dag_id      VARCHAR(250) NOT NULL,
    clause_no   INT NOT NULL,
    alias_id    BIGINT NOT NULL,
    PRIMARY KEY (dag_id, clause_no, alias_id),
    KEY dag_condition_alias_alias_idx (alias_id),
    CONSTRAINT dag_condition_alias_dag_id_fkey FOREIGN KEY (dag_id)
        REFERENCES {{ns}}.dag (dag_id) ON DELETE CASCADE,
    CONSTRAINT dag_condition_alias_alias_id_fkey FOREIGN KEY (alias_id)
        REFERENCES {{ns}}.asset_alias (id)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

-- Partitions (migration 0009_partitions). A static mapping of a partitioned consumer: an
-- event of asset asset_id with partition key upstream_key counts towards the consumer's key
-- target_key. With partition_require 'all', a target key needs an event for every upstream
-- key that maps to it.
CREATE TABLE IF NOT EXISTS {{ns}}.dag_partition_static_key (
    dag_id        VARCHAR(250) NOT NULL,
    asset_id      BIGINT NOT NULL,
    upstream_key  VARCHAR(250) NOT NULL,
    target_key    VARCHAR(250) NOT NULL,
    PRIMARY KEY (dag_id, asset_id, upstream_key),
    KEY dag_partition_static_key_target_idx (dag_id, asset_id, target_key),
    KEY dag_partition_static_key_reference_idx (asset_id, dag_id),
    CONSTRAINT dag_partition_static_key_reference_fkey FOREIGN KEY (asset_id, dag_id)
        REFERENCES {{ns}}.dag_schedule_asset_reference (asset_id, dag_id) ON DELETE CASCADE
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

-- The queue rows of partitioned consumers, with their keys: one row beside each of their
-- asset_dag_run_queue rows, written by the same fan-out and deleted by whoever deletes the
-- queue row (the pass, declare_dag, delete_asset; delete_dag by this table's own cascade). Not a foreign key to
-- the queue, as on PostgreSQL: its check would cost every queue row any pass deletes. A row
-- whose queue row is gone is never claimed: the pass reads a key's rows with their queue rows,
-- and drops those it finds alone.
-- partition_key is the consumer's key the event maps to, source_key the event's own key as
-- its mapping counts it (an hour of a day, a day of a week). examined: a pass has evaluated
-- the row's key since the row arrived and found its condition not met; a pass evaluates only
-- the keys of rows not yet examined, so it costs what arrived, never every pending key. The
-- index of rows not yet examined holds every row (MySQL has no partial index), the examined
-- ones in a range of their own that a pass never reads.
CREATE TABLE IF NOT EXISTS {{ns}}.asset_partition_queue (
    target_dag_id   VARCHAR(250) NOT NULL,
    asset_event_id  BIGINT NOT NULL,
    partition_key   VARCHAR(250) NOT NULL,
    asset_id        BIGINT NOT NULL,
    source_key      VARCHAR(250) NOT NULL,
    created_at      DATETIME(6) NOT NULL,
    examined        BOOLEAN NOT NULL DEFAULT FALSE,
    PRIMARY KEY (target_dag_id, asset_event_id),
    KEY asset_partition_queue_key_idx (target_dag_id, partition_key, created_at, asset_event_id),
    KEY asset_partition_queue_new_idx (target_dag_id, examined, asset_event_id),
    CONSTRAINT asset_partition_queue_dag_fkey FOREIGN KEY (target_dag_id)
        REFERENCES {{ns}}.dag (dag_id) ON DELETE CASCADE
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

-- Liveness (migration 0010_liveness): one row per scheduler or worker loop that runs, so that
-- status can show who is alive. process_id is made up by the loop when it starts (uuid4
-- hex); kind is 'scheduler' or 'worker'; name is a worker's name (its runs' worker column
-- starts with it), NULL for a scheduler; host, pid and version (the assetq package's) say
-- where it runs and what; interval_seconds is how often it promises to heartbeat;
-- started_at is its first heartbeat and last_seen_at its latest, both by the database's
-- clock (UTC). A loop that stops cleanly deletes its row (process_gone); a killed one leaves
-- it behind, and status calls it stale once last_seen_at is three intervals old. purge
-- deletes rows last seen before its cutoff. No foreign key and no index but the key: one
-- row per process, written by that process only.
CREATE TABLE IF NOT EXISTS {{ns}}.process_liveness (
    process_id        VARCHAR(64) NOT NULL,
    kind              VARCHAR(20) NOT NULL,
    name              VARCHAR(250) NULL,
    host              VARCHAR(255) NOT NULL,
    pid               BIGINT NOT NULL,
    version           VARCHAR(64) NOT NULL,
    interval_seconds  DOUBLE NOT NULL,
    started_at        DATETIME(6) NOT NULL,
    last_seen_at      DATETIME(6) NOT NULL,
    PRIMARY KEY (process_id),
    CONSTRAINT process_liveness_kind_check CHECK (kind IN ('scheduler', 'worker')),
    CONSTRAINT process_liveness_interval_check CHECK (interval_seconds > 0)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;


-- Fan-out (I1, I2), now also for consumers that depend on the asset through an alias it has
-- resolved to, and for paused consumers that queue while paused: one queue row per consumer,
-- even when it references the asset both directly and through an alias (UNION).
--
-- Every row it queues through is read with a shared lock (LOCK IN SHARE MODE): the reference
-- and alias-clause rows and the dag rows. On a dag row that is the lock the queue's
-- foreign-key check takes anyway, taken by the read so that a consumer deleted meanwhile
-- (delete_dag) is waited for and then skipped instead of failing the producer's foreign-key
-- check. On the reference and alias-clause rows it makes a re-declare that drops the asset
-- wait for the producers in flight, and the producers after it see the new definition: no
-- event is queued for a consumer that no longer depends on its asset. A trigger's reads are
-- locking reads anyway, except at READ COMMITTED under an INSERT ... SELECT (a batch
-- registration), where InnoDB would read them without locks: hence the explicit clauses.
-- delete_dag and declare_dag change a consumer's reference rows, then its alias-clause rows,
-- each in key order, then its dag row.
--
-- The asset's alias resolutions are looked up first (one index dive, with the shared lock the
-- alias query below takes on them anyway). An asset no alias has resolved to, the usual case,
-- takes the short statement: its reference rows in key order, each followed by its consumer's
-- dag row, as in 0003 but with the explicit locks. Interleaving is safe there: a declaration
-- or deletion holds the rows of one consumer only, and the producer reaches that consumer's
-- dag row only through its reference row, so it never holds a dag row such a writer waits
-- for while waiting for that writer. An asset with resolutions takes the UNION: every
-- reference and alias-clause row first (the derived table, materialized before the join),
-- then the dag rows, so a producer holding a consumer's dag row never waits for one of its
-- alias-clause rows. One queue row per consumer even when it references the asset both
-- directly and through an alias. The index hints keep the optimizer from scanning a small
-- table through a join buffer, which would lock the rows of every consumer.
-- MySQL 8 / MariaDB: a locking clause covers the tables of its own query block only, so each
-- block of the UNION has its own (in parentheses, as both require).
DELIMITER $$
DROP TRIGGER IF EXISTS {{ns}}.asset_event_fan_out $$
CREATE TRIGGER {{ns}}.asset_event_fan_out
    AFTER INSERT ON {{ns}}.asset_event
    FOR EACH ROW
BEGIN
    DECLARE v_resolutions BIGINT;
    DECLARE v_partitioned BIGINT;
    SELECT COUNT(*) INTO v_resolutions
      FROM {{ns}}.asset_alias_asset aa FORCE INDEX (asset_alias_asset_asset_idx)
     WHERE aa.asset_id = NEW.asset_id
      LOCK IN SHARE MODE;
    IF v_resolutions = 0 THEN
        INSERT INTO {{ns}}.asset_dag_run_queue (target_dag_id, asset_event_id, asset_id, created_at)
        SELECT d.dag_id, NEW.id, NEW.asset_id, NEW.`timestamp`
          FROM {{ns}}.dag_schedule_asset_reference r FORCE INDEX (PRIMARY)
          STRAIGHT_JOIN {{ns}}.dag d FORCE INDEX (PRIMARY) ON d.dag_id = r.dag_id
         WHERE r.asset_id = NEW.asset_id
           AND (NOT d.is_paused OR d.queue_while_paused)
          LOCK IN SHARE MODE;
    ELSE
        INSERT INTO {{ns}}.asset_dag_run_queue (target_dag_id, asset_event_id, asset_id, created_at)
        SELECT d.dag_id, NEW.id, NEW.asset_id, NEW.`timestamp`
          FROM ((SELECT r.dag_id
                   FROM {{ns}}.dag_schedule_asset_reference r
                  WHERE r.asset_id = NEW.asset_id
                   LOCK IN SHARE MODE)
                UNION
                (SELECT ca.dag_id
                   FROM {{ns}}.asset_alias_asset aa FORCE INDEX (asset_alias_asset_asset_idx)
                   STRAIGHT_JOIN {{ns}}.dag_condition_alias ca FORCE INDEX (dag_condition_alias_alias_idx)
                      ON ca.alias_id = aa.alias_id
                  WHERE aa.asset_id = NEW.asset_id
                   LOCK IN SHARE MODE)) t
          STRAIGHT_JOIN {{ns}}.dag d FORCE INDEX (PRIMARY) ON d.dag_id = t.dag_id
         WHERE NOT d.is_paused OR d.queue_while_paused
          LOCK IN SHARE MODE;
    END IF;

    -- Partitioned consumers (migration 0009_partitions): each of their new queue rows gets its
    -- row in asset_partition_queue, with the consumer's key the event maps to (partition_map
    -- signals AQ011 for an event it cannot map: the registration fails, nothing is written).
    -- Read back from the queue rows written above, so it is exactly those. Usually no consumer
    -- of the asset is partitioned: one look at its reference rows, read above already; through
    -- an alias the consumers are looked at too (identity mapping).
    SELECT COUNT(*) INTO v_partitioned
      FROM {{ns}}.dag_schedule_asset_reference r FORCE INDEX (PRIMARY)
     WHERE r.asset_id = NEW.asset_id AND r.partition_mapping IS NOT NULL;
    IF v_partitioned > 0 OR v_resolutions > 0 THEN
        CALL {{ns}}.partition_fan_out(NEW.id, NEW.asset_id, NEW.partition_key, NEW.`timestamp`);
    END IF;
END $$
DELIMITER ;

-- Every consumer gets its lock row in the statement that creates it, however it is created.
DROP TRIGGER IF EXISTS {{ns}}.dag_add_lock_row;
CREATE TRIGGER {{ns}}.dag_add_lock_row
    AFTER INSERT ON {{ns}}.dag
    FOR EACH ROW
    INSERT INTO {{ns}}.dag_lock (dag_id) VALUES (NEW.dag_id);


-- Routines. Errors are SIGNALed with SQLSTATE 45000 and a message that starts with assetq's
-- code in brackets ("[AQ001] unknown asset 'x'"): the Python layer maps the code to the same
-- exception as on PostgreSQL. Messages are cut to 128 characters, MySQL's limit for
-- MESSAGE_TEXT. Parameters and variables name their character set and collation: they would
-- otherwise take the database's defaults, which in a user's own database may be latin1.
--
-- MySQL 8 / MariaDB: procedures, not stored functions. With binary logging on (MySQL 8's
-- default) creating a function needs SUPER or log_bin_trust_function_creators; procedures
-- do not. So resolve_asset returns its id through an OUT parameter.
--
-- No routine starts or ends a transaction: START TRANSACTION inside a procedure would silently
-- commit the caller's work. After an error, a procedure's earlier statements are still in the
-- caller's transaction: callers roll back (the Python layer always does).

DELIMITER $$

-- Looks an asset up by name, then by uri. Raises AQ001 when neither matches.
DROP PROCEDURE IF EXISTS {{ns}}.resolve_asset $$
CREATE PROCEDURE {{ns}}.resolve_asset(
    IN  p_asset    TEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin,
    OUT p_asset_id BIGINT
)
READS SQL DATA
BEGIN
    DECLARE v_message VARCHAR(128) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin;
    SET p_asset_id = NULL;
    SELECT a.id INTO p_asset_id FROM {{ns}}.asset a WHERE a.name = p_asset;
    IF p_asset_id IS NULL THEN
        SELECT a.id INTO p_asset_id FROM {{ns}}.asset a WHERE a.uri = p_asset;
        IF p_asset_id IS NULL THEN
            SET v_message = LEFT(CONCAT('[AQ001] unknown asset ', QUOTE(LEFT(p_asset, 64)),
                                        ': declare it first (assetq.declare_asset)'), 128);
            SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = v_message;
        END IF;
    END IF;
END $$


-- Registers one event in the caller's transaction and returns it as one result set
-- (event_id, asset_id, event_timestamp, created), in one round trip. With an idempotency key,
-- a retry (same asset, same key) returns the original event with created = 0 and queues
-- nothing; the same key with a different extra raises AQ005.
DROP PROCEDURE IF EXISTS {{ns}}.register_event $$
CREATE PROCEDURE {{ns}}.register_event(
    IN p_asset            TEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin,
    IN p_extra            JSON,
    IN p_source_dag_id    TEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin,
    IN p_source_task_id   TEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin,
    IN p_source_run_id    TEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin,
    IN p_source_map_index INT,
    IN p_idempotency_key  TEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin
)
MODIFIES SQL DATA
BEGIN
    DECLARE v_asset_id  BIGINT;
    DECLARE v_event_id  BIGINT;
    DECLARE v_timestamp DATETIME(6);
    DECLARE v_extra     JSON DEFAULT COALESCE(p_extra, JSON_OBJECT());
    DECLARE v_old_extra JSON;
    DECLARE v_duplicate BOOLEAN DEFAULT FALSE;
    DECLARE v_kind      VARCHAR(32) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin;
    DECLARE v_message   VARCHAR(128) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin;

    -- MySQL 8 / MariaDB: MySQL rejects invalid JSON text when it binds a JSON parameter
    -- (error 3140); MariaDB's JSON is text and accepts anything, hence JSON_VALID first. A
    -- CASE, not OR: JSON_TYPE of invalid text is an error in a strict-mode routine, and OR
    -- does not promise to stop at its first true operand.
    SET v_kind = CASE WHEN JSON_VALID(v_extra) THEN JSON_TYPE(v_extra) ELSE 'invalid JSON' END;
    IF v_kind <> 'OBJECT' THEN
        SET v_message = CONCAT('[AQ002] event extra must be a JSON object, got ', v_kind);
        SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = v_message;
    END IF;
    -- The usual case, a name, inline: a nested CALL costs more than the lookup.
    SELECT a.id INTO v_asset_id FROM {{ns}}.asset a WHERE a.name = p_asset;
    IF v_asset_id IS NULL THEN
        CALL {{ns}}.resolve_asset(p_asset, v_asset_id);  -- by uri, or AQ001
    END IF;
    SET v_timestamp = UTC_TIMESTAMP(6);

    -- Insert first, look up only on a duplicate key: no read-then-insert race, and no lock on
    -- a missing key. A handler for 1062 (duplicate key) alone, not INSERT IGNORE, which would
    -- also turn a foreign-key or check failure into a silent warning. The duplicate check
    -- waits for a concurrent registration with the same key to commit or roll back, like
    -- PostgreSQL's ON CONFLICT; the failed INSERT is undone, the transaction goes on.
    -- MySQL 8 / MariaDB: no RETURNING on MySQL; the new id comes from LAST_INSERT_ID().
    BEGIN
        DECLARE CONTINUE HANDLER FOR 1062 SET v_duplicate = TRUE;
        INSERT INTO {{ns}}.asset_event
               (asset_id, extra, source_dag_id, source_task_id, source_run_id,
                source_map_index, idempotency_key, `timestamp`)
        VALUES (v_asset_id, v_extra, p_source_dag_id, p_source_task_id, p_source_run_id,
                COALESCE(p_source_map_index, -1), p_idempotency_key, v_timestamp);
    END;

    IF v_duplicate THEN
        -- A locking read: at REPEATABLE READ the caller's snapshot may be older than the
        -- original's commit, and a plain read would not see it.
        -- MySQL 8 / MariaDB: FOR SHARE is MySQL-only; LOCK IN SHARE MODE works on both.
        SELECT e.id, e.`timestamp`, e.extra INTO v_event_id, v_timestamp, v_old_extra
          FROM {{ns}}.asset_event e
         WHERE e.asset_id = v_asset_id AND e.idempotency_key = p_idempotency_key
          LOCK IN SHARE MODE;
        -- MySQL 8 / MariaDB: JSON_EQUALS is MariaDB-only. JSON_EXTRACT(x, '$') is a
        -- normalized JSON value on both: MySQL compares two of them as JSON (key order and
        -- whitespace ignored); MariaDB re-serializes the text (whitespace ignored, key order
        -- kept). assetq's Python sends keys sorted, so its retries compare equal on both; a
        -- raw caller that reorders keys gets AQ005 on MariaDB, never a silent merge.
        IF NOT (JSON_EXTRACT(v_old_extra, '$') <=> JSON_EXTRACT(v_extra, '$')) THEN
            SET v_message = LEFT(CONCAT('[AQ005] idempotency key ', QUOTE(LEFT(p_idempotency_key, 40)),
                                        ' was already used for event ', v_event_id,
                                        ' of this asset with a different extra'), 128);
            SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = v_message;
        END IF;
        SELECT v_event_id AS event_id, v_asset_id AS asset_id,
               v_timestamp AS event_timestamp, FALSE AS created;
    ELSE
        SELECT LAST_INSERT_ID() AS event_id, v_asset_id AS asset_id,
               v_timestamp AS event_timestamp, TRUE AS created;
    END IF;
END $$



-- The body of register_events (see there for what it guarantees), without its result set:
-- inserts the batch p_events in the caller's transaction and leaves one row per item in the
-- session temporary table _assetq_batch, which the caller reads and drops. register_events
-- and complete_run (a run's output events) both call it, so a run's events are registered
-- exactly as a producer's batch. MySQL 8 / MariaDB: a SELECT in a procedure called from
-- another one still sends its rows to the client, so complete_run cannot CALL
-- register_events: its CALL would return two result sets (tests/test_mysql_facts.py).
DROP PROCEDURE IF EXISTS {{ns}}.insert_event_batch $$
CREATE PROCEDURE {{ns}}.insert_event_batch(
    IN  p_events    JSON,
    OUT p_first_id  BIGINT,
    OUT p_timestamp DATETIME(6)
)
MODIFIES SQL DATA
BEGIN
    DECLARE v_count     INT;
    DECLARE v_item_no   INT DEFAULT 0;
    DECLARE v_bad       INT;
    DECLARE v_kind      VARCHAR(32) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin;
    DECLARE v_name      VARCHAR(1024) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin;
    DECLARE v_asset_id  BIGINT;
    DECLARE v_extra     JSON;
    DECLARE v_dag_id    VARCHAR(1024) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin;
    DECLARE v_task_id   VARCHAR(1024) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin;
    DECLARE v_run_id    VARCHAR(1024) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin;
    DECLARE v_map_index INT;
    DECLARE v_key       VARCHAR(1024) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin;
    DECLARE v_part      VARCHAR(1024) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin;
    DECLARE v_old_part  VARCHAR(250) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin;
    DECLARE v_event_id  BIGINT;
    DECLARE v_first_id  BIGINT;
    DECLARE v_timestamp DATETIME(6);
    DECLARE v_old_extra JSON;
    DECLARE v_old_timestamp DATETIME(6);
    DECLARE v_duplicate BOOLEAN;
    DECLARE v_aliases   BOOLEAN DEFAULT FALSE;
    DECLARE v_pos       BIGINT DEFAULT 0;
    DECLARE v_alias_id  BIGINT;
    DECLARE v_message   VARCHAR(128) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin;

    -- IF, not a CASE as in register_event: in this routine MariaDB 10.11 evaluated the CASE's
    -- JSON_TYPE on invalid text although its JSON_VALID branch was false, and failed with
    -- error 4037 instead of AQ002 (tests/test_direct_sql.py, batch-invalid-json).
    SET v_kind = 'invalid JSON';
    IF p_events IS NULL THEN
        SET v_kind = 'NULL';
    ELSEIF JSON_VALID(p_events) THEN
        SET v_kind = JSON_TYPE(p_events);
    END IF;
    IF v_kind <> 'ARRAY' THEN
        SET v_message = CONCAT('[AQ002] events must be a JSON array, got ', v_kind);
        SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = v_message;
    END IF;
    SET v_count = JSON_LENGTH(p_events);
    IF v_count > 10000 THEN
        SET v_message = CONCAT('[AQ002] a batch holds at most 10000 events, got ', v_count,
                               ': split it into several calls in one transaction');
        SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = v_message;
    END IF;

    -- The items, parsed once. A session temporary table (a failed call's is dropped by the
    -- next). Text columns are wider than the event table's: a value too long reaches the
    -- INSERT, which refuses it in strict mode (1406), instead of being cut short here.
    DROP TEMPORARY TABLE IF EXISTS {{ns}}._assetq_batch, {{ns}}._assetq_batch_alias,
                                   {{ns}}._assetq_alias_name, {{ns}}._assetq_alias_pair;
    CREATE TEMPORARY TABLE {{ns}}._assetq_batch (
        item_no          INT NOT NULL PRIMARY KEY,
        item_type        VARCHAR(32) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL,
        asset            VARCHAR(1024) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL,
        extra            LONGTEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL,
        source_dag_id    VARCHAR(1024) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL,
        source_task_id   VARCHAR(1024) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL,
        source_run_id    VARCHAR(1024) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL,
        source_map_index INT NULL,
        idempotency_key  VARCHAR(1024) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL,
        aliases          LONGTEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL,
        partition_key    VARCHAR(1024) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL,
        partition_type   VARCHAR(32) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL,
        asset_id         BIGINT NULL,
        event_id         BIGINT NULL,
        event_timestamp  DATETIME(6) NULL,
        created          BOOLEAN NULL,
        KEY (asset(255))
    ) ENGINE = InnoDB;
    INSERT INTO {{ns}}._assetq_batch
           (item_no, item_type, asset, extra, source_dag_id, source_task_id, source_run_id,
            source_map_index, idempotency_key, aliases, partition_key, partition_type)
    SELECT j.item_no, JSON_TYPE(j.item), j.asset,
           CASE WHEN j.extra IS NULL OR JSON_TYPE(j.extra) = 'NULL' THEN '{}' ELSE j.extra END,
           j.source_dag_id, j.source_task_id, j.source_run_id,
           COALESCE(j.source_map_index, -1), j.idempotency_key,
           CASE WHEN j.aliases IS NULL OR JSON_TYPE(j.aliases) = 'NULL' THEN NULL ELSE j.aliases END,
           j.partition_key, JSON_TYPE(j.partition_json)
      FROM JSON_TABLE(p_events, '$[*]' COLUMNS (
               item_no          FOR ORDINALITY,
               item             JSON PATH '$',
               asset            VARCHAR(1024) PATH '$.asset',
               extra            JSON PATH '$.extra',
               source_dag_id    VARCHAR(1024) PATH '$.source_dag_id',
               source_task_id   VARCHAR(1024) PATH '$.source_task_id',
               source_run_id    VARCHAR(1024) PATH '$.source_run_id',
               source_map_index INT PATH '$.source_map_index',
               idempotency_key  VARCHAR(1024) PATH '$.idempotency_key',
               aliases          JSON PATH '$.aliases',
               partition_key    VARCHAR(1024) PATH '$.partition_key',
               partition_json   JSON PATH '$.partition_key')) AS j;

    SET v_bad = NULL;
    SELECT b.item_no, b.item_type INTO v_bad, v_kind
      FROM {{ns}}._assetq_batch b WHERE b.item_type <> 'OBJECT' ORDER BY b.item_no LIMIT 1;
    IF v_bad IS NOT NULL THEN
        SET v_message = CONCAT('[AQ002] event ', v_bad, ' of the batch must be a JSON object, got ', v_kind);
        SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = v_message;
    END IF;
    SELECT b.item_no, JSON_TYPE(b.extra) INTO v_bad, v_kind
      FROM {{ns}}._assetq_batch b WHERE JSON_TYPE(b.extra) <> 'OBJECT' ORDER BY b.item_no LIMIT 1;
    IF v_bad IS NOT NULL THEN
        SET v_message = CONCAT('[AQ002] event extra must be a JSON object, got ', v_kind,
                               ' (event ', v_bad, ' of the batch)');
        SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = v_message;
    END IF;

    -- Partition keys (migration 0009_partitions): a string of 1 to 250 characters, or none.
    SELECT b.item_no INTO v_bad
      FROM {{ns}}._assetq_batch b
     WHERE b.partition_type IS NOT NULL AND b.partition_type <> 'NULL'
       AND (b.partition_type <> 'STRING' OR CHAR_LENGTH(b.partition_key) NOT BETWEEN 1 AND 250
            OR CHAR_LENGTH(b.partition_key) <> CHAR_LENGTH(RTRIM(b.partition_key)))
     ORDER BY b.item_no LIMIT 1;
    IF v_bad IS NOT NULL THEN
        SET v_message = CONCAT('[AQ002] partition_key must be a string of 1 to 250 characters,',
                               ' not ending with a space (event ', v_bad, ' of the batch)');
        SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = v_message;
    END IF;
    UPDATE {{ns}}._assetq_batch SET partition_key = NULL WHERE partition_type = 'NULL';

    -- Aliases: an array of 1 to 100 names of 1 to 512 characters. The names are read as JSON
    -- and measured unquoted, so a name too long is refused, never cut short. One scan tells
    -- whether any item has aliases; a batch without (the usual case) skips every alias step.
    SELECT COUNT(*) > 0 INTO v_aliases FROM {{ns}}._assetq_batch b WHERE b.aliases IS NOT NULL;
    IF v_aliases THEN
        SELECT b.item_no INTO v_bad
          FROM {{ns}}._assetq_batch b
         WHERE b.aliases IS NOT NULL
           AND (JSON_TYPE(b.aliases) <> 'ARRAY' OR JSON_LENGTH(b.aliases) NOT BETWEEN 1 AND 100)
         ORDER BY b.item_no LIMIT 1;
    END IF;
    IF v_aliases AND v_bad IS NULL THEN
        SELECT MIN(b.item_no) INTO v_bad
          FROM {{ns}}._assetq_batch b,
               JSON_TABLE(b.aliases, '$[*]' COLUMNS (alias JSON PATH '$')) AS x
         WHERE b.aliases IS NOT NULL
           AND (COALESCE(JSON_TYPE(x.alias), 'NULL') <> 'STRING'
                OR CHAR_LENGTH(JSON_UNQUOTE(x.alias)) NOT BETWEEN 1 AND 512);
    END IF;
    IF v_bad IS NOT NULL THEN
        SET v_message = LEFT(CONCAT('[AQ002] aliases must be a JSON array of 1 to 100 alias names of 1 to 512',
                                    ' characters (event ', v_bad, ' of the batch)'), 128);
        SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = v_message;
    END IF;

    -- Every asset first, each distinct one once (name, then uri), in item order, so the first
    -- unknown one in the batch is the one reported and nothing has been inserted yet. Plain
    -- reads, as in register_event: an UPDATE ... JOIN or INSERT ... SELECT reading asset would
    -- take shared next-key locks there at REPEATABLE READ, and a lookup that misses (a uri) would
    -- leave a gap lock that blocks declaring new assets until the caller commits.
    resolve_loop: LOOP
        SET v_name = NULL, v_bad = NULL;
        SELECT b.item_no, b.asset INTO v_bad, v_name
          FROM {{ns}}._assetq_batch b
         WHERE b.item_no > v_item_no AND b.asset_id IS NULL
         ORDER BY b.item_no LIMIT 1;
        IF v_bad IS NULL THEN
            LEAVE resolve_loop;
        END IF;
        SET v_item_no = v_bad, v_asset_id = NULL;
        SELECT a.id INTO v_asset_id FROM {{ns}}.asset a WHERE a.name = v_name;
        IF v_asset_id IS NULL THEN
            SELECT a.id INTO v_asset_id FROM {{ns}}.asset a WHERE a.uri = v_name;
        END IF;
        IF v_asset_id IS NULL THEN
            SET v_message = LEFT(CONCAT('[AQ001] unknown asset ', COALESCE(QUOTE(LEFT(v_name, 48)), 'NULL'),
                                        ' (event ', v_item_no, ' of the batch): declare it first'), 128);
            SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = v_message;
        END IF;
        UPDATE {{ns}}._assetq_batch SET asset_id = v_asset_id WHERE asset = v_name;
    END LOOP;

    -- Aliases, created if new and resolved to their item's asset before the events are
    -- inserted, so that the fan-out sees the resolution. Sorted, so concurrent batches lock in
    -- one order. Plain reads first: a resolution that exists already (the usual case) costs
    -- a lookup and takes no lock; only a missing one is inserted (a duplicate key, from a
    -- concurrent producer, is ignored by its handler, not by INSERT IGNORE, which would hide a
    -- foreign-key failure too).
    -- MySQL 8 / MariaDB: MySQL cannot open one temporary table twice in a statement, hence one
    -- temporary table per step.
    IF v_aliases THEN
        CREATE TEMPORARY TABLE {{ns}}._assetq_batch_alias (
            item_no INT NOT NULL,
            name    VARCHAR(512) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
            PRIMARY KEY (item_no, name)
        ) ENGINE = InnoDB;
        CREATE TEMPORARY TABLE {{ns}}._assetq_alias_name (
            pos      BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY,
            name     VARCHAR(512) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
            alias_id BIGINT NULL,
            UNIQUE KEY (name)
        ) ENGINE = InnoDB;
        CREATE TEMPORARY TABLE {{ns}}._assetq_alias_pair (
            pos      BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY,
            alias_id BIGINT NOT NULL,
            asset_id BIGINT NOT NULL,
            UNIQUE KEY (alias_id, asset_id)
        ) ENGINE = InnoDB;
        INSERT INTO {{ns}}._assetq_batch_alias (item_no, name)
        SELECT DISTINCT b.item_no, JSON_UNQUOTE(x.alias)
          FROM {{ns}}._assetq_batch b,
               JSON_TABLE(b.aliases, '$[*]' COLUMNS (alias JSON PATH '$')) AS x
         WHERE b.aliases IS NOT NULL;
        INSERT INTO {{ns}}._assetq_alias_name (name)
        SELECT DISTINCT ba.name FROM {{ns}}._assetq_batch_alias ba ORDER BY ba.name;

        alias_loop: LOOP
            SET v_name = NULL;
            SELECT n.pos, n.name INTO v_pos, v_name
              FROM {{ns}}._assetq_alias_name n WHERE n.pos > v_pos ORDER BY n.pos LIMIT 1;
            IF v_name IS NULL THEN
                LEAVE alias_loop;
            END IF;
            SET v_alias_id = NULL;
            SELECT al.id INTO v_alias_id FROM {{ns}}.asset_alias al WHERE al.name = v_name;
            IF v_alias_id IS NULL THEN
                -- Created meanwhile by a concurrent producer: the duplicate key hands back its id.
                INSERT INTO {{ns}}.asset_alias (name) VALUES (v_name)
                ON DUPLICATE KEY UPDATE id = LAST_INSERT_ID(id);
                SET v_alias_id = LAST_INSERT_ID();
            END IF;
            UPDATE {{ns}}._assetq_alias_name SET alias_id = v_alias_id WHERE pos = v_pos;
        END LOOP;

        INSERT INTO {{ns}}._assetq_alias_pair (alias_id, asset_id)
        SELECT DISTINCT n.alias_id, b.asset_id
          FROM {{ns}}._assetq_batch_alias ba
          JOIN {{ns}}._assetq_alias_name n ON n.name = ba.name
          JOIN {{ns}}._assetq_batch b ON b.item_no = ba.item_no
         ORDER BY n.alias_id, b.asset_id;
        SET v_pos = 0;
        pair_loop: LOOP
            SET v_alias_id = NULL;
            SELECT p.pos, p.alias_id, p.asset_id INTO v_pos, v_alias_id, v_asset_id
              FROM {{ns}}._assetq_alias_pair p WHERE p.pos > v_pos ORDER BY p.pos LIMIT 1;
            IF v_alias_id IS NULL THEN
                LEAVE pair_loop;
            END IF;
            -- A SELECT ... INTO, not IF EXISTS (SELECT ...): InnoDB reads a subquery in a
            -- routine's IF condition with shared locks, at any isolation level, and that lock
            -- would deadlock with delete_asset.
            SELECT COUNT(*) INTO v_bad
              FROM {{ns}}.asset_alias_asset aa
             WHERE aa.alias_id = v_alias_id AND aa.asset_id = v_asset_id;
            IF v_bad = 0 THEN
                -- The asset row first, with the shared lock the foreign-key check of the insert
                -- takes anyway: InnoDB checks it only after writing the new row, and
                -- delete_asset, which locks the asset and then deletes its resolutions, would
                -- deadlock with a producer holding the new row. An asset deleted since it was
                -- looked up is unknown.
                SET v_bad = NULL;
                SELECT 1 INTO v_bad FROM {{ns}}.asset a WHERE a.id = v_asset_id LOCK IN SHARE MODE;
                IF v_bad IS NULL THEN
                    SET v_message = '[AQ001] unknown asset: it was deleted while the event was being registered';
                    SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = v_message;
                END IF;
                BEGIN
                    DECLARE CONTINUE HANDLER FOR 1062 BEGIN END;
                    INSERT INTO {{ns}}.asset_alias_asset (alias_id, asset_id, created_at)
                    VALUES (v_alias_id, v_asset_id, UTC_TIMESTAMP(6));
                END;
            END IF;
        END LOOP;
    END IF;

    -- One timestamp for the whole batch: taken once, copied to every queue row by the trigger.
    SET v_timestamp = UTC_TIMESTAMP(6), v_duplicate = FALSE;

    -- The fast path: one multi-row INSERT ... SELECT. MySQL 8 has no RETURNING, so the items' ids
    -- come from LAST_INSERT_ID() (the first id of the statement) and the item order, which is
    -- exact only where InnoDB documents the ids of one INSERT ... SELECT as consecutive: at
    -- innodb_autoinc_lock_mode 0 or 1 (MariaDB's default) the statement holds the table's AUTO-INC
    -- lock to its end (other inserts of events wait for the statement, its per-row triggers
    -- included, but not for the transaction). A duplicate idempotency key (a retry, or two items
    -- sharing a key) fails the statement with 1062; InnoDB rolls the statement back, its trigger
    -- rows included, and the batch goes the slow path. The 1062 check waits for a concurrent
    -- registration with the same key to commit or roll back, like PostgreSQL's ON CONFLICT.
    IF @@GLOBAL.innodb_autoinc_lock_mode <= 1 THEN
        BEGIN
            DECLARE CONTINUE HANDLER FOR 1062 SET v_duplicate = TRUE;
            INSERT INTO {{ns}}.asset_event
                   (asset_id, extra, source_dag_id, source_task_id, source_run_id,
                    source_map_index, idempotency_key, `timestamp`, partition_key)
            SELECT b.asset_id, b.extra, b.source_dag_id, b.source_task_id, b.source_run_id,
                   b.source_map_index, b.idempotency_key, v_timestamp, b.partition_key
              FROM {{ns}}._assetq_batch b
             ORDER BY b.item_no;
        END;
        -- LAST_INSERT_ID() is the id of the statement's first row; item n has that + n - 1.
        SET v_first_id = IF(v_duplicate, NULL, LAST_INSERT_ID());
    ELSE
        -- MySQL 8's default, interleaved: the ids of one statement may have gaps.
        SET v_duplicate = TRUE;
    END IF;

    -- The slow path: one INSERT per event, exactly as register_event (see there), with its
    -- duplicate handling; the row-level trigger fans out per row either way.
    SET v_item_no = 0;
    WHILE v_duplicate AND v_item_no < v_count DO
        SET v_item_no = v_item_no + 1;
        SELECT b.asset_id, b.extra, b.source_dag_id, b.source_task_id, b.source_run_id,
               b.source_map_index, b.idempotency_key, b.partition_key
          INTO v_asset_id, v_extra, v_dag_id, v_task_id, v_run_id, v_map_index, v_key, v_part
          FROM {{ns}}._assetq_batch b WHERE b.item_no = v_item_no;
        SET v_old_extra = NULL;
        BEGIN
            DECLARE CONTINUE HANDLER FOR 1062
                SELECT e.id, e.`timestamp`, e.extra, e.partition_key
                  INTO v_event_id, v_old_timestamp, v_old_extra, v_old_part
                  FROM {{ns}}.asset_event e
                 WHERE e.asset_id = v_asset_id AND e.idempotency_key = v_key
                  LOCK IN SHARE MODE;
            INSERT INTO {{ns}}.asset_event
                   (asset_id, extra, source_dag_id, source_task_id, source_run_id,
                    source_map_index, idempotency_key, `timestamp`, partition_key)
            VALUES (v_asset_id, v_extra, v_dag_id, v_task_id, v_run_id, v_map_index, v_key,
                    v_timestamp, v_part);
        END;
        IF v_old_extra IS NULL THEN
            UPDATE {{ns}}._assetq_batch
               SET event_id = LAST_INSERT_ID(), event_timestamp = v_timestamp, created = TRUE
             WHERE item_no = v_item_no;
        ELSEIF JSON_EXTRACT(v_old_extra, '$') <=> JSON_EXTRACT(v_extra, '$')
               AND v_old_part <=> v_part THEN
            UPDATE {{ns}}._assetq_batch
               SET event_id = v_event_id, event_timestamp = v_old_timestamp, created = FALSE
             WHERE item_no = v_item_no;
        ELSE
            SET v_message = LEFT(CONCAT('[AQ005] idempotency key ', QUOTE(LEFT(v_key, 24)),
                                        ' was already used for event ', v_event_id,
                                        ' with a different extra or partition (event ', v_item_no,
                                        ' of the batch)'), 128);
            SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = v_message;
        END IF;
    END WHILE;

    -- The aliases of the events this call created (not of an event a retry met).
    IF v_aliases THEN
        IF v_first_id IS NOT NULL THEN
            UPDATE {{ns}}._assetq_batch
               SET event_id = v_first_id + item_no - 1, created = TRUE
             WHERE aliases IS NOT NULL;
        END IF;
        INSERT INTO {{ns}}.asset_event_alias (asset_event_id, alias_id)
        SELECT DISTINCT b.event_id, n.alias_id
          FROM {{ns}}._assetq_batch b
          JOIN {{ns}}._assetq_batch_alias ba ON ba.item_no = b.item_no
          JOIN {{ns}}._assetq_alias_name n ON n.name = ba.name
         WHERE b.created
         ORDER BY b.event_id, n.alias_id;
    END IF;

    -- The result, for the caller to read (register_events returns it as it is):
    -- _assetq_batch holds the items, with event_id, event_timestamp and created filled in
    -- by the row-by-row path; p_first_id is the fast path's first id (item n got
    -- p_first_id + n - 1, created, at p_timestamp), NULL after the row-by-row path.
    SET p_first_id = v_first_id, p_timestamp = v_timestamp;
    DROP TEMPORARY TABLE IF EXISTS {{ns}}._assetq_batch_alias, {{ns}}._assetq_alias_name,
                                   {{ns}}._assetq_alias_pair;
END $$


-- register_events, as in 0002, plus aliases: an item may carry "aliases", a JSON array of 1 to
-- 100 alias names (1 to 512 characters; null or absent: none). Before the events are
-- inserted, each alias is created if new and resolved to its item's asset, so the fan-out
-- already queues the event for the alias's consumers; each created event records the aliases
-- it came through. A retry (an idempotency key that met an existing event) records nothing new.
--
-- Registers a batch of events in the caller's transaction, in one round trip, and returns one
-- result set with one row per item in input order (item_no, event_id, asset_id,
-- event_timestamp, created), with register_event's guarantees for each. p_events is a JSON
-- array of at most 10,000 objects {"asset": name or uri, "extra", "source_dag_id",
-- "source_task_id", "source_run_id", "source_map_index", "idempotency_key", "aliases",
-- "partition_key"}; only "asset" is required. The events of one batch share one timestamp.
--
-- All or nothing, once the caller rolls back on error (as after any routine error here).
-- Every item is checked and every asset resolved before anything is written: one unknown asset
-- (AQ001) or extra that is not an object, or bad aliases (AQ002) fails the call with nothing
-- inserted. A key reused with another extra (AQ005), or a value the table refuses, fails it
-- after some rows may have been inserted in the caller's transaction. Items with the same
-- asset and idempotency key are one event, as retries would be: the first creates it (unless
-- it exists already), the others return it with created = 0. MySQL has no statement-level
-- triggers: the row-level trigger fans out each event of the batch.
--
-- Under autocommit each statement of a procedure commits on its own, so the row-by-row path
-- is atomic only inside a transaction: the Python layer opens one on an autocommit
-- connection.
--
-- Since migration 0006_work_queue the work is done by insert_event_batch, through which
-- complete_run registers a run's output events too; this procedure returns its rows, the
-- same result as before.
DROP PROCEDURE IF EXISTS {{ns}}.register_events $$
CREATE PROCEDURE {{ns}}.register_events(IN p_events JSON)
MODIFIES SQL DATA
BEGIN
    DECLARE v_first_id  BIGINT;
    DECLARE v_timestamp DATETIME(6);
    CALL {{ns}}.insert_event_batch(p_events, v_first_id, v_timestamp);
    IF v_first_id IS NULL THEN
        SELECT b.item_no, b.event_id, b.asset_id, b.event_timestamp, b.created
          FROM {{ns}}._assetq_batch b
         ORDER BY b.item_no;
    ELSE
        SELECT b.item_no, v_first_id + b.item_no - 1 AS event_id, b.asset_id,
               v_timestamp AS event_timestamp, TRUE AS created
          FROM {{ns}}._assetq_batch b
         ORDER BY b.item_no;
    END IF;
    DROP TEMPORARY TABLE IF EXISTS {{ns}}._assetq_batch;
END $$

-- Declares an asset (idempotent) and returns its id as one result set (asset_id). An existing
-- asset keeps its id; a given uri or extra replaces the stored one, and it counts as declared.
-- When no asset has the name yet but a consumer referenced the uri before anyone declared it
-- (an undeclared asset with that uri, or named by it without a uri), that asset takes the
-- name: it keeps its id, so the consumers that referenced it get its events. A uri that
-- belongs to another asset is refused (AQ002), nothing written.
DROP PROCEDURE IF EXISTS {{ns}}.declare_asset $$
CREATE PROCEDURE {{ns}}.declare_asset(
    IN p_name  TEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin,
    IN p_uri   TEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin,
    IN p_extra JSON
)
MODIFIES SQL DATA
BEGIN
    DECLARE v_id       BIGINT;
    DECLARE v_uri_id   BIGINT;
    DECLARE v_uri_name VARCHAR(512) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin;
    DECLARE v_declared BOOLEAN;
    DECLARE v_kind     VARCHAR(32) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin;
    DECLARE v_message  VARCHAR(128) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin;

    SET v_kind = CASE WHEN p_extra IS NULL THEN 'OBJECT'
                      WHEN JSON_VALID(p_extra) THEN JSON_TYPE(p_extra)
                      ELSE 'invalid JSON' END;
    IF v_kind <> 'OBJECT' THEN
        SET v_message = CONCAT('[AQ002] asset extra must be a JSON object, got ', v_kind);
        SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = v_message;
    END IF;
    IF p_uri IS NOT NULL THEN
        -- The asset that holds the uri, or an undeclared one named by it. Plain reads: a
        -- locking read that misses would leave a gap lock on the index, and two declarations
        -- of new assets would deadlock on it. The row found is then locked by key (a record
        -- lock) and read again: its latest version decides.
        SELECT a.id INTO v_uri_id FROM {{ns}}.asset a WHERE a.uri = p_uri;
        IF v_uri_id IS NULL THEN
            SELECT a.id INTO v_uri_id
              FROM {{ns}}.asset a
             WHERE a.name = p_uri AND a.uri IS NULL AND NOT a.declared AND a.name <> p_name;
        END IF;
        IF v_uri_id IS NOT NULL THEN
            SELECT a.name, a.declared INTO v_uri_name, v_declared
              FROM {{ns}}.asset a WHERE a.id = v_uri_id
               FOR UPDATE;
        END IF;
        IF v_uri_name <> p_name THEN
            SELECT a.id INTO v_id FROM {{ns}}.asset a WHERE a.name = p_name;
            IF v_declared OR v_id IS NOT NULL THEN
                SET v_message = LEFT(CONCAT('[AQ002] uri ', QUOTE(LEFT(p_uri, 48)),
                                            ' already belongs to asset ', QUOTE(LEFT(v_uri_name, 48))), 128);
                SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = v_message;
            END IF;
            -- The undeclared asset takes the name, keeping its id.
            UPDATE {{ns}}.asset
               SET name = p_name, uri = p_uri, extra = COALESCE(p_extra, extra), declared = TRUE
             WHERE id = v_uri_id;
            SET v_id = v_uri_id;
        END IF;
    END IF;
    IF v_id IS NULL THEN
        -- The uri stays out of this INSERT: ON DUPLICATE KEY UPDATE fires on a conflict with
        -- ANY unique key, so a uri that belongs to another asset would update that other
        -- asset. Here only the name can conflict; id = LAST_INSERT_ID(id) makes
        -- LAST_INSERT_ID() the existing row's id on a conflict (MySQL 8 / MariaDB: no
        -- RETURNING on MySQL).
        INSERT INTO {{ns}}.asset (name, extra, declared)
        VALUES (p_name, COALESCE(p_extra, JSON_OBJECT()), TRUE)
        ON DUPLICATE KEY UPDATE extra = COALESCE(p_extra, extra), declared = TRUE,
                                id = LAST_INSERT_ID(id);
        SET v_id = LAST_INSERT_ID();
        -- By key: the uri is free or already this asset's (checked above); one taken
        -- meanwhile fails with a duplicate-key error, never touching the other asset.
        IF p_uri IS NOT NULL THEN
            UPDATE {{ns}}.asset SET uri = p_uri WHERE id = v_id;
        END IF;
    END IF;
    SELECT v_id AS asset_id;
END $$


-- Partitions (migration 0009_partitions). Maps partition key p_key of an event of asset
-- p_asset_id to partitioned consumer p_dag_id's key under p_mapping (target_key), and gives
-- the key as the mapping counts it (source_key), as PostgreSQL's partition_map does:
--   identity      the key itself;
--   hour_to_day   'YYYY-MM-DDTHH' (optionally ':00' or ':00:00', optionally 'Z' or '+00:00':
--                 hours of UTC) -> 'YYYY-MM-DD'; source_key 'YYYY-MM-DDTHH';
--   day_to_week   'YYYY-MM-DD' -> its ISO week 'IYYY-Www' (e.g. 2026-W49);
--   day_to_month  'YYYY-MM-DD' -> 'YYYY-MM';
--   static        the consumer's dag_partition_static_key row for the asset and key.
-- An event without a key, or whose key does not parse or has no static row, signals AQ011:
-- the registration fails and nothing is written (never a silent skip). Days are checked by
-- arithmetic, not by STR_TO_DATE, whose warning strict mode would turn into another error.
-- MySQL 8 / MariaDB: a procedure with OUT parameters, not a function (see resolve_asset).
DROP PROCEDURE IF EXISTS {{ns}}.partition_map $$
CREATE PROCEDURE {{ns}}.partition_map(
    IN  p_dag_id   VARCHAR(250) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin,
    IN  p_asset_id BIGINT,
    IN  p_mapping  VARCHAR(20) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin,
    IN  p_key      VARCHAR(250) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin,
    OUT target_key VARCHAR(250) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin,
    OUT source_key VARCHAR(250) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin
)
READS SQL DATA
BEGIN
    DECLARE v_day     VARCHAR(10) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin;
    DECLARE v_year    INT;
    DECLARE v_month   INT;
    DECLARE v_dom     INT;
    DECLARE v_name    VARCHAR(512) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin;
    DECLARE v_message VARCHAR(128) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin;
    SET target_key = NULL, source_key = NULL;
    -- A key ending with a space, or holding a line break, maps to nothing, as on PostgreSQL:
    -- the binary collation compares 'k ' and 'k' as equal (PAD SPACE), and REGEXP's $ also
    -- matches before a final line break.
    IF p_key IS NOT NULL AND CHAR_LENGTH(p_key) = CHAR_LENGTH(RTRIM(p_key))
       AND INSTR(p_key, CHAR(10)) = 0 THEN
        IF p_mapping = 'identity' THEN
            SET target_key = p_key, source_key = p_key;
        ELSEIF p_mapping = 'static' THEN
            BEGIN
                -- No row is not an error here, and must not reach a caller's NOT FOUND handler.
                DECLARE CONTINUE HANDLER FOR NOT FOUND BEGIN END;
                SELECT s.target_key INTO target_key
                  FROM {{ns}}.dag_partition_static_key s
                 WHERE s.dag_id = p_dag_id AND s.asset_id = p_asset_id AND s.upstream_key = p_key;
            END;
            IF target_key IS NOT NULL THEN
                SET source_key = p_key;
            END IF;
        ELSE
            IF p_mapping = 'hour_to_day'
               AND p_key REGEXP '^[0-9]{4}-[0-9]{2}-[0-9]{2}T([01][0-9]|2[0-3])(:00(:00)?)?(Z|[+]00:00)?$' THEN
                SET v_day = LEFT(p_key, 10);
            ELSEIF p_mapping IN ('day_to_week', 'day_to_month') AND p_key REGEXP '^[0-9]{4}-[0-9]{2}-[0-9]{2}$' THEN
                SET v_day = p_key;
            END IF;
            IF v_day IS NOT NULL THEN
                SET v_year = CAST(LEFT(v_day, 4) AS UNSIGNED),
                    v_month = CAST(SUBSTRING(v_day, 6, 2) AS UNSIGNED),
                    v_dom = CAST(SUBSTRING(v_day, 9, 2) AS UNSIGNED);
                IF v_year >= 1 AND v_month BETWEEN 1 AND 12 AND v_dom >= 1
                   AND v_dom <= CASE WHEN v_month IN (4, 6, 9, 11) THEN 30
                                     WHEN v_month <> 2 THEN 31
                                     WHEN (v_year % 4 = 0 AND v_year % 100 <> 0) OR v_year % 400 = 0 THEN 29
                                     ELSE 28
                                 END
                THEN
                    SET target_key = CASE p_mapping
                                         WHEN 'hour_to_day' THEN v_day
                                         WHEN 'day_to_week' THEN DATE_FORMAT(CAST(v_day AS DATE), '%x-W%v')
                                         ELSE LEFT(v_day, 7)
                                     END,
                        source_key = IF(p_mapping = 'hour_to_day', LEFT(p_key, 13), v_day);
                END IF;
            END IF;
        END IF;
    END IF;
    IF target_key IS NULL THEN
        SELECT a.name INTO v_name FROM {{ns}}.asset a WHERE a.id = p_asset_id;
        IF p_key IS NULL THEN
            SET v_message = LEFT(CONCAT('[AQ011] consumer ', p_dag_id, ' is partitioned: the event of asset ',
                                        QUOTE(LEFT(v_name, 40)), ' needs a partition key'), 128);
        ELSE
            SET v_message = LEFT(CONCAT('[AQ011] partition key ', QUOTE(LEFT(p_key, 30)), ' of asset ',
                                        QUOTE(LEFT(v_name, 24)), ' maps to no partition of consumer ',
                                        p_dag_id, ' (', p_mapping, ')'), 128);
        END IF;
        SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = v_message;
    END IF;
END $$

-- The partitioned part of the fan-out (migration 0009_partitions), called by the trigger on
-- asset_event for an event whose asset has a partitioned consumer (or has alias resolutions):
-- one asset_partition_queue row beside each queue row the trigger wrote for a partitioned
-- consumer, read back by the event's id. No temporary table: it runs inside a trigger.
DROP PROCEDURE IF EXISTS {{ns}}.partition_fan_out $$
CREATE PROCEDURE {{ns}}.partition_fan_out(
    IN p_event_id  BIGINT,
    IN p_asset_id  BIGINT,
    IN p_key       VARCHAR(250) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin,
    IN p_timestamp DATETIME(6)
)
MODIFIES SQL DATA
BEGIN
    DECLARE v_done    BOOLEAN DEFAULT FALSE;
    DECLARE v_dag_id  VARCHAR(250) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin;
    DECLARE v_mapping VARCHAR(20) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin;
    DECLARE v_target  VARCHAR(250) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin;
    DECLARE v_source  VARCHAR(250) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin;
    DECLARE c_rows CURSOR FOR
        SELECT q.target_dag_id, COALESCE(r.partition_mapping, 'identity')
          FROM {{ns}}.asset_dag_run_queue q FORCE INDEX (asset_dag_run_queue_event_idx)
          STRAIGHT_JOIN {{ns}}.dag d FORCE INDEX (PRIMARY) ON d.dag_id = q.target_dag_id
          LEFT JOIN {{ns}}.dag_schedule_asset_reference r FORCE INDEX (PRIMARY)
                 ON r.asset_id = q.asset_id AND r.dag_id = q.target_dag_id
         WHERE q.asset_event_id = p_event_id AND d.partitioning IS NOT NULL
         ORDER BY q.target_dag_id;
    DECLARE CONTINUE HANDLER FOR NOT FOUND SET v_done = TRUE;
    OPEN c_rows;
    row_loop: LOOP
        FETCH c_rows INTO v_dag_id, v_mapping;
        IF v_done THEN
            LEAVE row_loop;
        END IF;
        CALL {{ns}}.partition_map(v_dag_id, p_asset_id, v_mapping, p_key, v_target, v_source);
        INSERT INTO {{ns}}.asset_partition_queue
               (target_dag_id, asset_event_id, partition_key, asset_id, source_key, created_at)
        VALUES (v_dag_id, p_event_id, v_target, p_asset_id, v_source, p_timestamp);
    END LOOP;
    CLOSE c_rows;
END $$

-- Declares or re-declares a consumer. p_condition is the condition as declared (kept for
-- reading back); p_clauses its conjunctive normal form, a JSON array of clauses, each a
-- non-empty array of members: "x" (an asset by name, else by uri), {"name": "x"},
-- {"uri": "x"} (by uri, else by name) or {"alias": "x"}. Assets and aliases named here that
-- do not exist are created (an asset referenced by uri gets the uri as its name too, as in
-- Airflow), marked undeclared. p_paused NULL keeps the current state (new consumers start
-- unpaused); p_max_active_runs and p_max_events_per_run NULL mean no cap (AQ002 below 1);
-- p_queue_while_paused NULL means false. Queued rows of assets the consumer no longer
-- depends on are deleted; the others stay and are consumed by its next run. Returns no
-- result set.
--
-- Retries (migration 0006_work_queue): a run gets p_max_attempts claims (1 to 1000; NULL: 1);
-- after a failed attempt with attempts left it is claimable again p_retry_delay_seconds
-- later (0 to 604800; NULL: 0), doubled for each further failed attempt up to
-- p_max_retry_delay_seconds when that is set (above 0, at least the delay, at most 604800).
-- Anything else raises AQ002.
--
-- The whole replacement happens in the caller's transaction, under the consumer's lock row: a
-- scheduler pass sees the old condition or the new one, never a mix. The rows the fan-out
-- reads are changed in the order it reads them: references, then alias clauses, each in
-- key order, only those that change; the dag row last. A producer in flight for the consumer
-- then either finishes first or waits for the caller's commit, and neither deadlocks with the
-- declaration. (A producer transaction that registers events of several of the consumer's
-- assets can still deadlock with it, at REPEATABLE READ: error 1213, rolled back whole, safe
-- to retry.)
DROP PROCEDURE IF EXISTS {{ns}}.declare_dag $$
CREATE PROCEDURE {{ns}}.declare_dag(
    IN p_dag_id             TEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin,
    IN p_condition          JSON,
    IN p_clauses            JSON,
    IN p_paused             BOOLEAN,
    IN p_max_active_runs    INT,
    IN p_max_events_per_run INT,
    IN p_queue_while_paused BOOLEAN,
    IN p_max_attempts       INT,
    IN p_retry_delay_seconds     DOUBLE,
    IN p_max_retry_delay_seconds DOUBLE
)
MODIFIES SQL DATA
BEGIN
    DECLARE v_bad     BIGINT;
    DECLARE v_exists  BIGINT;
    DECLARE v_partitioned BOOLEAN;
    DECLARE v_pos     BIGINT DEFAULT 0;
    DECLARE v_kind    VARCHAR(8) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin;
    DECLARE v_name    VARCHAR(512) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin;
    DECLARE v_id      BIGINT;
    DECLARE v_row     INT;
    DECLARE v_clause  INT;
    DECLARE v_new     BOOLEAN;
    DECLARE v_pos_kind   INT DEFAULT 0;
    DECLARE v_pos_key    BIGINT DEFAULT 0;
    DECLARE v_pos_clause INT DEFAULT 0;
    DECLARE v_message VARCHAR(128) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin;

    IF p_dag_id IS NULL OR NOT (p_dag_id REGEXP '^[A-Za-z0-9_.-]+$')
       OR CHAR_LENGTH(p_dag_id) > 250 THEN
        SET v_message = LEFT(CONCAT('[AQ002] invalid dag id ', COALESCE(QUOTE(LEFT(p_dag_id, 40)), 'NULL'),
                                    ': use 1 to 250 letters, digits, "_", "." or "-"'), 128);
        SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = v_message;
    END IF;
    IF p_max_active_runs < 1 OR p_max_events_per_run < 1 THEN
        SET v_message = LEFT(CONCAT('[AQ002] max_active_runs and max_events_per_run must be positive or NULL, got ',
                                    COALESCE(p_max_active_runs, 'NULL'), ' and ',
                                    COALESCE(p_max_events_per_run, 'NULL')), 128);
        SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = v_message;
    END IF;
    -- Retries: NULL means the default, one attempt and no delay.
    IF p_max_attempts < 1 OR p_max_attempts > 1000
       OR NOT (COALESCE(p_retry_delay_seconds, 0) >= 0 AND COALESCE(p_retry_delay_seconds, 0) <= 604800)
       OR NOT (COALESCE(p_max_retry_delay_seconds, 1) > 0 AND COALESCE(p_max_retry_delay_seconds, 1) <= 604800)
       OR p_max_retry_delay_seconds < p_retry_delay_seconds
    THEN
        SET v_message = LEFT(CONCAT('[AQ002] max_attempts must be 1 to 1000, retry_delay 0 to 604800 s and',
                                    ' max_retry_delay above 0, at least retry_delay and at most 604800 s; got ',
                                    COALESCE(p_max_attempts, 'NULL'), ', ',
                                    COALESCE(p_retry_delay_seconds, 'NULL'), ' and ',
                                    COALESCE(p_max_retry_delay_seconds, 'NULL')), 128);
        SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = v_message;
    END IF;
    IF p_condition IS NULL OR JSON_VALID(p_condition) = 0 THEN
        SET v_message = LEFT(CONCAT('[AQ004] condition of dag ', p_dag_id,
                                    ' is missing or not JSON'), 128);
        SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = v_message;
    END IF;

    -- The members as (clause_no, kind, value): kind 'any' for a plain string, else the one key
    -- of the object. Values are read as JSON and measured unquoted, so one too long is
    -- refused, never cut short.
    DROP TEMPORARY TABLE IF EXISTS {{ns}}._assetq_declare_member, {{ns}}._assetq_declare_name;
    CREATE TEMPORARY TABLE {{ns}}._assetq_declare_member (
        clause_no INT NOT NULL,
        kind      VARCHAR(8) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL,
        value     VARCHAR(512) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL,
        KEY (kind, value)
    ) ENGINE = InnoDB;
    CREATE TEMPORARY TABLE {{ns}}._assetq_declare_name (
        pos       BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY,
        kind      VARCHAR(8) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
        value     VARCHAR(512) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
        target_id BIGINT NULL,
        UNIQUE KEY (kind, value)
    ) ENGINE = InnoDB;
    IF p_clauses IS NULL OR NOT JSON_VALID(p_clauses) THEN
        SET v_bad = 1;
    ELSEIF JSON_TYPE(p_clauses) <> 'ARRAY' OR JSON_LENGTH(p_clauses) = 0 THEN
        SET v_bad = 1;
    ELSE
        -- MySQL 8 / MariaDB: JSON_TABLE with NESTED PATH is in both (MySQL >= 8.0.4,
        -- MariaDB >= 10.6). A clause that is empty or not an array yields one row with NULL
        -- item: its member is invalid.
        INSERT INTO {{ns}}._assetq_declare_member (clause_no, kind, value)
        SELECT m.clause_no, m.kind,
               CASE WHEN CHAR_LENGTH(m.value) BETWEEN 1 AND 512 THEN m.value END
          FROM (SELECT c.clause_no,
                       CASE WHEN c.item IS NULL OR c.clause IS NULL
                                 OR JSON_TYPE(c.clause) <> 'ARRAY' THEN NULL
                            WHEN JSON_TYPE(c.item) = 'STRING' THEN 'any'
                            WHEN JSON_TYPE(c.item) <> 'OBJECT' OR JSON_LENGTH(c.item) <> 1 THEN NULL
                            WHEN JSON_TYPE(JSON_EXTRACT(c.item, '$.name')) = 'STRING' THEN 'name'
                            WHEN JSON_TYPE(JSON_EXTRACT(c.item, '$.uri')) = 'STRING' THEN 'uri'
                            WHEN JSON_TYPE(JSON_EXTRACT(c.item, '$.alias')) = 'STRING' THEN 'alias'
                       END AS kind,
                       CASE WHEN JSON_TYPE(c.item) = 'STRING' THEN JSON_UNQUOTE(c.item)
                            WHEN JSON_TYPE(c.item) = 'OBJECT' THEN
                                 COALESCE(JSON_UNQUOTE(JSON_EXTRACT(c.item, '$.name')),
                                          JSON_UNQUOTE(JSON_EXTRACT(c.item, '$.uri')),
                                          JSON_UNQUOTE(JSON_EXTRACT(c.item, '$.alias')))
                       END AS value
                  FROM JSON_TABLE(p_clauses, '$[*]' COLUMNS (
                           clause_no FOR ORDINALITY,
                           clause    JSON PATH '$',
                           NESTED PATH '$[*]' COLUMNS (item JSON PATH '$'))) AS c) m;
        SELECT COUNT(*) INTO v_bad
          FROM {{ns}}._assetq_declare_member m
         WHERE m.kind IS NULL OR m.value IS NULL;
    END IF;
    IF v_bad > 0 THEN
        SET v_message = LEFT(CONCAT('[AQ004] condition clauses of dag ', p_dag_id,
                                    ' must be non-empty arrays of asset names or uris,',
                                    ' {"name"}, {"uri"} or {"alias"} (1 to 512 characters)'), 128);
        SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = v_message;
    END IF;

    -- The consumer's lock row first, as a scheduler pass takes it: every later statement
    -- runs under it (a new consumer gets its row, already locked, from the trigger on dag).
    SELECT COUNT(*) INTO v_exists FROM {{ns}}.dag_lock l WHERE l.dag_id = p_dag_id FOR UPDATE;

    -- Resolve every distinct member, creating the missing assets (undeclared) and aliases,
    -- one at a time: plain reads and keyed inserts only. An INSERT ... SELECT from asset
    -- would, at REPEATABLE READ, take shared gap locks on asset's indexes and deadlock
    -- concurrent declarations. A concurrent declaration may create one after our read: the
    -- duplicate key then hands back its id.
    INSERT INTO {{ns}}._assetq_declare_name (kind, value)
    SELECT DISTINCT m.kind, m.value FROM {{ns}}._assetq_declare_member m ORDER BY m.kind, m.value;
    name_loop: LOOP
        SET v_name = NULL;
        SELECT n.pos, n.kind, n.value INTO v_pos, v_kind, v_name
          FROM {{ns}}._assetq_declare_name n WHERE n.pos > v_pos ORDER BY n.pos LIMIT 1;
        IF v_name IS NULL THEN
            LEAVE name_loop;
        END IF;
        SET v_id = NULL;
        IF v_kind = 'alias' THEN
            SELECT al.id INTO v_id FROM {{ns}}.asset_alias al WHERE al.name = v_name;
            IF v_id IS NULL THEN
                INSERT INTO {{ns}}.asset_alias (name) VALUES (v_name)
                ON DUPLICATE KEY UPDATE id = LAST_INSERT_ID(id);
                SET v_id = LAST_INSERT_ID();
            END IF;
        ELSE
            IF v_kind IN ('any', 'name') THEN
                SELECT a.id INTO v_id FROM {{ns}}.asset a WHERE a.name = v_name;
            END IF;
            IF v_id IS NULL AND v_kind IN ('any', 'uri') THEN
                SELECT a.id INTO v_id FROM {{ns}}.asset a WHERE a.uri = v_name;
            END IF;
            IF v_id IS NULL AND v_kind = 'uri' THEN
                SELECT a.id INTO v_id FROM {{ns}}.asset a WHERE a.name = v_name;
            END IF;
            IF v_id IS NULL THEN
                INSERT INTO {{ns}}.asset (name, uri, declared)
                VALUES (v_name, IF(v_kind = 'uri', v_name, NULL), FALSE)
                ON DUPLICATE KEY UPDATE id = LAST_INSERT_ID(id);
                SET v_id = LAST_INSERT_ID();
            END IF;
        END IF;
        UPDATE {{ns}}._assetq_declare_name SET target_id = v_id WHERE pos = v_pos;
    END LOOP;

    -- The rows the fan-out reads: the references (kind 1, by asset) and alias clauses (kind 2,
    -- by alias, clause), the current ones read with shared locks (they see the latest
    -- committed rows, and a producer's shared locks do not conflict with them), the new ones
    -- from the members. Only rows that change are touched.
    DROP TEMPORARY TABLE IF EXISTS {{ns}}._assetq_declare_row;
    CREATE TEMPORARY TABLE {{ns}}._assetq_declare_row (
        kind      TINYINT NOT NULL,
        key_id    BIGINT NOT NULL,
        clause_no INT NOT NULL,
        old_row   BOOLEAN NOT NULL DEFAULT FALSE,
        new_row   BOOLEAN NOT NULL DEFAULT FALSE,
        PRIMARY KEY (kind, key_id, clause_no)
    ) ENGINE = InnoDB;
    IF v_exists > 0 THEN
        -- By the dag_id index: on a small table the optimizer would rather scan the primary
        -- key, locking the references of every consumer.
        INSERT INTO {{ns}}._assetq_declare_row (kind, key_id, clause_no, old_row)
        SELECT 1, r.asset_id, 0, TRUE
          FROM {{ns}}.dag_schedule_asset_reference r
               FORCE INDEX (dag_schedule_asset_reference_dag_idx)
         WHERE r.dag_id = p_dag_id
          LOCK IN SHARE MODE;
        INSERT INTO {{ns}}._assetq_declare_row (kind, key_id, clause_no, old_row)
        SELECT 2, ca.alias_id, ca.clause_no, TRUE
          FROM {{ns}}.dag_condition_alias ca
         WHERE ca.dag_id = p_dag_id
          LOCK IN SHARE MODE;
    END IF;
    INSERT INTO {{ns}}._assetq_declare_row (kind, key_id, clause_no, new_row)
    SELECT DISTINCT IF(m.kind = 'alias', 2, 1), n.target_id, IF(m.kind = 'alias', m.clause_no, 0), TRUE
      FROM {{ns}}._assetq_declare_member m
      JOIN {{ns}}._assetq_declare_name n ON n.kind = m.kind AND n.value = m.value
    ON DUPLICATE KEY UPDATE new_row = TRUE;

    -- A new consumer's row first: the rows below refer to it. Nobody queues for it yet.
    IF v_exists = 0 THEN
        INSERT INTO {{ns}}.dag (dag_id, `condition`, is_paused, max_active_runs,
                                max_events_per_run, queue_while_paused, max_attempts,
                                retry_delay_seconds, max_retry_delay_seconds)
        VALUES (p_dag_id, p_condition, COALESCE(p_paused, FALSE), p_max_active_runs,
                p_max_events_per_run, COALESCE(p_queue_while_paused, FALSE),
                COALESCE(p_max_attempts, 1), COALESCE(p_retry_delay_seconds, 0),
                p_max_retry_delay_seconds)
        ON DUPLICATE KEY UPDATE `condition` = p_condition,
                                is_paused = COALESCE(p_paused, is_paused),
                                max_active_runs = p_max_active_runs,
                                max_events_per_run = p_max_events_per_run,
                                queue_while_paused = COALESCE(p_queue_while_paused, FALSE),
                                max_attempts = COALESCE(p_max_attempts, 1),
                                retry_delay_seconds = COALESCE(p_retry_delay_seconds, 0),
                                max_retry_delay_seconds = p_max_retry_delay_seconds,
                                updated_at = UTC_TIMESTAMP(6);
    END IF;

    -- One keyed statement per changed row, in the order a producer's fan-out reads them:
    -- references by asset, then alias clauses by alias. A producer waits at most at one of
    -- them, holding only locks that come before it, which this loop has passed already.
    SET v_pos = 0;
    row_loop: LOOP
        SET v_row = NULL;
        SELECT w.kind, w.key_id, w.clause_no, w.new_row INTO v_row, v_id, v_clause, v_new
          FROM {{ns}}._assetq_declare_row w
         WHERE w.old_row <> w.new_row
           AND (w.kind > v_pos_kind
                OR (w.kind = v_pos_kind AND w.key_id > v_pos_key)
                OR (w.kind = v_pos_kind AND w.key_id = v_pos_key AND w.clause_no > v_pos_clause))
         ORDER BY w.kind, w.key_id, w.clause_no
         LIMIT 1;
        IF v_row IS NULL THEN
            LEAVE row_loop;
        END IF;
        SET v_pos_kind = v_row, v_pos_key = v_id, v_pos_clause = v_clause;
        IF v_row = 1 AND v_new THEN
            -- A new asset of a partitioned consumer maps by identity until set_dag_partitions
            -- says otherwise (migration 0009_partitions): its events are never queued
            -- without a key. A plain read: this declaration holds the consumer's lock row.
            SET v_partitioned = FALSE;
            SELECT d.partitioning IS NOT NULL INTO v_partitioned
              FROM {{ns}}.dag d WHERE d.dag_id = p_dag_id;
            INSERT INTO {{ns}}.dag_schedule_asset_reference
                   (asset_id, dag_id, partition_mapping, partition_require)
            VALUES (v_id, p_dag_id, IF(v_partitioned, 'identity', NULL), IF(v_partitioned, 'any', NULL));
        ELSEIF v_row = 1 THEN
            DELETE FROM {{ns}}.dag_schedule_asset_reference WHERE asset_id = v_id AND dag_id = p_dag_id;
        ELSEIF v_new THEN
            INSERT INTO {{ns}}.dag_condition_alias (dag_id, clause_no, alias_id)
            VALUES (p_dag_id, v_clause, v_id);
        ELSE
            DELETE FROM {{ns}}.dag_condition_alias
             WHERE dag_id = p_dag_id AND clause_no = v_clause AND alias_id = v_id;
        END IF;
    END LOOP;

    -- An existing consumer's row last: it waits for the producers in flight for it, which
    -- by now wait for nothing this declaration holds.
    IF v_exists > 0 THEN
        UPDATE {{ns}}.dag
           SET `condition` = p_condition,
               is_paused = COALESCE(p_paused, is_paused),
               max_active_runs = p_max_active_runs,
               max_events_per_run = p_max_events_per_run,
               queue_while_paused = COALESCE(p_queue_while_paused, FALSE),
               max_attempts = COALESCE(p_max_attempts, 1),
               retry_delay_seconds = COALESCE(p_retry_delay_seconds, 0),
               max_retry_delay_seconds = p_max_retry_delay_seconds,
               updated_at = UTC_TIMESTAMP(6)
         WHERE dag_id = p_dag_id;
        DELETE FROM {{ns}}.dag_condition_clause WHERE dag_id = p_dag_id;
    END IF;
    INSERT INTO {{ns}}.dag_condition_clause (dag_id, clause_no, asset_id)
    SELECT DISTINCT p_dag_id, m.clause_no, n.target_id
      FROM {{ns}}._assetq_declare_member m
      JOIN {{ns}}._assetq_declare_name n ON n.kind = m.kind AND n.value = m.value
     WHERE m.kind <> 'alias';
    DROP TEMPORARY TABLE IF EXISTS {{ns}}._assetq_declare_member, {{ns}}._assetq_declare_name,
                                   {{ns}}._assetq_declare_row;

    -- Rows queued for assets the consumer no longer depends on (neither a member nor resolved
    -- by one of its aliases) would never count towards its condition: they go. The alias test
    -- is a point lookup per row, so it waits only on a resolution of that very asset. A
    -- producer of a dropped asset has finished (the loop waited for it) or will not queue.
    IF v_exists > 0 THEN
        DELETE FROM {{ns}}.asset_dag_run_queue
         WHERE target_dag_id = p_dag_id
           AND asset_id NOT IN (SELECT r.asset_id FROM {{ns}}.dag_condition_clause r
                                 WHERE r.dag_id = p_dag_id)
           AND NOT EXISTS (SELECT 1
                             FROM {{ns}}.dag_condition_alias ca
                             JOIN {{ns}}.asset_alias_asset aa
                               ON aa.alias_id = ca.alias_id
                              AND aa.asset_id = {{ns}}.asset_dag_run_queue.asset_id
                            WHERE ca.dag_id = p_dag_id);
        -- And their partition rows (migration 0009_partitions).
        DELETE p
          FROM {{ns}}.asset_partition_queue p
          LEFT JOIN {{ns}}.asset_dag_run_queue q
                 ON q.target_dag_id = p.target_dag_id AND q.asset_event_id = p.asset_event_id
         WHERE p.target_dag_id = p_dag_id AND q.asset_event_id IS NULL;
    END IF;
END $$

-- Sets the partitioning of consumer p_dag_id (migration 0009_partitions), as PostgreSQL's
-- set_dag_partitions does (see there for p_partitions); the Python layer calls it right after
-- declare_dag, in the same transaction. The consumer's lock row is taken first, as a pass
-- takes it. The same partitioning for the same condition as before writes nothing. Otherwise
-- the dag row is locked FOR UPDATE, which waits for the producers in flight (they hold a
-- shared lock on it) and holds new ones back until the caller commits; its reference rows get
-- their mappings, and its queued events are mapped again (AQ011 if one cannot be), each key
-- evaluated afresh by the next pass. AQ002 for a malformed item, an asset that is not in the
-- condition or an asset named twice; AQ003 for an unknown consumer.
DROP PROCEDURE IF EXISTS {{ns}}.set_dag_partitions $$
CREATE PROCEDURE {{ns}}.set_dag_partitions(
    IN p_dag_id     TEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin,
    IN p_partitions JSON
)
MODIFIES SQL DATA
BEGIN
    DECLARE v_exists    BIGINT;
    DECLARE v_bad       BIGINT;
    DECLARE v_condition JSON;
    DECLARE v_old       JSON;
    DECLARE v_new       JSON;
    DECLARE v_cap       INT;
    DECLARE v_kind      VARCHAR(32) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin;
    DECLARE v_name      VARCHAR(1024) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin;
    DECLARE v_asset_id  BIGINT;
    DECLARE v_message   VARCHAR(128) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin;

    SELECT COUNT(*) INTO v_exists FROM {{ns}}.dag_lock l WHERE l.dag_id = p_dag_id FOR UPDATE;
    IF v_exists = 0 THEN
        SET v_message = LEFT(CONCAT('[AQ003] unknown dag ', COALESCE(QUOTE(LEFT(p_dag_id, 60)), 'NULL')), 128);
        SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = v_message;
    END IF;
    SELECT d.`condition`, d.partitioning, d.max_events_per_run INTO v_condition, v_old, v_cap
      FROM {{ns}}.dag d WHERE d.dag_id = p_dag_id;

    DROP TEMPORARY TABLE IF EXISTS {{ns}}._assetq_partition_spec;
    CREATE TEMPORARY TABLE {{ns}}._assetq_partition_spec (
        ord         INT NOT NULL PRIMARY KEY,
        item_type   VARCHAR(32) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL,
        asset_type  VARCHAR(32) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL,
        asset       VARCHAR(1024) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL,
        mapping     VARCHAR(32) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL,
        requirement VARCHAR(32) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL,
        static_keys LONGTEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL,
        asset_id    BIGINT NULL,
        KEY (asset_id)
    ) ENGINE = InnoDB;
    IF p_partitions IS NOT NULL THEN
        SET v_kind = 'invalid JSON';
        IF JSON_VALID(p_partitions) THEN
            SET v_kind = JSON_TYPE(p_partitions);
        END IF;
        IF v_kind <> 'OBJECT' OR COALESCE(JSON_TYPE(JSON_EXTRACT(p_partitions, '$.assets')), 'ARRAY') <> 'ARRAY' THEN
            SET v_message = LEFT(CONCAT('[AQ002] partitions of dag ', p_dag_id,
                                        ' must be NULL or {"assets": [...]}'), 128);
            SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = v_message;
        END IF;
        INSERT INTO {{ns}}._assetq_partition_spec
               (ord, item_type, asset_type, asset, mapping, requirement, static_keys)
        SELECT j.ord, JSON_TYPE(j.item), JSON_TYPE(j.asset_json), j.asset, j.mapping,
               IF(j.mapping = 'identity', 'any', COALESCE(j.requirement, 'all')),
               CASE WHEN j.static_keys IS NULL OR JSON_TYPE(j.static_keys) = 'NULL' THEN NULL
                    ELSE j.static_keys END
          FROM JSON_TABLE(p_partitions, '$.assets[*]' COLUMNS (
                   ord         FOR ORDINALITY,
                   item        JSON PATH '$',
                   asset_json  JSON PATH '$.asset',
                   asset       VARCHAR(1024) PATH '$.asset',
                   mapping     VARCHAR(32) PATH '$.mapping',
                   requirement VARCHAR(32) PATH '$.require',
                   static_keys JSON PATH '$.keys')) AS j;
        SET v_bad = NULL;
        SELECT MIN(x.ord) INTO v_bad
          FROM {{ns}}._assetq_partition_spec x
         WHERE x.item_type <> 'OBJECT' OR COALESCE(x.asset_type, '') <> 'STRING'
            OR COALESCE(x.mapping, '') NOT IN ('identity', 'hour_to_day', 'day_to_week', 'day_to_month', 'static')
            OR x.requirement NOT IN ('all', 'any')
            OR (x.mapping = 'static') <> (COALESCE(JSON_TYPE(x.static_keys), '') = 'ARRAY')
            OR (x.mapping = 'static' AND JSON_LENGTH(x.static_keys) = 0);
        IF v_bad IS NULL THEN
            SELECT MIN(x.ord) INTO v_bad
              FROM {{ns}}._assetq_partition_spec x,
                   JSON_TABLE(x.static_keys, '$[*]' COLUMNS (
                       pair     JSON PATH '$',
                       up_json  JSON PATH '$[0]',
                       to_json  JSON PATH '$[1]',
                       upstream VARCHAR(1024) PATH '$[0]',
                       target   VARCHAR(1024) PATH '$[1]')) AS k
             WHERE x.mapping = 'static'
               AND (COALESCE(JSON_TYPE(k.pair), '') <> 'ARRAY' OR JSON_LENGTH(k.pair) <> 2
                    OR COALESCE(JSON_TYPE(k.up_json), '') <> 'STRING'
                    OR COALESCE(JSON_TYPE(k.to_json), '') <> 'STRING'
                    OR CHAR_LENGTH(k.upstream) NOT BETWEEN 1 AND 250
                    OR CHAR_LENGTH(k.target) NOT BETWEEN 1 AND 250
                    OR CHAR_LENGTH(k.upstream) <> CHAR_LENGTH(RTRIM(k.upstream))
                    OR CHAR_LENGTH(k.target) <> CHAR_LENGTH(RTRIM(k.target)));
        END IF;
        IF v_bad IS NOT NULL THEN
            SET v_message = LEFT(CONCAT('[AQ002] partition mapping ', v_bad, ' of dag ', p_dag_id,
                                        ' must be {"asset", "mapping", "require", "keys"}: see docs/semantics.md'), 128);
            SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = v_message;
        END IF;
        -- Each asset by name, then by uri; it must be a (direct) member of the condition, once.
        SET v_bad = 0;
        resolve_loop: LOOP
            SET v_name = NULL;
            SELECT x.ord, x.asset INTO v_bad, v_name
              FROM {{ns}}._assetq_partition_spec x WHERE x.ord > v_bad ORDER BY x.ord LIMIT 1;
            IF v_name IS NULL THEN
                LEAVE resolve_loop;
            END IF;
            SET v_asset_id = NULL;
            SELECT a.id INTO v_asset_id FROM {{ns}}.asset a WHERE a.name = v_name;
            IF v_asset_id IS NULL THEN
                SELECT a.id INTO v_asset_id FROM {{ns}}.asset a WHERE a.uri = v_name;
            END IF;
            SELECT COUNT(*) INTO v_exists
              FROM {{ns}}.dag_schedule_asset_reference r
             WHERE r.dag_id = p_dag_id AND r.asset_id = v_asset_id;
            IF v_exists = 0 THEN
                SET v_bad = NULL;
            ELSE
                SELECT COUNT(*) INTO v_exists
                  FROM {{ns}}._assetq_partition_spec x WHERE x.asset_id = v_asset_id;
            END IF;
            IF v_bad IS NULL OR v_exists > 0 THEN
                SET v_message = LEFT(CONCAT('[AQ002] partition mapping of asset ', QUOTE(LEFT(v_name, 40)),
                                            ' for dag ', p_dag_id,
                                            ': the asset must be in its condition (not through an alias), once'), 128);
                SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = v_message;
            END IF;
            UPDATE {{ns}}._assetq_partition_spec SET asset_id = v_asset_id WHERE ord = v_bad;
        END LOOP;
        -- With the condition and the cap it was declared for: a change of either evaluates
        -- every key afresh (a key a smaller cap could not satisfy may run now).
        SET v_new = JSON_OBJECT('partitions', JSON_EXTRACT(p_partitions, '$'),
                                'condition', JSON_EXTRACT(v_condition, '$'),
                                'max_events_per_run', v_cap);
    END IF;
    IF (v_new IS NULL AND v_old IS NULL) OR JSON_EXTRACT(v_new, '$') <=> JSON_EXTRACT(v_old, '$') THEN
        DROP TEMPORARY TABLE IF EXISTS {{ns}}._assetq_partition_spec;
    ELSE
        SELECT COUNT(*) INTO v_exists FROM {{ns}}.dag d WHERE d.dag_id = p_dag_id FOR UPDATE;

        UPDATE {{ns}}.dag_schedule_asset_reference r
          LEFT JOIN {{ns}}._assetq_partition_spec x ON x.asset_id = r.asset_id
           SET r.partition_mapping = IF(v_new IS NULL, NULL, COALESCE(x.mapping, 'identity')),
               r.partition_require = IF(v_new IS NULL, NULL, COALESCE(x.requirement, 'any'))
         WHERE r.dag_id = p_dag_id;

        DELETE FROM {{ns}}.dag_partition_static_key WHERE dag_id = p_dag_id;
        INSERT INTO {{ns}}.dag_partition_static_key (dag_id, asset_id, upstream_key, target_key)
        SELECT p_dag_id, x.asset_id, k.upstream, k.target
          FROM {{ns}}._assetq_partition_spec x,
               JSON_TABLE(x.static_keys, '$[*]' COLUMNS (
                   upstream VARCHAR(250) PATH '$[0]',
                   target   VARCHAR(250) PATH '$[1]')) AS k
         WHERE x.mapping = 'static';
        DROP TEMPORARY TABLE IF EXISTS {{ns}}._assetq_partition_spec;

        UPDATE {{ns}}.dag SET partitioning = v_new, updated_at = UTC_TIMESTAMP(6)
         WHERE dag_id = p_dag_id;

        DELETE FROM {{ns}}.asset_partition_queue WHERE target_dag_id = p_dag_id;
        IF v_new IS NOT NULL THEN
            BEGIN
                DECLARE v_done     BOOLEAN DEFAULT FALSE;
                DECLARE v_event_id BIGINT;
                DECLARE v_created  DATETIME(6);
                DECLARE v_key      VARCHAR(250) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin;
                DECLARE v_mapping  VARCHAR(20) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin;
                DECLARE v_target   VARCHAR(250) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin;
                DECLARE v_source   VARCHAR(250) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin;
                DECLARE c_rows CURSOR FOR
                    SELECT q.asset_event_id, q.asset_id, q.created_at, e.partition_key,
                           COALESCE(r.partition_mapping, 'identity')
                      FROM {{ns}}.asset_dag_run_queue q
                      JOIN {{ns}}.asset_event e ON e.id = q.asset_event_id
                      LEFT JOIN {{ns}}.dag_schedule_asset_reference r
                             ON r.asset_id = q.asset_id AND r.dag_id = q.target_dag_id
                     WHERE q.target_dag_id = p_dag_id
                     ORDER BY q.asset_event_id
                      -- A locking read: it sees the rows of the producers the lock on the dag
                      -- row waited for, which a plain read at REPEATABLE READ (the default)
                      -- would not, and their events would go unmapped.
                      LOCK IN SHARE MODE;
                DECLARE CONTINUE HANDLER FOR NOT FOUND SET v_done = TRUE;
                OPEN c_rows;
                row_loop: LOOP
                    FETCH c_rows INTO v_event_id, v_asset_id, v_created, v_key, v_mapping;
                    IF v_done THEN
                        LEAVE row_loop;
                    END IF;
                    CALL {{ns}}.partition_map(p_dag_id, v_asset_id, v_mapping, v_key, v_target, v_source);
                    INSERT INTO {{ns}}.asset_partition_queue
                           (target_dag_id, asset_event_id, partition_key, asset_id, source_key, created_at)
                    VALUES (p_dag_id, v_event_id, v_target, v_asset_id, v_source, v_created);
                END LOOP;
                CLOSE c_rows;
            END;
        END IF;
    END IF;
END $$



-- Pauses or unpauses a consumer. Events that commit while it is paused are not queued for it.
-- Returns no result set.
DROP PROCEDURE IF EXISTS {{ns}}.set_dag_paused $$
CREATE PROCEDURE {{ns}}.set_dag_paused(
    IN p_dag_id TEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin,
    IN p_paused BOOLEAN
)
MODIFIES SQL DATA
BEGIN
    DECLARE v_found   BIGINT;
    DECLARE v_message VARCHAR(128) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin;
    -- The lock row first, as declare_dag does; a locking read also sees a consumer created
    -- after the caller's snapshot. Not ROW_COUNT() of the UPDATE: with the CLIENT_FOUND_ROWS
    -- flag (SQLAlchemy sets it) it counts matched rows, without it changed rows.
    SELECT COUNT(*) INTO v_found FROM {{ns}}.dag_lock l WHERE l.dag_id = p_dag_id FOR UPDATE;
    IF v_found = 0 THEN
        SET v_message = LEFT(CONCAT('[AQ003] unknown dag ', COALESCE(QUOTE(LEFT(p_dag_id, 64)), 'NULL')), 128);
        SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = v_message;
    END IF;
    UPDATE {{ns}}.dag SET is_paused = p_paused, updated_at = UTC_TIMESTAMP(6)
     WHERE dag_id = p_dag_id;
END $$


-- The part of a scheduler pass for one partitioned consumer (migration 0009_partitions),
-- called by schedule_pass holding the consumer's lock row, as PostgreSQL's
-- schedule_partitions is (see there for what it does and why it costs what arrived, never
-- every pending key). The runs it creates go into the pass's _assetq_run; it advances the
-- consumer's run sequence in dag_lock. Its own temporary tables, created here on first use and
-- dropped by schedule_pass:
--   _assetq_pkey    the keys to evaluate: those of the (at most 1,000) oldest rows not yet
--                   examined, in order of their first such row
--   _assetq_prow    the key's rows in queue order (all, or the N + 1 oldest), pos 1 the
--                   oldest; with N and the condition not met, also its rows after those
--   _assetq_present the assets present for the key (enough distinct upstream keys)
-- Every write to the queue tables is by primary key, driven by a temporary table: a range
-- scan would wait for producers' uncommitted rows, even at READ COMMITTED (see schedule_pass).
DROP PROCEDURE IF EXISTS {{ns}}.schedule_partitions $$
CREATE PROCEDURE {{ns}}.schedule_partitions(
    IN p_dag_id     VARCHAR(250) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin,
    IN p_max_active BIGINT,
    IN p_max_events BIGINT,
    IN p_now        DATETIME(6)
)
MODIFIES SQL DATA
BEGIN
    DECLARE v_pos       BIGINT DEFAULT 0;
    DECLARE v_key       VARCHAR(250) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin;
    DECLARE v_active    BIGINT DEFAULT 0;
    DECLARE v_clauses   BIGINT;
    DECLARE v_met       BIGINT;
    DECLARE v_limit     BIGINT;
    DECLARE v_n         BIGINT;
    DECLARE v_take      BIGINT;
    DECLARE v_seq       BIGINT;
    DECLARE v_gen       INT;
    DECLARE v_trigger   BIGINT;
    DECLARE v_run_after DATETIME(6);
    DECLARE v_run_pk    BIGINT;
    DECLARE v_run_id    VARCHAR(250) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin;
    DECLARE v_deleted   BIGINT;
    DECLARE v_event_ids LONGTEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin;
    DECLARE v_next_id   BIGINT;
    DECLARE v_year      INT;
    DECLARE v_asset     BIGINT;
    DECLARE v_source    VARCHAR(250) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin;
    DECLARE v_count     BIGINT;
    DECLARE v_required  BIGINT;
    DECLARE v_claimed   BOOLEAN;
    DECLARE v_last      BIGINT;
    DECLARE v_pick_no   BIGINT;
    DECLARE v_month     INT;
    DECLARE v_days      INT;
    DECLARE v_message   VARCHAR(128) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin;
    DECLARE v_saved_gcl BIGINT UNSIGNED DEFAULT @@SESSION.group_concat_max_len;

    CREATE TEMPORARY TABLE IF NOT EXISTS {{ns}}._assetq_pkey (
        pos           BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY,
        partition_key VARCHAR(250) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL
    ) ENGINE = InnoDB;
    CREATE TEMPORARY TABLE IF NOT EXISTS {{ns}}._assetq_prow (
        pos            BIGINT NOT NULL PRIMARY KEY,
        asset_event_id BIGINT NOT NULL,
        asset_id       BIGINT NOT NULL,
        source_key     VARCHAR(250) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
        created_at     DATETIME(6) NOT NULL,
        queued         BOOLEAN NOT NULL DEFAULT TRUE,
        claim          BOOLEAN NOT NULL DEFAULT FALSE
    ) ENGINE = InnoDB;
    CREATE TEMPORARY TABLE IF NOT EXISTS {{ns}}._assetq_present (
        asset_id BIGINT NOT NULL PRIMARY KEY
    ) ENGINE = InnoDB;
    -- How many distinct upstream keys each asset of the key's rows needs to be present.
    CREATE TEMPORARY TABLE IF NOT EXISTS {{ns}}._assetq_prequired (
        asset_id BIGINT NOT NULL PRIMARY KEY,
        required BIGINT NOT NULL
    ) ENGINE = InnoDB;
    -- The condition's members (clause, asset; an alias by the assets it resolved to), and for
    -- the witness search: the complete assets in the order found, the clauses they hit, the
    -- rows taken. MySQL 8 / MariaDB: no statement names one temporary table twice.
    CREATE TEMPORARY TABLE IF NOT EXISTS {{ns}}._assetq_pmember (
        clause_no INT NOT NULL,
        asset_id  BIGINT NOT NULL,
        PRIMARY KEY (clause_no, asset_id),
        KEY (asset_id)
    ) ENGINE = InnoDB;
    CREATE TEMPORARY TABLE IF NOT EXISTS {{ns}}._assetq_phave (
        pick_no  BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY,
        asset_id BIGINT NOT NULL,
        UNIQUE KEY (asset_id)
    ) ENGINE = InnoDB;
    CREATE TEMPORARY TABLE IF NOT EXISTS {{ns}}._assetq_phit (
        clause_no INT NOT NULL PRIMARY KEY
    ) ENGINE = InnoDB;
    CREATE TEMPORARY TABLE IF NOT EXISTS {{ns}}._assetq_ptaken (
        pos        BIGINT NOT NULL PRIMARY KEY,
        asset_id   BIGINT NOT NULL,
        source_key VARCHAR(250) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
        KEY (asset_id)
    ) ENGINE = InnoDB;
    DELETE FROM {{ns}}._assetq_pkey;
    DELETE FROM {{ns}}._assetq_pmember;
    INSERT IGNORE INTO {{ns}}._assetq_pmember (clause_no, asset_id)
    SELECT c.clause_no, c.asset_id FROM {{ns}}.dag_condition_clause c WHERE c.dag_id = p_dag_id
    UNION ALL
    SELECT ca.clause_no, aa.asset_id
      FROM {{ns}}.dag_condition_alias ca
      JOIN {{ns}}.asset_alias_asset aa ON aa.alias_id = ca.alias_id
     WHERE ca.dag_id = p_dag_id;

    IF p_max_active IS NOT NULL THEN
        SELECT COUNT(*) INTO v_active FROM {{ns}}.dag_run r
         WHERE r.dag_id = p_dag_id AND r.state IN ('queued', 'running');
    END IF;
    SELECT COUNT(DISTINCT m.clause_no) INTO v_clauses
      FROM (SELECT c.clause_no FROM {{ns}}.dag_condition_clause c WHERE c.dag_id = p_dag_id
            UNION ALL
            SELECT ca.clause_no FROM {{ns}}.dag_condition_alias ca WHERE ca.dag_id = p_dag_id) m;

    INSERT INTO {{ns}}._assetq_pkey (partition_key)
    SELECT a.partition_key
      FROM (SELECT p.partition_key, p.asset_event_id
              FROM {{ns}}.asset_partition_queue p FORCE INDEX (asset_partition_queue_new_idx)
             WHERE p.target_dag_id = p_dag_id AND p.examined = FALSE
             ORDER BY p.asset_event_id
             LIMIT 1000) a
     GROUP BY a.partition_key
     ORDER BY MIN(a.asset_event_id);

    key_loop: LOOP
        SET v_key = NULL;
        SELECT k.pos, k.partition_key INTO v_pos, v_key
          FROM {{ns}}._assetq_pkey k WHERE k.pos > v_pos ORDER BY k.pos LIMIT 1;
        IF v_key IS NULL THEN
            LEAVE key_loop;
        END IF;

        -- The key's rows in queue order, each with whether its queue row is there. One whose
        -- queue row is gone (delete_asset, a re-declaration, committed meanwhile) is dropped,
        -- by key, and the key read again. All of them, with a cap too: when the N oldest do
        -- not satisfy the condition, the others may (the witness search below).
        read_loop: LOOP
            DELETE FROM {{ns}}._assetq_prow;
            INSERT INTO {{ns}}._assetq_prow (pos, asset_event_id, asset_id, source_key, created_at, queued)
            SELECT ROW_NUMBER() OVER (ORDER BY o.created_at, o.asset_event_id),
                   o.asset_event_id, o.asset_id, o.source_key, o.created_at,
                   (SELECT COUNT(*) FROM {{ns}}.asset_dag_run_queue q FORCE INDEX (PRIMARY)
                     WHERE q.target_dag_id = p_dag_id AND q.asset_event_id = o.asset_event_id) > 0
              FROM (SELECT p.asset_event_id, p.asset_id, p.source_key, p.created_at
                      FROM {{ns}}.asset_partition_queue p FORCE INDEX (asset_partition_queue_key_idx)
                     WHERE p.target_dag_id = p_dag_id AND p.partition_key = v_key
                     ORDER BY p.created_at, p.asset_event_id) o;
            SELECT COUNT(*) INTO v_n FROM {{ns}}._assetq_prow r WHERE NOT r.queued;
            IF v_n = 0 THEN
                LEAVE read_loop;
            END IF;
            DELETE p
              FROM {{ns}}._assetq_prow r
              STRAIGHT_JOIN {{ns}}.asset_partition_queue p FORCE INDEX (PRIMARY)
                ON p.target_dag_id = p_dag_id AND p.asset_event_id = r.asset_event_id
             WHERE NOT r.queued;
        END LOOP;
        SELECT COUNT(*) INTO v_n FROM {{ns}}._assetq_prow;
        IF v_n > 0 THEN
            -- The days of the key's month, for a day -> month roll-up. Computed here, not in
            -- the query: MariaDB may evaluate a CASE branch of constants that is not taken, and
            -- a cast of a key that is no month would then fail the statement in strict mode.
            SET v_days = 1;
            IF v_key REGEXP '^[0-9]{4}-(0[1-9]|1[0-2])$' AND INSTR(v_key, CHAR(10)) = 0 THEN
                SET v_year = CAST(LEFT(v_key, 4) AS UNSIGNED), v_month = CAST(RIGHT(v_key, 2) AS UNSIGNED);
                SET v_days = CASE WHEN v_month IN (4, 6, 9, 11) THEN 30
                                  WHEN v_month <> 2 THEN 31
                                  WHEN (v_year % 4 = 0 AND v_year % 100 <> 0) OR v_year % 400 = 0 THEN 29
                                  ELSE 28
                              END;
            END IF;

            -- What each asset of the key needs: one upstream key, or all sub-partitions of a
            -- roll-up (24 hours, 7 days, the month's days), or every static key mapping to it.
            DELETE FROM {{ns}}._assetq_prequired;
            INSERT INTO {{ns}}._assetq_prequired (asset_id, required)
            SELECT a.asset_id,
                   CASE
                       WHEN f.partition_mapping IS NULL OR f.partition_mapping = 'identity'
                            OR f.partition_require <> 'all' THEN 1
                       WHEN f.partition_mapping = 'hour_to_day' THEN 24
                       WHEN f.partition_mapping = 'day_to_week' THEN 7
                       WHEN f.partition_mapping = 'day_to_month' THEN v_days
                       ELSE (SELECT COUNT(*) FROM {{ns}}.dag_partition_static_key t
                              WHERE t.dag_id = p_dag_id AND t.asset_id = a.asset_id
                                AND t.target_key = v_key)
                   END
              FROM (SELECT DISTINCT r.asset_id FROM {{ns}}._assetq_prow r) a
              LEFT JOIN {{ns}}.dag_schedule_asset_reference f
                     ON f.asset_id = a.asset_id AND f.dag_id = p_dag_id;

            -- The claim (_assetq_prow.claim): all rows, or with max_events_per_run = N and
            -- more rows queued, the N oldest when they satisfy the condition; otherwise, when
            -- the key's whole queue does, witnesses plus the oldest other rows, N in all (as
            -- for an unpartitioned consumer, docs/semantics.md §5: a cap never starves a key).
            SET v_claimed = FALSE;
            SET v_limit = IF(p_max_events IS NOT NULL AND v_n > p_max_events, p_max_events, v_n);
            present_loop: LOOP
                -- The assets present among the rows up to v_limit: as many distinct upstream
                -- keys as the mapping needs (one, or all sub-partitions of a roll-up).
                DELETE FROM {{ns}}._assetq_present;
                INSERT INTO {{ns}}._assetq_present (asset_id)
                SELECT s.asset_id
                  FROM (SELECT r.asset_id, COUNT(DISTINCT r.source_key) AS n
                          FROM {{ns}}._assetq_prow r WHERE r.pos <= v_limit
                         GROUP BY r.asset_id) s
                  JOIN {{ns}}._assetq_prequired q ON q.asset_id = s.asset_id
                 WHERE s.n >= q.required;
                SELECT COUNT(DISTINCT m.clause_no) INTO v_met
                  FROM {{ns}}._assetq_pmember m
                 WHERE m.asset_id IN (SELECT x.asset_id FROM {{ns}}._assetq_present x);
                IF v_clauses > 0 AND v_met = v_clauses THEN
                    IF v_limit < v_n THEN
                        UPDATE {{ns}}._assetq_prow SET claim = TRUE WHERE pos <= v_limit;
                        SET v_claimed = TRUE;
                    END IF;
                    LEAVE present_loop;
                END IF;
                IF v_limit = v_n THEN
                    LEAVE present_loop;
                END IF;
                SET v_limit = v_n;  -- the N oldest do not: does the whole queue?
            END LOOP;

            IF NOT v_claimed AND (v_clauses = 0 OR v_met < v_clauses) THEN
                -- Not met: the key's rows read here are examined, by key; a row committed
                -- meanwhile is not, and the next pass evaluates its key with it.
                UPDATE {{ns}}._assetq_prow r
                  STRAIGHT_JOIN {{ns}}.asset_partition_queue p FORCE INDEX (PRIMARY)
                    ON p.target_dag_id = p_dag_id AND p.asset_event_id = r.asset_event_id
                   SET p.examined = TRUE
                 WHERE p.examined = FALSE;
            ELSEIF p_max_active IS NOT NULL AND v_active >= p_max_active THEN
                -- At the cap: this key and those after it stay as they are.
                LEAVE key_loop;
            ELSE
                IF NOT v_claimed AND (p_max_events IS NULL OR v_n <= p_max_events) THEN
                    UPDATE {{ns}}._assetq_prow SET claim = TRUE;
                ELSEIF NOT v_claimed THEN
                    -- Witnesses: rows in queue order, each taken when its asset is in a clause
                    -- no complete asset hits yet and it brings an upstream key the asset still
                    -- needs; an asset with as many as it needs is complete. Then the complete
                    -- assets, the last completed first, are dropped while the others still hit
                    -- every clause, with their rows: a minimal set. declare_dag refused a cap
                    -- below what they can need, so they fit in N.
                    DELETE FROM {{ns}}._assetq_phave;
                    DELETE FROM {{ns}}._assetq_phit;
                    DELETE FROM {{ns}}._assetq_ptaken;
                    SET v_pick_no = 0;
                    witness_loop: WHILE v_pick_no < v_n DO
                        SET v_pick_no = v_pick_no + 1;
                        SELECT r.asset_id, r.source_key INTO v_asset, v_source
                          FROM {{ns}}._assetq_prow r WHERE r.pos = v_pick_no;
                        SELECT COUNT(*) INTO v_count FROM {{ns}}._assetq_phave h WHERE h.asset_id = v_asset;
                        IF v_count > 0 THEN
                            ITERATE witness_loop;
                        END IF;
                        SELECT COUNT(*) INTO v_count
                          FROM {{ns}}._assetq_pmember m
                         WHERE m.asset_id = v_asset
                           AND m.clause_no NOT IN (SELECT h.clause_no FROM {{ns}}._assetq_phit h);
                        IF v_count = 0 THEN
                            ITERATE witness_loop;
                        END IF;
                        SELECT COUNT(*) INTO v_count
                          FROM {{ns}}._assetq_ptaken t
                         WHERE t.asset_id = v_asset AND t.source_key = v_source;
                        IF v_count > 0 THEN
                            ITERATE witness_loop;
                        END IF;
                        INSERT INTO {{ns}}._assetq_ptaken (pos, asset_id, source_key)
                        VALUES (v_pick_no, v_asset, v_source);
                        SELECT COUNT(DISTINCT t.source_key) INTO v_count
                          FROM {{ns}}._assetq_ptaken t WHERE t.asset_id = v_asset;
                        SELECT q.required INTO v_required
                          FROM {{ns}}._assetq_prequired q WHERE q.asset_id = v_asset;
                        IF v_count >= v_required THEN
                            INSERT INTO {{ns}}._assetq_phave (asset_id) VALUES (v_asset);
                            INSERT IGNORE INTO {{ns}}._assetq_phit (clause_no)
                            SELECT m.clause_no FROM {{ns}}._assetq_pmember m WHERE m.asset_id = v_asset;
                            SELECT COUNT(*) INTO v_count FROM {{ns}}._assetq_phit;
                            IF v_count = v_clauses THEN
                                LEAVE witness_loop;
                            END IF;
                        END IF;
                    END WHILE;
                    SELECT MAX(h.pick_no) + 1 INTO v_pick_no FROM {{ns}}._assetq_phave h;
                    prune_loop: LOOP
                        SET v_asset = NULL;
                        SELECT h.pick_no, h.asset_id INTO v_pick_no, v_asset
                          FROM {{ns}}._assetq_phave h
                         WHERE h.pick_no < v_pick_no
                         ORDER BY h.pick_no DESC
                         LIMIT 1;
                        IF v_asset IS NULL THEN
                            LEAVE prune_loop;
                        END IF;
                        SELECT COUNT(DISTINCT m.clause_no) INTO v_count
                          FROM {{ns}}._assetq_pmember m
                         WHERE m.asset_id IN (SELECT h.asset_id FROM {{ns}}._assetq_phave h
                                               WHERE h.asset_id <> v_asset);
                        IF v_count = v_clauses THEN
                            DELETE FROM {{ns}}._assetq_phave WHERE asset_id = v_asset;
                        END IF;
                    END LOOP;
                    UPDATE {{ns}}._assetq_prow r
                      JOIN {{ns}}._assetq_ptaken t ON t.pos = r.pos
                      JOIN {{ns}}._assetq_phave h ON h.asset_id = t.asset_id
                       SET r.claim = TRUE;
                    -- Then the oldest other rows, N in all.
                    SELECT COUNT(*) INTO v_count FROM {{ns}}._assetq_prow r WHERE r.claim;
                    IF v_count < p_max_events THEN
                        SET v_count = p_max_events - v_count - 1;
                        SET v_last = NULL;
                        SELECT r.pos INTO v_last
                          FROM {{ns}}._assetq_prow r WHERE NOT r.claim
                         ORDER BY r.pos LIMIT v_count, 1;
                        UPDATE {{ns}}._assetq_prow SET claim = TRUE
                         WHERE NOT claim AND (v_last IS NULL OR pos <= v_last);
                    END IF;
                END IF;
                SELECT COUNT(*), MAX(r.pos) INTO v_take, v_last FROM {{ns}}._assetq_prow r WHERE r.claim;
                UPDATE {{ns}}.dag_lock SET last_run_seq = last_run_seq + 1, last_scheduled_at = p_now
                 WHERE dag_id = p_dag_id;
                SELECT l.last_run_seq INTO v_seq FROM {{ns}}.dag_lock l WHERE l.dag_id = p_dag_id;
                SELECT COALESCE(MAX(r.partition_generation), 0) + 1 INTO v_gen
                  FROM {{ns}}.dag_run r WHERE r.dag_id = p_dag_id AND r.partition_key = v_key;
                SELECT r.asset_event_id, r.created_at INTO v_trigger, v_run_after
                  FROM {{ns}}._assetq_prow r WHERE r.pos = v_last;
                SET v_run_id = CONCAT('asset_triggered__', DATE_FORMAT(v_run_after, '%Y-%m-%dT%H:%i:%s.%f'),
                                      '+00:00__', v_seq);
                INSERT INTO {{ns}}.dag_run (dag_id, run_id, seq, run_after, created_at,
                                            triggering_event_id, event_count, not_before,
                                            partition_key, partition_generation)
                VALUES (p_dag_id, v_run_id, v_seq, v_run_after, p_now, v_trigger, v_take, p_now,
                        v_key, v_gen);
                SET v_run_pk = LAST_INSERT_ID();

                -- Exactly the claimed rows, by primary key, with the claim guard (I3, I4), and
                -- their asset_partition_queue rows.
                DELETE q
                  FROM {{ns}}._assetq_prow k
                  STRAIGHT_JOIN {{ns}}.asset_dag_run_queue q FORCE INDEX (PRIMARY)
                    ON q.target_dag_id = p_dag_id AND q.asset_event_id = k.asset_event_id
                 WHERE k.claim;
                SET v_deleted = ROW_COUNT();
                IF v_deleted <> v_take THEN
                    SET v_message = LEFT(CONCAT('[AQ900] claim guard: dag ', p_dag_id, ' claimed ', v_take,
                                                ' queue rows of a partition but deleted ', v_deleted), 128);
                    SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = v_message;
                END IF;
                DELETE p
                  FROM {{ns}}._assetq_prow k
                  STRAIGHT_JOIN {{ns}}.asset_partition_queue p FORCE INDEX (PRIMARY)
                    ON p.target_dag_id = p_dag_id AND p.asset_event_id = k.asset_event_id
                 WHERE k.claim;
                INSERT INTO {{ns}}.dagrun_asset_event (dag_run_id, asset_event_id, dag_id)
                SELECT v_run_pk, k.asset_event_id, p_dag_id FROM {{ns}}._assetq_prow k WHERE k.claim;

                SET SESSION group_concat_max_len = 1073741824;
                SELECT CONCAT('[', GROUP_CONCAT(k.asset_event_id ORDER BY k.asset_event_id SEPARATOR ','), ']')
                  INTO v_event_ids
                  FROM {{ns}}._assetq_prow k WHERE k.claim;
                SET SESSION group_concat_max_len = v_saved_gcl;
                IF NOT (JSON_LENGTH(v_event_ids) <=> v_take) THEN
                    SET v_message = LEFT(CONCAT('[AQ900] claim guard: event ids of dag ', p_dag_id,
                                                ' were truncated'), 128);
                    SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = v_message;
                END IF;
                INSERT INTO {{ns}}._assetq_run
                       (dag_run_id, dag_id, run_id, seq, run_after, created_at, event_ids,
                        triggering_event_id, state, partition_key)
                VALUES (v_run_pk, p_dag_id, v_run_id, v_seq, v_run_after, p_now, v_event_ids,
                        v_trigger, 'queued', v_key);

                -- With N, a key left with rows is looked at again by the next pass.
                IF v_n > v_take THEN
                    SELECT r.asset_event_id INTO v_next_id
                      FROM {{ns}}._assetq_prow r WHERE NOT r.claim ORDER BY r.pos LIMIT 1;
                    UPDATE {{ns}}.asset_partition_queue SET examined = FALSE
                     WHERE target_dag_id = p_dag_id AND asset_event_id = v_next_id;
                END IF;
                SET v_active = v_active + 1;
            END IF;
        END IF;
    END LOOP;
    UPDATE {{ns}}.dag_lock SET last_scheduled_at = p_now WHERE dag_id = p_dag_id;
END $$

-- One scheduler pass (I3-I6). Takes at most p_limit unpaused consumers with queued rows,
-- least recently examined first, each by its lock row FOR UPDATE SKIP LOCKED, and for each:
-- skips it while it has max_active_runs active runs (queued or running: its queue is left
-- whole); claims its committed queue rows (all of them, or with max_events_per_run the
-- oldest that satisfy the condition, see below), evaluates the condition on exactly those
-- rows, and when it holds creates a run, links exactly the claimed events and deletes
-- exactly the claimed rows by key. A consumer without max_events_per_run gets at most one
-- run a pass (it consumes its whole queue); a capped one may get several (see below).
-- Returns one result set, one row per run created, in the order they were created
-- (dag_run_id, dag_id, run_id, seq, run_after, created_at, event_ids as a JSON array,
-- triggering_event_id: the newest claimed row, state).
--
-- A clause holds when a claimed row's asset is one of its asset members or has been resolved
-- by one of its alias members; an alias that has resolved to nothing yet satisfies nothing,
-- and its clause still counts.
--
-- max_events_per_run = N with more than N rows queued: if the whole queue does not satisfy
-- the condition, no run. Otherwise the claim is built so the consumer is never starved: for
-- each clause in order not yet hit, the queued member asset whose oldest row is oldest
-- (greedy); then each chosen asset, newest choice first, is dropped if the others still hit
-- every clause; the claim is the oldest row of each chosen asset plus the oldest other rows,
-- N in all (more only if the chosen assets alone are more than N). When the oldest N rows
-- satisfy the condition, that is exactly them.
--
-- A capped run costs what it consumes (migration 0007_capped_claim): the pass reads the
-- N + 1 oldest rows through asset_dag_run_queue_order_idx and, only when the N oldest do not
-- satisfy the condition, each member asset's oldest row through asset_dag_run_queue_asset_idx;
-- never the backlog behind them (tests/test_capped_claim.py counts it). The claims are those
-- of 0006, row for row.
--
-- Runs per pass (migration 0011_runs_per_pass): a capped consumer gets runs one after
-- another in the same pass, each claimed as above from what the runs before it left, until
-- no claim satisfies the condition (no run, as before), a claim took the whole remaining
-- queue (it read at most N rows), the consumer made its share of the pass, or, with
-- max_active_runs, its active runs (counted once, at the cap check) plus the runs this pass
-- made for it reach the cap. The share is p_limit divided by the number of candidates with
-- work when the pass starts (at most p_limit), rounded down, at least 1: one capped consumer
-- drains up to p_limit runs in a pass, 100 consumers get one each, and the runs of consumers
-- without partitions never exceed p_limit. Before, a capped backlog drained one run a pass:
-- at N = 1, a pass per event (issue 16). A consumer's runs of one pass have consecutive seq
-- numbers and one created_at.
--
-- Run it at READ COMMITTED, in a transaction of its own (assetq.schedule does). At READ
-- COMMITTED every plain read below takes a fresh snapshot, after the lock, and locks nothing.
-- At REPEATABLE READ the snapshot can be older than the lock: a pass would claim rows another
-- pass consumed meanwhile (measured: 2,804 duplicate links in 5,000 events). The check after
-- the lock refuses such a pass with AQ900 instead; its INSERT ... SELECT reads would also
-- take shared gap locks that hold producers back. AQ900 (claim guard) means the pass was
-- rolled back and is safe to retry.
--
-- Workers (migration 0006_work_queue): a new run is claimable by claim_runs at once
-- (not_before = its creation). Before a consumer with max_active_runs is counted against its
-- cap, its running runs whose last attempt's lease expired are failed (I10: a worker that
-- died on its last attempt must not hold the cap for good; claim_runs does the same). Rows a
-- worker is completing right now are skipped, not waited for. Since 0007_capped_claim every
-- pass first fails up to 100 such runs of any consumer, oldest lease first ("the next time
-- anyone claims or passes", docs/workers.md), found through dag_run_lease_idx.
DROP PROCEDURE IF EXISTS {{ns}}.schedule_pass $$
CREATE PROCEDURE {{ns}}.schedule_pass(IN p_limit INT)
MODIFIES SQL DATA
BEGIN
    DECLARE v_pos        BIGINT DEFAULT 0;
    DECLARE v_taken      INT DEFAULT 0;
    DECLARE v_dag_id     VARCHAR(250) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin;
    DECLARE v_locked_seq BIGINT;
    DECLARE v_seen_seq   BIGINT;
    DECLARE v_paused     BOOLEAN;
    DECLARE v_max_active BIGINT;
    DECLARE v_max_events BIGINT;
    DECLARE v_max_attempts INT;
    DECLARE v_expired    BIGINT;
    DECLARE v_reaping    BOOLEAN DEFAULT FALSE;
    DECLARE v_aliased    BOOLEAN;
    DECLARE v_partitioned BOOLEAN;
    DECLARE v_members    BOOLEAN;
    DECLARE v_temps      BOOLEAN DEFAULT FALSE;
    DECLARE v_candidates BIGINT;
    DECLARE v_share      BIGINT;
    DECLARE v_made       BIGINT;
    DECLARE v_from_t     DATETIME(6);
    DECLARE v_from_id    BIGINT;
    DECLARE v_seq        BIGINT;
    DECLARE v_active     BIGINT;
    DECLARE v_queued     BIGINT;
    DECLARE v_take       BIGINT;
    DECLARE v_clause     INT;
    DECLARE v_next       INT;
    DECLARE v_hit        BIGINT;
    DECLARE v_pick       BIGINT;
    DECLARE v_pick_id    BIGINT;
    DECLARE v_pick_time  DATETIME(6);
    DECLARE v_pick_no    BIGINT;
    DECLARE v_asset      BIGINT;
    DECLARE v_missing    BOOLEAN;
    DECLARE v_witnessed  BOOLEAN;
    DECLARE v_claimed    BIGINT;
    DECLARE v_deleted    BIGINT;
    DECLARE v_run_after  DATETIME(6);
    DECLARE v_oldest     DATETIME(6);
    DECLARE v_newest_id  BIGINT;
    DECLARE v_trigger    BIGINT;
    DECLARE v_clauses    BIGINT;
    DECLARE v_met        BIGINT;
    DECLARE v_now        DATETIME(6);
    DECLARE v_run_pk     BIGINT;
    DECLARE v_run_id     VARCHAR(250) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin;
    DECLARE v_event_ids  LONGTEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin;
    DECLARE v_message    VARCHAR(128) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin;
    DECLARE v_saved_gcl  BIGINT UNSIGNED DEFAULT @@SESSION.group_concat_max_len;

    IF p_limit IS NULL OR p_limit < 1 THEN
        SET v_message = CONCAT('[AQ002] limit must be a positive integer, got ',
                               COALESCE(p_limit, 'NULL'));
        SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = v_message;
    END IF;

    -- Session temporary tables: the claimed ids are held in a table, never in a
    -- GROUP_CONCAT / JSON_ARRAYAGG string, which is silently cut at group_concat_max_len.
    -- Temporary tables do not end the caller's transaction. InnoDB, not MEMORY: a consumer
    -- with a huge backlog must not hit max_heap_table_size. Tables left by a failed pass on
    -- this connection are dropped here. Created only once a consumer with alias members or
    -- max_events_per_run needs them (a pass over consumers with neither creates none):
    --   _assetq_member  the consumer's clause members (clause_no, asset_id); an alias member
    --                   that has resolved to nothing gives asset_id NULL, so its clause counts
    --   _assetq_queue   with max_events_per_run = N: the consumer's N + 1 oldest rows, by
    --                   position in queue order (1: the oldest), witness rows marked
    --   _assetq_oldest  with max_events_per_run, in the witness search: each member asset's
    --                   oldest queued row (none for an asset with no row queued)
    --   _assetq_chosen  with max_events_per_run: the witness assets, in the order chosen,
    --                   with their oldest rows
    -- and only once a run whose last attempt's lease expired is found:
    --   _assetq_reap    those runs, with their consumers' max_attempts,
    --   _assetq_reaped  and those of them locked, with their errors
    -- MySQL 8 / MariaDB: MySQL cannot open one temporary table twice in a statement, so no
    -- statement below names the same temporary table twice.
    DROP TEMPORARY TABLE IF EXISTS {{ns}}._assetq_candidate, {{ns}}._assetq_claim, {{ns}}._assetq_run,
                                   {{ns}}._assetq_member, {{ns}}._assetq_queue, {{ns}}._assetq_oldest,
                                   {{ns}}._assetq_chosen, {{ns}}._assetq_reap, {{ns}}._assetq_reaped,
                                   {{ns}}._assetq_pkey, {{ns}}._assetq_prow, {{ns}}._assetq_present,
                                   {{ns}}._assetq_pmember, {{ns}}._assetq_phave, {{ns}}._assetq_phit,
                                   {{ns}}._assetq_ptaken, {{ns}}._assetq_prequired;
    CREATE TEMPORARY TABLE {{ns}}._assetq_candidate (
        pos    BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY,
        dag_id VARCHAR(250) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL
    ) ENGINE = InnoDB;
    CREATE TEMPORARY TABLE {{ns}}._assetq_claim (
        asset_event_id BIGINT NOT NULL PRIMARY KEY,
        asset_id       BIGINT NOT NULL,
        created_at     DATETIME(6) NOT NULL
    ) ENGINE = InnoDB;
    CREATE TEMPORARY TABLE {{ns}}._assetq_run (
        dag_run_id          BIGINT NOT NULL PRIMARY KEY,
        dag_id              VARCHAR(250) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
        run_id              VARCHAR(250) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
        seq                 BIGINT NOT NULL,
        run_after           DATETIME(6) NOT NULL,
        created_at          DATETIME(6) NOT NULL,
        event_ids           LONGTEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
        triggering_event_id BIGINT NOT NULL,
        state               VARCHAR(20) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
        partition_key       VARCHAR(250) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL
    ) ENGINE = InnoDB;

    -- I10: a run whose last attempt's lease expired is failed by the next pass (and by the
    -- next claim), whatever its consumer's state: at most 100 per pass, oldest lease first.
    -- As the check at the cap below and claim_runs do it: a plain read of the candidates
    -- through dag_run_lease_idx (running runs by the end of their lease; the usual answer is
    -- none, and costs no temporary table), then those rows locked by primary key SKIP LOCKED
    -- and tested again as locked (a worker completing or renewing one now keeps it), each
    -- error written from the row as locked, and failed by key. Not one locking read: through
    -- a secondary index it would keep every row it read and refused locked to the end of the
    -- pass, live leases included, even at READ COMMITTED. The consumers' max_attempts are
    -- read plainly: a dag row is never locked (see dag_lock).
    SET v_now = UTC_TIMESTAMP(6);
    SELECT COUNT(*) INTO v_expired
      FROM (SELECT r.id
              FROM {{ns}}.dag_run r FORCE INDEX (dag_run_lease_idx)
              STRAIGHT_JOIN {{ns}}.dag d FORCE INDEX (PRIMARY) ON d.dag_id = r.dag_id
             WHERE r.state = 'running' AND r.not_before <= v_now AND r.attempt >= d.max_attempts
             LIMIT 1) x;
    IF v_expired > 0 THEN
        CREATE TEMPORARY TABLE {{ns}}._assetq_reap (
            id           BIGINT NOT NULL PRIMARY KEY,
            max_attempts INT NOT NULL
        ) ENGINE = InnoDB;
        CREATE TEMPORARY TABLE {{ns}}._assetq_reaped (
            id    BIGINT NOT NULL PRIMARY KEY,
            error TEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL
        ) ENGINE = InnoDB;
        SET v_reaping = TRUE;
        INSERT INTO {{ns}}._assetq_reap (id, max_attempts)
        SELECT r.id, d.max_attempts
          FROM {{ns}}.dag_run r FORCE INDEX (dag_run_lease_idx)
          STRAIGHT_JOIN {{ns}}.dag d FORCE INDEX (PRIMARY) ON d.dag_id = r.dag_id
         WHERE r.state = 'running' AND r.not_before <= v_now AND r.attempt >= d.max_attempts
         ORDER BY r.not_before
         LIMIT 100;
        INSERT INTO {{ns}}._assetq_reaped (id, error)
        SELECT r.id,
               CONCAT('the lease of attempt ', r.attempt, ' (worker ', COALESCE(r.worker, ''),
                      ') expired at ',
                      COALESCE(DATE_FORMAT(r.lease_until, '%Y-%m-%d %H:%i:%s.%f'), ''),
                      '+00 and no attempt is left (max_attempts ', k.max_attempts, ')')
          FROM {{ns}}._assetq_reap k FORCE INDEX (PRIMARY)
          STRAIGHT_JOIN {{ns}}.dag_run r FORCE INDEX (PRIMARY) ON r.id = k.id
         WHERE r.state = 'running' AND r.not_before <= v_now AND r.attempt >= k.max_attempts
           FOR UPDATE SKIP LOCKED;
        UPDATE {{ns}}._assetq_reaped k
          STRAIGHT_JOIN {{ns}}.dag_run r FORCE INDEX (PRIMARY) ON r.id = k.id
           SET r.state = 'failed', r.ended_at = v_now, r.updated_at = v_now,
               r.not_before = NULL, r.lease_until = NULL, r.error = k.error;
    END IF;

    -- Candidates: unpaused consumers with queued rows, least recently examined first (NULL
    -- sorts first in MySQL's ascending order). A plain read that locks nothing; each
    -- candidate is locked on its own below. One locking statement with ORDER BY ... LIMIT
    -- could lock every candidate before sorting and keep the ones past the limit locked.
    -- MySQL 8 / MariaDB: MariaDB has no FOR UPDATE OF <table>, so a locking join would
    -- lock the dag rows too; the lock statement below reads dag_lock alone.
    -- Whether a consumer has queued rows is one probe of the queue's primary key by consumer
    -- (migration 0007_capped_claim), a scalar subquery. MySQL 8 / MariaDB: both may flatten
    -- an EXISTS into a semi-join, and MariaDB 10.11 answered this one, as a SELECT, by
    -- materializing every queued row's consumer: the whole backlog read (measured: 100,020
    -- index entries for 1,001 consumers over 100,000 queued rows). A scalar subquery is
    -- never flattened, and its LIMIT 1 stops at the first row (tests/test_capped_claim.py).
    INSERT INTO {{ns}}._assetq_candidate (dag_id)
    SELECT l.dag_id
      FROM {{ns}}.dag_lock l
      JOIN {{ns}}.dag d ON d.dag_id = l.dag_id
     WHERE NOT d.is_paused
       AND CASE WHEN d.partitioning IS NULL
                THEN (SELECT q.target_dag_id
                        FROM {{ns}}.asset_dag_run_queue q FORCE INDEX (PRIMARY)
                       WHERE q.target_dag_id = l.dag_id
                       LIMIT 1)
                -- A partitioned consumer has work only when a row arrived that no pass has
                -- examined yet (migration 0009_partitions): its keys waiting for other assets
                -- cost nothing.
                ELSE (SELECT p.target_dag_id
                        FROM {{ns}}.asset_partition_queue p FORCE INDEX (asset_partition_queue_new_idx)
                       WHERE p.target_dag_id = l.dag_id AND p.examined = FALSE
                       LIMIT 1)
           END IS NOT NULL
     ORDER BY l.last_scheduled_at, l.dag_id;

    -- Each capped consumer's share of the pass's runs (see above): p_limit over the number of
    -- candidates with work, at most p_limit, rounded down. MySQL 8 / MariaDB: DIV is integer
    -- division on both; the candidates are never counted as 0 here (no division by zero).
    SELECT COUNT(*) INTO v_candidates FROM {{ns}}._assetq_candidate;
    SET v_share = GREATEST(1, p_limit DIV LEAST(GREATEST(v_candidates, 1), p_limit));

    candidate_loop: WHILE v_taken < p_limit DO
        SET v_dag_id = NULL;
        SELECT c.pos, c.dag_id INTO v_pos, v_dag_id
          FROM {{ns}}._assetq_candidate c WHERE c.pos > v_pos ORDER BY c.pos LIMIT 1;
        IF v_dag_id IS NULL THEN
            LEAVE candidate_loop;
        END IF;

        -- The consumer's lock row; SKIP LOCKED: concurrent passes split the consumers
        -- between them instead of waiting (I5). The dag row is never locked (see dag_lock).
        SET v_locked_seq = NULL;
        SELECT l.last_run_seq INTO v_locked_seq
          FROM {{ns}}.dag_lock l WHERE l.dag_id = v_dag_id
           FOR UPDATE SKIP LOCKED;
        IF v_locked_seq IS NULL THEN
            ITERATE candidate_loop;
        END IF;
        SET v_taken = v_taken + 1;

        -- Our snapshot must not predate the last run created for this consumer: a pass that
        -- commits a run bumps last_run_seq with the deletion of the rows it consumed. A plain
        -- read here (a fresh snapshot at READ COMMITTED) sees the locked value; at REPEATABLE
        -- READ it may see an older one, and the claim would hold rows already consumed.
        SELECT l.last_run_seq INTO v_seen_seq FROM {{ns}}.dag_lock l WHERE l.dag_id = v_dag_id;
        IF v_seen_seq <> v_locked_seq THEN
            SET v_message = LEFT(CONCAT('[AQ900] claim guard: snapshot of dag ', v_dag_id,
                                        ' predates its lock; run the pass at READ COMMITTED'), 128);
            SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = v_message;
        END IF;

        -- A consumer deleted since the candidate read has no lock row: skipped above. Whether
        -- it has alias members comes with its row (a plain read: its condition changes only
        -- under the lock this pass holds).
        SELECT d.is_paused, d.max_active_runs, d.max_events_per_run, d.max_attempts,
               EXISTS (SELECT 1 FROM {{ns}}.dag_condition_alias ca WHERE ca.dag_id = d.dag_id),
               d.partitioning IS NOT NULL
          INTO v_paused, v_max_active, v_max_events, v_max_attempts, v_aliased, v_partitioned
          FROM {{ns}}.dag d WHERE d.dag_id = v_dag_id;
        IF v_paused THEN
            -- Paused since the candidate read: like a consumer another pass holds.
            SET v_taken = v_taken - 1;
            ITERATE candidate_loop;
        END IF;
        SET v_now = UTC_TIMESTAMP(6);

        -- At its cap: no run, the queue stays whole. Runs become active only in a pass holding
        -- this lock, so the count can only be too high (a run finishing meanwhile), never too
        -- low: the next pass sees it. First, its runs whose last attempt's lease expired are
        -- failed: a plain read of them (the usual answer is none, and costs no temporary
        -- table), then those rows locked by key SKIP LOCKED and tested again as locked (a
        -- worker completing or renewing one now keeps it), each error written from the row as
        -- locked, and failed by key. Not a locking read of the consumer's running runs: it
        -- would keep every one it read locked to the end of the pass, live leases included
        -- (see claim_runs). MySQL 8 / MariaDB: an UPDATE cannot read its own table in a
        -- subquery, and MySQL cannot open one temporary table twice in a statement.
        IF v_max_active IS NOT NULL THEN
            SELECT COUNT(*) INTO v_expired
              FROM {{ns}}.dag_run r
             WHERE r.dag_id = v_dag_id AND r.state = 'running' AND r.not_before <= v_now
               AND r.attempt >= v_max_attempts;
            IF v_expired > 0 THEN
                IF NOT v_reaping THEN
                    CREATE TEMPORARY TABLE {{ns}}._assetq_reap (
                        id           BIGINT NOT NULL PRIMARY KEY,
                        max_attempts INT NOT NULL
                    ) ENGINE = InnoDB;
                    CREATE TEMPORARY TABLE {{ns}}._assetq_reaped (
                        id    BIGINT NOT NULL PRIMARY KEY,
                        error TEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL
                    ) ENGINE = InnoDB;
                    SET v_reaping = TRUE;
                END IF;
                DELETE FROM {{ns}}._assetq_reap;
                DELETE FROM {{ns}}._assetq_reaped;
                INSERT INTO {{ns}}._assetq_reap (id, max_attempts)
                SELECT r.id, v_max_attempts
                  FROM {{ns}}.dag_run r
                 WHERE r.dag_id = v_dag_id AND r.state = 'running' AND r.not_before <= v_now
                   AND r.attempt >= v_max_attempts;
                INSERT INTO {{ns}}._assetq_reaped (id, error)
                SELECT r.id,
                       CONCAT('the lease of attempt ', r.attempt, ' (worker ', COALESCE(r.worker, ''),
                              ') expired at ',
                              COALESCE(DATE_FORMAT(r.lease_until, '%Y-%m-%d %H:%i:%s.%f'), ''),
                              '+00 and no attempt is left (max_attempts ', k.max_attempts, ')')
                  FROM {{ns}}._assetq_reap k FORCE INDEX (PRIMARY)
                  STRAIGHT_JOIN {{ns}}.dag_run r FORCE INDEX (PRIMARY) ON r.id = k.id
                 WHERE r.state = 'running' AND r.not_before <= v_now AND r.attempt >= k.max_attempts
                   FOR UPDATE SKIP LOCKED;
                UPDATE {{ns}}._assetq_reaped k
                  STRAIGHT_JOIN {{ns}}.dag_run r FORCE INDEX (PRIMARY) ON r.id = k.id
                   SET r.state = 'failed', r.ended_at = v_now, r.updated_at = v_now,
                       r.not_before = NULL, r.lease_until = NULL, r.error = k.error;
            END IF;
            SELECT COUNT(*) INTO v_active
              FROM {{ns}}.dag_run r
             WHERE r.dag_id = v_dag_id AND r.state IN ('queued', 'running');
            IF v_active >= v_max_active THEN
                UPDATE {{ns}}.dag_lock SET last_scheduled_at = v_now WHERE dag_id = v_dag_id;
                ITERATE candidate_loop;
            END IF;
        END IF;

        -- A partitioned consumer: a run per partition key whose events satisfy the condition.
        IF v_partitioned THEN
            CALL {{ns}}.schedule_partitions(v_dag_id, v_max_active, v_max_events, v_now);
            ITERATE candidate_loop;
        END IF;

        -- The condition's members, read once for this consumer into _assetq_member when it
        -- has alias members or max_events_per_run. Otherwise (the usual case) its clauses are
        -- its asset members alone, counted and matched in dag_condition_clause directly.
        SET v_members = v_aliased OR v_max_events IS NOT NULL;
        IF v_members THEN
            IF NOT v_temps THEN
                CREATE TEMPORARY TABLE {{ns}}._assetq_member (
                    clause_no INT NOT NULL,
                    asset_id  BIGINT NULL,
                    KEY (asset_id),
                    KEY (clause_no)
                ) ENGINE = InnoDB;
                CREATE TEMPORARY TABLE {{ns}}._assetq_queue (
                    pos            BIGINT NOT NULL PRIMARY KEY,
                    asset_event_id BIGINT NOT NULL,
                    asset_id       BIGINT NOT NULL,
                    created_at     DATETIME(6) NOT NULL,
                    witness        BOOLEAN NOT NULL DEFAULT FALSE,
                    UNIQUE KEY (asset_event_id)
                ) ENGINE = InnoDB;
                CREATE TEMPORARY TABLE {{ns}}._assetq_oldest (
                    asset_id       BIGINT NOT NULL PRIMARY KEY,
                    asset_event_id BIGINT NOT NULL,
                    created_at     DATETIME(6) NOT NULL
                ) ENGINE = InnoDB;
                CREATE TEMPORARY TABLE {{ns}}._assetq_chosen (
                    pick_no        BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY,
                    asset_id       BIGINT NOT NULL,
                    asset_event_id BIGINT NOT NULL,
                    created_at     DATETIME(6) NOT NULL,
                    UNIQUE KEY (asset_id),
                    UNIQUE KEY (asset_event_id)
                ) ENGINE = InnoDB;
                SET v_temps = TRUE;
            END IF;
            DELETE FROM {{ns}}._assetq_member;
            INSERT INTO {{ns}}._assetq_member (clause_no, asset_id)
            SELECT c.clause_no, c.asset_id
              FROM {{ns}}.dag_condition_clause c
             WHERE c.dag_id = v_dag_id
            UNION ALL
            SELECT ca.clause_no, aa.asset_id
              FROM {{ns}}.dag_condition_alias ca
              LEFT JOIN {{ns}}.asset_alias_asset aa ON aa.alias_id = ca.alias_id
             WHERE ca.dag_id = v_dag_id;
            SELECT COUNT(DISTINCT m.clause_no) INTO v_clauses FROM {{ns}}._assetq_member m;
        ELSE
            SELECT COUNT(DISTINCT c.clause_no) INTO v_clauses
              FROM {{ns}}.dag_condition_clause c WHERE c.dag_id = v_dag_id;
        END IF;

        -- Its runs, one after another (migration 0011_runs_per_pass): each one's claim is built
        -- afresh, so the temporary tables of the claim are emptied for each run; the members
        -- are the consumer's and stay. A consumer without max_events_per_run leaves after its
        -- first run: that one consumed its whole queue.
        SET v_made = 0;
        SET v_from_t = '1000-01-01 00:00:00.000000', v_from_id = 0;
        run_loop: LOOP
            -- The claim: a plain read of the consumer's committed queue rows, taken after the
            -- lock, so it sees every row committed so far, including the deletions of a pass that
            -- held this consumer a moment ago. A row committed after this read is not in the
            -- claim and waits for the next pass: selection is by reference, never by time (I3).
            -- An uncommitted producer row is neither read nor waited for. A run after the
            -- first sees the rows the ones before it deleted (this transaction's own).
            DELETE FROM {{ns}}._assetq_claim;
            IF v_max_events IS NULL THEN
                INSERT INTO {{ns}}._assetq_claim (asset_event_id, asset_id, created_at)
                SELECT q.asset_event_id, q.asset_id, q.created_at
                  FROM {{ns}}.asset_dag_run_queue q
                 WHERE q.target_dag_id = v_dag_id;
            ELSE
                -- Capped at N = max_events_per_run: the N + 1 oldest rows only, in queue order
                -- (created_at, asset_event_id) through asset_dag_run_queue_order_idx, which holds
                -- every column read: a capped run costs what it consumes, never the backlog
                -- behind it (issue 16). Numbered in that order; the selection below works on this
                -- copy, and on each member asset's oldest row if it must (the witness search).
                -- A run after the first reads on from the oldest row the one before it read
                -- and left (v_from_t, v_from_id), here and in the witness search: the rows
                -- before it are the ones this pass deleted, whose delete-marked index records
                -- stay until it commits, and stepping over them again would make a pass of R
                -- runs cost R² of them. A row committed meanwhile with an older timestamp is
                -- left to the next pass. MySQL 8 / MariaDB: the position as two ranges (OR),
                -- which both range optimizers take, not a row comparison.
                -- MySQL 8 / MariaDB: LIMIT takes a routine variable, not an expression.
                DELETE FROM {{ns}}._assetq_queue;
                DELETE FROM {{ns}}._assetq_oldest;
                DELETE FROM {{ns}}._assetq_chosen;
                SET v_take = v_max_events + 1;
                SET v_witnessed = FALSE;
                INSERT INTO {{ns}}._assetq_queue (pos, asset_event_id, asset_id, created_at)
                SELECT ROW_NUMBER() OVER (ORDER BY o.created_at, o.asset_event_id),
                       o.asset_event_id, o.asset_id, o.created_at
                  FROM (SELECT q.asset_event_id, q.asset_id, q.created_at
                          FROM {{ns}}.asset_dag_run_queue q FORCE INDEX (asset_dag_run_queue_order_idx)
                         WHERE q.target_dag_id = v_dag_id
                           AND (q.created_at > v_from_t
                                OR (q.created_at = v_from_t AND q.asset_event_id >= v_from_id))
                         ORDER BY q.created_at, q.asset_event_id
                         LIMIT v_take) o;
                SELECT COUNT(*) INTO v_queued FROM {{ns}}._assetq_queue;
                SET v_met = 0;
                IF v_queued > v_max_events THEN
                    SELECT COUNT(DISTINCT m.clause_no) INTO v_met
                      FROM {{ns}}._assetq_member m
                     WHERE m.asset_id IN (SELECT q.asset_id FROM {{ns}}._assetq_queue q
                                           WHERE q.pos <= v_max_events);
                END IF;
                IF v_queued <= v_max_events THEN
                    -- At most N queued: the whole queue.
                    INSERT INTO {{ns}}._assetq_claim (asset_event_id, asset_id, created_at)
                    SELECT q.asset_event_id, q.asset_id, q.created_at FROM {{ns}}._assetq_queue q;
                ELSEIF v_clauses > 0 AND v_met = v_clauses THEN
                    -- The N oldest rows satisfy the condition: they are the claim.
                    INSERT INTO {{ns}}._assetq_claim (asset_event_id, asset_id, created_at)
                    SELECT q.asset_event_id, q.asset_id, q.created_at
                      FROM {{ns}}._assetq_queue q
                     WHERE q.pos <= v_max_events;
                ELSEIF v_clauses > 0 THEN
                    SET v_witnessed = TRUE;
                    -- The N oldest rows do not satisfy the condition. Greedy witnesses over the
                    -- whole queue, by index: first each member asset's oldest queued row, one
                    -- probe of asset_dag_run_queue_asset_idx each, its id and timestamp read
                    -- together. MySQL 8 / MariaDB: MariaDB has no LATERAL join, hence the loop.
                    SET v_asset = 0;
                    asset_loop: LOOP
                        SELECT MIN(m.asset_id) INTO v_asset
                          FROM {{ns}}._assetq_member m WHERE m.asset_id > v_asset;
                        IF v_asset IS NULL THEN
                            LEAVE asset_loop;
                        END IF;
                        SET v_pick_id = NULL;
                        SELECT q.asset_event_id, q.created_at INTO v_pick_id, v_pick_time
                          FROM {{ns}}.asset_dag_run_queue q FORCE INDEX (asset_dag_run_queue_asset_idx)
                         WHERE q.target_dag_id = v_dag_id AND q.asset_id = v_asset
                           AND (q.created_at > v_from_t
                                OR (q.created_at = v_from_t AND q.asset_event_id >= v_from_id))
                         ORDER BY q.created_at, q.asset_event_id
                         LIMIT 1;
                        IF v_pick_id IS NOT NULL THEN
                            INSERT INTO {{ns}}._assetq_oldest (asset_id, asset_event_id, created_at)
                            VALUES (v_asset, v_pick_id, v_pick_time);
                        END IF;
                    END LOOP;
                    -- Then, for each clause not yet hit, the member asset whose oldest row is the
                    -- oldest, and that row. A clause with no queued member: the whole queue does
                    -- not satisfy the condition, no run.
                    SET v_clause = 0;
                    SET v_missing = FALSE;
                    clause_loop: LOOP
                        SET v_next = NULL;
                        SELECT MIN(m.clause_no) INTO v_next
                          FROM {{ns}}._assetq_member m WHERE m.clause_no > v_clause;
                        IF v_next IS NULL THEN
                            LEAVE clause_loop;
                        END IF;
                        SET v_clause = v_next;
                        SELECT COUNT(*) INTO v_hit
                          FROM {{ns}}._assetq_chosen c
                          JOIN {{ns}}._assetq_member m ON m.asset_id = c.asset_id
                         WHERE m.clause_no = v_clause;
                        IF v_hit = 0 THEN
                            SET v_pick = NULL;
                            SELECT o.asset_id, o.asset_event_id, o.created_at
                              INTO v_pick, v_pick_id, v_pick_time
                              FROM {{ns}}._assetq_oldest o
                              JOIN {{ns}}._assetq_member m ON m.asset_id = o.asset_id
                             WHERE m.clause_no = v_clause
                             ORDER BY o.created_at, o.asset_event_id
                             LIMIT 1;
                            IF v_pick IS NULL THEN
                                SET v_missing = TRUE;
                                LEAVE clause_loop;
                            END IF;
                            INSERT INTO {{ns}}._assetq_chosen (asset_id, asset_event_id, created_at)
                            VALUES (v_pick, v_pick_id, v_pick_time);
                        END IF;
                    END LOOP;
                    IF NOT v_missing THEN
                        -- Prune, newest choice first: what is left is a minimal set of assets.
                        SELECT MAX(c.pick_no) + 1 INTO v_pick_no FROM {{ns}}._assetq_chosen c;
                        prune_loop: LOOP
                            SET v_pick = NULL;
                            SELECT c.pick_no, c.asset_id INTO v_pick_no, v_pick
                              FROM {{ns}}._assetq_chosen c
                             WHERE c.pick_no < v_pick_no
                             ORDER BY c.pick_no DESC
                             LIMIT 1;
                            IF v_pick IS NULL THEN
                                LEAVE prune_loop;
                            END IF;
                            SELECT COUNT(DISTINCT m.clause_no) INTO v_met
                              FROM {{ns}}._assetq_chosen c
                              JOIN {{ns}}._assetq_member m ON m.asset_id = c.asset_id
                             WHERE c.asset_id <> v_pick;
                            IF v_met = v_clauses THEN
                                DELETE FROM {{ns}}._assetq_chosen WHERE asset_id = v_pick;
                            END IF;
                        END LOOP;
                        -- The witness rows, then the oldest others, N in all (more only if the
                        -- witnesses alone are more). The others come from the N + 1 oldest rows
                        -- read above: at most N minus the witnesses are needed, and that many
                        -- are among them.
                        UPDATE {{ns}}._assetq_queue q
                          JOIN {{ns}}._assetq_chosen c ON c.asset_event_id = q.asset_event_id
                           SET q.witness = TRUE;
                        INSERT INTO {{ns}}._assetq_claim (asset_event_id, asset_id, created_at)
                        SELECT c.asset_event_id, c.asset_id, c.created_at FROM {{ns}}._assetq_chosen c;
                        SELECT GREATEST(v_max_events - COUNT(*), 0) INTO v_take
                          FROM {{ns}}._assetq_chosen;
                        INSERT INTO {{ns}}._assetq_claim (asset_event_id, asset_id, created_at)
                        SELECT q.asset_event_id, q.asset_id, q.created_at
                          FROM {{ns}}._assetq_queue q
                         WHERE NOT q.witness
                         ORDER BY q.pos
                         LIMIT v_take;
                    END IF;
                END IF;
            END IF;
            SELECT COUNT(*), MAX(k.created_at), MIN(k.created_at), MAX(k.asset_event_id)
              INTO v_claimed, v_run_after, v_oldest, v_newest_id
              FROM {{ns}}._assetq_claim k;

            -- I6: every clause of the condition needs an asset among the claimed rows.
            IF v_members THEN
                SELECT COUNT(DISTINCT m.clause_no) INTO v_met
                  FROM {{ns}}._assetq_member m
                 WHERE m.asset_id IN (SELECT k.asset_id FROM {{ns}}._assetq_claim k);
            ELSE
                SELECT COUNT(DISTINCT c.clause_no) INTO v_met
                  FROM {{ns}}.dag_condition_clause c
                 WHERE c.dag_id = v_dag_id
                   AND c.asset_id IN (SELECT k.asset_id FROM {{ns}}._assetq_claim k);
            END IF;

            IF v_claimed = 0 OR v_clauses = 0 OR v_met < v_clauses THEN
                UPDATE {{ns}}.dag_lock SET last_scheduled_at = v_now WHERE dag_id = v_dag_id;
                LEAVE run_loop;
            END IF;
            SET v_seq = v_locked_seq + v_made + 1;
            UPDATE {{ns}}.dag_lock
               SET last_run_seq = v_seq, last_scheduled_at = v_now
             WHERE dag_id = v_dag_id;
            -- The triggering event: the newest claimed row (created_at, then id). When every
            -- claimed row has one timestamp (a single row, or one batch) that is the highest
            -- id, counted above; otherwise it is looked up.
            IF v_oldest = v_run_after THEN
                SET v_trigger = v_newest_id;
            ELSE
                SELECT k.asset_event_id INTO v_trigger
                  FROM {{ns}}._assetq_claim k
                 ORDER BY k.created_at DESC, k.asset_event_id DESC
                 LIMIT 1;
            END IF;
            SET v_run_id = CONCAT('asset_triggered__',
                                  DATE_FORMAT(v_run_after, '%Y-%m-%dT%H:%i:%s.%f'),
                                  '+00:00__', v_seq);
            -- not_before: claimable by workers (claim_runs) from now on.
            INSERT INTO {{ns}}.dag_run (dag_id, run_id, seq, run_after, created_at,
                                        triggering_event_id, event_count, not_before)
            VALUES (v_dag_id, v_run_id, v_seq, v_run_after, v_now, v_trigger, v_claimed, v_now);
            -- MySQL 8 / MariaDB: no RETURNING on MySQL.
            SET v_run_pk = LAST_INSERT_ID();

            -- Delete exactly the claimed rows (I3), one primary-key lookup per claimed id:
            -- STRAIGHT_JOIN makes the claim table drive the join. A plan that range-scans the
            -- consumer's queue instead waits on producers' uncommitted rows, even at READ
            -- COMMITTED. FORCE INDEX (PRIMARY) since 0007_capped_claim: with the queue's indexes
            -- by consumer, MariaDB 10.11 chose a ref scan of asset_dag_run_queue_order_idx over
            -- the consumer's rows (index only, which it costs below the primary key's eq_ref)
            -- for a consumer with few queued rows, and the pass waited for producers.
            -- The claim guard (I4): if any claimed row is gone, someone else
            -- consumed it (or delete_asset deleted it with its event); abort the whole pass.
            -- Before the links: once the rows are held, delete_asset waits for this pass
            -- before it deletes their events, so a link never meets a deleted event.
            DELETE q
              FROM {{ns}}._assetq_claim k
              STRAIGHT_JOIN {{ns}}.asset_dag_run_queue q FORCE INDEX (PRIMARY)
                ON q.target_dag_id = v_dag_id AND q.asset_event_id = k.asset_event_id;
            SET v_deleted = ROW_COUNT();
            IF v_deleted <> v_claimed THEN
                SET v_message = LEFT(CONCAT('[AQ900] claim guard: dag ', v_dag_id, ' claimed ',
                                            v_claimed, ' queue rows but deleted ', v_deleted), 128);
                SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = v_message;
            END IF;

            INSERT INTO {{ns}}.dagrun_asset_event (dag_run_id, asset_event_id, dag_id)
            SELECT v_run_pk, k.asset_event_id, v_dag_id FROM {{ns}}._assetq_claim k;

            -- The run's ids as JSON text for the result. GROUP_CONCAT is cut silently at
            -- group_concat_max_len (1024 by default on MySQL): raised for this one statement
            -- to 1 GiB, the largest value both engines accept in strict mode and the most a
            -- packet can carry anyway, and the result is checked against the claim all the same.
            -- MySQL 8 / MariaDB: JSON_ARRAYAGG takes no ORDER BY on MySQL and is cut at
            -- group_concat_max_len on MariaDB; GROUP_CONCAT behaves the same on both.
            SET SESSION group_concat_max_len = 1073741824;
            SELECT CONCAT('[', GROUP_CONCAT(k.asset_event_id ORDER BY k.asset_event_id SEPARATOR ','), ']')
              INTO v_event_ids
              FROM {{ns}}._assetq_claim k;
            SET SESSION group_concat_max_len = v_saved_gcl;
            IF NOT (JSON_LENGTH(v_event_ids) <=> v_claimed) THEN
                SET v_message = LEFT(CONCAT('[AQ900] claim guard: event ids of dag ', v_dag_id,
                                            ' were truncated'), 128);
                SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = v_message;
            END IF;

            INSERT INTO {{ns}}._assetq_run
                   (dag_run_id, dag_id, run_id, seq, run_after, created_at, event_ids,
                    triggering_event_id, state, partition_key)
            VALUES (v_run_pk, v_dag_id, v_run_id, v_seq, v_run_after, v_now, v_event_ids,
                    v_trigger, 'queued', NULL);

            -- The next run, unless this one took the whole remaining queue (uncapped, or it
            -- read at most N rows), the consumer made its share of the pass, or its active
            -- runs, counted at the cap check, and this pass's reach the cap.
            SET v_made = v_made + 1;
            IF v_max_events IS NULL OR v_queued <= v_max_events OR v_made >= v_share
               OR (v_max_active IS NOT NULL AND v_active + v_made >= v_max_active) THEN
                LEAVE run_loop;
            END IF;
            -- Where the next claim reads from: the oldest row read and not claimed (the N + 1st
            -- when the N oldest were the claim).
            SET v_from_id = NULL;
            IF v_witnessed THEN
                SELECT q.created_at, q.asset_event_id INTO v_from_t, v_from_id
                  FROM {{ns}}._assetq_queue q
                 WHERE NOT EXISTS (SELECT 1 FROM {{ns}}._assetq_claim k
                                    WHERE k.asset_event_id = q.asset_event_id)
                 ORDER BY q.pos
                 LIMIT 1;
            ELSE
                SELECT q.created_at, q.asset_event_id INTO v_from_t, v_from_id
                  FROM {{ns}}._assetq_queue q WHERE q.pos = v_max_events + 1;
            END IF;
            IF v_from_id IS NULL THEN
                LEAVE run_loop;
            END IF;
        END LOOP run_loop;
    END WHILE candidate_loop;

    SELECT r.dag_run_id, r.dag_id, r.run_id, r.seq, r.run_after, r.created_at, r.event_ids,
           r.triggering_event_id, r.state, r.partition_key
      FROM {{ns}}._assetq_run r
     ORDER BY r.dag_run_id;
    DROP TEMPORARY TABLE IF EXISTS {{ns}}._assetq_candidate, {{ns}}._assetq_claim, {{ns}}._assetq_run,
                                   {{ns}}._assetq_member, {{ns}}._assetq_queue, {{ns}}._assetq_oldest,
                                   {{ns}}._assetq_chosen, {{ns}}._assetq_reap, {{ns}}._assetq_reaped,
                                   {{ns}}._assetq_pkey, {{ns}}._assetq_prow, {{ns}}._assetq_present,
                                   {{ns}}._assetq_pmember, {{ns}}._assetq_phave, {{ns}}._assetq_phit,
                                   {{ns}}._assetq_ptaken, {{ns}}._assetq_prequired;
END $$


-- Moves run p_run_id of consumer p_dag_id to state p_state and returns it as one result set
-- (the get_run columns). Allowed: queued -> running, success or failed; running -> success
-- or failed. Moving a run to the state it is in changes nothing (a retry is harmless).
-- Anything else, or a state that is none of the four, raises AQ008; an unknown run AQ006.
-- started_at is set on entering running, ended_at on entering success or failed, updated_at
-- on every change. A run in success or failed no longer counts against max_active_runs.
-- It locks the run row only: never the consumer, so it never waits for a scheduler pass.
--
-- Workers (migration 0006_work_queue): the result has the run's attempt, worker, lease,
-- not_before and error too. A run a worker holds (claimed by claim_runs: running under a
-- lease) is finished by that worker's complete_run, fenced by its attempt (I8): moving it
-- here raises AQ008 (if the worker died, the run is claimed again when its lease expires). A
-- run moved out of queued by hand is no longer claimable (not_before NULL) and has no lease,
-- so it is not held, whatever worker and attempt it kept from an earlier attempt.
DROP PROCEDURE IF EXISTS {{ns}}.set_run_state $$
CREATE PROCEDURE {{ns}}.set_run_state(
    IN p_dag_id TEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin,
    IN p_run_id TEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin,
    IN p_state  TEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin
)
MODIFIES SQL DATA
BEGIN
    DECLARE v_id      BIGINT;
    DECLARE v_old     VARCHAR(20) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin;
    DECLARE v_worker  VARCHAR(250) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin;
    DECLARE v_attempt INT;
    DECLARE v_lease   DATETIME(6);
    DECLARE v_now     DATETIME(6);
    DECLARE v_message VARCHAR(128) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin;

    -- NOT LIKE '% ': the PAD SPACE collation would take 'queued ' for 'queued'.
    IF p_state IS NULL OR p_state NOT IN ('queued', 'running', 'success', 'failed')
       OR p_state LIKE '% ' THEN
        SET v_message = LEFT(CONCAT('[AQ008] unknown run state ', COALESCE(QUOTE(LEFT(p_state, 40)), 'NULL'),
                                    ': use queued, running, success or failed'), 128);
        SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = v_message;
    END IF;
    -- A locking read: it sees the run whatever the caller's snapshot, and holds it.
    SELECT r.id, r.state, r.worker, r.attempt, r.lease_until
      INTO v_id, v_old, v_worker, v_attempt, v_lease
      FROM {{ns}}.dag_run r
     WHERE r.dag_id = p_dag_id AND r.run_id = p_run_id
       FOR UPDATE;
    IF v_id IS NULL THEN
        SET v_message = LEFT(CONCAT('[AQ006] unknown run ', COALESCE(QUOTE(LEFT(p_run_id, 60)), 'NULL'),
                                    ' of dag ', COALESCE(QUOTE(LEFT(p_dag_id, 40)), 'NULL')), 128);
        SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = v_message;
    END IF;
    IF v_old = 'running' AND v_lease IS NOT NULL AND v_old <> p_state THEN
        SET v_message = LEFT(CONCAT('[AQ008] run ', QUOTE(LEFT(p_run_id, 60)), ' is held by worker ',
                                    QUOTE(LEFT(v_worker, 40)), ' (attempt ', v_attempt,
                                    '): its worker completes it (assetq.complete_run)'), 128);
        SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = v_message;
    END IF;
    IF v_old <> p_state THEN
        IF NOT ((v_old = 'queued' AND p_state IN ('running', 'success', 'failed'))
                OR (v_old = 'running' AND p_state IN ('success', 'failed'))) THEN
            SET v_message = LEFT(CONCAT('[AQ008] run ', QUOTE(LEFT(p_run_id, 60)), ' is ', v_old,
                                        ': it cannot move to ', p_state), 128);
            SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = v_message;
        END IF;
        SET v_now = UTC_TIMESTAMP(6);
        UPDATE {{ns}}.dag_run
           SET state = p_state,
               started_at = IF(p_state = 'running', v_now, started_at),
               ended_at = IF(p_state IN ('success', 'failed'), v_now, ended_at),
               updated_at = v_now,
               -- Leaving queued by hand: no worker may claim it any more.
               not_before = NULL,
               lease_until = NULL
         WHERE id = v_id;
    END IF;
    SELECT r.id AS dag_run_id, r.dag_id, r.run_id, r.seq, r.state, r.run_after, r.created_at,
           r.started_at, r.ended_at, r.triggering_event_id, r.event_count, r.attempt, r.worker,
           r.lease_until, r.not_before, r.error, r.partition_key
      FROM {{ns}}.dag_run r
     WHERE r.id = v_id;
END $$


-- Removes consumer p_dag_id with its queue rows, condition, runs and their links, and its
-- lock row (cascades). Returns no result set; AQ003 for an unknown consumer. Waits for a
-- scheduler pass that holds it (its lock row, first). Then its reference and alias-clause
-- rows go before its dag row, the order in which the fan-out reads them: a producer in
-- flight for this consumer finishes first (its queue rows are deleted with the consumer), a
-- later one waits and then finds no consumer to queue for. Neither fails.
--
-- Its links and queue rows are deleted by hand, before the dag row (the link table has no
-- foreign keys since 0012_link_checks, the queue none since 0013_queue_checks; the runs
-- still go by cascade). No pass can add one behind that
-- delete: a pass holds the consumer's lock row from its claim to its commit, and we hold it
-- from the first statement (every later pass skips the consumer, SKIP LOCKED); the delete
-- is a locking read, which reads the committed pass's links. Its runs are locked before
-- the links, in the order purge_runs takes them (runs, then links), so the two never
-- deadlock; purge_runs skips them (SKIP LOCKED).
DROP PROCEDURE IF EXISTS {{ns}}.delete_dag $$
CREATE PROCEDURE {{ns}}.delete_dag(IN p_dag_id TEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin)
MODIFIES SQL DATA
BEGIN
    DECLARE v_found   BIGINT;
    DECLARE v_message VARCHAR(128) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin;
    SELECT COUNT(*) INTO v_found FROM {{ns}}.dag_lock l WHERE l.dag_id = p_dag_id FOR UPDATE;
    IF v_found = 0 THEN
        SET v_message = LEFT(CONCAT('[AQ003] unknown dag ', COALESCE(QUOTE(LEFT(p_dag_id, 64)), 'NULL')), 128);
        SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = v_message;
    END IF;
    -- By the dag_id index: on a small table the optimizer would rather scan the primary key,
    -- locking the references of every consumer. MySQL 8 / MariaDB: MySQL takes no index hint
    -- in a single-table DELETE; the multiple-table form takes one on both.
    DELETE r
      FROM {{ns}}.dag_schedule_asset_reference r
           FORCE INDEX (dag_schedule_asset_reference_dag_idx)
     WHERE r.dag_id = p_dag_id;
    -- The alias clauses by alias, the order of the fan-out's reads (their key is by clause):
    -- read with shared locks, which producers' do not conflict with, then deleted by key,
    -- driven by the list.
    DROP TEMPORARY TABLE IF EXISTS {{ns}}._assetq_delete_alias;
    CREATE TEMPORARY TABLE {{ns}}._assetq_delete_alias (
        alias_id  BIGINT NOT NULL,
        clause_no INT NOT NULL,
        PRIMARY KEY (alias_id, clause_no)
    ) ENGINE = InnoDB;
    INSERT INTO {{ns}}._assetq_delete_alias (alias_id, clause_no)
    SELECT ca.alias_id, ca.clause_no
      FROM {{ns}}.dag_condition_alias ca
     WHERE ca.dag_id = p_dag_id
      LOCK IN SHARE MODE;
    DELETE ca
      FROM {{ns}}._assetq_delete_alias k
      STRAIGHT_JOIN {{ns}}.dag_condition_alias ca
         ON ca.dag_id = p_dag_id AND ca.clause_no = k.clause_no AND ca.alias_id = k.alias_id;
    DROP TEMPORARY TABLE IF EXISTS {{ns}}._assetq_delete_alias;
    SELECT COUNT(*) INTO v_found
      FROM {{ns}}.dag_run r FORCE INDEX (dag_run_dag_state_idx)
     WHERE r.dag_id = p_dag_id
       FOR UPDATE;
    -- Its links through those runs, by the runs' dag_id index and the links' primary key: no
    -- index of the links leads with dag_id since 0014_link_keys. A multiple-table DELETE
    -- reads the runs, which we hold FOR UPDATE already.
    DELETE l
      FROM {{ns}}.dag_run r FORCE INDEX (dag_run_dag_state_idx)
      STRAIGHT_JOIN {{ns}}.dagrun_asset_event l FORCE INDEX (PRIMARY) ON l.dag_run_id = r.id
     WHERE r.dag_id = p_dag_id;
    -- Its queue rows by hand too (the queue has no foreign keys since 0013_queue_checks),
    -- after its reference and alias-clause rows: their delete waited for every producer in
    -- flight that read them (the fan-out reads them with a shared lock), and this delete, a
    -- locking read, reads those producers' committed rows; a later producer finds no
    -- reference to queue through.
    DELETE q
      FROM {{ns}}.asset_dag_run_queue q FORCE INDEX (PRIMARY)
     WHERE q.target_dag_id = p_dag_id;
    DELETE FROM {{ns}}.dag WHERE dag_id = p_dag_id;
END $$


-- Removes asset p_asset (a name or uri) with its events: their queue rows (consumers that
-- depended on it through an alias lose the pending ones), their links (runs that consumed
-- them keep their other events and their event_count) and alias resolutions. Returns one
-- result set (deleted_events). AQ001 for an unknown asset; AQ007 while a consumer condition
-- names the asset: re-declare those consumers first. The asset row is locked first, so
-- producers registering for it finish before (their events are deleted too) or fail after
-- with a foreign-key error that assetq reports as an unknown asset.
DROP PROCEDURE IF EXISTS {{ns}}.delete_asset $$
CREATE PROCEDURE {{ns}}.delete_asset(IN p_asset TEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin)
MODIFIES SQL DATA
BEGIN
    DECLARE v_id      BIGINT;
    DECLARE v_locked  BIGINT;
    DECLARE v_uses    BIGINT;
    DECLARE v_dags    TEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin;
    DECLARE v_deleted BIGINT;
    DECLARE v_message VARCHAR(128) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin;

    CALL {{ns}}.resolve_asset(p_asset, v_id);  -- by name, then uri, or AQ001
    SELECT a.id INTO v_locked FROM {{ns}}.asset a WHERE a.id = v_id FOR UPDATE;
    IF v_locked IS NULL THEN
        SET v_message = LEFT(CONCAT('[AQ001] unknown asset ', QUOTE(LEFT(p_asset, 64)),
                                    ': it was deleted meanwhile'), 128);
        SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = v_message;
    END IF;
    -- A locking read: a clause committed after the caller's snapshot counts too.
    SELECT COUNT(*) INTO v_uses
      FROM {{ns}}.dag_condition_clause c WHERE c.asset_id = v_id
      LOCK IN SHARE MODE;
    IF v_uses > 0 THEN
        SELECT GROUP_CONCAT(QUOTE(LEFT(x.dag_id, 40)) ORDER BY x.dag_id SEPARATOR ', ') INTO v_dags
          FROM (SELECT DISTINCT c.dag_id FROM {{ns}}.dag_condition_clause c
                 WHERE c.asset_id = v_id ORDER BY c.dag_id LIMIT 5) x;
        SET v_message = LEFT(CONCAT('[AQ007] asset ', QUOTE(LEFT(p_asset, 40)),
                                    ' is in the condition of dag ', COALESCE(v_dags, '?')), 128);
        SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = v_message;
    END IF;
    -- Everything by the asset's own index entries, which a producer adds only once its
    -- foreign-key check has passed (after this commits, it fails instead): the queue rows
    -- through the events (the queue has no index by asset, and a scan of it would lock every
    -- consumer's rows), the events, the alias resolutions, the references. The index hints
    -- keep the optimizer from scanning a small table by its primary key, which would lock
    -- (and wait for) the rows producers are inserting. MySQL 8 / MariaDB: MySQL takes no
    -- index hint in a single-table DELETE; the multiple-table form takes one on both.
    -- First the partition rows of those queue rows (migration 0009_partitions), the same way.
    DELETE p
      FROM {{ns}}.asset_event e FORCE INDEX (asset_event_idempotency_key)
      STRAIGHT_JOIN {{ns}}.asset_dag_run_queue q FORCE INDEX (asset_dag_run_queue_event_idx)
         ON q.asset_event_id = e.id
      STRAIGHT_JOIN {{ns}}.asset_partition_queue p FORCE INDEX (PRIMARY)
         ON p.target_dag_id = q.target_dag_id AND p.asset_event_id = q.asset_event_id
     WHERE e.asset_id = v_id;
    DELETE q
      FROM {{ns}}.asset_event e FORCE INDEX (asset_event_idempotency_key)
      STRAIGHT_JOIN {{ns}}.asset_dag_run_queue q FORCE INDEX (asset_dag_run_queue_event_idx)
         ON q.asset_event_id = e.id
     WHERE e.asset_id = v_id;
    -- The links of its events, by hand (no foreign keys on the link table since
    -- 0012_link_checks), after the queue rows: that delete, a locking read, waited for every
    -- pass holding one of them (a pass deletes the rows it claims and holds them to its
    -- commit), and this one, a locking read too, reads those passes' committed links. A pass
    -- that claims one of them later finds it deleted by us: its delete waits for our commit,
    -- deletes fewer rows than it claimed, and the claim guard (AQ900) rolls it back before it
    -- links anything.
    DELETE l
      FROM {{ns}}.asset_event e FORCE INDEX (asset_event_idempotency_key)
      STRAIGHT_JOIN {{ns}}.dagrun_asset_event l FORCE INDEX (dagrun_asset_event_once)
         ON l.asset_event_id = e.id
     WHERE e.asset_id = v_id;
    DELETE e
      FROM {{ns}}.asset_event e FORCE INDEX (asset_event_idempotency_key)
     WHERE e.asset_id = v_id;
    SET v_deleted = ROW_COUNT();
    DELETE aa
      FROM {{ns}}.asset_alias_asset aa FORCE INDEX (asset_alias_asset_asset_idx)
     WHERE aa.asset_id = v_id;
    DELETE r
      FROM {{ns}}.dag_schedule_asset_reference r FORCE INDEX (PRIMARY)
     WHERE r.asset_id = v_id;
    DELETE FROM {{ns}}.asset WHERE id = v_id;
    SELECT v_deleted AS deleted_events;
END $$

DELIMITER ;

SET SESSION sql_mode = @assetq_saved_sql_mode;


-- Operations (migration 0003_operations): the dag_queue_status view, retention
-- (purge_runs, purge_events) and least privilege (grant_access, revoke_access).

SET @assetq_saved_sql_mode = @@SESSION.sql_mode,
    SESSION sql_mode = 'STRICT_TRANS_TABLES,STRICT_ALL_TABLES,NO_ZERO_IN_DATE,NO_ZERO_DATE,ERROR_FOR_DIVISION_BY_ZERO,NO_ENGINE_SUBSTITUTION';

DELIMITER $$

-- Indexes for retention and status. Each is read by key or by a short range, so purge and
-- status cost what they delete or show, never a scan of the history. (The queue's index by
-- event, which the foreign-key check of a purged event needs, exists since 0001: InnoDB
-- needs one for every foreign key.)
--   asset_event_timestamp_idx  events by age, in the (timestamp, id) order of purge_events
--   dag_run_created_idx        runs by age, for purge_runs
--   dag_run_dag_created_idx    runs of a consumer by age, for dag_queue_status
-- MySQL 8 / MariaDB: CREATE INDEX IF NOT EXISTS is MariaDB-only, so a helper adds each index
-- unless information_schema already lists it, and is dropped again.
DROP PROCEDURE IF EXISTS {{ns}}._assetq_add_index $$
CREATE PROCEDURE {{ns}}._assetq_add_index(
    IN p_table TEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin,
    IN p_index TEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin,
    IN p_columns TEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin
)
MODIFIES SQL DATA
SQL SECURITY INVOKER
BEGIN
    IF NOT EXISTS (SELECT 1 FROM information_schema.STATISTICS s
                    WHERE s.TABLE_SCHEMA = DATABASE() AND s.TABLE_NAME = p_table
                      AND s.INDEX_NAME = p_index) THEN
        -- Inside a routine DATABASE() is the routine's own database: the namespace.
        SET @assetq_ddl = CONCAT('ALTER TABLE `', DATABASE(), '`.`', p_table,
                                 '` ADD INDEX `', p_index, '` (', p_columns, ')');
        PREPARE assetq_ddl FROM @assetq_ddl;
        EXECUTE assetq_ddl;
        DEALLOCATE PREPARE assetq_ddl;
    END IF;
END $$

DELIMITER ;

CALL {{ns}}._assetq_add_index('asset_event', 'asset_event_timestamp_idx', '`timestamp`, id');
CALL {{ns}}._assetq_add_index('dag_run', 'dag_run_created_idx', 'created_at');
CALL {{ns}}._assetq_add_index('dag_run', 'dag_run_dag_created_idx', 'dag_id, created_at');
DROP PROCEDURE IF EXISTS {{ns}}._assetq_add_index;


-- One row per consumer, for `assetq status` and dashboards. Read-only (it aggregates).
--   queued_events              queue rows of the consumer: events it has not consumed yet
--   oldest_queued_at           timestamp of the oldest of them (NULL when none), UTC
--   oldest_queued_age_seconds  how long that one has waited, by the server's clock
--   runs_last_hour             runs created in the last hour (runs purged are not counted)
--   last_run_at                when its newest run still in the history was created, UTC
--   runs_total                 runs ever created for it (its run sequence; purge keeps it)
--   last_scheduled_at          when a scheduler pass last examined it, UTC
--   max_active_runs            its cap on active runs (NULL: none)
--   active_runs                its runs in state queued or running
--   running_runs               its runs in state running (migration 0006_work_queue, as the
--                              rest below)
--   oldest_lease_until         the earliest end of a lease among its active runs (NULL: none)
--   expired_leases             running runs whose lease has ended: their worker stopped
--                              renewing it (the next claim takes them as a new attempt, or
--                              fails the last one)
--   retrying_runs              active runs already on a retry (a failed attempt or an expired
--                              lease behind them)
--   failed_runs                its failed runs still in the history
--   max_attempts               its max_attempts
-- The queue is grouped whole: it holds pending rows only, never history; the active runs are
-- grouped through dag_run_state_idx, so the view costs what is active, never the finished
-- history (failed_runs is one index range per consumer). SQL SECURITY DEFINER: a reader
-- needs SELECT on the view only.
-- MySQL 8 / MariaDB: no LATERAL on MariaDB, hence the grouped derived tables and the
-- correlated subqueries.
CREATE OR REPLACE SQL SECURITY DEFINER VIEW {{ns}}.dag_queue_status AS
SELECT d.dag_id,
       d.is_paused,
       COALESCE(q.queued_events, 0) AS queued_events,
       q.oldest_queued_at,
       TIMESTAMPDIFF(MICROSECOND, q.oldest_queued_at, UTC_TIMESTAMP(6)) / 1000000
           AS oldest_queued_age_seconds,
       (SELECT COUNT(*)
          FROM {{ns}}.dag_run r
         WHERE r.dag_id = d.dag_id
           AND r.created_at > UTC_TIMESTAMP(6) - INTERVAL 1 HOUR) AS runs_last_hour,
       (SELECT MAX(r.created_at) FROM {{ns}}.dag_run r WHERE r.dag_id = d.dag_id) AS last_run_at,
       l.last_run_seq AS runs_total,
       l.last_scheduled_at,
       d.max_active_runs,
       (SELECT COUNT(*)
          FROM {{ns}}.dag_run r
         WHERE r.dag_id = d.dag_id AND r.state IN ('queued', 'running')) AS active_runs,
       COALESCE(w.running_runs, 0) AS running_runs,
       w.oldest_lease_until,
       COALESCE(w.expired_leases, 0) AS expired_leases,
       COALESCE(w.retrying_runs, 0) AS retrying_runs,
       (SELECT COUNT(*)
          FROM {{ns}}.dag_run r
         WHERE r.dag_id = d.dag_id AND r.state = 'failed') AS failed_runs,
       d.max_attempts
  FROM {{ns}}.dag d
  JOIN {{ns}}.dag_lock l ON l.dag_id = d.dag_id
  LEFT JOIN (SELECT r.dag_id,
                    COUNT(CASE WHEN r.state = 'running' THEN 1 END) AS running_runs,
                    MIN(r.lease_until) AS oldest_lease_until,
                    COUNT(CASE WHEN r.state = 'running' AND r.lease_until < UTC_TIMESTAMP(6)
                               THEN 1 END) AS expired_leases,
                    COUNT(CASE WHEN r.attempt > CASE r.state WHEN 'running' THEN 1 ELSE 0 END
                               THEN 1 END) AS retrying_runs
               FROM {{ns}}.dag_run r
              WHERE r.state IN ('queued', 'running')
              GROUP BY r.dag_id) w
    ON w.dag_id = d.dag_id
  LEFT JOIN (SELECT q.target_dag_id,
                    COUNT(*) AS queued_events,
                    MIN(q.created_at) AS oldest_queued_at
               FROM {{ns}}.asset_dag_run_queue q
              GROUP BY q.target_dag_id) q
    ON q.target_dag_id = d.dag_id;


DELIMITER $$

-- Retention, step 1: deletes at most p_batch_size runs created before p_older_than, oldest
-- first, with their links (ON DELETE CASCADE). Returns one result set (deleted). Run each
-- batch at READ COMMITTED in a short transaction of its own (assetq.purge does). A run locked
-- by someone else is skipped, not waited for (SKIP LOCKED), and left for a later batch.
-- Only finished runs (success, failed) are deleted (migration 0006_work_queue): a queued or
-- running run may still be worked on, and its worker would find it gone.
-- The links go by hand, just before their runs (no foreign keys on the link table since
-- 0012_link_checks): those of the runs locked, by key. Nobody adds a link to a run it finds:
-- links are written only in the pass that creates their run, in the same transaction, and
-- the candidates are committed, finished runs.
DROP PROCEDURE IF EXISTS {{ns}}.purge_runs $$
CREATE PROCEDURE {{ns}}.purge_runs(IN p_older_than DATETIME(6), IN p_batch_size INT)
MODIFIES SQL DATA
BEGIN
    DECLARE v_deleted  BIGINT;
    DECLARE v_want     BIGINT;
    DECLARE v_read     BIGINT;
    DECLARE v_locked   BIGINT;
    DECLARE v_after_ts DATETIME(6) DEFAULT NULL;
    DECLARE v_after_id BIGINT DEFAULT 0;
    DECLARE v_message  VARCHAR(128) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin;
    IF p_older_than IS NULL OR p_batch_size IS NULL OR p_batch_size < 1 THEN
        SET v_message = '[AQ002] purge_runs needs a cutoff and a positive batch size';
        SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = v_message;
    END IF;
    DROP TEMPORARY TABLE IF EXISTS {{ns}}._assetq_purge_candidate, {{ns}}._assetq_purge;
    CREATE TEMPORARY TABLE {{ns}}._assetq_purge_candidate (
        pos        BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY,
        id         BIGINT NOT NULL,
        created_at DATETIME(6) NOT NULL
    ) ENGINE = InnoDB;
    CREATE TEMPORARY TABLE {{ns}}._assetq_purge (
        id BIGINT NOT NULL PRIMARY KEY
    ) ENGINE = InnoDB;
    -- The batch: finished runs by a plain read in (created_at, id) order, then locked by key
    -- and tested again as locked (a run may have been retried meanwhile), SKIP LOCKED; the
    -- next ones after those another purge holds, until the batch is full or none is left.
    -- Not one locking read by age, as on PostgreSQL: MySQL 8 / MariaDB: a locking read
    -- through an index keeps the rows its WHERE refused locked too, to the end of the batch
    -- (see claim_runs), and the workers of the active runs it passed over would wait.
    SET v_want = p_batch_size;
    fill_loop: LOOP
        DELETE FROM {{ns}}._assetq_purge_candidate;
        INSERT INTO {{ns}}._assetq_purge_candidate (id, created_at)
        SELECT r.id, r.created_at
          FROM {{ns}}.dag_run r FORCE INDEX (dag_run_created_idx)
         WHERE r.created_at < p_older_than
           AND (v_after_ts IS NULL OR r.created_at > v_after_ts
                OR (r.created_at = v_after_ts AND r.id > v_after_id))
           AND r.state IN ('success', 'failed')
         ORDER BY r.created_at, r.id
         LIMIT v_want;
        SET v_read = ROW_COUNT();
        IF v_read = 0 THEN
            LEAVE fill_loop;
        END IF;
        INSERT INTO {{ns}}._assetq_purge (id)
        SELECT r.id
          FROM {{ns}}._assetq_purge_candidate c FORCE INDEX (PRIMARY)
          STRAIGHT_JOIN {{ns}}.dag_run r FORCE INDEX (PRIMARY) ON r.id = c.id
         WHERE r.state IN ('success', 'failed')
           FOR UPDATE SKIP LOCKED;
        SET v_locked = ROW_COUNT();
        IF v_locked = v_read OR v_read < v_want THEN
            LEAVE fill_loop;
        END IF;
        SET v_want = v_want - v_locked;
        SELECT c.created_at, c.id INTO v_after_ts, v_after_id
          FROM {{ns}}._assetq_purge_candidate c ORDER BY c.pos DESC LIMIT 1;
    END LOOP;
    -- By key. MySQL 8 / MariaDB: a DELETE cannot read its own table in a subquery.
    SELECT COUNT(*) INTO v_deleted FROM {{ns}}._assetq_purge;
    DELETE l
      FROM {{ns}}._assetq_purge k
      STRAIGHT_JOIN {{ns}}.dagrun_asset_event l FORCE INDEX (PRIMARY) ON l.dag_run_id = k.id;
    DELETE r
      FROM {{ns}}._assetq_purge k
      STRAIGHT_JOIN {{ns}}.dag_run r FORCE INDEX (PRIMARY) ON r.id = k.id;
    DROP TEMPORARY TABLE IF EXISTS {{ns}}._assetq_purge_candidate, {{ns}}._assetq_purge;
    SELECT v_deleted AS deleted;
END $$


-- Retention, step 2: examines the next p_batch_size events whose timestamp is before
-- p_older_than, in (timestamp, id) order after the cursor (p_after_timestamp, p_after_id;
-- NULL: from the start), and deletes those that are consumed: no queue row (nobody still
-- waits for them) and no link (the runs that consumed them were purged, or there were none).
-- Returns one result set (deleted, examined, last_timestamp, last_id): the cursor for the
-- next batch; fewer examined than p_batch_size means the end. The cursor moves past events
-- it keeps, so a long-queued event is examined once per purge, not once per batch.
--
-- Never deletes a queued event: the test below (the queue has no foreign key to asset_event
-- since 0013_queue_checks). An event's queue rows are written by the statement that inserts
-- it and commit with it, so the test's snapshot, which sees the event, sees all of them that
-- are left, and none is added later (the comment in the body on the foreign key refusing
-- a DELETE (1451) predates 0013, which kept the body as it was). Run it at READ COMMITTED (assetq.purge does): the window and
-- the test are plain reads (INSERT ... SELECT reads without locks at READ COMMITTED); only
-- the events that passed the test are then locked, SKIP LOCKED, so the batch never waits
-- for a producer or a scheduler and never locks an event a scheduler is consuming
-- (tests/test_purge.py holds a batch open and runs both meanwhile).
-- Since 0012_link_checks the link table has no foreign keys: a pass takes no lock on an event
-- it links, but it links only the events of queue rows it deletes, and the test's one
-- snapshot saw no queue row of the event (a pass still open holds its deleted rows, which
-- the snapshot still sees; a committed one wrote its links in the same commit); queue rows
-- are written only with their event. So no link can come to an event the test passed.
DROP PROCEDURE IF EXISTS {{ns}}.purge_events $$
CREATE PROCEDURE {{ns}}.purge_events(
    IN p_older_than      DATETIME(6),
    IN p_batch_size      INT,
    IN p_after_timestamp DATETIME(6),
    IN p_after_id        BIGINT
)
MODIFIES SQL DATA
BEGIN
    DECLARE v_after_ts   DATETIME(6) DEFAULT COALESCE(p_after_timestamp, '1000-01-01 00:00:00');
    DECLARE v_after_id   BIGINT DEFAULT COALESCE(p_after_id, 0);
    DECLARE v_examined   BIGINT;
    DECLARE v_deleted    BIGINT DEFAULT 0;
    DECLARE v_last_ts    DATETIME(6) DEFAULT p_after_timestamp;
    DECLARE v_last_id    BIGINT DEFAULT p_after_id;
    DECLARE v_message    VARCHAR(128) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin;
    IF p_older_than IS NULL OR p_batch_size IS NULL OR p_batch_size < 1 THEN
        SET v_message = '[AQ002] purge_events needs a cutoff and a positive batch size';
        SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = v_message;
    END IF;
    DROP TEMPORARY TABLE IF EXISTS {{ns}}._assetq_purge_window, {{ns}}._assetq_purge_candidate,
                                   {{ns}}._assetq_purge;
    CREATE TEMPORARY TABLE {{ns}}._assetq_purge_window (
        id BIGINT NOT NULL PRIMARY KEY,
        ts DATETIME(6) NOT NULL
    ) ENGINE = InnoDB;
    CREATE TEMPORARY TABLE {{ns}}._assetq_purge_candidate (
        id BIGINT NOT NULL PRIMARY KEY
    ) ENGINE = InnoDB;
    CREATE TEMPORARY TABLE {{ns}}._assetq_purge (
        id BIGINT NOT NULL PRIMARY KEY
    ) ENGINE = InnoDB;

    -- The window. MySQL 8 / MariaDB: the row comparison (a, b) > (x, y) is spelled out, the
    -- form both optimizers turn into a range of the (timestamp, id) index.
    INSERT INTO {{ns}}._assetq_purge_window (id, ts)
    SELECT e.id, e.`timestamp`
      FROM {{ns}}.asset_event e
     WHERE e.`timestamp` < p_older_than
       AND (e.`timestamp` > v_after_ts OR (e.`timestamp` = v_after_ts AND e.id > v_after_id))
     ORDER BY e.`timestamp`, e.id
     LIMIT p_batch_size;
    SELECT COUNT(*) INTO v_examined FROM {{ns}}._assetq_purge_window;

    IF v_examined > 0 THEN
        SELECT w.ts, w.id INTO v_last_ts, v_last_id
          FROM {{ns}}._assetq_purge_window w ORDER BY w.ts DESC, w.id DESC LIMIT 1;
        INSERT INTO {{ns}}._assetq_purge_candidate (id)
        SELECT w.id
          FROM {{ns}}._assetq_purge_window w
         WHERE NOT EXISTS (SELECT 1 FROM {{ns}}.asset_dag_run_queue q
                            WHERE q.asset_event_id = w.id)
           AND NOT EXISTS (SELECT 1 FROM {{ns}}.dagrun_asset_event l
                            WHERE l.asset_event_id = w.id);
        INSERT INTO {{ns}}._assetq_purge (id)
        SELECT e.id
          FROM {{ns}}._assetq_purge_candidate c
          STRAIGHT_JOIN {{ns}}.asset_event e ON e.id = c.id
           FOR UPDATE SKIP LOCKED;
        -- By key, without testing again: a DELETE reads other tables with locking reads,
        -- and the test would wait on every producer's uncommitted queue row it scans. No
        -- test is needed: while we hold an event, nobody can make a row refer to it (that
        -- takes a shared lock on it), and before, only a raw INSERT could have (queue rows
        -- are written with their event, links with the deletion of the queue row, both
        -- seen by the one snapshot of the test). Such a queue row makes the foreign key
        -- refuse the DELETE (1451): the batch rolls back and its retry keeps the event.
        DELETE e
          FROM {{ns}}._assetq_purge k
          STRAIGHT_JOIN {{ns}}.asset_event e ON e.id = k.id;
        SET v_deleted = ROW_COUNT();
    END IF;
    DROP TEMPORARY TABLE IF EXISTS {{ns}}._assetq_purge_window, {{ns}}._assetq_purge_candidate,
                                   {{ns}}._assetq_purge;
    SELECT v_deleted AS deleted, v_examined AS examined,
           v_last_ts AS last_timestamp, v_last_id AS last_id;
END $$


-- Least privilege. Four kinds of access, granted to existing accounts by grant_access:
--   producer   EXECUTE on register_event and register_events: can register events only;
--   scheduler  EXECUTE on schedule_pass, set_run_state and retry_run: can run scheduler
--              passes, move the runs they created through their states and retry failed
--              runs, nothing else;
--   worker     EXECUTE on claim_runs, heartbeat_run and complete_run (migration
--              0006_work_queue): can claim runs, renew their leases and complete them, with
--              their output events, nothing else;
--   reader     SELECT on the namespace: can read every table and view, never write.
-- Schedulers and workers may also record that they are alive (process_heartbeat and
-- process_gone, migration 0010_liveness); producers and readers may not.
-- Every kind also gets SELECT on the version table (assetq checks the installed revision).
-- Producers, schedulers and workers get no right on any table: the routines run with their
-- definer's rights (SQL SECURITY DEFINER, MySQL's default, which doctor checks), so the
-- definer must be an account that exists and may write the namespace: grant_access refuses
-- otherwise, since every call would fail (error 1449 for a missing definer).
--
-- grant_access runs with the caller's rights (SQL SECURITY INVOKER): only an account that
-- may grant these privileges can use it, and it must be able to read mysql.user. p_host is
-- the account's host (NULL: '%'). Idempotent. AQ002 for an unknown kind or account.
-- MySQL 8 / MariaDB: GRANT never creates the account here: MariaDB would create a missing
-- one without a password unless sql_mode has NO_AUTO_CREATE_USER, a mode MySQL 8 no longer
-- knows, hence the explicit check.
DROP PROCEDURE IF EXISTS {{ns}}.grant_access $$
CREATE PROCEDURE {{ns}}.grant_access(
    IN p_access  TEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin,
    IN p_grantee TEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin,
    IN p_host    TEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin
)
MODIFIES SQL DATA
SQL SECURITY INVOKER
BEGIN
    DECLARE v_host    TEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin DEFAULT COALESCE(p_host, '%');
    DECLARE v_account TEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin;
    DECLARE v_ns      TEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin;
    DECLARE v_definer TEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin;
    DECLARE v_found   BIGINT;
    DECLARE v_message VARCHAR(128) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin;

    IF p_access IS NULL OR p_access NOT IN ('producer', 'scheduler', 'worker', 'reader') THEN
        SET v_message = LEFT(CONCAT('[AQ002] unknown access ', COALESCE(QUOTE(LEFT(p_access, 40)), 'NULL'),
                                    ': use producer, scheduler, worker or reader'), 128);
        SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = v_message;
    END IF;
    SELECT COUNT(*) INTO v_found FROM mysql.user u WHERE u.User = p_grantee AND u.Host = v_host;
    IF v_found = 0 THEN
        SET v_message = LEFT(CONCAT('[AQ002] account ', COALESCE(QUOTE(LEFT(p_grantee, 40)), 'NULL'), '@',
                                    QUOTE(LEFT(v_host, 40)), ' does not exist: CREATE USER it first'), 128);
        SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = v_message;
    END IF;
    -- The definer of the granted routines (all created by one installer).
    SELECT MIN(r.DEFINER) INTO v_definer
      FROM information_schema.ROUTINES r
     WHERE r.ROUTINE_SCHEMA = DATABASE()
       AND r.ROUTINE_NAME IN ('register_event', 'register_events', 'schedule_pass', 'set_run_state',
                              'retry_run', 'claim_runs', 'heartbeat_run', 'complete_run');
    SELECT COUNT(*) INTO v_found
      FROM mysql.user u
     WHERE CONCAT(u.User, '@', u.Host) = v_definer;
    IF v_found = 0 THEN
        SET v_message = LEFT(CONCAT('[AQ002] the routines'' definer ', COALESCE(v_definer, 'NULL'),
                                    ' does not exist: every call would fail; reinstall as an existing account'), 128);
        SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = v_message;
    END IF;

    SET v_account = CONCAT(QUOTE(p_grantee), '@', QUOTE(v_host));
    SET v_ns = CONCAT('`', DATABASE(), '`');
    SET @assetq_grant = CONCAT('GRANT SELECT ON ', v_ns, '.assetq_alembic_version TO ', v_account);
    PREPARE assetq_grant FROM @assetq_grant;
    EXECUTE assetq_grant;
    IF p_access = 'producer' THEN
        SET @assetq_grant = CONCAT('GRANT EXECUTE ON PROCEDURE ', v_ns, '.register_event TO ', v_account);
        PREPARE assetq_grant FROM @assetq_grant;
        EXECUTE assetq_grant;
        SET @assetq_grant = CONCAT('GRANT EXECUTE ON PROCEDURE ', v_ns, '.register_events TO ', v_account);
        PREPARE assetq_grant FROM @assetq_grant;
        EXECUTE assetq_grant;
    ELSEIF p_access = 'scheduler' THEN
        SET @assetq_grant = CONCAT('GRANT EXECUTE ON PROCEDURE ', v_ns, '.schedule_pass TO ', v_account);
        PREPARE assetq_grant FROM @assetq_grant;
        EXECUTE assetq_grant;
        SET @assetq_grant = CONCAT('GRANT EXECUTE ON PROCEDURE ', v_ns, '.set_run_state TO ', v_account);
        PREPARE assetq_grant FROM @assetq_grant;
        EXECUTE assetq_grant;
        SET @assetq_grant = CONCAT('GRANT EXECUTE ON PROCEDURE ', v_ns, '.retry_run TO ', v_account);
        PREPARE assetq_grant FROM @assetq_grant;
        EXECUTE assetq_grant;
    ELSEIF p_access = 'worker' THEN
        SET @assetq_grant = CONCAT('GRANT EXECUTE ON PROCEDURE ', v_ns, '.claim_runs TO ', v_account);
        PREPARE assetq_grant FROM @assetq_grant;
        EXECUTE assetq_grant;
        SET @assetq_grant = CONCAT('GRANT EXECUTE ON PROCEDURE ', v_ns, '.heartbeat_run TO ', v_account);
        PREPARE assetq_grant FROM @assetq_grant;
        EXECUTE assetq_grant;
        SET @assetq_grant = CONCAT('GRANT EXECUTE ON PROCEDURE ', v_ns, '.complete_run TO ', v_account);
        PREPARE assetq_grant FROM @assetq_grant;
        EXECUTE assetq_grant;
    ELSE
        SET @assetq_grant = CONCAT('GRANT SELECT ON ', v_ns, '.* TO ', v_account);
        PREPARE assetq_grant FROM @assetq_grant;
        EXECUTE assetq_grant;
    END IF;
    -- Schedulers and workers record that they are alive (migration 0010_liveness).
    IF p_access IN ('scheduler', 'worker') THEN
        SET @assetq_grant = CONCAT('GRANT EXECUTE ON PROCEDURE ', v_ns, '.process_heartbeat TO ', v_account);
        PREPARE assetq_grant FROM @assetq_grant;
        EXECUTE assetq_grant;
        SET @assetq_grant = CONCAT('GRANT EXECUTE ON PROCEDURE ', v_ns, '.process_gone TO ', v_account);
        PREPARE assetq_grant FROM @assetq_grant;
        EXECUTE assetq_grant;
    END IF;
    DEALLOCATE PREPARE assetq_grant;
END $$


-- Takes every kind of access grant_access gave the account away again. Idempotent: a
-- privilege the account does not hold is skipped (errors 1141, 1147, 1403: no such grant).
DROP PROCEDURE IF EXISTS {{ns}}.revoke_access $$
CREATE PROCEDURE {{ns}}.revoke_access(
    IN p_grantee TEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin,
    IN p_host    TEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin
)
MODIFIES SQL DATA
SQL SECURITY INVOKER
BEGIN
    DECLARE v_host    TEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin DEFAULT COALESCE(p_host, '%');
    DECLARE v_account TEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin;
    DECLARE v_ns      TEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin;
    DECLARE v_found   BIGINT;
    DECLARE v_message VARCHAR(128) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin;
    DECLARE CONTINUE HANDLER FOR 1141, 1147, 1403 BEGIN END;

    SELECT COUNT(*) INTO v_found FROM mysql.user u WHERE u.User = p_grantee AND u.Host = v_host;
    IF v_found = 0 THEN
        SET v_message = LEFT(CONCAT('[AQ002] account ', COALESCE(QUOTE(LEFT(p_grantee, 40)), 'NULL'), '@',
                                    QUOTE(LEFT(v_host, 40)), ' does not exist'), 128);
        SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = v_message;
    END IF;
    SET v_account = CONCAT(QUOTE(p_grantee), '@', QUOTE(v_host));
    SET v_ns = CONCAT('`', DATABASE(), '`');
    SET @assetq_grant = CONCAT('REVOKE EXECUTE ON PROCEDURE ', v_ns, '.register_event FROM ', v_account);
    PREPARE assetq_grant FROM @assetq_grant;
    EXECUTE assetq_grant;
    SET @assetq_grant = CONCAT('REVOKE EXECUTE ON PROCEDURE ', v_ns, '.register_events FROM ', v_account);
    PREPARE assetq_grant FROM @assetq_grant;
    EXECUTE assetq_grant;
    SET @assetq_grant = CONCAT('REVOKE EXECUTE ON PROCEDURE ', v_ns, '.schedule_pass FROM ', v_account);
    PREPARE assetq_grant FROM @assetq_grant;
    EXECUTE assetq_grant;
    SET @assetq_grant = CONCAT('REVOKE EXECUTE ON PROCEDURE ', v_ns, '.set_run_state FROM ', v_account);
    PREPARE assetq_grant FROM @assetq_grant;
    EXECUTE assetq_grant;
    SET @assetq_grant = CONCAT('REVOKE EXECUTE ON PROCEDURE ', v_ns, '.retry_run FROM ', v_account);
    PREPARE assetq_grant FROM @assetq_grant;
    EXECUTE assetq_grant;
    SET @assetq_grant = CONCAT('REVOKE EXECUTE ON PROCEDURE ', v_ns, '.claim_runs FROM ', v_account);
    PREPARE assetq_grant FROM @assetq_grant;
    EXECUTE assetq_grant;
    SET @assetq_grant = CONCAT('REVOKE EXECUTE ON PROCEDURE ', v_ns, '.heartbeat_run FROM ', v_account);
    PREPARE assetq_grant FROM @assetq_grant;
    EXECUTE assetq_grant;
    SET @assetq_grant = CONCAT('REVOKE EXECUTE ON PROCEDURE ', v_ns, '.complete_run FROM ', v_account);
    PREPARE assetq_grant FROM @assetq_grant;
    EXECUTE assetq_grant;
    SET @assetq_grant = CONCAT('REVOKE EXECUTE ON PROCEDURE ', v_ns, '.process_heartbeat FROM ', v_account);
    PREPARE assetq_grant FROM @assetq_grant;
    EXECUTE assetq_grant;
    SET @assetq_grant = CONCAT('REVOKE EXECUTE ON PROCEDURE ', v_ns, '.process_gone FROM ', v_account);
    PREPARE assetq_grant FROM @assetq_grant;
    EXECUTE assetq_grant;
    SET @assetq_grant = CONCAT('REVOKE SELECT ON ', v_ns, '.* FROM ', v_account);
    PREPARE assetq_grant FROM @assetq_grant;
    EXECUTE assetq_grant;
    SET @assetq_grant = CONCAT('REVOKE SELECT ON ', v_ns, '.assetq_alembic_version FROM ', v_account);
    PREPARE assetq_grant FROM @assetq_grant;
    EXECUTE assetq_grant;
    DEALLOCATE PREPARE assetq_grant;
END $$

DELIMITER ;

SET SESSION sql_mode = @assetq_saved_sql_mode;


-- Runs as work (migration 0006_work_queue): claim_runs, heartbeat_run, complete_run, retry_run.

SET @assetq_saved_sql_mode = @@SESSION.sql_mode,
    SESSION sql_mode = 'STRICT_TRANS_TABLES,STRICT_ALL_TABLES,NO_ZERO_IN_DATE,NO_ZERO_DATE,ERROR_FOR_DIVISION_BY_ZERO,NO_ENGINE_SUBSTITUTION';

DELIMITER $$

-- Workers (migration 0006_work_queue): a run is work that exactly one worker holds at a time.
-- docs/workers.md explains the protocol from the user's side.
--
-- A run's attempt counts its claims. not_before is when the run may next be claimed: for a
-- queued run when it was created (or when its retry is due), for a running one the end of
-- its lease (then another worker may claim it, as a new attempt), NULL for a finished run or
-- one moved by hand (set_run_state), which no worker claims. One index on it serves every
-- claim: MySQL has no partial index, but a range "not_before <= now" starts after the NULLs,
-- so a claim reads what it takes, never the finished history. Every call after a claim names
-- the claim's attempt and is refused (AQ010, lease lost) unless the run is still running at
-- that attempt (I8): a worker whose lease expired may still finish while nobody has claimed
-- the run again, never after.
--
-- None of these routines locks a dag row: every producer in flight holds a shared lock on its
-- consumers' dag rows (the fan-out's read), and MySQL has no NO
-- KEY lock mode. They read the consumer's options with plain reads.

-- Claims at most p_limit runs for worker p_worker (oldest not_before first; within the
-- consumers p_dag_ids, a JSON array, or all when NULL) and returns them as one result set
-- (dag_run_id, dag_id, run_id, seq, run_after, created_at, event_ids as a JSON array,
-- triggering_event_id, state, attempt, worker, lease_until, started_at), running, with a
-- lease of p_lease_seconds on the database's clock. Run it in a short transaction of its own
-- at READ COMMITTED (assetq.claim_runs does): there the plain reads below lock nothing and see
-- what is committed. A running run whose lease expired on its last attempt is failed here
-- instead of claimed (I10), and the search goes on for the limit. AQ002 for bad arguments.
--
-- The search runs in two steps, repeated until the limit is reached or no candidate is
-- left: a plain read of the next candidates in not_before order, through the claim index
-- (with the consumer filter), then one statement that locks them by primary key, in that
-- order, FOR UPDATE SKIP LOCKED, up to the limit, testing each again as locked (another
-- claimer may have taken it and committed meanwhile). Concurrent claimers take different
-- runs and never wait for each other; a row locked by a pass or a completion is simply not
-- taken now. Not one locking statement over the claim index, as on PostgreSQL: MySQL 8 /
-- MariaDB: a locking read through a secondary index keeps every row it read locked to the
-- end of the transaction, even at READ COMMITTED and also the rows its WHERE then refused,
-- so a claim for some consumers would hold the older runs of every other consumer it passed,
-- and their workers would skip them. Rows read by primary key and refused are unlocked at
-- once (tests/test_mysql_facts.py). FORCE INDEX keeps both steps in that order: a plan that
-- sorted would lock every candidate before the sort. Every join from a temporary table into
-- dag_run forces its primary key too: on a small table the optimizer would rather scan
-- dag_run through a join buffer, and an UPDATE or a locking read that scans locks every run,
-- those other workers hold included (it would wait for them). MariaDB has no FOR UPDATE OF,
-- and the locking statement reads dag_run alone: a join with dag would lock the dag rows too,
-- and skip the runs of every consumer a producer is registering for.
DROP PROCEDURE IF EXISTS {{ns}}.claim_runs $$
CREATE PROCEDURE {{ns}}.claim_runs(
    IN p_worker        TEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin,
    IN p_limit         INT,
    IN p_lease_seconds DOUBLE,
    IN p_dag_ids       JSON
)
MODIFIES SQL DATA
BEGIN
    DECLARE v_now       DATETIME(6);
    DECLARE v_until     DATETIME(6);
    DECLARE v_want      INT;
    DECLARE v_batch     INT;
    DECLARE v_read      BIGINT;
    DECLARE v_pos       BIGINT DEFAULT 0;
    DECLARE v_last_pos  BIGINT DEFAULT 0;
    DECLARE v_after_nb  DATETIME(6) DEFAULT NULL;
    DECLARE v_after_id  BIGINT DEFAULT 0;
    DECLARE v_taken     INT DEFAULT 0;
    DECLARE v_locked    BIGINT;
    DECLARE v_expired   BIGINT;
    DECLARE v_failed    BIGINT;
    DECLARE v_bad       BIGINT DEFAULT 0;
    DECLARE v_kind      VARCHAR(32) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin;
    DECLARE v_message   VARCHAR(128) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin;
    DECLARE v_saved_gcl BIGINT UNSIGNED DEFAULT @@SESSION.group_concat_max_len;

    IF p_worker IS NULL OR CHAR_LENGTH(p_worker) = 0 OR CHAR_LENGTH(p_worker) > 250 THEN
        SET v_message = LEFT(CONCAT('[AQ002] worker must be a name of 1 to 250 characters, got ',
                                    COALESCE(QUOTE(LEFT(p_worker, 60)), 'NULL')), 128);
        SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = v_message;
    END IF;
    IF p_limit IS NULL OR p_limit < 1 OR p_limit > 1000 THEN
        SET v_message = CONCAT('[AQ002] limit must be 1 to 1000, got ', COALESCE(p_limit, 'NULL'));
        SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = v_message;
    END IF;
    IF p_lease_seconds IS NULL OR NOT (p_lease_seconds > 0 AND p_lease_seconds <= 604800) THEN
        SET v_message = LEFT(CONCAT('[AQ002] lease must be above 0 and at most 604800 seconds, got ',
                                    COALESCE(p_lease_seconds, 'NULL')), 128);
        SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = v_message;
    END IF;
    -- IFs, not one condition: MariaDB may evaluate JSON_TYPE of invalid text and fail
    -- (see register_events).
    IF p_dag_ids IS NOT NULL THEN
        SET v_kind = 'invalid JSON';
        IF JSON_VALID(p_dag_ids) THEN
            SET v_kind = JSON_TYPE(p_dag_ids);
        END IF;
        IF v_kind = 'ARRAY' THEN
            SELECT COUNT(*) INTO v_bad
              FROM JSON_TABLE(p_dag_ids, '$[*]' COLUMNS (item JSON PATH '$')) AS j
             WHERE COALESCE(JSON_TYPE(j.item), 'NULL') <> 'STRING';
        END IF;
        IF v_kind <> 'ARRAY' OR v_bad > 0 THEN
            SET v_message = '[AQ002] dag_ids must be a JSON array of dag ids or NULL';
            SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = v_message;
        END IF;
    END IF;
    SET v_now = UTC_TIMESTAMP(6);
    SET v_until = v_now + INTERVAL CAST(ROUND(p_lease_seconds * 1000000) AS SIGNED) MICROSECOND;

    -- Session temporary tables (a failed call's are dropped by the next):
    --   _assetq_claim_candidate  the candidates of the current batch, in claim order
    --   _assetq_claim_lock       the runs one round locked, with what the expired-lease test
    --                            needs, read from the rows as locked
    --   _assetq_claim_cap        max_attempts of the consumers of those expired leases
    --   _assetq_claimed          the runs claimed, as returned
    DROP TEMPORARY TABLE IF EXISTS {{ns}}._assetq_claim_candidate, {{ns}}._assetq_claim_lock,
                                   {{ns}}._assetq_claim_cap, {{ns}}._assetq_claimed;
    CREATE TEMPORARY TABLE {{ns}}._assetq_claim_candidate (
        pos        BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY,
        id         BIGINT NOT NULL,
        not_before DATETIME(6) NOT NULL
    ) ENGINE = InnoDB;
    CREATE TEMPORARY TABLE {{ns}}._assetq_claim_lock (
        id           BIGINT NOT NULL PRIMARY KEY,
        pos          BIGINT NOT NULL,
        dag_id       VARCHAR(250) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
        state        VARCHAR(20) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
        attempt      INT NOT NULL,
        worker       VARCHAR(250) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL,
        lease_until  DATETIME(6) NULL,
        max_attempts INT NULL,
        fail         BOOLEAN NOT NULL DEFAULT FALSE
    ) ENGINE = InnoDB;
    CREATE TEMPORARY TABLE {{ns}}._assetq_claim_cap (
        dag_id       VARCHAR(250) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL PRIMARY KEY,
        max_attempts INT NOT NULL
    ) ENGINE = InnoDB;
    CREATE TEMPORARY TABLE {{ns}}._assetq_claimed (
        dag_run_id          BIGINT NOT NULL PRIMARY KEY,
        dag_id              VARCHAR(250) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
        run_id              VARCHAR(250) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
        seq                 BIGINT NOT NULL,
        run_after           DATETIME(6) NOT NULL,
        created_at          DATETIME(6) NOT NULL,
        event_ids           LONGTEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
        links               BIGINT NOT NULL,
        triggering_event_id BIGINT NULL,
        state               VARCHAR(20) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
        attempt             INT NOT NULL,
        worker              VARCHAR(250) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL,
        lease_until         DATETIME(6) NULL,
        started_at          DATETIME(6) NULL,
        partition_key       VARCHAR(250) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL
    ) ENGINE = InnoDB;

    -- The event ids of each claimed run, as JSON text: GROUP_CONCAT is cut silently at
    -- group_concat_max_len, raised for this call (as in schedule_pass) and checked below.
    SET SESSION group_concat_max_len = 1073741824;
    search_loop: WHILE v_taken < p_limit DO
        SET v_want = p_limit - v_taken;
        -- The next batch of candidates once this one is used up: a plain read, after the
        -- last candidate of the previous batch ((not_before, id) spelled out, the form both
        -- optimizers turn into a range of the index). Some spare ones for the runs other
        -- claimers hold.
        IF v_pos >= v_last_pos THEN
            SET v_batch = LEAST(2 * v_want + 16, 2000);
            DELETE FROM {{ns}}._assetq_claim_candidate;
            INSERT INTO {{ns}}._assetq_claim_candidate (id, not_before)
            SELECT r.id, r.not_before
              FROM {{ns}}.dag_run r FORCE INDEX (dag_run_claim_idx)
             WHERE r.not_before <= v_now
               AND (v_after_nb IS NULL OR r.not_before > v_after_nb
                    OR (r.not_before = v_after_nb AND r.id > v_after_id))
               AND (p_dag_ids IS NULL OR JSON_CONTAINS(p_dag_ids, JSON_QUOTE(r.dag_id)))
             ORDER BY r.not_before, r.id
             LIMIT v_batch;
            SET v_read = ROW_COUNT();
            IF v_read = 0 THEN
                LEAVE search_loop;
            END IF;
            -- Every new position is above v_pos (the last of the previous batch): a DELETE
            -- does not reset AUTO_INCREMENT.
            SELECT c.pos, c.not_before, c.id INTO v_last_pos, v_after_nb, v_after_id
              FROM {{ns}}._assetq_claim_candidate c ORDER BY c.pos DESC LIMIT 1;
        END IF;

        -- Lock the next candidates, by key, as they are now.
        DELETE FROM {{ns}}._assetq_claim_lock;
        INSERT INTO {{ns}}._assetq_claim_lock (id, pos, dag_id, state, attempt, worker, lease_until)
        SELECT r.id, c.pos, r.dag_id, r.state, r.attempt, r.worker, r.lease_until
          FROM {{ns}}._assetq_claim_candidate c FORCE INDEX (PRIMARY)
          STRAIGHT_JOIN {{ns}}.dag_run r FORCE INDEX (PRIMARY) ON r.id = c.id
         WHERE c.pos > v_pos AND r.not_before <= v_now
         ORDER BY c.pos
         LIMIT v_want
           FOR UPDATE SKIP LOCKED;
        SET v_locked = ROW_COUNT();
        SET v_failed = 0;
        IF v_locked > 0 THEN
            -- Expired leases on their last attempt: failed, not claimed. The consumers'
            -- options by a plain read (INSERT ... SELECT reads without locks at READ
            -- COMMITTED; an UPDATE joined with dag would wait for a declare_dag in flight).
            SELECT COUNT(*) INTO v_expired FROM {{ns}}._assetq_claim_lock k WHERE k.state = 'running';
            IF v_expired > 0 THEN
                DELETE FROM {{ns}}._assetq_claim_cap;
                INSERT INTO {{ns}}._assetq_claim_cap (dag_id, max_attempts)
                SELECT d.dag_id, d.max_attempts
                  FROM {{ns}}.dag d
                 WHERE d.dag_id IN (SELECT k.dag_id FROM {{ns}}._assetq_claim_lock k
                                     WHERE k.state = 'running');
                UPDATE {{ns}}._assetq_claim_lock k
                  STRAIGHT_JOIN {{ns}}._assetq_claim_cap c ON c.dag_id = k.dag_id
                   SET k.max_attempts = c.max_attempts,
                       k.fail = (k.state = 'running' AND k.attempt >= c.max_attempts);
                SELECT COUNT(*) INTO v_failed FROM {{ns}}._assetq_claim_lock k WHERE k.fail;
                IF v_failed > 0 THEN
                    UPDATE {{ns}}._assetq_claim_lock k
                      STRAIGHT_JOIN {{ns}}.dag_run r FORCE INDEX (PRIMARY) ON r.id = k.id
                       SET r.state = 'failed', r.ended_at = v_now, r.updated_at = v_now,
                           r.not_before = NULL, r.lease_until = NULL,
                           r.error = CONCAT('the lease of attempt ', k.attempt, ' (worker ',
                                            COALESCE(k.worker, ''), ') expired at ',
                                            COALESCE(DATE_FORMAT(k.lease_until, '%Y-%m-%d %H:%i:%s.%f'), ''),
                                            '+00 and no attempt is left (max_attempts ',
                                            k.max_attempts, ')')
                     WHERE k.fail;
                END IF;
            END IF;

            -- The claim: a new attempt, held until v_until.
            UPDATE {{ns}}._assetq_claim_lock k
              STRAIGHT_JOIN {{ns}}.dag_run r FORCE INDEX (PRIMARY) ON r.id = k.id
               SET r.state = 'running', r.attempt = r.attempt + 1, r.worker = p_worker,
                   r.lease_until = v_until, r.not_before = v_until, r.started_at = v_now,
                   r.updated_at = v_now
             WHERE NOT k.fail;
            INSERT INTO {{ns}}._assetq_claimed
                   (dag_run_id, dag_id, run_id, seq, run_after, created_at, event_ids, links,
                    triggering_event_id, state, attempt, worker, lease_until, started_at,
                    partition_key)
            SELECT r.id, r.dag_id, r.run_id, r.seq, r.run_after, r.created_at,
                   (SELECT CONCAT('[', COALESCE(GROUP_CONCAT(l.asset_event_id ORDER BY l.asset_event_id
                                                             SEPARATOR ','), ''), ']')
                      FROM {{ns}}.dagrun_asset_event l WHERE l.dag_run_id = r.id),
                   (SELECT COUNT(*) FROM {{ns}}.dagrun_asset_event l WHERE l.dag_run_id = r.id),
                   r.triggering_event_id, r.state, r.attempt, r.worker, r.lease_until, r.started_at,
                   r.partition_key
              FROM {{ns}}._assetq_claim_lock k
              STRAIGHT_JOIN {{ns}}.dag_run r FORCE INDEX (PRIMARY) ON r.id = k.id
             WHERE NOT k.fail;
            SET v_taken = v_taken + ROW_COUNT();
        END IF;
        -- Where the next round goes on: after the whole batch, or, when the limit stopped the
        -- lock and failed runs left room, after the last candidate locked.
        IF v_locked < v_want THEN
            SET v_pos = v_last_pos;
        ELSEIF v_failed > 0 THEN
            SELECT MAX(k.pos) INTO v_pos FROM {{ns}}._assetq_claim_lock k;
        END IF;
    END WHILE search_loop;
    SET SESSION group_concat_max_len = v_saved_gcl;

    SELECT COUNT(*) INTO v_bad
      FROM {{ns}}._assetq_claimed c WHERE NOT (JSON_LENGTH(c.event_ids) <=> c.links);
    IF v_bad > 0 THEN
        SET v_message = '[AQ900] claim guard: the event ids of a claimed run were truncated';
        SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = v_message;
    END IF;
    SELECT c.dag_run_id, c.dag_id, c.run_id, c.seq, c.run_after, c.created_at, c.event_ids,
           c.triggering_event_id, c.state, c.attempt, c.worker, c.lease_until, c.started_at,
           c.partition_key
      FROM {{ns}}._assetq_claimed c
     ORDER BY c.dag_run_id;
    DROP TEMPORARY TABLE IF EXISTS {{ns}}._assetq_claim_candidate, {{ns}}._assetq_claim_lock,
                                   {{ns}}._assetq_claim_cap, {{ns}}._assetq_claimed;
END $$


-- Renews the lease of run p_run_id of consumer p_dag_id held at attempt p_attempt to
-- p_lease_seconds from now (database clock) and returns the new end as one result set
-- (lease_until). AQ010 (lease lost) when the run is no longer running at that attempt:
-- another worker claimed it after the lease expired, or it was finished; nothing is written.
-- AQ006 for an unknown run, AQ002 for a bad lease. Run it in a short transaction of its own
-- (assetq.heartbeat does).
DROP PROCEDURE IF EXISTS {{ns}}.heartbeat_run $$
CREATE PROCEDURE {{ns}}.heartbeat_run(
    IN p_dag_id        TEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin,
    IN p_run_id        TEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin,
    IN p_attempt       INT,
    IN p_lease_seconds DOUBLE
)
MODIFIES SQL DATA
BEGIN
    DECLARE v_id      BIGINT;
    DECLARE v_state   VARCHAR(20) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin;
    DECLARE v_attempt INT;
    DECLARE v_lease   DATETIME(6);
    DECLARE v_now     DATETIME(6);
    DECLARE v_until   DATETIME(6);
    DECLARE v_message VARCHAR(128) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin;

    IF p_lease_seconds IS NULL OR NOT (p_lease_seconds > 0 AND p_lease_seconds <= 604800) THEN
        SET v_message = LEFT(CONCAT('[AQ002] lease must be above 0 and at most 604800 seconds, got ',
                                    COALESCE(p_lease_seconds, 'NULL')), 128);
        SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = v_message;
    END IF;
    -- A locking read: it sees the run whatever the caller's snapshot, and holds it.
    SELECT r.id, r.state, r.attempt, r.lease_until INTO v_id, v_state, v_attempt, v_lease
      FROM {{ns}}.dag_run r
     WHERE r.dag_id = p_dag_id AND r.run_id = p_run_id
       FOR UPDATE;
    IF v_id IS NULL THEN
        SET v_message = LEFT(CONCAT('[AQ006] unknown run ', COALESCE(QUOTE(LEFT(p_run_id, 60)), 'NULL'),
                                    ' of dag ', COALESCE(QUOTE(LEFT(p_dag_id, 40)), 'NULL')), 128);
        SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = v_message;
    END IF;
    -- Held means running under a lease at this attempt: a run moved to running by hand
    -- (set_run_state) has none, and no claim of an earlier attempt holds it. The facts
    -- first, the names last: a message is cut at 128 characters.
    IF v_state <> 'running' OR NOT (v_attempt <=> p_attempt) OR v_lease IS NULL THEN
        SET v_message = LEFT(CONCAT('[AQ010] lease lost: the run is ', v_state,
                                    IF(v_state = 'running' AND v_lease IS NULL, ' with no lease', ''),
                                    ' at attempt ', v_attempt,
                                    ', not running at attempt ', COALESCE(p_attempt, 'NULL'),
                                    '; stop working on run ', QUOTE(LEFT(p_run_id, 60)),
                                    ' of dag ', QUOTE(LEFT(p_dag_id, 40))), 128);
        SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = v_message;
    END IF;
    SET v_now = UTC_TIMESTAMP(6);
    SET v_until = v_now + INTERVAL CAST(ROUND(p_lease_seconds * 1000000) AS SIGNED) MICROSECOND;
    UPDATE {{ns}}.dag_run
       SET lease_until = v_until, not_before = v_until, updated_at = v_now
     WHERE id = v_id;
    SELECT v_until AS lease_until;
END $$


-- Finishes attempt p_attempt of run p_run_id of consumer p_dag_id, in the caller's
-- transaction (I9): with p_state 'success' the run succeeds and the events p_events (a JSON
-- array, as register_events takes it, or NULL) are registered and fanned out, so the caller's
-- own writes, the success and the output events commit together or not at all. With
-- 'failed' the error p_error is recorded (its first 4000 characters); while the consumer's
-- max_attempts has attempts left the run is queued again, claimable after the retry delay
-- (retry_delay_seconds, doubled for each attempt already failed when max_retry_delay_seconds
-- is set, up to it), otherwise it fails for good. Success and a final failure free a place
-- under max_active_runs. Returns one result set: the run (the set_run_state columns) with
-- output_event_ids, the ids of the output events in input order as a JSON array. AQ010
-- (lease lost, nothing written) unless the run is running at that attempt; AQ008 for another
-- state; AQ002 for events with a failure; register_events' own errors for bad events.
--
-- The events go through insert_event_batch, the body of register_events: a CALL of
-- register_events itself would send its result set to the client as a second one. The run
-- row is locked first (a locking read: the caller's snapshot may be older than the claim),
-- then the events are inserted, then the run is updated.
--
-- A failed call leaves the caller's transaction as it was (migration 0007_capped_claim):
-- its work runs under a savepoint, rolled back to before the error is raised again, so a
-- caller that commits anyway after an error (an output event refused after others were
-- inserted) commits no output event without the run's success (I9). PostgreSQL aborts the
-- caller's transaction instead, which comes to the same. A deadlock (1213) has already rolled
-- the whole transaction back, savepoint included: ROLLBACK TO SAVEPOINT then fails with 1305,
-- which is ignored, so the caller gets the deadlock, which it retries, not 1305
-- (tests/test_work_outputs.py). Under autocommit, with no transaction, every statement
-- commits on its own and there is no savepoint to go back to (the Python layer opens a
-- transaction for the call).
DROP PROCEDURE IF EXISTS {{ns}}.complete_run $$
CREATE PROCEDURE {{ns}}.complete_run(
    IN p_dag_id  TEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin,
    IN p_run_id  TEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin,
    IN p_attempt INT,
    IN p_state   TEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin,
    IN p_error   LONGTEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin,
    IN p_events  JSON
)
MODIFIES SQL DATA
BEGIN
    DECLARE v_id        BIGINT;
    DECLARE v_state     VARCHAR(20) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin;
    DECLARE v_attempt   INT;
    DECLARE v_lease     DATETIME(6);
    DECLARE v_max       INT;
    DECLARE v_delay     DOUBLE;
    DECLARE v_cap       DOUBLE;
    DECLARE v_now       DATETIME(6);
    DECLARE v_events    BOOLEAN DEFAULT FALSE;
    DECLARE v_count     BIGINT;
    DECLARE v_first_id  BIGINT;
    DECLARE v_timestamp DATETIME(6);
    DECLARE v_out       LONGTEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin DEFAULT '[]';
    DECLARE v_message   VARCHAR(128) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin;
    DECLARE v_saved_gcl BIGINT UNSIGNED DEFAULT @@SESSION.group_concat_max_len;
    -- RESIGNAL raises the error that started the handler, whatever the statements before it
    -- did; group_concat_max_len is not left raised on the connection.
    DECLARE EXIT HANDLER FOR SQLEXCEPTION
    BEGIN
        BEGIN
            DECLARE CONTINUE HANDLER FOR 1305 BEGIN END;
            ROLLBACK TO SAVEPOINT assetq_complete_run;
            RELEASE SAVEPOINT assetq_complete_run;
        END;
        SET SESSION group_concat_max_len = v_saved_gcl;
        RESIGNAL;
    END;

    -- First, before anything that can fail: the handler rolls back to this point only.
    SAVEPOINT assetq_complete_run;
    -- NOT LIKE '% ': the PAD SPACE collation would take 'success ' for 'success'.
    IF p_state IS NULL OR p_state NOT IN ('success', 'failed') OR p_state LIKE '% ' THEN
        SET v_message = LEFT(CONCAT('[AQ008] a run is completed as success or failed, got ',
                                    COALESCE(QUOTE(LEFT(p_state, 40)), 'NULL')), 128);
        SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = v_message;
    END IF;
    -- Events unless NULL or an empty array; anything else is register_events' to judge.
    -- IFs, not one condition: MariaDB may evaluate JSON_TYPE of invalid text and fail.
    IF p_events IS NOT NULL THEN
        SET v_events = TRUE;
        IF JSON_VALID(p_events) THEN
            IF JSON_TYPE(p_events) = 'ARRAY' THEN
                SET v_events = JSON_LENGTH(p_events) > 0;
            END IF;
        END IF;
    END IF;
    IF p_state = 'failed' AND v_events THEN
        SET v_message = '[AQ002] a failed run produces no events';
        SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = v_message;
    END IF;
    SELECT r.id, r.state, r.attempt, r.lease_until INTO v_id, v_state, v_attempt, v_lease
      FROM {{ns}}.dag_run r
     WHERE r.dag_id = p_dag_id AND r.run_id = p_run_id
       FOR UPDATE;
    IF v_id IS NULL THEN
        SET v_message = LEFT(CONCAT('[AQ006] unknown run ', COALESCE(QUOTE(LEFT(p_run_id, 60)), 'NULL'),
                                    ' of dag ', COALESCE(QUOTE(LEFT(p_dag_id, 40)), 'NULL')), 128);
        SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = v_message;
    END IF;
    -- Held means running under a lease at this attempt (see heartbeat_run).
    IF v_state <> 'running' OR NOT (v_attempt <=> p_attempt) OR v_lease IS NULL THEN
        SET v_message = LEFT(CONCAT('[AQ010] lease lost: the run is ', v_state,
                                    IF(v_state = 'running' AND v_lease IS NULL, ' with no lease', ''),
                                    ' at attempt ', v_attempt,
                                    ', not running at attempt ', COALESCE(p_attempt, 'NULL'),
                                    '; roll back: nothing was written for run ', QUOTE(LEFT(p_run_id, 60)),
                                    ' of dag ', QUOTE(LEFT(p_dag_id, 40))), 128);
        SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = v_message;
    END IF;
    SET v_now = UTC_TIMESTAMP(6);
    IF p_state = 'success' THEN
        IF v_events THEN
            CALL {{ns}}.insert_event_batch(p_events, v_first_id, v_timestamp);
            SELECT COUNT(*) INTO v_count FROM {{ns}}._assetq_batch;
            SET SESSION group_concat_max_len = 1073741824;
            IF v_first_id IS NULL THEN
                SELECT CONCAT('[', GROUP_CONCAT(b.event_id ORDER BY b.item_no SEPARATOR ','), ']')
                  INTO v_out
                  FROM {{ns}}._assetq_batch b;
            ELSE
                SELECT CONCAT('[', GROUP_CONCAT(v_first_id + b.item_no - 1 ORDER BY b.item_no SEPARATOR ','), ']')
                  INTO v_out
                  FROM {{ns}}._assetq_batch b;
            END IF;
            SET SESSION group_concat_max_len = v_saved_gcl;
            DROP TEMPORARY TABLE IF EXISTS {{ns}}._assetq_batch;
            IF NOT (JSON_LENGTH(v_out) <=> v_count) THEN
                SET v_message = '[AQ900] claim guard: the output event ids were truncated';
                SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = v_message;
            END IF;
        END IF;
        UPDATE {{ns}}.dag_run
           SET state = 'success', ended_at = v_now, updated_at = v_now, lease_until = NULL,
               not_before = NULL
         WHERE id = v_id;
    ELSE
        -- The consumer's retry options: a plain read (see above: never the dag row's lock).
        SELECT d.max_attempts, d.retry_delay_seconds, d.max_retry_delay_seconds
          INTO v_max, v_delay, v_cap
          FROM {{ns}}.dag d WHERE d.dag_id = p_dag_id;
        IF v_attempt < v_max THEN
            IF v_cap IS NOT NULL THEN
                SET v_delay = LEAST(v_delay * POW(2, LEAST(v_attempt - 1, 60)), v_cap);
            END IF;
            UPDATE {{ns}}.dag_run
               SET state = 'queued', updated_at = v_now, lease_until = NULL,
                   not_before = v_now + INTERVAL CAST(ROUND(v_delay * 1000000) AS SIGNED) MICROSECOND,
                   error = LEFT(p_error, 4000)
             WHERE id = v_id;
        ELSE
            UPDATE {{ns}}.dag_run
               SET state = 'failed', ended_at = v_now, updated_at = v_now, lease_until = NULL,
                   not_before = NULL, error = LEFT(p_error, 4000)
             WHERE id = v_id;
        END IF;
    END IF;
    BEGIN
        -- 1305 under autocommit: the savepoint ended with its own statement.
        DECLARE CONTINUE HANDLER FOR 1305 BEGIN END;
        RELEASE SAVEPOINT assetq_complete_run;
    END;
    SELECT r.id AS dag_run_id, r.dag_id, r.run_id, r.seq, r.state, r.run_after, r.created_at,
           r.started_at, r.ended_at, r.triggering_event_id, r.event_count, r.attempt, r.worker,
           r.lease_until, r.not_before, r.error, v_out AS output_event_ids, r.partition_key
      FROM {{ns}}.dag_run r
     WHERE r.id = v_id;
END $$


-- Puts failed run p_run_id of consumer p_dag_id back in the queue, claimable now, with the
-- same events and run id; its next claim is the next attempt (the count goes on), and it is
-- given one more attempt whatever max_attempts says. AQ008 unless the run is failed, AQ006
-- for an unknown run. It may put the consumer one run over max_active_runs. Returns one
-- result set: the run (the complete_run columns, no output events).
DROP PROCEDURE IF EXISTS {{ns}}.retry_run $$
CREATE PROCEDURE {{ns}}.retry_run(
    IN p_dag_id TEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin,
    IN p_run_id TEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin
)
MODIFIES SQL DATA
BEGIN
    DECLARE v_id      BIGINT;
    DECLARE v_state   VARCHAR(20) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin;
    DECLARE v_now     DATETIME(6);
    DECLARE v_message VARCHAR(128) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin;

    SELECT r.id, r.state INTO v_id, v_state
      FROM {{ns}}.dag_run r
     WHERE r.dag_id = p_dag_id AND r.run_id = p_run_id
       FOR UPDATE;
    IF v_id IS NULL THEN
        SET v_message = LEFT(CONCAT('[AQ006] unknown run ', COALESCE(QUOTE(LEFT(p_run_id, 60)), 'NULL'),
                                    ' of dag ', COALESCE(QUOTE(LEFT(p_dag_id, 40)), 'NULL')), 128);
        SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = v_message;
    END IF;
    IF v_state <> 'failed' THEN
        SET v_message = LEFT(CONCAT('[AQ008] run ', QUOTE(LEFT(p_run_id, 60)), ' is ', v_state,
                                    ': only a failed run can be retried'), 128);
        SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = v_message;
    END IF;
    SET v_now = UTC_TIMESTAMP(6);
    UPDATE {{ns}}.dag_run
       SET state = 'queued', ended_at = NULL, lease_until = NULL, not_before = v_now,
           updated_at = v_now
     WHERE id = v_id;
    SELECT r.id AS dag_run_id, r.dag_id, r.run_id, r.seq, r.state, r.run_after, r.created_at,
           r.started_at, r.ended_at, r.triggering_event_id, r.event_count, r.attempt, r.worker,
           r.lease_until, r.not_before, r.error, '[]' AS output_event_ids, r.partition_key
      FROM {{ns}}.dag_run r
     WHERE r.id = v_id;
END $$


-- Liveness (migration 0010_liveness). Records that loop p_process_id is alive now (database
-- clock, UTC): inserts its row on the first call, then moves last_seen_at (started_at
-- stays). One statement, atomic under autocommit too; the loops call it in a short
-- transaction of its own, never inside a pass or a run. No result set. AQ002 for a bad kind
-- or interval; the lengths are the columns' (strict mode refuses longer values).
-- ON DUPLICATE KEY UPDATE, not REPLACE: REPLACE deletes the row first, and would lose
-- started_at.
DROP PROCEDURE IF EXISTS {{ns}}.process_heartbeat $$
CREATE PROCEDURE {{ns}}.process_heartbeat(
    IN p_process_id       TEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin,
    IN p_kind             TEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin,
    IN p_name             TEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin,
    IN p_host             TEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin,
    IN p_pid              BIGINT,
    IN p_version          TEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin,
    IN p_interval_seconds DOUBLE
)
MODIFIES SQL DATA
BEGIN
    DECLARE v_now     DATETIME(6);
    DECLARE v_message VARCHAR(128) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin;

    IF p_kind IS NULL OR p_kind NOT IN ('scheduler', 'worker') THEN
        SET v_message = LEFT(CONCAT('[AQ002] unknown process kind ', COALESCE(QUOTE(LEFT(p_kind, 40)), 'NULL'),
                                    ': use scheduler or worker'), 128);
        SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = v_message;
    END IF;
    IF p_interval_seconds IS NULL OR NOT (p_interval_seconds > 0 AND p_interval_seconds <= 604800) THEN
        SET v_message = LEFT(CONCAT('[AQ002] liveness interval must be above 0 and at most 604800 seconds, got ',
                                    COALESCE(p_interval_seconds, 'NULL')), 128);
        SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = v_message;
    END IF;
    IF p_process_id IS NULL OR p_process_id = '' OR p_host IS NULL OR p_pid IS NULL OR p_version IS NULL THEN
        SIGNAL SQLSTATE '45000'
            SET MESSAGE_TEXT = '[AQ002] a heartbeat needs a process id, host, pid and version';
    END IF;
    SET v_now = UTC_TIMESTAMP(6);
    INSERT INTO {{ns}}.process_liveness
           (process_id, kind, name, host, pid, version, interval_seconds, started_at, last_seen_at)
    VALUES (p_process_id, p_kind, p_name, p_host, p_pid, p_version, p_interval_seconds, v_now, v_now)
    ON DUPLICATE KEY UPDATE
           kind = p_kind, name = p_name, host = p_host, pid = p_pid, version = p_version,
           interval_seconds = p_interval_seconds, last_seen_at = v_now;
END $$


-- Liveness (migration 0010_liveness). Deletes loop p_process_id's row: the loop stopped
-- cleanly. Idempotent (no row, nothing done). No result set.
DROP PROCEDURE IF EXISTS {{ns}}.process_gone $$
CREATE PROCEDURE {{ns}}.process_gone(
    IN p_process_id TEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin
)
MODIFIES SQL DATA
BEGIN
    DELETE FROM {{ns}}.process_liveness WHERE process_id = p_process_id;
END $$

DELIMITER ;

SET SESSION sql_mode = @assetq_saved_sql_mode;
