"""The embedded cluster: connection strings, and a second cluster started and stopped."""

from __future__ import annotations

import shutil
import socket
import subprocess
import uuid

import psycopg
import pytest

from madlib_mop.tools.embedded import REPO_ROOT, EmbeddedCluster, configured_dsn


def test_dsn_comes_from_the_environment_when_set(monkeypatch):
    monkeypatch.setenv("MADLIB_MOP_DSN", "postgresql://someone@db.example:5433/prod")
    assert configured_dsn() == "postgresql://someone@db.example:5433/prod"
    monkeypatch.delenv("MADLIB_MOP_DSN")
    monkeypatch.setenv("MADLIB_MOP_PGPORT", "55555")
    cluster = EmbeddedCluster()
    assert configured_dsn() == ("postgresql://postgres@127.0.0.1:55555/madlib_mop"
                                f"?passfile={cluster.passfile}")


def test_make_dsn_prints_the_connection_string():
    printed = subprocess.run(["make", "-s", "dsn"], cwd=REPO_ROOT, check=True,
                             capture_output=True, text=True).stdout.strip()
    assert printed == configured_dsn()
    assert printed.startswith("postgresql://")


def _free_port() -> int:
    """A port of 54400-54899 nothing listens on or connects from (a random one may be a
    client connection's own port at that moment)."""
    for port in sorted(range(54400, 54900), key=lambda _: uuid.uuid4().int):
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port))
                return port
            except OSError:
                continue
    raise AssertionError("no free port in 54400-54899")


@pytest.fixture
def second_cluster():
    # Under the repository's git-ignored .pg folder: the server's OS user can reach it.
    cluster = EmbeddedCluster(base=REPO_ROOT / ".pg" / f"test-{uuid.uuid4().hex[:8]}", port=_free_port())
    yield cluster
    cluster.stop()
    shutil.rmtree(cluster.base, ignore_errors=True)


def test_a_cluster_starts_idempotently_and_stops(second_cluster):
    assert not second_cluster.is_initialized()
    dsn = second_cluster.start("demo_db")
    assert second_cluster.is_running()
    assert second_cluster.start("demo_db") == dsn  # a second start changes nothing
    with psycopg.connect(dsn) as conn:
        row = conn.execute("SELECT current_database(), current_setting('port'), "
                           "current_setting('listen_addresses')").fetchone()
    assert row == ("demo_db", str(second_cluster.port), "127.0.0.1")
    second_cluster.stop()
    assert not second_cluster.is_running()
    with pytest.raises(psycopg.OperationalError):
        psycopg.connect(dsn, connect_timeout=2)
