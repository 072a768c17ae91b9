"""madlib_keras_automl (Hyperband, Hyperopt), hyperband_schedule and fit_multiple's pruners,
end to end in a real server: MADlib's documented example, the output tables, decisions
that survive a killed coordinator, pruned models' results kept, bad input."""

from __future__ import annotations

import json
import threading
import time

import psycopg
import pytest
from psycopg import sql

from madlib_mop.job import tables as job_tables
from madlib_mop.runtime import state
from tests.conftest import connect as _connect, held_job, iris_table

# MADlib's automl example: two MLPs as Keras 2.1.6 wrote them (a list of layers).
def _madlib_mlp(hidden_layers: int) -> str:
    def dense(name, units, activation, **extra):
        return {"class_name": "Dense", "config": {
            "name": name, "units": units, "activation": activation, "use_bias": True,
            "trainable": True, "kernel_initializer": {"class_name": "VarianceScaling", "config": {
                "distribution": "uniform", "scale": 1.0, "seed": None, "mode": "fan_avg"}},
            "bias_initializer": {"class_name": "Zeros", "config": {}}, "kernel_regularizer": None,
            "bias_regularizer": None, "activity_regularizer": None, "kernel_constraint": None,
            "bias_constraint": None, **extra}}
    layers = [dense("dense_1", 10, "relu", dtype="float32", batch_input_shape=[None, 4])]
    layers += [dense(f"dense_{i + 2}", 10, "relu") for i in range(hidden_layers - 1)]
    layers.append(dense(f"dense_{hidden_layers + 1}", 3, "softmax"))
    return json.dumps({"class_name": "Sequential", "config": layers, "keras_version": "2.1.6",
                       "backend": "tensorflow"})


# As in MADlib's docs, with the schema madlib_mop.
DOC_COMPILE_GRID = """{
    'loss': ['categorical_crossentropy'],
    'optimizer_params_list': [
        {'optimizer': ['Adam'],'lr': [0.001, 0.1, 'log']},
        {'optimizer': ['RMSprop'],'lr': [0.001, 0.1, 'log']}
    ],
    'metrics': ['accuracy']
} """
DOC_FIT_GRID = "{'batch_size': [4, 8], 'epochs': [1]}"


@pytest.fixture(scope="module")
def data(extension_dsn):
    with _connect(extension_dsn) as conn:
        iris_table(conn, "iris_data", features="numeric[]", label_type="varchar", madlib_names=True, first_id=1)
        # MADlib's train_test_split(0.8): a fixed split here.
        conn.execute("CREATE TABLE iris_train AS SELECT * FROM iris_data WHERE id % 5 <> 0")
        conn.execute("CREATE TABLE iris_test AS SELECT * FROM iris_data WHERE id % 5 = 0")
        for statement in [
            "SELECT madlib_mop.training_preprocessor_dl('iris_train', 'iris_train_packed', "
            "'class_text', 'attributes')",
            "SELECT madlib_mop.validation_preprocessor_dl('iris_test', 'iris_test_packed', "
            "'class_text', 'attributes', 'iris_train_packed')",
        ]:
            conn.execute(statement)
        conn.execute("SELECT madlib_mop.load_keras_model('model_arch_library', %s::json, NULL, "
                     "'Sophie', 'MLP with 1 hidden layer')", (_madlib_mlp(1),))
        conn.execute("SELECT madlib_mop.load_keras_model('model_arch_library', %s::json, NULL, "
                     "'Maria', 'MLP with 2 hidden layers')", (_madlib_mlp(2),))
    return extension_dsn


def _automl(dsn, out, method="hyperband", params="R=9, eta=3, skip_last=0", random_state=None,
            notices=None, mst=None):
    with _connect(dsn) as conn:
        if notices is not None:
            conn.add_notice_handler(lambda d: notices.append(d.message_primary))
        conn.execute(f"""
            SELECT madlib_mop.madlib_keras_automl('iris_train_packed',   -- source table
                                      %s,                    -- model output table
                                      'model_arch_library',  -- model architecture table
                                      %s,                    -- model selection output table
                                      ARRAY[1,2],            -- model IDs
                                      $${DOC_COMPILE_GRID}$$,   -- compile param grid
                                      $${DOC_FIT_GRID}$$,  -- fit params grid
                                      %s,                    -- autoML method
                                      %s,                    -- autoML params
                                      %s,                    -- random state
                                      NULL,                  -- object table
                                      FALSE,                 -- use GPUs
                                      'iris_test_packed',    -- validation table
                                      1,                     -- metrics compute freq
                                      NULL,                  -- name
                                      NULL)                  -- descr
            """, (out, mst or f"{out}_mst_table", method, params, random_state))


def _weights(conn, out):
    return dict(conn.execute(sql.SQL("SELECT mst_key, model_weights FROM {} ORDER BY 1").format(
        sql.Identifier(out))).fetchall())


