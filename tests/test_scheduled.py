"""Scheduled model selection: the output policy of a repeated call, and pg_cron firing a fit.

A scheduled call runs the same statement again and again.  Its policy:
- an unfinished job of the same call is continued (interrupted runs are not started over);
- a finished output is an error (`if_output_exists => 'error'`, the default), or the call
  trains into the next free `<out>_v<N>` (`'new_version'`).
The pg_cron test waits for real firings (pg_cron 1.4: once a minute) on the server.
"""

from __future__ import annotations

import threading
import time

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from madlib_mop.tools.demo import load_iris
from tests.conftest import _server_kind, connect as _connect, held_job

ARCH = """{"class_name": "Sequential", "config": {"name": "mlp", "layers": [
  {"class_name": "Dense", "config": {"units": 8, "activation": "relu", "batch_input_shape": [null, 4]}},
  {"class_name": "Dense", "config": {"units": 3, "activation": "softmax"}}]}}"""


@pytest.fixture(scope="module")
def data(extension_dsn):
    with _connect(extension_dsn) as conn:
        iris = load_iris(conn)
        conn.execute("SELECT training_preprocessor_dl(%s, 'iris_packed', 'class_text', "
                     "'attributes', distribution_rules => '2')", (iris,))
        conn.execute("SELECT validation_preprocessor_dl(%s, 'iris_valid', 'class_text', "
                     "'attributes', 'iris_packed')", (iris,))
        conn.execute("SELECT load_keras_model('arch', %s)", (ARCH,))
        conn.execute("SELECT load_model_selection_table('arch', 'mst', ARRAY[1], "
                     "ARRAY[$$loss='categorical_crossentropy', optimizer='Adam(lr=0.01)', "
                     "metrics=['accuracy']$$], ARRAY['batch_size=16'])")
    return extension_dsn


def _fit_sql(out: str, iterations: int = 1, policy: str | None = None) -> str:
    return (f"SELECT madlib_keras_fit_multiple_model('iris_packed', '{out}', 'mst', {iterations}, "
            "FALSE, 'iris_valid', 1" + (f", if_output_exists => '{policy}'" if policy else "") + ")")


def _jobs_of(conn, out_prefix: str):
    return conn.execute("SELECT job_id, model_output_table, state FROM jobs "
                        "WHERE model_output_table LIKE %s ORDER BY job_id",
                        (f"public.{out_prefix}%",)).fetchall()


def test_a_finished_output_is_an_error_by_default(data):
    with _connect(data) as conn:
        conn.execute(_fit_sql("kept"))
        with pytest.raises(psycopg.errors.DuplicateTable) as error:
            conn.execute(_fit_sql("kept"))
        assert "already exists" in error.value.diag.message_primary
        assert "if_output_exists => 'new_version'" in error.value.diag.message_hint
        assert len(_jobs_of(conn, "kept")) == 1


def test_new_version_writes_the_next_free_name(data):
    notices = []
    with _connect(data) as conn:
        conn.add_notice_handler(lambda d: notices.append(d.message_primary))
        for _ in range(3):
            conn.execute(_fit_sql("nightly", policy="new_version"))
        outputs = [row[1] for row in _jobs_of(conn, "nightly")]
        assert outputs == ["public.nightly", "public.nightly_v2", "public.nightly_v3"]
        for table in ("nightly_v2", "nightly_v2_info", "nightly_v2_summary", "nightly_v3"):
            assert conn.execute("SELECT count(*) FROM " + table).fetchone()[0] >= 1
        assert any("training into public.nightly_v3" in n for n in notices), notices
        # the versions are trained alike: same configuration and seed, same weights
        weights = {t: conn.execute(f"SELECT model_weights FROM {t}").fetchone()[0]
                   for t in ("nightly", "nightly_v2", "nightly_v3")}
        assert weights["nightly"] == weights["nightly_v2"] == weights["nightly_v3"]


