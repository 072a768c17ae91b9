"""Image CNNs in the database, on CIFAR-10-shaped data (32x32x3, 10 classes, generated with
structure to learn: nothing is downloaded).

- A small residual network with BatchNormalization and Dropout: the moving statistics
  travel with the model's state from segment to segment, and Dropout's masks come from the
  model's seed, so the same job again, and a job resumed after a killed coordinator whose
  states between hops were lost (its sub-epochs replayed), give the same bits.
- The CNN of MADlib's CIFAR-10 walkthrough (Keras' cifar10_cnn, written as tf.keras 2 JSON)
  trains unchanged, then evaluates and predicts.
"""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
from psycopg import sql

from madlib_mop.job import state_store
from madlib_mop.tools.demo import cifar_shaped_images
from tests.conftest import connect, coordinator_killed_mid_job

ROWS, CLASSES = 120, 10
COMPILE = "loss='categorical_crossentropy', optimizer='Adam(learning_rate={lr})', metrics=['accuracy']"


def _layer(class_name: str, name: str | None = None, inbound: list[str] | None = None, **config) -> dict:
    layer = {"class_name": class_name, "config": config}
    if name is not None:
        layer["config"]["name"] = layer["name"] = name
        layer["inbound_nodes"] = [[[source, 0, 0, {}] for source in inbound]] if inbound else []
    return layer


def residual_json() -> str:
    """A small ResNet (functional, as Keras 2 wrote it): a stem, one residual block with
    BatchNormalization, Dropout before the classifier."""
    layers = [
        _layer("InputLayer", "image", batch_input_shape=[None, 32, 32, 3]),
        _layer("Conv2D", "stem", ["image"], filters=8, kernel_size=[3, 3], strides=[2, 2], padding="same"),
        _layer("BatchNormalization", "stem_bn", ["stem"]),
        _layer("Activation", "stem_relu", ["stem_bn"], activation="relu"),
        _layer("Conv2D", "block_a", ["stem_relu"], filters=8, kernel_size=[3, 3], padding="same"),
        _layer("BatchNormalization", "block_a_bn", ["block_a"]),
        _layer("Activation", "block_a_relu", ["block_a_bn"], activation="relu"),
        _layer("Conv2D", "block_b", ["block_a_relu"], filters=8, kernel_size=[3, 3], padding="same"),
        _layer("BatchNormalization", "block_b_bn", ["block_b"]),
        _layer("Add", "residual", ["block_b_bn", "stem_relu"]),
        _layer("Activation", "block_relu", ["residual"], activation="relu"),
        _layer("GlobalAveragePooling2D", "pool", ["block_relu"]),
        _layer("Dropout", "dropout", ["pool"], rate=0.3),
        _layer("Dense", "classes", ["dropout"], units=CLASSES, activation="softmax"),
    ]
    return json.dumps({"class_name": "Model", "config": {
        "name": "small_resnet", "layers": layers,
        "input_layers": [["image", 0, 0]], "output_layers": [["classes", 0, 0]]},
        "keras_version": "2.2.4", "backend": "tensorflow"})


def madlib_cifar10_cnn_json() -> str:
    """The CNN of MADlib's CIFAR-10 walkthrough (Keras' cifar10_cnn example), as
    tf.keras 2 wrote it with model.to_json()."""
    layers = [
        _layer("Conv2D", filters=32, kernel_size=[3, 3], padding="same",
               batch_input_shape=[None, 32, 32, 3]),
        _layer("Activation", activation="relu"),
        _layer("Conv2D", filters=32, kernel_size=[3, 3]),
        _layer("Activation", activation="relu"),
        _layer("MaxPooling2D", pool_size=[2, 2]),
        _layer("Dropout", rate=0.25),
        _layer("Conv2D", filters=64, kernel_size=[3, 3], padding="same"),
        _layer("Activation", activation="relu"),
        _layer("Conv2D", filters=64, kernel_size=[3, 3]),
        _layer("Activation", activation="relu"),
        _layer("MaxPooling2D", pool_size=[2, 2]),
        _layer("Dropout", rate=0.25),
        _layer("Flatten"),
        _layer("Dense", units=512),
        _layer("Activation", activation="relu"),
        _layer("Dropout", rate=0.5),
        _layer("Dense", units=CLASSES),
        _layer("Activation", activation="softmax"),
    ]
    return json.dumps({"class_name": "Sequential", "config": {"name": "cifar10_cnn", "layers": layers},
                       "keras_version": "2.2.4-tf", "backend": "tensorflow"})


