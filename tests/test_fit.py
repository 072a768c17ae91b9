"""madlib_keras_fit_multiple_model end to end in a real server: outputs, reproducibility,
replay, failures of workers and of the coordinator, concurrent jobs, bad input."""

from __future__ import annotations

import threading
import time
import uuid

import numpy as np
import psycopg
import pytest
from psycopg import sql
from psycopg.rows import dict_row

from madlib_mop.job import state_store
from madlib_mop.tools.replay import replay
from tests.conftest import connect as _connect, coordinator_killed_mid_job, held_job, iris_table, mlp_json
from madlib_mop.job.schedule import visit_orders
from madlib_mop.runtime import fusion, training

import keras  # noqa: E402  (a missing Keras fails these tests, it does not skip them)

COMPILE_GRID = ("{'loss': ['categorical_crossentropy'], 'optimizer_params_list': ["
                "{'optimizer': ['Adam'], 'lr': [0.01, 0.05]}], 'metrics': ['accuracy']}")
FIT_GRID = "{'batch_size': [8, 16], 'epochs': [1]}"


@pytest.fixture(scope="module")
def data(extension_dsn):
    from sklearn.datasets import load_digits

    digits = load_digits()
    with psycopg.connect(extension_dsn, autocommit=True) as conn:
        conn.execute("SET search_path = public, madlib_mop")
        iris_table(conn)
        conn.execute("CREATE TABLE digits (id int, pixels real[], digit int)")
        with conn.cursor().copy("COPY digits FROM STDIN") as copy:
            for i, (x, y) in enumerate(zip(digits.data, digits.target)):
                copy.write_row((i, [float(v) for v in x], int(y)))
        conn.execute("SELECT training_preprocessor_dl('iris', 'iris_packed', 'class_text', "
                     "'attributes', distribution_rules => '2')")
        conn.execute("SELECT validation_preprocessor_dl('iris', 'iris_valid', 'class_text', "
                     "'attributes', 'iris_packed')")
        conn.execute("CREATE TABLE digits_train AS SELECT * FROM digits WHERE id % 5 <> 0")
        conn.execute("CREATE TABLE digits_test AS SELECT * FROM digits WHERE id % 5 = 0")
        conn.execute("SELECT training_preprocessor_dl('digits_train', 'digits_packed', 'digit', "
                     "'pixels', normalizing_const => 16, distribution_rules => '2')")
        conn.execute("SELECT validation_preprocessor_dl('digits_test', 'digits_valid', 'digit', "
                     "'pixels', 'digits_packed')")
        for inputs, hidden, classes in ((4, 8, 3), (64, 32, 10), (5, 8, 3), (4, 8, 2)):
            conn.execute("SELECT load_keras_model('arch', %s::json)", (mlp_json(inputs, hidden, classes),))
        conn.execute("SELECT generate_model_configs('arch', 'mst_iris', ARRAY[1], %s, %s)",
                     (COMPILE_GRID, FIT_GRID))
        conn.execute("SELECT generate_model_configs('arch', 'mst_digits', ARRAY[2], %s, %s)",
                     (COMPILE_GRID, "{'batch_size': [16], 'epochs': [1]}"))
    return extension_dsn


def _fit(dsn, out, mst="mst_iris", source="iris_packed", iterations=3, validation="iris_valid",
         seed=0, notices=None, procedure=False):
    with _connect(dsn) as conn:
        if notices is not None:
            conn.add_notice_handler(lambda diag: notices.append(diag.message_primary))
        statement = ("CALL fit_multiple(%s, %s, %s, %s, FALSE, %s, 1, seed => %s)" if procedure else
                     "SELECT madlib_keras_fit_multiple_model(%s, %s, %s, %s, FALSE, %s, 1, seed => %s)")
        conn.execute(statement, (source, out, mst, iterations, validation, seed))


def _weights(conn, out):
    return dict(conn.execute(sql.SQL("SELECT mst_key, model_weights FROM {} ORDER BY 1").format(
        sql.Identifier(out))).fetchall())


