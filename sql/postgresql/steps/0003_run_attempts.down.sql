-- The trigger and its function go first: left behind, they would fail every run's end.
DROP TRIGGER IF EXISTS dag_run_attempt_end ON {{ns}}.dag_run;
DROP FUNCTION IF EXISTS {{ns}}.dag_run_attempt_end();
DROP TABLE {{ns}}.dag_run_attempt;
