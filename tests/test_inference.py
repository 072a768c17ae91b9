"""madlib_keras_evaluate / _predict / _predict_byom against plain Keras on the same rows."""

from __future__ import annotations

import numpy as np
import psycopg
import pytest
from psycopg.rows import dict_row

from madlib_mop.runtime import keras_json, model_state

import keras  # noqa: E402  (a missing Keras fails these tests, it does not skip them)


def _mlp(inputs, outputs, activation="softmax"):
    return keras.Sequential([keras.Input((inputs,)), keras.layers.Dense(8, activation="relu"),
                             keras.layers.Dense(outputs, activation=activation)]).to_json()


@pytest.fixture(scope="module")
def models(extension_dsn):
    from sklearn.datasets import load_iris

    iris = load_iris()
    with psycopg.connect(extension_dsn, autocommit=True) as conn:
        conn.execute("SET search_path = public, madlib_mop")
        conn.execute("CREATE TABLE iris (id int, attributes float8[], class_text text, width float8)")
        with conn.cursor().copy("COPY iris FROM STDIN") as copy:
            for i, (x, y) in enumerate(zip(iris.data, iris.target)):
                copy.write_row((i, [float(v) for v in x[:3]], str(iris.target_names[y]), float(x[3])))
        conn.execute("CREATE TABLE iris_wide AS SELECT id, attributes || width AS attributes FROM iris")
        conn.execute("SELECT training_preprocessor_dl('iris', 'iris_packed', 'class_text', 'attributes', "
                     "normalizing_const => 2, distribution_rules => '2')")
        conn.execute("SELECT validation_preprocessor_dl('iris', 'iris_valid', 'class_text', 'attributes', "
                     "'iris_packed')")
        conn.execute("SELECT training_preprocessor_dl('iris', 'width_packed', 'width', 'attributes', "
                     "distribution_rules => '2', regression => TRUE)")
        conn.execute("SELECT load_keras_model('arch', %s::json)", (_mlp(3, 3),))
        conn.execute("SELECT load_keras_model('arch', %s::json)", (_mlp(3, 1, "linear"),))
        conn.execute("SELECT generate_model_configs('arch', 'mst', ARRAY[1], %s, %s)", (
            "{'loss': ['categorical_crossentropy'], 'optimizer_params_list': [{'optimizer': ['Adam'], "
            "'lr': [0.01, 0.05]}], 'metrics': [['accuracy', 'top_k_categorical_accuracy']]}",
            "{'batch_size': [16], 'epochs': [1]}"))
        conn.execute("SELECT madlib_keras_fit_multiple_model('iris_packed', 'multi', 'mst', 2, FALSE, "
                     "'iris_valid')")
        conn.execute("SELECT madlib_keras_fit('iris_packed', 'single', 'arch', 1, "
                     "$$loss='categorical_crossentropy', optimizer='Adam(lr=0.05)', metrics=['accuracy']$$, "
                     "'batch_size=16', 2)")
        conn.execute("SELECT madlib_keras_fit('width_packed', 'regression', 'arch', 2, "
                     "$$loss='mse', optimizer='Adam(lr=0.05)', metrics=['mae']$$, 'batch_size=16', 2)")
    return extension_dsn, iris


@pytest.fixture
def conn(models):
    with psycopg.connect(models[0], autocommit=True) as connection:
        connection.execute("SET search_path = public, madlib_mop")
        yield connection


def _keras_model(conn, table, mst_key=None, compile_params=None):
    arch, weights = conn.execute(
        f"SELECT model_arch::text, model_weights FROM {table}"
        + (" WHERE mst_key = %s" if mst_key else ""), (mst_key,) if mst_key else None).fetchone()
    model = keras_json.model_from_config(keras_json.parse_model_json(arch))
    model_state.set_flat_weights(model, weights)
    return model


def _features(iris, normalizing_const=2.0):
    return iris.data[:, :3].astype(np.float32) / np.float32(normalizing_const)


