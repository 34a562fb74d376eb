-- The part of a scheduler pass for one partitioned consumer,
-- called by schedule_pass holding the consumer's lock row, as PostgreSQL's
-- schedule_partitions is (see there for what it does and why it costs what arrived, never
-- every pending key). Each run it creates is made by create_run from the pass's _assetq_claim,
-- as the pass makes its own. Its own temporary tables, created here on first use and dropped
-- by schedule_pass:
--   _assetq_pkey    the keys to evaluate: those of the (at most 1,000) oldest rows not yet
--                   examined, in order of their first such row
--   _assetq_prow    the key's rows in queue order (all, or the N + 1 oldest), pos 1 the
--                   oldest; with N and the condition not met, also its rows after those
--   _assetq_present the assets present for the key (enough distinct upstream keys)
-- Every write to the queue tables is by primary key, driven by a temporary table: a range
-- scan would wait for producers' uncommitted rows, even at READ COMMITTED (see schedule_pass).
DELIMITER $$
DROP PROCEDURE IF EXISTS {{ns}}.schedule_partitions
$$
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
                -- The run (create_run) consumes the pass's claim table: the key's claimed rows
                -- are copied there. Then their asset_partition_queue rows go, by key.
                DELETE FROM {{ns}}._assetq_claim;
                INSERT INTO {{ns}}._assetq_claim (asset_event_id, asset_id, created_at)
                SELECT r.asset_event_id, r.asset_id, r.created_at FROM {{ns}}._assetq_prow r WHERE r.claim;
                SET v_take = ROW_COUNT();
                CALL {{ns}}.create_run(p_dag_id, p_now, v_key);
                DELETE p
                  FROM {{ns}}._assetq_claim k
                  STRAIGHT_JOIN {{ns}}.asset_partition_queue p FORCE INDEX (PRIMARY)
                    ON p.target_dag_id = p_dag_id AND p.asset_event_id = k.asset_event_id;

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
END
$$
DELIMITER ;