def _decisions(conn, out):
    return conn.execute(sql.SQL("SELECT mst_key, s, i, stopped_iteration, stop_reason, metrics_iters "
                                "FROM {} ORDER BY 1").format(sql.Identifier(f"{out}_info"))).fetchall()


def test_hyperband_schedule_table(data):
    with _connect(data) as conn:
        conn.execute("SELECT madlib_mop.hyperband_schedule ('hb_schedule', 81, 3, 0)")
        rows = conn.execute("SELECT s, i, n_i, r_i FROM hb_schedule ORDER BY s DESC, i").fetchall()
        assert len(rows) == 15 and rows[0] == (4, 0, 81, 1) and rows[-1] == (0, 0, 5, 81)
        assert rows[5] == (3, 0, 27, 3)
        with pytest.raises(psycopg.errors.InvalidParameterValue) as raised:
            conn.execute("SELECT madlib_mop.hyperband_schedule('hb_bad', 2, 3)")
        assert "R (2) must be at least eta (3)" in str(raised.value) and raised.value.diag.message_hint
        assert conn.execute("SELECT to_regclass('hb_bad')").fetchone()[0] is None


def test_madlibs_hyperband_example(data):
    notices: list[str] = []
    _automl(data, "automl_output", notices=notices)
    with _connect(data) as conn:
        summary = conn.execute("SELECT automl_method, automl_params, random_state, model_arch_table "
                               "FROM automl_output_summary").fetchone()
        assert summary == ("hyperband", "R=9, eta=3, skip_last=0", None, "public.model_arch_library")
        rows = _decisions(conn, "automl_output")
        assert len(rows) == 15  # brackets of 9, 3 and 3 configurations
        assert [r[1] for r in rows] == [2] * 9 + [1] * 3 + [0] * 3
        alive = [r for r in rows if r[3] is None]
        # Bracket 2 keeps 1 of 9 (3 after 1 iteration, then 1 after 3), bracket 1 keeps 1 of
        # 3 after 3, bracket 0 trains its 3 for 9 iterations.
        assert len(alive) == 5 and all(r[5][-1] == 9 for r in alive)
        assert sorted((r[1], r[3]) for r in rows if r[3] is not None) == [(1, 3)] * 2 + [(2, 1)] * 6 + [(2, 3)] * 2
        assert all("bracket" in r[4] and "validation_loss" in r[4] for r in rows if r[3] is not None)
        assert {r[2] for r in alive} == {2, 1, 0}  # the round each survivor completed last
        # MADlib's queries of the docs run.
        conn.execute("SELECT * FROM automl_output_summary")
        conn.execute("SELECT * FROM automl_output_info ORDER BY validation_metrics_final DESC, "
                     "validation_loss_final LIMIT 3").fetchall()
        # The model selection table keeps the best configuration (lowest validation loss).
        best = conn.execute("SELECT mst_key FROM automl_output_info "
                            "ORDER BY validation_loss_final, mst_key LIMIT 1").fetchone()[0]
        assert conn.execute("SELECT mst_key FROM automl_output_mst_table").fetchall() == [(best,)]
        assert conn.execute("SELECT model_arch_table FROM automl_output_mst_table_summary").fetchone()[0] \
            == "public.model_arch_library"
        # A pruned model keeps its state and metrics as of its stop.
        pruned = next(r for r in rows if r[3] == 1)
        info = conn.execute("SELECT training_loss_final, validation_loss_final, metrics_iters "
                            "FROM automl_output_info WHERE mst_key = %s", (pruned[0],)).fetchone()
        assert info[0] is not None and info[1] is not None and info[2] == [1]
        weights = conn.execute("SELECT model_weights FROM automl_output WHERE mst_key = %s",
                               (pruned[0],)).fetchone()[0]
        # Its weights are those of its last state, the one after its stop's iteration.
        trained = conn.execute("SELECT count(*) FROM automl_output_mop_visits WHERE mst_key = %s",
                               (pruned[0],)).fetchone()[0]
        segments = conn.execute("SELECT num_segments FROM automl_output_summary").fetchone()[0]
        assert trained == segments  # one iteration of one epoch, then stopped
        states = job_tables.state_table(conn, sql.Identifier("automl_output_mop_state"))
        assert states.last_step(pruned[0], 10 ** 6) == trained
        assert bytes(weights) == bytes(state.madlib_weights(states.read(pruned[0], trained)))
        progress = conn.execute("SELECT state, models, models_stopped, models_finished, models_waiting, "
                                "percent_done FROM job_progress WHERE model_output_table = "
                                "'public.automl_output'").fetchone()
        assert progress == ("finished", 15, 10, 5, 0, 100.0)
        # MADlib's predict example (mst_key 4).
        conn.execute("""SELECT madlib_mop.madlib_keras_predict('automl_output', 'iris_test', 'id',
                        'attributes', 'iris_predict', 'response', FALSE, 4)""")
        assert conn.execute("SELECT count(*) FROM iris_predict").fetchone()[0] == 30
    assert any("mst_key" in n and "stopped: bracket 2 round 0" in n for n in notices), notices
    assert any("goes on after iteration 3" in n for n in notices), notices
    assert any("deciding by validation_loss (lower is better)" in n for n in notices), notices


