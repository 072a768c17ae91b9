"""Fused training (madlib_mop.runtime.fusion) against each model trained alone by the unfused
loop (`training.train_subepoch`), in this process, without a database: each model's state
equal within float rounding, its reported loss and metrics too, and fused runs repeatable
bit for bit.

Tolerances (measured on this processor; a batched product sums in another order than a
single one): weights and optimizer slots within 2e-5 relative after three sub-epochs of
Dense, BatchNormalization and Dropout models under SGD, Adam and RMSprop, 1e-4 after two of
a convolutional model under Adam; integer variables (iteration counts, seed generator
states) exactly.  The compiled loop (XLA, groups of up to 8 without Dropout): within 1e-4
relative or 1e-5 absolute after two or three sub-epochs, every fusable layer, loss and
optimizer flag."""

from __future__ import annotations

import keras
import numpy as np
import pytest

from madlib_mop.runtime import fused_program, fusion, state, training
from madlib_mop.runtime.buffers import Buffer


def _mlp(dropout: bool = False, batch_norm: bool = False) -> str:
    layers = [keras.Input((6,)), keras.layers.Dense(16, activation="relu")]
    layers += [keras.layers.BatchNormalization()] if batch_norm else []
    layers += [keras.layers.Dropout(0.25)] if dropout else []
    layers += [keras.layers.Dense(8, activation="tanh"), keras.layers.Dense(3, activation="softmax")]
    return keras.Sequential(layers).to_json()


def _cnn() -> str:
    return keras.Sequential([
        keras.Input((8, 8, 2)), keras.layers.Conv2D(4, 3, padding="same", activation="relu"),
        keras.layers.BatchNormalization(), keras.layers.MaxPooling2D(2),
        keras.layers.Conv2D(6, 3, strides=1, activation="relu"), keras.layers.Dropout(0.2),
        keras.layers.GlobalAveragePooling2D(), keras.layers.Dense(3, activation="softmax")]).to_json()


OPTIMIZERS = {
    "Adam": ["Adam(lr=0.01)", "Adam(lr=0.003, beta_1=0.8)", "Adam(lr=0.001, epsilon=1e-5)"],
    "SGD": ["SGD(lr=0.05, momentum=0.9)", "SGD(lr=0.01, momentum=0.5)",
            "SGD(lr=0.1, momentum=0.9)"],
    "RMSprop": ["RMSprop(lr=0.001)", "RMSprop(lr=0.003, rho=0.8)", "RMSprop(lr=0.0005)"],
}


def _specs(architecture: str, optimizers: list[str], loss="categorical_crossentropy",
           batch_size: int = 8) -> list[training.ModelSpec]:
    return [training.ModelSpec(key, architecture,
                               f"optimizer='{optimizer}',loss='{loss}',metrics=['accuracy']",
                               f"batch_size={batch_size}")
            for key, optimizer in enumerate(optimizers, start=1)]


def _buffers(shape: tuple, rows_per_buffer=(23, 19, 30), seed: int = 5) -> list[Buffer]:
    rng = np.random.default_rng(seed)
    buffers = []
    for rows in rows_per_buffer:
        x = rng.standard_normal((rows,) + shape).astype(np.float32)
        flat = x.reshape(rows, -1)
        classes = (flat[:, 0] > 0).astype(int) + (flat[:, 1] > 0.5).astype(int)
        y = np.eye(3, dtype=np.int16)[classes]
        buffers.append(Buffer(rows, lambda x=x, y=y: (x, y)))
    return buffers


def _alone(specs, buffers, steps):
    """Each model trained by the unfused loop; its states and reported metrics."""
    states, reports = {}, {}
    for spec in specs:
        program = training.Program.for_spec(spec)
        program.restore(training.initial_states([spec], 7)[spec.mst_key])
        reports[spec.mst_key] = [training.train_subepoch(program, spec, buffers, 7, step, True).means()
                                 for step in range(steps)]
        states[spec.mst_key] = program.capture()
    return states, reports


