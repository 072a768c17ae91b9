"""The server's pool of worker sessions: the cap holds, a job runs on fewer workers than
segments with the same weights, a job waits in the queue (shown as queued), idle sessions
are taken back for another role's job, a wait can give up, and only a superuser sets
the cap."""

from __future__ import annotations

import contextlib
import re
import threading
import time
import uuid

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from madlib_mop.tools.embedded import EmbeddedCluster
from tests.conftest import ADAM, REPO_ROOT, _free_port, connect, held_job, iris_grid, mlp_json

COMPILE = ADAM
SLOTS = "SELECT count(*) FROM madlib_mop.worker_sessions"  # every database's: the library is preloaded


@pytest.fixture(scope="module")
def data(extension_dsn, allow_worker_role):
    analyst = f"pool_analyst_{uuid.uuid4().hex[:6]}"
    allow_worker_role(analyst)
    database = conninfo_to_dict(extension_dsn)["dbname"]
    with psycopg.connect(extension_dsn, autocommit=True) as conn:
        conn.execute("SET search_path = public, madlib_mop")
        iris_grid(conn)
        conn.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(analyst)))
        conn.execute(sql.SQL("GRANT USAGE ON SCHEMA madlib_mop TO {0}; GRANT CREATE ON SCHEMA public TO {0}; "
                             "GRANT SELECT ON ALL TABLES IN SCHEMA public TO {0}").format(sql.Identifier(analyst)))
        # Every test's reference: the job on as many workers as segments.
        conn.execute("SELECT madlib_keras_fit_multiple_model('iris_packed', 'reference', 'mst', 3)")
    yield extension_dsn, analyst, database
    with psycopg.connect(extension_dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("ALTER DATABASE {} RESET madlib_mop.max_worker_sessions").format(
            sql.Identifier(database)))
        conn.execute("DELETE FROM madlib_mop.jobs WHERE owner = %s", (analyst,))
        conn.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(analyst)))
        conn.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(analyst)))


def _cap(dsn, database, value):
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("ALTER DATABASE {} SET madlib_mop.max_worker_sessions = {}").format(
            sql.Identifier(database), sql.Literal(value)))


def _as(dsn, role, notices=None):
    conn = psycopg.connect(dsn, autocommit=True)
    conn.execute(sql.SQL("SET ROLE {}").format(sql.Identifier(role)))
    conn.execute("SET search_path = public, madlib_mop")
    if notices is not None:
        conn.add_notice_handler(lambda d: notices.append(d.message_primary))
    return conn


def _recorded(errors, function):
    def run(*args):
        try:
            function(*args)
        except BaseException as error:  # the test asserts there was none
            errors.append(error)
    return run


def _no_slots_held(conn, timeout=30.0):
    """Idle worker sessions outlive the sessions that opened them (kept for their role):
    ended here, so that a test starts with every slot free."""
    deadline = time.monotonic() + timeout
    while conn.execute(SLOTS).fetchone()[0]:
        # (again: a session handed over a moment ago may not show as idle yet)
        conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                     "WHERE application_name = 'madlib_mop idle worker'")
        assert time.monotonic() < deadline, "worker sessions still hold slots"
        time.sleep(0.1)


@contextlib.contextmanager
def _peak_sessions(dsn):
    """The worker sessions alive (every database's), sampled while the block runs: a list
    that holds them when the block ends."""
    peak: list[int] = []
    done = threading.Event()

    def watch():
        with connect(dsn) as watcher:
            while not done.is_set():
                peak.append(watcher.execute(SLOTS).fetchone()[0])
                time.sleep(0.02)
    watching = threading.Thread(target=watch)
    watching.start()
    try:
        yield peak
    finally:
        done.set()
        watching.join()


def _queued_row(watcher, out, deadline):
    """(state, queue_position) of the job writing public.<out> once it is queued, or as it
    is at `deadline`."""
    row = None
    while time.monotonic() < deadline:
        row = watcher.execute("SELECT state, queue_position FROM madlib_mop.job_progress "
                              "WHERE model_output_table = %s", (f"public.{out}",)).fetchone()
        if row and row[0] == "queued":
            break
        time.sleep(0.05)
    return row


def _weights(conn, out):
    return dict(conn.execute(sql.SQL("SELECT mst_key, model_weights FROM {} ORDER BY 1").format(
        sql.Identifier(out))).fetchall())


