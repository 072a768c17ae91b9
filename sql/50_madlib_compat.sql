-- MADlib deep-learning functions outside the model-selection workflow.  The converters of
-- MADlib's packed tables are implemented.  The function madlib_mop leaves out on purpose
-- (the GPU inventory) exists with MADlib's signatures so that a MADlib script stops at a
-- clear error (SQLSTATE 0A000, feature_not_supported) saying why and what to do instead,
-- rather than at "function does not exist".

-- ---- Converters: arrays <-> the bytes of MADlib's packed buffers -------------------------
-- NumPy's tobytes() and frombuffer(), as MADlib's own (madlib_mop/api/converters.py): tables
-- packed by MADlib can be read here and the reverse.  IMMUTABLE STRICT (NULL in, NULL out)
-- and PARALLEL SAFE: they depend on their argument only, and the server's byte order.

CREATE FUNCTION @extschema@.convert_array_to_bytea(var real[])
RETURNS bytea
LANGUAGE plpython3u IMMUTABLE STRICT PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $python$
element = "real"
#include "convert_array_to_bytea.py"
$python$;

COMMENT ON FUNCTION @extschema@.convert_array_to_bytea(real[]) IS
    'MADlib''s packing of a real[] (any shape, flattened) as float32 bytes in machine order, as NumPy''s tobytes()';

CREATE FUNCTION @extschema@.convert_array_to_bytea(var smallint[])
RETURNS bytea
LANGUAGE plpython3u IMMUTABLE STRICT PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $python$
element = "smallint"
#include "convert_array_to_bytea.py"
$python$;

COMMENT ON FUNCTION @extschema@.convert_array_to_bytea(smallint[]) IS
    'MADlib''s packing of a smallint[] (any shape, flattened) as int16 bytes in machine order, as NumPy''s tobytes()';

CREATE FUNCTION @extschema@.convert_bytea_to_real_array(var bytea)
RETURNS real[]
LANGUAGE plpython3u IMMUTABLE STRICT PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $python$
element = "real"
#include "convert_bytea_to_array.py"
$python$;

COMMENT ON FUNCTION @extschema@.convert_bytea_to_real_array(bytea) IS
    'MADlib''s unpacking of float32 bytes in machine order (NumPy''s tobytes()) as a one-dimensional real[]';

CREATE FUNCTION @extschema@.convert_bytea_to_smallint_array(var bytea)
RETURNS smallint[]
LANGUAGE plpython3u IMMUTABLE STRICT PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $python$
element = "smallint"
#include "convert_bytea_to_array.py"
$python$;

COMMENT ON FUNCTION @extschema@.convert_bytea_to_smallint_array(bytea) IS
    'MADlib''s unpacking of int16 bytes in machine order (NumPy''s tobytes()) as a one-dimensional smallint[]';

-- ---- Refused: GPUs ------------------------------------------------------------------------
-- madlib_mop trains on CPUs: there is no GPU to inventory.  (MADlib's custom functions are
-- sql/55_custom_functions.sql.)

-- Why a MADlib function is not supported, and what to use instead (one place for the texts).
CREATE FUNCTION @extschema@._unsupported_madlib_function(function_name text, OUT message text,
                                                          OUT hint text)
LANGUAGE sql IMMUTABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT 'madlib_mop: ' || function_name || ' is not supported: ' || CASE function_name
            WHEN 'gpu_configuration' THEN
                'madlib_mop trains on CPUs, so there is no GPU configuration to report'
            END,
        CASE function_name
            WHEN 'gpu_configuration' THEN
                'madlib_mop trains on CPUs; pass use_gpus => FALSE (the default).'
        END
$$;

CREATE FUNCTION @extschema@._refuse_madlib_function(function_name text)
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    refusal record;
BEGIN
    SELECT * INTO refusal FROM @extschema@._unsupported_madlib_function(function_name);
    RAISE EXCEPTION USING MESSAGE = refusal.message, ERRCODE = 'feature_not_supported',
                          HINT = refusal.hint;
END
$$;

-- MADlib's overloads, with its parameter names and types, each refusing; the message forms
-- (MADlib's online help) return the same explanation as text.  gpu_configuration's help
-- form takes no argument (a one-argument text form would be the output table's).  (A DO
-- $routines$ block is part of an upgrade's generated routines: it must be rerunnable.)
DO $routines$
DECLARE
    f record;
BEGIN
    FOR f IN SELECT * FROM (VALUES
        ('gpu_configuration', 'output_table text, source text'),
        ('gpu_configuration', 'output_table text')) AS v(name, parameters)
    LOOP
        EXECUTE format(
            'CREATE OR REPLACE FUNCTION %I.%I(%s) RETURNS void LANGUAGE sql '
            'SET search_path = pg_catalog, pg_temp AS %L',
            '@extschema@', f.name, f.parameters,
            format('SELECT %I._refuse_madlib_function(%L)', '@extschema@', f.name));
        EXECUTE format('COMMENT ON FUNCTION %I.%I(%s) IS %L', '@extschema@', f.name, f.parameters,
                       (SELECT u.message FROM @extschema@._unsupported_madlib_function(f.name) u));
    END LOOP;
    FOR f IN SELECT * FROM (VALUES
        ('gpu_configuration', '')) AS v(name, parameters)
    LOOP
        EXECUTE format(
            'CREATE OR REPLACE FUNCTION %I.%I(%s) RETURNS varchar LANGUAGE sql IMMUTABLE '
            'SET search_path = pg_catalog, pg_temp AS %L',
            '@extschema@', f.name, f.parameters,
            format('SELECT u.message || E''\n'' || u.hint FROM %I._unsupported_madlib_function(%L) u',
                   '@extschema@', f.name));
    END LOOP;
END
$routines$;