def _fused(specs, buffers, steps, compiled: bool = False):
    program = fused_program.FusedProgram(specs[0], len(specs), compiled)
    assert program.compiled == compiled
    program.restore([training.initial_states([spec], 7)[spec.mst_key] for spec in specs])
    reports = {spec.mst_key: [] for spec in specs}
    for step in range(steps):
        outcomes, seconds = fused_program.train_fused_subepoch(program, specs, buffers, 7, [step] * len(specs), True)
        assert set(seconds) == {"decode", "gather", "train"}
        for spec, outcome in zip(specs, outcomes):
            reports[spec.mst_key].append(outcome.means())
    return dict(zip((s.mst_key for s in specs), program.capture())), reports


def _payload(blob) -> bytes:
    """A state's arrays' bytes."""
    return bytes(blob[state.split(blob)[1]:])


def _assert_close(fused: bytes, alone: bytes, rtol=2e-5, atol=2e-6):
    (found, _), (expected, _) = state.decode(fused), state.decode(alone)
    assert state.layout_of(found) == state.layout_of(expected)
    for a, b in zip(found, expected, strict=True):
        if a.array.dtype.kind in "iu":
            assert np.array_equal(a.array, b.array), a.name
        else:
            np.testing.assert_allclose(a.array, b.array, rtol=rtol, atol=atol, err_msg=a.name)


@pytest.mark.parametrize("optimizer", sorted(OPTIMIZERS))
@pytest.mark.parametrize("layers", ["dense", "batch_norm_dropout"])
def test_fused_models_train_as_each_alone(optimizer, layers):
    specs = _specs(_mlp(dropout=layers != "dense", batch_norm=layers != "dense"), OPTIMIZERS[optimizer])
    assert len({fusion.fusion_key(spec) for spec in specs}) == 1
    buffers = _buffers((6,))
    fused, fused_reports = _fused(specs, buffers, 3)
    alone, alone_reports = _alone(specs, buffers, 3)
    for spec in specs:
        _assert_close(fused[spec.mst_key], alone[spec.mst_key])
        for got, expected in zip(fused_reports[spec.mst_key], alone_reports[spec.mst_key], strict=True):
            assert got.keys() == expected.keys()
            assert got == pytest.approx(expected, rel=1e-5)


def _small_cnn() -> str:  # (no Dropout: it compiles)
    return keras.Sequential([
        keras.Input((8, 8, 2)), keras.layers.Conv2D(4, 3, padding="same", activation="relu"),
        keras.layers.BatchNormalization(), keras.layers.MaxPooling2D(2),
        keras.layers.GlobalAveragePooling2D(), keras.layers.Dense(3, activation="softmax")]).to_json()


@pytest.mark.parametrize("optimizer", sorted(OPTIMIZERS))
@pytest.mark.parametrize("layers", ["dense", "batch_norm", "convolution"])
def test_a_compiled_loop_trains_each_model_as_alone(optimizer, layers):
    """A group trained in the compiled loop (its 7 full minibatches of 10 rows compiled,
    the last 2 rows in the traced loop): each model's state and reported metrics as alone,
    within float rounding (weights within 1e-4 relative or 1e-5 absolute after three
    sub-epochs); run again, the same bits."""
    if layers == "convolution":
        specs, buffers = _specs(_small_cnn(), OPTIMIZERS[optimizer], batch_size=10), _buffers((8, 8, 2))
    else:
        specs, buffers = _specs(_mlp(batch_norm=layers == "batch_norm"), OPTIMIZERS[optimizer],
                                batch_size=10), _buffers((6,))
    fused, fused_reports = _fused(specs, buffers, 3, compiled=True)
    alone, alone_reports = _alone(specs, buffers, 3)
    for spec in specs:  # (XLA's own rounding: 1e-5 absolute on weights of about 0.01 under SGD)
        _assert_close(fused[spec.mst_key], alone[spec.mst_key], rtol=1e-4, atol=1e-5)
        for got, expected in zip(fused_reports[spec.mst_key], alone_reports[spec.mst_key], strict=True):
            assert got == pytest.approx(expected, rel=1e-5)
    again, _ = _fused(specs, buffers, 3, compiled=True)
    assert {key: _payload(blob) for key, blob in again.items()} == {key: _payload(blob) for key, blob in fused.items()}


