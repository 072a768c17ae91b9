"""The compiled training loop (madlib_mop.runtime.training.Program) against Keras' own fit and
evaluate, in this process, without a database: the same bits, also when models share one
program."""

from __future__ import annotations

import keras
import numpy as np
import pytest

from madlib_mop.runtime import model_state, state, training


def _architecture(dropout: bool) -> str:
    layers = [keras.Input((5,)), keras.layers.Dense(12, activation="relu")]
    layers += [keras.layers.Dropout(0.3)] if dropout else []
    layers += [keras.layers.Dense(3, activation="softmax")]
    return keras.Sequential(layers).to_json()


ARCHITECTURES = {dropout: _architecture(dropout) for dropout in (False, True)}


def _spec(mst_key: int, lr: float, loss: str = "categorical_crossentropy", dropout: bool = False,
          batch_size: int = 8) -> training.ModelSpec:
    return training.ModelSpec(mst_key, ARCHITECTURES[dropout],
                              f"optimizer='Adam(lr={lr})',loss='{loss}',metrics=['accuracy']",
                              f"batch_size={batch_size}")


def _data(rows: int = 61, seed: int = 3):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((rows, 5)).astype(np.float32)
    classes = (x[:, 0] > 0).astype(int) + (x[:, 1] > 0.5).astype(int)
    return x, np.eye(3, dtype=np.float32)[classes], classes


def _weights(model) -> list[np.ndarray]:
    return [np.asarray(v.numpy()) for v in model.weights + model.optimizer.variables]


@pytest.mark.parametrize("case", ["plain", "class_weight", "sparse", "dropout"])
def test_a_pass_is_keras_fit_bit_for_bit(case):
    """61 rows in batches of 8: seven full minibatches and one of 5, as fit slices them."""
    x, onehot, classes = _data()
    spec = _spec(1, 0.01, loss="sparse_categorical_crossentropy" if case == "sparse"
                 else "categorical_crossentropy", dropout=case == "dropout")
    y = classes.astype(np.int32) if case == "sparse" else onehot
    class_weight = {0: 1.0, 1: 2.5, 2: 0.5} if case == "class_weight" else None
    reference, program = training.compiled_model(spec, 0), training.Program.for_spec(spec)
    program.restore(model_state.capture_state(reference))
    reported = program.train(x, y, 8, training.class_weights(y, class_weight))
    second = program.train(x[:40], y[:40], 8, training.class_weights(y[:40], class_weight))
    history = reference.fit(x, y, batch_size=8, epochs=1, shuffle=False, verbose=0,
                            class_weight=class_weight).history
    again = reference.fit(x[:40], y[:40], batch_size=8, epochs=1, shuffle=False, verbose=0,
                          class_weight=class_weight).history
    for found, expected in zip(_weights(program.model), _weights(reference), strict=True):
        assert np.array_equal(found, expected)
    assert reported == pytest.approx({k: v[-1] for k, v in history.items()}, rel=0, abs=0)
    assert second == pytest.approx({k: v[-1] for k, v in again.items()}, rel=0, abs=0)


def test_models_sharing_a_program_train_as_each_alone():
    """Two learning rates, one program: the learning rate travels in the state."""
    x, y, _ = _data()
    fast, slow = _spec(1, 0.05), _spec(2, 0.001)
    assert training.program_key(fast) == training.program_key(slow)
    assert training.program_key(fast) != training.program_key(_spec(3, 0.05, dropout=True))
    renamed = training.ModelSpec(4, _architecture(False), fast.compile_params, "")  # dense_9 ...
    assert renamed.model_arch != fast.model_arch
    assert training.program_key(renamed) == training.program_key(fast)
    shared = training.Program.for_spec(fast)
    states = {k: model_state.capture_state(training.compiled_model(s, 0)) for k, s in ((1, fast), (2, slow))}
    alone = {k: training.Program.for_spec(s) for k, s in ((1, fast), (2, slow))}
    for key, program in alone.items():
        program.restore(states[key])
    for rows in (slice(0, 30), slice(30, 61)):  # two hops each, interleaved on one program
        for key in (1, 2):
            shared.restore(states[key])
            shared.train(x[rows], y[rows], 8)
            states[key] = shared.capture()
            alone[key].train(x[rows], y[rows], 8)
    def arrays(blob):  # names are informative only (Keras numbers them per process)
        return [e.array for e in state.decode(blob)[0]]

    for key, program in alone.items():
        for found, expected in zip(arrays(states[key]), arrays(program.capture()), strict=True):
            assert np.array_equal(found, expected)
    assert not np.array_equal(arrays(states[1])[0], arrays(states[2])[0])


