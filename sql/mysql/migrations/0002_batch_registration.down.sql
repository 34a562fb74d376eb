-- Migration 0002_batch_registration (down): removes what 0002_batch_registration.up.sql created.

DROP PROCEDURE IF EXISTS {{ns}}.register_events;
