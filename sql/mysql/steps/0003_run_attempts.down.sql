-- The trigger goes first: left behind, it would fail every run's end.
DROP TRIGGER IF EXISTS {{ns}}.dag_run_attempt_end;
DROP TABLE IF EXISTS {{ns}}.dag_run_attempt;
