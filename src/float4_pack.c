/*
 * float4_pack: an aggregate that packs numeric arrays into one buffer of float32 values.
 *
 * The preprocessor reads its source table in chunks of rows; for each chunk,
 * float4_pack(x) returns
 *
 *     int32 ndim, int32 dims[ndim], float32 values[rows * prod(dims)]
 *
 * in the server's byte order, which NumPy reads without a Python object per row or per
 * value.  Every row must have the same shape, no NULL element and only finite values; the
 * errors carry SQLSTATEs and hints like the rest of madlib_mop.
 */
#include "postgres.h"

#include <math.h>

#include "catalog/pg_type.h"
#include "fmgr.h"
#include "lib/stringinfo.h"
#include "utils/array.h"
#include "utils/builtins.h"

PG_MODULE_MAGIC;

typedef struct PackState
{
	int			ndim;
	int			dims[MAXDIM];
	int64		rows;
	StringInfoData buf;
} PackState;

static char *
shape_text(int ndim, const int *dims)
{
	StringInfoData text;
	int			i;

	initStringInfo(&text);
	appendStringInfoChar(&text, '[');
	for (i = 0; i < ndim; i++)
		appendStringInfo(&text, i ? ", %d" : "%d", dims[i]);
	appendStringInfoChar(&text, ']');
	return text.data;
}

static void
not_finite(void)
{
	ereport(ERROR,
			(errcode(ERRCODE_DATA_EXCEPTION),
			 errmsg("madlib_mop: NaN or infinite value in an array"),
			 errhint("Remove or replace those values before packing.")));
}

#define COPY_CONVERTED(ctype, getter) \
	do { \
		const ctype *in = (const ctype *) ARR_DATA_PTR(array); \
		for (i = 0; i < count; i++) \
		{ \
			double		v = (double) getter(in[i]); \
			if (!isfinite(v)) \
				not_finite(); \
			out[i] = (float4) v; \
			if (!isfinite(out[i])) \
				ereport(ERROR, \
						(errcode(ERRCODE_NUMERIC_VALUE_OUT_OF_RANGE), \
						 errmsg("madlib_mop: value %g is out of range for float32", v), \
						 errhint("Scale the values (normalizing_const) into float32's range."))); \
		} \
	} while (0)

#define IDENTITY(x) (x)

PG_FUNCTION_INFO_V1(madlib_mop_float4_pack_transfn);

Datum
madlib_mop_float4_pack_transfn(PG_FUNCTION_ARGS)
{
	MemoryContext aggcontext;
	MemoryContext old;
	PackState  *state;
	ArrayType  *array;
	int			ndim;
	int		   *dims;
	int			count;
	int			i;
	float4	   *out;

	if (!AggCheckCallContext(fcinfo, &aggcontext))
		elog(ERROR, "madlib_mop_float4_pack_transfn called in non-aggregate context");

	state = PG_ARGISNULL(0) ? NULL : (PackState *) PG_GETARG_POINTER(0);
	if (PG_ARGISNULL(1))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("madlib_mop: a row has NULL features"),
				 errhint("Remove or fill such rows, e.g. with a view and WHERE ... IS NOT NULL.")));

	array = PG_GETARG_ARRAYTYPE_P(1);
	ndim = ARR_NDIM(array);
	dims = ARR_DIMS(array);
	if (ARR_HASNULL(array) && array_contains_nulls(array))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("madlib_mop: a row has NULL features"),
				 errdetail("An array holds a NULL element."),
				 errhint("Remove or fill such rows, e.g. with a view and WHERE ... IS NOT NULL.")));
	if (ndim < 1)
		ereport(ERROR,
				(errcode(ERRCODE_DATA_EXCEPTION),
				 errmsg("madlib_mop: a row has an empty array"),
				 errhint("Every row needs an array of the same shape.")));

	if (state == NULL)
	{
		old = MemoryContextSwitchTo(aggcontext);
		state = (PackState *) palloc0(sizeof(PackState));
		state->ndim = ndim;
		memcpy(state->dims, dims, ndim * sizeof(int));
		initStringInfo(&state->buf);
		appendBinaryStringInfo(&state->buf, (char *) &ndim, sizeof(int32));
		appendBinaryStringInfo(&state->buf, (char *) dims, ndim * sizeof(int32));
		MemoryContextSwitchTo(old);
	}
	else if (ndim != state->ndim || memcmp(dims, state->dims, ndim * sizeof(int)) != 0)
		ereport(ERROR,
				(errcode(ERRCODE_DATA_EXCEPTION),
				 errmsg("madlib_mop: arrays differ in shape"),
				 errdetail("Found shapes %s and %s.", shape_text(state->ndim, state->dims),
						   shape_text(ndim, dims)),
				 errhint("Every row needs an array of the same shape.")));

	count = ArrayGetNItems(ndim, dims);
	enlargeStringInfo(&state->buf, count * (int) sizeof(float4));
	out = (float4 *) (state->buf.data + state->buf.len);
	switch (ARR_ELEMTYPE(array))
	{
		case FLOAT4OID:
			COPY_CONVERTED(float4, IDENTITY);
			break;
		case FLOAT8OID:
			COPY_CONVERTED(float8, IDENTITY);
			break;
		case INT2OID:
			COPY_CONVERTED(int16, IDENTITY);
			break;
		case INT4OID:
			COPY_CONVERTED(int32, IDENTITY);
			break;
		case INT8OID:
			COPY_CONVERTED(int64, IDENTITY);
			break;
		default:
			ereport(ERROR,
					(errcode(ERRCODE_DATATYPE_MISMATCH),
					 errmsg("madlib_mop: float4_pack takes arrays of real, double precision, "
							"smallint, integer or bigint"),
					 errhint("Cast the array, e.g. x::double precision[].")));
	}
	state->buf.len += count * (int) sizeof(float4);
	state->rows++;
	PG_RETURN_POINTER(state);
}

