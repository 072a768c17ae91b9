"""Answers a MADlib user gets, run as psql runs a script file (autocommit, one statement
after another): data of another shape than the model's input is refused wherever a flat
array would be reshaped, a model trained on one-hot labels predicts classes that are the
labels' positions, a NULL validation label that is no training class is packed as MADlib
packs it, and the error texts carry MADlib's phrases."""

from __future__ import annotations

import json

import numpy as np
import pytest

from tests.conftest import connect, psql_error, psql_rows, psql_script

# A model of images of 4x4 pixels and 3 channels (channels last): 48 values per row.
IMAGE_MODEL = json.dumps({"class_name": "Sequential", "config": {"name": "img", "layers": [
    {"class_name": "InputLayer", "config": {"batch_input_shape": [None, 4, 4, 3], "name": "i"}},
    {"class_name": "Flatten", "config": {"name": "f"}},
    {"class_name": "Dense", "config": {"units": 2, "activation": "softmax", "name": "d"}}]}})
COMPILE = "loss='categorical_crossentropy', optimizer='Adam(lr=0.05)', metrics=['accuracy']"
MLP = json.dumps({"class_name": "Sequential", "config": {"name": "mlp", "layers": [
    {"class_name": "InputLayer", "config": {"batch_input_shape": [None, 4], "name": "i"}},
    {"class_name": "Dense", "config": {"units": 5, "activation": "softmax", "name": "d"}}]}})


@pytest.fixture(scope="module")
def dsn(extension_dsn):
    rng = np.random.default_rng(7)
    with connect(extension_dsn) as conn:
        # The same pixels as (4, 4, 3) (channels last, as the model reads them), as
        # (3, 4, 4) (channels first) and flat (48): three shapes of the same 48 values.
        conn.execute("CREATE TABLE images (id int, x real[], y text)")
        conn.execute("CREATE TABLE images_chw (id int, x real[], y text)")
        conn.execute("CREATE TABLE images_flat (id int, x real[], y text)")
        for i in range(40):
            pixels = rng.random((4, 4, 3)).round(3)
            label = "bright" if pixels[..., 0].mean() > 0.5 else "dark"
            conn.execute("INSERT INTO images VALUES (%s, %s, %s)", (i, pixels.tolist(), label))
            conn.execute("INSERT INTO images_chw VALUES (%s, %s, %s)",
                         (i, pixels.transpose(2, 0, 1).tolist(), label))
            conn.execute("INSERT INTO images_flat VALUES (%s, %s, %s)", (i, pixels.ravel().tolist(), label))
        conn.execute("SELECT load_keras_model('image_arch', %s::json)", (IMAGE_MODEL,))
        conn.execute("SELECT load_keras_model('image_arch', %s::json, %s::bytea)",
                     (IMAGE_MODEL, np.zeros(48 * 2 + 2, dtype=np.float32).tobytes()))
        conn.execute("SELECT training_preprocessor_dl('images', 'images_packed', 'y', 'x', "
                     "distribution_rules => '2')")
        conn.execute("SELECT training_preprocessor_dl('images_chw', 'images_chw_packed', 'y', 'x', "
                     "distribution_rules => '2')")
        conn.execute("SELECT madlib_keras_fit('images_packed', 'image_model', 'image_arch', 1, "
                     f"$${COMPILE}$$, 'batch_size=8', 1)")
    return extension_dsn




def _exists(dsn: str, table: str) -> bool:
    return psql_rows(dsn, f"SELECT to_regclass('{table}') IS NOT NULL;") == ["t"]


# ---- 1. data of another shape than the model's input ---------------------------------------

@pytest.mark.parametrize(("what", "statement", "found"), [
    ("predict, channels first", "SELECT madlib_keras_predict('image_model', 'images_chw', 'id', 'x', "
                                "'p_chw', 'response')", "[3, 4, 4]"),
    ("predict, flat rows", "SELECT madlib_keras_predict('image_model', 'images_flat', 'id', 'x', "
                           "'p_chw')", "[48]"),
    ("predict_byom", "SELECT madlib_keras_predict_byom('image_arch', 2, 'images_chw', 'id', 'x', "
                     "'p_chw', class_values => ARRAY['bright', 'dark'])", "[3, 4, 4]"),
    ("evaluate", "SELECT madlib_keras_evaluate('image_model', 'images_chw_packed', 'p_chw')",
     "[3, 4, 4]"),
    ("fit", "SELECT madlib_keras_fit('images_chw_packed', 'p_chw', 'image_arch', 1, "
            f"$${COMPILE}$$, 'batch_size=8', 1)", "[3, 4, 4]"),
    ("fit, validation data", "SELECT madlib_keras_fit('images_packed', 'p_chw', 'image_arch', 1, "
                             f"$${COMPILE}$$, 'batch_size=8', 1, validation_table => 'images_chw_packed')",
     "[3, 4, 4]"),
])
def test_another_shape_of_the_same_values_is_refused(dsn, what, statement, found):
    """The model takes (4, 4, 3); the same 48 values as (3, 4, 4) or flat would reshape
    without an error and give wrong answers: refused with both shapes, as MADlib does."""
    error = psql_error(dsn, statement)
    assert error["sqlstate"] == "22023", error
    assert "Input shape [4, 4, 3] in the model architecture does not match the input shape " \
           f"{found} of column x in table" in error["message"], error
    assert error["hint"] and "Both hold 48 values per row" in error["detail"], error
    assert not _exists(dsn, "p_chw") and not _exists(dsn, "p_chw_summary")


