"""MADlib's functions outside model selection: the bytea converters of its packed tables (read
and written byte for byte as MADlib does), the function refused on purpose (the GPU
inventory), which stops with SQLSTATE 0A000 and a HINT naming what to use, and the
signatures of MADlib's custom function catalog (tests/test_custom_functions.py tries it)."""

from __future__ import annotations

import numpy as np
import psycopg
import pytest

S = "madlib_mop"

# MADlib's overloads (apache/madlib, madlib_keras_gpu_info.sql_in), each called as a MADlib
# script calls it.
REFUSED = [
    ("gpu_configuration", f"{S}.gpu_configuration('host_gpu_mapping_tf')"),
    ("gpu_configuration", f"{S}.gpu_configuration('host_gpu_mapping_nvidia', 'nvidia')"),
    ("gpu_configuration", f"{S}.gpu_configuration(output_table => 'gpus', source => 'tensorflow')"),
]
HINTS = {"gpu_configuration": "use_gpus => FALSE"}
REASONS = {"gpu_configuration": "CPU"}

REALS = [0.0, 1.0, -1.0, 0.1, -2.5, 1234.5678, -0.000123, 3.4e38, -3.4e38, 1.2e-38, 1e-45]
SMALLINTS = [0, 1, -1, 2, 255, 256, 258, -256, 32767, -32768, 12345, -12345]


def _error(conn: psycopg.Connection, statement: str) -> psycopg.errors.Diagnostic:
    with pytest.raises(psycopg.Error) as caught:
        conn.execute(statement)
    return caught.value.diag


def _value(conn: psycopg.Connection, expression: str, *params):
    return conn.execute(f"SELECT {expression}", params or None).fetchone()[0]


# ---- refused ---------------------------------------------------------------------------------

@pytest.mark.parametrize("function, statement", REFUSED, ids=[s.split("(")[0] + f"-{i}"
                                                              for i, (_, s) in enumerate(REFUSED)])
def test_refused_functions_say_why_and_what_instead(conn, function, statement):
    diag = _error(conn, f"SELECT {statement}")
    assert diag.sqlstate == "0A000", diag.message_primary
    assert f"{function} is not supported" in diag.message_primary
    assert REASONS[function] in diag.message_primary
    assert diag.message_hint and HINTS[function] in diag.message_hint, diag.message_hint
    # Nothing was made: no GPU table.
    assert _value(conn, "to_regclass('public.host_gpu_mapping_tf') IS NULL")


def test_help_form_explains_the_refusal(conn):
    text = _value(conn, f"{S}.gpu_configuration()")
    assert "is not supported" in text and "\n" in text


@pytest.mark.parametrize("statement", [
    f"{S}.load_custom_function()", f"{S}.load_custom_function('help')",
    f"{S}.delete_custom_function()", f"{S}.delete_custom_function('usage')",
    f"{S}.load_top_k_accuracy_function()", f"{S}.load_top_k_accuracy_function('?')"])
def test_custom_function_help_forms(conn, statement):
    text = _value(conn, statement)
    assert "SELECT " in text and "object_table" in text


def test_signatures_are_madlibs(conn):
    found = {row[0] for row in conn.execute(
        "SELECT p.proname || '(' || pg_get_function_arguments(p.oid) || ') ' "
        "|| pg_get_function_result(p.oid) FROM pg_proc p "
        "WHERE p.pronamespace = 'madlib_mop'::regnamespace AND p.proname IN ("
        "'load_custom_function', 'delete_custom_function', 'load_top_k_accuracy_function', "
        "'gpu_configuration', 'convert_array_to_bytea', 'convert_bytea_to_real_array', "
        "'convert_bytea_to_smallint_array')")}
    assert found == {
        "load_custom_function(object_table character varying, object bytea, name text, "
        "description text DEFAULT NULL::text) void",
        "load_custom_function(message character varying DEFAULT ''::character varying) "
        "character varying",
        "delete_custom_function(object_table character varying, id integer) void",
        "delete_custom_function(object_table character varying, name text) void",
        "delete_custom_function(message character varying DEFAULT ''::character varying) "
        "character varying",
        "load_top_k_accuracy_function(object_table character varying, k integer) void",
        "load_top_k_accuracy_function(message character varying DEFAULT ''::character varying) "
        "character varying",
        "gpu_configuration(output_table text, source text) void",
        "gpu_configuration(output_table text) void",
        "gpu_configuration() character varying",
        "convert_array_to_bytea(var real[]) bytea",
        "convert_array_to_bytea(var smallint[]) bytea",
        "convert_bytea_to_real_array(var bytea) real[]",
        "convert_bytea_to_smallint_array(var bytea) smallint[]",
    }


