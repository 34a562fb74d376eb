ALTER TABLE {{ns}}.asset_event DROP INDEX asset_event_note_idx;
