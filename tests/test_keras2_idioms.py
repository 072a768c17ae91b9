"""Keras 2 idioms of MADlib's deep-learning examples, trained: an optimizer's `decay`,
`top_<k>_accuracy` metrics without a custom-function table, and fit_params
`callbacks=[TensorBoard(...)]` (accepted, not run, with a WARNING)."""

from __future__ import annotations

import math

import keras
import numpy as np
import psycopg
import pytest
from psycopg.rows import dict_row

from madlib_mop.runtime import keras_json, model_state, training
from tests.conftest import connect, iris_table

ARCH = keras.Sequential([keras.Input((4,)), keras.layers.Dense(6, activation="relu"),
                         keras.layers.Dense(3, activation="softmax")]).to_json()


def _spec(key: int, optimizer: str, metrics: str = "['accuracy']",
          loss: str = "categorical_crossentropy") -> training.ModelSpec:
    return training.ModelSpec(key, ARCH, f"optimizer='{optimizer}',loss='{loss}',metrics={metrics}",
                              "batch_size=8")


def _data(rows: int = 45):
    rng = np.random.default_rng(7)
    x = rng.standard_normal((rows, 4)).astype(np.float32)
    classes = (x[:, 0] > 0).astype(int) + (x[:, 1] > 0.5).astype(int)
    return x, np.eye(3, dtype=np.float32)[classes], classes.astype(np.int32)


def test_program_keys_keep_decayed_rates_apart():
    """A schedule's constants are traced into the program: lr and decay are in the key."""
    keys = {training.program_key(_spec(1, o)) for o in (
        "Adam(lr=0.01,decay=0.1)", "Adam(lr=0.02,decay=0.1)", "Adam(lr=0.01,decay=0.2)", "Adam(lr=0.01)")}
    assert len(keys) == 4
    assert training.program_key(_spec(1, "Adam(lr=0.01)")) == training.program_key(_spec(2, "Adam(lr=0.02)"))


@pytest.mark.parametrize("loss", ["categorical_crossentropy", "sparse_categorical_crossentropy"])
def test_a_decayed_pass_is_keras_fit_and_keras2s_rate(loss):
    x, onehot, classes = _data()
    y = classes if loss.startswith("sparse") else onehot
    spec = _spec(1, "Adam(lr=0.05,decay=0.5)", "['top_2_accuracy', 'accuracy']", loss)
    reference, program = training.compiled_model(spec, 0), training.Program.for_spec(spec)
    program.restore(model_state.capture_state(reference))
    reported = program.train(x, y, 8)
    history = reference.fit(x, y, batch_size=8, epochs=1, shuffle=False, verbose=0).history
    assert set(reported) == {"loss", "top_2_accuracy", "accuracy"}
    assert reported == pytest.approx({k: v[-1] for k, v in history.items()}, rel=0, abs=0)
    for found, expected in zip(program.model.weights + program.model.optimizer.variables,
                               reference.weights + reference.optimizer.variables, strict=True):
        assert np.array_equal(found.numpy(), expected.numpy())
    steps = int(program.model.optimizer.iterations.numpy())
    assert steps == math.ceil(45 / 8)
    assert float(program.model.optimizer.learning_rate) == pytest.approx(0.05 / (1 + 0.5 * steps), rel=1e-6)
    top2 = np.mean([c in np.argsort(p)[-2:] for p, c in zip(program.model.predict(x, verbose=0), classes)])
    assert program.evaluate(x, y)["top_2_accuracy"] == pytest.approx(top2, abs=1e-6)


# ---- in the database --------------------------------------------------------------------------

COMPILE = ("loss='categorical_crossentropy', optimizer='Adam(lr=0.01, decay=0.5)', "
           "metrics=['top_3_accuracy', 'top_2_accuracy']")
FIT = 'batch_size=4, epochs=1, callbacks=[TensorBoard(log_dir="/tmp/logs/fit")]'


@pytest.fixture(scope="module")
def fitted(extension_dsn):
    """madlib_keras_fit as MADlib's docs write it, over 30 iris rows in 2 segments."""
    from sklearn.datasets import load_iris

    iris = load_iris()
    warnings: list[str] = []
    with connect(extension_dsn) as conn:
        conn.add_notice_handler(lambda d: warnings.append(d.message_primary)
                                if d.severity_nonlocalized == "WARNING" else None)
        iris_table(conn, rows=range(0, 150, 5))
        conn.execute("SELECT training_preprocessor_dl('iris', 'iris_packed', 'class_text', "
                     "'attributes', distribution_rules => '2')")
        conn.execute("SELECT validation_preprocessor_dl('iris', 'iris_valid', 'class_text', "
                     "'attributes', 'iris_packed')")
        conn.execute("SELECT load_keras_model('arch', %s::json)", (ARCH,))
        conn.execute("SELECT madlib_keras_fit('iris_packed', 'kt', 'arch', 1, %s, %s, 2, FALSE, "
                     "'iris_valid')", (COMPILE, FIT))
    return extension_dsn, warnings, iris


def test_tensorboard_callbacks_warn_once_and_are_kept_as_written(fitted):
    dsn, warnings, _ = fitted
    assert len(warnings) == 1, warnings
    assert "TensorBoard callbacks are not run inside the database" in warnings[0]
    assert "madlib-mop tensorboard public.kt --logdir /tmp/logs/fit" in warnings[0]
    with connect(dsn) as conn:
        assert conn.execute("SELECT fit_params FROM kt_summary").fetchone()[0] == FIT
        diag = None
        try:
            conn.execute("SELECT madlib_keras_fit('iris_packed', 'kt_bad', 'arch', 1, %s, "
                         "'batch_size=4, callbacks=[EarlyStopping(patience=1)]', 1)", (COMPILE,))
        except psycopg.Error as error:
            diag = error.diag
        assert diag is not None and diag.sqlstate == "22023"
        assert "EarlyStopping" in diag.message_primary and "madlib-mop tensorboard" in diag.message_hint


