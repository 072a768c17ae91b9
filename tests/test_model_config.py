"""Compile/fit parameter and grid parsing without a database: literals only, whitelists."""

from __future__ import annotations

import pytest

from madlib_mop.runtime import model_config as mc
from madlib_mop.errors import MadlibMopError


def test_madlib_compile_string_round_trips():
    text = "optimizer='Adam(lr=0.001)',loss='categorical_crossentropy',metrics=['accuracy']"
    params = mc.parse_compile_params(text)
    assert params.optimizer == mc.Optimizer("Adam", (("lr", 0.001),))
    assert params.optimizer.keras_arguments() == {"learning_rate": 0.001}
    assert params.loss == "categorical_crossentropy" and params.metrics == ("accuracy",)
    assert str(params) == text
    assert mc.parse_compile_params(str(params)) == params


@pytest.mark.parametrize("optimizer", ["'adam'", "'Adam()'", "Adam", "Adam()", "'ADAM'"])
def test_optimizer_spellings(optimizer):
    params = mc.parse_compile_params(f"optimizer={optimizer}, loss='mse'")
    assert params.optimizer == mc.Optimizer("Adam", ())


def test_unquoted_values_as_madlib_random_search_writes_them():
    params = mc.parse_compile_params("optimizer=SGD(lr=0.1,momentum=0.9),loss=mse,metrics=[mae]")
    assert params.optimizer.keras_arguments() == {"learning_rate": 0.1, "momentum": 0.9}
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
    ("optimizer='Adam(lr=0.1, decay=0.01)', loss='mse'", "22023", "has no argument 'decay'"),
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
    ("verbose=7", "0, 1 or 2"), ("callbacks=[]", "callbacks is not accepted"),
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
    for name in mc.OPTIMIZERS.values():
        assert "learning_rate" in mc.optimizer_parameters(name)
