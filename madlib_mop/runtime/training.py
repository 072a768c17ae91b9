"""One sub-epoch, the narrow waist of MOP: train a model over one segment's rows, once.

Used by the segment workers inside the server and, unchanged, by `madlib_mop.tools.replay` in a
plain Python process, so that a replay of the recorded visits gives the same weights.

The rows of a sub-epoch come in an order drawn from (job seed, model, step): the segment's
buffers in a permuted order, the rows of each buffer permuted.  The order does not depend on
whether the buffers are cached in memory or streamed from the table.
"""

from __future__ import annotations

import functools
import math
import random
import time
from dataclasses import dataclass, field
from typing import Any, Callable, ContextManager, Iterable, Iterator, Mapping

import numpy as np

from madlib_mop.grammar import model_config
from madlib_mop.runtime import custom_functions, keras_json, model_state, state
from madlib_mop.runtime.buffers import Buffer, rows_of
from madlib_mop.runtime.custom_functions import CustomFunctions
from madlib_mop.runtime.tf_runtime import import_tensorflow

SPARSE_LOSSES = {"sparse_categorical_crossentropy"}
_WEIGHTS_FINITE = "__weights_finite__"  # the train loop's check of the weights, beside its metrics
# A staged model's frozen prefix's state by its digest (`runtime.staging`), as a context.
PrefixSource = Callable[[str], ContextManager[Any]]


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
    # The job's custom losses and metrics (`runtime.custom_functions`): in a worker, the
    # callables compile; in the calling session, stand-ins (for initial states).
    custom: CustomFunctions | None = None

    @classmethod
    def of(cls, row: Mapping[str, Any], custom: CustomFunctions | None = None) -> "ModelSpec":
        """From any record of a configuration: a plan's entry (`weights`), a job's models row
        (`initial_weights`) or a segment server's shipped description (neither)."""
        return cls(row["mst_key"], row["model_arch"], row["compile_params"], row["fit_params"],
                   row.get("initial_weights", row.get("weights")), custom)

    # Parsed once: a worker asks at every sub-epoch.
    @functools.cached_property
    def fit(self) -> dict:
        return model_config.parse_fit_params(self.fit_params)

    @functools.cached_property
    def epochs(self) -> int:
        """Fit epochs: passes over each segment per iteration."""
        return model_config.fit_epochs(self.fit_params)

    @functools.cached_property
    def compile(self) -> model_config.CompileParams:
        # (any name: configurations are checked against their object table where they are
        # made, `job.plan`; a name that is no custom function here is Keras' to refuse)
        return model_config.parse_compile_params(self.compile_params, custom_names=None)

    @functools.cached_property
    def program_key(self) -> tuple:
        return program_key(self)


def optimizer_arguments(optimizer: model_config.Optimizer) -> dict[str, Any]:
    """The Keras 3 optimizer's arguments; a Keras 2 decay becomes its learning rate schedule.
    An argument given as None is Keras' default, as Keras 2 read it (MADlib's scripts write
    Adam(epsilon=None)); Keras 3 takes None for a number nowhere."""
    arguments = {key: value for key, value in optimizer.written_arguments().items()
                 if value is not None}
    decay = arguments.pop(model_config.DECAY, None)
    if decay:
        arguments["learning_rate"] = inverse_time_decay(
            optimizer.name, arguments.get("learning_rate"), decay)
    return arguments


def inverse_time_decay(name: str, learning_rate: float | None, decay: float):
    """Keras 2's lr / (1 + decay * iterations), exactly: InverseTimeDecay with one step per
    decay, read at the optimizer's iteration count (which a model's state carries across
    hops).  Without lr, the optimizer's own default."""
    import inspect

    import_tensorflow()
    import keras

    if learning_rate is None:
        learning_rate = inspect.signature(getattr(keras.optimizers, name).__init__) \
            .parameters["learning_rate"].default
    return keras.optimizers.schedules.InverseTimeDecay(
        initial_learning_rate=learning_rate, decay_steps=1, decay_rate=decay)


def seed_initialisers(seed: int) -> None:
    """Seed what Keras' initialisers and seed generators draw from when they are given no
    seed: Python's `random` (Keras 3's `make_default_seed`), and NumPy's and Keras' global
    generator for good measure.  Not `keras.utils.set_random_seed`: it also sets TensorFlow's
    global seed, and TensorFlow then drops its caches of instantiated functions and kernels,
    which made the next call of every traced function of the process ten times slower."""
    from keras.src.backend.common import global_state  # Keras 3.15, pinned in pyproject.toml
    from keras.src.random.seed_generator import GLOBAL_SEED_GENERATOR

    random.seed(seed)
    np.random.seed(seed)
    global_state.set_global_attribute(GLOBAL_SEED_GENERATOR, None)


