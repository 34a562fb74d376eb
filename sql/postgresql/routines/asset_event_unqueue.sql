-- A delete of events takes their queue rows with it, and the partition rows of those queue
-- rows: since the queue lost its foreign key to asset_event (development revision
-- 0013_queue_checks), a plain DELETE of a queued event (an operator cleaning up by hand) was
-- accepted, and the next pass created a run that linked the deleted event. A statement
-- trigger with the deleted rows as a transition table: one statement per DELETE, whatever
-- it deleted; producers never delete events, so they pay nothing for it.
--
-- purge_events deletes only events without a queue row (its own test, in the same
-- statement): here it costs one probe of the queue's index by event per event it deleted,
-- finding nothing, and no partition row is looked at. delete_asset deletes its events'
-- queue rows before its events: the same. The ids as an array, compared with = ANY: an
-- index scan of asset_dag_run_queue_event_idx whatever the planner guesses of the
-- transition table's size (it has no statistics), never a scan of the whole queue. The
-- partition rows by the primary key of the queue rows this deleted.
--
-- An event a pass is consuming at that moment (the pass holds its queue row, deleted and not
-- yet committed) is waited for: the pass links it and this finds its queue row gone.
CREATE OR REPLACE FUNCTION {{ns}}.asset_event_unqueue() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    WITH gone AS (
        DELETE FROM {{ns}}.asset_dag_run_queue q
         WHERE q.asset_event_id = ANY (ARRAY(SELECT o.id FROM old_events o))
     RETURNING q.target_dag_id, q.asset_event_id
    )
    DELETE FROM {{ns}}.asset_partition_queue p
     USING gone g
     WHERE p.target_dag_id = g.target_dag_id AND p.asset_event_id = g.asset_event_id;
    RETURN NULL;
END
$$;
