CREATE INDEX asset_event_note_idx ON {{ns}}.asset_event (note);
