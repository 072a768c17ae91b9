"""Keras model architectures as JSON: parsed, upgraded from Keras 2, built in safe mode.

MADlib users keep architectures written by tf.keras / Keras 2 (`model.to_json()`), whose
layout differs from Keras 3's: no `module` keys, `batch_input_shape` on the first layer of a
Sequential, and in Keras <= 2.2 a Sequential whose `config` is the bare list of layers.
`upgrade_legacy_json` rewrites those into what Keras 3 reads; `model_from_config` then builds the
model with Keras' safe deserialization after our own check, which refuses Lambda layers and
anything that is not a built-in Keras class (no code from the database ever runs).
"""

from __future__ import annotations

import copy
import functools
import json
import math
import re
from typing import Any

from madlib_mop import errors
from madlib_mop.errors import MadlibMopError
from madlib_mop.json_values import json_value
from madlib_mop.runtime.tf_runtime import import_tensorflow

MODEL_CLASSES = {"Sequential", "Functional", "Model"}
# Layers that run arbitrary Python, refused whatever their config says.
CODE_LAYERS = {"Lambda", "TFOpLambda", "SlicingOpLambda"}

_SCOPE_UNSAFE = re.compile(r"[^A-Za-z0-9_.\-/>]")

_NOT_A_MODEL_HINT = (
    "Pass the output of model.to_json() of a keras.Sequential or functional keras.Model."
)


def parse_model_json(text: Any) -> dict:
    """The architecture as a dict in Keras 3 layout, or a clear error."""
    if isinstance(text, dict):
        config = copy.deepcopy(text)
    else:
        try:
            config = json.loads(text)
        except (TypeError, ValueError) as error:
            raise MadlibMopError(
                f"model_arch is not valid JSON: {error}",
                sqlstate=errors.INVALID_PARAMETER_VALUE, hint=_NOT_A_MODEL_HINT,
            ) from None
    if not isinstance(config, dict) or config.get("class_name") not in MODEL_CLASSES \
            or "config" not in config:
        raise MadlibMopError(
            "model_arch is JSON but not a Keras model",
            sqlstate=errors.INVALID_PARAMETER_VALUE,
            detail="A Keras model's JSON has class_name Sequential, Functional or Model "
                   "and a config.",
            hint=_NOT_A_MODEL_HINT,
        )
    _refuse_code(config)
    if "module" not in config or str(config.get("keras_version", "")).startswith("2."):
        config = upgrade_legacy_json(config)
    body = config.get("config")
    if isinstance(body, dict) and isinstance(body.get("name"), str):
        # TensorFlow uses the model's name as a scope name, which allows fewer characters
        # than a Keras name (no spaces); nothing refers to the model's own name.
        body["name"] = _SCOPE_UNSAFE.sub("_", body["name"]).lstrip("_") or "model"
    return config


def _refuse_code(node: Any) -> None:
    """Refuse layers that carry Python code, and classes from outside Keras, anywhere in
    the architecture."""
    if isinstance(node, dict):
        name = node.get("class_name")
        module = node.get("module")
        registered = node.get("registered_name")
        if name is not None and (
                (isinstance(module, str) and module != "keras" and not module.startswith("keras."))
                or (isinstance(registered, str) and registered != name)):
            raise MadlibMopError(
                f"model_arch uses {name}, which is not a built-in Keras class",
                sqlstate=errors.INVALID_PARAMETER_VALUE,
                detail=f"module {module!r}, registered name {registered!r}",
                hint="Use built-in Keras layers only; custom layers and objects are not loaded.")
        if name in CODE_LAYERS:
            raise MadlibMopError(
                f"model_arch contains a {name} layer, which runs Python code",
                sqlstate=errors.INVALID_PARAMETER_VALUE,
                detail="Lambda layers are refused: loading one would run code stored in "
                       "the database.",
                hint="Replace the Lambda with built-in Keras layers (e.g. Rescaling, "
                     "Reshape, Activation).",
            )
        for value in node.values():
            _refuse_code(value)
    elif isinstance(node, list):
        for value in node:
            _refuse_code(value)