# ---- converters ------------------------------------------------------------------------------

def test_converters_are_immutable_strict_and_parallel_safe(conn):
    rows = conn.execute(
        "SELECT p.oid::regprocedure::text, p.provolatile, p.proisstrict, p.proparallel "
        "FROM pg_proc p WHERE p.pronamespace = 'madlib_mop'::regnamespace "
        "AND p.proname LIKE 'convert\\_%'").fetchall()
    assert len(rows) == 4
    for signature, volatility, strict, parallel in rows:
        assert (volatility, strict, parallel) == ("i", True, "s"), signature


def test_real_bytes_are_numpys_float32_bytes(conn):
    packed = _value(conn, f"{S}.convert_array_to_bytea(%s::real[])", REALS)
    assert bytes(packed) == np.array(REALS, dtype=np.float32).tobytes()
    # 1.0 is 0x3f800000: in the machine's (little-endian) order on this server.
    assert bytes(_value(conn, f"{S}.convert_array_to_bytea(ARRAY[1]::real[])")) == b"\x00\x00\x80\x3f"


def test_smallint_bytes_are_numpys_int16_bytes(conn):
    packed = _value(conn, f"{S}.convert_array_to_bytea(%s::smallint[])", SMALLINTS)
    assert bytes(packed) == np.array(SMALLINTS, dtype=np.int16).tobytes()
    assert bytes(_value(conn, f"{S}.convert_array_to_bytea(ARRAY[258, -2]::smallint[])")) == \
        b"\x02\x01\xfe\xff"


def test_reals_round_trip(conn):
    back = _value(conn, f"{S}.convert_bytea_to_real_array({S}.convert_array_to_bytea(%s::real[]))",
                  REALS)
    assert np.array_equal(np.array(back, dtype=np.float32), np.array(REALS, dtype=np.float32))
    assert _value(conn, f"{S}.convert_bytea_to_real_array({S}.convert_array_to_bytea(x)) = x "
                        "FROM (SELECT %s::real[] AS x) s", REALS)


def test_smallints_round_trip(conn):
    assert _value(conn, f"{S}.convert_bytea_to_smallint_array({S}.convert_array_to_bytea("
                        "%s::smallint[]))", SMALLINTS) == SMALLINTS


def test_bytes_packed_by_numpy_are_read(conn):
    """What MADlib's preprocessor stores (ndarray.tobytes()) reads back as the values."""
    x = np.array([[0.5, -1.25, 3.0], [1e10, -7.75, 0.0]], dtype=np.float32)
    y = np.array([[0, 1, 0], [1, 0, 0]], dtype=np.int16)
    conn.execute("CREATE TABLE public.madlib_packed (independent_var bytea, dependent_var bytea, "
                 "independent_var_shape integer[], dependent_var_shape integer[])")
    try:
        conn.execute("INSERT INTO public.madlib_packed VALUES (%s, %s, %s, %s)",
                     (x.tobytes(), y.tobytes(), list(x.shape), list(y.shape)))
        reals, smallints = conn.execute(
            f"SELECT {S}.convert_bytea_to_real_array(independent_var), "
            f"{S}.convert_bytea_to_smallint_array(dependent_var) FROM public.madlib_packed").fetchone()
    finally:
        conn.execute("DROP TABLE public.madlib_packed")
    assert np.array_equal(np.array(reals, dtype=np.float32), x.ravel())
    assert smallints == y.ravel().tolist()


