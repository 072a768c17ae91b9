"""The extension's settings are declared by its library, which reserves the prefix
madlib_mop.*: a misspelt name is an error when it is set (the embedded server preloads the
library, as the README tells a DBA to), every name the package reads is declared, an unset
one reads as empty (the extension's default), and the documentation's pages explain each."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict

from tests.conftest import connect

ROOT = Path(__file__).resolve().parents[1]
FILES = {"madlib_mop.control", "madlib_mop.so"}  # names of files, not settings


def _declared() -> set[str]:
    return {name for path in (ROOT / "src").glob("*.c")
            for name in re.findall(r'"(madlib_mop\.[a-z_]+)"', path.read_text())}


# Settings declared as numbers, with their defaults; the others are text, empty by default.
NUMBERS = {"madlib_mop.max_worker_sessions": "0", "madlib_mop.prewarm_sessions": "1"}


def _read_by_the_package() -> set[str]:
    names = set()
    for path in (ROOT / "madlib_mop").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) \
                    and re.fullmatch(r"madlib_mop\.[a-z_]+", node.value) and node.value not in FILES:
                names.add(node.value)
    return names


def test_every_setting_the_package_reads_is_declared():
    read = _read_by_the_package()
    assert len(read) >= 8
    assert read <= _declared(), read - _declared()


def test_the_documentation_explains_every_setting():
    """Beyond the generated reference's line: a written page says how each is used."""
    written = "".join(path.read_text() for path in (ROOT / "docs").glob("*.md"))
    assert [name for name in sorted(_declared()) if f"`{name}`" not in written] == []


def test_declared_settings_read_as_their_defaults(extension_dsn):
    with connect(extension_dsn) as conn:
        for name in sorted(_declared()):
            assert conn.execute(sql.SQL("SHOW {}").format(sql.Identifier(name))).fetchone()[0] == \
                NUMBERS.get(name, "")
        conn.execute("SET madlib_mop.worker_idle_seconds = 5")
        assert conn.execute("SELECT current_setting('madlib_mop.worker_idle_seconds')").fetchone()[0] == "5"


@pytest.mark.parametrize("statement", [
    "SET madlib_mop.max_worker_session = 8",  # one letter short
    "SET madlib_mop.worker_memory = 2048",
    "SELECT set_config('madlib_mop.queue_timeout', '10', false)",
])
def test_a_misspelt_setting_is_an_error_when_it_is_set(extension_dsn, statement):
    # A new session that has called nothing of the extension: the preloaded library has
    # reserved the prefix already.
    with psycopg.connect(extension_dsn, autocommit=True) as conn:
        with pytest.raises(psycopg.Error) as caught:
            conn.execute(statement)
    assert caught.value.diag.sqlstate == "42602"
    assert "reserved prefix" in (caught.value.diag.message_detail or "")


def test_a_misspelt_setting_of_a_database_is_refused(extension_dsn):
    database = conninfo_to_dict(extension_dsn)["dbname"]
    with connect(extension_dsn) as conn:
        with pytest.raises(psycopg.Error) as caught:
            conn.execute(sql.SQL("ALTER DATABASE {} SET madlib_mop.worker_idle_second = 1").format(
                sql.Identifier(database)))
        assert caught.value.diag.sqlstate == "42602"
        assert conn.execute("SELECT count(*) FROM pg_db_role_setting s JOIN pg_database d "
                            "ON d.oid = s.setdatabase WHERE d.datname = %s AND "
                            "array_to_string(s.setconfig, ',') LIKE '%%idle_second=%%'",
                            (database,)).fetchone()[0] == 0