def _compiled_case(case: str) -> tuple[str, str, tuple, str]:
    """(architecture, loss, input shape, optimizer) of a model of each fusable layer, loss
    and optimizer flag that the compiled loop must train as the unfused loop does."""
    image = [keras.Input((6, 6, 2)), keras.layers.Conv2D(3, 3, padding="same", activation="relu")]
    head = [keras.layers.Dense(3, activation="softmax")]
    layers, loss, shape, optimizer = {
        "average_pooling": (image + [keras.layers.AveragePooling2D(2), keras.layers.Flatten()] + head,
                            "categorical_crossentropy", (6, 6, 2), "Adam(lr=0.01)"),
        "global_max_pooling": (image + [keras.layers.GlobalMaxPooling2D()] + head,
                               "categorical_crossentropy", (6, 6, 2), "Adam(lr=0.01)"),
        "reshape": ([keras.Input((6,)), keras.layers.Reshape((2, 3)), keras.layers.Flatten(),
                     keras.layers.Activation("relu"), keras.layers.ReLU(), keras.layers.Dense(3),
                     keras.layers.Softmax()], "categorical_crossentropy", (6,), "Adam(lr=0.01)"),
        "binary_crossentropy": ([keras.Input((6,)), keras.layers.Dense(3, activation="sigmoid")],
                                "binary_crossentropy", (6,), "SGD(lr=0.05, momentum=0.9, nesterov=True)"),
        "mean_squared_error": ([keras.Input((6,)), keras.layers.Dense(3)], "mse", (6,),
                               "Adam(lr=0.01, amsgrad=True)"),
        "mean_absolute_error": ([keras.Input((6,)), keras.layers.Dense(3)], "mae", (6,),
                                "RMSprop(lr=0.01, centered=True, momentum=0.5)"),
    }[case]
    return keras.Sequential(layers).to_json(), loss, shape, optimizer


@pytest.mark.parametrize("case", ["average_pooling", "global_max_pooling", "reshape", "binary_crossentropy",
                                  "mean_squared_error", "mean_absolute_error"])
def test_every_fused_layer_loss_and_optimizer_flag_trains_in_the_compiled_loop(case):
    """The layers, losses and optimizer flags the tests above do not compile, each in a
    pair compiled against each model alone (rows padded from 73 to 80, a last minibatch of
    3 rows)."""
    architecture, loss, shape, optimizer = _compiled_case(case)
    specs = [training.ModelSpec(key, architecture, f"optimizer='{optimizer.replace('lr=0', f'lr={key}')}',"
                                f"loss='{loss}',metrics=['accuracy']", "batch_size=10") for key in (1, 2)]
    buffers = _buffers(shape, (23, 19, 31))
    fused, fused_reports = _fused(specs, buffers, 2, compiled=True)
    alone, alone_reports = _alone(specs, buffers, 2)
    for spec in specs:
        _assert_close(fused[spec.mst_key], alone[spec.mst_key], rtol=1e-4, atol=1e-5)
        for got, expected in zip(fused_reports[spec.mst_key], alone_reports[spec.mst_key], strict=True):
            assert got == pytest.approx(expected, rel=1e-5)


@pytest.mark.parametrize("rows", [(7,), (40, 40), (23, 19, 31)])
def test_a_compiled_loop_over_fewer_rows_than_a_minibatch_or_a_whole_number_of_them(rows):
    """7 rows (no full minibatch of 10: the traced loop alone), 80 (whole minibatches, no
    padding, no last partial one), 73 (padded to 80, a last minibatch of 3): as alone."""
    specs = _specs(_mlp(), OPTIMIZERS["Adam"][:2], batch_size=10)
    buffers = _buffers((6,), rows)
    assert fused_program.padded_rows(sum(rows)) == {7: 7, 80: 80, 73: 80}[sum(rows)]
    fused, _ = _fused(specs, buffers, 2, compiled=True)
    alone, _ = _alone(specs, buffers, 2)
    for spec in specs:
        _assert_close(fused[spec.mst_key], alone[spec.mst_key], rtol=1e-4, atol=1e-5)


