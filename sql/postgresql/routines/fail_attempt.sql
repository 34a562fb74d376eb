-- Ends the running attempt of run p_id, which the caller has locked, as a failure with error
-- p_error (its first 4000 characters) at p_now: while the consumer's max_attempts has
-- attempts left the run is queued again, claimable after the retry delay
-- (retry_delay_seconds, doubled for each attempt already failed when max_retry_delay_seconds
-- is set, up to it), otherwise it fails for good, which frees a place under max_active_runs.
-- The one place the retry policy is written: complete_run (a handler's failure) and
-- claim_runs_v2 (a timed-out attempt) call it. Returns the run's new state.
CREATE OR REPLACE FUNCTION {{ns}}.fail_attempt(p_id bigint, p_error text, p_now timestamptz)
RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
    v_dag_id  text;
    v_attempt integer;
    v_max     integer;
    v_delay   double precision;
    v_cap     double precision;
BEGIN
    -- The consumer's retry options: a plain read, the run's lock is enough.
    SELECT r.dag_id, r.attempt, d.max_attempts, d.retry_delay_seconds, d.max_retry_delay_seconds
      INTO v_dag_id, v_attempt, v_max, v_delay, v_cap
      FROM {{ns}}.dag_run r
      JOIN {{ns}}.dag d ON d.dag_id = r.dag_id
     WHERE r.id = p_id;
    IF v_attempt < v_max THEN
        IF v_cap IS NOT NULL THEN
            v_delay := least(v_delay * power(2::double precision, least(v_attempt - 1, 60)), v_cap);
        END IF;
        UPDATE {{ns}}.dag_run r
           SET state = 'queued', updated_at = p_now, lease_until = NULL, deadline = NULL,
               not_before = p_now + make_interval(secs => v_delay), error = left(p_error, 4000)
         WHERE r.id = p_id;
        RETURN 'queued';
    END IF;
    UPDATE {{ns}}.dag_run r
       SET state = 'failed', ended_at = p_now, updated_at = p_now, lease_until = NULL,
           deadline = NULL, not_before = NULL, error = left(p_error, 4000)
     WHERE r.id = p_id;
    PERFORM {{ns}}.run_ended(v_dag_id);
    RETURN 'failed';
END
$$;

ALTER FUNCTION {{ns}}.fail_attempt(bigint, text, timestamptz)
    SECURITY DEFINER SET search_path = pg_catalog, pg_temp;
