"""Staged transfer learning: a model's frozen first layers computed once per row.

A model whose first layers are frozen (`trainable: false`, as when a trained network is
reused for a new task) computes the same output of those layers for a row at every epoch:
their weights never change, and they behave alike in training and in inference.  A staged
model computes that output, its *features*, once per row and segment, and trains its
trainable rest (the head) on them.  Models whose frozen prefixes are the same layers with the
same weights (several heads on one base network) share one copy of the features.

The prefix staged is the longest run of first layers of a Sequential model that are frozen
and deterministic (`DETERMINISTIC_LAYERS`, no regularizer, no mask); layers without weights
(Flatten, pooling) join it whatever their flag.  Any other layer ends it: a Dropout or a
noise layer (in training they draw anew at every step), an Embedding with mask_zero (the
mask is not part of the features), a model nested as a layer.  A functional model is
trained whole.

The head shares the model's layers, variables and optimizer: a state is restored into the
whole model and captured from it as for any model, so a staged model's state, outputs and
replays are those of the unstaged model.  Between hops on the job's server its frozen
weights stay put: a hop carries a head state (`state.head_meta`), and the prefix's weights
are kept once per job and digest (`job.state_store.HopFiles.keep_prefix`).  The features
of a row are computed by the same layers as inside a training step.  Where a row's output
is the same bits whatever the number of rows computed with it (Dense layers; some
convolutions, on some processors), staged training gives the unstaged weights bit for bit;
oneDNN picks other convolutions' algorithm by the number of rows, and the weights then
agree within float rounding (see docs/architecture.md).
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, Callable

import numpy as np

from madlib_mop.runtime import keras_json, model_state, state, training

# Layers whose output in training is their output in inference when they are frozen (a
# frozen BatchNormalization runs in inference mode in Keras 3).
WEIGHTED_LAYERS = frozenset(
    "Dense EinsumDense Conv1D Conv2D Conv3D Conv1DTranspose Conv2DTranspose Conv3DTranspose "
    "SeparableConv1D SeparableConv2D DepthwiseConv1D DepthwiseConv2D BatchNormalization "
    "LayerNormalization GroupNormalization Embedding PReLU".split())
SHAPING_LAYERS = frozenset(
    "Flatten Reshape Permute RepeatVector Activation ReLU LeakyReLU ELU Softmax "
    "MaxPooling1D MaxPooling2D MaxPooling3D AveragePooling1D AveragePooling2D AveragePooling3D "
    "GlobalMaxPooling1D GlobalMaxPooling2D GlobalMaxPooling3D GlobalAveragePooling1D "
    "GlobalAveragePooling2D GlobalAveragePooling3D ZeroPadding1D ZeroPadding2D ZeroPadding3D "
    "Cropping1D Cropping2D Cropping3D UpSampling1D UpSampling2D UpSampling3D Rescaling "
    "UnitNormalization Identity".split())
DETERMINISTIC_LAYERS = WEIGHTED_LAYERS | SHAPING_LAYERS

FEATURE_ROWS = 1024  # rows whose features are computed in one call


def _layers(config: dict) -> list[dict] | None:
    """A Sequential architecture's layers (Keras 3 layout), its InputLayer left out."""
    if config.get("class_name") != "Sequential":
        return None
    layers = config.get("config", {}).get("layers")
    if not isinstance(layers, list):
        return None
    return [layer for layer in layers if isinstance(layer, dict) and layer.get("class_name") != "InputLayer"]


def frozen_prefix(config: dict) -> int:
    """How many first layers of the architecture (parsed, `keras_json.parse_model_json`)
    are staged: 0 when none (no frozen layer with weights first, a functional model, or
    nothing trainable after them)."""
    layers = _layers(config)
    if not layers:
        return 0
    cut, weighted = 0, False
    for layer in layers:
        name, body = layer.get("class_name"), layer.get("config") or {}
        regularized = any(key.endswith("regularizer") and value is not None for key, value in body.items())
        frozen = body.get("trainable") is False
        # A mask (Embedding's mask_zero) goes from layer to layer beside the output, and
        # features do not carry it.
        masking = bool(body.get("mask_zero"))
        if (name not in DETERMINISTIC_LAYERS or regularized or masking
                or (name in WEIGHTED_LAYERS and not frozen)):
            break
        weighted = weighted or name in WEIGHTED_LAYERS
        cut += 1
    if not weighted or cut == len(layers):
        return 0
    return cut


