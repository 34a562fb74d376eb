-- Removes consumer p_dag_id with its queue rows, condition, runs and their links. Waits for
-- a scheduler pass that holds it. Producers racing with it are not disturbed: the fan-out
-- skips a consumer deleted meanwhile. AQ003 for an unknown consumer.
--
-- The links first, by hand (the link table has no foreign keys; the
-- rest goes by cascade from the dag row). No pass can add one behind that delete: the dag row
-- is locked first, FOR UPDATE, which waits for a pass that holds it (FOR NO KEY UPDATE, in
-- schedule_pass and so in schedule_partitions) to commit, and makes every later pass skip
-- the consumer (SKIP LOCKED); the link delete after it is a statement of its own, whose
-- snapshot has the committed pass's links (and their runs, inserted in the same transaction,
-- through which it finds them). Its runs are locked before the links, in the order
-- purge_runs takes them (runs, then links), so the two never deadlock; purge_runs skips them
-- (SKIP LOCKED).
--
-- The queue rows by hand too (the queue has no foreign keys), after
-- the lock: the FOR UPDATE waited for every producer holding the dag row (the fan-out locks it
-- FOR KEY SHARE), the queue delete's snapshot has their rows, and a producer after it waits
-- for our commit and then skips the deleted consumer.
--
-- Only at READ COMMITTED (AQ002 otherwise, before anything is locked): above it every
-- statement reads the transaction's snapshot, older than the producers and passes the lock
-- waited for, whose queue rows and links would be left behind.
CREATE OR REPLACE FUNCTION {{ns}}.delete_dag(p_dag_id text) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    IF current_setting('transaction_isolation') <> 'read committed' THEN
        RAISE EXCEPTION 'delete_dag runs only at READ COMMITTED (this transaction is %)',
                current_setting('transaction_isolation')
            USING ERRCODE = 'AQ002',
                  HINT = 'Delete the consumer in a READ COMMITTED transaction (PostgreSQL''s default).';
    END IF;
    PERFORM 1 FROM {{ns}}.dag d WHERE d.dag_id = p_dag_id FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'unknown dag %', quote_nullable(p_dag_id) USING ERRCODE = 'AQ003';
    END IF;
    PERFORM 1 FROM {{ns}}.dag_run r WHERE r.dag_id = p_dag_id FOR UPDATE;
    -- Through its runs (dag_run_dag_state_idx, then the links' primary key): no index of the
    -- links leads with dag_id. The runs are the ones locked just above.
    DELETE FROM {{ns}}.dagrun_asset_event l
     USING {{ns}}.dag_run r
     WHERE r.dag_id = p_dag_id AND l.dag_run_id = r.id;
    DELETE FROM {{ns}}.asset_dag_run_queue q WHERE q.target_dag_id = p_dag_id;
    DELETE FROM {{ns}}.dag d WHERE d.dag_id = p_dag_id;
END
$$;
