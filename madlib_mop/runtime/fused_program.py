"""A fused program (see `runtime.fusion` for what fuses and what a model keeps): K models'
variables stacked, restored from and captured to each model's own state, trained together
by one traced loop over each model's own rows order."""

from __future__ import annotations

import time
from typing import Any, Sequence

import numpy as np

from madlib_mop.runtime import fused_ops, model_state
from madlib_mop.runtime.buffers import Buffer
from madlib_mop.runtime.fusion import (ONE_MINUS, PER_MODEL_ARGUMENTS, SHARED_ARGUMENTS,
                                       per_model_arguments, shape_arguments)
from madlib_mop.runtime.training import ModelSpec, Outcome, compiled_model, labels_for, subepoch_order


class FusedProgram:
    """K models of one fusion key, their variables stacked: restored from and captured to
    each model's own state, trained together over the same rows in each model's own order.

    Built from a template model of the key (`training.compiled_model`): its variables give
    the state's layout, and its layers the steps of the fused forward pass."""

    def __init__(self, spec: ModelSpec, size: int, compiled: bool = False):
        import tensorflow as tf

        self.size = size
        self.template = compiled_model(spec, None)
        # (jobs never ask for it: see COMPILED_GROUP)
        self.compiled = compiled and compiled_loop_pays(self.template, spec, size)
        self.optimizer_name = spec.compile.optimizer.name
        self.loss = spec.compile.loss
        self.metrics = spec.compile.metrics
        self.shared = dict(zip(SHARED_ARGUMENTS[self.optimizer_name], shape_arguments(spec)))
        self.variables = model_state.state_variables(self.template)
        self.layout = [(kind, tuple(v.shape)) for kind, v in self.variables]
        # One stacked variable per variable of the template's state, in its order.
        self.stacked = [tf.Variable(tf.zeros((size,) + tuple(v.shape), dtype=v.dtype),
                                    trainable=False, name=f"fused_{i}")
                        for i, (_, v) in enumerate(self.variables)]
        self.states = model_state.StackedStates(self.variables, self.stacked)
        self._by_id = {id(v): stacked for (_, v), stacked in zip(self.variables, self.stacked)}
        self.trainable = [self._by_id[id(v)] for v in self.template.trainable_variables]
        self._functions: dict[tuple, Any] = {}

    def of(self, variable):
        """The stacked variable of a template variable."""
        return self._by_id[id(variable)]

    # ---- state ----
    def restore(self, blobs: Sequence[bytes | bytearray]) -> None:
        """Each model's whole state, in the order of the group."""
        self.states.restore(blobs)

    def load_weights(self, weights: Sequence[bytes]) -> None:
        """Each model's trained weights (MADlib's `model_weights`: float32, concatenated in
        the order of `model.weights`), for inference.  The other variables (optimizer
        slots, random generators' states) are left as they are: inference reads none."""
        if len(weights) != self.size:
            raise ValueError(f"a fused program of {self.size} models given {len(weights)} weights")
        flats = [np.frombuffer(w, np.float32) for w in weights]
        offset = 0
        for (kind, shape), stacked in zip(self.layout, self.stacked):
            if kind != "weights":
                continue
            size = int(np.prod(shape, dtype=np.int64))
            stacked.assign(np.stack([flat[offset:offset + size].reshape(shape) for flat in flats])
                           .astype(stacked.dtype.as_numpy_dtype, copy=False))
            offset += size
        if any(len(flat) != offset for flat in flats):
            raise ValueError(f"weights of {[len(f) for f in flats]} values for a model of {offset}")

    def capture(self) -> list[bytes]:
        """Each model's state, the bytes an unfused program of it would write."""
        return self.states.capture()

    def capture_checked(self) -> tuple[list[bytes], dict[int, str]]:
        """`capture()`, and why models' weights diverged (one is NaN or infinite), by the
        model's index: what `training.Program.nonfinite` finds of an unfused model.  The
        stacked variables are read once for both."""
        rows = self.states.rows()
        return self.states.capture_rows(rows), self.states.nonfinite(rows)

    def nonfinite(self) -> dict[int, str]:
        return self.capture_checked()[1]

    # ---- the fused forward pass ----
    def _function(self, kind: str, x, y):
        """The traced pass for these dtypes and shapes (x, y: tensors), over rows x (rows,
        ...) and their labels y: a training pass in minibatches, each model's its own rows
        (an int32 (K, rows) of each model's row positions in its own order, gathered a
        minibatch at a time inside the loop); or an evaluation of the same rows by every
        model."""
        import tensorflow as tf

        training = kind == "train"
        key = (kind, x.dtype.name, tuple(x.shape[1:]), y.dtype.name, tuple(y.shape[1:]))
        if key not in self._functions:
            k, columns = self.size, _argument_columns(self.optimizer_name)

            def loop(x, y, orders, arguments, batch_size):
                rows = tf.shape(orders)[1] if training else tf.shape(x)[0]
                zeros = (tf.zeros([k]), tf.zeros([k, len(self.metrics)]))

                def rows_of(tensor, start, end):
                    """The minibatch of every model: its own rows, or the shared rows K times."""
                    if training:
                        return tf.gather(tensor, orders[:, start:end])
                    part = tensor[start:end][None]
                    return tf.broadcast_to(part, tf.concat([[k], tf.shape(part)[1:]], 0))

                def body(start, loss_sums, metric_sums):
                    end = tf.minimum(start + batch_size, rows)
                    xb, yb = rows_of(x, start, end), rows_of(y, start, end)
                    if training:
                        losses, predicted = _train_step(self, xb, yb, arguments, tf)
                    else:
                        predicted = fused_ops.forward(self, xb, False)
                        losses = fused_ops.losses(self, yb, predicted, tf)
                    batch = tf.cast(end - start, tf.float32)
                    return (end, loss_sums + losses * batch,
                            metric_sums + fused_ops.metric_sums(self, yb, predicted, tf))

                _, loss_sums, metric_sums = tf.while_loop(
                    lambda start, *_: start < rows, body, (tf.constant(0),) + zeros,
                    parallel_iterations=1)
                return loss_sums, metric_sums

            specs = [tf.TensorSpec((None,) + tuple(x.shape[1:]), x.dtype),
                     tf.TensorSpec((None,) + tuple(y.shape[1:]), y.dtype),
                     tf.TensorSpec((k, None), tf.int32),
                     tf.TensorSpec((k, columns), tf.float32), tf.TensorSpec((), tf.int32)]
            self._functions[key] = tf.function(loop, autograph=False,
                                               input_signature=specs).get_concrete_function()
        return self._functions[key]

    def predict(self, x: np.ndarray, batch_size: int) -> np.ndarray:
        """Each model's outputs (K, rows, ...) for the same rows x (rows, ...), in batches
        of `batch_size` rows (traced once per dtype and row shape)."""
        import tensorflow as tf

        key = ("predict", x.dtype.str, x.shape[1:])
        if key not in self._functions:
            def forward(rows):
                stacked = tf.broadcast_to(rows[None], tf.concat([[self.size], tf.shape(rows)], 0))
                return fused_ops.forward(self, stacked, False)
            self._functions[key] = tf.function(forward, autograph=False, input_signature=[
                tf.TensorSpec((None,) + x.shape[1:], tf.as_dtype(x.dtype))]).get_concrete_function()
        function = self._functions[key]
        return np.concatenate([function(tf.constant(x[start:start + batch_size])).numpy()
                               for start in range(0, len(x), batch_size)], axis=1)

    def run(self, kind: str, x, y, arguments: np.ndarray, batch_size: int,
            orders=None) -> tuple[np.ndarray, np.ndarray]:
        """Each model's sums over the rows (K,) of its loss (times each minibatch's rows)
        and (K, metrics) of its metrics, over rows x (rows, ...) and labels y (arrays or
        tensors).  "train": each model over its own rows, `orders` (K, rows) of int32
        positions in x (an array or a tensor); "test": every model over all the rows in
        their order (`orders` not read)."""
        import tensorflow as tf

        training = kind == "train"
        if training and (orders is None or orders.shape[0] != self.size or orders.dtype != np.int32):
            raise ValueError(f"a fused training run of {self.size} models takes an int32 order of rows for each")
        given = orders if training else np.zeros((self.size, 0), np.int32)
        x, y = tf.convert_to_tensor(x), tf.convert_to_tensor(y)
        if training and self.compiled:
            return _train_compiled(self, x, y, tf.convert_to_tensor(given), arguments, batch_size)
        loss_sums, metric_sums = self._function(kind, x, y)(
            x, y, tf.convert_to_tensor(given), tf.constant(arguments, tf.float32),
            tf.constant(batch_size, tf.int32))
        return loss_sums.numpy(), metric_sums.numpy()


