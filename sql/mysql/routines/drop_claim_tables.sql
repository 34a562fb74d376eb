-- Drops the session temporary tables of a claim (claim_into's), those of a failed call too.
DELIMITER $$
DROP PROCEDURE IF EXISTS {{ns}}.drop_claim_tables
$$
CREATE PROCEDURE {{ns}}.drop_claim_tables()
MODIFIES SQL DATA
BEGIN
    DROP TEMPORARY TABLE IF EXISTS {{ns}}._assetq_claim_candidate, {{ns}}._assetq_claim_lock,
                                   {{ns}}._assetq_claim_cap, {{ns}}._assetq_claimed;
END
$$
DELIMITER ;