def _fit(conn, out, iterations=3):
    conn.execute("SELECT madlib_keras_fit_multiple_model('iris_packed', %s, 'mst', %s)", (out, iterations))


def _kept_decoded(conn, out):
    return {r[0] for r in conn.execute(sql.SQL("SELECT DISTINCT (result->>'in_memory')::bool FROM {}")
                                       .format(sql.Identifier(f"{out}_mop_visits")))}


def _pids(conn, out):
    return {r[0] for r in conn.execute(sql.SQL("SELECT DISTINCT (result->>'pid')::int FROM {}").format(
        sql.Identifier(f"{out}_mop_visits")))}


def test_a_job_on_fewer_workers_than_segments_gives_the_same_weights(data):
    dsn, _, database = data
    _cap(dsn, database, 1)
    with connect(dsn) as conn:
        _no_slots_held(conn)  # the sessions of the module's set-up have ended
        with _peak_sessions(dsn) as peak:
            _fit(conn, "one_worker")
        assert _weights(conn, "one_worker") == _weights(conn, "reference")
        assert len(_pids(conn, "one_worker")) == 1
        assert conn.execute("SELECT segments FROM job_progress WHERE model_output_table = "
                            "'public.one_worker'").fetchone()[0] == 2
    assert max(peak) <= 1  # the cap held: never more than one worker session


def test_a_job_waits_in_the_queue_then_runs(data):
    dsn, analyst, database = data
    _cap(dsn, database, 1)
    notices: list[str] = []
    errors: list[BaseException] = []
    with connect(dsn) as first, _as(dsn, analyst, notices) as second:
        _no_slots_held(first)
        # The first job holds the one slot: its next hop waits for the test's lock.
        blocker = threading.Thread(target=_recorded(errors, _fit), args=(first, "holding", 2))
        with connect(dsn) as watcher:
            blocker.start()
            with held_job(watcher, "holding", 1):
                deadline = time.monotonic() + 60
                waiter = threading.Thread(target=_recorded(errors, _fit), args=(second, "waiting", 3))
                waiter.start()
                assert _queued_row(watcher, "waiting", deadline) == ("queued", 1)
                assert watcher.execute(SLOTS).fetchone()[0] == 1
            blocker.join()
            waiter.join()
        assert not errors, errors
        assert any("queued for a worker session (position 1" in n for n in notices), notices
        assert second.execute("SELECT state FROM job_progress WHERE model_output_table = "
                              "'public.waiting'").fetchone()[0] == "finished"
        assert _weights(second, "waiting") == _weights(first, "reference")


def test_idle_workers_are_taken_back_for_another_roles_job(data):
    dsn, analyst, database = data
    _cap(dsn, database, 2)
    with connect(dsn) as owner:
        _fit(owner, "kept_warm")  # its two sessions stay, idle, for this session's next job
        kept = _pids(owner, "kept_warm")
        assert len(kept) == 2
        with _as(dsn, analyst) as other:
            _fit(other, "taken_back")
            assert len(_pids(other, "taken_back")) == 2
            assert _weights(other, "taken_back") == _weights(owner, "reference")
        alive = owner.execute("SELECT count(*) FROM pg_stat_activity WHERE pid = ANY(%s)",
                              (list(kept),)).fetchone()[0]
        assert alive == 0


def test_a_roles_next_job_starts_warm_from_another_session(data):
    """Idle worker sessions are kept for their role, not for the session that opened them:
    they outlive it, and the role's next job, from a new session, runs on them (TensorFlow
    imported, programs traced), with the same weights."""
    dsn, analyst, database = data
    _cap(dsn, database, 4)
    with connect(dsn) as admin:
        _no_slots_held(admin)
        with _as(dsn, analyst) as first:
            first.execute("SET madlib_mop.worker_memory_mb = 0")  # keep no buffers decoded
            _fit(first, "warm_first")
            opened = _pids(first, "warm_first")
        assert len(opened) == 2 and _kept_decoded(admin, "warm_first") == {False}
        idle = {pid for pid, in admin.execute(
            "SELECT pid FROM pg_stat_activity WHERE usename = %s AND application_name = "
            "'madlib_mop idle worker'", (analyst,))}
        assert idle == opened  # the session that opened them has ended; they have not
        with _as(dsn, analyst) as second:
            _fit(second, "warm_second")
            assert _pids(second, "warm_second") == opened
            assert _weights(second, "warm_second") == _weights(admin, "reference")
        # The settings are the adopting call's, not those of the session that opened them.
        assert _kept_decoded(admin, "warm_second") == {True}
        # A job of another role gets sessions of its own, not this role's idle ones.
        _fit(admin, "other_role")
        assert not _pids(admin, "other_role") & opened


