"""The extension in a real server: install in any schema, drop cleanly, non-superuser use."""

from __future__ import annotations

import re
import uuid
from pathlib import Path

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import make_conninfo

from tests.conftest import iris_table, mlp_json

REPO_ROOT = Path(__file__).resolve().parents[1]

# Every object a CREATE EXTENSION could leave behind, described by PostgreSQL itself.
SNAPSHOT = """
    SELECT 'function ' || oid::regprocedure::text FROM pg_proc
    UNION ALL SELECT 'relation ' || oid::regclass::text FROM pg_class
    UNION ALL SELECT 'type ' || oid::regtype::text FROM pg_type
    UNION ALL SELECT 'schema ' || nspname FROM pg_namespace
    UNION ALL SELECT 'cast ' || pg_describe_object('pg_cast'::regclass, oid, 0) FROM pg_cast
    UNION ALL SELECT 'operator ' || oid::regoperator::text FROM pg_operator
    UNION ALL SELECT 'event trigger ' || evtname FROM pg_event_trigger
    UNION ALL SELECT 'extension ' || extname FROM pg_extension
"""


def _objects(conn: psycopg.Connection) -> set[str]:
    return {row[0] for row in conn.execute(SNAPSHOT)}


@pytest.fixture
def bare_conn(database_dsn):
    """The module's database without the extension (each test cleans up after itself)."""
    with psycopg.connect(database_dsn, autocommit=True) as conn:
        yield conn


def test_create_extension_in_schema_madlib(bare_conn):
    bare_conn.execute("CREATE SCHEMA madlib")
    try:
        bare_conn.execute("CREATE EXTENSION madlib_mop SCHEMA madlib CASCADE")
        schema, version = bare_conn.execute(
            "SELECT extnamespace::regnamespace::text, extversion FROM pg_extension "
            "WHERE extname = 'madlib_mop'").fetchone()
        assert (schema, version) == ("madlib", "0.23.0")
        reported = bare_conn.execute("SELECT madlib.version()").fetchone()[0]
        assert reported.startswith("madlib_mop 0.23.0, PostgreSQL 15")
        assert "TensorFlow 2.21.0" in reported and "Python 3.11" in reported
        # Nothing was put anywhere else: the functions are all in schema madlib.
        elsewhere = bare_conn.execute(
            "SELECT count(*) FROM pg_depend d JOIN pg_proc p ON d.objid = p.oid "
            "WHERE d.refobjid = (SELECT oid FROM pg_extension WHERE extname = 'madlib_mop') "
            "AND p.pronamespace <> 'madlib'::regnamespace").fetchone()[0]
        assert elsewhere == 0
    finally:
        bare_conn.execute("DROP EXTENSION IF EXISTS madlib_mop")
        bare_conn.execute("DROP SCHEMA madlib")


def test_drop_extension_leaves_no_objects(bare_conn):
    bare_conn.execute("CREATE EXTENSION IF NOT EXISTS plpython3u")
    bare_conn.execute("CREATE SCHEMA madlib_mop")
    before = _objects(bare_conn)
    bare_conn.execute("CREATE EXTENSION madlib_mop SCHEMA madlib_mop")
    during = _objects(bare_conn)
    # Every routine the SQL sources declare, and the jobs catalog, came with the extension.
    declared = {m for path in (REPO_ROOT / "sql").glob("*.sql") for m in re.findall(
        r"^CREATE (?:FUNCTION|PROCEDURE|AGGREGATE) @extschema@\.(\w+)\(", path.read_text(), re.M)}
    created = {o.split(".", 1)[1].split("(")[0] for o in during - before
               if o.startswith("function madlib_mop.")}
    assert len(declared) > 20 and declared <= created
    assert {"relation madlib_mop.jobs", "relation madlib_mop.job_progress"} <= during - before
    bare_conn.execute("DROP EXTENSION madlib_mop")
    after = _objects(bare_conn)
    assert after == before
    bare_conn.execute("DROP SCHEMA madlib_mop")


