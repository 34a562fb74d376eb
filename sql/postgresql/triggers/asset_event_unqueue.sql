CREATE OR REPLACE TRIGGER asset_event_unqueue
    AFTER DELETE ON {{ns}}.asset_event
    REFERENCING OLD TABLE AS old_events
    FOR EACH STATEMENT EXECUTE FUNCTION {{ns}}.asset_event_unqueue();
