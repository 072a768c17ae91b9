"""Worker sessions kept ready for named roles (madlib_mop.prewarm_roles): opened by the
preloaded library's background worker after a reload and after a restart, TensorFlow
imported and the role's latest job's programs traced, counted by the cap; a listed role's
first job runs on them without tracing, to the same bits; they give their slots
to a call that waits; the setting refuses an entry that is not role@database, and only a
superuser runs the function the background worker calls."""

from __future__ import annotations

import time

import psycopg
import pytest
from psycopg import sql

from madlib_mop.tools.embedded import EmbeddedCluster
from tests.conftest import REPO_ROOT, _free_port, iris_grid

ANALYST = "prewarm_analyst"
# A cap of 2 (the two prewarmed sessions hold every slot); sessions warmed for jobs of 2
# segments, as the test's packed table has, whatever this machine's cores.
OPTIONS = "-c madlib_mop.max_worker_sessions=2 -c madlib_mop.segments=2"
IDLE = ("SELECT pid FROM madlib_mop.worker_sessions WHERE role = %s AND database = 'shop' "
        "AND state = 'idle' ORDER BY pid")


def _idle_pids(dsn: str, role: str, count: int, timeout: float = 90.0) -> list[int]:
    """The role's idle sessions once there are `count` of them (the background worker looks
    every 5 s and imports TensorFlow in each)."""
    deadline = time.monotonic() + timeout
    while True:
        with psycopg.connect(dsn, autocommit=True) as conn:
            pids = [pid for pid, in conn.execute(IDLE, (role,))]
        if len(pids) >= count or time.monotonic() > deadline:
            return pids
        time.sleep(0.5)


def _visit_pids(conn: psycopg.Connection, out: str) -> set[int]:
    return {pid for pid, in conn.execute(sql.SQL("SELECT DISTINCT (result->>'pid')::int FROM {}").format(
        sql.Identifier(f"{out}_mop_visits")))}


def _weights(conn: psycopg.Connection, out: str) -> list[tuple]:
    return conn.execute(sql.SQL("SELECT mst_key, md5(model_weights) FROM {} ORDER BY 1").format(
        sql.Identifier(out))).fetchall()


@pytest.fixture()
def server(server_host):
    if not isinstance(server_host, EmbeddedCluster):
        pytest.skip("starts a server of its own on this machine")
    cluster = EmbeddedCluster(REPO_ROOT / ".pg-prewarm", _free_port())
    cluster.destroy()
    try:
        cluster.start(database="shop", options=OPTIONS)
        cluster.allow_role(ANALYST)
        with psycopg.connect(cluster.dsn("shop"), autocommit=True) as conn:
            conn.execute("CREATE SCHEMA madlib_mop; CREATE EXTENSION madlib_mop SCHEMA madlib_mop CASCADE")
            conn.execute("SET search_path = public, madlib_mop")
            # No session kept idle by the set-up's catalog call: the cap's 2 slots are the
            # prewarmed sessions'.
            conn.execute("SET madlib_mop.worker_idle_seconds = 0")
            iris_grid(conn)  # two models: both workers train at once
            conn.execute(sql.SQL("CREATE ROLE {0} LOGIN; GRANT USAGE ON SCHEMA madlib_mop TO {0}; "
                                 "GRANT CREATE ON SCHEMA public TO {0}; "
                                 "GRANT SELECT ON ALL TABLES IN SCHEMA public TO {0}").format(
                sql.Identifier(ANALYST)))
        yield cluster
    finally:
        cluster.destroy()


