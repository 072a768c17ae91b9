"""Several models of one architecture trained as one program (horizontal fusion): which
models fuse.  The program is `runtime.fused_program`, its steps `runtime.fused_ops`.

On small models a training step is mostly fixed cost (TensorFlow's per-operation work, small
matrix products that use a fraction of a core).  A fused program holds the variables of K
models of one architecture stacked along a new leading axis and runs each layer as one wide
operation over all K (a batched matrix product, a grouped convolution, ...), so that a step
of K models costs about what one model's step costs.

What a model keeps, fused or not:
- its own rows order (`training.subepoch_order`, seeded by job, model and step): a fused
  step gathers each model's own minibatch from the same decoded rows;
- its own state, in the bytes an unfused program reads and writes (`runtime.state`), with
  the same variables in the same order, so that outputs, resume, replay and warm start see
  ordinary models;
- its own hyperparameters: the learning rate travels in the state as unfused; the other
  arguments of its optimizer (momentum, betas, epsilon, rho) are vectors over the K models;
- its own random draws: a Dropout layer's mask comes from the model's own seed generator
  state, as Keras draws it.
So a model's result does not depend on which models it was fused with.  It equals the
unfused result within float rounding, not bitwise: a batched product sums in another order
than a single one (tolerances measured in tests/test_fusion.py).  One exception: a variable
whose gradient is rounding noise alone (the bias of a Dense layer without activation that
feeds a BatchNormalization, which cancels it) is stepped by Adam at full size whatever the
noise, so it differs between fused and unfused by far more than rounding; the model's
outputs do not depend on it.

Which models fuse is decided from the configuration alone (`fusion_key`): a Sequential
model of the layers in FUSED_LAYERS, one of FUSED_OPTIMIZERS without clipping, decay or
weight decay, a loss of FUSED_LOSSES and metrics of FUSED_METRICS, no class weights; models
of one key also share the batch size and the fit epochs.  Any other model trains unfused.
"""

from __future__ import annotations

import functools

from madlib_mop.runtime import keras_json
from madlib_mop.runtime.training import ModelSpec

FUSED_LAYERS = {"InputLayer", "Dense", "Activation", "ReLU", "Softmax", "Dropout", "Flatten",
                "Reshape", "BatchNormalization", "Conv2D", "MaxPooling2D", "AveragePooling2D",
                "GlobalAveragePooling2D", "GlobalMaxPooling2D"}
# Optimizer arguments that may differ within a group (vectors over its models); the
# learning rate is a variable of each model's state.
PER_MODEL_ARGUMENTS = {"SGD": ("momentum",), "Adam": ("beta_1", "beta_2", "epsilon"),
                       "RMSprop": ("rho", "momentum", "epsilon")}
KERAS_DEFAULTS = {"SGD": {"momentum": 0.0, "nesterov": False},
                  "Adam": {"beta_1": 0.9, "beta_2": 0.999, "epsilon": 1e-7, "amsgrad": False},
                  "RMSprop": {"rho": 0.9, "momentum": 0.0, "epsilon": 1e-7, "centered": False}}
ONE_MINUS = {"SGD": (), "Adam": ("beta_1", "beta_2"), "RMSprop": ("rho",)}
FUSED_OPTIMIZERS = set(PER_MODEL_ARGUMENTS)
# Arguments that shape the traced step or the state's layout (Keras builds momentum slots
# only for a nonzero momentum): the same within a group.
SHARED_ARGUMENTS = {"SGD": ("nesterov",), "Adam": ("amsgrad",), "RMSprop": ("centered",)}
SLOTS_IF_NONZERO = {"SGD": "momentum", "RMSprop": "momentum"}
FUSED_LOSSES = {"categorical_crossentropy", "sparse_categorical_crossentropy",
                "binary_crossentropy", "mean_squared_error", "mse", "mean_absolute_error", "mae"}
FUSED_METRICS = {"accuracy", "acc", "categorical_accuracy", "sparse_categorical_accuracy",
                 "binary_accuracy", "mean_squared_error", "mse", "mean_absolute_error", "mae"}
# Layer arguments that make a layer run code of its own or change its variables after a
# step (regularizers add to the loss, constraints project the weights).
_UNFUSED_ARGUMENTS = ("kernel_regularizer", "bias_regularizer", "activity_regularizer",
                      "gamma_regularizer", "beta_regularizer", "kernel_constraint",
                      "bias_constraint", "beta_constraint", "gamma_constraint",
                      "lora_rank")  # (a low-rank kernel is computed, not a variable)


