"""Architectures as JSON without a database: Keras 3 and Keras 2 layouts, safe loading."""

from __future__ import annotations

import json

import numpy as np
import pytest

from madlib_mop.runtime import keras_json, model_state
from madlib_mop.errors import MadlibMopError

import keras  # noqa: E402  (a missing Keras fails these tests, it does not skip them)


def _dense(name, units, activation, **extra):
    return {"class_name": "Dense", "config": {
        "name": name, "trainable": True, "dtype": "float32", "units": units,
        "activation": activation, "use_bias": True,
        "kernel_initializer": {"class_name": "GlorotUniform", "config": {"seed": None}},
        "bias_initializer": {"class_name": "Zeros", "config": {}},
        "kernel_regularizer": None, "bias_regularizer": None, "activity_regularizer": None,
        "kernel_constraint": None, "bias_constraint": None, **extra}}


# What tf.keras 2.x wrote for Sequential([Dense(10, input_shape=(4,)), Dense(3)]).
KERAS2_SEQUENTIAL = {
    "class_name": "Sequential",
    "config": {"name": "sequential", "layers": [
        _dense("dense", 10, "relu", batch_input_shape=[None, 4]), _dense("dense_1", 3, "softmax")]},
    "keras_version": "2.4.0", "backend": "tensorflow"}


def _build(config):
    return keras_json.model_from_config(keras_json.parse_model_json(json.dumps(config)))


def test_keras3_json_builds():
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(10), keras.layers.Dense(3)])
    built = _build(json.loads(model.to_json()))
    assert built.count_params() == model.count_params() == 83
    assert keras_json.input_shape(built) == [4]


def test_keras2_sequential_with_batch_input_shape():
    model = _build(KERAS2_SEQUENTIAL)
    assert keras_json.input_shape(model) == [4]
    assert model.count_params() == 4 * 10 + 10 + 10 * 3 + 3
    assert model.output_shape == (None, 3)


def test_keras_2_2_sequential_whose_config_is_a_list():
    old = {"class_name": "Sequential", "config": KERAS2_SEQUENTIAL["config"]["layers"],
           "keras_version": "2.2.4", "backend": "tensorflow"}
    assert keras_json.input_shape(_build(old)) == [4]


def test_keras2_functional_model():
    functional = {"class_name": "Functional", "config": {"name": "model", "layers": [
        {"name": "input_1", "class_name": "InputLayer", "inbound_nodes": [],
         "config": {"batch_input_shape": [None, 8, 8, 1], "dtype": "float32", "name": "input_1"}},
        {"name": "flatten", "class_name": "Flatten", "inbound_nodes": [[["input_1", 0, 0, {}]]],
         "config": {"name": "flatten", "trainable": True, "dtype": "float32"}},
        {**_dense("dense", 10, "softmax"), "name": "dense", "inbound_nodes": [[["flatten", 0, 0, {}]]]}],
        "input_layers": [["input_1", 0, 0]], "output_layers": [["dense", 0, 0]]},
        "keras_version": "2.6.0", "backend": "tensorflow"}
    model = _build(functional)
    assert keras_json.input_shape(model) == [8, 8, 1] and model.count_params() == 650


def test_lambda_layer_is_refused_before_keras_sees_it():
    model = keras.Sequential([keras.Input((4,)), keras.layers.Lambda(lambda x: x * 2)])
    with pytest.raises(MadlibMopError, match="Lambda layer") as raised:
        keras_json.parse_model_json(model.to_json())
    assert raised.value.sqlstate == "22023"


def test_unknown_custom_layer_is_refused():
    config = json.loads(keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)]).to_json())
    config["config"]["layers"][1].update(class_name="EvilLayer", module="evil.layers",
                                         registered_name="evil>EvilLayer")
    with pytest.raises(MadlibMopError, match="not a built-in Keras class"):
        _build(config)


@pytest.mark.parametrize(("text", "match"), [
    ("not json at all", "not valid JSON"),
    ('{"class_name": "Dense", "config": {}}', "not a Keras model"),
    ("[1, 2, 3]", "not a Keras model"),
])
def test_not_a_model(text, match):
    with pytest.raises(MadlibMopError, match=match):
        keras_json.parse_model_json(text)


def test_model_without_input_shape():
    config = {"module": "keras", "class_name": "Sequential",
              "config": {"name": "s", "layers": [_dense("d", 2, "relu")]}}
    with pytest.raises(MadlibMopError, match="no input shape"):
        _build(config)


def test_weights_are_checked_and_loaded():
    model = _build(KERAS2_SEQUENTIAL)
    flat = np.arange(model.count_params(), dtype=np.float32)
    keras_json.check_weights(model, flat.tobytes())
    model_state.set_flat_weights(model, flat.tobytes())
    assert np.array_equal(np.concatenate([w.ravel() for w in model.get_weights()]), flat)
    with pytest.raises(MadlibMopError, match="has 8 bytes, the architecture needs 332") as raised:
        keras_json.check_weights(model, b"\0" * 8)
    assert raised.value.sqlstate == "22023"


def _legacy(class_name, name, inbound, **config):
    """A layer of a functional model as tf.keras 2.x wrote it (no module keys)."""
    return {"class_name": class_name, "name": name, "config": {"name": name, **config},
            "inbound_nodes": [[[inbound, 0, 0, {}]]] if inbound else []}


def test_keras2_functional_cnn_with_initializer_dtypes_and_batchnorm_axis():
    """What tf.keras 2.2.4-tf wrote for a small CNN: initializers with a dtype (Keras 3's take
    none), BatchNormalization's axis as a list, InputLayer with batch_input_shape."""
    init = {"class_name": "GlorotUniform", "config": {"seed": None, "dtype": "float32"}}
    zeros = {"class_name": "Zeros", "config": {"dtype": "float32"}}
    ones = {"class_name": "Ones", "config": {"dtype": "float32"}}
    layers = [
        _legacy("InputLayer", "input_1", None, batch_input_shape=[None, 8, 8, 1], dtype="float32",
                sparse=False),
        _legacy("Conv2D", "conv2d", "input_1", filters=4, kernel_size=[3, 3], strides=[1, 1],
                padding="valid", activation="relu", kernel_initializer=init, bias_initializer=zeros),
        _legacy("BatchNormalization", "batch_normalization", "conv2d", axis=[3], momentum=0.99,
                epsilon=0.001, beta_initializer=zeros, gamma_initializer=ones,
                moving_mean_initializer=zeros, moving_variance_initializer=ones),
        _legacy("MaxPooling2D", "max_pooling2d", "batch_normalization", pool_size=[2, 2]),
        _legacy("Dropout", "dropout", "max_pooling2d", rate=0.2),
        _legacy("Flatten", "flatten", "dropout"),
        _legacy("Dense", "dense", "flatten", units=10, activation="softmax",
                kernel_initializer=init, bias_initializer=zeros)]
    config = {"class_name": "Model", "keras_version": "2.2.4-tf", "backend": "tensorflow",
              "config": {"name": "model", "layers": layers, "input_layers": [["input_1", 0, 0]],
                         "output_layers": [["dense", 0, 0]]}}
    model = _build(config)
    assert keras_json.input_shape(model) == [8, 8, 1]
    # conv 3*3*1*4+4, batchnorm 4*4 (moving statistics included), dense 36*10+10
    assert model.count_params() == 40 + 16 + 370
    assert [w.shape for w in model.get_weights()][2:6] == [(4,)] * 4