# A group of at most COMPILED_GROUP models, none of whose layers draws random numbers,
# whose step is small (a model's weights x batch size at most COMPILED_LIMIT), trains its
# full minibatches in one XLA-compiled loop (TensorFlow's jit_compile; the last, partial
# minibatch in the traced loop): XLA joins the step's hundreds of small operations into a
# few kernels, where a small step's time goes.  Measured (bench_fusion, one thread, 100,000
# rows, a pair): 0.44-0.58x the traced fused loop at batch 32-64, 0.71-0.84x at 256; groups
# of 16, and a pair's steps of 43 M, were as fast or slower compiled.  Dropout is left out: XLA draws
# other masks than the unfused model's from the same seeds.
# Jobs do not use it (workers build their fused programs traced): in a job's worker
# session the XLA-compiled call corrupted the process's heap ("corrupted size vs.
# prev_size", "free(): invalid pointer"; the server then restarts every session), in
# every run of W5's 64 MLPs in compiled groups of 8 and in one of two runs of compiled
# pairs at batch 256 and 512; never in a Python process, nor in PL/Python functions
# running the same calls on the server's own rows and hop files outside a job (cause not
# found; docs/architecture.md).  Kept for bench_fusion and its tests, which measure and
# check it in a Python process.
COMPILED_GROUP = 8
COMPILED_LIMIT = 9_000_000
# The compiled loop's rows are padded to one of a few sizes (at most 1/8 more), so that the
# segments of a job, of about the same size, share one compilation (about 1.5 s).
_ROW_BUCKET_BITS = 3


