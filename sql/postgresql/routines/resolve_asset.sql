-- Looks an asset up by name, then by uri. Raises AQ001 when neither matches.
CREATE OR REPLACE FUNCTION {{ns}}.resolve_asset(p_asset text) RETURNS bigint
LANGUAGE plpgsql STABLE AS $$
DECLARE
    v_id bigint;
BEGIN
    SELECT a.id INTO v_id FROM {{ns}}.asset a WHERE a.name = p_asset;
    IF NOT FOUND THEN
        SELECT a.id INTO v_id FROM {{ns}}.asset a WHERE a.uri = p_asset;
        IF NOT FOUND THEN
            RAISE EXCEPTION 'unknown asset %', quote_literal(p_asset)
                USING ERRCODE = 'AQ001',
                      HINT = 'Declare the asset first (assetq.declare_asset) or name it in a consumer condition.';
        END IF;
    END IF;
    RETURN v_id;
END
$$;
