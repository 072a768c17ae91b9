"""The upgrade chain: an extension installed at 0.1.0 and updated with ALTER EXTENSION
UPDATE is the same as a fresh install of this version: the same catalog (routines, tables,
views, policies, privileges), its jobs rows converted, and the same trained weights."""

from __future__ import annotations

import subprocess
import sysconfig
from pathlib import Path

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import make_conninfo

import madlib_mop
from madlib_mop.tools.containers import ContainerServer
from tests.conftest import REPO_ROOT

OLD = "0.1.0"
FROZEN = REPO_ROOT / "tests" / "upgrade" / f"madlib_mop--{OLD}.sql"

# The extension's objects as PostgreSQL describes them (all but the jobs rows).
CATALOG = {
    "routines": """
        SELECT p.proname, pg_get_function_identity_arguments(p.oid), pg_get_function_result(p.oid),
               p.prokind, p.prosrc, p.proconfig, p.prosecdef, p.provolatile, p.proacl::text,
               obj_description(p.oid, 'pg_proc')
        FROM pg_proc p WHERE p.pronamespace = 'madlib_mop'::regnamespace ORDER BY 1, 2""",
    "columns": """
        SELECT c.relname, c.relkind, a.attname, format_type(a.atttypid, a.atttypmod),
               pg_get_expr(d.adbin, d.adrelid), a.attnotnull, a.attacl::text, c.relacl::text,
               c.relrowsecurity
        FROM pg_class c JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0
        LEFT JOIN pg_attrdef d ON d.adrelid = c.oid AND d.adnum = a.attnum
        WHERE c.relnamespace = 'madlib_mop'::regnamespace ORDER BY 1, 3""",
    "descriptions": """
        SELECT c.relname, obj_description(c.oid, 'pg_class') FROM pg_class c
        WHERE c.relnamespace = 'madlib_mop'::regnamespace ORDER BY 1""",
    "views": """
        SELECT c.relname, pg_get_viewdef(c.oid), c.reloptions FROM pg_class c
        WHERE c.relnamespace = 'madlib_mop'::regnamespace AND c.relkind = 'v' ORDER BY 1""",
    "policies": """
        SELECT polname, polcmd, pg_get_expr(polqual, polrelid), pg_get_expr(polwithcheck, polrelid)
        FROM pg_policy ORDER BY 1""",
    "members": """
        SELECT pg_describe_object(classid, objid, objsubid) FROM pg_depend
        WHERE refclassid = 'pg_extension'::regclass AND deptype = 'e'
          AND refobjid = (SELECT oid FROM pg_extension WHERE extname = 'madlib_mop') ORDER BY 1""",
}

DATA = """
    CREATE TABLE public.flowers AS
    SELECT i AS id, ARRAY[(i % 3) + (i % 7) / 10.0, (i % 3) * 2 - (i % 5) / 10.0,
                          (i % 3) + 0.5, (i % 11) / 10.0]::real[] AS features,
           (ARRAY['a', 'b', 'c'])[i % 3 + 1] AS species
    FROM generate_series(1, 60) i"""
ARCH = ('{"class_name": "Sequential", "config": {"name": "tiny", "layers": [{"class_name": "Dense", "config": '
        '{"units": 6, "activation": "relu", "batch_input_shape": [null, 4]}}, {"class_name": '
        '"Dense", "config": {"units": 3, "activation": "softmax"}}]}}')


@pytest.fixture(scope="module")
def old_version_available(server_host):
    """Version 0.1.0's install script in the server's extension folder while the module
    runs (it is no part of an install: the runtime it names is this version's)."""
    if isinstance(server_host, ContainerServer):
        sharedir = "/usr/share/postgresql/15"
        site = server_host.output([server_host.python, "-c",
                                   "import sysconfig; print(sysconfig.get_paths()['purelib'])"])
        write, remove = server_host.write_file, server_host.remove_file
    else:
        sharedir = subprocess.run(["/usr/lib/postgresql/15/bin/pg_config", "--sharedir"],
                                  capture_output=True, text=True, check=True).stdout.strip()
        site = sysconfig.get_paths()["purelib"]
        write, remove = (lambda path, text: Path(path).write_text(text)), (lambda path: Path(path).unlink())
    target = f"{sharedir}/extension/{FROZEN.name}"
    write(target, FROZEN.read_text().replace("@site_packages@", site))
    try:
        yield
    finally:
        remove(target)


