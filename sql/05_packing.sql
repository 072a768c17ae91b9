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
COMMENT ON FUNCTION @extschema@.float4_unpack IS
    'Bytes of float32 values (server byte order) as a real[]: what float4_pack packed';

CREATE FUNCTION @extschema@.int4_unpack(bytea)
RETURNS integer[]
AS 'MODULE_PATHNAME', 'madlib_mop_int4_unpack'
LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
COMMENT ON FUNCTION @extschema@.int4_unpack IS
    'Bytes of int32 values (server byte order) as an integer[]';

-- Did this transaction (or a live subtransaction of it) change the relation: its catalog
-- row, or rows in it?  Exact, unlike pg_stat_xact_all_tables, which on PostgreSQL 15 also
-- counts this session's earlier, committed transactions until its statistics are flushed.
-- Written in C (src/written_here.c): only the server knows its own transaction's writes.
CREATE FUNCTION @extschema@.written_in_transaction(regclass)
RETURNS boolean
AS 'MODULE_PATHNAME', 'madlib_mop_written_in_transaction'
LANGUAGE C STABLE STRICT;

COMMENT ON FUNCTION @extschema@.written_in_transaction(regclass) IS
    'True when the current transaction created, altered, truncated or wrote rows of the relation';
