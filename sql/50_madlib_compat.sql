-- MADlib deep-learning functions outside the model-selection workflow.  The converters of
-- MADlib's packed tables are implemented.  The functions madlib_mop leaves out on purpose
-- (custom Python objects, the GPU inventory) exist with MADlib's signatures so that a MADlib
-- script stops at a clear error (SQLSTATE 0A000, feature_not_supported) saying why and what
-- to do instead, rather than at "function does not exist".

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

-- ---- Refused: custom Python objects and GPUs --------------------------------------------
-- MADlib's custom functions are dill-pickled Python callables stored in a table and
-- unpickled by the training code: loading one runs whatever code the bytes hold, inside the
-- database server, as the server's operating-system user.  madlib_mop never unpickles
-- anything from the database; its losses and metrics are Keras' built-in ones, named in
-- compile_params, top-k accuracy included.  It trains on CPUs: there is no GPU to inventory.

-- Why a MADlib function is not supported, and what to use instead (one place for the texts).
CREATE FUNCTION @extschema@._unsupported_madlib_function(function_name text, OUT message text,
                                                          OUT hint text)
LANGUAGE sql IMMUTABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT 'madlib_mop: ' || function_name || ' is not supported: ' || CASE function_name
            WHEN 'gpu_configuration' THEN
                'madlib_mop trains on CPUs, so there is no GPU configuration to report'
            WHEN 'load_top_k_accuracy_function' THEN
                'it stores a custom function, and custom functions are pickled Python code '
                'stored in a table: loading them would run arbitrary code inside the database '
                'server'
            ELSE
                'custom functions are pickled Python code stored in a table: loading them '
                'would run arbitrary code inside the database server'
            END,
        CASE function_name
            WHEN 'gpu_configuration' THEN
                'madlib_mop trains on CPUs; pass use_gpus => FALSE (the default).'
            WHEN 'load_top_k_accuracy_function' THEN
                'Ask for metrics=[''top_3_accuracy''] (any k) in compile_params: top-k accuracy '
                'is built in.'
            WHEN 'delete_custom_function' THEN
                'madlib_mop keeps no custom functions, so there is none to delete.  For losses '
                'and metrics, name built-in Keras ones in compile_params, e.g. '
                'loss=''categorical_crossentropy'' and metrics=[''accuracy''].'
            ELSE
                'Name a built-in Keras loss or metric in compile_params instead, e.g. '
                'loss=''categorical_crossentropy'' (or ''mean_squared_error'', ''huber'', '
                '''binary_crossentropy'') and metrics=[''accuracy''] (or ''mae'', '
                '''top_k_categorical_accuracy'', ''top_3_accuracy'').'
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
        ('load_custom_function', 'object_table varchar, object bytea, name text, description text'),
        ('load_custom_function', 'object_table varchar, object bytea, name text'),
        ('delete_custom_function', 'object_table varchar, id integer'),
        ('delete_custom_function', 'object_table varchar, name text'),
        ('load_top_k_accuracy_function', 'object_table varchar, k integer'),
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
        ('load_custom_function', 'message varchar DEFAULT '''''),
        ('delete_custom_function', 'message varchar DEFAULT '''''),
        ('load_top_k_accuracy_function', 'message varchar DEFAULT '''''),
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