def prefix_description(config: dict, cut: int) -> str:
    """The prefix's layers as canonical text (names replaced by their order): part of what
    makes two models' features the same."""
    body = config["config"]
    layers = [layer for layer in body["layers"] if layer.get("class_name") == "InputLayer"]
    layers += _layers(config)[:cut]
    return keras_json.canonical_architecture(json.dumps(layers))


class LayerOutput:
    """A model's output for rows, computed as inside a training step (the same traced
    layers, no XLA: `predict` may compile with XLA, whose kernels round otherwise), in
    chunks of FEATURE_ROWS rows, as little-endian float32."""

    def __init__(self, model):
        import tensorflow as tf

        self.model = model
        self.shape = tuple(int(d) for d in model.compute_output_shape((1,) + tuple(model.input_shape[1:]))[1:])
        self._function = tf.function(
            lambda x: model(x, training=False), autograph=False,
            input_signature=[tf.TensorSpec((None,) + tuple(model.input_shape[1:]), tf.float32)],
        ).get_concrete_function()

    def digest(self) -> str:
        """What the output is a function of: the layers (their classes and configurations
        but their names, which Keras may make up anew in each session, in order) and their
        weights."""
        layers = [(type(layer).__name__, {k: v for k, v in layer.get_config().items() if k != "name"})
                  for layer in self.model.layers]
        hashed = hashlib.blake2b(json.dumps(layers, sort_keys=True, default=str).encode(), digest_size=16)
        for variable in self.model.weights:
            hashed.update(np.ascontiguousarray(variable.numpy()).tobytes())
        return hashed.hexdigest()

    def __call__(self, x: np.ndarray) -> np.ndarray:
        import tensorflow as tf

        parts = [self._function(tf.constant(x[start:start + FEATURE_ROWS])).numpy()
                 for start in range(0, len(x), FEATURE_ROWS)]
        if not parts:
            return np.zeros((0,) + self.shape, "<f4")
        return np.concatenate(parts).astype("<f4", copy=False)


