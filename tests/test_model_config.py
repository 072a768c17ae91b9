"""Compile/fit parameter and grid parsing without a database: literals only, whitelists."""

from __future__ import annotations

import pytest

from madlib_mop.grammar import model_config as mc
from madlib_mop.errors import MadlibMopError


def test_madlib_compile_string_round_trips():
    text = "optimizer='Adam(lr=0.001)',loss='categorical_crossentropy',metrics=['accuracy']"
    params = mc.parse_compile_params(text)
    assert params.optimizer == mc.Optimizer("Adam", (("lr", 0.001),))
    assert params.optimizer.written_arguments() == {"learning_rate": 0.001}
    assert params.loss == "categorical_crossentropy" and params.metrics == ("accuracy",)
    assert str(params) == text
    assert mc.parse_compile_params(str(params)) == params


@pytest.mark.parametrize("optimizer", ["'adam'", "'Adam()'", "Adam", "Adam()", "'ADAM'"])
def test_optimizer_spellings(optimizer):
    params = mc.parse_compile_params(f"optimizer={optimizer}, loss='mse'")
    assert params.optimizer == mc.Optimizer("Adam", ())


def test_unquoted_values_as_madlib_random_search_writes_them():
    params = mc.parse_compile_params("optimizer=SGD(lr=0.1,momentum=0.9),loss=mse,metrics=[mae]")
    assert params.optimizer.written_arguments() == {"learning_rate": 0.1, "momentum": 0.9}
    assert params.loss == "mse" and params.metrics == ("mae",)


def test_several_metrics_and_sparse_losses_are_allowed():
    params = mc.parse_compile_params(
        "optimizer='SGD()', loss='sparse_categorical_crossentropy', "
        "metrics=['sparse_categorical_accuracy', 'sparse_top_k_categorical_accuracy']")
    assert len(params.metrics) == 2


def test_fit_params():
    assert mc.parse_fit_params("batch_size=64, epochs=2, shuffle=False") == {
        "batch_size": 64, "epochs": 2, "shuffle": False}
    assert mc.fit_params_text({"batch_size": 64, "epochs": 1}) == "batch_size=64,epochs=1"
    assert mc.parse_fit_params(None) == {} and mc.parse_fit_params("  ") == {}
    assert mc.parse_fit_params("class_weight={0: 1.0, 1: 2.5}")["class_weight"] == {0: 1.0, 1: 2.5}


@pytest.mark.parametrize(("text", "sqlstate", "match"), [
    ("optimizer='Adamm()', loss='mse'", "22023", "not a Keras optimizer"),
    ("optimizer='Adam(lr=0.1, dekay=0.01)', loss='mse'", "22023", "has no argument 'dekay'"),
    ("optimizer='Adam(lr=0.1, decay=-0.01)', loss='mse'", "22023", "decay=-0.01 is out of range"),
    ("optimizer='Adam(lr=0.1, decay=None)', loss='mse'", "22023", "must be a number at least 0"),
    ("optimizer='Adam', loss='mse', metrics=['top_0_accuracy']", "22023", "metric 'top_0_accuracy'"),
    ("optimizer='Adam', loss='mse', metrics=['top_k_accuracy']", "22023", "metric 'top_k_accuracy'"),
    ("optimizer='Adam(lr=float(1))', loss='mse'", "42601", "not a literal"),
    ("optimizer='Adam', loss='no_such_loss'", "22023", "loss 'no_such_loss' is not supported"),
    ("optimizer='Adam', loss='mse', metrics=['accuracy', 'f1_custom']", "22023", "metric 'f1_custom'"),
    ("optimizer='Adam', loss='mse', metrics='accuracy', run_eagerly=True", "22023", "run_eagerly is not accepted"),
    ("optimizer='Adam'", "22023", "needs a loss"),
    ("optimizer='Adam', loss='mse'; DROP TABLE t", "42601", "not valid"),
    ("loss=__import__('os').system('id')", "42601", "not a literal"),
    ("optimizer=__import__('os').system('id'), loss='mse'", "42601", "expected Name"),
    ("__import__('os').system('id')", "42601", "every value needs a key"),
    ("loss='mse', loss='mae'", "42601", "given twice"),
    ("loss='mse'), (1", "42601", "expected key=value"),
])
def test_bad_compile_params(text, sqlstate, match):
    with pytest.raises(MadlibMopError, match=match) as raised:
        mc.parse_compile_params(text)
    assert raised.value.sqlstate == sqlstate and raised.value.hint


@pytest.mark.parametrize(("text", "match"), [
    ("batch_size=0", "positive integer"), ("epochs=1.5", "positive integer"),
    ("verbose=7", "0, 1 or 2"), ("callbacks='[TensorBoard()]'", "a list of TensorBoard"),
    ("validation_split=0.1", "validation_split is not accepted"),
    ("batch_size='64'", "positive integer"), ("shuffle=1", "True or False"),
])
def test_bad_fit_params(text, match):
    with pytest.raises(MadlibMopError, match=match):
        mc.parse_fit_params(text)


@pytest.mark.parametrize(("text", "match"), [
    ("__import__('os').system('id')", "not a dict literal"),
    ("{'loss': ['mse'], 'x': open('/etc/passwd')}", "not a dict literal"),
    ("{'loss': 'mse'}", "must be a non-empty list"),
    ("['mse']", "must be a non-empty dict"),
    ("{'loss': ['mse']", "not a dict literal"),
    ("", "is empty"),
])
def test_bad_grids(text, match):
    with pytest.raises(MadlibMopError, match=match):
        mc.parse_grid(text, "compile_params_grid")