def compiled_model(spec: ModelSpec, seed: int | None):
    """The compiled Keras model with its optimizer built; initialised from the seed (or the
    architecture table's initial weights).  seed None: the initial values do not matter (a
    state is restored into the model before it is used)."""
    import_tensorflow()
    import keras

    if seed is not None:
        seed_initialisers(derived_seed(seed, spec.mst_key, 0x1A17))
    model = keras_json.model_from_config(keras_json.parse_model_json(spec.model_arch),
                                   initialised=seed is not None)
    if spec.initial_weights is not None:
        model_state.set_flat_weights(model, spec.initial_weights)
    params = spec.compile
    optimizer = getattr(keras.optimizers, params.optimizer.name)(**optimizer_arguments(params.optimizer))
    objects = custom_functions.callables(spec.custom, params.named())
    metrics = keras_metrics(params, objects)
    if len(model.outputs) > 1:
        # MADlib's one list of metrics applies to every output; Keras 3 takes a list per
        # output (each output's own metric objects).
        metrics = [keras_metrics(params, objects) for _ in model.outputs]
    model.compile(optimizer=optimizer, loss=objects.get(params.loss, params.loss),
                  metrics=metrics, **dict(params.extra))
    optimizer.build(model.trainable_variables)
    return model


def keras_metrics(params: model_config.CompileParams, objects: Mapping[str, Any] | None = None) -> list:
    """The metrics to compile: their names, but custom functions (`objects`, from an object
    table) and top_<k>_accuracy, which Keras does not know by name: its top-k accuracy
    (sparse with a sparse loss).  Each is named as written, so results, _info tables and
    evaluations report it under that name."""
    import keras

    objects = objects or {}
    metric = (keras.metrics.SparseTopKCategoricalAccuracy if params.loss in SPARSE_LOSSES
              else keras.metrics.TopKCategoricalAccuracy)
    return [custom_functions.keras_metric(name, objects[name]) if name in objects
            else name if model_config.top_k(name) is None
            else metric(k=model_config.top_k(name), name=name)
            for name in params.metrics]


def program_key(spec: ModelSpec) -> tuple:
    """Models with the same key train by the same function of (state, rows, batch size): the
    same architecture, loss, metrics and optimizer class and arguments, but for the learning
    rate, which Keras keeps in an optimizer variable and so travels in the state.  A decayed
    rate is a schedule, whose constants are traced into the function: it is part of the key.
    The arguments as written: a schedule object neither sorts nor hashes."""
    params = spec.compile
    scheduled = params.optimizer.scheduled
    arguments = tuple(sorted((k, v) for k, v in params.optimizer.written_arguments().items()
                             if k != "learning_rate" or scheduled))
    return (keras_json.canonical_architecture(spec.model_arch), params.optimizer.name, arguments,
            params.loss, params.metrics, repr(params.extra),
            spec.custom.key(params.named()) if spec.custom else ())


def state_layout(spec: ModelSpec) -> list[tuple[str, tuple]]:
    """The kinds and shapes a state of `spec` holds (`state.layout_of`), from the built
    model, without capturing one."""
    return [(kind, tuple(v.shape)) for kind, v in model_state.state_variables(compiled_model(spec, None))]


def initial_states(specs: list[ModelSpec], seed: int) -> dict[int, bytes]:
    """`each_initial_state` of every spec, all at once (for a few small models)."""
    return dict(each_initial_state(specs, seed))