def test_installed_without_cascade_needs_plpython(bare_conn):
    """`requires = plpython3u`: without CASCADE PostgreSQL names the missing language."""
    bare_conn.execute("DROP EXTENSION IF EXISTS plpython3u")
    bare_conn.execute("CREATE SCHEMA madlib_mop")
    try:
        with pytest.raises(psycopg.errors.UndefinedObject, match="plpython3u"):
            bare_conn.execute("CREATE EXTENSION madlib_mop SCHEMA madlib_mop")
    finally:
        bare_conn.execute("DROP SCHEMA madlib_mop")


def test_non_superuser_granted_usage_can_call(conn):
    role = f"analyst_{uuid.uuid4().hex[:8]}"
    conn.execute(sql.SQL("CREATE ROLE {} NOLOGIN NOSUPERUSER").format(sql.Identifier(role)))
    try:
        conn.execute(sql.SQL("SET ROLE {}").format(sql.Identifier(role)))
        assert conn.execute("SELECT rolsuper FROM pg_roles WHERE rolname = current_user").fetchone()[0] is False
        with pytest.raises(psycopg.errors.InsufficientPrivilege, match="schema madlib_mop"):
            conn.execute("SELECT madlib_mop.version()")
        conn.execute("RESET ROLE")

        conn.execute(sql.SQL("GRANT USAGE ON SCHEMA madlib_mop TO {}").format(sql.Identifier(role)))
        conn.execute(sql.SQL("GRANT CREATE ON SCHEMA public TO {}").format(sql.Identifier(role)))
        conn.execute(sql.SQL("SET ROLE {}").format(sql.Identifier(role)))
        assert conn.execute("SELECT madlib_mop.version()").fetchone()[0].startswith("madlib_mop ")
        # The role's own table, read by the in-database runtime under the role's rights.
        table = f"{role}_points"
        conn.execute(sql.SQL("CREATE TABLE {} (x real[], y boolean)").format(sql.Identifier(table)))
        conn.execute(sql.SQL(
            "INSERT INTO {} SELECT ARRAY[i::real, (i % 7)::real], i % 2 = 0 FROM generate_series(1, 40) i"
        ).format(sql.Identifier(table)))
        report = conn.execute(
            "SELECT madlib_mop.runtime_check(%s, 'y', 'x', epochs => 2)", (table,)).fetchone()[0]
        assert report["rows"] == 40 and report["class_values"] == ["false", "true"]
    finally:
        conn.execute("RESET ROLE")
        conn.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(role)))
        conn.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))


def test_a_sql_ascii_database_trains_and_predicts(server_dsn):
    """A database of encoding SQL_ASCII (legacy clusters; a container without a locale makes
    one): the worker sessions read text as text, not bytes."""
    name = f"t_ascii_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(server_dsn, autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE DATABASE {} ENCODING 'SQL_ASCII' LC_COLLATE 'C' LC_CTYPE 'C' "
                              "TEMPLATE template0").format(sql.Identifier(name)))
    try:
        with psycopg.connect(make_conninfo(server_dsn, dbname=name, client_encoding="UTF8"),
                             autocommit=True) as conn:
            assert conn.execute("SHOW server_encoding").fetchone()[0] == "SQL_ASCII"
            conn.execute("CREATE SCHEMA madlib_mop; CREATE EXTENSION madlib_mop SCHEMA madlib_mop CASCADE")
            conn.execute("SET search_path = public, madlib_mop")
            iris_table(conn)
            conn.execute("SELECT training_preprocessor_dl('iris', 'iris_packed', 'class_text', 'attributes')")
            conn.execute("SELECT load_keras_model('arch', %s::json)", (mlp_json(4, 8, 3),))
            conn.execute("SELECT madlib_keras_fit('iris_packed', 'iris_model', 'arch', 1, $$loss="
                         "'categorical_crossentropy', optimizer='Adam'$$, $$batch_size=16, epochs=1$$, 1)")
            conn.execute("SELECT madlib_keras_predict('iris_model', 'iris', 'id', 'attributes', 'iris_predict', "
                         "'response')")
            classes = {row[0] for row in conn.execute("SELECT class_value FROM iris_predict")}
        assert classes and classes <= {"setosa", "versicolor", "virginica"}
    finally:
        with psycopg.connect(server_dsn, autocommit=True) as admin:
            admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
