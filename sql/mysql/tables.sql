-- assetq on MySQL 8.0+ / MariaDB 10.6+: every table and index (the 0.1.0 baseline).
--
-- A fresh install executes this file (the baseline revision, migrations/versions/
-- 0001_baseline.py), then creates every routine, trigger and view from routines/, triggers/
-- and views/ (assetq.routines). Later table changes are alembic revisions of their own; a
-- change to a routine is a change to its one file (docs/operations.md, "Upgrading").
--
-- {{ns}} is replaced by the backquoted namespace (a MySQL database, default `assetq`) when the
-- file is loaded. Every object is qualified with it, so nothing depends on the connection's
-- default database. The file runs unchanged through the mysql client too: assetq's loader
-- (sqlfiles.split_script) splits it exactly as the client does.
--
-- Only the common subset of MySQL 8.0 and MariaDB 10.6 is used. Where the two differ, a
-- comment marked "MySQL 8 / MariaDB:" says what was avoided and why.
--
-- Every statement can run twice (CREATE TABLE IF NOT EXISTS): MySQL commits every DDL
-- statement on its own, so an install that stopped half-way is finished by running it again.
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

-- Strict mode while the tables are created (their defaults and checks are validated under
-- it); the installer's mode is restored at the end of the file. Routines get the same mode
-- from assetq.routines when they are created (MySQL stores it with each routine and trigger).
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
    -- Partitions: NULL for an unpartitioned consumer; otherwise
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
    -- A partitioned consumer's mapping of the asset's partition keys to its own (see
    -- partition_map), and whether a key needs all of its upstream
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
    -- Events by age, in the (timestamp, id) order purge_events walks them with its cursor.
    KEY asset_event_timestamp_idx (`timestamp`, id),
    -- Also the index that serves lookups and foreign-key checks by asset_id. NULL keys never
    -- conflict, as on PostgreSQL.
    CONSTRAINT asset_event_idempotency_key UNIQUE (asset_id, idempotency_key),
    CONSTRAINT asset_event_asset_id_fkey FOREIGN KEY (asset_id) REFERENCES {{ns}}.asset (id),
    CONSTRAINT asset_event_extra_is_object CHECK (JSON_TYPE(extra) = 'OBJECT'),
    CONSTRAINT asset_event_idempotency_key_not_empty CHECK (CHAR_LENGTH(idempotency_key) > 0),
    -- The event's partition: NULL for an unpartitioned event. No
    -- CHECK that it is not empty (insert_event_batch refuses ''): adding one to an existing
    -- install would copy the whole event history (ALGORITHM=COPY).
    partition_key     VARCHAR(250) NULL
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

-- One row per (consumer, event) not yet consumed. created_at is the event's own timestamp,
-- copied by the trigger (I2).
--
-- No foreign keys, as on PostgreSQL: a queue row's consumer and
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
    -- The queue by event: purge_events' "still queued?" test and delete_asset (it also served a
    -- foreign key to asset_event during development).
    KEY asset_dag_run_queue_event_idx (asset_event_id),
    -- A consumer's queue in queue order (a capped claim reads its N + 1 oldest rows), and each
    -- of its assets' oldest row (the witness search), by index.
    KEY asset_dag_run_queue_order_idx (target_dag_id, created_at, asset_event_id, asset_id),
    KEY asset_dag_run_queue_asset_idx (target_dag_id, asset_id, created_at, asset_event_id)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