def why_unfused(spec: ModelSpec) -> str | None:
    """Why this model cannot train fused (None: it can)."""
    config = keras_json.parse_model_json(spec.model_arch)
    if config.get("class_name") != "Sequential":
        return "not a Sequential model"
    for layer in config["config"].get("layers", []):
        name, arguments = layer.get("class_name"), layer.get("config") or {}
        if name not in FUSED_LAYERS:
            return f"layer {name} does not fuse"
        if arguments.get("trainable") is False:
            return "a layer is frozen"
        if any(arguments.get(key) for key in _UNFUSED_ARGUMENTS):
            return f"layer {name} has a regularizer, constraint or low-rank kernel"
        if arguments.get("data_format") not in (None, "channels_last"):
            return f"layer {name} is channels-first"
        if name == "Softmax" and arguments.get("axis", -1) not in (-1, [-1]):
            return "a Softmax is not over the last axis"
        if arguments.get("dtype") not in (None, "float32") and not isinstance(arguments.get("dtype"), dict):
            return "a layer's dtype is not float32"
        if isinstance(arguments.get("dtype"), dict) and \
                (arguments["dtype"].get("config") or {}).get("name", "float32") != "float32":
            return "a layer's dtype policy is not float32"
        if name == "Conv2D" and arguments.get("groups", 1) != 1:
            return "a Conv2D is grouped"
        if name == "BatchNormalization" and (arguments.get("axis", -1) not in (-1, [-1])
                                             or arguments.get("renorm") or arguments.get("synchronized")):
            return "a BatchNormalization is not over the last axis"
        if name == "Dropout" and arguments.get("noise_shape") is not None:
            return "a Dropout has a noise shape"
    params = spec.compile
    optimizer = params.optimizer
    if optimizer.name not in FUSED_OPTIMIZERS:
        return f"optimizer {optimizer.name} does not fuse"
    extra = set(optimizer.written_arguments()) - {"learning_rate", *PER_MODEL_ARGUMENTS[optimizer.name],
                                                 *SHARED_ARGUMENTS[optimizer.name]}
    if extra:
        return f"optimizer argument {sorted(extra)[0]} does not fuse"
    if params.loss not in FUSED_LOSSES:
        return f"loss {params.loss} does not fuse"
    if any(metric not in FUSED_METRICS for metric in params.metrics):
        return "a metric does not fuse"
    if params.extra:
        return "compile arguments beyond optimizer, loss and metrics"
    if spec.custom is not None and spec.custom.key(params.named()):
        return "custom losses or metrics"
    if spec.fit.get("class_weight"):
        return "class weights"
    return None


def fusion_key(spec: ModelSpec) -> tuple | None:
    """Models with the same key can train as one fused program (None: this one trains
    alone): the same architecture, loss, metrics, optimizer class and shape-giving
    arguments, batch size, fit epochs and shuffling."""
    if why_unfused(spec) is not None:
        return None
    params = spec.compile
    name = params.optimizer.name
    fit = spec.fit
    return (keras_json.canonical_architecture(spec.model_arch), name, shape_arguments(spec), params.loss,
            params.metrics, fit.get("batch_size", 32), spec.epochs, fit.get("shuffle", True))


def fusion_class(spec: ModelSpec) -> str | None:
    """`fusion_key` as text, worked out once per configuration (a worker asks at each hop)."""
    if spec.custom is not None:
        key = fusion_key(spec)
        return None if key is None else repr(key)
    return _class_of(spec.model_arch, spec.compile_params, spec.fit_params)


@functools.lru_cache(maxsize=1024)
def _class_of(model_arch: str, compile_params: str, fit_params: str) -> str | None:
    key = fusion_key(ModelSpec(0, model_arch, compile_params, fit_params))
    return None if key is None else repr(key)


def shape_arguments(spec: ModelSpec) -> tuple[bool, ...]:
    """The optimizer's flags that shape its step or its state: the same within a group."""
    name = spec.compile.optimizer.name
    written = spec.compile.optimizer.written_arguments()
    flags = tuple(bool(written.get(key, KERAS_DEFAULTS[name][key])) for key in SHARED_ARGUMENTS[name])
    if name in SLOTS_IF_NONZERO:
        flags += (bool(written.get(SLOTS_IF_NONZERO[name]) or 0),)
    return flags


def per_model_arguments(spec: ModelSpec) -> list[float]:
    """The optimizer arguments that may differ within a group, Keras' defaults filled in,
    then `1 - argument` of those Keras writes so (betas, rho): computed in double precision
    as Keras' Python does, before the product rounds it to float32."""
    name = spec.compile.optimizer.name
    written = spec.compile.optimizer.written_arguments()
    values = {key: float(written[key]) if written.get(key) is not None else KERAS_DEFAULTS[name][key]
              for key in PER_MODEL_ARGUMENTS[name]}
    return [values[key] for key in PER_MODEL_ARGUMENTS[name]] + \
        [1.0 - values[key] for key in ONE_MINUS[name]]