def test_multidimensional_arrays_are_flattened_in_row_major_order(conn):
    cube = np.arange(24, dtype=np.float32).reshape(2, 3, 4) - 11.5
    literal = "{" + ",".join("{" + ",".join("{" + ",".join(str(v) for v in row) + "}"
                                            for row in plane) + "}" for plane in cube) + "}"
    packed = _value(conn, f"{S}.convert_array_to_bytea(%s::real[])", literal)
    assert bytes(packed) == cube.tobytes()
    assert _value(conn, f"{S}.convert_bytea_to_real_array(%s)", packed) == cube.ravel().tolist()
    grid = np.array([[1, -2, 3], [-4, 5, -6]], dtype=np.int16)
    packed = _value(conn, f"{S}.convert_array_to_bytea('{{{{1,-2,3}},{{-4,5,-6}}}}'::smallint[])")
    assert bytes(packed) == grid.tobytes()
    assert _value(conn, f"{S}.convert_bytea_to_smallint_array(%s)", packed) == grid.ravel().tolist()


def test_non_finite_reals_are_packed_as_numpy_does(conn):
    values = [1.0, float("nan"), float("inf"), float("-inf"), -2.5]
    packed = _value(conn, f"{S}.convert_array_to_bytea(ARRAY[1, 'NaN', 'Infinity', '-Infinity', "
                          "-2.5]::real[])")
    assert bytes(packed) == np.array(values, dtype=np.float32).tobytes()
    back = np.array(_value(conn, f"{S}.convert_bytea_to_real_array(%s)", packed), dtype=np.float32)
    assert np.array_equal(back, np.array(values, dtype=np.float32), equal_nan=True)


def test_empty_arrays_and_empty_bytes(conn):
    assert bytes(_value(conn, f"{S}.convert_array_to_bytea('{{}}'::real[])")) == b""
    assert bytes(_value(conn, f"{S}.convert_array_to_bytea('{{}}'::smallint[])")) == b""
    # PostgreSQL's own empty array (no dimension), equal to '{}'.
    assert _value(conn, f"{S}.convert_bytea_to_real_array(''::bytea) = '{{}}'::real[]")
    assert _value(conn, f"{S}.convert_bytea_to_smallint_array(''::bytea) = '{{}}'::smallint[]")
    assert _value(conn, f"array_ndims({S}.convert_bytea_to_real_array(''::bytea))") is None


@pytest.mark.parametrize("expression", [
    f"{S}.convert_array_to_bytea(NULL::real[])", f"{S}.convert_array_to_bytea(NULL::smallint[])",
    f"{S}.convert_bytea_to_real_array(NULL)", f"{S}.convert_bytea_to_smallint_array(NULL)"])
def test_null_in_null_out(conn, expression):
    assert _value(conn, expression) is None


@pytest.mark.parametrize("function, length", [
    ("convert_bytea_to_real_array", 1), ("convert_bytea_to_real_array", 3),
    ("convert_bytea_to_real_array", 6), ("convert_bytea_to_real_array", 9),
    ("convert_bytea_to_smallint_array", 1), ("convert_bytea_to_smallint_array", 7)])
def test_bytes_of_a_partial_value_are_refused(conn, function, length):
    diag = _error(conn, f"SELECT {S}.{function}('\\x{'ab' * length}'::bytea)")
    assert diag.sqlstate == "22023", diag.message_primary
    assert f"{length} bytes" in diag.message_primary
    assert diag.message_hint


@pytest.mark.parametrize("literal", ["ARRAY[1, NULL]::real[]", "'{{1,2},{NULL,4}}'::real[]",
                                     "ARRAY[NULL, 2]::smallint[]"])
def test_null_elements_are_refused(conn, literal):
    diag = _error(conn, f"SELECT {S}.convert_array_to_bytea({literal})")
    assert diag.sqlstate == "22004", diag.message_primary
    assert diag.message_hint


def test_converters_run_in_parallel_workers(conn):
    with conn.transaction():
        conn.execute("SET LOCAL force_parallel_mode = on")
        plan = "\n".join(row[0] for row in conn.execute(
            f"EXPLAIN SELECT {S}.convert_bytea_to_real_array({S}.convert_array_to_bytea("
            "ARRAY[i, -i]::real[])) FROM generate_series(1, 50) i"))
        assert "Gather" in plan
        total = _value(conn, f"sum(cardinality({S}.convert_bytea_to_real_array("
                             f"{S}.convert_array_to_bytea(ARRAY[i, -i, 'NaN']::real[])))"
                             f" + cardinality({S}.convert_bytea_to_smallint_array("
                             f"{S}.convert_array_to_bytea(ARRAY[i, -i]::smallint[])))) "
                             "FROM generate_series(1, 50) i")
    assert total == 50 * 5