class StagedProgram(training.Program):
    """A Program whose model trains and evaluates on features: its `trainer` is the head
    (the layers after the cut, compiled with the model's own optimizer object, so that the
    optimizer's variables are the model's), `prefix` computes the features."""

    def __init__(self, model, spec: training.ModelSpec, cut: int, description: str):
        import keras

        super().__init__(model)
        self.cut = cut
        self.description = description
        self.prefix = keras.Sequential([keras.Input(model.input_shape[1:])] + model.layers[:cut])
        self.feature_shape = tuple(model.layers[cut - 1].output.shape[1:])
        head = keras.Sequential([keras.Input(self.feature_shape)] + model.layers[cut:])
        params = spec.compile
        head.compile(optimizer=model.optimizer, loss=params.loss,
                     metrics=training.keras_metrics(params), **dict(params.extra))
        self.trainer = head
        self.features = LayerOutput(self.prefix)
        # The frozen prefix's weights never change: between hops on the job's server they
        # stay in a file of their own, once per job and digest, and a hop carries the rest
        # (`state.head_meta`).  `held_prefix`: the digest of the prefix weights the model
        # holds now (None: not known since the last whole state restored).
        variables = model_state.state_variables(model)
        frozen = {id(v) for v in self.prefix.weights}
        self.prefix_entries = [i for i, (_, v) in enumerate(variables) if id(v) in frozen]
        self.prefix_state = model_state.ModelState(model, [p for p in variables if id(p[1]) in frozen])
        self.head_state = model_state.ModelState(model, [p for p in variables if id(p[1]) not in frozen])
        self.held_prefix: str | None = None

    @classmethod
    def for_spec(cls, spec: training.ModelSpec) -> training.Program:
        """The staged program of the spec, or a plain one when it has no frozen prefix."""
        from madlib_mop.runtime import keras_json

        config = keras_json.parse_model_json(spec.model_arch)
        cut = frozen_prefix(config)
        if not cut:
            return training.Program.for_spec(spec)
        return cls(training.compiled_model(spec, None), spec, cut, prefix_description(config, cut))

    def restore(self, blob: bytes | bytearray, prefixes: training.PrefixSource | None = None) -> None:
        """A whole state, or a head state whose prefix is the one the model holds or is
        read by `prefixes(digest)` (a context giving the prefix's state)."""
        header, _ = state.split(blob)
        digest = state.head_prefix(header)
        if digest is None:
            self.held_prefix = None  # (also if the restore fails half way)
            self.state.restore(blob)
            return
        if header["meta"]["prefix"]["entries"] != self.prefix_entries:
            raise state.StateFormatError("model state does not fit this model: its frozen layers differ")
        if digest != self.held_prefix:
            if prefixes is None:
                raise state.StateFormatError("a state without its frozen layers, and none to add")
            self.held_prefix = None
            with prefixes(digest) as prefix:
                self.prefix_state.restore(prefix)
            self.held_prefix = digest
        self.head_state.restore(blob)

    def write_head(self, handle) -> None:
        """The model's state but its prefix's weights (a head state) into a file."""
        assert self.held_prefix is not None, "a head state names the prefix the model holds"
        self.head_state.write(handle, state.head_meta(self.held_prefix, self.prefix_entries))

    def write_prefix(self, handle) -> None:
        """The prefix's weights, the state a head state leaves out, into a file."""
        assert self.held_prefix is not None, "a prefix's state names its digest"
        self.prefix_state.write(handle, state.prefix_meta(self.held_prefix))

    def digest(self) -> str:
        """What the restored model's features are a function of: the prefix's layers and
        their weights.  Models of equal digests share features."""
        hashed = hashlib.blake2b(self.description.encode(), digest_size=16)
        for variable in self.prefix.weights:
            hashed.update(np.ascontiguousarray(variable.numpy()).tobytes())
        return hashed.hexdigest()

    def feature_bytes(self, rows: int) -> int:
        return 4 * rows * int(np.prod(self.feature_shape, dtype=np.int64))

    def prefix_seconds_per_row(self, rows: Callable[[], np.ndarray]) -> float:
        """What computing the features costs per row, the best of a few runs on (at most
        COST_ROWS of) `rows()`: a staged model's evaluation runs its head alone, and its
        inference cost is both.  The cost is the prefix's layers', whatever their weights:
        measured once per prefix architecture in a worker session (measured at every
        validation pass, it cost more than the passes themselves)."""
        import time

        if self.description not in _prefix_costs:
            x = rows()[:COST_ROWS]
            self.features(x[:1])  # (a first call of a shape may trace)
            runs = []
            for _ in range(3):
                started = time.perf_counter()
                self.features(x)
                runs.append(time.perf_counter() - started)
            _prefix_costs[self.description] = min(runs) / max(1, len(x))
        return _prefix_costs[self.description]


COST_ROWS = 256
_prefix_costs: dict[str, float] = {}  # prefix description -> seconds per row


def program_for(spec: training.ModelSpec, staged: bool) -> training.Program:
    return StagedProgram.for_spec(spec) if staged else training.Program.for_spec(spec)


def staged_models(configs: list[dict[str, Any]]) -> dict[int, int]:
    """mst_key -> staged layers, of the configurations that have a frozen prefix."""
    from madlib_mop.runtime import keras_json

    cuts = {}
    for config in configs:
        cut = frozen_prefix(keras_json.parse_model_json(config["model_arch"]))
        if cut:
            cuts[config["mst_key"]] = cut
    return cuts