def test_a_compiled_model_trains_the_same_whatever_it_is_fused_with():
    """As traced (`test_a_model_trains_the_same_whatever_it_is_fused_with`): model 1
    compiled in a group of three and of two, within 1e-6.  (A group of more than 8, a
    person's clone joining a full group, trains traced: within the traced loop's rounding
    of the compiled one, 1e-4.)"""
    specs = _specs(_mlp(batch_norm=True), OPTIMIZERS["SGD"], batch_size=10)
    three, _ = _fused(specs, _buffers((6,), (23, 19, 31)), 2, compiled=True)
    two, _ = _fused([specs[0], specs[2]], _buffers((6,), (23, 19, 31)), 2, compiled=True)
    _assert_close(three[1], two[1], rtol=1e-6, atol=1e-7)


def test_which_fused_groups_compile_their_loop():
    """Decided from the configuration and the group's size alone: not with Dropout (XLA
    draws other masks), not above 8 models, not for a step of more than 9 M weights x rows;
    and the compiled loop's rows are padded to a few sizes, at most 1/8 more."""
    def compiled(architecture, size=2, batch=8):
        specs = _specs(architecture, ["Adam(lr=0.01)"] * size, batch_size=batch)
        return fused_program.FusedProgram(specs[0], size, True).compiled
    assert compiled(_mlp()) and compiled(_mlp(batch_norm=True)) and compiled(_mlp(), size=8)
    assert not compiled(_mlp(dropout=True)) and not compiled(_mlp(), size=9)
    assert not fused_program.FusedProgram(_specs(_mlp(), ["Adam(lr=0.01)"] * 2)[0], 2).compiled
    wide = keras.Sequential([keras.Input((600,)), keras.layers.Dense(300),
                             keras.layers.Dense(3, activation="softmax")]).to_json()  # 181,203 weights
    assert compiled(wide, batch=49) and not compiled(wide, batch=50)
    for rows in (1, 7, 8, 9, 100, 100_000, 99_873, 100_219, 2**31 - 1):
        padded = fused_program.padded_rows(rows)
        assert rows <= padded <= rows + rows // 8 + 1
    assert fused_program.padded_rows(99_873) == fused_program.padded_rows(100_219)


def test_fused_models_at_their_own_steps_train_as_each_alone():
    """A clone in its source's group trains its own step (5 fewer here): each model's rows
    order comes from its own step, as alone."""
    specs = _specs(_mlp(dropout=True), OPTIMIZERS["Adam"][:2])
    buffers, offsets = _buffers((6,)), [5, 0]
    program = fused_program.FusedProgram(specs[0], 2)
    program.restore([training.initial_states([spec], 7)[spec.mst_key] for spec in specs])
    for step in range(3):
        fused_program.train_fused_subepoch(program, specs, buffers, 7, [step + o for o in offsets], True)
    fused = dict(zip((s.mst_key for s in specs), program.capture()))
    for spec, offset in zip(specs, offsets):
        alone = training.Program.for_spec(spec)
        alone.restore(training.initial_states([spec], 7)[spec.mst_key])
        for step in range(3):
            training.train_subepoch(alone, spec, buffers, 7, step + offset, True)
        _assert_close(fused[spec.mst_key], alone.capture())


def test_fused_convolutions_train_as_each_alone():
    specs = _specs(_cnn(), OPTIMIZERS["Adam"][:2], batch_size=6)
    buffers = _buffers((8, 8, 2), (10, 13))
    fused, _ = _fused(specs, buffers, 2)
    alone, _ = _alone(specs, buffers, 2)
    for spec in specs:
        _assert_close(fused[spec.mst_key], alone[spec.mst_key], rtol=1e-4, atol=1e-5)


def test_a_fused_run_is_repeatable_bit_for_bit():
    specs = _specs(_mlp(dropout=True), OPTIMIZERS["Adam"])
    first, _ = _fused(specs, _buffers((6,)), 2)
    again, _ = _fused(specs, _buffers((6,)), 2)
    for key in first:  # (the names in the headers are Keras' numbering of this process)
        assert _payload(first[key]) == _payload(again[key])