def _killed_then_resumed(data, out: str, done: int, call) -> list[str]:
    """Run `call(notices)`, kill its coordinator once the job has `done` sub-epochs, then
    make the same call again (which continues the job); returns the second call's notices."""
    failure: list[Exception] = []

    def until_killed():
        try:
            call(None)
        except psycopg.OperationalError as error:
            failure.append(error)

    job = threading.Thread(target=until_killed)
    job.start()
    with _connect(data) as watcher:
        with held_job(watcher, out, done):
            job_id, pid = watcher.execute("SELECT job_id, coordinator_pid FROM jobs WHERE "
                                          "model_output_table = %s", (f"public.{out}",)).fetchone()
            watcher.execute("SELECT pg_terminate_backend(%s)", (pid,))
        job.join()
        assert failure
        deadline = time.monotonic() + 60
        while not watcher.execute("SELECT pg_try_advisory_lock(lock_key) FROM jobs WHERE job_id = %s",
                                  (job_id,)).fetchone()[0]:
            assert time.monotonic() < deadline
            time.sleep(0.2)
        watcher.execute("SELECT pg_advisory_unlock(lock_key) FROM jobs WHERE job_id = %s", (job_id,))
    notices: list[str] = []
    call(notices)
    assert any("continuing job" in n for n in notices), notices
    return notices


def test_hyperband_decisions_and_weights_survive_a_killed_coordinator(data):
    _automl(data, "hb_reference", random_state=5)
    with _connect(data) as conn:
        reference = _decisions(conn, "hb_reference"), _weights(conn, "hb_reference")
    # Killed past bracket 2's first round (9 models x 2 segments).
    _killed_then_resumed(data, "hb_killed", 40,
                         lambda notices: _automl(data, "hb_killed", random_state=5, notices=notices))
    with _connect(data) as conn:
        assert _decisions(conn, "hb_killed") == reference[0]
        assert _weights(conn, "hb_killed") == reference[1]
        assert conn.execute("SELECT count(*) FROM hb_killed_mst_table").fetchone()[0] == 1


def test_hyperopt_tpe_adds_models_as_others_finish(data):
    notices: list[str] = []
    params = "num_configs=6, num_iterations=2, algorithm=tpe, startup_configs=2"
    _automl(data, "hyperopt_output", "hyperopt", params, 3, notices)
    with _connect(data) as conn:
        rows = conn.execute("SELECT mst_key, model_id, compile_params, fit_params, metrics_iters "
                            "FROM hyperopt_output_info ORDER BY 1").fetchall()
        assert [r[0] for r in rows] == [1, 2, 3, 4, 5, 6]
        assert all(r[4] == [1, 2] for r in rows)
        assert len({r[1:4] for r in rows}) == 6
        assert conn.execute("SELECT automl_method, automl_params, random_state FROM "
                            "hyperopt_output_summary").fetchone() == ("hyperopt", params, "3")
        assert conn.execute("SELECT count(*) FROM hyperopt_output_mst_table").fetchone()[0] == 1
        job = conn.execute("SELECT models, models_finished, subepochs_done, subepochs_total "
                           "FROM job_progress WHERE model_output_table = 'public.hyperopt_output'").fetchone()
        assert job[:2] == (6, 6) and job[2] == job[3] == 6 * 2 * 2
    entered = [n for n in notices if "enters" in n]
    assert len(entered) == 4, notices  # 2 at the start (the segments), 4 as others finished
    # The same seed proposes the same configurations, also when the job's coordinator is
    # killed after a model was added and the job resumed.
    _killed_then_resumed(data, "hyperopt_again", 10,
                         lambda n: _automl(data, "hyperopt_again", "hyperopt", params, 3, n))
    with _connect(data) as conn:
        again = conn.execute("SELECT mst_key, model_id, compile_params, fit_params, metrics_iters "
                             "FROM hyperopt_again_info ORDER BY 1").fetchall()
        assert again == rows
        assert _weights(conn, "hyperopt_again") == _weights(conn, "hyperopt_output")