def test_top_k_accuracy_is_reported_by_its_name(fitted):
    dsn, _, iris = fitted
    with connect(dsn) as conn:
        summary = conn.cursor(row_factory=dict_row).execute("SELECT * FROM kt_summary").fetchone()
        info = conn.cursor(row_factory=dict_row).execute("SELECT * FROM kt_info").fetchone()
        assert summary["metrics_type"] == info["metrics_type"] == ["top_3_accuracy", "top_2_accuracy"]
        # The first metric is top-3 of 3 classes: always right, on training and validation data.
        assert summary["training_metrics"] == [1.0] and summary["validation_metrics"] == [1.0]
        conn.execute("SELECT madlib_keras_evaluate('kt', 'iris_valid', 'kt_eval')")
        row = conn.cursor(row_factory=dict_row).execute("SELECT * FROM kt_eval").fetchone()
        weights = conn.execute("SELECT model_weights FROM kt").fetchone()[0]
    assert set(row["metrics"]) == {"loss", "top_3_accuracy", "top_2_accuracy"} and row["metric"] == 1.0
    model = keras_json.model_from_config(keras_json.parse_model_json(ARCH))
    model_state.set_flat_weights(model, weights)
    rows = list(range(0, 150, 5))
    scores = model.predict(iris.data[rows].astype(np.float32), verbose=0)
    top2 = np.mean([c in np.argsort(p)[-2:] for p, c in zip(scores, iris.target[rows])])
    assert row["metrics"]["top_2_accuracy"] == pytest.approx(top2, abs=1e-6)


def test_decay_continues_across_hops(fitted):
    """The iteration count travels in the state: after 2 iterations over 2 segments the
    rate is Keras 2's lr / (1 + decay * all the steps), not those of the last segment."""
    dsn, _, _ = fitted
    with connect(dsn) as conn:
        rows = [r[0] for r in conn.execute("SELECT result->'rows' FROM kt_mop_visits").fetchall()]
        blob = conn.execute("SELECT state FROM kt_mop_state ORDER BY step DESC LIMIT 1").fetchone()[0]
        compile_params = conn.execute("SELECT compile_params FROM kt_summary").fetchone()[0]
    assert len(rows) == 4 and sum(rows) == 60  # 2 iterations x 2 segments, 30 rows
    steps = sum(math.ceil(r / 4) for r in rows)
    program = training.Program.for_spec(training.ModelSpec(1, ARCH, compile_params, FIT))
    program.restore(bytes(blob))
    optimizer = program.model.optimizer
    assert int(optimizer.iterations.numpy()) == steps > max(math.ceil(r / 4) for r in rows)
    assert float(optimizer.learning_rate) == pytest.approx(0.01 / (1 + 0.5 * steps), rel=1e-6)


def test_an_optimizer_argument_of_none_trains_with_keras_default(fitted):
    """MADlib's scripts write Keras 2's Adam(epsilon=None): Keras' default epsilon, trained
    (it failed every retry with "None values not supported" before)."""
    with connect(fitted[0]) as conn:
        conn.execute("SELECT madlib_keras_fit('iris_packed', 'kt_none', 'arch', 1, %s, "
                     "'batch_size=4', 1)",
                     ("loss='categorical_crossentropy', optimizer='Adam(lr=0.01, epsilon=None)', "
                      "metrics=['accuracy']",))
        compile_params, loss = conn.execute(
            "SELECT s.compile_params, s.training_loss[1] FROM kt_none_summary s").fetchone()
    assert "epsilon=None" in compile_params and math.isfinite(loss)


def test_sample_weight_mode_none_is_accepted_with_a_notice(fitted):
    """MADlib's scripts write Keras 2's compile argument sample_weight_mode=None (its
    default); Keras 3 has none.  Accepted with a NOTICE, it trains as without it; any other
    value is refused."""
    written = ("loss='categorical_crossentropy', optimizer='Adam(lr=0.01)', metrics=['accuracy'], "
               "sample_weight_mode=None")
    notices: list[str] = []
    with connect(fitted[0], notices) as conn:
        conn.execute("SELECT madlib_keras_fit('iris_packed', 'kt_swm', 'arch', 1, %s, 'batch_size=4', 1)",
                     (written,))
        conn.execute("SELECT madlib_keras_fit('iris_packed', 'kt_plain', 'arch', 1, %s, 'batch_size=4', 1)",
                     (written.replace(", sample_weight_mode=None", ""),))
        weights = conn.execute("SELECT (SELECT model_weights FROM kt_swm), "
                               "(SELECT model_weights FROM kt_plain)").fetchone()
        assert weights[0] == weights[1]
        assert any("sample_weight_mode=None is Keras 2's default" in n for n in notices), notices
        # A model selection table takes it too (the fit that reads it says so, once).
        conn.execute("SELECT load_model_selection_table('arch', 'kt_swm_mst', ARRAY[1], ARRAY[%s], "
                     "ARRAY['batch_size=4'])", (written,))
        assert sum("sample_weight_mode=None" in n for n in notices) == 1
        with pytest.raises(psycopg.Error) as caught:
            conn.execute("SELECT madlib_keras_fit('iris_packed', 'kt_temporal', 'arch', 1, %s, "
                         "'batch_size=4', 1)", (written.replace("None", "'temporal'"),))
        assert caught.value.diag.sqlstate == "0A000"
        assert "remove it" in caught.value.diag.message_hint