def test_a_model_trains_the_same_whatever_it_is_fused_with():
    """Model 1 in a group of three and in a group of two with another partner: the same
    state within 1e-6 (its own rows order, its own seeds; the others' rows never mix in;
    batched products of other sizes may round otherwise)."""
    specs = _specs(_mlp(dropout=True), OPTIMIZERS["SGD"])
    three, _ = _fused(specs, _buffers((6,)), 2)
    two, _ = _fused([specs[0], specs[2]], _buffers((6,)), 2)
    _assert_close(three[1], two[1], rtol=1e-6, atol=1e-7)


def test_what_fuses_is_decided_from_the_configuration():
    mlp = _mlp()
    key = fusion.fusion_key(_specs(mlp, ["Adam(lr=0.01)"])[0])
    assert key == fusion.fusion_key(_specs(mlp, ["Adam(lr=0.1, beta_2=0.9)"])[0])
    assert key != fusion.fusion_key(_specs(mlp, ["Adam(lr=0.01)"], batch_size=16)[0])
    assert key != fusion.fusion_key(_specs(mlp, ["SGD(lr=0.01)"])[0])
    # momentum 0 and nonzero: states of different layouts
    assert fusion.fusion_key(_specs(mlp, ["SGD(lr=0.01)"])[0]) != \
        fusion.fusion_key(_specs(mlp, ["SGD(lr=0.01, momentum=0.9)"])[0])
    lstm = keras.Sequential([keras.Input((4, 2)), keras.layers.LSTM(3), keras.layers.Dense(3)]).to_json()
    unfused = {
        "layer": _specs(lstm, ["Adam(lr=0.01)"])[0],
        "optimizer": _specs(mlp, ["Adagrad(lr=0.01)"])[0],
        "clipping": _specs(mlp, ["Adam(lr=0.01, clipnorm=1.0)"])[0],
        "decay": _specs(mlp, ["SGD(lr=0.01, decay=1e-4)"])[0],
    }
    for why, spec in unfused.items():
        assert fusion.fusion_key(spec) is None, why
        assert fusion.why_unfused(spec)
    channels_first = keras.Sequential([keras.Input((2, 3, 3)), keras.layers.Flatten(data_format="channels_first"),
                                       keras.layers.Dense(3, activation="softmax")]).to_json()
    assert fusion.why_unfused(_specs(channels_first, ["Adam(lr=0.01)"])[0]) == "layer Flatten is channels-first"
    by_rows = keras.Sequential([keras.Input((4, 3)), keras.layers.Softmax(axis=1)]).to_json()
    assert fusion.why_unfused(_specs(by_rows, ["Adam(lr=0.01)"])[0]) == "a Softmax is not over the last axis"
    frozen = keras.Sequential([keras.Input((6,)), keras.layers.Dense(4, trainable=False),
                               keras.layers.Dense(3, activation="softmax")]).to_json()
    assert fusion.why_unfused(_specs(frozen, ["Adam(lr=0.01)"])[0]) == "a layer is frozen"


def test_auto_fuses_classes_of_small_steps_in_jobs_long_enough():
    """`auto` keeps a class where a step's weights x batch size is at most AUTO_LIMIT and
    its models train enough steps per segment in the job to earn back the tracing of their
    fused program (`steps_to_pay`: fewer for a bigger class); `on` keeps all."""
    from madlib_mop.job import fusing

    mlp = _mlp()
    configs = [{"mst_key": key, "model_arch": mlp, "fit_params": f"batch_size={batch}",
                "compile_params": f"optimizer='Adam(lr={lr})',loss='categorical_crossentropy'"}
               for key, (batch, lr) in enumerate([(64, 0.1), (64, 0.01), (512, 0.1), (512, 0.01)], start=1)]
    weights = fusing.AUTO_LIMIT // 512 + 1  # over the limit at batch 512, under it at 64
    pair = fusing.steps_to_pay(2)
    assert round(pair) == 20_000 and 6_000 < fusing.steps_to_pay(16) < 6_500
    assert fusing.steps_to_pay(40) == fusing.steps_to_pay(16)  # (groups of MAX_GROUP)
    counts = lambda rows: {c["mst_key"]: weights for c in rows}  # noqa: E731
    assert fusing.fusion_classes(configs, "auto", counts, lambda c: pair / 2) == {1: 0, 2: 0}
    assert fusing.fusion_classes(configs, "auto", counts, lambda c: pair / 2 - 1) == {}
    assert fusing.fusion_classes(configs, "on", counts, lambda c: 1) == {1: 0, 2: 0, 3: 1, 4: 1}
    assert fusing.fusion_classes(configs, "off", counts, lambda c: pair / 2) == {}
    # 16 models of one class need fewer steps each than a pair
    sixteen = [dict(configs[0], mst_key=key, compile_params=f"optimizer='Adam(lr={key / 100})',"
                                                            "loss='categorical_crossentropy'")
               for key in range(1, 17)]
    each = fusing.steps_to_pay(16) / 16 + 0.01
    assert len(fusing.fusion_classes(sixteen, "auto", counts, lambda c: each)) == 16
    assert fusing.fusion_classes(sixteen, "auto", counts, lambda c: each - 1) == {}


