-- Workers: a run is work that exactly one worker holds at a time.
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
-- consumers p_dag_ids, a JSON array, or all when NULL) and leaves them in the session
-- temporary table _assetq_claimed (dag_run_id, dag_id, run_id, seq, run_after, created_at,
-- event_ids as a JSON array, triggering_event_id, state, attempt, worker, lease_until,
-- started_at, ...), running, with a lease of p_lease_seconds on the database's clock: the
-- body of claim_runs_v2 and schedule_and_claim, which return them as one result set and drop
-- the claim's tables (drop_claim_tables). Run it in a short transaction of its own
-- at READ COMMITTED (assetq.claim_runs does): there the plain reads below lock nothing and see
-- what is committed. A running run whose lease expired on its last attempt is failed here
-- instead of claimed (I10), and the search goes on for the limit. AQ002 for bad arguments.
--
-- Timeouts: an attempt claimed here gets a deadline, the claim's time plus the consumer's
-- timeout_seconds, or p_timeout_seconds (the worker's default) for a consumer that declares
-- none; NULL for neither. Its lease never runs past it (nor does any heartbeat's), so the run
-- comes back to the claim index at its deadline: a running candidate past its deadline is
-- ended here as a failure, "timed out after 30s", retried or failed by fail_attempt (the
-- consumer's max_attempts and retry delay), and is not claimed now. So the timeout holds
-- with its worker dead or stopped too; a live worker ends the attempt itself at the deadline
-- (complete_run as failed). The result ends with each run's deadline, and whether its
-- consumer caps its active runs (max_active_runs): then the run's end lets the consumer's
-- next run be created, and on MySQL the worker runs the pass that creates it.
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
DELIMITER $$
DROP PROCEDURE IF EXISTS {{ns}}.claim_into
$$
CREATE PROCEDURE {{ns}}.claim_into(
    IN p_worker          TEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin,
    IN p_limit           INT,
    IN p_lease_seconds   DOUBLE,
    IN p_dag_ids         JSON,
    IN p_timeout_seconds DOUBLE
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
    DECLARE v_late      BIGINT;
    DECLARE v_late_secs DOUBLE;
    DECLARE v_late_end  VARCHAR(20) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin;
    DECLARE v_bad       BIGINT DEFAULT 0;
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
    IF p_timeout_seconds IS NOT NULL AND NOT (p_timeout_seconds > 0 AND p_timeout_seconds <= 604800) THEN
        SET v_message = LEFT(CONCAT('[AQ002] timeout must be above 0 and at most 604800 seconds, got ',
                                    p_timeout_seconds), 128);
        SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = v_message;
    END IF;
    CALL {{ns}}.check_dag_ids(p_dag_ids);
    SET v_now = UTC_TIMESTAMP(6);
    SET v_until = v_now + INTERVAL CAST(ROUND(p_lease_seconds * 1000000) AS SIGNED) MICROSECOND;

    -- Session temporary tables (a failed call's are dropped by the next):
    --   _assetq_claim_candidate  the candidates of the current batch, in claim order
    --   _assetq_claim_lock       the runs one round locked, with what the expired-lease and
    --                            timeout tests need, read from the rows as locked, and the
    --                            deadline of the attempt a claim starts
    --   _assetq_claim_cap        max_attempts and timeout of the consumers of those runs
    --   _assetq_claimed          the runs claimed, as returned
    CALL {{ns}}.drop_claim_tables();
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
        started_at   DATETIME(6) NULL,
        deadline     DATETIME(6) NULL,
        max_attempts INT NULL,
        capped       BOOLEAN NOT NULL DEFAULT FALSE,
        fail         BOOLEAN NOT NULL DEFAULT FALSE,
        timed_out    BOOLEAN NOT NULL DEFAULT FALSE,
        new_deadline DATETIME(6) NULL
    ) ENGINE = InnoDB;
    CREATE TEMPORARY TABLE {{ns}}._assetq_claim_cap (
        dag_id          VARCHAR(250) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL PRIMARY KEY,
        max_attempts    INT NOT NULL,
        timeout_seconds DOUBLE NULL,
        capped          BOOLEAN NOT NULL
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
        partition_key       VARCHAR(250) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL,
        deadline            DATETIME(6) NULL,
        capped              BOOLEAN NOT NULL
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
        INSERT INTO {{ns}}._assetq_claim_lock
               (id, pos, dag_id, state, attempt, worker, lease_until, started_at, deadline)
        SELECT r.id, c.pos, r.dag_id, r.state, r.attempt, r.worker, r.lease_until, r.started_at,
               r.deadline
          FROM {{ns}}._assetq_claim_candidate c FORCE INDEX (PRIMARY)
          STRAIGHT_JOIN {{ns}}.dag_run r FORCE INDEX (PRIMARY) ON r.id = c.id
         WHERE c.pos > v_pos AND r.not_before <= v_now
         ORDER BY c.pos
         LIMIT v_want
           FOR UPDATE SKIP LOCKED;
        SET v_locked = ROW_COUNT();
        SET v_failed = 0;
        IF v_locked > 0 THEN
            -- The consumers' options by a plain read (INSERT ... SELECT reads without locks
            -- at READ COMMITTED; an UPDATE joined with dag would wait for a declare_dag in
            -- flight): max_attempts for expired leases, the timeout for the claims' deadlines.
            DELETE FROM {{ns}}._assetq_claim_cap;
            INSERT INTO {{ns}}._assetq_claim_cap (dag_id, max_attempts, timeout_seconds, capped)
            SELECT d.dag_id, d.max_attempts, d.timeout_seconds, d.max_active_runs IS NOT NULL
              FROM {{ns}}.dag d
             WHERE d.dag_id IN (SELECT k.dag_id FROM {{ns}}._assetq_claim_lock k);
            -- A running candidate past its deadline timed out; one on its last attempt whose
            -- lease expired is failed, not claimed.
            UPDATE {{ns}}._assetq_claim_lock k
              STRAIGHT_JOIN {{ns}}._assetq_claim_cap c ON c.dag_id = k.dag_id
               SET k.max_attempts = c.max_attempts, k.capped = c.capped,
                   k.timed_out = (k.state = 'running' AND k.deadline IS NOT NULL AND k.deadline <= v_now),
                   k.fail = (k.state = 'running' AND NOT (k.deadline IS NOT NULL AND k.deadline <= v_now)
                             AND k.attempt >= c.max_attempts),
                   k.new_deadline = v_now + INTERVAL CAST(ROUND(COALESCE(c.timeout_seconds, p_timeout_seconds)
                                                                * 1000000) AS SIGNED) MICROSECOND;
            SELECT COUNT(*) INTO v_failed FROM {{ns}}._assetq_claim_lock k WHERE k.fail OR k.timed_out;
            IF v_failed > 0 THEN
                UPDATE {{ns}}._assetq_claim_lock k
                  STRAIGHT_JOIN {{ns}}.dag_run r FORCE INDEX (PRIMARY) ON r.id = k.id
                   SET r.state = 'failed', r.ended_at = v_now, r.updated_at = v_now,
                       r.not_before = NULL, r.lease_until = NULL, r.deadline = NULL,
                       r.error = CONCAT('the lease of attempt ', k.attempt, ' (worker ',
                                        COALESCE(k.worker, ''), ') expired at ',
                                        COALESCE(DATE_FORMAT(k.lease_until, '%Y-%m-%d %H:%i:%s.%f'), ''),
                                        '+00 and no attempt is left (max_attempts ',
                                        k.max_attempts, ')')
                 WHERE k.fail;
                SET v_late = 0;
                late_loop: LOOP
                    SET v_late_secs = NULL;
                    SELECT k.id, TIMESTAMPDIFF(MICROSECOND, k.started_at, k.deadline) / 1e6
                      INTO v_late, v_late_secs
                      FROM {{ns}}._assetq_claim_lock k
                     WHERE k.timed_out AND k.id > v_late
                     ORDER BY k.id
                     LIMIT 1;
                    IF v_late_secs IS NULL THEN
                        LEAVE late_loop;
                    END IF;
                    CALL {{ns}}.fail_attempt(v_late, CONCAT('timed out after ', v_late_secs, 's'),
                                            v_now, v_late_end);
                END LOOP;
            END IF;

            -- The claim: a new attempt, held until v_until.
            UPDATE {{ns}}._assetq_claim_lock k
              STRAIGHT_JOIN {{ns}}.dag_run r FORCE INDEX (PRIMARY) ON r.id = k.id
               SET r.state = 'running', r.attempt = r.attempt + 1, r.worker = p_worker,
                   -- LEAST is NULL with a NULL deadline: then the whole lease.
                   r.lease_until = COALESCE(LEAST(v_until, k.new_deadline), v_until),
                   r.not_before = COALESCE(LEAST(v_until, k.new_deadline), v_until),
                   r.deadline = k.new_deadline, r.started_at = v_now, r.updated_at = v_now
             WHERE NOT k.fail AND NOT k.timed_out;
            INSERT INTO {{ns}}._assetq_claimed
                   (dag_run_id, dag_id, run_id, seq, run_after, created_at, event_ids, links,
                    triggering_event_id, state, attempt, worker, lease_until, started_at,
                    partition_key, deadline, capped)
            SELECT r.id, r.dag_id, r.run_id, r.seq, r.run_after, r.created_at,
                   (SELECT CONCAT('[', COALESCE(GROUP_CONCAT(l.asset_event_id ORDER BY l.asset_event_id
                                                             SEPARATOR ','), ''), ']')
                      FROM {{ns}}.dagrun_asset_event l WHERE l.dag_run_id = r.id),
                   (SELECT COUNT(*) FROM {{ns}}.dagrun_asset_event l WHERE l.dag_run_id = r.id),
                   r.triggering_event_id, r.state, r.attempt, r.worker, r.lease_until, r.started_at,
                   r.partition_key, r.deadline, k.capped
              FROM {{ns}}._assetq_claim_lock k
              STRAIGHT_JOIN {{ns}}.dag_run r FORCE INDEX (PRIMARY) ON r.id = k.id
             WHERE NOT k.fail AND NOT k.timed_out;
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
END
$$
DELIMITER ;