@pytest.fixture(scope="module")
def databases(server_dsn, old_version_available):
    """Two databases: `updated` (0.1.0, then ALTER EXTENSION UPDATE), `fresh`."""
    names = {"updated": "t_upgrade_updated", "fresh": "t_upgrade_fresh"}
    with psycopg.connect(server_dsn, autocommit=True) as admin:
        for name in names.values():
            admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
            admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    dsns = {k: make_conninfo(server_dsn, dbname=v) for k, v in names.items()}
    try:
        yield dsns
    finally:
        with psycopg.connect(server_dsn, autocommit=True) as admin:
            for name in names.values():
                admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


def _catalog(dsn: str) -> dict:
    with psycopg.connect(dsn) as conn:
        return {key: conn.execute(query).fetchall() for key, query in CATALOG.items()}


def test_update_from_0_1_0_equals_a_fresh_install(databases):
    with psycopg.connect(databases["updated"], autocommit=True) as conn:
        conn.execute("CREATE SCHEMA madlib_mop")
        conn.execute(f"CREATE EXTENSION madlib_mop SCHEMA madlib_mop VERSION '{OLD}' CASCADE")
        # A job row as 0.1.0 recorded it: its tables as quoted SQL names.
        conn.execute(
            "INSERT INTO madlib_mop.jobs (model_output_table, source_table, model_selection_table, "
            "arguments, tables, num_models, num_segments, seed, subepochs_total) VALUES "
            "('public.m', 'public.p', 'public.s', '{}', %s, 1, 1, 0, 1)",
            ('{"output": "public.m", "info": "\\"My Schema\\".\\"m_Info\\""}',))
        conn.execute("ALTER EXTENSION madlib_mop UPDATE")
        assert conn.execute("SELECT extversion FROM pg_extension WHERE extname = 'madlib_mop'"
                            ).fetchone()[0] == madlib_mop.__version__
        assert conn.execute("SELECT tables FROM madlib_mop.jobs").fetchone()[0] == {
            "output": ["public", "m"], "info": ["My Schema", "m_Info"]}
        conn.execute("DELETE FROM madlib_mop.jobs")
    with psycopg.connect(databases["fresh"], autocommit=True) as conn:
        conn.execute("CREATE SCHEMA madlib_mop")
        conn.execute("CREATE EXTENSION madlib_mop SCHEMA madlib_mop CASCADE")
    updated, fresh = _catalog(databases["updated"]), _catalog(databases["fresh"])
    assert len(fresh["routines"]) > 30
    for key in CATALOG:
        assert updated[key] == fresh[key], key


def test_an_updated_extension_trains_the_same_weights(databases):
    weights = {}
    for kind, dsn in databases.items():
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("SET search_path = madlib_mop, public")
            conn.execute(DATA)
            conn.execute("SELECT training_preprocessor_dl('flowers', 'packed', 'species', "
                         "'features', NULL, 1, NULL, '2')")
            conn.execute("SELECT load_keras_model('arch', %s)", (ARCH,))
            conn.execute("SELECT load_model_selection_table('arch', 'mst', ARRAY[1], "
                         "ARRAY[$$loss='categorical_crossentropy', optimizer='Adam(lr=0.05)', "
                         "metrics=['accuracy']$$], ARRAY['batch_size=8, epochs=1'])")
            conn.execute("SELECT madlib_keras_fit_multiple_model('packed', 'model', 'mst', 2)")
            weights[kind] = conn.execute("SELECT md5(model_weights) FROM model").fetchall()
    assert weights["updated"] == weights["fresh"] and len(weights["fresh"]) == 1