@pytest.mark.parametrize("method, params, sqlstate, fragment", [
    ("hyperband", "R=2, eta=3", "22023", "R (2) must be at least eta (3)"),
    ("hyperband", "R=9, eta=3, skip_last=5", "22023", "skip_last (5) is more than"),
    ("hyperband", "R=9, colour=3", "22023", "colour is not a parameter of hyperband"),
    ("hyperopt", "num_configs=3, algorithm=annealing", "22023", "algorithm must be tpe or rand"),
    ("hyperband", "R=9, metric=validation_auc", "22023", "'auc' is not reported"),
    ("hyperbend", None, "22023", "automl_method must be 'hyperband' or 'hyperopt'"),
    ("hyperband", "R=9 eta=3", "42601", "automl_params is not valid"),
])
def test_bad_automl_input_gets_a_clean_error_and_writes_nothing(data, method, params, sqlstate, fragment):
    with pytest.raises(psycopg.Error) as raised:
        _automl(data, "bad_automl", method, params)
    assert raised.value.sqlstate == sqlstate and fragment in str(raised.value)
    assert raised.value.diag.message_hint
    with _connect(data) as conn:
        assert conn.execute("SELECT count(*) FROM pg_class WHERE relname LIKE 'bad_automl%'").fetchone()[0] == 0


def test_fit_multiple_with_a_pruner(data):
    with _connect(data) as conn:
        conn.execute("""SELECT madlib_mop.generate_model_configs('model_arch_library', 'mst_pruned',
            ARRAY[1, 2], $${'loss': ['categorical_crossentropy'], 'optimizer_params_list': [
            {'optimizer': ['Adam'], 'lr': [0.0001, 0.01, 0.1]}], 'metrics': ['accuracy']}$$,
            $${'batch_size': [8], 'epochs': [1]}$$)""")
        notices: list[str] = []
        conn.add_notice_handler(lambda d: notices.append(d.message_primary))
        conn.execute("""SELECT madlib_mop.madlib_keras_fit_multiple_model('iris_train_packed',
            'pruned', 'mst_pruned', 4, FALSE, 'iris_test_packed', NULL, pruner =>
            'successive_halving, eta=2, min_iterations=1, metric=accuracy')""")
        rows = conn.execute("SELECT mst_key, stopped_iteration, stop_reason, metrics_iters, "
                            "validation_metrics FROM pruned_info ORDER BY 1").fetchall()
        stops = sorted(r[1] for r in rows if r[1] is not None)
        # 6 models; 3 go on after iteration 1, 1 after iteration 2.
        assert stops == [1, 1, 1, 2, 2]
        for row in rows:
            # Metrics at the rungs (1, 2) and at the end (metrics_compute_frequency NULL).
            assert row[3] == {1: [1], 2: [1, 2], None: [1, 2, 4]}[row[1]]
            if row[1] is not None:
                assert "not among the best" in row[2] and "validation_accuracy" in row[2]
        at_one = {r[0]: r[4][0] for r in rows}
        kept = sorted(at_one, key=lambda k: (-at_one[k], k))[:3]
        assert {r[0] for r in rows if r[1] != 1} == set(kept)  # ranked by accuracy, higher first
        # A stopped model did no work after its decision, and keeps its state and weights
        # as of its last iteration (the state table keeps its latest state).
        segments = conn.execute("SELECT num_segments FROM pruned_summary").fetchone()[0]
        for key, stopped, _, _, _ in rows:
            done, step, blob = conn.execute(
                "SELECT i.subepochs_done, s.step, s.state FROM pruned_info i JOIN pruned_mop_state s "
                "USING (mst_key) WHERE mst_key = %s ORDER BY s.step DESC LIMIT 1", (key,)).fetchone()
            assert done == step == (stopped or 4) * segments
            weights = conn.execute("SELECT model_weights FROM pruned WHERE mst_key = %s", (key,)).fetchone()[0]
            assert bytes(weights) == state.madlib_weights(bytes(blob))
        assert conn.execute("SELECT pruner FROM pruned_summary").fetchone()[0].startswith("successive_halving")
        assert conn.execute("SELECT models_stopped, models_finished FROM job_progress "
                            "WHERE model_output_table = 'public.pruned'").fetchone() == (5, 1)
        assert any("stopped: not among the best 3 of 6" in n for n in notices), notices
        # A bad pruner: a clean error, nothing written.
        for pruner, fragment in [("median, warmpu=2", "unknown option warmpu"),
                                 ("median, metric=training_auc", "'auc' is not reported"),
                                 ("median, metric=validation_loss", "needs a validation_table")]:
            with pytest.raises(psycopg.errors.InvalidParameterValue) as raised:
                conn.execute("SELECT madlib_mop.madlib_keras_fit_multiple_model('iris_train_packed', "
                             "'pruned_bad', 'mst_pruned', 2, pruner => %s)", (pruner,))
            assert fragment in str(raised.value) and raised.value.diag.message_hint
        assert conn.execute("SELECT to_regclass('pruned_bad')").fetchone()[0] is None