def test_the_right_shape_predicts(dsn):
    rows = psql_rows(dsn, """
        SELECT madlib_keras_predict('image_model', 'images', 'id', 'x', 'p_ok', 'response');
        SELECT count(*), count(DISTINCT id) FROM p_ok;
        DROP TABLE p_ok;""")
    assert rows == ["40|40"]


def test_rows_of_another_shape_after_the_first_are_refused(dsn):
    """Predict checks the first row before any worker starts; every later row is checked
    where it is read (a chunk whose rows differ in shape is refused by the packing
    aggregate, a chunk of rows of another shape by the worker)."""
    psql_rows(dsn, """
        CREATE TABLE images_mixed AS SELECT * FROM images WHERE id < 20;
        INSERT INTO images_mixed SELECT id + 100, x, y FROM images_chw;
        INSERT INTO images_mixed SELECT id + 200, x, y FROM images_chw;""")
    error = psql_error(dsn, "SELECT madlib_keras_predict('image_model', 'images_mixed', 'id', 'x', 'p_mixed')")
    assert error["sqlstate"] in ("22000", "22023"), error
    if error["sqlstate"] == "22000":
        assert "differ in shape" in error["message"], error
    assert "[3, 4, 4]" in error["message"] + (error["detail"] or ""), error
    assert not _exists(dsn, "p_mixed")


# ---- 2. one-hot labels: classes are the positions ------------------------------------------

@pytest.fixture(scope="module")
def one_hot_model(dsn):
    """A model fit on one-hot label arrays of 5 classes, its summary's class values then
    set as MADlib's test scripts set them for one-hot data: NULL."""
    psql_rows(dsn, f"""
        CREATE TABLE five AS SELECT i AS id,
            ARRAY[i % 5, (i / 5) % 3, i % 7, i % 2]::real[] AS attributes,
            (SELECT array_agg((k = i % 5)::int ORDER BY k) FROM generate_series(0, 4) k)::smallint[] AS y
        FROM generate_series(0, 59) i;
        SELECT training_preprocessor_dl('five', 'five_packed', 'y', 'attributes',
                                        distribution_rules => '2');
        SELECT load_keras_model('five_arch', $${MLP}$$::json);
        SELECT madlib_keras_fit('five_packed', 'five_model', 'five_arch', 1, $${COMPILE}$$,
                                'batch_size=10', 2);
        SELECT load_model_selection_table('five_arch', 'five_mst', ARRAY[1], ARRAY[$${COMPILE}$$],
                                          ARRAY['batch_size=10']);
        SELECT madlib_keras_fit_multiple_model('five_packed', 'five_multi', 'five_mst', 2, FALSE);""")
    return dsn


@pytest.mark.parametrize("model", ["five_model", "five_multi"])
@pytest.mark.parametrize(("class_values", "num_classes"), [
    ("ARRAY[NULL]::smallint[]", "ARRAY[5]"), ("NULL", "ARRAY[5]"), ("ARRAY[NULL]::smallint[]", "NULL")])
def test_one_hot_models_predict_positions(one_hot_model, model, class_values, num_classes):
    """MADlib's one-hot summaries have NULL class values: the classes are then the
    positions '0' .. '4' (num_classes of them, else the model's outputs).  (A NULL array
    and no num_classes is a regression model's summary.)"""
    mst = ", NULL, 1" if model == "five_multi" else ""
    rows = psql_rows(one_hot_model, f"""
        UPDATE {model}_summary SET y_class_values = {class_values}, num_classes = {num_classes};
        SELECT madlib_keras_predict('{model}', 'five', 'id', 'attributes', 'five_prob', 'prob'{mst});
        SELECT count(*), count(DISTINCT id), string_agg(DISTINCT class_value, ',' ORDER BY class_value)
        FROM five_prob;
        SELECT madlib_keras_predict('{model}', 'five', 'id', 'attributes', 'five_resp', 'response'{mst});
        SELECT count(*), bool_and(r.class_value = (SELECT p.class_value FROM five_prob p
                                                   WHERE p.id = r.id AND p.rank = 1))
        FROM five_resp r;
        SELECT madlib_keras_evaluate('{model}', 'five_packed', 'five_eval'{', NULL, 1' if mst else ''});
        SELECT loss > 0 FROM five_eval;
        DROP TABLE five_prob, five_resp, five_eval;""")
    # prob: one row per position for each id; response: the position of the highest.
    assert rows == ["300|60|0,1,2,3,4", "60|t", "t"]


