-- A delete of an event takes its queue rows with it, and their partition rows: since the
-- queue lost its foreign key to asset_event (development revision 0013_queue_checks), a plain
-- DELETE of a queued event (an operator cleaning up by hand) was accepted, and the next pass
-- created a run that linked the deleted event. MySQL 8 / MariaDB have no statement triggers
-- with the deleted rows: a row trigger, which producers never fire (they never delete).
--
-- By the queue's index by event (asset_dag_run_queue_event_idx), then the partition rows by
-- their primary key, with the index hints of delete_asset: a scan would lock every
-- consumer's queue rows. purge_events deletes only events without a queue row (its test, at
-- READ COMMITTED) and delete_asset deletes its events' queue rows before its events: for
-- them this is one index probe per event that finds nothing, and at READ COMMITTED it locks
-- nothing (no gap locks; the entry it stops at does not match, so it is not locked, and a
-- producer's uncommitted queue row is never waited for). Partition rows first: they are
-- found through the queue rows.
DELIMITER $$
DROP TRIGGER IF EXISTS {{ns}}.asset_event_unqueue
$$
CREATE TRIGGER {{ns}}.asset_event_unqueue
    AFTER DELETE ON {{ns}}.asset_event
    FOR EACH ROW
BEGIN
    DELETE p
      FROM {{ns}}.asset_dag_run_queue q FORCE INDEX (asset_dag_run_queue_event_idx)
      STRAIGHT_JOIN {{ns}}.asset_partition_queue p FORCE INDEX (PRIMARY)
         ON p.target_dag_id = q.target_dag_id AND p.asset_event_id = q.asset_event_id
     WHERE q.asset_event_id = OLD.id;
    DELETE q
      FROM {{ns}}.asset_dag_run_queue q FORCE INDEX (asset_dag_run_queue_event_idx)
     WHERE q.asset_event_id = OLD.id;
END
$$
DELIMITER ;
