-- assetq 0.1.0's batch registration, kept for its packages while they are in the
-- compatibility window (docs/operations.md): register_events_v2, whose result set has two more
-- columns (always NULL here), which 0.1.0 does not read, and whose savepoint of its own
-- leaves nothing of a failed batch in the caller's transaction even without 0.1.0's.
DELIMITER $$
DROP PROCEDURE IF EXISTS {{ns}}.register_events
$$
CREATE PROCEDURE {{ns}}.register_events(IN p_events JSON)
MODIFIES SQL DATA
BEGIN
    CALL {{ns}}.register_events_v2(p_events);
END
$$
DELIMITER ;
