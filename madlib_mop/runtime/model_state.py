"""A Keras model's state: every variable it holds (weights, other variables such as random
generators' states, the optimizer's) in one order, captured from the model, written to a
file and restored into it, a part of a variable at a time where a variable is big; the
initial weights of MADlib's format (float32, concatenated) set into a model.  The bytes'
format is `runtime.state`'s."""

from __future__ import annotations

import contextlib
import math
import sys
import time
from typing import Any, Iterator

import numpy as np

from madlib_mop.runtime import state


# A variable bigger than SLICED_VARIABLE_BYTES is read and assigned VARIABLE_CHUNK_BYTES of
# rows at a time: whole, the copy TensorFlow makes on the way in or out is one more
# allocation of its size.  Smaller ones go whole: the sliced ops are sparse accesses, after
# which TensorFlow copies the variable at every dense read (each training step's), which
# made a 1 GB MLP's hops 12% slower; the biggest variables (embeddings) are read sparsely
# by their training anyway.
SLICED_VARIABLE_BYTES = 512 * 1024 * 1024
VARIABLE_CHUNK_BYTES = 64 * 1024 * 1024


def row_slices(variable) -> list[slice | None]:
    """The slices of rows a variable is read and assigned by (None: whole)."""
    shape = tuple(variable.shape)
    size = int(np.prod(shape, dtype=np.int64)) * np.dtype(variable.dtype).itemsize
    if len(shape) == 0 or size <= SLICED_VARIABLE_BYTES or shape[0] < 2:
        return [None]
    rows = max(1, VARIABLE_CHUNK_BYTES // max(1, size // shape[0]))
    return [slice(start, min(start + rows, shape[0])) for start in range(0, shape[0], rows)]


# Slices go through the variable's handle: a gather of rows and a strided assignment touch
# those rows alone, where `variable[rows]` reads the whole variable first (and, once a
# sparse update such as an Embedding's has run, copies it).
def variable_parts(variable) -> Iterator:
    """A variable's values as little-endian arrays of at most VARIABLE_CHUNK_BYTES (but for
    a single row bigger than that), in order."""
    import tensorflow as tf

    for rows in row_slices(variable):
        if rows is None:
            part = np.asarray(variable.numpy())
        else:
            part = tf.raw_ops.ResourceGather(
                resource=variable.handle, indices=tf.range(rows.start, rows.stop, dtype=tf.int64),
                dtype=variable.value.dtype).numpy()
        yield part.astype(part.dtype.newbyteorder("<"), copy=False)


def assign_variable(variable, array) -> None:
    """`variable.assign(array)`, a slice of rows at a time when it is big."""
    import tensorflow as tf

    for rows in row_slices(variable):
        if rows is None:
            variable.assign(array)
            continue
        shape = list(variable.shape)
        tf.raw_ops.ResourceStridedSliceAssign(
            ref=variable.handle, begin=[rows.start] + [0] * (len(shape) - 1),
            end=[rows.stop] + shape[1:], strides=[1] * len(shape),
            value=tf.constant(array[rows], dtype=variable.value.dtype))


def set_flat_weights(model, weights: bytes) -> None:
    """Load MADlib-format weights (float32, concatenated) into the model."""
    flat = np.frombuffer(weights, dtype=np.float32)
    offset = 0
    # One variable at a time, in slices when big (not set_weights(get_weights()-shaped
    # arrays): copies of them all, maybe GBs).
    for variable in model.weights:
        shape = tuple(variable.shape)
        size = int(np.prod(shape, dtype=np.int64))
        assign_variable(variable, flat[offset:offset + size].reshape(shape).astype(variable.dtype, copy=False))
        offset += size


def other_variables(model) -> list:
    """The model's variables that are not weights (random generators' states, ...)."""
    weight_ids = {id(v) for v in model.weights}
    return [v for v in model.variables if id(v) not in weight_ids]


def state_variables(model) -> list[tuple[str, object]]:
    """(kind, variable) of everything a state holds, in the state's order."""
    return ([("weights", v) for v in model.weights]
            + [("variables", v) for v in other_variables(model)]
            + [("optimizer", v) for v in model.optimizer.variables])


def state_header(variables: list[tuple[str, Any]]) -> list[dict]:
    """The layout a state of these variables records (`state.layout_item`)."""
    return [state.layout_item(kind, v.path, np.dtype(v.dtype), tuple(v.shape)) for kind, v in variables]


def capture_state(model) -> bytearray:
    """The model's state, each variable copied once into its place (a state may be GBs)."""
    return capture_variables(state_variables(model))


def capture_variables(variables: list[tuple[str, Any]], meta: dict | None = None) -> bytearray:
    """A state of these (kind, variable) pairs, `meta` in its header."""
    head = state.assemble(state_header(variables), b"", meta)
    blob = bytearray(len(head) + sum(int(np.prod(v.shape, dtype=np.int64)) * np.dtype(v.dtype).itemsize
                                     for _, v in variables))
    blob[:len(head)] = head
    offset = len(head)
    for _, variable in variables:
        for part in variable_parts(variable):
            np.frombuffer(blob, np.uint8, part.nbytes, offset)[:] = part.reshape(-1).view(np.uint8)
            offset += part.nbytes
    return blob


def write_variables(variables: list[tuple[str, Any]], handle, meta: dict | None = None) -> None:
    """`capture_variables`' bytes into a file, a part of a variable at a time: never the
    whole state in memory beside the model."""
    handle.write(state.assemble(state_header(variables), b"", meta))
    for _, variable in variables:
        for part in variable_parts(variable):
            handle.write(memoryview(np.ascontiguousarray(part)).cast("B"))


class ModelState:
    """The state of one compiled model (or of a part of its variables), restored into it
    and read out of it at every hop.

    Done per variable, a hop is a call into TensorFlow per variable (tens per model) each
    way.  A traced call each way on the state's bytes costs less per hop (the arrays cut
    from the bytes and bitcast to their dtypes inside the graph), but tracing it costs
    0.1-0.4 s, as much as tens of hops: a model that hops a few times (a short job, a
    model a pruner stops early) never earns it back.  So a state goes per variable until
    that has cost TRACE_AFTER_SECONDS in this program, then by the traced call (so the
    first way costs about twice the better one at most).  Both copy the same bytes.  On
    a big-endian host, for a dtype bitcast does not take, or above RAW_PATH_BYTES, it stays
    per variable."""

    _BITCAST = frozenset("float16 float32 float64 int8 int16 int32 int64 uint8 uint16 uint32 "
                         "uint64".split())
    TRACE_AFTER_SECONDS = 0.25
    # Above this size a state goes one variable at a time all the same: the one traced call
    # would copy the whole state several times more (a string tensor in, its bytes out),
    # and a variable's copy costs far more than a call into TensorFlow.
    RAW_PATH_BYTES = 16 * 1024 * 1024

    def __init__(self, model, variables: list[tuple[str, Any]] | None = None):
        self.model = model
        self.variables = state_variables(model) if variables is None else variables
        self.layout = [(kind, tuple(v.shape)) for kind, v in self.variables]
        self._header = state_header(self.variables)
        self._dtypes = [item["dtype"] for item in self._header]
        self._state_bytes = sum(int(np.prod(v.shape, dtype=np.int64)) * np.dtype(v.dtype).itemsize
                                for _, v in self.variables)
        self._raw_path = (sys.byteorder == "little" and self._state_bytes <= self.RAW_PATH_BYTES
                          and all(np.dtype(v.dtype).name in self._BITCAST for _, v in self.variables))
        self._functions: dict[str, object] = {}
        self._untraced_seconds = {"assign": 0.0, "read": 0.0}

    def _targets(self) -> tuple[list, list[int]]:
        """The variables the traced calls assign and read, and the axes before a state's."""
        return [v for _, v in self.variables], []

    def trace(self) -> None:
        """Trace both calls now (a worker warming up for the jobs to come)."""
        if self._raw_path:
            self._function("assign")
            self._function("read")

    def _traced(self, kind: str) -> bool:
        return self._raw_path and (kind in self._functions
                                   or self._untraced_seconds[kind] >= self.TRACE_AFTER_SECONDS)

    @contextlib.contextmanager
    def _untraced(self, kind: str) -> Iterator[None]:
        started = time.perf_counter()
        yield
        self._untraced_seconds[kind] += time.perf_counter() - started

    def _function(self, kind: str):
        import tensorflow as tf

        if kind not in self._functions:
            # (one state's bytes per variable; a stacked state has K of each, one per row)
            sizes = [int(np.prod(v.shape, dtype=np.int64)) * np.dtype(v.dtype).itemsize
                     for _, v in self.variables]
            variables, leading = self._targets()
            if kind == "assign":
                def assign(payload):
                    raw = tf.io.decode_raw(payload, tf.uint8)
                    start = 0
                    for variable, size in zip(variables, sizes):
                        piece = raw[..., start:start + size]
                        dtype = tf.as_dtype(variable.dtype)
                        value = piece if dtype.size == 1 else tf.reshape(piece, leading + [-1, dtype.size])
                        value = tf.bitcast(value, dtype) if dtype != tf.uint8 else value
                        variable.assign(tf.reshape(value, variable.shape))
                        start += size
                    return tf.constant(0)

                function = tf.function(assign, autograph=False,
                                       input_signature=[tf.TensorSpec(leading, tf.string)])
            else:
                def read():
                    # (a Keras variable's value is a property, a tf.Variable's a method)
                    return tf.concat([tf.reshape(tf.bitcast(tf.convert_to_tensor(v), tf.uint8), leading + [-1])
                                      for v in variables], axis=-1)

                function = tf.function(read, autograph=False)
            self._functions[kind] = function.get_concrete_function()
        return self._functions[kind]

    def restore(self, blob: bytes | bytearray) -> None:
        import tensorflow as tf

        header, offset = state.split(blob)
        state.check_layout(state.header_layout(header), self.layout)
        if self._traced("assign") and [item["dtype"] for item in header["layout"]] == self._dtypes:
            self._function("assign")(tf.constant(bytes(blob[offset:])))
            return
        with self._untraced("assign"):
            for (_, variable), entry in zip(self.variables, state.decode(blob)[0]):
                assign_variable(variable, entry.array)

    def capture(self, meta: dict | None = None) -> bytes | bytearray:
        if self._traced("read"):
            return state.assemble(self._header, self._function("read")().numpy().tobytes(), meta)
        with self._untraced("read"):
            return capture_variables(self.variables, meta)

    def write(self, handle, meta: dict | None = None) -> None:
        """`capture()`'s bytes into a file; a big state a part of a variable at a time."""
        if self._traced("read"):
            handle.write(self.capture(meta))
            return
        with self._untraced("read"):
            write_variables(self.variables, handle, meta)


class StackedStates(ModelState):
    """K models' states held in variables stacked along a leading axis (a fused program's,
    `runtime.fused_program`): each model's own state restored into its row and captured
    from it as the bytes its unfused program would write.  The same two ways as one
    model's state: per variable (a `numpy.stack` of K arrays each) until that has cost
    TRACE_AFTER_SECONDS, then one traced call each way for all K (3 small MLPs restored in
    2.4 ms per variable, 0.8 ms by the traced call).  A stacked state traces at once: its
    fused program's loop costs about 0.5 s to trace, which the program is kept to earn
    back, and tracing its restore and capture costs 0.1-0.15 s more (2 to 16 small MLPs),
    where the untraced way cost 2 ms a call more for 2 MLPs of W2, whose 4 fused programs
    were called about 20 times each per worker and job (never reaching 0.25 s)."""

    TRACE_AFTER_SECONDS = 0.0

    def __init__(self, variables: list[tuple[str, Any]], stacked: list):
        super().__init__(None, variables)
        self.stacked = stacked
        self.size = int(stacked[0].shape[0])
        self._raw_path = self._raw_path and self.size * self._state_bytes <= self.RAW_PATH_BYTES
        # Where each float weight lies in a row of `rows()` (worked out once: read every hop)
        self._float_weights, start = [], 0
        for item in self._header:
            dtype = np.dtype(item["dtype"]).newbyteorder("<")
            size = math.prod(item["shape"]) * dtype.itemsize
            if item["kind"] == "weights" and dtype.kind == "f":
                self._float_weights.append((slice(start, start + size), dtype, item["name"]))
            start += size

    def _targets(self) -> tuple[list, list[int]]:
        return self.stacked, [self.size]

    def restore(self, blobs) -> None:  # (a list of K states, in the order of the rows)
        import tensorflow as tf

        if len(blobs) != self.size:
            raise ValueError(f"a fused program of {self.size} models given {len(blobs)} states")
        payloads, dtypes = [], []
        for blob in blobs:
            header, offset = state.split(blob)
            state.check_layout(state.header_layout(header), self.layout)
            payloads.append(bytes(blob[offset:]))
            dtypes.append([item["dtype"] for item in header["layout"]])
        if self._traced("assign") and all(each == self._dtypes for each in dtypes):
            self._function("assign")(tf.constant(payloads))
            return
        with self._untraced("assign"):
            entries = [state.decode(blob)[0] for blob in blobs]
            for index, stacked in enumerate(self.stacked):
                stacked.assign(np.stack([each[index].array for each in entries]))

    def rows(self) -> np.ndarray:
        """(K, a state's payload bytes) uint8: row k the payload of model k's state."""
        if self._traced("read"):
            return self._function("read")().numpy()
        with self._untraced("read"):
            values = [np.asarray(stacked.numpy()) for stacked in self.stacked]
            return np.concatenate([v.astype(v.dtype.newbyteorder("<"), copy=False).reshape(self.size, -1)
                                   .view(np.uint8) for v in values], axis=1)

    def capture(self, meta: dict | None = None) -> list[bytes]:  # (each model's state)
        return self.capture_rows(self.rows(), meta)

    def write(self, handle, meta: dict | None = None) -> None:
        raise TypeError("a fused program's states are captured (`capture`), one per model")

    def capture_rows(self, rows: np.ndarray, meta: dict | None = None) -> list[bytes]:
        """Each model's state from `rows()`."""
        return [state.assemble(self._header, row.tobytes(), meta) for row in rows]

    def nonfinite(self, rows: np.ndarray) -> dict[int, str]:
        """Why models' weights in `rows` (`rows()`) are not finite, by the model's row."""
        found: dict[int, str] = {}
        for columns, dtype, name in self._float_weights:
            values = np.ascontiguousarray(rows[:, columns]).view(dtype)
            for index in np.flatnonzero(~np.isfinite(values).all(axis=1)):
                found.setdefault(int(index), f"weight {name} is not finite")
        return found
