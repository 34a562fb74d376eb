-- The date of p_day when it is a real day written 'YYYY-MM-DD' (years 1 to 9999), NULL
-- otherwise: never an error for a key that does not parse.
CREATE OR REPLACE FUNCTION {{ns}}.partition_day(p_day text) RETURNS date
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    v_year  integer;
    v_month integer;
    v_dom   integer;
BEGIN
    IF p_day IS NULL OR p_day !~ '^[0-9]{4}-[0-9]{2}-[0-9]{2}$' THEN
        RETURN NULL;
    END IF;
    v_year := substr(p_day, 1, 4)::integer;
    v_month := substr(p_day, 6, 2)::integer;
    v_dom := substr(p_day, 9, 2)::integer;
    IF v_year < 1 OR v_month NOT BETWEEN 1 AND 12 OR v_dom < 1
       OR v_dom > extract(day FROM make_date(v_year, v_month, 1) + interval '1 month' - interval '1 day')
    THEN
        RETURN NULL;
    END IF;
    RETURN make_date(v_year, v_month, v_dom);
END
$$;
