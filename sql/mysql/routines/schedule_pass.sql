-- One scheduler pass over every consumer, skipping those another pass holds: schedule_pass_v2
-- with no consumer filter and no wait. The routine of assetq 0.1.0's schedulers, kept for
-- them while they are in the compatibility window (docs/operations.md).
DELIMITER $$
DROP PROCEDURE IF EXISTS {{ns}}.schedule_pass
$$
CREATE PROCEDURE {{ns}}.schedule_pass(IN p_limit INT)
MODIFIES SQL DATA
BEGIN
    CALL {{ns}}.schedule_pass_v2(p_limit, NULL, 0);
END
$$
DELIMITER ;