@pytest.fixture(scope="module")
def reference(data):
    """An uninterrupted job: every other run must end with these weights."""
    notices: list[str] = []
    _fit(data, "ref", notices=notices)
    with _connect(data) as conn:
        return _weights(conn, "ref"), notices


def test_outputs_follow_madlib(data, reference):
    weights, notices = reference
    with _connect(data) as conn:
        def columns(table: str) -> list[str]:
            return [r[0] for r in conn.execute(
                "SELECT attname FROM pg_attribute WHERE attrelid = %s::regclass AND attnum > 0 "
                "AND NOT attisdropped ORDER BY attnum", (table,))]
        assert columns("ref") == ["mst_key", "model_weights", "model_arch"]
        assert columns("ref_info")[:17] == [
            "mst_key", "model_id", "compile_params", "fit_params", "model_type", "model_size",
            "metrics_elapsed_time", "metrics_type", "loss_type", "training_metrics_final",
            "training_loss_final", "training_metrics", "training_loss", "validation_metrics_final",
            "validation_loss_final", "validation_metrics", "validation_loss"]
        assert columns("ref_summary")[:4] == ["source_table", "validation_table", "model", "model_info"]
        model = keras.models.model_from_json(mlp_json(4, 8, 3))
        assert sorted(weights) == [1, 2, 3, 4]
        assert all(len(w) == 4 * model.count_params() for w in weights.values())
        info = conn.cursor(row_factory=dict_row).execute("SELECT * FROM ref_info ORDER BY mst_key").fetchall()
        for row in info:
            assert row["metrics_type"] == ["accuracy"] and row["loss_type"] == "categorical_crossentropy"
            assert len(row["training_loss"]) == len(row["validation_metrics"]) == 3
            assert row["metrics_iters"] == [1, 2, 3]
            assert row["training_loss_final"] == row["training_loss"][-1]
            assert 0 <= row["validation_metrics_final"] <= 1
            assert row["metrics_elapsed_time"] == sorted(row["metrics_elapsed_time"])
        # The best configuration learns something.
        assert max(r["validation_metrics_final"] for r in info) > 0.6
        summary = conn.cursor(row_factory=dict_row).execute("SELECT * FROM ref_summary").fetchone()
        assert summary["class_text_class_values"] == ["setosa", "versicolor", "virginica"]
        assert summary["num_iterations"] == 3 and summary["end_training_time"] is not None
        progress = conn.cursor(row_factory=dict_row).execute(
            "SELECT * FROM job_progress WHERE model_output_table = 'public.ref'").fetchone()
        assert progress["state"] == "finished" and progress["percent_done"] == 100
    epoch_notices = [n for n in notices if ": epoch " in n]
    assert len(epoch_notices) == 3 and "epoch 3/3" in epoch_notices[-1] and "ETA" in epoch_notices[0]


def test_visits_follow_the_schedule(data, reference):
    with _connect(data) as conn:
        visits = conn.execute("SELECT mst_key, step, segment FROM ref_mop_visits ORDER BY 1, 2").fetchall()
        seed, orders_by = conn.execute("SELECT seed, arguments->'orders' FROM jobs "
                                       "WHERE model_output_table = 'public.ref'").fetchone()
        configs = conn.cursor(row_factory=dict_row).execute(
            "SELECT mst_key, model_arch::text AS model_arch, compile_params, fit_params "
            "FROM ref_mop_models").fetchall()
    # Paths drawn by the models' fusion classes (their configurations alone), as recorded
    classes = {c["mst_key"]: fusion.fusion_class(training.ModelSpec.of(c)) for c in configs}
    groups: dict = {}
    for key in sorted(classes):
        groups.setdefault(classes[key], []).append(key)
    assert orders_by["by_class"] == [g for g in groups.values() if len(g) > 1] != []
    assert orders_by["clones"] == "source_path"
    orders = visit_orders([1, 2, 3, 4], 2, 3, seed, {k: i for i, g in enumerate(orders_by["by_class"]) for k in g})
    for mst_key in (1, 2, 3, 4):
        segments = [s for k, _, s in visits if k == mst_key]
        assert segments == [s for epoch in orders[mst_key] for s in epoch]