def test_predict_prob_equals_keras(conn, models):
    _, iris = models
    conn.execute("DROP TABLE IF EXISTS p_prob")
    conn.execute("SELECT madlib_keras_predict('multi', 'iris', 'id', 'attributes', 'p_prob', 'prob', FALSE, 2)")
    expected = _keras_model(conn, "multi", 2).predict(_features(iris), verbose=0)
    classes = ["setosa", "versicolor", "virginica"]
    rows = conn.execute("SELECT id, class_name, class_value, prob, rank FROM p_prob").fetchall()
    assert len(rows) == 150 * 3 and {r[1] for r in rows} == {"class_text"}
    got = np.zeros((150, 3))
    for identifier, _, value, prob, rank in rows:
        got[identifier, classes.index(value)] = prob
        assert rank == 1 + int(np.sum(expected[identifier] > expected[identifier, classes.index(value)]))
    assert np.max(np.abs(got - expected)) <= 1e-6


def test_pred_types(conn, models):
    _, iris = models
    expected = _keras_model(conn, "single").predict(_features(iris), verbose=0)
    for table, pred_type in (("p_response", "response"), ("p_top2", "2"), ("p_threshold", "0.3")):
        conn.execute(f"DROP TABLE IF EXISTS {table}")
        conn.execute("SELECT madlib_keras_predict('single', 'iris', 'id', 'attributes', %s, %s)",
                     (table, pred_type))
    columns = [c.name for c in conn.execute("SELECT * FROM p_response LIMIT 0").description]
    assert columns == ["id", "class_name", "class_value", "prob"]  # MADlib drops rank for 'response'
    response = dict(conn.execute("SELECT id, class_value FROM p_response").fetchall())
    names = np.array(["setosa", "versicolor", "virginica"])
    assert [response[i] for i in range(150)] == names[np.argmax(expected, axis=1)].tolist()
    top2 = conn.execute("SELECT count(*), count(DISTINCT id), max(rank) FROM p_top2").fetchone()
    assert top2 == (300, 150, 2)
    above = conn.execute("SELECT count(*) FROM p_threshold").fetchone()[0]
    assert above == int(np.sum(expected > 0.3))


def test_regression_predicts_values(conn, models):
    _, iris = models
    conn.execute("DROP TABLE IF EXISTS p_width")
    conn.execute("SELECT madlib_keras_predict('regression', 'iris', 'id', 'attributes', 'p_width')")
    expected = _keras_model(conn, "regression").predict(_features(iris, 1.0), verbose=0)
    got = dict(conn.execute("SELECT id, prediction FROM p_width").fetchall())
    assert np.max(np.abs(np.array([got[i] for i in range(150)]) - expected)) <= 1e-6


def test_predict_byom(conn, models):
    _, iris = models
    model = keras.models.model_from_json(_mlp(3, 3))
    flat = np.concatenate([w.ravel() for w in model.get_weights()]).astype(np.float32)
    conn.execute("DROP TABLE IF EXISTS byom, p_byom")
    conn.execute("SELECT load_keras_model('byom', %s::json, %s)", (_mlp(3, 3), flat.tobytes()))
    conn.execute("SELECT madlib_keras_predict_byom('byom', 1, 'iris', 'id', 'attributes', 'p_byom', "
                 "'response', FALSE, ARRAY['a', 'b', 'c'], 2.0)")
    model_state.set_flat_weights(model, flat.tobytes())
    expected = np.array(["a", "b", "c"])[np.argmax(model.predict(_features(iris), verbose=0), axis=1)]
    got = dict(conn.execute("SELECT id, class_value FROM p_byom").fetchall())
    assert [got[i] for i in range(150)] == expected.tolist()


def _valid_arrays(iris):
    classes = ["setosa", "versicolor", "virginica"]
    y = np.eye(3, dtype=np.float32)[[classes.index(str(iris.target_names[t])) for t in iris.target]]
    return _features(iris), y


