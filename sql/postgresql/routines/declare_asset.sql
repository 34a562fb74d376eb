-- Declares an asset (idempotent). An existing asset keeps its id; a given uri or extra
-- replaces the stored one. When no asset has the name yet but a consumer referenced the uri
-- before anyone declared it (an undeclared asset with that uri, or named by it), that asset
-- takes the name: it keeps its id, so the consumers that referenced it get its events. A uri
-- that belongs to another asset is refused (AQ002), nothing written.
CREATE OR REPLACE FUNCTION {{ns}}.declare_asset(p_name text, p_uri text DEFAULT NULL, p_extra jsonb DEFAULT NULL)
RETURNS bigint
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_id       bigint;
    v_uri_id   bigint;
    v_uri_name text;
    v_declared boolean;
BEGIN
    IF p_extra IS NOT NULL AND jsonb_typeof(p_extra) <> 'object' THEN
        RAISE EXCEPTION 'asset extra must be a JSON object, got %', jsonb_typeof(p_extra)
            USING ERRCODE = 'AQ002';
    END IF;
    IF p_uri IS NOT NULL THEN
        SELECT a.id, a.name, a.declared INTO v_uri_id, v_uri_name, v_declared
          FROM {{ns}}.asset a WHERE a.uri = p_uri
           FOR UPDATE;
        IF NOT FOUND THEN
            SELECT a.id, a.name, a.declared INTO v_uri_id, v_uri_name, v_declared
              FROM {{ns}}.asset a
             WHERE a.name = p_uri AND a.uri IS NULL AND NOT a.declared AND a.name <> p_name
               FOR UPDATE;
        END IF;
        IF v_uri_id IS NOT NULL AND v_uri_name <> p_name THEN
            IF v_declared OR EXISTS (SELECT 1 FROM {{ns}}.asset a WHERE a.name = p_name) THEN
                RAISE EXCEPTION 'uri % already belongs to asset %', quote_literal(p_uri), quote_literal(v_uri_name)
                    USING ERRCODE = 'AQ002',
                          HINT = 'An asset''s uri is unique: declare it under that name, or use another uri.';
            END IF;
            UPDATE {{ns}}.asset a
               SET name = p_name, uri = p_uri, extra = coalesce(p_extra, a.extra), declared = true
             WHERE a.id = v_uri_id;
            RETURN v_uri_id;
        END IF;
    END IF;
    INSERT INTO {{ns}}.asset AS a (name, uri, extra)
    VALUES (p_name, p_uri, coalesce(p_extra, '{}'::jsonb))
    ON CONFLICT (name) DO UPDATE
       SET uri = coalesce(EXCLUDED.uri, a.uri),
           extra = CASE WHEN p_extra IS NULL THEN a.extra ELSE EXCLUDED.extra END,
           declared = true
    RETURNING a.id INTO v_id;
    RETURN v_id;
END
$$;