PG_FUNCTION_INFO_V1(madlib_mop_float4_pack_finalfn);

Datum
madlib_mop_float4_pack_finalfn(PG_FUNCTION_ARGS)
{
	PackState  *state;
	bytea	   *result;

	if (PG_ARGISNULL(0))
		PG_RETURN_NULL();
	state = (PackState *) PG_GETARG_POINTER(0);
	result = (bytea *) palloc(VARHDRSZ + state->buf.len);
	SET_VARSIZE(result, VARHDRSZ + state->buf.len);
	memcpy(VARDATA(result), state->buf.data, state->buf.len);
	PG_RETURN_BYTEA_P(result);
}

/*
 * float4_unpack(bytea) -> real[] and int4_unpack(bytea) -> integer[]: the reverse
 * direction, for results computed in Python (predictions, class indexes), which then reach
 * SQL without a Python object per value.  The bytes are in the server's byte order.
 */
static Datum
unpack_array(bytea *bytes, Oid element_type, int element_size, bool byval, char align)
{
	int			length = VARSIZE_ANY_EXHDR(bytes);
	int			count;
	ArrayType  *result;
	int			dims[1];
	int			lbs[1] = {1};
	int			nbytes;

	if (length % element_size != 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_BINARY_REPRESENTATION),
				 errmsg("madlib_mop: %d bytes are not a whole number of %d-byte values",
						length, element_size),
				 errhint("Pass the bytes of a NumPy array of that type.")));
	count = length / element_size;
	dims[0] = count;
	nbytes = ARR_OVERHEAD_NONULLS(1) + length;
	result = (ArrayType *) palloc0(nbytes);
	SET_VARSIZE(result, nbytes);
	result->ndim = 1;
	result->dataoffset = 0;
	result->elemtype = element_type;
	memcpy(ARR_DIMS(result), dims, sizeof(int));
	memcpy(ARR_LBOUND(result), lbs, sizeof(int));
	memcpy(ARR_DATA_PTR(result), VARDATA_ANY(bytes), length);
	(void) byval;
	(void) align;
	PG_RETURN_ARRAYTYPE_P(result);
}

PG_FUNCTION_INFO_V1(madlib_mop_float4_unpack);

Datum
madlib_mop_float4_unpack(PG_FUNCTION_ARGS)
{
	return unpack_array(PG_GETARG_BYTEA_PP(0), FLOAT4OID, sizeof(float4), true, 'i');
}

PG_FUNCTION_INFO_V1(madlib_mop_int4_unpack);

Datum
madlib_mop_int4_unpack(PG_FUNCTION_ARGS)
{
	return unpack_array(PG_GETARG_BYTEA_PP(0), INT4OID, sizeof(int32), true, 'i');
}