def test_evaluate_equals_keras(conn, models):
    _, iris = models
    conn.execute("DROP TABLE IF EXISTS ev")
    conn.execute("SELECT madlib_keras_evaluate('multi', 'iris_valid', 'ev', FALSE, 1)")
    row = conn.cursor(row_factory=dict_row).execute("SELECT * FROM ev").fetchone()
    assert row["metrics_type"] == ["accuracy", "top_k_categorical_accuracy"]
    assert row["loss_type"] == "categorical_crossentropy"
    model = _keras_model(conn, "multi", 1)
    model.compile(loss="categorical_crossentropy", metrics=["accuracy", "top_k_categorical_accuracy"])
    x, y = _valid_arrays(iris)
    expected = model.evaluate(x, y, verbose=0, return_dict=True)
    assert row["loss"] == pytest.approx(expected["loss"], abs=1e-5)
    assert row["metric"] == pytest.approx(expected["accuracy"], abs=1e-6)
    assert row["metrics"]["top_k_categorical_accuracy"] == pytest.approx(
        expected["top_k_categorical_accuracy"], abs=1e-6)


def test_evaluate_every_model_in_one_pass(conn, models):
    conn.execute("DROP TABLE IF EXISTS ev_all")
    conn.execute("SELECT madlib_keras_evaluate_multiple_model('multi', 'iris_valid', 'ev_all')")
    rows = conn.execute("SELECT e.mst_key, e.loss, i.validation_loss_final FROM ev_all e "
                        "JOIN multi_info i USING (mst_key) ORDER BY 1").fetchall()
    assert [r[0] for r in rows] == [1, 2]
    assert all(r[1] == pytest.approx(r[2], abs=1e-6) for r in rows)


@pytest.mark.parametrize(("statement", "sqlstate", "message"), [
    ("SELECT madlib_keras_predict('multi', 'iris', 'id', 'attributes', 'bad_out')", "22023",
     "holds several models: pass mst_key"),
    ("SELECT madlib_keras_predict('single', 'iris', 'id', 'attributes', 'bad_out', 'prob', FALSE, 1)",
     "22023", "holds one model: do not pass mst_key"),
    ("SELECT madlib_keras_predict('nope', 'iris', 'id', 'attributes', 'bad_out')", "42P01", "does not exist"),
    ("SELECT madlib_keras_predict('multi', 'iris', 'id', 'attributes', 'bad_out', 'prob', FALSE, 9)",
     "22023", "mst_key 9 is not in"),
    ("SELECT madlib_keras_predict('single', 'iris', 'no_id', 'attributes', 'bad_out')", "42703", "no_id"),
    ("SELECT madlib_keras_predict('single', 'iris', 'id', 'width', 'bad_out')", "42804",
     "which is not a numeric array"),
    ("SELECT madlib_keras_predict('single', 'iris_wide', 'id', 'attributes', 'bad_out')",
     "22023", "Input shape [3] in the model architecture does not match the input shape [4] of "
              "column attributes in table public.iris_wide"),
    ("SELECT madlib_keras_predict('single', 'iris', 'id', 'attributes', 'iris')", "42P07", "already exists"),
    ("SELECT madlib_keras_predict('single', 'iris', 'id', 'attributes', 'bad_out', 'maybe')", "22023",
     "pred_type 'maybe' is not valid"),
    ("SELECT madlib_keras_evaluate('single', 'iris', 'bad_out')", "42P01", "no summary table"),
    ("SELECT madlib_keras_evaluate('multi', 'iris_valid', 'bad_out')", "22023", "pass mst_key"),
    ("SELECT madlib_keras_evaluate('regression', 'iris_valid', 'bad_out')", "42804",
     "trained for regression"),
])
def test_bad_input(conn, models, statement, sqlstate, message):
    with pytest.raises(psycopg.Error) as raised:
        conn.execute(statement)
    diag = raised.value.diag
    assert diag.sqlstate == sqlstate, diag.message_primary
    assert message in diag.message_primary and diag.message_hint
    assert conn.execute("SELECT to_regclass('bad_out') IS NULL").fetchone()[0]