def test_a_wait_gives_up_after_the_timeout(data):
    dsn, analyst, database = data
    _cap(dsn, database, 1)
    with connect(dsn) as first, _as(dsn, analyst) as second, connect(dsn) as watcher:
        _no_slots_held(first)
        blocker = threading.Thread(target=_fit, args=(first, "holding_again", 2))
        blocker.start()
        with held_job(watcher, "holding_again", 1):
            second.execute("SET madlib_mop.queue_timeout_seconds = 1")
            with pytest.raises(psycopg.Error) as caught:
                _fit(second, "gave_up", 2)
        blocker.join()
    assert caught.value.diag.sqlstate == "53000"
    assert "waited 1s for a worker session" in caught.value.diag.message_primary
    assert "resume" in caught.value.diag.message_hint


def test_only_a_superuser_sets_the_cap(data):
    dsn, analyst, _ = data
    with _as(dsn, analyst) as conn:
        conn.execute("SELECT madlib_mop._mop_max_worker_sessions()")  # the library declares it
        with pytest.raises(psycopg.Error) as caught:
            conn.execute("SET madlib_mop.max_worker_sessions = 100")
        assert caught.value.diag.sqlstate == "42501"
    with connect(dsn) as conn:
        conn.execute("SET madlib_mop.max_worker_sessions = 100")
        assert conn.execute("SELECT madlib_mop._mop_max_worker_sessions()").fetchone()[0] == 100


def test_the_queue_serves_the_role_with_fewer_sessions_first(data):
    """Role A holds every slot and queues a second job; role B queues one after it: B's
    job is served first.  When A's first job ends, both waiting jobs get a turn."""
    dsn, analyst, database = data
    _cap(dsn, database, 2)
    errors: list[BaseException] = []
    with connect(dsn) as a1, connect(dsn) as a2, _as(dsn, analyst) as b, connect(dsn) as watcher:
        _no_slots_held(watcher)
        first = threading.Thread(target=_recorded(errors, _fit), args=(a1, "a_first", 3))
        first.start()
        with held_job(watcher, "a_first", 1):
            assert watcher.execute(SLOTS).fetchone()[0] == 2
            second = threading.Thread(target=_recorded(errors, _fit), args=(a2, "a_second", 3))
            second.start()
            _wait_for_state(watcher, "a_second", "queued")
            other = threading.Thread(target=_recorded(errors, _fit), args=(b, "b_only", 3))
            other.start()
            _wait_for_state(watcher, "b_only", "queued")
            time.sleep(0.6)  # both have looked at their turn since
            positions = dict(watcher.execute(
                "SELECT model_output_table, queue_position FROM madlib_mop.jobs "
                "WHERE model_output_table IN ('public.a_second', 'public.b_only')").fetchall())
            assert positions == {"public.b_only": 1, "public.a_second": 2}
        for thread in (first, second, other):
            thread.join()
        assert not errors, errors
        reference = _weights(watcher, "reference")
        for out in ("a_first", "a_second", "b_only"):
            assert _weights(watcher, out) == reference
        assert watcher.execute("SELECT count(*) FROM madlib_mop.jobs WHERE state = 'finished' AND "
                               "model_output_table IN ('public.a_second', 'public.b_only')").fetchone()[0] == 2


def _wait_for_state(conn, out, state, timeout=60.0):
    deadline = time.monotonic() + timeout
    while conn.execute("SELECT state FROM madlib_mop.jobs WHERE model_output_table = %s",
                       (f"public.{out}",)).fetchone() != (state,):
        assert time.monotonic() < deadline, f"{out} is not {state}"
        time.sleep(0.05)