# ---- 3. a NULL validation label that is no training class ---------------------------------

def test_null_validation_label_is_packed_as_madlib_packs_it(dsn):
    done = psql_script(dsn, f"""
        CREATE TABLE images_valid AS SELECT * FROM images WHERE id < 10;
        UPDATE images_valid SET y = NULL WHERE id < 3;
        SELECT validation_preprocessor_dl('images_valid', 'images_valid_packed', 'y', 'x',
                                          'images_packed');
        SELECT madlib_keras_fit('images_packed', 'image_valid_model', 'image_arch', 1,
                                $${COMPILE}$$, 'batch_size=8', 2,
                                validation_table => 'images_valid_packed');""")
    assert done.returncode == 0, done.stderr
    assert "3 rows have a NULL label, which is no class of" in done.stderr
    assert "all-zero one-hot label, as MADlib packs them" in done.stderr
    rows = psql_rows(dsn, """
        SELECT num_rows FROM images_valid_packed_summary;
        SELECT y_class_values FROM images_valid_packed_summary;
        SELECT validation_loss_final IS NOT NULL FROM image_valid_model_summary;""")
    assert rows == ["10", "{bright,dark}", "t"]
    with connect(dsn) as conn:
        labels = [np.frombuffer(y, dtype="<i2").reshape(shape)
                  for y, shape in conn.execute("SELECT y, y_shape FROM images_valid_packed")]
    labels = np.concatenate(labels)
    assert labels.shape == (10, 2) and (labels.sum(axis=1) == 0).sum() == 3
    assert set(labels.sum(axis=1)) == {0, 1}


def test_other_unknown_validation_labels_are_still_refused(dsn):
    psql_rows(dsn, """
        CREATE TABLE images_other AS SELECT * FROM images WHERE id < 10;
        UPDATE images_other SET y = 'grey' WHERE id < 2;
        UPDATE images_other SET y = NULL WHERE id = 5;""")
    error = psql_error(dsn, "SELECT validation_preprocessor_dl('images_other', 'images_other_packed', "
                        "'y', 'x', 'images_packed')")
    assert error["sqlstate"] == "22023" and "'grey'" in error["message"], error
    assert not _exists(dsn, "images_other_packed")


# ---- 4. MADlib's phrases for the same mistakes -----------------------------------------------

@pytest.mark.parametrize(("statement", "sqlstate", "phrase"), [
    (f"SELECT madlib_keras_fit('images_packed', 'x_out', 'image_arch', 1, $${COMPILE}$$, "
     "'batch_size=8', 1, validation_table => 'no_such_valid')", "42P01",
     "Input table 'no_such_valid' does not exist"),
    ("SELECT madlib_keras_fit_multiple_model('no_such_packed', 'x_out', 'mst', 1)", "42P01",
     "Input table 'no_such_packed' does not exist"),
    ("SELECT madlib_keras_evaluate('image_model', 'no_such_test', 'x_out')", "42P01",
     "Input table 'no_such_test' does not exist"),
    ("SELECT madlib_keras_predict('image_model', 'no_such_test', 'id', 'x', 'x_out')", "42P01",
     "Input table 'no_such_test' does not exist"),
    ("SELECT madlib_keras_predict('image_model', 'images', 'id', 'x', 'images')", "42P07",
     "Output table 'public.images' already exists"),
    ("SELECT training_preprocessor_dl('images', 'images_packed', 'y', 'x')", "42P07",
     "Output table 'public.images_packed' already exists"),
    ("CREATE TABLE empty_images (id int, x real[], y text); "
     "SELECT training_preprocessor_dl('empty_images', 'x_out', 'y', 'x')", "22000",
     "Input table 'public.empty_images' is empty"),
])
def test_madlib_phrases(dsn, statement, sqlstate, phrase):
    error = psql_error(dsn, statement)
    assert error["sqlstate"] == sqlstate and phrase in error["message"], error
    assert error["hint"]
    assert not _exists(dsn, "x_out")