def test_same_seed_same_weights_and_replay(data, reference):
    weights, _ = reference
    _fit(data, "again", procedure=True)  # the procedure, committing as it goes
    _fit(data, "other_seed", seed=1)
    with _connect(data) as conn:
        assert _weights(conn, "again") == weights
        assert _weights(conn, "other_seed") != weights
        for mst_key in (1, 4):
            replayed = replay(conn, "ref", mst_key)
            stored = np.frombuffer(weights[mst_key], dtype=np.float32)
            assert np.max(np.abs(replayed - stored)) <= 1e-6


def test_two_concurrent_jobs_match_each_alone(data, reference):
    weights, _ = reference
    alone = {}
    _fit(data, "digits_alone", mst="mst_digits", source="digits_packed", validation="digits_valid",
         iterations=2)
    with _connect(data) as conn:
        alone = _weights(conn, "digits_alone")
    runs = [threading.Thread(target=_fit, args=(data, "con_iris")),
            threading.Thread(target=_fit, args=(data, "con_digits"),
                             kwargs=dict(mst="mst_digits", source="digits_packed",
                                         validation="digits_valid", iterations=2))]
    for run in runs:
        run.start()
    for run in runs:
        run.join()
    with _connect(data) as conn:
        assert _weights(conn, "con_iris") == weights
        assert _weights(conn, "con_digits") == alone


def test_a_sessions_next_job_finds_its_workers_warm(data, reference):
    """The second job of a session runs on the first one's worker sessions (TensorFlow
    imported, functions traced) and gives the same weights; the workers outlive the session,
    idle, kept for the role's next call (tests/test_worker_pool.py: from another session)."""
    weights, _ = reference
    with _connect(data) as conn:
        pids = []
        for out in ("warm_first", "warm_second"):
            conn.execute("SELECT madlib_keras_fit_multiple_model('iris_packed', %s, 'mst_iris', 3, "
                         "FALSE, 'iris_valid', 1, seed => 0)", (out,))
            assert _weights(conn, out) == weights
            pids.append({r[0] for r in conn.execute(sql.SQL(
                "SELECT DISTINCT (result->>'pid')::int FROM {}").format(
                sql.Identifier(f"{out}_mop_visits"))).fetchall()})
        assert pids[0] == pids[1] and len(pids[0]) == 2
    with _connect(data) as conn:
        time.sleep(1.5)  # longer than a busy worker takes to see its caller gone
        assert conn.execute("SELECT count(*) FROM pg_stat_activity WHERE pid = ANY(%s) AND "
                            "application_name = 'madlib_mop idle worker'",
                            (list(pids[0]),)).fetchone()[0] == 2


