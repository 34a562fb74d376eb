CREATE OR REPLACE TRIGGER asset_event_fan_out
    AFTER INSERT ON {{ns}}.asset_event
    REFERENCING NEW TABLE AS new_events
    FOR EACH STATEMENT EXECUTE FUNCTION {{ns}}.asset_event_fan_out();