def test_a_pass_that_leaves_a_weight_infinite_is_found_though_its_loss_is_finite():
    """One minibatch with a learning rate of float32's infinity: the loss reported is the
    one before the update (finite), the weights after it are not.  The train loop checks
    them in its own graph (`Program.nonfinite`), as the slow copy of every weight did."""
    x, y, _ = _data(rows=8)
    spec = training.ModelSpec(1, ARCHITECTURES[False], "optimizer='SGD(learning_rate=1e39)',"
                              "loss='categorical_crossentropy',metrics=['accuracy']", "batch_size=8")
    program = training.Program.for_spec(spec)
    assert program.nonfinite() is None
    reported = program.train(x, y, 8)
    assert training.divergence(reported) is None
    assert program.nonfinite() is not None and program.nonfinite().endswith("is not finite")
    assert program.nonfinite().startswith("weight ")
    # A sound pass afterwards (the state restored) clears it.
    program.restore(model_state.capture_state(training.compiled_model(spec, 0)))
    program.model.optimizer.learning_rate.assign(0.01)
    program.train(x, y, 8)
    assert program.nonfinite() is None


def test_evaluate_is_keras_evaluate():
    x, y, _ = _data(rows=2500)
    program = training.Program(training.compiled_model(_spec(1, 0.01), 0))
    program.train(x, y, 32)
    expected = program.model.evaluate(x, y, batch_size=1024, verbose=0, return_dict=True)
    assert program.evaluate(x, y) == pytest.approx(expected, rel=0, abs=0)


def test_a_state_of_another_model_is_refused():
    program = training.Program(training.compiled_model(_spec(1, 0.01), 0))
    other = model_state.capture_state(training.compiled_model(_spec(2, 0.01, dropout=True), 0))
    with pytest.raises(ValueError, match="does not fit this model"):
        program.restore(other)


@pytest.mark.parametrize("optimizer", ["Adam(lr={})", "SGD(lr={},momentum=0.9)", "RMSprop(lr={})",
                                       "Adagrad(lr={})", "Adam(lr={},use_ema=True)",
                                       "Adam(lr={},decay=0.1)", "SGD(lr={},decay=0.1)"])
def test_initial_states_are_those_of_models_built_one_by_one(optimizer):
    """Two architectures x two learning rates: each key's second model takes the shortcut."""
    specs = [training.ModelSpec(k, ARCHITECTURES[k % 2 == 0],
                                f"optimizer='{optimizer.format(0.01 * k)}',"
                                "loss='categorical_crossentropy'", "") for k in (1, 2, 3, 4)]
    states = training.initial_states(specs, seed=5)
    for spec in specs:
        expected = state.decode(model_state.capture_state(training.compiled_model(spec, 5)))[0]
        found = state.decode(states[spec.mst_key])[0]
        assert state.layout_of(found) == state.layout_of(expected)
        for a, b in zip(found, expected, strict=True):
            assert a.kind == b.kind and np.array_equal(a.array, b.array), (spec.mst_key, b.name)


@pytest.mark.parametrize("traced", [True, False])
def test_state_bytes_go_in_and_out_whole(monkeypatch, traced):
    """The program's restore and capture, per variable or by the traced call, give the bytes
    of `capture_state` and the model's values; a truncated state is refused."""
    monkeypatch.setattr(model_state.ModelState, "TRACE_AFTER_SECONDS", 0.0 if traced else float("inf"))
    program = training.Program(training.compiled_model(_spec(1, 0.01, dropout=True), 0))
    x, y, _ = _data()
    program.train(x, y, 8)
    blob = program.capture()
    assert blob == model_state.capture_state(program.model)
    other = training.Program(training.compiled_model(_spec(2, 0.01, dropout=True), 3))
    other.restore(blob)
    assert other.capture()[-200:] == blob[-200:]  # names differ in the header, not the values
    for found, expected in zip(_weights(other.model), _weights(program.model), strict=True):
        assert np.array_equal(found, expected)
    with pytest.raises(ValueError, match="truncated"):
        other.restore(blob[:-4])
    assert other.state._traced("assign") == traced and program.state._traced("read") == traced


def test_differently_wired_networks_do_not_share_a_program():
    """Names are normalised, the wiring they express is kept: relu then tanh is another
    program than tanh then relu, built from layers of the same names."""
    def functional(a_first: bool) -> str:
        inputs = keras.Input((5,), name="in")
        a = keras.layers.Dense(5, activation="relu", name="a")
        b = keras.layers.Dense(5, activation="tanh", name="b")
        hidden = b(a(inputs)) if a_first else a(b(inputs))
        return keras.Model(inputs, keras.layers.Dense(3, name="out")(hidden)).to_json()

    compile_params = "optimizer='Adam(lr=0.01)',loss='categorical_crossentropy'"

    def key(arch: str) -> tuple:
        return training.program_key(training.ModelSpec(1, arch, compile_params, ""))

    relu_first, tanh_first = functional(True), functional(False)
    assert key(relu_first) != key(tanh_first)
    assert key(relu_first) == key(relu_first.replace('"a"', '"first"').replace('"b"', '"second"'))