def upgrade_legacy_json(config: dict) -> dict:
    """Rewrite a tf.keras / Keras 2 model config into the layout Keras 3 reads."""
    config = copy.deepcopy(config)
    config["module"] = "keras"
    _upgrade_legacy_arguments(config["config"])
    if config["class_name"] == "Functional":
        # Keras 3 reads a legacy functional model under its public name.
        config["class_name"] = "Model"
    if config["class_name"] != "Sequential":
        return config
    body = config["config"]
    if isinstance(body, list):  # Keras <= 2.2: the config is the list of layers
        body = {"name": "sequential", "layers": body}
    layers = list(body.get("layers") or [])
    if layers and isinstance(layers[0], dict) and layers[0].get("class_name") != "InputLayer":
        first = layers[0].get("config", {})
        shape = first.pop("batch_input_shape", None)
        if shape is None and first.get("input_dim") is not None:
            shape = [None, first.pop("input_dim")]
        if shape is not None:
            layers.insert(0, {
                "module": "keras.layers",
                "class_name": "InputLayer",
                "config": {"batch_shape": list(shape), "dtype": first.get("dtype", "float32"),
                           "name": "input_layer"},
            })
    for layer in layers[1:]:
        if isinstance(layer, dict):
            layer.get("config", {}).pop("batch_input_shape", None)
    body["layers"] = layers
    config["config"] = body
    return config