def test_new_version_continues_an_interrupted_run_instead_of_starting_another(data):
    notices = []
    with _connect(data) as conn, _connect(data) as holder:
        conn.execute(_fit_sql("resumed", policy="new_version"))
        pid = conn.execute("SELECT pg_backend_pid()").fetchone()[0]
        outcome = {}

        def run():
            try:
                conn.execute(_fit_sql("resumed", iterations=3, policy="new_version"))
            except psycopg.Error as error:
                outcome["error"] = error

        second = threading.Thread(target=run)
        second.start()
        with held_job(holder, "resumed_v2", done=2):
            holder.execute("SELECT pg_cancel_backend(%s)", (pid,))
        second.join(timeout=120)
        assert isinstance(outcome.get("error"), psycopg.errors.QueryCanceled)
        assert [r[1:] for r in _jobs_of(conn, "resumed")] == [
            ("public.resumed", "finished"), ("public.resumed_v2", "interrupted")]
        conn.add_notice_handler(lambda d: notices.append(d.message_primary))
        # another call of the family (other arguments) leaves the interrupted one alone
        conn.execute(_fit_sql("resumed", iterations=2, policy="new_version"))
        assert any("started with other arguments: it is left as it is" in n for n in notices)
        conn.execute(_fit_sql("resumed", iterations=3, policy="new_version"))
        assert [r[1:] for r in _jobs_of(conn, "resumed")] == [
            ("public.resumed", "finished"), ("public.resumed_v2", "finished"),
            ("public.resumed_v3", "finished")]
        assert any("continuing job" in n for n in notices), notices
        assert conn.execute("SELECT array_length(training_loss, 1) FROM resumed_v2_info").fetchone()[0] == 3


def test_a_bad_policy_is_refused_before_anything_is_written(data):
    with _connect(data) as conn:
        with pytest.raises(psycopg.errors.InvalidParameterValue) as error:
            conn.execute(_fit_sql("bad_policy", policy="overwrite"))
        assert "'error' or 'new_version'" in error.value.diag.message_hint
        with pytest.raises(psycopg.errors.InvalidParameterValue):
            conn.execute("SELECT madlib_keras_fit_multiple_model('iris_packed', 'bad_policy', 'mst', 1, "
                         "warm_start => TRUE, if_output_exists => 'new_version')")
        long_name = "n" * 50  # fits the job's tables (51 bytes at most), not its versions'
        with pytest.raises(psycopg.errors.InvalidParameterValue) as error:
            conn.execute(_fit_sql(long_name, policy="new_version"))
        assert "too long to add \"_v99_mop_" in error.value.diag.message_primary
        assert "at most 47 bytes" in error.value.diag.message_hint
        assert conn.execute("SELECT to_regclass('bad_policy') IS NULL").fetchone()[0]
        assert _jobs_of(conn, "bad_policy") == []


# ---- pg_cron ------------------------------------------------------------------------------------
def _cron_dsn(server_dsn: str) -> str | None:
    """The database pg_cron runs in, when the server has pg_cron loaded."""
    with psycopg.connect(server_dsn, autocommit=True) as conn:
        loaded = "pg_cron" in conn.execute("SHOW shared_preload_libraries").fetchone()[0]
        if not loaded:
            return None
        database = conn.execute("SHOW cron.database_name").fetchone()[0]
    return make_conninfo(server_dsn, dbname=database)


def _runs(cron, jobid, started=False):
    """The job's runs: those that ended (status, message), or also those under way."""
    return cron.execute("SELECT status, return_message FROM cron.job_run_details "
                        "WHERE jobid = %s AND (%s OR status IN ('succeeded', 'failed')) "
                        "ORDER BY runid", (jobid, started)).fetchall()


def _wait_for_runs(cron, jobid, count, timeout=150.0, started=False):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        runs = _runs(cron, jobid, started)
        if len(runs) >= count:
            return runs
        time.sleep(1)
    raise AssertionError(f"cron job {jobid}: {count} runs expected within {timeout:g}s, "
                         f"got {_runs(cron, jobid)}")