def _wait_for(conn, query, params=None, timeout=120.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        row = conn.execute(query, params).fetchone()
        if row and row[0]:
            return row
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for: {query}")


def test_a_killed_worker_changes_nothing(data, reference):
    weights, _ = reference
    notices: list[str] = []
    job = threading.Thread(target=_fit, args=(data, "killed_worker"), kwargs=dict(notices=notices))
    job.start()
    with _connect(data) as watcher:
        with held_job(watcher, "killed_worker", 4):
            # Progress is visible while the job runs.
            running = watcher.execute("SELECT state, subepochs_done, job_id FROM job_progress "
                                      "WHERE model_output_table = 'public.killed_worker'").fetchone()
            assert running[0] == "running" and 0 < running[1] < 24
            pid = watcher.execute("SELECT pid FROM pg_stat_activity WHERE application_name = %s",
                                  (f"madlib_mop worker job {running[2]} #1",)).fetchone()[0]
            assert watcher.execute("SELECT pg_terminate_backend(%s)", (pid,)).fetchone()[0]
    job.join()
    # A lost session is waited for and its call run again on a new one.
    assert any("this server did not answer" in n and "retrying in 0s" in n
               for n in notices), notices
    with _connect(data) as conn:
        assert _weights(conn, "killed_worker") == weights


def test_a_killed_coordinator_resumes(data, reference):
    weights, _ = reference
    failure: list[Exception] = []

    def fit_until_killed():
        try:
            _fit(data, "killed_coordinator")
        except psycopg.OperationalError as error:
            failure.append(error)

    job = threading.Thread(target=fit_until_killed)
    job.start()
    with _connect(data) as watcher:
        with held_job(watcher, "killed_coordinator", 6):
            job_id, pid = watcher.execute(
                "SELECT job_id, coordinator_pid FROM jobs WHERE model_output_table = "
                "'public.killed_coordinator'").fetchone()
            watcher.execute("SELECT pg_terminate_backend(%s)", (pid,))
        # It dies at its next look at its interrupts, once its hop is recorded.
        job.join()
        assert failure, "the coordinator's session should have been terminated"
        state, done = watcher.execute("SELECT state, subepochs_done FROM jobs WHERE job_id = %s",
                                      (job_id,)).fetchone()
        assert state == "running" and done < 24  # left as it was: nobody marked it
        # ... but the progress view sees that its coordinator is gone.
        _wait_for(watcher, "SELECT state = 'interrupted' FROM job_progress WHERE job_id = %s", (job_id,))
        _wait_for(watcher, "SELECT pg_try_advisory_lock(lock_key) FROM jobs WHERE job_id = %s", (job_id,))
        watcher.execute("SELECT pg_advisory_unlock(lock_key) FROM jobs WHERE job_id = %s", (job_id,))
        watcher.execute("CALL resume(%s)", (job_id,))
        assert watcher.execute("SELECT state FROM jobs WHERE job_id = %s", (job_id,)).fetchone()[0] == "finished"
        assert _weights(watcher, "killed_coordinator") == weights


def _hop_directory(conn, job_id):
    """Where the job's states between hops are (`job.state_store`)."""
    from pathlib import Path

    directory, oid = conn.execute("SELECT current_setting('data_directory'), oid FROM pg_database "
                                  "WHERE datname = current_database()").fetchone()
    return Path(directory) / state_store.DIRECTORY / str(oid) / str(job_id)


def test_states_lost_between_hops_are_trained_again_to_the_same_bits(data, reference):
    """A restarted server (or machine) does not trust the states between hops, which are not
    fsynced: each model goes back to its last durable state (step 0 or an iteration's end)
    and trains its lost sub-epochs again.  The weights are the same bits."""
    import shutil

    weights, _ = reference
    with _connect(data) as watcher:
        job_id = coordinator_killed_mid_job(watcher, "lost_hops", 5, lambda: _fit(data, "lost_hops"))
        done = dict(watcher.execute("SELECT mst_key, count(*) FROM lost_hops_mop_visits "
                                    "GROUP BY mst_key").fetchall())
        # An odd count of visits: a model between two hops of an iteration (2 segments).
        between = [k for k, n in done.items() if n % 2]
        assert between, done
        hops = _hop_directory(watcher, job_id)
        assert any(hops.rglob(f"{between[0]}-{done[between[0]]}.state"))
        killed_at = time.time()
        shutil.rmtree(hops)  # what a restart does to them: they are not read any more
        watcher.execute("CALL resume(%s)", (job_id,))
        assert _weights(watcher, "lost_hops") == weights
        # The lost sub-epoch was trained again (and recorded anew).
        again = watcher.execute("SELECT (result->>'finished_at')::float8 FROM lost_hops_mop_visits "
                                "WHERE mst_key = %s AND step = %s", (between[0], done[between[0]] - 1)).fetchone()[0]
        assert again > killed_at
        # A finished job keeps no files: its states are in its state table.
        assert not hops.exists()
        steps = {r[0] for r in watcher.execute("SELECT DISTINCT step FROM lost_hops_mop_state")}
        assert steps <= {0, 2, 4, 6}, steps


def test_a_resume_makes_the_copies_a_killed_coordinator_did_not(data, reference):
    """The state table's copy of an iteration's end is made beside the hops; a coordinator
    killed before it was made leaves it to the resume, even for a model that trains no
    further: a warm start reads the final states from that table."""
    weights, _ = reference
    with _connect(data) as watcher:
        # At 23 sub-epochs of 24, 3 models at least have all their 6 visits.
        job_id = coordinator_killed_mid_job(watcher, "late_copies", 23, lambda: _fit(data, "late_copies"))
        # As if none of its copies had been made: only the initial states are in the table.
        watcher.execute("DELETE FROM late_copies_mop_state WHERE step > 0")
        watcher.execute("CALL resume(%s)", (job_id,))
        assert _weights(watcher, "late_copies") == weights
        final = dict(watcher.execute("SELECT mst_key, max(step) FROM late_copies_mop_state "
                                     "GROUP BY mst_key").fetchall())
        assert final == {key: 6 for key in weights}, final


def test_calling_the_fit_again_continues_an_unfinished_job(data, reference):
    weights, _ = reference
    with _connect(data) as conn, _connect(data) as watcher:
        # A job cancelled after its first sub-epochs (Ctrl-C in psql does the same).
        def cancel_soon():
            with held_job(watcher, "cancelled", 4):
                conn.cancel_safe()

        canceller = threading.Thread(target=cancel_soon)
        canceller.start()
        with pytest.raises(psycopg.errors.QueryCanceled):
            conn.execute("SELECT madlib_keras_fit_multiple_model('iris_packed', 'cancelled', "
                         "'mst_iris', 3, FALSE, 'iris_valid', 1)")
        canceller.join()
        state, done = conn.execute("SELECT state, subepochs_done FROM jobs "
                                   "WHERE model_output_table = 'public.cancelled'").fetchone()
        assert state == "interrupted" and done < 24
        notices: list[str] = []
        conn.add_notice_handler(lambda diag: notices.append(diag.message_primary))
        conn.execute("SELECT madlib_keras_fit_multiple_model('iris_packed', 'cancelled', "
                     "'mst_iris', 3, FALSE, 'iris_valid', 1)")
        assert any("continuing job" in n for n in notices)
        assert _weights(conn, "cancelled") == weights


def test_warm_start_continues_training(data, reference):
    _fit(data, "warm", iterations=1)
    with _connect(data) as conn:
        conn.execute("SELECT madlib_keras_fit_multiple_model('iris_packed', 'warm', 'mst_iris', 2, "
                     "FALSE, 'iris_valid', 1, TRUE)")
        info = conn.execute("SELECT metrics_iters FROM warm_info").fetchall()
        assert all(row[0] == [1, 2] for row in info)  # MADlib: arrays cover the new run
        jobs = conn.execute("SELECT count(*) FROM jobs WHERE model_output_table = 'public.warm'").fetchone()[0]
        assert jobs == 2


def test_non_superuser_runs_a_job(data, allow_worker_role):
    role = f"analyst_{uuid.uuid4().hex[:6]}"
    allow_worker_role(role)
    with _connect(data) as conn:
        conn.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(role)))
        try:
            conn.execute(sql.SQL("GRANT USAGE ON SCHEMA madlib_mop TO {0}; GRANT CREATE ON SCHEMA public TO {0}; "
                                 "GRANT SELECT ON ALL TABLES IN SCHEMA public TO {0}").format(sql.Identifier(role)))
            conn.execute(sql.SQL("SET ROLE {}").format(sql.Identifier(role)))
            conn.execute("SELECT madlib_keras_fit_multiple_model('iris_packed', 'analyst_model', "
                         "'mst_iris', 1, FALSE)")
            assert len(_weights(conn, "analyst_model")) == 4
            owners = conn.execute("SELECT DISTINCT owner FROM jobs").fetchall()
            assert owners == [(role,)]  # another role's jobs are not visible
        finally:
            conn.execute("RESET ROLE")
            conn.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(role)))
            conn.execute("DELETE FROM jobs WHERE owner = %s", (role,))
            conn.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))


