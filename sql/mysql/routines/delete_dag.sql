-- Removes consumer p_dag_id with its queue rows, condition, runs and their links, and its
-- lock row (cascades). Returns no result set; AQ003 for an unknown consumer. Waits for a
-- scheduler pass that holds it (its lock row, first). Then its reference and alias-clause
-- rows go before its dag row, the order in which the fan-out reads them: a producer in
-- flight for this consumer finishes first (its queue rows are deleted with the consumer), a
-- later one waits and then finds no consumer to queue for. Neither fails.
--
-- Its links and queue rows are deleted by hand, before the dag row (the link table has no
-- foreign keys, the queue none; the runs
-- still go by cascade). No pass can add one behind that
-- delete: a pass holds the consumer's lock row from its claim to its commit, and we hold it
-- from the first statement (every later pass skips the consumer, SKIP LOCKED); the delete
-- is a locking read, which reads the committed pass's links. Its runs are locked before
-- the links, in the order purge_runs takes them (runs, then links), so the two never
-- deadlock; purge_runs skips them (SKIP LOCKED).
DELIMITER $$
DROP PROCEDURE IF EXISTS {{ns}}.delete_dag
$$
CREATE PROCEDURE {{ns}}.delete_dag(IN p_dag_id TEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin)
MODIFIES SQL DATA
BEGIN
    DECLARE v_found BIGINT;
    CALL {{ns}}.lock_dag(p_dag_id);  -- its lock row, or AQ003
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
    -- index of the links leads with dag_id. A multiple-table DELETE
    -- reads the runs, which we hold FOR UPDATE already.
    DELETE l
      FROM {{ns}}.dag_run r FORCE INDEX (dag_run_dag_state_idx)
      STRAIGHT_JOIN {{ns}}.dagrun_asset_event l FORCE INDEX (PRIMARY) ON l.dag_run_id = r.id
     WHERE r.dag_id = p_dag_id;
    -- Its queue rows by hand too (the queue has no foreign keys),
    -- after its reference and alias-clause rows: their delete waited for every producer in
    -- flight that read them (the fan-out reads them with a shared lock), and this delete, a
    -- locking read, reads those producers' committed rows; a later producer finds no
    -- reference to queue through.
    DELETE q
      FROM {{ns}}.asset_dag_run_queue q FORCE INDEX (PRIMARY)
     WHERE q.target_dag_id = p_dag_id;
    DELETE FROM {{ns}}.dag WHERE dag_id = p_dag_id;
END
$$
DELIMITER ;
