-- One scheduler pass (I3-I6), the body of schedule_pass_v2 and schedule_and_claim, which
-- read the runs it made from the session temporary table _assetq_run and then drop it
-- (drop_pass_tables). Takes at most p_limit unpaused consumers with queued rows (of the
-- consumers p_dag_ids, a JSON array, or of all when NULL), least recently examined first, each by its lock row FOR UPDATE SKIP LOCKED, and for each:
-- skips it while it has max_active_runs active runs (queued or running: its queue is left
-- whole); claims its committed queue rows (all of them, or with max_events_per_run the
-- oldest that satisfy the condition, see below), evaluates the condition on exactly those
-- rows, and when it holds creates a run, links exactly the claimed events and deletes
-- exactly the claimed rows by key. A consumer without max_events_per_run gets at most one
-- run a pass (it consumes its whole queue); a capped one may get several (see below).
-- Leaves one row per run created in _assetq_run (dag_run_id, dag_id, run_id, seq, run_after,
-- created_at, event_ids as a JSON array, triggering_event_id: the newest claimed row, state,
-- partition_key).
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
-- A capped run costs what it consumes: the pass reads the
-- N + 1 oldest rows through asset_dag_run_queue_order_idx and, only when the N oldest do not
-- satisfy the condition, each member asset's oldest row through asset_dag_run_queue_asset_idx;
-- never the backlog behind them (tests/test_capped_claim.py counts it). The claims are those
-- of 0006, row for row.
--
-- Runs per pass: a capped consumer gets runs one after
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
-- Workers: a new run is claimable by claim_runs at once
-- (not_before = its creation). Before a consumer with max_active_runs is counted against its
-- cap, its running runs whose last attempt's lease expired are failed (I10: a worker that
-- died on its last attempt must not hold the cap for good; claim_runs does the same). Rows a
-- worker is completing right now are skipped, not waited for. Every
-- pass first fails up to 100 such runs of any consumer, oldest lease first ("the next time
-- anyone claims or passes", docs/workers.md), found through dag_run_lease_idx.
--
-- p_wait_seconds > 0 with p_dag_ids (a worker's pass, schedule_and_claim): a consumer with
-- queued rows that another pass holds, met while this pass holds no consumer yet, is waited
-- for, up to p_wait_seconds (whole seconds: innodb_lock_wait_timeout, at least 1), instead of
-- skipped: when the holder commits, its run is there for the claim that follows, and this
-- pass finds the queue it consumed gone. A wait that times out skips the consumer, as a
-- plain pass does. Such a pass leaves the runs whose last attempt's lease expired (I10,
-- below) to the claim that follows it.
DELIMITER $$
DROP PROCEDURE IF EXISTS {{ns}}.schedule_consumers
$$
CREATE PROCEDURE {{ns}}.schedule_consumers(
    IN p_limit        INT,
    IN p_dag_ids      JSON,
    IN p_wait_seconds DOUBLE
)
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
    DECLARE v_aliased    BOOLEAN;
    DECLARE v_partitioned BOOLEAN;
    DECLARE v_members    BOOLEAN;
    DECLARE v_temps      BOOLEAN DEFAULT FALSE;
    DECLARE v_candidates BIGINT;
    DECLARE v_share      BIGINT;
    DECLARE v_made       BIGINT;
    DECLARE v_from_t     DATETIME(6);
    DECLARE v_from_id    BIGINT;
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
    DECLARE v_clauses    BIGINT;
    DECLARE v_met        BIGINT;
    DECLARE v_now        DATETIME(6);
    DECLARE v_message    VARCHAR(128) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin;
    DECLARE v_wait_timeout BIGINT;
    DECLARE v_wait_seconds BIGINT;
    DECLARE v_timed_out  BOOLEAN;

    IF p_limit IS NULL OR p_limit < 1 THEN
        SET v_message = CONCAT('[AQ002] limit must be a positive integer, got ',
                               COALESCE(p_limit, 'NULL'));
        SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = v_message;
    END IF;
    CALL {{ns}}.check_dag_ids(p_dag_ids);
    -- NOT (... >= 0): NaN is refused too. At most a minute: a worker waits for a pass.
    IF p_wait_seconds IS NULL OR NOT (p_wait_seconds >= 0 AND p_wait_seconds <= 60) THEN
        SET v_message = LEFT(CONCAT('[AQ002] wait must be 0 to 60 seconds, got ',
                                    COALESCE(p_wait_seconds, 'NULL')), 128);
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
    -- and those of fail_expired_runs, once a run whose last attempt's lease expired is found.
    -- MySQL 8 / MariaDB: MySQL cannot open one temporary table twice in a statement, so no
    -- statement below names the same temporary table twice.
    CALL {{ns}}.drop_pass_tables();
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
    SET v_now = UTC_TIMESTAMP(6);
    IF p_dag_ids IS NULL THEN
        CALL {{ns}}.fail_expired_runs(NULL, NULL, v_now);
    END IF;

    -- Candidates: unpaused consumers with queued rows, least recently examined first (NULL
    -- sorts first in MySQL's ascending order). A plain read that locks nothing; each
    -- candidate is locked on its own below. One locking statement with ORDER BY ... LIMIT
    -- could lock every candidate before sorting and keep the ones past the limit locked.
    -- MySQL 8 / MariaDB: MariaDB has no FOR UPDATE OF <table>, so a locking join would
    -- lock the dag rows too; the lock statement below reads dag_lock alone.
    -- Whether a consumer has queued rows is one probe of the queue's primary key by consumer,
    -- a scalar subquery. MySQL 8 / MariaDB: both may flatten
    -- an EXISTS into a semi-join, and MariaDB 10.11 answered this one, as a SELECT, by
    -- materializing every queued row's consumer: the whole backlog read (measured: 100,020
    -- index entries for 1,001 consumers over 100,000 queued rows). A scalar subquery is
    -- never flattened, and its LIMIT 1 stops at the first row (tests/test_capped_claim.py).
    INSERT INTO {{ns}}._assetq_candidate (dag_id)
    SELECT l.dag_id
      FROM {{ns}}.dag_lock l
      JOIN {{ns}}.dag d ON d.dag_id = l.dag_id
     WHERE NOT d.is_paused
       AND (p_dag_ids IS NULL OR JSON_CONTAINS(p_dag_ids, JSON_QUOTE(l.dag_id)))
       AND CASE WHEN d.partitioning IS NULL
                THEN (SELECT q.target_dag_id
                        FROM {{ns}}.asset_dag_run_queue q FORCE INDEX (PRIMARY)
                       WHERE q.target_dag_id = l.dag_id
                       LIMIT 1)
                -- A partitioned consumer has work only when a row arrived that no pass has
                -- examined yet: its keys waiting for other assets
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
        -- A worker's pass that holds no consumer yet waits for one another pass holds (see
        -- above; holding none, two waiting passes never wait for each other). A lock wait
        -- timeout (1205) ends that statement alone (innodb_rollback_on_timeout is off by
        -- default; with it on, the whole transaction rolls back, and is retried).
        IF v_locked_seq IS NULL AND p_wait_seconds > 0 AND p_dag_ids IS NOT NULL AND v_taken = 0 THEN
            SET v_wait_timeout = @@SESSION.innodb_lock_wait_timeout;
            -- MySQL 8 / MariaDB: a variable, not an expression (an integer is required).
            SET v_wait_seconds = GREATEST(1, CEIL(p_wait_seconds));
            SET SESSION innodb_lock_wait_timeout = v_wait_seconds;
            SET v_timed_out = FALSE;
            BEGIN
                DECLARE CONTINUE HANDLER FOR 1205 SET v_timed_out = TRUE;
                SELECT l.last_run_seq INTO v_locked_seq
                  FROM {{ns}}.dag_lock l WHERE l.dag_id = v_dag_id
                   FOR UPDATE;
            END;
            SET SESSION innodb_lock_wait_timeout = v_wait_timeout;
            IF v_timed_out THEN
                SET v_locked_seq = NULL;
            END IF;
        END IF;
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
        -- failed (fail_expired_runs): rows a worker is completing or renewing now are skipped.
        IF v_max_active IS NOT NULL THEN
            CALL {{ns}}.fail_expired_runs(v_dag_id, v_max_attempts, v_now);
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

        -- Its runs, one after another: each one's claim is built
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
            SELECT COUNT(*) INTO v_claimed FROM {{ns}}._assetq_claim k;

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
            CALL {{ns}}.create_run(v_dag_id, v_now, NULL);

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

END
$$
DELIMITER ;