def compiled_loop_pays(template: Any, spec: ModelSpec, size: int) -> bool:
    """Whether a fused program of `size` models of `template` (built from `spec`) trains in
    a compiled loop (see COMPILED_GROUP): decided from the configuration and the group's
    size alone, so a job run again or resumed compiles the same groups."""
    if size > COMPILED_GROUP or any(type(layer).__name__ == "Dropout" for layer in template.layers):
        return False
    return template.count_params() * spec.fit.get("batch_size", 32) <= COMPILED_LIMIT


def padded_rows(rows: int) -> int:
    """`rows` rounded up to a multiple of 2^(bits(rows) - 1 - _ROW_BUCKET_BITS)."""
    unit = 1 << max(0, rows.bit_length() - 1 - _ROW_BUCKET_BITS)
    return -(-rows // unit) * unit


def _compiled_loop(program: FusedProgram, batch: int, x, y):
    """The program's training loop over `steps` full minibatches of `batch` rows, compiled
    by XLA: traced once for these dtypes and row shapes, compiled once per number of
    (padded) rows."""
    import tensorflow as tf

    k, columns = program.size, _argument_columns(program.optimizer_name)

    def loop(x, y, orders, arguments, steps):
        def body(step, loss_sums, metric_sums):
            positions = tf.slice(orders, [0, step * batch], [k, batch])
            xb, yb = tf.gather(x, positions), tf.gather(y, positions)
            losses, predicted = _train_step(program, xb, yb, arguments, tf)
            return (step + 1, loss_sums + losses * float(batch),
                    metric_sums + fused_ops.metric_sums(program, yb, predicted, tf))
        zeros = (tf.zeros([k]), tf.zeros([k, len(program.metrics)]))
        _, loss_sums, metric_sums = tf.while_loop(lambda step, *_: step < steps, body,
                                                  (tf.constant(0),) + zeros, parallel_iterations=1)
        return loss_sums, metric_sums
    return tf.function(loop, autograph=False, jit_compile=True, input_signature=[
        tf.TensorSpec((None,) + tuple(x.shape[1:]), x.dtype), tf.TensorSpec((None,) + tuple(y.shape[1:]), y.dtype),
        tf.TensorSpec((k, None), tf.int32), tf.TensorSpec((k, columns), tf.float32), tf.TensorSpec((), tf.int32)])


def _train_compiled(program: FusedProgram, x, y, orders, arguments: np.ndarray, batch: int):
    """`FusedProgram.run`'s training, its full minibatches in the compiled loop: x, y and
    the orders padded to `padded_rows` (the padding never gathered)."""
    import tensorflow as tf

    rows = int(orders.shape[1])
    full = rows // batch
    loss_sums = np.zeros(program.size, np.float32)
    metric_sums = np.zeros((program.size, len(program.metrics)), np.float32)
    if full:
        key = ("compiled", batch, x.dtype.name, tuple(x.shape[1:]), y.dtype.name, tuple(y.shape[1:]))
        if key not in program._functions:
            program._functions[key] = _compiled_loop(program, batch, x, y)
        size = padded_rows(max(rows, int(x.shape[0])))

        def padded(tensor, axis: int):
            missing = size - int(tensor.shape[axis])
            if not missing:
                return tensor
            return tf.pad(tensor, [[0, missing if a == axis else 0] for a in range(tensor.shape.rank)])
        done = program._functions[key](padded(x, 0), padded(y, 0), padded(orders, 1),
                                       tf.constant(arguments, tf.float32), tf.constant(full))
        loss_sums, metric_sums = done[0].numpy(), done[1].numpy()
    if full * batch < rows:  # the last minibatch, of fewer rows
        rest = program._function("train", x, y)(x, y, orders[:, full * batch:], tf.constant(arguments, tf.float32),
                                               tf.constant(batch, tf.int32))
        loss_sums, metric_sums = loss_sums + rest[0].numpy(), metric_sums + rest[1].numpy()
    return loss_sums, metric_sums


def _argument_columns(optimizer_name: str) -> int:
    """The columns of a group's per-model optimizer arguments (`fusion.per_model_arguments`)."""
    return len(PER_MODEL_ARGUMENTS[optimizer_name]) + len(ONE_MINUS[optimizer_name])


def _train_step(program: FusedProgram, xb, yb, arguments, tf):
    """One minibatch's step of every model (xb, yb: (K, rows, ...)): each model's loss
    (K,) and outputs, its variables updated."""
    with tf.GradientTape(watch_accessed_variables=False) as tape:
        tape.watch(program.trainable)
        predicted = fused_ops.forward(program, xb, True)
        losses = fused_ops.losses(program, yb, predicted, tf)
        total = tf.reduce_sum(losses)
    fused_ops.apply_update(program, tape.gradient(total, program.trainable), arguments, tf)
    return losses, predicted


def train_fused_subepoch(program: FusedProgram, specs: Sequence[ModelSpec], buffers: list[Buffer],
                         seed: int, steps: Sequence[int], classification: bool
                         ) -> tuple[list[Outcome], dict[str, float]]:
    """Train the program's models (their states restored, in the order of `specs`) over
    the buffers once, each in its own seeded order (`training.subepoch_order` of its own
    step, `steps` in the order of `specs`), in the minibatches `training.train_subepoch`
    gives it.  The buffers are decoded once for all and held whole (unlike the unfused
    loop, which streams them); each model's minibatch is gathered from them inside the
    traced loop, so no model's copy of the rows is ever made whole.  Returns each model's
    outcome and the seconds spent decoding, ordering the rows ("gather") and training."""
    import tensorflow as tf

    seconds = {"decode": 0.0, "gather": 0.0, "train": 0.0}
    if not buffers:
        return [Outcome() for _ in specs], seconds
    fit = specs[0].fit
    started = time.perf_counter()
    loaded = [buffer.load() for buffer in buffers]
    if any(isinstance(x, list) or isinstance(y, list) for x, y in loaded):
        raise ValueError("a fused program takes one input and one output")
    offsets = np.cumsum([0] + [len(x) for x, _ in loaded])
    # The loop's tensors: the concatenation is freed as soon as it is copied into them.  A
    # compiled loop's rows are padded (`padded_rows`) here, not copied again.
    rows = int(offsets[-1])
    features = np.zeros(((padded_rows(rows) if program.compiled else rows),) + loaded[0][0].shape[1:],
                        loaded[0][0].dtype)
    np.concatenate([x for x, _ in loaded], out=features[:rows])
    x_all = tf.convert_to_tensor(features)
    del features
    y_all = tf.convert_to_tensor(labels_for(program.loss, np.concatenate([y for _, y in loaded]),
                                            classification))
    del loaded
    seconds["decode"] = time.perf_counter() - started
    if rows == 0:
        return [Outcome() for _ in specs], seconds
    if rows >= 2**31:  # (the traced loop counts rows in int32)
        raise ValueError(f"a fused call takes a segment of less than 2^31 rows, not {rows}")
    started = time.perf_counter()
    orders = np.zeros((len(specs), rows), np.int32)
    for row, (spec, step) in enumerate(zip(specs, steps, strict=True)):
        order = subepoch_order([b.rows for b in buffers], seed, spec.mst_key, step, fit.get("shuffle", True))
        orders[row] = np.concatenate([offsets[i] + permutation for i, permutation in order])
    orders = tf.convert_to_tensor(orders)  # (the array freed: one copy held while training)
    arguments = np.array([per_model_arguments(spec) for spec in specs], np.float32).reshape(len(specs), -1)
    seconds["gather"] = time.perf_counter() - started
    started = time.perf_counter()
    loss_sums, metric_sums = program.run("train", x_all, y_all, arguments, fit.get("batch_size", 32), orders)
    seconds["train"] = time.perf_counter() - started
    outcomes = [Outcome() for _ in specs]
    for k, outcome in enumerate(outcomes):
        values = {"loss": loss_sums[k] / rows}
        values.update({name: metric_sums[k, i] / rows for i, name in enumerate(program.metrics)})
        outcome.add(rows, values)
        outcome.seconds_train = seconds["train"] / len(outcomes)
    return outcomes, seconds


def evaluate_fused(program: FusedProgram, specs: Sequence[ModelSpec], buffers: list[Buffer],
                   classification: bool, batch_size: int = 1024) -> list[Outcome]:
    """Loss and metrics of each of the program's models over the buffers, as
    `training.evaluate` gives them one model at a time; each buffer decoded once for all.
    (Not the models' inference cost, `Outcome.seconds_per_row`, which `training.evaluate`
    measures.)"""
    # (the optimizer's arguments are an input of the traced loop; evaluation reads none)
    arguments = np.array([per_model_arguments(spec) for spec in specs], np.float32).reshape(len(specs), -1)
    outcomes = [Outcome() for _ in specs]
    for buffer in buffers:
        x, y = buffer.load()
        if isinstance(x, list) or isinstance(y, list):
            raise ValueError("a fused program takes one input and one output")
        loss_sums, metric_sums = program.run("test", x, labels_for(program.loss, y, classification),
                                             arguments, batch_size)
        for k, outcome in enumerate(outcomes):
            values = {"loss": loss_sums[k] / len(x)}
            values.update({name: metric_sums[k, i] / len(x) for i, name in enumerate(program.metrics)})
            outcome.add(len(x), values)
    return outcomes
