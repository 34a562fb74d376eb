DROP TABLE IF EXISTS {{ns}}.process_dag;
UPDATE {{ns}}.dag_run SET state = 'failed' WHERE state = 'cancelled';
ALTER TABLE {{ns}}.dag_run DROP COLUMN deadline;
ALTER TABLE {{ns}}.dag DROP COLUMN timeout_seconds;