def test_a_job_that_cannot_fit_is_refused_up_front(data):
    dsn, _, database = data
    notices: list[str] = []
    _cap(dsn, database, 2)
    with connect(dsn, notices) as conn:
        _fit(conn, "estimated", 1)
    estimate = next(n for n in notices if "each worker session needs about" in n)
    # The packed tables' partitions hold the buffers (the partitioned parent holds none).
    buffers = float(re.search(r"buffers ([0-9.]+)\)", estimate).group(1))
    assert 0 < buffers < 1 and "TensorFlow 900" in estimate, estimate
    # So many sessions allowed that each may use less than TensorFlow alone needs.
    _cap(dsn, database, 5000)
    with connect(dsn) as conn:
        with pytest.raises(psycopg.Error) as caught:
            _fit(conn, "too_big", 1)
        assert caught.value.diag.sqlstate == "53000"
        assert "would each need about" in caught.value.diag.message_primary
        assert "max_worker_sessions" in caught.value.diag.message_hint
        assert conn.execute("SELECT to_regclass('public.too_big'), to_regclass('public.too_big_info')"
                            ).fetchone() == (None, None)
        assert conn.execute("SELECT count(*) FROM madlib_mop.jobs WHERE model_output_table = "
                            "'public.too_big'").fetchone()[0] == 0
    _cap(dsn, database, 2)


def test_a_model_too_big_for_worker_memory_mb_is_refused_up_front(data):
    """madlib_mop.worker_memory_mb bounds what a worker holds beyond TensorFlow: a model of
    800,003 parameters (Adam: 9.6 MB of state, held about 3 times) does not fit 16 MB and
    is refused before a job exists; with the setting its HINT names, it trains, and its
    buffers get what the model leaves."""
    dsn, _, database = data
    _cap(dsn, database, 2)
    notices: list[str] = []
    with connect(dsn, notices) as conn:
        conn.execute("SELECT load_keras_model('arch', %s::json)", (mlp_json(4, 100_000, 3),))
        big = conn.execute("SELECT max(model_id) FROM arch").fetchone()[0]
        conn.execute("SELECT load_model_selection_table('arch', 'mst_big', ARRAY[%s], ARRAY[%s], "
                     "ARRAY['batch_size=50, epochs=1'])", (big, COMPILE))
        conn.execute("SET madlib_mop.worker_memory_mb = 16")
        with pytest.raises(psycopg.Error) as caught:
            conn.execute("SELECT madlib_keras_fit_multiple_model('iris_packed', 'big_model', 'mst_big', 1)")
        diag = caught.value.diag
        assert diag.sqlstate == "53000" and "more than madlib_mop.worker_memory_mb (16 MB)" in diag.message_primary
        assert conn.execute("SELECT count(*) FROM madlib_mop.jobs WHERE model_output_table = "
                            "'public.big_model'").fetchone()[0] == 0
        wanted = int(re.search(r"SET madlib_mop.worker_memory_mb = (\d+);", diag.message_hint).group(1))
        models = float(re.search(r"need about (\d+) MB", diag.message_primary).group(1))
        assert 27 <= models <= 30 and wanted > models
        conn.execute(f"SET madlib_mop.worker_memory_mb = {wanted}")
        conn.execute("SELECT madlib_keras_fit_multiple_model('iris_packed', 'big_model', 'mst_big', 1)")
        conn.execute("RESET madlib_mop.worker_memory_mb")
    estimate = next(n for n in notices if "each worker session needs about" in n)
    shown = re.search(r"models ([0-9.]+), buffers ([0-9.]+)\)", estimate)
    assert float(shown.group(1)) + float(shown.group(2)) <= wanted
    _cap(dsn, database, 2)


