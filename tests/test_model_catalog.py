"""Model architecture and model selection tables in a real server (MADlib's API)."""

from __future__ import annotations

import json

import numpy as np
import psycopg
import pytest
from psycopg import sql

from tests.test_keras_json import KERAS2_SEQUENTIAL

import keras  # noqa: E402  (a missing Keras fails these tests, it does not skip them)

COMPILE_GRID = ("{'loss': ['categorical_crossentropy'], 'optimizer_params_list': ["
                "{'optimizer': ['Adam'], 'lr': [0.001, 0.01]}, {'optimizer': ['SGD'], 'lr': [0.1]}], "
                "'metrics': ['accuracy']}")
FIT_GRID = "{'batch_size': [16, 32], 'epochs': [1]}"


def _mlp_json(hidden=10, inputs=4):
    return keras.Sequential([keras.Input((inputs,)), keras.layers.Dense(hidden, activation="relu"),
                             keras.layers.Dense(3, activation="softmax")]).to_json()


def _cnn_json():
    inputs = keras.Input((8, 8, 1))
    x = keras.layers.Conv2D(4, 3, activation="relu")(inputs)
    x = keras.layers.Flatten()(x)
    return keras.Model(inputs, keras.layers.Dense(10, activation="softmax")(x)).to_json()


def _load(conn, table, arch, weights=None, name=None, description=None):
    conn.execute("SELECT madlib_mop.load_keras_model(%s, %s::json, %s, %s, %s)",
                 (table, arch, weights, name, description))


def _error(conn, query, params=()):
    with pytest.raises(psycopg.Error) as raised:
        conn.execute(query, params)
    return raised.value.diag


def _exists(conn, table):
    return conn.execute("SELECT to_regclass(%s) IS NOT NULL", (table,)).fetchone()[0]


def test_load_keras_model_creates_madlib_table(conn):
    conn.execute("DROP TABLE IF EXISTS arch")
    _load(conn, "arch", _mlp_json(), name="mlp", description="two dense layers")
    _load(conn, "arch", json.dumps(KERAS2_SEQUENTIAL), name="keras 2 mlp")
    _load(conn, "arch", _cnn_json(), name="cnn")
    columns = [r[0] for r in conn.execute(
        "SELECT attname FROM pg_attribute WHERE attrelid = 'arch'::regclass AND attnum > 0 ORDER BY attnum")]
    assert columns == ["model_id", "model_arch", "model_weights", "name", "description",
                       "__internal_madlib_id__"]
    rows = conn.execute("SELECT model_id, name, model_weights IS NULL FROM arch ORDER BY 1").fetchall()
    assert rows == [(1, "mlp", True), (2, "keras 2 mlp", True), (3, "cnn", True)]
    # The architecture is stored as given.
    assert conn.execute("SELECT model_arch FROM arch WHERE model_id = 2").fetchone()[0] == KERAS2_SEQUENTIAL


def test_initial_weights(conn):
    conn.execute("DROP TABLE IF EXISTS arch_w")
    model = keras.models.model_from_json(_mlp_json())
    flat = np.concatenate([w.ravel() for w in model.get_weights()]).astype(np.float32)
    _load(conn, "arch_w", _mlp_json(), flat.tobytes(), "pretrained")
    stored = conn.execute("SELECT model_weights FROM arch_w").fetchone()[0]
    assert np.array_equal(np.frombuffer(stored, dtype=np.float32), flat)
    diag = _error(conn, "SELECT madlib_mop.load_keras_model('arch_w', %s::json, %s)",
                  (_mlp_json(), flat[:-1].tobytes()))
    assert diag.sqlstate == "22023" and "the architecture needs 332" in diag.message_primary
    assert conn.execute("SELECT count(*) FROM arch_w").fetchone()[0] == 1


