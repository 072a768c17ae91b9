-- MADlib deep-learning functions outside the model-selection workflow.  The converters of
-- MADlib's packed tables are implemented.  The functions madlib_mop leaves out on purpose
-- (custom Python objects, the GPU inventory) exist with MADlib's signatures so that a MADlib
-- script stops at a clear error (SQLSTATE 0A000, feature_not_supported) saying why and what
-- to do instead, rather than at "function does not exist".

-- ---- Converters: arrays <-> the bytes of MADlib's packed buffers -------------------------
-- MADlib stores a buffer as the bytes of a NumPy array (ndarray.tobytes()): the values in
-- row-major order (a multi-dimensional array is flattened), each in the machine's byte
-- order, 4 bytes per real (float32) and 2 per smallint (int16), no header.  These functions
-- read and write exactly that, so that tables packed by MADlib can be read here and the
-- reverse.  The real[] ones ride on the C functions of 05_packing.sql (float4_pack,
-- float4_unpack): a buffer of independent variables holds up to millions of values.  The
-- smallint[] ones (MADlib's one-hot dependent variables: a few values per row) go value by
-- value in SQL.  All are IMMUTABLE STRICT (NULL in, NULL out) and PARALLEL SAFE: they depend
-- on their argument only, and the server's byte order.

CREATE FUNCTION @extschema@.convert_array_to_bytea(var real[])
RETURNS bytea
LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    packed bytea;
    little_endian boolean;
BEGIN
    IF cardinality(var) = 0 THEN
        RETURN '\x'::bytea;
    END IF;
    IF num_nulls(VARIADIC var) > 0 THEN  -- any shape, without a row per value
        RAISE EXCEPTION 'madlib_mop: convert_array_to_bytea: the array holds NULL elements'
            USING ERRCODE = 'null_value_not_allowed',
                  DETAIL = 'Packed values are raw float32 bytes, which have no NULL.',
                  HINT = 'Replace the NULLs first, e.g. with array_replace(x, NULL, 0::real).';
    END IF;
    IF NOT ('NaN' = ANY (var) OR 'Infinity' = ANY (var) OR '-Infinity' = ANY (var)) THEN
        -- float4_pack writes int32 ndim, int32 dims[ndim], then the values: skip the header.
        SELECT @extschema@.float4_pack(var) INTO packed;
        RETURN substring(packed FROM 4 * array_ndims(var) + 5);
    END IF;
    -- Non-finite values, which float4_pack refuses (the preprocessor must; NumPy packs
    -- them): value by value, float4send's big-endian bytes put in the server's order.
    little_endian := @extschema@.int4_unpack('\x01000000'::bytea) = ARRAY[1];
    RETURN (SELECT string_agg(CASE WHEN little_endian
                                   THEN substring(b FROM 4 FOR 1) || substring(b FROM 3 FOR 1)
                                        || substring(b FROM 2 FOR 1) || substring(b FROM 1 FOR 1)
                                   ELSE b END, '\x'::bytea ORDER BY i)
            FROM unnest(var) WITH ORDINALITY AS v(x, i), LATERAL float4send(v.x) AS b);
END
$$;

COMMENT ON FUNCTION @extschema@.convert_array_to_bytea(real[]) IS
    'MADlib''s packing of a real[] (any shape, flattened) as float32 bytes in machine order, as NumPy''s tobytes()';

CREATE FUNCTION @extschema@.convert_array_to_bytea(var smallint[])
RETURNS bytea
LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    little_endian boolean := @extschema@.int4_unpack('\x01000000'::bytea) = ARRAY[1];
BEGIN
    IF num_nulls(VARIADIC var) > 0 THEN
        RAISE EXCEPTION 'madlib_mop: convert_array_to_bytea: the array holds NULL elements'
            USING ERRCODE = 'null_value_not_allowed',
                  DETAIL = 'Packed values are raw int16 bytes, which have no NULL.',
                  HINT = 'Replace the NULLs first, e.g. with array_replace(y, NULL, 0::smallint).';
    END IF;
    -- Each value as 4 hex digits, its two bytes in the server's order.
    RETURN (SELECT coalesce(decode(string_agg(lpad(to_hex(
                CASE WHEN little_endian THEN ((x & 255) << 8) | ((x >> 8) & 255)
                     ELSE x & 65535 END), 4, '0'), '' ORDER BY i), 'hex'), '\x'::bytea)
            FROM unnest(var) WITH ORDINALITY AS v(x, i));
END
$$;

COMMENT ON FUNCTION @extschema@.convert_array_to_bytea(smallint[]) IS
    'MADlib''s packing of a smallint[] (any shape, flattened) as int16 bytes in machine order, as NumPy''s tobytes()';

CREATE FUNCTION @extschema@.convert_bytea_to_real_array(var bytea)
RETURNS real[]
LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF octet_length(var) % 4 <> 0 THEN
        RAISE EXCEPTION 'madlib_mop: convert_bytea_to_real_array: % bytes are not a whole number of 4-byte float32 values',
                        octet_length(var)
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'Pass the bytes of float32 values (MADlib''s independent_var buffers); '
                         'int16 bytes (dependent_var buffers) are read by convert_bytea_to_smallint_array.';
    END IF;
    IF octet_length(var) = 0 THEN
        RETURN '{}'::real[];  -- PostgreSQL's empty array has no dimension
    END IF;
    RETURN @extschema@.float4_unpack(var);
END
$$;

COMMENT ON FUNCTION @extschema@.convert_bytea_to_real_array(bytea) IS
    'MADlib''s unpacking of float32 bytes in machine order (NumPy''s tobytes()) as a one-dimensional real[]';

CREATE FUNCTION @extschema@.convert_bytea_to_smallint_array(var bytea)
RETURNS smallint[]
LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    little_endian boolean := @extschema@.int4_unpack('\x01000000'::bytea) = ARRAY[1];
BEGIN
    IF octet_length(var) % 2 <> 0 THEN
        RAISE EXCEPTION 'madlib_mop: convert_bytea_to_smallint_array: % bytes are not a whole number of 2-byte int16 values',
                        octet_length(var)
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'Pass the bytes of int16 values (MADlib''s dependent_var buffers); '
                         'float32 bytes (independent_var buffers) are read by convert_bytea_to_real_array.';
    END IF;
    -- Two bytes as an unsigned 16-bit value u, then as signed: (u # 32768) - 32768.
    RETURN ARRAY(
        SELECT ((CASE WHEN little_endian THEN get_byte(var, k) | (get_byte(var, k + 1) << 8)
                      ELSE (get_byte(var, k) << 8) | get_byte(var, k + 1) END # 32768) - 32768)::smallint
        FROM generate_series(0, octet_length(var) - 2, 2) AS k
        ORDER BY k);
END
$$;

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

-- MADlib's overloads, with its parameter names and types.  The one-argument message forms
-- (MADlib's online help) return the same explanation as text.
CREATE FUNCTION @extschema@.load_custom_function(object_table varchar, object bytea, name text,
                                                 description text)
RETURNS void
LANGUAGE sql
SET search_path = pg_catalog, pg_temp
AS $$ SELECT @extschema@._refuse_madlib_function('load_custom_function') $$;

COMMENT ON FUNCTION @extschema@.load_custom_function(varchar, bytea, text, text) IS
    'Not supported (loading pickled Python code would run it in the server): name built-in Keras losses and metrics';

CREATE FUNCTION @extschema@.load_custom_function(object_table varchar, object bytea, name text)
RETURNS void
LANGUAGE sql
SET search_path = pg_catalog, pg_temp
AS $$ SELECT @extschema@._refuse_madlib_function('load_custom_function') $$;

COMMENT ON FUNCTION @extschema@.load_custom_function(varchar, bytea, text) IS
    'Not supported (loading pickled Python code would run it in the server): name built-in Keras losses and metrics';

CREATE FUNCTION @extschema@.load_custom_function(message varchar DEFAULT '')
RETURNS varchar
LANGUAGE sql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$ SELECT u.message || E'\n' || u.hint FROM @extschema@._unsupported_madlib_function('load_custom_function') AS u $$;

CREATE FUNCTION @extschema@.delete_custom_function(object_table varchar, id integer)
RETURNS void
LANGUAGE sql
SET search_path = pg_catalog, pg_temp
AS $$ SELECT @extschema@._refuse_madlib_function('delete_custom_function') $$;

COMMENT ON FUNCTION @extschema@.delete_custom_function(varchar, integer) IS
    'Not supported (custom functions are pickled Python code): name built-in Keras losses and metrics';

CREATE FUNCTION @extschema@.delete_custom_function(object_table varchar, name text)
RETURNS void
LANGUAGE sql
SET search_path = pg_catalog, pg_temp
AS $$ SELECT @extschema@._refuse_madlib_function('delete_custom_function') $$;

COMMENT ON FUNCTION @extschema@.delete_custom_function(varchar, text) IS
    'Not supported (custom functions are pickled Python code): name built-in Keras losses and metrics';

CREATE FUNCTION @extschema@.delete_custom_function(message varchar DEFAULT '')
RETURNS varchar
LANGUAGE sql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$ SELECT u.message || E'\n' || u.hint FROM @extschema@._unsupported_madlib_function('delete_custom_function') AS u $$;

CREATE FUNCTION @extschema@.load_top_k_accuracy_function(object_table varchar, k integer)
RETURNS void
LANGUAGE sql
SET search_path = pg_catalog, pg_temp
AS $$ SELECT @extschema@._refuse_madlib_function('load_top_k_accuracy_function') $$;

COMMENT ON FUNCTION @extschema@.load_top_k_accuracy_function(varchar, integer) IS
    'Not supported (it stores pickled Python code): ask for metrics=[''top_3_accuracy''] (any k) in compile_params';

CREATE FUNCTION @extschema@.load_top_k_accuracy_function(message varchar DEFAULT '')
RETURNS varchar
LANGUAGE sql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$ SELECT u.message || E'\n' || u.hint FROM @extschema@._unsupported_madlib_function('load_top_k_accuracy_function') AS u $$;

CREATE FUNCTION @extschema@.gpu_configuration(output_table text, source text)
RETURNS void
LANGUAGE sql
SET search_path = pg_catalog, pg_temp
AS $$ SELECT @extschema@._refuse_madlib_function('gpu_configuration') $$;

COMMENT ON FUNCTION @extschema@.gpu_configuration(text, text) IS
    'Not supported: madlib_mop trains on CPUs (use_gpus => FALSE)';

CREATE FUNCTION @extschema@.gpu_configuration(output_table text)
RETURNS void
LANGUAGE sql
SET search_path = pg_catalog, pg_temp
AS $$ SELECT @extschema@._refuse_madlib_function('gpu_configuration') $$;

COMMENT ON FUNCTION @extschema@.gpu_configuration(text) IS
    'Not supported: madlib_mop trains on CPUs (use_gpus => FALSE)';

-- MADlib's help form takes no argument (a one-argument text form would be the output
-- table's): no `message` parameter here, unlike the others.
CREATE FUNCTION @extschema@.gpu_configuration()
RETURNS varchar
LANGUAGE sql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$ SELECT u.message || E'\n' || u.hint FROM @extschema@._unsupported_madlib_function('gpu_configuration') AS u $$;
