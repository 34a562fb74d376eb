-- Migration 0002_batch_registration (down): removes what 0002_batch_registration.up.sql created.

DROP FUNCTION IF EXISTS {{ns}}.register_events(jsonb);