def test_initial_weights_from_the_architecture_table(data):
    """Transfer learning: a model starts from the weights stored with its architecture."""
    from madlib_mop.runtime import state

    model = keras.models.model_from_json(mlp_json(4, 8, 3))
    start = np.linspace(-0.5, 0.5, model.count_params()).astype(np.float32)
    with _connect(data) as conn:
        conn.execute("SELECT load_keras_model('arch_pretrained', %s::json, %s)", (mlp_json(4, 8, 3), start.tobytes()))
        conn.execute("SELECT load_model_selection_table('arch_pretrained', 'mst_pretrained', ARRAY[1], "
                     "ARRAY[$$loss='categorical_crossentropy',optimizer='SGD(lr=0.0)'$$], ARRAY['batch_size=16'])")
        conn.execute("SELECT madlib_keras_fit_multiple_model('iris_packed', 'pretrained', 'mst_pretrained', 1, FALSE)")
        initial = conn.execute("SELECT state FROM pretrained_mop_state WHERE step = 0").fetchone()[0]
        assert state.madlib_weights(initial) == start.tobytes()
        # With a learning rate of 0 the weights stay where they started.
        assert _weights(conn, "pretrained")[1] == start.tobytes()


def test_madlib_keras_fit_single_model(data):
    with _connect(data) as conn:
        conn.execute("SELECT madlib_keras_fit('iris_packed', 'single', 'arch', 1, "
                     "$$loss='categorical_crossentropy', optimizer='Adam(lr=0.01)', metrics=['accuracy']$$, "
                     "'batch_size=8', 3, FALSE, 'iris_valid')")
        model = conn.cursor(row_factory=dict_row).execute("SELECT * FROM single").fetchone()
        assert len(model["model_weights"]) == 4 * 67 and model["model_arch"]["class_name"] == "Sequential"
        summary = conn.cursor(row_factory=dict_row).execute("SELECT * FROM single_summary").fetchone()
        for column in ("source_table", "model", "dependent_varname", "independent_varname",
                       "model_arch_table", "model_id", "compile_params", "fit_params",
                       "num_iterations", "validation_table", "metrics_compute_frequency",
                       "model_type", "model_size", "start_training_time", "end_training_time",
                       "metrics_elapsed_time", "madlib_version", "num_classes", "metrics_type",
                       "loss_type", "training_metrics_final", "training_loss_final",
                       "training_metrics", "training_loss", "validation_metrics_final",
                       "validation_loss_final", "validation_metrics", "validation_loss",
                       "metrics_iters", "class_text_class_values"):
            assert column in summary, column
        assert summary["model_id"] == 1 and summary["metrics_iters"] == [3]
        assert len(summary["training_loss"]) == 1 and summary["validation_metrics_final"] is not None


