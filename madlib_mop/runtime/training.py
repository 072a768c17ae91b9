"""One sub-epoch, the narrow waist of MOP: train a model over one segment's rows, once.

Used by the segment workers inside the server and, unchanged, by `madlib_mop.tools.replay` in a
plain Python process, so that a replay of the recorded visits gives the same weights.

The rows of a sub-epoch come in an order drawn from (job seed, model, step): the segment's
buffers in a permuted order, the rows of each buffer permuted.  The order does not depend on
whether the buffers are cached in memory or streamed from the table.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Iterable, Iterator

import numpy as np

from madlib_mop.runtime import keras_json, model_config, state
from madlib_mop.runtime.buffers import Buffer
from madlib_mop.runtime.tf_runtime import import_tensorflow

SPARSE_LOSSES = {"sparse_categorical_crossentropy"}


def derived_seed(*parts: int) -> int:
    """A 31-bit seed from integers (job seed, model, step, purpose)."""
    return int(np.random.SeedSequence([int(p) & 0xFFFFFFFF for p in parts]).generate_state(1)[0]) & 0x7FFFFFFF


@dataclass
class ModelSpec:
    """What a job knows of one model: architecture, parameters, initial weights."""

    mst_key: int
    model_arch: str
    compile_params: str
    fit_params: str
    initial_weights: bytes | None = None

    @property
    def fit(self) -> dict:
        return model_config.parse_fit_params(self.fit_params)

    @property
    def compile(self) -> model_config.CompileParams:
        return model_config.parse_compile_params(self.compile_params)


def build_model(spec: ModelSpec, seed: int):
    """The compiled Keras model with its optimizer built; initialised from the seed (or the
    architecture table's initial weights)."""
    import_tensorflow()
    import keras

    keras.utils.set_random_seed(derived_seed(seed, spec.mst_key, 0x1A17))
    model = keras_json.build_model(keras_json.parse_model_json(spec.model_arch))
    if spec.initial_weights is not None:
        keras_json.set_flat_weights(model, spec.initial_weights)
    params = spec.compile
    optimizer = getattr(keras.optimizers, params.optimizer.name)(**params.optimizer.keras_arguments())
    model.compile(optimizer=optimizer, loss=params.loss, metrics=list(params.metrics),
                  **dict(params.extra))
    optimizer.build(model.trainable_variables)
    return model


def _other_variables(model) -> list:
    weight_ids = {id(v) for v in model.weights}
    return [v for v in model.variables if id(v) not in weight_ids]


def capture_state(model) -> bytes:
    entries = [state.Entry("weights", v.path, np.asarray(v.numpy())) for v in model.weights]
    entries += [state.Entry("variables", v.path, np.asarray(v.numpy())) for v in _other_variables(model)]
    entries += [state.Entry("optimizer", v.path, np.asarray(v.numpy())) for v in model.optimizer.variables]
    return state.encode(entries)


def restore_state(model, blob: bytes) -> None:
    entries, _ = state.decode(blob)
    variables = list(model.weights) + _other_variables(model) + list(model.optimizer.variables)
    expected = ([("weights", v) for v in model.weights]
                + [("variables", v) for v in _other_variables(model)]
                + [("optimizer", v) for v in model.optimizer.variables])
    state.check_layout(entries, [state.Entry(k, v.path, np.empty(v.shape)) for k, v in expected])
    for variable, entry in zip(variables, entries):
        variable.assign(entry.array)


def labels_for(loss: str, labels: np.ndarray, classification: bool) -> np.ndarray:
    """Packed labels (int16 one-hot, or float32 targets) as the loss wants them."""
    if classification and loss in SPARSE_LOSSES:
        return np.argmax(labels, axis=1).astype(np.int32)
    return labels.astype(np.float32, copy=False)


def subepoch_order(buffers: list[int], seed: int, mst_key: int, step: int,
                   shuffle: bool = True) -> list[tuple[int, np.ndarray]]:
    """[(buffer index, row permutation)] in the order the sub-epoch reads them."""
    if not shuffle:
        return [(i, np.arange(n)) for i, n in enumerate(buffers)]
    rng = np.random.default_rng(derived_seed(seed, mst_key, step, 0x0DE5))
    return [(int(i), rng.permutation(buffers[int(i)])) for i in rng.permutation(len(buffers))]


def _chunks(buffers: list[Buffer], order, batch_size: int, chunk_rows: int | None
            ) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """Rows in sub-epoch order, in chunks of a multiple of batch_size rows (the last may be
    shorter), so that minibatches are the same whatever the chunk size."""
    limit = math.inf if chunk_rows is None else max(batch_size, chunk_rows // batch_size * batch_size)
    xs, ys, held = [], [], 0
    for index, permutation in order:
        x, y = buffers[index].load()
        xs.append(x[permutation])
        ys.append(y[permutation])
        held += len(permutation)
        while held >= limit:
            x_all, y_all = np.concatenate(xs), np.concatenate(ys)
            cut = int(limit)
            yield x_all[:cut], y_all[:cut]
            xs, ys, held = [x_all[cut:]], [y_all[cut:]], held - cut
    if held:
        yield np.concatenate(xs), np.concatenate(ys)


@dataclass
class Outcome:
    rows: int = 0
    sums: dict = field(default_factory=dict)  # metric -> sum of value x rows
    seconds_train: float = 0.0

    def add(self, rows: int, values: dict) -> None:
        self.rows += rows
        for name, value in values.items():
            self.sums[name] = self.sums.get(name, 0.0) + float(value) * rows

    def means(self) -> dict:
        return {name: total / self.rows for name, total in self.sums.items()} if self.rows else {}


def train_subepoch(model, spec: ModelSpec, buffers: list[Buffer], seed: int, step: int,
                   classification: bool, chunk_rows: int | None = None) -> Outcome:
    """Train `model` over the buffers once, in the seeded order; loss and metrics are the
    means over the sub-epoch's rows."""
    import keras

    fit = spec.fit
    batch_size = fit.get("batch_size", 32)
    keras.utils.set_random_seed(derived_seed(seed, spec.mst_key, step, 0x7EA1))
    order = subepoch_order([b.rows for b in buffers], seed, spec.mst_key, step,
                           fit.get("shuffle", True))
    outcome = Outcome()
    loss = spec.compile.loss
    for x, y in _chunks(buffers, order, batch_size, chunk_rows):
        started = time.perf_counter()
        history = model.fit(x, labels_for(loss, y, classification), batch_size=batch_size,
                            epochs=1, shuffle=False, verbose=0,
                            class_weight=fit.get("class_weight"))
        outcome.seconds_train += time.perf_counter() - started
        outcome.add(len(x), {k: v[-1] for k, v in history.history.items()})
    return outcome


def evaluate(model, spec: ModelSpec, buffers: Iterable[Buffer], classification: bool) -> Outcome:
    """Loss and metrics of the model over the buffers (no training)."""
    outcome = Outcome()
    loss = spec.compile.loss
    for buffer in buffers:
        x, y = buffer.load()
        values = model.evaluate(x, labels_for(loss, y, classification), batch_size=1024,
                                verbose=0, return_dict=True)
        outcome.add(len(x), values)
    return outcome
