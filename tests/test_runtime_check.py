"""The in-database runtime: TensorFlow inside the server, reading a table through SPI."""

from __future__ import annotations

import psycopg
import pytest
from psycopg import sql
from sklearn.datasets import load_iris


@pytest.fixture(scope="module")
def iris(extension_dsn):
    data = load_iris()
    with psycopg.connect(extension_dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE iris (id int, attributes float8[], class_text text)")
        with conn.cursor().copy("COPY iris FROM STDIN") as copy:
            for i, (x, y) in enumerate(zip(data.data, data.target)):
                copy.write_row((i, [float(v) for v in x], str(data.target_names[y])))
    return "iris"


def _check(conn, *args, **named):
    placeholders = [sql.Placeholder()] * len(args) + [
        sql.SQL("{} => {}").format(sql.Identifier(k), sql.Placeholder()) for k in named]
    query = sql.SQL("SELECT madlib_mop.runtime_check({})").format(sql.SQL(", ").join(placeholders))
    return conn.execute(query, (*args, *named.values())).fetchone()[0]


def test_trains_a_keras_model_on_the_table(conn, iris):
    report = _check(conn, iris, "class_text", "attributes", epochs=30)
    assert report["rows"] == 150 and report["features"] == 4
    assert report["class_values"] == ["setosa", "versicolor", "virginica"]
    assert len(report["loss"]) == 30
    assert report["loss"][-1] < report["loss"][0] / 2
    assert report["accuracy"][-1] > 0.8
    assert report["tensorflow"] == "2.21.0" and report["python"].startswith("3.11")


def test_same_seed_same_training(conn, iris):
    first = _check(conn, iris, "class_text", "attributes", epochs=3, seed=7)
    second = _check(conn, iris, "class_text", "attributes", epochs=3, seed=7)
    other = _check(conn, iris, "class_text", "attributes", epochs=3, seed=8)
    assert first["loss"] == second["loss"]
    assert first["loss"] != other["loss"]


def test_schema_qualified_and_quoted_names(conn, iris):
    conn.execute('CREATE SCHEMA IF NOT EXISTS "Odd Schema"')
    conn.execute('CREATE TABLE IF NOT EXISTS "Odd Schema"."My Iris" AS '
                 'SELECT attributes AS "Features", class_text AS "Class" FROM iris')
    report = _check(conn, '"Odd Schema"."My Iris"', "Class", "Features", epochs=1)
    assert report["rows"] == 150
    assert report["source_table"] == '"Odd Schema"."My Iris"'


@pytest.mark.parametrize(
    ("args", "sqlstate", "message", "hint"),
    [
        (("no_such_table", "class_text", "attributes"), "42P01",
         "source_table: Input table 'no_such_table' does not exist", "existing table"),
        (("iris", "class_text", "Attributes"), "42703",
         'independent_varname "Attributes" is not a column of public.iris', "case-sensitive"),
        (("iris", "label", "attributes"), "42703",
         'dependent_varname "label" is not a column of public.iris', "column names"),
        (("iris", "class_text", "class_text"), "42804",
         "has type text, not a numeric array", "real[]"),
        (("", "class_text", "attributes"), "22023", "source_table must name a table", "e.g."),
    ],
)
def test_bad_input_gets_a_clear_error(conn, iris, args, sqlstate, message, hint):
    with pytest.raises(psycopg.Error) as raised:
        _check(conn, *args)
    diag = raised.value.diag
    assert diag.sqlstate == sqlstate
    assert diag.message_primary.startswith("madlib_mop: ")
    assert message in diag.message_primary
    assert hint in (diag.message_hint or "")


def test_bad_epochs(conn, iris):
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="epochs must be at least 1"):
        _check(conn, iris, "class_text", "attributes", epochs=0)


@pytest.mark.parametrize(
    ("rows", "sqlstate", "message"),
    [
        ("SELECT ARRAY[1.0, NULL]::float8[], 'a'", "22004", "NULL feature or label"),
        ("SELECT ARRAY[1.0, 2.0]::float8[], NULL", "22004", "NULL feature or label"),
        ("SELECT ARRAY[1.0, 2.0]::float8[], 'a' UNION ALL SELECT ARRAY[1.0]::float8[], 'b'",
         "22000", "differ in length"),
        ("SELECT ARRAY[1.0]::float8[], 'a' WHERE false", "22000", "has no rows"),
    ],
)
def test_bad_rows_get_a_clear_error(conn, rows, sqlstate, message):
    conn.execute("DROP TABLE IF EXISTS bad_rows")
    conn.execute(f"CREATE TABLE bad_rows AS SELECT * FROM ({rows}) AS t(x, y)")
    with pytest.raises(psycopg.Error) as raised:
        _check(conn, "bad_rows", "y", "x")
    assert raised.value.diag.sqlstate == sqlstate
    assert message in raised.value.diag.message_primary


def test_tensorflow_refuses_a_session_that_used_jit(extension_dsn):
    """JIT's LLVM and TensorFlow's crash the server when loaded together: a clear error instead."""
    with psycopg.connect(extension_dsn, autocommit=True) as fresh:
        fresh.execute("SET jit = on")
        fresh.execute("SET jit_above_cost = 0")
        fresh.execute("SELECT sum(i) FROM generate_series(1, 1000) AS i").fetchone()
        with pytest.raises(psycopg.Error) as raised:
            fresh.execute("SELECT madlib_mop.version()")
        assert raised.value.diag.sqlstate == "55000"
        assert "JIT" in raised.value.diag.message_primary
        assert "jit = off" in raised.value.diag.message_hint
    with psycopg.connect(extension_dsn, autocommit=True) as other:
        other.execute("SELECT madlib_mop.version()")  # the server is fine
        assert other.execute("SHOW jit").fetchone()[0] == "off"  # and JIT is off from then on