def each_initial_state(specs: list[ModelSpec], seed: int) -> Iterator[tuple[int, bytes]]:
    """(mst_key, step 0) of each model in turn, so that a caller holds one state at a time:
    what `model_state.capture_state(compiled_model(spec, seed))` gives, for less.  The layers are built
    per model (their initialisers draw from the model's seed); the compiled model and its
    optimizer once per program key, since a fresh optimizer's variables depend on the
    weights' shapes and its arguments alone, and of those only the learning rate differs
    within a key."""
    import keras

    templates: dict[tuple, tuple] = {}
    for spec in specs:
        key = spec.program_key
        if key not in templates:
            model = compiled_model(spec, seed)
            templates[key] = (model, [np.asarray(v.numpy()) for v in model.optimizer.variables])
            yield spec.mst_key, model_state.capture_state(model)
            continue
        model, fresh = templates[key]
        seed_initialisers(derived_seed(seed, spec.mst_key, 0x1A17))
        layers = keras_json.model_from_config(keras_json.parse_model_json(spec.model_arch))
        if spec.initial_weights is not None:
            model_state.set_flat_weights(layers, spec.initial_weights)
        params = spec.compile.optimizer
        rate = getattr(keras.optimizers, params.name)(**optimizer_arguments(params)).learning_rate
        optimizer = [np.asarray(rate.numpy()) if v.name == "learning_rate" else value
                     for v, value in zip(model.optimizer.variables, fresh)]
        values = ([v.numpy() for v in layers.weights] + [v.numpy() for v in model_state.other_variables(layers)]
                  + optimizer)
        yield spec.mst_key, state.encode([state.Entry(kind, v.path, np.asarray(value))
                                          for (kind, v), value in zip(model_state.state_variables(model), values)])


EVALUATION_BATCH = 1024  # rows per batch of `Program.evaluate`


class Program:
    """A compiled Keras model with one traced function for a whole pass of training over a
    chunk of rows, and one for evaluating a chunk.

    Keras' `fit` runs Python between steps (about 3 ms a step here against 0.47 ms in this
    loop, for W1's MLPs in `make bench`); on small models that is most of the time.
    Here a call runs all of a chunk's minibatches inside one TensorFlow graph: the same
    `train_step` as `fit`, on the same slices in the same order, so the weights are the
    same bits as `fit(x, y, batch_size, shuffle=False)` gives.

    One program serves every model of the same `program_key` on a worker: each call first
    restores the model's whole state (weights, optimizer variables including the learning
    rate, random generator states), so the functions are traced once per key, not once per
    model, and a worker holds one Keras model per key."""

    def __init__(self, model):
        self.model = model
        # What trains and evaluates: the model, or a staged model's head (`runtime.staging`)
        self.trainer = model
        self.state = model_state.ModelState(model)  # restored and read out at every hop
        self._functions: dict[tuple, object] = {}
        self.traced = 0  # functions traced so far (a visit that traced none found them ready)
        self.last_seconds = 0.0  # the last train or evaluate call's run, without tracing
        self.weights_finite = True  # after the last train call: no weight NaN or infinite

    @classmethod
    def for_spec(cls, spec: ModelSpec) -> "Program":
        return cls(compiled_model(spec, None))

    # ---- state: the model's (`runtime.model_state`) ----
    def restore(self, blob: bytes | bytearray, prefixes: PrefixSource | None = None) -> None:
        """`blob`: a whole state (`prefixes`: for a staged program's head states)."""
        self.state.restore(blob)

    def capture(self) -> bytes | bytearray:
        return self.state.capture()

    def write_state(self, handle) -> None:
        """`capture()`'s bytes into a file; a big state a part of a variable at a time."""
        self.state.write(handle)

    # ---- traced loops ----
    def _function(self, kind: str, *arrays):
        """The traced loop for arrays of these dtypes and trailing shapes (any row count);
        features and labels are arrays, or lists of them (a model of several inputs or
        outputs)."""
        import tensorflow as tf

        key = (kind,) + tuple(None if a is None else each(a, lambda v: (v.dtype.str, v.shape[1:]), tuple)
                              for a in arrays)
        if key not in self._functions:
            data = tuple(None if a is None else each(a, lambda v: v[:1]) for a in arrays)
            # Builds the compiled metrics' and loss' variables outside the traced function,
            # as fit does before its first step (Keras 3.15, pinned in pyproject.toml).
            self.trainer._symbolic_build(data_batch=data if data[-1] is not None else data[:2])
            specs = [each(a, lambda v: tf.TensorSpec((None,) + v.shape[1:], tf.as_dtype(v.dtype)))
                     for a in arrays if a is not None]
            step = self.trainer.train_step if kind == "train" else self.trainer.test_step

            def loop(*tensors):
                *data, batch_size = tensors
                rows = tf.shape(tf.nest.flatten(data[0])[0])[0]

                def body(start):
                    end = tf.minimum(start + batch_size, rows)
                    step(tuple(each(t, lambda v: v[start:end]) for t in data))
                    return (end,)

                # One iteration at a time: each step reads the variables the last one wrote.
                tf.while_loop(lambda start: start < rows, body, (tf.constant(0),),
                              parallel_iterations=1)
                results = dict(self.trainer.get_metrics_result())
                if kind == "train":
                    # The divergence check in the same graph, after the loop's writes (read
                    # in program order): copying each weight out took longer than a tiny
                    # model's training on a segment.  The trainer's weights: a staged
                    # model's frozen prefix does not change (`runtime.staging`).
                    results[_WEIGHTS_FINITE] = tf.reduce_all(
                        [tf.reduce_all(tf.math.is_finite(v)) for v in self.trainer.weights
                         if tf.as_dtype(v.dtype).is_floating] or [tf.constant(True)])
                return results

            self._functions[key] = tf.function(
                loop, autograph=False,
                input_signature=specs + [tf.TensorSpec((), tf.int32)]).get_concrete_function()
            self.traced += 1
        return self._functions[key]

    def _run(self, kind: str, x, y, sample_weight: np.ndarray | None, batch_size: int) -> dict:
        import tensorflow as tf

        fresh = len(self._functions)
        function = self._function(kind, x, y, sample_weight)
        fresh = len(self._functions) > fresh
        arrays = [x, y] + ([sample_weight] if sample_weight is not None else [])
        if fresh and kind == "test":
            # A concrete function's first call also optimises its graph: done on one row, so
            # that `last_seconds` times evaluation alone (a model's inference cost).
            function(*[each(a, lambda v: tf.constant(v[:1])) for a in arrays],
                     tf.constant(batch_size, tf.int32))
        self.trainer.reset_metrics()
        started = time.perf_counter()
        values = function(*[each(a, tf.constant) for a in arrays], tf.constant(batch_size, tf.int32))
        if kind == "train":
            self.weights_finite = bool(values.pop(_WEIGHTS_FINITE))
        values = {name: float(value) for name, value in values.items()}
        self.last_seconds = time.perf_counter() - started
        return outputs_mean(values, getattr(self.trainer, "output_names", None) or [])

    def train(self, x: np.ndarray, y: np.ndarray, batch_size: int,
              sample_weight: np.ndarray | None = None) -> dict:
        """One pass over the rows in order, in minibatches of batch_size (the last may be
        shorter); the loss and metrics are the means over the rows, as fit reports them."""
        return self._run("train", x, y, sample_weight, batch_size)

    def evaluate(self, x: np.ndarray, y: np.ndarray, batch_size: int = EVALUATION_BATCH) -> dict:
        """Loss and metrics over the rows, as `evaluate(x, y, batch_size)` reports them."""
        return self._run("test", x, y, None, batch_size)

    def nonfinite(self) -> str | None:
        """Why the model's weights diverged after the last train call (one is NaN or
        infinite), else None: a NaN weight makes every later loss NaN, but the step that
        made it may still have reported a finite one."""
        if self.weights_finite:
            return None
        for variable in self.trainer.weights:
            values = np.asarray(variable.numpy())
            if values.dtype.kind == "f" and not np.isfinite(values).all():
                return f"weight {variable.path} is not finite"
        return "a weight is not finite"


