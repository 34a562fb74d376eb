DROP TABLE IF EXISTS {{ns}}.process_dag;
UPDATE {{ns}}.dag_run SET state = 'failed' WHERE state = 'cancelled';
ALTER TABLE {{ns}}.dag_run
    ADD CONSTRAINT dag_run_state_check CHECK (state IN ('queued', 'running', 'success', 'failed'));
ALTER TABLE {{ns}}.dag_run DROP COLUMN deadline;
ALTER TABLE {{ns}}.dag DROP COLUMN timeout_seconds;