@pytest.fixture(scope="module")
def images(extension_dsn):
    with connect(extension_dsn) as conn:
        for table, seed in (("cifar_train", 1), ("cifar_test", 2)):
            conn.execute(sql.SQL("CREATE TABLE {} (id int, rgb real[], label int)").format(
                sql.Identifier(table)))
            x, y = cifar_shaped_images(ROWS if table == "cifar_train" else 40, seed)
            with conn.cursor().copy(sql.SQL("COPY {} FROM STDIN").format(sql.Identifier(table))) as copy:
                for i, (image, label) in enumerate(zip(x, y)):
                    copy.write_row((i, image.tolist(), int(label)))
        conn.execute("SELECT training_preprocessor_dl('cifar_train', 'cifar_packed', 'label', 'rgb', "
                     "buffer_size => 20, distribution_rules => '2')")
        conn.execute("SELECT validation_preprocessor_dl('cifar_test', 'cifar_valid', 'label', 'rgb', "
                     "'cifar_packed')")
        conn.execute("SELECT load_keras_model('cifar_arch', %s::json, NULL, 'small_resnet')",
                     (residual_json(),))
        conn.execute("SELECT load_keras_model('cifar_arch', %s::json, NULL, 'madlib_cifar10_cnn')",
                     (madlib_cifar10_cnn_json(),))
        conn.execute("SELECT load_model_selection_table('cifar_arch', 'cifar_mst', ARRAY[1], "
                     "ARRAY[%s, %s], ARRAY['batch_size=16, epochs=1'])",
                     (COMPILE.format(lr=0.01), COMPILE.format(lr=0.003)))
    return extension_dsn


def _fit(dsn: str, out: str) -> None:
    with connect(dsn) as conn:
        conn.execute("SELECT madlib_keras_fit_multiple_model('cifar_packed', %s, 'cifar_mst', 3, "
                     "FALSE, 'cifar_valid', 1)", (out,))


def _weights(conn, out: str) -> dict:
    return dict(conn.execute(sql.SQL("SELECT mst_key, model_weights FROM {} ORDER BY 1").format(
        sql.Identifier(out))).fetchall())


def _batch_norm_statistics(weights: bytes) -> list[np.ndarray]:
    """The moving means and variances of the residual network's BatchNormalization layers,
    cut out of its weights as Keras orders them."""
    from madlib_mop.runtime import keras_json

    model = keras_json.model_from_config(keras_json.parse_model_json(residual_json()))
    flat, offset, statistics = np.frombuffer(weights, dtype=np.float32), 0, []
    for variable in model.weights:
        size = int(np.prod(variable.shape))
        if "moving" in variable.path:
            statistics.append(flat[offset:offset + size])
        offset += size
    assert offset == flat.size
    return statistics


def test_batchnorm_and_dropout_travel_with_the_state_and_replay_to_the_same_bits(images):
    _fit(images, "resnet_reference")
    with connect(images) as conn:
        reference = _weights(conn, "resnet_reference")
        assert len(reference) == 2
        for weights in reference.values():
            statistics = _batch_norm_statistics(weights)
            assert len(statistics) == 6  # 3 layers x (mean, variance)
            means, variances = statistics[0::2], statistics[1::2]
            # Trained over both segments' rows: not the initial zeros and ones.
            assert all(np.abs(m).max() > 1e-3 for m in means)
            assert all(np.abs(v - 1).max() > 1e-3 for v in variances)
        for losses, in conn.execute("SELECT training_loss FROM resnet_reference_info"):
            assert len(losses) == 3 and losses[-1] < losses[0]  # it trains

    _fit(images, "resnet_again")
    with connect(images) as conn:
        assert _weights(conn, "resnet_again") == reference
        # Killed mid-job, its states between hops lost (a restart does not trust them): the
        # lost sub-epochs are trained again, Dropout's masks and BatchNormalization's
        # statistics included, to the same bits.
        job_id = coordinator_killed_mid_job(conn, "resnet_resumed", 5, lambda: _fit(images, "resnet_resumed"))
        directory, oid = conn.execute("SELECT current_setting('data_directory'), oid FROM pg_database "
                                      "WHERE datname = current_database()").fetchone()
        shutil.rmtree(f"{directory}/{state_store.DIRECTORY}/{oid}/{job_id}", ignore_errors=True)
        conn.execute("CALL resume(%s)", (job_id,))
        assert _weights(conn, "resnet_resumed") == reference


def test_madlibs_cifar10_cnn_trains_unchanged(images):
    with connect(images) as conn:
        conn.execute("SELECT madlib_keras_fit('cifar_packed', 'cifar_cnn', 'cifar_arch', 2, "
                     "$$ loss='categorical_crossentropy', optimizer='rmsprop(lr=0.0001, decay=1e-6)', "
                     "metrics=['accuracy'] $$, $$ batch_size=32, epochs=1 $$, 2)")
        assert conn.execute("SELECT num_iterations FROM cifar_cnn_summary").fetchone()[0] == 2
        # MADlib's model_weights: every weight of the network, float32, in Keras' order.
        from madlib_mop.runtime import keras_json

        parameters = keras_json.model_from_config(keras_json.parse_model_json(madlib_cifar10_cnn_json())).count_params()
        assert conn.execute("SELECT octet_length(model_weights) FROM cifar_cnn").fetchone()[0] == 4 * parameters
        conn.execute("SELECT madlib_keras_evaluate('cifar_cnn', 'cifar_valid', 'cifar_cnn_eval')")
        loss, accuracy = conn.execute("SELECT loss, metric FROM cifar_cnn_eval").fetchone()
        assert np.isfinite(loss) and 0 <= accuracy <= 1
        conn.execute("SELECT madlib_keras_predict('cifar_cnn', 'cifar_test', 'id', 'rgb', "
                     "'cifar_cnn_predicted', 'response')")
        predicted = conn.execute("SELECT count(*), count(DISTINCT id) FROM cifar_cnn_predicted").fetchone()
        assert predicted == (40, 40)

