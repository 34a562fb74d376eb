ALTER TABLE {{ns}}.asset_event ADD COLUMN note text;