def test_which_models_evaluate_fused():
    """`fusing.inference_groups`: the models of one class (their fits' batch sizes aside),
    small, two or more, at most 16 a group; none with the setting off."""
    from madlib_mop.job import fusing

    mlp = _mlp()
    specs = ([training.ModelSpec(k, mlp, f"optimizer='Adam(lr={k / 1000})',loss='categorical_crossentropy',"
                                 "metrics=['accuracy']", "") for k in range(1, 19)]
             + _specs(mlp, ["SGD(lr=0.01)"]) + _specs(_cnn(), ["Adam(lr=0.01)", "Adam(lr=0.1)"]))
    small = [1000] * len(specs)
    assert fusing.inference_groups("off", specs, small) == []
    for setting in ("on", "auto"):
        assert fusing.inference_groups(setting, specs, small) == [list(range(16)), [16, 17], [19, 20]]
    # a big model, or one whose weights are kept in pieces, evaluates alone
    assert fusing.inference_groups("on", specs[19:], [1000, None]) == []
    assert fusing.inference_groups("on", specs[:3], [1000, fusing.FUSED_INFERENCE_WEIGHT_BYTES + 4, 1000]
                                    ) == [[0, 2]]


def test_a_fused_state_restores_into_an_unfused_program():
    """States leave a fused program in the unfused format: a model can hop from a fused
    visit to an unfused one."""
    specs = _specs(_mlp(), OPTIMIZERS["Adam"][:2])
    fused, _ = _fused(specs, _buffers((6,)), 1)
    program = training.Program.for_spec(specs[0])
    program.restore(fused[1])
    assert _payload(program.capture()) == _payload(fused[1])


def test_a_fused_models_infinite_weight_is_found_for_it_alone():
    """One learning rate of float32's infinity among three: that model's weights are not
    finite after a step though its reported loss is; its partners' are, and so found."""
    specs = _specs(_mlp(), ["SGD(lr=0.05)", "SGD(lr=1e39)", "SGD(lr=0.01)"])
    program = fused_program.FusedProgram(specs[0], len(specs))
    program.restore([training.initial_states([spec], 7)[spec.mst_key] for spec in specs])
    assert program.nonfinite() == {}
    outcomes, _ = fused_program.train_fused_subepoch(program, specs, _buffers((6,), (8,)), 7, [0] * 3, True)
    assert all(training.divergence(outcome.means()) is None for outcome in outcomes)
    found = program.nonfinite()
    assert list(found) == [1] and found[1].startswith("weight ") and found[1].endswith("is not finite")


def test_fused_evaluation_is_each_models_own():
    """Models trained fused, then evaluated fused over other rows: each model's loss and
    accuracy as the unfused evaluation of its state gives them (BatchNormalization's
    moving statistics and no Dropout at inference)."""
    specs = _specs(_mlp(dropout=True, batch_norm=True), OPTIMIZERS["Adam"])
    trained, _ = _fused(specs, _buffers((6,)), 2)
    held_out = _buffers((6,), (17, 1100), seed=9)  # a buffer longer than one evaluation batch
    program = fused_program.FusedProgram(specs[0], len(specs))
    program.restore([trained[spec.mst_key] for spec in specs])
    fused = fused_program.evaluate_fused(program, specs, held_out, True)
    alone = training.Program.for_spec(specs[0])
    for spec, outcome in zip(specs, fused):
        alone.restore(trained[spec.mst_key])
        expected = training.evaluate(alone, spec, held_out, True).means()
        assert outcome.means().keys() == expected.keys()
        assert outcome.means() == pytest.approx(expected, rel=1e-5)
    assert len({round(o.means()["loss"], 6) for o in fused}) == len(specs)  # three models