def each(value, function, container=list):
    """`function` of an array, or of each array of a list (a model's several inputs or
    outputs), as a `container`."""
    return container(function(v) for v in value) if isinstance(value, list) else function(value)


def outputs_mean(values: dict, output_names: list[str]) -> dict:
    """Keras' results, and for a model of several outputs each metric's mean over its
    outputs under the metric's own name (Keras reports `<output>_<metric>`; `loss` is the
    total): what the summaries and _info tables report as the model's metric."""
    if len(output_names) < 2:
        return values
    found: dict[str, list[float]] = {}
    for output in output_names:
        for name, value in values.items():
            if name.startswith(output + "_") and name != f"{output}_loss":
                found.setdefault(name[len(output) + 1:], []).append(value)
    for name, per_output in found.items():
        if len(per_output) == len(output_names):
            values.setdefault(name, sum(per_output) / len(per_output))
    return values


def labels_for(loss: str, labels, classification: bool):
    """Packed labels (int16 one-hot, or float32 targets) as the loss wants them: an array,
    or one per output."""
    if classification and loss in SPARSE_LOSSES:
        return each(labels, lambda v: np.argmax(v, axis=1).astype(np.int32))
    return each(labels, lambda v: v.astype(np.float32, copy=False))


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
        xs.append(each(x, lambda v, rows=permutation: v[rows]))
        ys.append(each(y, lambda v, rows=permutation: v[rows]))
        held += len(permutation)
        while held >= limit:
            x_all, y_all = _concatenate(xs), _concatenate(ys)
            head, rest = slice(None, int(limit)), slice(int(limit), None)
            yield each(x_all, lambda v, rows=head: v[rows]), each(y_all, lambda v, rows=head: v[rows])
            xs, ys = [each(x_all, lambda v, rows=rest: v[rows])], [each(y_all, lambda v, rows=rest: v[rows])]
            held -= int(limit)
    if held:
        yield _concatenate(xs), _concatenate(ys)