def test_whitelisted_names_exist_in_keras():
    import keras

    for loss in mc.LOSSES:
        assert keras.losses.get(loss) is not None, loss
    for metric in mc.METRICS - {"accuracy", "acc"}:
        assert keras.metrics.get(metric) is not None, metric
    import inspect

    for name in mc.OPTIMIZERS.values():  # the grammar's table is Keras' signatures
        signature = inspect.signature(getattr(keras.optimizers, name).__init__).parameters
        assert mc.optimizer_parameters(name) == set(signature) - {"self", "kwargs"}, name


# ---- Keras 2 idioms of MADlib's examples ------------------------------------------------------

def test_an_argument_of_none_is_keras_default():
    """Keras 2's Adam(epsilon=None) meant the default epsilon; Keras 3 refuses None."""
    import keras

    from madlib_mop.runtime.training import optimizer_arguments

    optimizer = mc.parse_optimizer("Adam(lr=0.01, epsilon=None)")
    assert str(optimizer) == "Adam(lr=0.01,epsilon=None)"  # kept as written
    assert optimizer_arguments(optimizer) == {"learning_rate": 0.01}
    built = keras.optimizers.Adam(**optimizer_arguments(optimizer))
    assert built.epsilon == keras.optimizers.Adam().epsilon


def test_decay_is_kept_as_written_and_becomes_keras2s_schedule():
    import keras

    from madlib_mop.runtime.training import optimizer_arguments

    text = "optimizer='Adam(lr=0.01,decay=0.5)',loss='categorical_crossentropy'"
    params = mc.parse_compile_params(text)
    assert str(params) == text and params.optimizer.scheduled
    assert params.optimizer.written_arguments() == {"learning_rate": 0.01, "decay": 0.5}
    schedule = optimizer_arguments(params.optimizer)["learning_rate"]
    assert isinstance(schedule, keras.optimizers.schedules.InverseTimeDecay)
    assert list(optimizer_arguments(params.optimizer)) == ["learning_rate"]
    optimizer = keras.optimizers.Adam(**optimizer_arguments(params.optimizer))
    for steps in (0, 1, 7, 100):  # Keras 2: lr / (1 + decay * iterations)
        optimizer.iterations.assign(steps)
        assert float(optimizer.learning_rate) == pytest.approx(0.01 / (1 + 0.5 * steps), rel=1e-6)
    # Without lr, the optimizer's own default decays; decay=0 is no schedule at all.
    assert optimizer_arguments(mc.parse_optimizer("SGD(decay=1e-4)"))["learning_rate"] \
        .get_config()["initial_learning_rate"] == 0.01
    assert optimizer_arguments(mc.parse_optimizer("Adam(lr=0.1, decay=0)")) == {"learning_rate": 0.1}
    assert not mc.parse_optimizer("Adam(lr=0.1, decay=0)").scheduled
    # As MADlib's generate_model_configs examples write it.
    assert str(mc.make_optimizer("Adam", [("lr", 0.01), ("decay", 1e-4)], "")) == "Adam(lr=0.01,decay=0.0001)"


def test_top_k_accuracy_for_any_k():
    params = mc.parse_compile_params("loss='categorical_crossentropy', "
                                     "metrics=['top_3_accuracy', 'top_10_accuracy', 'top_k_categorical_accuracy']")
    assert params.metrics == ("top_3_accuracy", "top_10_accuracy", "top_k_categorical_accuracy")
    assert [mc.top_k(m) for m in params.metrics] == [3, 10, None]
    assert mc.top_k("top_03_accuracy") is None and mc.top_k("top_3_accuracy_x") is None
    with pytest.raises(MadlibMopError, match="not supported") as raised:
        mc.parse_compile_params("loss='mse', metrics=['top_3_acc']")
    assert "top_<k>_accuracy (e.g. top_3_accuracy)" in raised.value.hint


def test_tensorboard_callbacks_are_read_never_run():
    text = 'batch_size=32, epochs=1, callbacks=[TensorBoard(log_dir="/tmp/logs/fit", histogram_freq=1)]'
    assert mc.parse_fit_params(text) == {"batch_size": 32, "epochs": 1}  # what training uses
    callbacks = mc.fit_callbacks(text)
    assert callbacks == [mc.Callback("TensorBoard", (("log_dir", "/tmp/logs/fit"), ("histogram_freq", 1)))]
    assert mc.fit_params_text(mc.fit_params_from(mc.parse_keyword_text(text, "fit_params"), text)) == \
        "batch_size=32,epochs=1,callbacks=[TensorBoard(log_dir='/tmp/logs/fit', histogram_freq=1)]"
    assert mc.fit_callbacks("batch_size=8") == [] and mc.fit_callbacks("callbacks=[]") == []


@pytest.mark.parametrize(("text", "sqlstate", "match"), [
    ("callbacks=[EarlyStopping(patience=2)]", "22023", "callback EarlyStopping is not supported"),
    ("callbacks=[TensorBoard(), ModelCheckpoint(filepath='/tmp/m')]", "22023", "ModelCheckpoint"),
    ("callbacks=[TensorBoard('/tmp/logs')]", "42601", "is not a callback such as"),
    ("callbacks=[keras.callbacks.TensorBoard()]", "42601", "is not a callback such as"),
    ("callbacks=[TensorBoard(log_dir=__import__('os').getcwd())]", "42601", "not a literal"),
    ("callbacks=[TensorBoard(**{'log_dir': '/tmp'})]", "42601", "is not a callback such as"),
    ("callbacks=TensorBoard()", "42601", "not a literal"),
])
def test_bad_callbacks(text, sqlstate, match):
    with pytest.raises(MadlibMopError, match=match) as raised:
        mc.parse_fit_params(text)
    assert raised.value.sqlstate == sqlstate and raised.value.hint
    if sqlstate == "22023":
        assert "madlib-mop tensorboard" in raised.value.hint