def test_pg_cron_runs_a_nightly_fit_continues_it_after_an_interruption_and_reports_errors(
        data, server_dsn):
    cron_dsn = _cron_dsn(server_dsn)
    if cron_dsn is None:
        assert _server_kind() == "dsn", "the embedded server and the image's must load pg_cron"
        pytest.skip("this server does not load pg_cron")
    database = conninfo_to_dict(data)["dbname"]
    with psycopg.connect(cron_dsn, autocommit=True) as cron, _connect(data) as conn:
        cron.execute("CREATE EXTENSION IF NOT EXISTS pg_cron")
        fit = ("CALL madlib_mop.fit_multiple('iris_packed', 'cron_models', 'mst', 6, FALSE, "
               "'iris_valid', 1, if_output_exists => 'new_version')")
        broken = "CALL madlib_mop.fit_multiple('no_such_table', 'cron_broken', 'mst', 1)"
        jobs = {}
        try:
            for name, command in (("fit", fit), ("broken", broken)):
                jobs[name] = cron.execute(
                    "SELECT cron.schedule_in_database(%s, '* * * * *', %s, %s)",
                    (f"madlib_mop_test_{name}_{database}", command, database)).fetchone()[0]
            # The first run: held once it has trained 4 sub-epochs, then its session is ended
            # (as a server restart would end it).
            with held_job(conn, "cron_models", done=4, timeout=150):
                pid = conn.execute("SELECT coordinator_pid FROM jobs WHERE model_output_table = "
                                   "'public.cron_models'").fetchone()[0]
                conn.execute("SELECT pg_terminate_backend(%s)", (pid,))
            broken_runs = _wait_for_runs(cron, jobs["broken"], 1)
            cron.execute("SELECT cron.unschedule(%s)", (jobs["broken"],))
            first = _wait_for_runs(cron, jobs["fit"], 1)
            assert first[0][0] == "failed"
            # Paused, while this session trains a job of the same role: its worker sessions
            # stay idle, kept for the role, and the next firing runs on them.
            cron.execute("SELECT cron.alter_job(%s, active => false)", (jobs["fit"],))
            conn.execute("SELECT madlib_mop.madlib_keras_fit_multiple_model('iris_packed', "
                         "'cron_warm', 'mst', 1)")
            idle = {pid for pid, in conn.execute(
                "SELECT pid FROM pg_stat_activity WHERE usename = current_user "
                "AND application_name = 'madlib_mop idle worker'")}
            resumed_at = time.time()
            cron.execute("SELECT cron.alter_job(%s, active => true)", (jobs["fit"],))
            # The next firing continues the same job: no second version is made.  No third
            # firing: moved to January once the second has started (unscheduling would
            # cancel the run under way).
            _wait_for_runs(cron, jobs["fit"], 2, started=True)
            cron.execute("SELECT cron.alter_job(%s, schedule => '0 0 1 1 *')", (jobs["fit"],))
            runs = _wait_for_runs(cron, jobs["fit"], 2)
        finally:
            for jobid in jobs.values():
                if cron.execute("SELECT 1 FROM cron.job WHERE jobid = %s", (jobid,)).fetchone():
                    cron.execute("SELECT cron.unschedule(%s)", (jobid,))
        assert runs[1] == ("succeeded", "CALL"), runs
        warm = {pid for pid, in conn.execute(
            "SELECT DISTINCT (result->>'pid')::int FROM cron_models_mop_visits "
            "WHERE (result->>'finished_at')::float > %s", (resumed_at,))}
        assert warm and warm <= idle, (warm, idle)
        assert [r[1:] for r in _jobs_of(conn, "cron_models")] == [("public.cron_models", "finished")]
        assert conn.execute("SELECT count(*) FROM cron_models_info WHERE "
                            "array_length(validation_loss, 1) = 6").fetchone()[0] == 1
        assert conn.execute("SELECT subepochs_done FROM jobs WHERE model_output_table = "
                            "'public.cron_models'").fetchone()[0] == 12
        status, message = broken_runs[0]
        assert status == "failed"
        assert "source_table: Input table 'no_such_table' does not exist" in message, message