def _concatenate(parts: list):
    """Concatenated rows of arrays, or of lists of arrays (one per input or output)."""
    if isinstance(parts[0], list):
        return [np.concatenate([part[i] for part in parts]) for i in range(len(parts[0]))]
    return np.concatenate(parts)


@dataclass
class Outcome:
    rows: int = 0
    sums: dict = field(default_factory=dict)  # metric -> sum of value x rows
    seconds_train: float = 0.0
    seconds_per_row: float | None = None  # evaluation's cost: the best of a buffer's timed runs

    def add(self, rows: int, values: dict) -> None:
        self.rows += rows
        for name, value in values.items():
            self.sums[name] = self.sums.get(name, 0.0) + float(value) * rows

    def means(self) -> dict:
        return {name: total / self.rows for name, total in self.sums.items()} if self.rows else {}


def class_weights(labels: np.ndarray, class_weight: dict | None) -> np.ndarray | None:
    """Per-row weights from fit's class_weight ({class index: weight}), as fit computes them."""
    if not class_weight or isinstance(labels, list):  # (refused with several outputs: job.plan)
        return None
    from keras.src.trainers.data_adapters.data_adapter_utils import class_weight_to_sample_weights

    return class_weight_to_sample_weights(labels, class_weight)


def train_subepoch(program: Program, spec: ModelSpec, buffers: list[Buffer], seed: int, step: int,
                   classification: bool, chunk_rows: int | None = None) -> Outcome:
    """Train the program's model (its state restored by the caller) over the buffers once, in
    the seeded order; loss and metrics are the means over the sub-epoch's rows."""
    # No global reseeding here: what is random in training (dropout, noise layers) draws from
    # seed generators whose states are variables of the model, restored from the state; and
    # TensorFlow drops its caches when its global seed changes, which made every sub-epoch
    # after a reseed about ten times slower.
    fit = spec.fit
    batch_size = fit.get("batch_size", 32)
    order = subepoch_order([b.rows for b in buffers], seed, spec.mst_key, step,
                           fit.get("shuffle", True))
    outcome = Outcome()
    loss = spec.compile.loss
    for x, y in _chunks(buffers, order, batch_size, chunk_rows):
        labels = labels_for(loss, y, classification)
        started = time.perf_counter()
        values = program.train(x, labels, batch_size, class_weights(labels, fit.get("class_weight")))
        outcome.seconds_train += time.perf_counter() - started
        outcome.add(rows_of(x), values)
    return outcome


def divergence(metrics: dict) -> str | None:
    """Why a model diverged, or None: its loss or a metric (the means of a sub-epoch or of
    a validation pass) is NaN or infinite (its weights: `Program.nonfinite`)."""
    for name, value in metrics.items():
        if not math.isfinite(value):
            return f"{name} is {value}"
    return None


COST_REPEATS = 2  # runs of a validation pass's first buffer, timed again for its cost
COST_TIMED_SECONDS = 0.05


def evaluate(program: Program, spec: ModelSpec, buffers: Iterable[Buffer],
             classification: bool) -> Outcome:
    """Loss and metrics of the program's model over the buffers (no training)."""
    outcome = Outcome()
    loss = spec.compile.loss
    for number, buffer in enumerate(buffers):
        x, y = buffer.load()
        labels = labels_for(loss, y, classification)
        outcome.add(rows_of(x), program.evaluate(x, labels))
        if number == 0 and rows_of(x):
            # The model's inference cost: one timing of a few ms varies by a factor of 2 with
            # what the other workers do on the same cores; the best of a few runs does not
            # (a run of COST_TIMED_SECONDS or more is timed once: it varies little).
            runs = [program.last_seconds]
            while len(runs) <= COST_REPEATS and program.last_seconds < COST_TIMED_SECONDS:
                program.evaluate(x, labels)
                runs.append(program.last_seconds)
            outcome.seconds_per_row = min(runs) / rows_of(x)
    return outcome