def test_streamed_segments_train_like_cached_ones(data):
    """Over the memory budget, workers read buffers per sub-epoch: same minibatches, same weights."""
    with _connect(data) as conn:
        conn.execute("SELECT training_preprocessor_dl('digits_train', 'digits_small', 'digit', "
                     "'pixels', buffer_size => 100, normalizing_const => 16, distribution_rules => '2')")
        assert conn.execute("SELECT count(*) FROM digits_small").fetchone()[0] >= 14
        conn.execute("SELECT madlib_keras_fit_multiple_model('digits_small', 'cached', 'mst_digits', 1, FALSE)")
        conn.execute("SET madlib_mop.worker_memory_mb = 0")
        conn.execute("SELECT madlib_keras_fit_multiple_model('digits_small', 'streamed', 'mst_digits', 1, FALSE)")
        conn.execute("RESET madlib_mop.worker_memory_mb")
        conn.execute("SELECT madlib_keras_fit_multiple_model('digits_small', 'uncached', 'mst_digits', 1, "
                     "FALSE, use_caching => FALSE)")
        assert _weights(conn, "streamed") == _weights(conn, "cached") == _weights(conn, "uncached")
        # Both read the same rows: every sub-epoch saw its segment's rows.
        rows = conn.execute("SELECT sum((result->>'rows')::int) FROM streamed_mop_visits").fetchone()[0]
        assert rows == 1437 * 2  # 2 models, one pass each over the 1437 training rows
        modes = conn.execute("SELECT (SELECT bool_and((result->>'in_memory')::boolean) FROM cached_mop_visits), "
                             "(SELECT bool_or((result->>'in_memory')::boolean) FROM streamed_mop_visits), "
                             "(SELECT bool_or((result->>'in_memory')::boolean) FROM uncached_mop_visits)").fetchone()
        assert modes == (True, False, False)


