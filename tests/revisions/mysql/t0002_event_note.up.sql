ALTER TABLE {{ns}}.asset_event ADD COLUMN note VARCHAR(200) NULL;
