ALTER TABLE {{ns}}.asset_event DROP COLUMN note;