def _upgrade_legacy_arguments(node: Any) -> None:
    """Keras 2 arguments that Keras 3 spells otherwise, rewritten in place wherever they
    are: an initializer's `dtype` (Keras 2 wrote one; Keras 3's initializers take none and
    use the variable's), and BatchNormalization's `axis` as a one-element list (Keras 3
    takes the int)."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key.endswith("_initializer") and isinstance(value, dict) \
                    and isinstance(value.get("config"), dict):
                value["config"].pop("dtype", None)
        if node.get("class_name") == "BatchNormalization" and isinstance(node.get("config"), dict):
            axis = node["config"].get("axis")
            if isinstance(axis, list) and len(axis) == 1:
                node["config"]["axis"] = axis[0]
        for value in node.values():
            _upgrade_legacy_arguments(value)
    elif isinstance(node, list):
        for value in node:
            _upgrade_legacy_arguments(value)


def model_from_config(config: dict, initialised: bool = True):
    """Build the Keras model in safe mode; unknown classes are a clear error.
    `initialised` False: every variable starts at zero, for a model whose values are set
    right after (a state restored, weights loaded) or whose shapes alone are wanted: a
    random initialiser allocates its variable's size two times more, which TensorFlow's
    CPU allocator then keeps (3 GB of a worker's memory for 1 GB of weights)."""
    import_tensorflow()
    import keras

    if not initialised:
        config = _zero_initialisers(config)
    try:
        model = keras.saving.deserialize_keras_object(config, safe_mode=True)
    except MadlibMopError:
        raise
    except Exception as error:  # Keras reports bad configs with many exception types
        message = str(error).split("\n")[0]
        unknown = "Could not locate" in message or "Unknown layer" in message
        raise MadlibMopError(
            "model_arch uses a class that is not a built-in Keras class"
            if unknown else "model_arch could not be built as a Keras model",
            sqlstate=errors.INVALID_PARAMETER_VALUE,
            detail=message[:500],
            hint="Use built-in Keras layers only; custom layers and objects are not "
                 "loaded." if unknown else _NOT_A_MODEL_HINT,
        ) from None
    if not isinstance(model, keras.Model):
        raise MadlibMopError("model_arch is not a Keras model",
                             sqlstate=errors.INVALID_PARAMETER_VALUE, hint=_NOT_A_MODEL_HINT)
    if not model.built:
        raise MadlibMopError(
            "model_arch has no input shape",
            sqlstate=errors.INVALID_PARAMETER_VALUE,
            hint="Give the model an input shape, e.g. keras.Input(shape=(4,)) as its first layer.",
        )
    return model


def require_input_shape(model_shape: list, data_shape: Any, column: str, table: str,
                        *, who: str = "", hint: str) -> None:
    """Refuse data whose rows' shape is not the model's input shape.  The same number of
    values in another shape (images packed as (3, 32, 32) for a model of (32, 32, 3)) would
    reshape without error and train or predict on scrambled inputs; MADlib refuses it with
    the phrase this message carries."""
    model_shape, data_shape = [int(d) for d in model_shape], [int(d) for d in data_shape]
    if model_shape == data_shape:
        return
    same_size = math.prod(model_shape) == math.prod(data_shape)
    raise MadlibMopError(
        f"{who}Input shape {model_shape} in the model architecture does not match the input "
        f"shape {data_shape} of column {column} in table {table}",
        sqlstate=errors.INVALID_PARAMETER_VALUE,
        detail=(f"Both hold {math.prod(model_shape)} values per row, in another arrangement: "
                "reshaping them would give wrong answers." if same_size else None),
        hint=hint)


def require_input_shapes(model_shapes: list, data_shapes: list, columns: Any, table: str,
                         *, who: str = "", hint: str) -> None:
    """`require_input_shape` for each input of the model, in order, against the feature
    columns (as MADlib feeds them: the first column to the first input, and so on)."""
    columns = list(columns)
    if len(model_shapes) != len(data_shapes):
        raise MadlibMopError(
            f"{who}the model has {len(model_shapes)} inputs, table {table} has "
            f"{len(data_shapes)} feature columns ({', '.join(columns)}): the number of inputs "
            "does not match", sqlstate=errors.INVALID_PARAMETER_VALUE,
            hint="Pack one feature column per input of the model, in the order of its inputs "
                 "(independent_varname 'a, b').")
    for model_shape, data_shape, column in zip(model_shapes, data_shapes, columns):
        require_input_shape(model_shape, data_shape, column, table, who=who, hint=hint)


def each_shape(shape: Any) -> list:
    """A model's input (or output) shapes, one per input (or output): Keras gives a list
    for several, a tuple for one."""
    return list(shape) if isinstance(shape, list) else [shape]


def input_shapes(model) -> list[list[int | None]]:
    """Each input's shape without the batch dimension, in the order of the model's inputs."""
    return [[None if d is None else int(d) for d in shape[1:]] for shape in each_shape(model.input_shape)]


def input_shape(model, purpose: str = "this") -> list[int | None]:
    """The input shape (without the batch dimension) of a model of one input."""
    shape = model.input_shape
    if isinstance(shape, list):  # several inputs
        raise MadlibMopError(
            f"models with several inputs are not supported for {purpose}",
            sqlstate=errors.FEATURE_NOT_SUPPORTED,
            hint="Use a model of one input here.",
        )
    return list(shape[1:])


def check_weights(model, weights: bytes | None) -> None:
    """Initial weights are the float32 values of get_weights(), concatenated."""
    check_weight_bytes(model.count_params(), weights)


def check_weight_bytes(parameters: int, weights: bytes | None) -> None:
    """`check_weights` from the architecture's number of parameters (no model built)."""
    if weights is None:
        return
    expected = 4 * parameters
    if len(weights) != expected:
        raise MadlibMopError(
            f"model_weights has {len(weights)} bytes, the architecture needs {expected}",
            sqlstate=errors.INVALID_PARAMETER_VALUE,
            detail=f"The architecture has {parameters} parameters; weights are "
                   "stored as float32 (4 bytes each), concatenated in get_weights() order.",
            hint="Pass numpy.concatenate([w.ravel() for w in model.get_weights()])"
                 ".astype('float32').tobytes(), or NULL for a random initialisation.",
        )


def _zero_initialisers(config: Any) -> Any:
    """The config with every layer's `*_initializer` set to zeros."""
    if isinstance(config, dict):
        return {key: "zeros" if key.endswith("_initializer") and value is not None
                else _zero_initialisers(value) for key, value in config.items()}
    if isinstance(config, list):
        return [_zero_initialisers(value) for value in config]
    return config


def canonical_architecture(model_arch: str) -> str:
    """The architecture with its model's and layers' names replaced by their order of
    appearance: `to_json()` of the same network names it sequential_3 / dense_7 after other
    models were made in the process, and the names change nothing in what it computes.
    Every occurrence of a name is replaced (layers refer to each other by name), so different
    networks stay different.  Kept per text: a grid's models share a few architectures, and
    a job asks for each model's key several times (plan, memory, fusion)."""
    if isinstance(model_arch, str):
        return _canonical_text(model_arch)
    return _canonical(model_arch)


@functools.lru_cache(maxsize=64)
def _canonical_text(model_arch: str) -> str:
    return _canonical(model_arch)


def _canonical(model_arch: Any) -> str:
    config = json_value(model_arch)
    names: dict[str, str] = {}

    def collect(node) -> None:
        if isinstance(node, dict):
            for key, value in node.items():
                if key == "name" and isinstance(value, str):
                    names.setdefault(value, f"\x00{len(names)}")
                collect(value)
        elif isinstance(node, list):
            for value in node:
                collect(value)

    def rename(node):
        if isinstance(node, dict):
            return {key: rename(value) for key, value in node.items()}
        if isinstance(node, list):
            return [rename(value) for value in node]
        return names.get(node, node) if isinstance(node, str) else node

    collect(config)
    return json.dumps(rename(config), sort_keys=True)