@pytest.mark.parametrize("case", ["rows_of_several_steps", "several_sigmoids"])
def test_metrics_are_reported_as_keras_reports_them(case):
    """A metric over outputs of rank 3 is each row's mean, then the rows' mean; "accuracy"
    is chosen by the shapes, as Keras chooses it (3 sigmoid units: categorical)."""
    if case == "rows_of_several_steps":
        architecture = keras.Sequential([keras.Input((2, 3)), keras.layers.Dense(3)]).to_json()
        compiled, shape = "loss='mse',metrics=['mae','mse']", (2, 3)
    else:
        architecture = keras.Sequential([keras.Input((6,)), keras.layers.Dense(3, activation="sigmoid")]).to_json()
        compiled, shape = "loss='binary_crossentropy',metrics=['accuracy']", (6,)
    specs = [training.ModelSpec(key, architecture, f"optimizer='SGD(lr={lr})',{compiled}", "batch_size=8")
             for key, lr in ((1, 0.01), (2, 0.05))]
    buffers = _buffers(shape, (20, 12))
    if case == "rows_of_several_steps":  # float targets of the outputs' shape
        buffers = [Buffer(b.rows, lambda b=b: (b.load()[0], np.tanh(b.load()[0]))) for b in buffers]
    classification = case != "rows_of_several_steps"
    fused = fused_program.FusedProgram(specs[0], 2)
    fused.restore([training.initial_states([spec], 7)[spec.mst_key] for spec in specs])
    outcomes, _ = fused_program.train_fused_subepoch(fused, specs, buffers, 7, [0, 0], classification)
    for spec, outcome in zip(specs, outcomes):
        alone = training.Program.for_spec(spec)
        alone.restore(training.initial_states([spec], 7)[spec.mst_key])
        expected = training.train_subepoch(alone, spec, buffers, 7, 0, classification).means()
        assert outcome.means() == pytest.approx(expected, rel=1e-5)


def test_a_fused_programs_states_go_the_same_bits_per_variable_and_traced():
    """A fused program restores and captures K states by one traced call each way, from
    its first call (`StackedStates.TRACE_AFTER_SECONDS`), or per variable (where that is
    not to be traced, as an unfused state's first calls): both ways give each model's own
    payload, and a non-finite weight is found in the captured rows alike."""
    specs = _specs(_cnn(), OPTIMIZERS["Adam"])
    fused, _ = _fused(specs, _buffers((8, 8, 2)), 1)
    states = [fused[spec.mst_key] for spec in specs]
    per_variable = fused_program.FusedProgram(specs[0], len(specs))
    per_variable.states.TRACE_AFTER_SECONDS = float("inf")
    traced = fused_program.FusedProgram(specs[0], len(specs))
    for program in (per_variable, traced):
        program.restore(states)
        assert [_payload(blob) for blob in program.capture()] == [_payload(blob) for blob in states]
    assert not per_variable.states._traced("assign") and traced.states._traced("assign")
    assert np.array_equal(per_variable.states.rows(), traced.states.rows())
    broken = [bytearray(blob) for blob in states]
    weights = state.decode(states[2])[0][0]  # the first variable: weights, float32
    start = len(states[2]) - len(_payload(states[2]))
    broken[2][start:start + 4] = np.array([np.inf], np.float32).tobytes()
    assert state.decode(broken[2])[0][0].kind == weights.kind == "weights"
    for program in (per_variable, traced):
        program.restore(broken)
        blobs, found = program.capture_checked()
        assert list(found) == [2] and _payload(blobs[2]) == _payload(broken[2])


