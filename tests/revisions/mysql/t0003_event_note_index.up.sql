ALTER TABLE {{ns}}.asset_event ADD INDEX asset_event_note_idx (note);