-- A run. As work (see claim_runs): attempt counts its claims,
-- worker holds or last held it, lease_until ends its lease, not_before is when it may next be
-- claimed (NULL: never, it is finished or was moved by hand), error is its last failed
-- attempt's. No CHECK (attempt >= 0): adding one to an existing install would copy the whole
-- table (MySQL 8 / MariaDB: ALGORITHM=COPY), so none is added; only claim_runs writes it.
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
    -- lease expired. Not partial (MySQL has none): the other
    -- states are in it too, in ranges of their own a range on 'running' never reads.
    KEY dag_run_lease_idx (state, not_before),
    -- Runs by age, for purge_runs; a consumer's runs by age, for dag_queue_status.
    KEY dag_run_created_idx (created_at),
    KEY dag_run_dag_created_idx (dag_id, created_at),
    CONSTRAINT dag_run_run_id_key UNIQUE (dag_id, run_id),
    CONSTRAINT dag_run_seq_key UNIQUE (dag_id, seq),
    -- Was the target of the link table's composite foreign key during development; kept, so
    -- that a development install stamped as the baseline has the baseline's indexes.
    CONSTRAINT dag_run_id_dag_key UNIQUE (id, dag_id),
    CONSTRAINT dag_run_dag_id_fkey FOREIGN KEY (dag_id)
        REFERENCES {{ns}}.dag (dag_id) ON DELETE CASCADE,
    CONSTRAINT dag_run_type_check CHECK (run_type IN ('asset_triggered')),
    CONSTRAINT dag_run_state_check CHECK (state IN ('queued', 'running', 'success', 'failed')),
    -- Partitions: the key a partitioned consumer's run is for, and
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
-- runs of one consumer. Event first (during development it was
-- (dag_id, asset_event_id) with an event index beside it): the same uniqueness, and it serves every
-- lookup by event too, one index entry fewer for every link a pass inserts.
--
-- No foreign keys, as on PostgreSQL: a link's run and event are
-- guaranteed by the routines, not checked per row (on PostgreSQL the two checks were 1.9 s of
-- a 3.3 s pass over a 100,000-event backlog; here such a pass is 1.3x faster without them).
-- Links are written only by schedule_pass and schedule_partitions, in the transaction that
-- inserts their run, for the events of queue rows the pass has just deleted by key (the claim
-- guard counts them); a queued event is never deleted (see the queue table). Every routine that deletes runs or events deletes their links
-- first (purge_runs, delete_dag, delete_asset; purge_events deletes only unlinked events),
-- and says next to it why no pass can add a link behind it. A DELETE of runs or events by
-- hand must delete their links too (docs/guarantees.md). The run index that served the key
-- to dag_run stays, for a link lookup by run (claim_runs, consumed_events); lookups by event
-- (purge_events, delete_asset) go by the unique key, which leads with the event (no
-- separate event index).
CREATE TABLE IF NOT EXISTS {{ns}}.dagrun_asset_event (
    dag_run_id      BIGINT NOT NULL,
    asset_event_id  BIGINT NOT NULL,
    dag_id          VARCHAR(250) NOT NULL,
    PRIMARY KEY (dag_run_id, asset_event_id),
    CONSTRAINT dagrun_asset_event_once UNIQUE (asset_event_id, dag_id),
    KEY dagrun_asset_event_run_idx (dag_run_id, dag_id)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

-- Asset aliases: a producer registers an event "through" an
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

-- Partitions. A static mapping of a partitioned consumer: an
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

-- Liveness: one row per scheduler or worker loop that runs, so that
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

-- The routines, triggers and views this namespace holds, as assetq.routines last created them
-- from their files: kind ('routine', 'trigger', 'view'), name (the file's), the SHA-256 of
-- the file's text (checksum), the assetq package version that created it, and the SHA-256 of
-- the definition as the server then printed it (definition_checksum: doctor tells a body
-- changed by hand from one a package wrote). Every install, upgrade and repair re-creates
-- what differs from its files, never a body written by a newer package (forward only).
CREATE TABLE IF NOT EXISTS {{ns}}.routine_catalogue (
    kind                 VARCHAR(20) NOT NULL,
    name                 VARCHAR(64) NOT NULL,
    checksum             CHAR(64) NOT NULL,
    package_version      VARCHAR(64) NOT NULL,
    definition_checksum  CHAR(64) NULL,
    applied_at           DATETIME(6) NOT NULL,
    PRIMARY KEY (kind, name)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

SET SESSION sql_mode = @assetq_saved_sql_mode;