def test_cancelling_a_job_or_killing_a_worker_touches_no_other_job(data):
    """Two roles train at once: one role's job is cancelled, and a worker of the other's is
    terminated; the second finishes with the reference's weights, the first is resumable."""
    dsn, analyst, database = data
    _cap(dsn, database, 4)
    errors: list[BaseException] = []
    with connect(dsn) as mine, _as(dsn, analyst) as theirs, connect(dsn) as watcher, \
            connect(dsn) as second_watcher:
        _no_slots_held(watcher)
        cancelled = threading.Thread(target=_recorded(errors, _fit), args=(mine, "cancelled", 3))
        cancelled.start()
        with held_job(watcher, "cancelled", 1):
            kept = threading.Thread(target=_recorded(errors, _fit), args=(theirs, "kept", 3))
            kept.start()
            with held_job(second_watcher, "kept", 1):
                coordinator = watcher.execute("SELECT coordinator_pid FROM madlib_mop.jobs WHERE "
                                              "model_output_table = 'public.cancelled'").fetchone()[0]
                job = watcher.execute("SELECT job_id FROM madlib_mop.jobs WHERE "
                                      "model_output_table = 'public.kept'").fetchone()[0]
                worker = watcher.execute("SELECT pid FROM pg_stat_activity WHERE application_name = %s",
                                         (f"madlib_mop worker job {job} #0",)).fetchone()[0]
                assert watcher.execute("SELECT pg_cancel_backend(%s), pg_terminate_backend(%s)",
                                       (coordinator, worker)).fetchone() == (True, True)
        cancelled.join()
        kept.join()
        assert len(errors) == 1 and errors[0].diag.sqlstate == "57014"  # the cancelled call only
        assert _weights(watcher, "kept") == _weights(watcher, "reference")
        states = dict(watcher.execute("SELECT model_output_table, state FROM madlib_mop.job_progress "
                                      "WHERE model_output_table IN ('public.cancelled', 'public.kept')"))
        assert states == {"public.cancelled": "interrupted", "public.kept": "finished"}
        # The cancelled job resumes to the same weights.
        job = watcher.execute("SELECT job_id FROM madlib_mop.jobs WHERE model_output_table = "
                              "'public.cancelled'").fetchone()[0]
        mine.execute("CALL resume(%s)", (job,))
        assert _weights(mine, "cancelled") == _weights(mine, "reference")


def test_predict_runs_on_the_pool_with_fewer_workers_than_parts(data):
    dsn, _, database = data
    predictions = {}
    for cap, out in ((1, "predicted_on_one"), (4, "predicted_on_two")):
        _cap(dsn, database, cap)
        with connect(dsn) as conn:
            _no_slots_held(conn)
            conn.execute("SET madlib_mop.segments = 2")
            conn.execute("SELECT madlib_keras_predict('reference', 'iris', 'id', 'attributes', %s, "
                         "'prob', FALSE, 1)", (out,))
            predictions[cap] = conn.execute(sql.SQL("SELECT * FROM {} ORDER BY 1, 5").format(
                sql.Identifier(out))).fetchall()
            # Its sessions hold their slots, kept idle for this session's next call.
            assert conn.execute(SLOTS).fetchone()[0] == min(cap, 2)
    assert len(predictions[1]) == 150 * 3 and predictions[1] == predictions[4]


@pytest.fixture(scope="module")
def other_database(data, server_dsn):
    """A second database of the server with the extension and the same data and configurations."""
    dsn, _, _ = data
    name = f"t_pool_other_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(server_dsn, autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    other = make_conninfo(dsn, dbname=name)
    try:
        with psycopg.connect(other, autocommit=True) as conn:
            conn.execute("CREATE SCHEMA madlib_mop; CREATE EXTENSION madlib_mop SCHEMA madlib_mop CASCADE")
            conn.execute("SET search_path = public, madlib_mop")
            iris_grid(conn)
        yield other, name
    finally:
        with psycopg.connect(server_dsn, autocommit=True) as admin:
            admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


def test_two_databases_share_one_cap(data, other_database):
    """The cap counts the worker sessions of every database (the library is preloaded): a
    job of another database waits, shown as queued there, while this database's job holds
    every slot, then runs; the server's worker sessions never exceed the cap."""
    dsn, _, database = data
    other, other_name = other_database
    for target, name in ((dsn, database), (other, other_name)):
        _cap(target, name, 2)
    notices: list[str] = []
    errors: list[BaseException] = []
    with connect(dsn) as first, connect(other, notices) as second, connect(dsn) as watcher:
        assert watcher.execute("SELECT madlib_mop._mop_pool_shared()").fetchone()[0]
        _no_slots_held(first)
        blocker = threading.Thread(target=_recorded(errors, _fit), args=(first, "holding_both", 2))
        with _peak_sessions(dsn) as peak:
            blocker.start()
            with held_job(watcher, "holding_both", 1), connect(other) as other_watcher:
                waiter = threading.Thread(target=_recorded(errors, _fit), args=(second, "from_elsewhere", 3))
                waiter.start()
                assert _queued_row(other_watcher, "from_elsewhere", time.monotonic() + 60) == ("queued", 1)
                holders = watcher.execute("SELECT database, count(*) FROM madlib_mop.worker_sessions "
                                          "GROUP BY 1").fetchall()
                assert holders == [(database, 2)]  # this database's job holds both slots
            blocker.join()
            waiter.join()
        assert not errors, errors
        assert any("queued for a worker session (position 1; all 2 of this server's are taken, "
                   "2 of them by other databases)" in n for n in notices), notices
        assert second.execute("SELECT state FROM madlib_mop.job_progress WHERE model_output_table = "
                              "'public.from_elsewhere'").fetchone()[0] == "finished"
        assert _weights(second, "from_elsewhere") == _weights(first, "reference")
    assert max(peak) <= 2  # never more than the cap, both databases together