def test_a_fused_run_gathers_each_models_rows_from_one_copy_of_the_segment(monkeypatch):
    """The fused loop is given the segment's rows once and each model's order of them (its
    own `subepoch_order` at its own step), and gathers each minibatch inside the traced
    loop: one run per sub-epoch, and no model's copy of the rows made whole."""
    specs = _specs(_mlp(), OPTIMIZERS["Adam"])
    buffers = _buffers((6,), rows_per_buffer=(23, 19, 30, 41))
    runs = []
    original = fused_program.FusedProgram.run
    monkeypatch.setattr(fused_program.FusedProgram, "run",
                        lambda self, kind, x, y, arguments, batch, orders=None:
                        runs.append((x, orders)) or original(self, kind, x, y, arguments, batch, orders))
    program = fused_program.FusedProgram(specs[0], len(specs))
    program.restore([training.initial_states([spec], 7)[spec.mst_key] for spec in specs])
    steps = [3, 0, 5]
    fused_program.train_fused_subepoch(program, specs, buffers, 7, steps, True)
    [(x, orders)] = runs
    orders = np.asarray(orders)
    assert x.shape == (113, 6) and orders.shape == (3, 113) and orders.dtype == np.int32
    starts = np.cumsum([0, 23, 19, 30])
    for row, (spec, step) in enumerate(zip(specs, steps)):
        order = training.subepoch_order([23, 19, 30, 41], 7, spec.mst_key, step)
        assert np.array_equal(orders[row], np.concatenate([starts[i] + p for i, p in order]))
    assert len({o.tobytes() for o in orders}) == 3  # (each model's own)
    with pytest.raises(ValueError, match="an int32 order of rows for each"):
        program.run("train", x, x[:, :3], np.zeros((3, 4), np.float32), 8)
    with pytest.raises(ValueError, match="an int32 order of rows for each"):
        program.run("train", x, x[:, :3], np.zeros((3, 4), np.float32), 8, orders.astype(np.int64))


@pytest.mark.parametrize("compiled", [False, True])
def test_fused_models_in_the_rows_order_with_sparse_labels_train_as_each_alone(compiled):
    """fit's shuffle=False (every model over the rows in their order) and integer labels
    (sparse_categorical_crossentropy) fuse as the unfused loop trains them, traced and in
    the compiled loop (72 rows: 7 minibatches of 10 and one of 2)."""
    architecture = _mlp()
    specs = [training.ModelSpec(key, architecture,
                                f"optimizer='{optimizer}',loss='sparse_categorical_crossentropy',"
                                "metrics=['accuracy']", "batch_size=10, shuffle=False")
             for key, optimizer in enumerate(OPTIMIZERS["Adam"], start=1)]
    rng = np.random.default_rng(3)
    buffers = []
    for rows in (23, 19, 30):
        x = rng.standard_normal((rows, 6)).astype(np.float32)
        y = ((x[:, 0] > 0).astype(np.int32) + (x[:, 1] > 0.5).astype(np.int32))[:, None]
        buffers.append(Buffer(rows, lambda x=x, y=y: (x, y)))
    alone, alone_reports = _alone(specs, buffers, 2)
    fused, fused_reports = _fused(specs, buffers, 2, compiled)
    for spec in specs:
        _assert_close(fused[spec.mst_key], alone[spec.mst_key], **({"rtol": 1e-4, "atol": 1e-5} if compiled else {}))
        for report, other in zip(fused_reports[spec.mst_key], alone_reports[spec.mst_key]):
            assert report.keys() == other.keys()
            assert all(report[n] == pytest.approx(other[n], rel=1e-5, abs=1e-6) for n in report)


def test_a_fused_call_over_a_segment_without_rows_trains_nothing():
    specs = _specs(_mlp(), OPTIMIZERS["SGD"])
    program = fused_program.FusedProgram(specs[0], len(specs))
    blobs = [training.initial_states([spec], 7)[spec.mst_key] for spec in specs]
    program.restore(blobs)
    empty = [Buffer(0, lambda: (np.zeros((0, 6), np.float32), np.zeros((0, 3), np.int16)))]
    outcomes, _ = fused_program.train_fused_subepoch(program, specs, empty, 7, [0] * 3, True)
    assert [o.rows for o in outcomes] == [0, 0, 0] and all(o.means() == {} for o in outcomes)
    assert [_payload(b) for b in program.capture()] == [_payload(b) for b in blobs]
