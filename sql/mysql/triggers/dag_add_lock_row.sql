-- Every consumer gets its lock row in the statement that creates it, however it is created.
DELIMITER $$
DROP TRIGGER IF EXISTS {{ns}}.dag_add_lock_row
$$
CREATE TRIGGER {{ns}}.dag_add_lock_row
    AFTER INSERT ON {{ns}}.dag
    FOR EACH ROW
    INSERT INTO {{ns}}.dag_lock (dag_id) VALUES (NEW.dag_id)
$$
DELIMITER ;
