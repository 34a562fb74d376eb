-- Drops every temporary table a scheduler pass may create on its connection: schedule_pass's
-- own, schedule_partitions' and fail_expired_runs'. The pass calls it first (the tables a
-- failed pass left) and last (I11: none stays on a connection a pool hands to another
-- client), so one list serves both and no table is forgotten in one of them.
DELIMITER $$
DROP PROCEDURE IF EXISTS {{ns}}.drop_pass_tables
$$
CREATE PROCEDURE {{ns}}.drop_pass_tables()
MODIFIES SQL DATA
BEGIN
    DROP TEMPORARY TABLE IF EXISTS {{ns}}._assetq_candidate, {{ns}}._assetq_claim, {{ns}}._assetq_run,
                                   {{ns}}._assetq_member, {{ns}}._assetq_queue, {{ns}}._assetq_oldest,
                                   {{ns}}._assetq_chosen, {{ns}}._assetq_reap, {{ns}}._assetq_reaped,
                                   {{ns}}._assetq_pkey, {{ns}}._assetq_prow, {{ns}}._assetq_present,
                                   {{ns}}._assetq_pmember, {{ns}}._assetq_phave, {{ns}}._assetq_phit,
                                   {{ns}}._assetq_ptaken, {{ns}}._assetq_prequired;
END
$$
DELIMITER ;