@pytest.mark.parametrize(("arch", "sqlstate", "message"), [
    ("PLACEHOLDER_LAMBDA", "22023", "Lambda layer"),
    ('{"class_name": "Sequential", "config": {"layers": [{"class_name": "MyLayer", '
     '"module": "my.layers", "config": {}}]}, "module": "keras"}', "22023", "not a built-in Keras class"),
    ('{"a": 1}', "22023", "not a Keras model"),
    ('{"class_name": "Sequential", "config": {"name": "s", "layers": '
     '[{"class_name": "Dense", "config": {"units": 2}}]}}', "22023", "no input shape"),
])
def test_bad_architectures_leave_nothing(conn, arch, sqlstate, message):
    if arch == "PLACEHOLDER_LAMBDA":
        arch = keras.Sequential([keras.Input((4,)), keras.layers.Lambda(lambda x: x + 1)]).to_json()
    conn.execute("DROP TABLE IF EXISTS arch_bad")
    diag = _error(conn, "SELECT madlib_mop.load_keras_model('arch_bad', %s::json)", (arch,))
    assert diag.sqlstate == sqlstate and message in diag.message_primary and diag.message_hint
    assert not _exists(conn, "arch_bad")


def test_not_json_at_all(conn):
    diag = _error(conn, "SELECT madlib_mop.load_keras_model('arch_bad', %s::json)", ("nope",))
    assert diag.sqlstate == "22P02"  # PostgreSQL's own check of the json type


def test_delete_keras_model(conn):
    conn.execute("DROP TABLE IF EXISTS arch_d")
    _load(conn, "arch_d", _mlp_json())
    _load(conn, "arch_d", _mlp_json(20))
    conn.execute("SELECT madlib_mop.delete_keras_model('arch_d', 1)")
    assert conn.execute("SELECT array_agg(model_id) FROM arch_d").fetchone()[0] == [2]
    diag = _error(conn, "SELECT madlib_mop.delete_keras_model('arch_d', 7)")
    assert diag.sqlstate == "22023" and "model_id 7 is not in" in diag.message_primary
    conn.execute("SELECT madlib_mop.delete_keras_model('arch_d', 2)")
    assert not _exists(conn, "arch_d")  # MADlib drops the table once it is empty


@pytest.fixture
def arch(conn):
    conn.execute("DROP TABLE IF EXISTS arch_m")
    _load(conn, "arch_m", _mlp_json(10))
    _load(conn, "arch_m", _mlp_json(20))
    for table in ("mst", "mst_summary", "mst_r1", "mst_r1_summary", "mst_r2", "mst_r2_summary",
                  "mst_l", "mst_l_summary", "mst_bad", "mst_bad_summary"):
        conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(sql.Identifier(table)))
    return "arch_m"


def _configs(conn, table):
    return conn.execute(sql.SQL("SELECT mst_key, model_id, compile_params, fit_params FROM {} "
                                "ORDER BY mst_key").format(sql.Identifier(table))).fetchall()


def test_generate_model_configs_grid(conn, arch):
    conn.execute("SELECT madlib_mop.generate_model_configs('arch_m', 'mst', ARRAY[1, 2], %s, %s)",
                 (COMPILE_GRID, FIT_GRID))
    rows = _configs(conn, "mst")
    assert len(rows) == 2 * 3 * 2
    assert rows[0] == (1, 1, "optimizer='Adam(lr=0.001)',loss='categorical_crossentropy',"
                             "metrics=['accuracy']", "batch_size=16,epochs=1")
    assert conn.execute("SELECT model_arch_table, object_table FROM mst_summary").fetchall() == [
        ("public.arch_m", None)]
    # Calling again appends (MADlib's behaviour); identical configurations are not repeated.
    conn.execute("SELECT madlib_mop.generate_model_configs('arch_m', 'mst', ARRAY[1], %s, %s)",
                 (COMPILE_GRID, "{'batch_size': [16, 64], 'epochs': [1]}"))
    rows = _configs(conn, "mst")
    assert len(rows) == 12 + 3 and [r[0] for r in rows[-3:]] == [13, 14, 15]


def test_generate_model_configs_random_is_reproducible(conn, arch):
    grid = ("{'loss': ['categorical_crossentropy'], 'optimizer_params_list': [{'optimizer': "
            "['SGD'], 'lr': [0.0001, 0.1, 'log'], 'momentum': [0.9, 0.99, 'log_near_one']}], "
            "'metrics': [['accuracy', 'top_k_categorical_accuracy']]}")
    for table in ("mst_r1", "mst_r2"):
        conn.execute("SELECT madlib_mop.generate_model_configs('arch_m', %s, ARRAY[1, 2], %s, %s, "
                     "'random', 5, 42)", (table, grid, FIT_GRID))
    first, second = _configs(conn, "mst_r1"), _configs(conn, "mst_r2")
    assert first == second and len(first) == 5
    assert "metrics=['accuracy', 'top_k_categorical_accuracy']" in first[0][2]


