"""The worker pool, the queue and the jobs as Prometheus metrics (`madlib-mop exporter`,
the dashboard's /metrics), read with prometheus_client's own parser while a job runs and
after it: busy sessions, taken and free slots, jobs by state, sub-epochs finished, and a
histogram of sub-epoch seconds that counts every visit."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
import urllib.request

import psycopg
import pytest
from prometheus_client.parser import text_string_to_metric_families
from psycopg.conninfo import conninfo_to_dict

from madlib_mop.client.metrics import metrics_text
from madlib_mop.client.session import make_engine
from tests.conftest import REPO_ROOT, connect, held_job, mlp_json, packed_iris

COMPILE = "loss='categorical_crossentropy', optimizer='Adam(learning_rate=0.01)', metrics=['accuracy']"


@pytest.fixture(scope="module")
def prepared(extension_dsn):
    with connect(extension_dsn) as conn:
        packed_iris(conn)
        conn.execute("SELECT load_keras_model('arch', %s::json)", (mlp_json(4, 8, 3),))
        conn.execute("SELECT load_model_selection_table('arch', 'mst', ARRAY[1], ARRAY[%s], "
                     "ARRAY['batch_size=8, epochs=1', 'batch_size=16, epochs=1'])", (COMPILE,))
    return extension_dsn


def _samples(text: str) -> dict[tuple, float]:
    """{(sample name, sorted labels): value} of a scrape."""
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def _value(samples: dict, name: str, **labels) -> float:
    return samples[(name, tuple(sorted(labels.items())))]


def test_metrics_of_a_running_job_and_after_it(prepared):
    dsn = prepared
    database = conninfo_to_dict(dsn)["dbname"]
    engine = make_engine(dsn)
    errors: list[BaseException] = []

    def fit():
        try:
            with connect(dsn) as conn:
                conn.execute("SELECT madlib_keras_fit_multiple_model('iris_packed', 'scraped', 'mst', 3)")
        except BaseException as error:  # the test asserts there was none
            errors.append(error)

    with connect(dsn) as watcher:
        runner = threading.Thread(target=fit)
        runner.start()
        with held_job(watcher, "scraped", 2):
            during = _samples(metrics_text(engine, "madlib_mop").decode())
        runner.join()
    assert not errors, errors
    assert _value(during, "madlib_mop_jobs", database=database, role="postgres", state="running") == 1
    busy = _value(during, "madlib_mop_worker_sessions", database=database, role="postgres", state="busy")
    assert busy == 2  # one worker per segment
    assert _value(during, "madlib_mop_worker_slots", database=database, state="taken") >= busy
    assert _value(during, "madlib_mop_subepochs_finished_total", database=database, role="postgres") >= 2

    after = _samples(metrics_text(engine, "madlib_mop").decode())
    with connect(dsn) as conn:
        visits = conn.execute("SELECT count(*), sum((result->'seconds'->>'total')::float8) "
                              "FROM scraped_mop_visits").fetchone()
        done = conn.execute("SELECT sum(subepochs_done) FROM jobs WHERE owner = current_user").fetchone()[0]
    assert visits[0] == 2 * 2 * 3  # models x segments x iterations
    assert _value(after, "madlib_mop_jobs", database=database, role="postgres", state="finished") >= 1
    assert _value(after, "madlib_mop_jobs", database=database, role="postgres", state="running") == 0
    assert _value(after, "madlib_mop_subepochs_finished_total", database=database, role="postgres") == done
    count = _value(after, "madlib_mop_subepoch_seconds_count", database=database, role="postgres")
    assert count >= visits[0]  # this job's visits, and any earlier job's of this database
    assert _value(after, "madlib_mop_subepoch_seconds_bucket", database=database, role="postgres",
                  le="+Inf") == count
    assert _value(after, "madlib_mop_subepoch_seconds_sum", database=database, role="postgres") >= visits[1]
    assert not [key for key in after if key[0] == "madlib_mop_calls_queued"]  # none waits now
    assert _value(after, "madlib_mop_queue_oldest_wait_seconds", database=database) == 0.0
    with psycopg.connect(dsn) as conn:
        cap = conn.execute("SELECT madlib_mop._mop_worker_cap()").fetchone()[0]
    assert _value(after, "madlib_mop_worker_slots", database=database, state="free") + \
        _value(after, "madlib_mop_worker_slots", database=database, state="taken") == cap


def test_the_exporter_command_serves_metrics(prepared):
    server = subprocess.Popen([sys.executable, "-m", "madlib_mop.client.cli", "--dsn", prepared,
                               "exporter", "--port", "0"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True, cwd=REPO_ROOT)
    try:
        line, deadline = "", time.monotonic() + 120
        while "http://" not in line and time.monotonic() < deadline:
            line = server.stdout.readline()
        address = line[line.index("http://"):].split()[0]
        with urllib.request.urlopen(address, timeout=60) as answer:
            assert answer.headers["Content-Type"].startswith("text/plain")
            families = {f.name for f in text_string_to_metric_families(answer.read().decode())}
    finally:
        server.send_signal(signal.SIGINT)
        # Read what it still writes while it stops: a child blocked on a full pipe never ends.
        said, _ = server.communicate(timeout=120)
    assert server.returncode == 0, said
    assert {"madlib_mop_worker_sessions", "madlib_mop_worker_slots", "madlib_mop_calls_queued",
            "madlib_mop_queue_oldest_wait_seconds", "madlib_mop_jobs", "madlib_mop_subepochs_finished",
            "madlib_mop_subepoch_seconds"} <= families
