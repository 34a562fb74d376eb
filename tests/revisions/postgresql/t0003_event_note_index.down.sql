DROP INDEX {{ns}}.asset_event_note_idx;