@pytest.mark.parametrize(("args", "sqlstate", "message"), [
    (("arch_m", "mst_bad", [1, 9], COMPILE_GRID, FIT_GRID), "22023", "model_id 9 not found"),
    (("no_arch", "mst_bad", [1], COMPILE_GRID, FIT_GRID), "42P01", "does not exist"),
    (("arch_m", "mst_bad", [1], "__import__('os').system('id')", FIT_GRID), "42601", "not a dict literal"),
    (("arch_m", "mst_bad", [1], "{'loss': ['categorical_crossentropy'", FIT_GRID), "42601", "not a dict literal"),
    (("arch_m", "mst_bad", [1], "{'loss': ['no_loss']}", FIT_GRID), "22023", "loss 'no_loss' is not supported"),
    (("arch_m", "mst_bad", [1], "{'loss': ['mse'], 'metrics': ['f9']}", FIT_GRID), "22023", "metric 'f9'"),
    (("arch_m", "mst_bad", [1], "{'loss': ['mse'], 'optimizer': ['Adamz']}", FIT_GRID), "22023",
     "not a Keras optimizer"),
    (("arch_m", "mst_bad", [1], COMPILE_GRID, "{'batch_size': [0]}"), "22023", "positive integer"),
    (("arch_m", "mst_bad", [1], COMPILE_GRID, FIT_GRID, "exhaustive"), "22023", "neither 'grid' nor 'random'"),
    (("arch_m", "mst_bad", [1], COMPILE_GRID, FIT_GRID, "grid", 3), "22023", "for random search"),
    (("arch_m", "mst_bad", [1], COMPILE_GRID, FIT_GRID, "grid", None, None, "objs"), "42P01",
     "object_table: Input table 'objs' does not exist"),
])
def test_generate_model_configs_bad_input(conn, arch, args, sqlstate, message):
    placeholders = sql.SQL(", ").join([sql.Placeholder()] * len(args))
    diag = _error(conn, sql.SQL("SELECT madlib_mop.generate_model_configs({})").format(placeholders), args)
    assert diag.sqlstate == sqlstate and message in diag.message_primary and diag.message_hint
    assert not _exists(conn, "mst_bad") and not _exists(conn, "mst_bad_summary")


def test_load_model_selection_table(conn, arch):
    compiles = ["loss='categorical_crossentropy', optimizer='Adam(lr=0.01)', metrics=['accuracy']",
                "loss='categorical_crossentropy',optimizer='Adam(lr=0.01)',metrics=['accuracy']",
                "optimizer='SGD(lr=0.1)',loss='categorical_crossentropy'"]
    conn.execute("SELECT madlib_mop.load_model_selection_table('arch_m', 'mst_l', ARRAY[1, 2], %s, %s)",
                 (compiles, ["batch_size=16,epochs=1", "batch_size=32, epochs=1"]))
    rows = _configs(conn, "mst_l")
    assert len(rows) == 2 * 2 * 2  # the two spellings of the same Adam config count once
    diag = _error(conn, "SELECT madlib_mop.load_model_selection_table('arch_m', 'mst_l', ARRAY[1], %s, %s)",
                  (compiles, ["epochs=1"]))
    assert diag.sqlstate == "42P07"
    diag = _error(conn, "SELECT madlib_mop.load_model_selection_table('arch_m', 'mst_bad', ARRAY[1], %s, %s)",
                  (["loss='mse', optimizer=__import__('os')"], ["epochs=1"]))
    assert diag.sqlstate == "42601"
    assert not _exists(conn, "mst_bad")


@pytest.mark.parametrize("function", ["load_keras_model", "delete_keras_model",
                                      "generate_model_configs", "load_model_selection_table"])
def test_usage(conn, function):
    text = conn.execute(sql.SQL("SELECT madlib_mop.{}()").format(sql.Identifier(function))).fetchone()[0]
    assert text.startswith(function) and "SELECT " + function in text
    assert conn.execute(sql.SQL("SELECT madlib_mop.{}('help')").format(
        sql.Identifier(function))).fetchone()[0] == text