def test_a_prewarmed_roles_first_job_after_a_restart_runs_on_prewarmed_sessions(server):
    dsn = server.dsn("shop")
    with psycopg.connect(dsn, autocommit=True) as conn:
        assert _idle_pids(dsn, ANALYST, 1, timeout=6) == []  # none listed yet
        # A typo is refused when it is set, not ignored.
        with pytest.raises(psycopg.errors.InvalidParameterValue, match="role@database"):
            conn.execute(f"ALTER SYSTEM SET madlib_mop.prewarm_roles = '{ANALYST}'")
        conn.execute(f"ALTER SYSTEM SET madlib_mop.prewarm_roles = '{ANALYST}@shop'")
        conn.execute("ALTER SYSTEM SET madlib_mop.prewarm_sessions = 2")
        conn.execute("SELECT pg_reload_conf()")
    assert len(_idle_pids(dsn, ANALYST, 2)) == 2  # after a reload
    with psycopg.connect(dsn, autocommit=True) as conn:  # the role's job of last night
        conn.execute(sql.SQL("SET ROLE {}").format(sql.Identifier(ANALYST)))
        conn.execute("SET search_path = public, madlib_mop")
        conn.execute("SELECT madlib_keras_fit_multiple_model('iris_packed', 'last_night', 'mst', 2)")
        last_night = _weights(conn, "last_night")

    server.stop()
    server.start(database="shop", options=OPTIONS)
    prewarmed = _idle_pids(dsn, ANALYST, 2)
    assert len(prewarmed) == 2  # after a restart
    with psycopg.connect(dsn, autocommit=True) as conn:
        # TensorFlow is imported in them (their memory says so), and they hold the cap's slots.
        assert conn.execute("SELECT count(*) FROM madlib_mop.worker_sessions").fetchone()[0] == 2
        assert conn.execute("SELECT backend_type FROM pg_stat_activity WHERE application_name = "
                            "'madlib_mop prewarm'").fetchone()[0] == "madlib_mop prewarm"
        for pid in prewarmed:
            with open(f"/proc/{pid}/status", encoding="ascii") as status:
                rss_kb = next(int(line.split()[1]) for line in status if line.startswith("VmRSS:"))
            assert rss_kb > 300_000, rss_kb

    # The role's first job, in a new session, runs on the prewarmed sessions alone (which of
    # them trained which visit is the scheduler's business).
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("SET ROLE {}").format(sql.Identifier(ANALYST)))
        conn.execute("SET search_path = public, madlib_mop")
        conn.execute("SELECT madlib_keras_fit_multiple_model('iris_packed', 'first_job', 'mst', 2)")
        trained_on = _visit_pids(conn, "first_job")
        assert trained_on and trained_on <= set(prewarmed), (trained_on, prewarmed)
        # The prewarmed sessions traced last night's programs: no visit of the same
        # configurations traced one, and the weights are last night's, bit for bit.
        traced = conn.execute("SELECT array_agg(DISTINCT (result->>'traced')::int) FROM first_job_mop_visits"
                              ).fetchone()[0]
        assert traced == [0], traced
        assert _weights(conn, "first_job") == last_night
        night = conn.execute("SELECT array_agg(DISTINCT (result->>'traced')::int) FROM last_night_mop_visits"
                             ).fetchone()[0]
        assert 1 in night, night  # while last night's first visits traced theirs

    # Another role's call waits for a slot: the prewarmed sessions give theirs, and none is
    # opened again while it waits.
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SET search_path = public, madlib_mop")
        conn.execute("SELECT madlib_keras_fit_multiple_model('iris_packed', 'other_role', 'mst', 1)")
        assert not _visit_pids(conn, "other_role") & set(prewarmed)
        assert conn.execute("SELECT count(*) FROM pg_stat_activity WHERE pid = ANY(%s)",
                            (prewarmed,)).fetchone()[0] == 0


def test_only_a_superuser_runs_the_prewarm(server):
    with psycopg.connect(server.dsn("shop"), autocommit=True) as conn:
        conn.execute(sql.SQL("SET ROLE {}").format(sql.Identifier(ANALYST)))
        with pytest.raises(psycopg.errors.InsufficientPrivilege, match="only as a superuser"):
            conn.execute("SELECT madlib_mop._mop_prewarm()")