@pytest.mark.parametrize(("args", "sqlstate", "message"), [
    (("iris", "bad_out", "mst_iris", 1), "42P01", "has no summary table"),
    (("iris_packed", "bad_out", "no_mst", 1), "42P01", "does not exist"),
    (("iris_packed", "bad_out", "mst_iris", 0), "22023", "num_iterations must be at least 1"),
    (("iris_packed", "bad_out", "mst_iris", 2, False, None, 0), "22023", "metrics_compute_frequency"),
    (("iris_packed", "bad_out", "mst_iris", 1, True), "0A000", "use_gpus"),
    (("iris_packed", "bad_out", "mst_shape", 1), "22023",
     "Input shape [5] in the model architecture does not match the input shape [4] of column attributes"),
    (("iris_packed", "bad_out", "mst_outputs", 1), "42804", "has 2 outputs"),
    (("iris_packed", "bad_out", "mst_loss", 1), "42804", "binary_crossentropy with 1 output"),
    (("iris_packed", "bad_out", "mst_iris", 1, False, "digits_valid"), "42804", "does not match"),
    (("iris_packed", "ref", "mst_iris", 1), "42P07", "already exists"),
])
def test_bad_input(data, reference, args, sqlstate, message):
    with _connect(data) as conn:
        conn.execute("DROP TABLE IF EXISTS mst_shape, mst_shape_summary, mst_outputs, "
                     "mst_outputs_summary, mst_loss, mst_loss_summary")
        conn.execute("SELECT load_model_selection_table('arch', 'mst_shape', ARRAY[3], "
                     "ARRAY[$$loss='categorical_crossentropy',optimizer='Adam'$$], ARRAY['epochs=1'])")
        conn.execute("SELECT load_model_selection_table('arch', 'mst_outputs', ARRAY[4], "
                     "ARRAY[$$loss='categorical_crossentropy',optimizer='Adam'$$], ARRAY['epochs=1'])")
        conn.execute("SELECT load_keras_model('arch', %s::json)", (
            keras.Sequential([keras.Input((4,)), keras.layers.Dense(1, activation="sigmoid")]).to_json(),))
        last = conn.execute("SELECT max(model_id) FROM arch").fetchone()[0]
        conn.execute("SELECT load_model_selection_table('arch', 'mst_loss', ARRAY[%s], "
                     "ARRAY[$$loss='binary_crossentropy',optimizer='Adam'$$], ARRAY['epochs=1'])", (last,))
        jobs_before = conn.execute("SELECT count(*) FROM jobs").fetchone()[0]
        placeholders = sql.SQL(", ").join([sql.Placeholder()] * len(args))
        with pytest.raises(psycopg.Error) as raised:
            conn.execute(sql.SQL("SELECT madlib_keras_fit_multiple_model({})").format(placeholders), args)
        diag = raised.value.diag
        assert diag.sqlstate == sqlstate and message in diag.message_primary and diag.message_hint
        assert conn.execute("SELECT to_regclass('bad_out') IS NULL AND to_regclass('bad_out_info') IS NULL "
                            "AND to_regclass('bad_out_mop_state') IS NULL").fetchone()[0]
        assert conn.execute("SELECT count(*) FROM jobs").fetchone()[0] == jobs_before