def test_without_the_preloaded_library_each_database_caps_its_own(server_host):
    """A server that does not preload the library: the slots are each database's advisory
    locks, and every call says so in a NOTICE with the line a DBA adds."""
    if not isinstance(server_host, EmbeddedCluster):
        pytest.skip("starts a server of its own on this machine")
    server = EmbeddedCluster(REPO_ROOT / ".pg-no-preload", _free_port())
    server.destroy()
    try:
        server.start(options="-c shared_preload_libraries=pg_cron")
        notices: list[tuple[str, str]] = []
        with psycopg.connect(server.dsn("madlib_mop"), autocommit=True) as conn:
            assert conn.execute("SHOW shared_preload_libraries").fetchone()[0] == "pg_cron"
            conn.add_notice_handler(lambda diag: notices.append((diag.message_primary, diag.message_hint)))
            conn.execute("CREATE SCHEMA madlib_mop; CREATE EXTENSION madlib_mop SCHEMA madlib_mop CASCADE")
            conn.execute("SET search_path = public, madlib_mop")
            assert conn.execute("SELECT _mop_pool_shared()").fetchone()[0] is False
            conn.execute("SET madlib_mop.worker_idle_seconds = 0")  # the catalog call keeps none
            iris_grid(conn)
            conn.execute("RESET madlib_mop.worker_idle_seconds")
            conn.execute("SELECT madlib_keras_fit_multiple_model('iris_packed', 'fallback', 'mst', 1)")
            kept = conn.execute("SELECT database, state FROM worker_sessions").fetchall()
            locks = conn.execute("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' "
                                 "AND classid = 1297043543 AND objsubid = 2 AND granted").fetchone()[0]
        said = [hint for message, hint in notices if "counts this database's only" in message]
        assert said and "shared_preload_libraries = 'madlib_mop'" in said[0]
        assert kept == [("madlib_mop", "idle")] * 2 and locks == 2  # the job's two, kept for its role
    finally:
        server.destroy()


class _SlowWorker:
    """What `engine.pool` asks of a worker (it is engine-independent): calls run on it,
    cancel() and close()."""
    segment = 0

    def __init__(self):
        self.ran, self.cancelled, self.closed, self.release = [], False, False, threading.Event()

    def cancel(self):
        self.cancelled = True
        self.release.set()

    def close(self):
        self.closed = True


def test_a_stopped_pool_drops_the_calls_not_started():
    """A job that stops (a cancel) leaves its workers no call to run unwaited for: the one
    running is cancelled, those queued behind it are dropped; `ready` prefers a worker that
    runs nothing."""
    from madlib_mop.engine.pool import WorkerPool

    busy, free = _SlowWorker(), _SlowWorker()
    pool = WorkerPool([busy, free])
    pool.submit(0, "first", lambda w: (w.release.wait(10), w.ran.append("first")))
    for name in ("second", "third"):
        pool.submit(0, name, lambda w, name=name: w.ran.append(name))
    deadline = time.monotonic() + 10
    while not pool.threads[0].running and time.monotonic() < deadline:
        time.sleep(0.01)
    assert pool.ready() == [1]
    assert pool.call_each([lambda w: "built"], lambda: None, pool.ready()) == ["built"]
    pool.stop()
    for thread in pool.threads:
        thread.join(timeout=10)
    assert busy.cancelled and busy.closed and free.closed
    assert busy.ran == ["first"]  # second and third never ran
