-- float4_pack(array): packs the arrays of a set of rows into one buffer of float32 values
-- (header: int32 ndim, int32 dims[ndim]).  Written in C (src/float4_pack.c): it is the
-- preprocessor's inner loop, one value at a time over the whole table.

CREATE FUNCTION @extschema@._float4_pack_transfn(internal, anyarray)
RETURNS internal
AS 'MODULE_PATHNAME', 'madlib_mop_float4_pack_transfn'
LANGUAGE C CALLED ON NULL INPUT;

CREATE FUNCTION @extschema@._float4_pack_finalfn(internal)
RETURNS bytea
AS 'MODULE_PATHNAME', 'madlib_mop_float4_pack_finalfn'
LANGUAGE C STRICT;

CREATE AGGREGATE @extschema@.float4_pack(anyarray) (
    SFUNC = @extschema@._float4_pack_transfn,
    STYPE = internal,
    FINALFUNC = @extschema@._float4_pack_finalfn
);

COMMENT ON AGGREGATE @extschema@.float4_pack(anyarray) IS
    'Packs same-shaped numeric arrays into float32 bytes: int32 ndim, int32 dims[], float32 values';

-- The reverse: bytes of float32 / int32 values (server byte order) as an array.
CREATE FUNCTION @extschema@.float4_unpack(bytea)
RETURNS real[]
AS 'MODULE_PATHNAME', 'madlib_mop_float4_unpack'
LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;

CREATE FUNCTION @extschema@.int4_unpack(bytea)
RETURNS integer[]
AS 'MODULE_PATHNAME', 'madlib_mop_int4_unpack'
LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
