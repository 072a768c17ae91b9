"""training_preprocessor_dl / validation_preprocessor_dl in a real server."""

from __future__ import annotations

from collections import Counter

import numpy as np
import psycopg
import pytest
from psycopg import sql
from sklearn.datasets import load_digits, load_iris



@pytest.fixture(scope="module")
def data(extension_dsn):
    """iris (text labels, float8[] features) and digits (int labels, 8x8x1 real[] images)."""
    iris, digits = load_iris(), load_digits()
    with psycopg.connect(extension_dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE iris (id int, attributes float8[], class_text text, "
                     "sepal_length float8, sepal_width float8, petal_length real, petal_width numeric)")
        with conn.cursor().copy("COPY iris FROM STDIN") as copy:
            for i, (x, y) in enumerate(zip(iris.data, iris.target)):
                copy.write_row((i, [float(v) for v in x], str(iris.target_names[y]), *map(float, x)))
        conn.execute("CREATE TABLE digits (id int, image real[], digit int)")
        with conn.cursor().copy("COPY digits FROM STDIN") as copy:
            for i, (x, y) in enumerate(zip(digits.images, digits.target)):
                copy.write_row((i, x.reshape(8, 8, 1).tolist(), int(y)))
    return iris, digits


def _call(conn, function, *args, **named):
    parts = [sql.Placeholder()] * len(args) + [
        sql.SQL("{} => {}").format(sql.Identifier(k), sql.Placeholder()) for k in named]
    conn.execute(sql.SQL("SELECT madlib_mop.{}({})").format(sql.Identifier(function),
                                                              sql.SQL(", ").join(parts)),
                 (*args, *named.values()))


def _drop(conn, *tables):
    for table in tables:
        conn.execute(sql.SQL("DROP TABLE IF EXISTS {}, {} CASCADE").format(
            sql.Identifier(table), sql.Identifier(table + "_summary")))


def _summary(conn, table):
    with conn.cursor(row_factory=psycopg.rows.dict_row) as cur:
        return cur.execute(sql.SQL("SELECT * FROM {}").format(sql.Identifier(table + "_summary"))).fetchone()


def _unpack(conn, table, x, y, label_dtype="<i2"):
    rows = conn.execute(sql.SQL(
        "SELECT __dist_key__, buffer_id, {x}, {y}, {xs}, {ys} FROM {t} ORDER BY buffer_id").format(
        x=sql.Identifier(x), y=sql.Identifier(y), xs=sql.Identifier(x + "_shape"),
        ys=sql.Identifier(y + "_shape"), t=sql.Identifier(table))).fetchall()
    features = [np.frombuffer(r[2], dtype="<f4").reshape(r[4]) for r in rows]
    labels = [np.frombuffer(r[3], dtype=label_dtype).reshape(r[5]) for r in rows]
    return rows, np.concatenate(features), np.concatenate(labels)


def test_iris_round_trip(conn, data):
    iris, _ = data
    _drop(conn, "iris_packed")
    _call(conn, "training_preprocessor_dl", "iris", "iris_packed", "class_text", "attributes",
          distribution_rules="2")
    summary = _summary(conn, "iris_packed")
    assert list(summary)[:11] == [
        "source_table", "output_table", "dependent_varname", "independent_varname",
        "dependent_vartype", "class_text_class_values", "buffer_size", "normalizing_const",
        "num_classes", "distribution_rules", "__internal_gpu_config__"]
    assert summary["class_text_class_values"] == ["setosa", "versicolor", "virginica"]
    assert summary["num_classes"] == [3] and summary["dependent_vartype"] == ["text"]
    assert summary["num_segments"] == 2 and summary["num_rows"] == 150
    assert summary["rows_per_segment"] == [75, 75] and summary["feature_shape"] == [4]

    rows, features, labels = _unpack(conn, "iris_packed", "attributes", "class_text")
    assert sorted(r[0] for r in rows) == [0, 1]  # one buffer per segment
    assert labels.shape == (150, 3) and (labels.sum(axis=1) == 1).all()
    # Unpacked rows are exactly the source rows, as a multiset, with their labels.
    packed = Counter((tuple(x), summary["class_text_class_values"][int(np.argmax(y))])
                     for x, y in zip(features.tolist(), labels))
    source = Counter((tuple(np.float32(v).item() for v in x), str(iris.target_names[t]))
                     for x, t in zip(iris.data, iris.target))
    assert packed == source
    # Shuffled: not in the source order.
    assert not np.array_equal(features, iris.data.astype(np.float32))


def test_partitions_hold_their_segments(conn, data):
    _drop(conn, "digits_packed")
    _call(conn, "training_preprocessor_dl", "digits", "digits_packed", "digit", "image",
          buffer_size=100, normalizing_const=16.0, distribution_rules="3")
    partitions = conn.execute(
        "SELECT c.relname, pg_get_expr(c.relpartbound, c.oid) FROM pg_inherits i "
        "JOIN pg_class c ON c.oid = i.inhrelid WHERE i.inhparent = 'digits_packed'::regclass "
        "ORDER BY 1").fetchall()
    assert partitions == [(f"digits_packed_seg{k}", f"FOR VALUES IN ({k})") for k in range(3)]
    counts = conn.execute("SELECT __dist_key__, count(*) FROM digits_packed GROUP BY 1 ORDER BY 1").fetchall()
    assert [c for _, c in counts] in ([6, 6, 6], [6, 6, 7], [7, 7, 6])
    assert sum(c for _, c in counts) == -(-1797 // 100)
    summary = _summary(conn, "digits_packed")
    assert summary["digit_class_values"] == list(range(10)) and summary["feature_shape"] == [8, 8, 1]
    assert summary["normalizing_const"] == 16.0


def test_images_round_trip_normalized(conn, data):
    _, digits = data
    _drop(conn, "digits_round")
    _call(conn, "training_preprocessor_dl", "digits", "digits_round", "digit", "image",
          normalizing_const=16.0, distribution_rules="2")
    _, features, labels = _unpack(conn, "digits_round", "image", "digit")
    assert features.shape == (1797, 8, 8, 1)
    packed = Counter((x.tobytes(), int(np.argmax(y))) for x, y in zip(features, labels))
    source = Counter(((x.reshape(8, 8, 1).astype(np.float32) / np.float32(16)).tobytes(), int(t))
                     for x, t in zip(digits.images, digits.target))
    assert packed == source


def test_same_seed_same_packing(conn, data):
    _drop(conn, "seed_a", "seed_b", "seed_c")
    for table, seed in (("seed_a", 5), ("seed_b", 5), ("seed_c", 6)):
        _call(conn, "training_preprocessor_dl", "iris", table, "class_text", "attributes",
              distribution_rules="2", seed=seed)
    a, b, c = (conn.execute(sql.SQL("SELECT string_agg(attributes, '' ORDER BY buffer_id) FROM {}").format(
        sql.Identifier(t))).fetchone()[0] for t in ("seed_a", "seed_b", "seed_c"))
    assert a == b and a != c


def test_a_table_larger_than_the_packing_memory_is_packed_in_waves(conn, data):
    """madlib_mop.preprocessor_memory_mb bounds the rows a packing holds: a table larger than
    that is packed in several waves (here 10,000 rows of 256 bytes in 1 MB: 3 waves of
    whole buffers), into the same buffers as in one wave."""
    _drop(conn, "wide", "one_wave", "waves")
    conn.execute("CREATE TABLE wide AS SELECT i AS id, ARRAY(SELECT ((i * j) % 17)::real "
                 "FROM generate_series(1, 64) j) AS x, i % 10 AS y FROM generate_series(1, 10000) i")
    _call(conn, "training_preprocessor_dl", "wide", "one_wave", "y", "x", 1000, distribution_rules="2")
    conn.execute("SET madlib_mop.preprocessor_memory_mb = 1")
    try:
        _call(conn, "training_preprocessor_dl", "wide", "waves", "y", "x", 1000, distribution_rules="2")
    finally:
        conn.execute("RESET madlib_mop.preprocessor_memory_mb")
    one, waves = (conn.execute(sql.SQL("SELECT buffer_id, __dist_key__, x, y FROM {} ORDER BY 1")
                               .format(sql.Identifier(t))).fetchall() for t in ("one_wave", "waves"))
    assert len(one) == 10 and one == waves


def test_several_scalar_feature_columns_are_refused_with_the_view_of_one_input(conn, data):
    """MADlib reads 'a, b' as the inputs of a model of several inputs, each an array (see
    test_multi_io.py): scalar columns are refused, with the view that gives one input made
    of them."""
    _drop(conn, "cols_packed")
    diag = _error(conn, "training_preprocessor_dl", "iris", "cols_packed", "class_text",
                  'sepal_length, sepal_width, "petal_length", petal_width')
    assert diag.sqlstate == "42804" and "several inputs" in diag.message_primary
    assert "ARRAY[sepal_length, sepal_width, petal_length, petal_width]" in diag.message_hint
    _nothing_left(conn, "cols_packed")


def test_float_labels_are_classes_and_null_is_a_class(conn, data):
    """MADlib's meaning: a float label holds classes; NULL is a class (the first)."""
    _drop(conn, "float_packed", "float_valid")
    conn.execute("CREATE TABLE IF NOT EXISTS floats AS SELECT id, attributes, "
                 "CASE WHEN id % 5 = 0 THEN NULL ELSE (id % 3)::float8 / 2 END AS half FROM iris")
    _call(conn, "training_preprocessor_dl", "floats", "float_packed", "half", "attributes",
          distribution_rules="2")
    summary = _summary(conn, "float_packed")
    assert summary["label_kind"] == "classification" and summary["num_classes"] == [4]
    assert summary["half_class_values"] == [None, 0.0, 0.5, 1.0]
    _, _, labels = _unpack(conn, "float_packed", "attributes", "half")
    counts = conn.execute("SELECT count(*) FILTER (WHERE half IS NULL), count(*) FILTER "
                          "(WHERE half = 0), count(*) FILTER (WHERE half = 0.5), count(*) "
                          "FILTER (WHERE half = 1) FROM floats").fetchone()
    assert labels.shape == (150, 4) and (labels.sum(axis=1) == 1).all()
    assert labels.sum(axis=0).tolist() == list(counts)
    _call(conn, "validation_preprocessor_dl", "floats", "float_valid", "half", "attributes",
          "float_packed")
    assert _summary(conn, "float_valid")["half_class_values"] == [None, 0.0, 0.5, 1.0]


def test_numeric_array_labels_are_one_hot(conn, data):
    _drop(conn, "onehot_packed", "onehot_bad")
    conn.execute("CREATE TABLE IF NOT EXISTS onehot AS SELECT id, attributes, "
                 "ARRAY[(id % 3 = 0)::int, (id % 3 = 1)::int, (id % 3 = 2)::int]::real[] AS y FROM iris")
    _call(conn, "training_preprocessor_dl", "onehot", "onehot_packed", "y", "attributes",
          distribution_rules="2")
    summary = _summary(conn, "onehot_packed")
    # As MADlib writes it: no class values and no num_classes for one-hot arrays (readers
    # take the classes from the arrays' width).
    assert summary["label_kind"] == "classification" and summary["num_classes"] is None
    assert summary["y_class_values"] is None
    _, _, labels = _unpack(conn, "onehot_packed", "attributes", "y")
    counts = conn.execute("SELECT count(*) FILTER (WHERE id % 3 = 0), count(*) FILTER "
                          "(WHERE id % 3 = 1), count(*) FILTER (WHERE id % 3 = 2) FROM onehot").fetchone()
    assert labels.shape == (150, 3) and labels.sum(axis=0).tolist() == list(counts)
    conn.execute("CREATE TABLE IF NOT EXISTS not_onehot AS SELECT id, attributes, "
                 "ARRAY[sepal_length, 1]::real[] AS y FROM iris")
    diag = _error(conn, "training_preprocessor_dl", "not_onehot", "onehot_bad", "y", "attributes")
    assert diag.sqlstate == "22023" and "regression => TRUE" in diag.message_hint
    _nothing_left(conn, "onehot_bad")


def test_boolean_integer_labels_and_num_classes(conn, data):
    _drop(conn, "bool_packed")
    conn.execute("CREATE TABLE IF NOT EXISTS flags AS SELECT id, attributes, id % 3 = 0 AS big FROM iris")
    _call(conn, "training_preprocessor_dl", "flags", "bool_packed", "big", "attributes",
          num_classes=[4], distribution_rules="2")
    summary = _summary(conn, "bool_packed")
    assert summary["big_class_values"] == [False, True, None, None]
    assert summary["num_classes"] == [4]
    _, _, labels = _unpack(conn, "bool_packed", "attributes", "big")
    assert labels.shape == (150, 4) and labels[:, 2:].sum() == 0 and labels[:, 1].sum() == 50


def test_regression_targets(conn, data):
    _drop(conn, "reg_packed")
    conn.execute("CREATE TABLE IF NOT EXISTS reg AS SELECT id, attributes, "
                 "ARRAY[sepal_length * 2, petal_width::float8] AS target FROM iris")
    _call(conn, "training_preprocessor_dl", "reg", "reg_packed", "target", "attributes",
          distribution_rules="2", regression=True)
    summary = _summary(conn, "reg_packed")
    assert summary["label_kind"] == "regression" and summary["num_classes"] is None
    _, features, targets = _unpack(conn, "reg_packed", "attributes", "target", label_dtype="<f4")
    assert targets.shape == (150, 2)
    assert np.allclose(targets[:, 0], features[:, 0] * 2)


def test_view_source(conn, data):
    _drop(conn, "view_packed")
    conn.execute("CREATE OR REPLACE VIEW setosa_or_not AS "
                 "SELECT attributes, class_text = 'setosa' AS setosa FROM iris WHERE id < 100")
    _call(conn, "training_preprocessor_dl", "setosa_or_not", "view_packed", "setosa", "attributes",
          distribution_rules="2")
    assert _summary(conn, "view_packed")["num_rows"] == 100


def test_validation_uses_the_training_classes(conn, data):
    _drop(conn, "iris_packed", "iris_valid")
    _call(conn, "training_preprocessor_dl", "iris", "iris_packed", "class_text", "attributes",
          distribution_rules="2")
    conn.execute("CREATE TABLE IF NOT EXISTS iris_tail AS SELECT * FROM iris WHERE id >= 100")  # virginica only
    _call(conn, "validation_preprocessor_dl", "iris_tail", "iris_valid", "class_text", "attributes",
          "iris_packed")
    summary = _summary(conn, "iris_valid")
    assert summary["class_text_class_values"] == ["setosa", "versicolor", "virginica"]
    assert summary["num_segments"] == 2
    _, features, labels = _unpack(conn, "iris_valid", "attributes", "class_text")
    assert labels.shape == (50, 3) and (labels[:, 2] == 1).all()


def _error(conn, function, *args, **named):
    with pytest.raises(psycopg.Error) as raised:
        _call(conn, function, *args, **named)
    return raised.value.diag


def _nothing_left(conn, *tables):
    for table in tables:
        for name in (table, table + "_summary", table + "_seg0"):
            assert conn.execute("SELECT to_regclass(%s)", (name,)).fetchone()[0] is None, name


@pytest.mark.parametrize(("setup", "args", "named", "sqlstate", "message"), [
    (None, ("no_table", "out", "y", "x"), {}, "42P01", "source_table: Input table 'no_table' does not exist"),
    (None, ("iris", "out", "class_text", "no_column"), {}, "42703", 'independent_varname "no_column"'),
    (None, ("iris", "out", "no_label", "attributes"), {}, "42703", 'dependent_varname "no_label"'),
    ("CREATE TABLE bad AS SELECT ARRAY[1.0, NULL]::float8[] AS x, 'a' AS y",
     ("bad", "out", "y", "x"), {}, "22004", "NULL features"),
    ("CREATE TABLE bad AS SELECT NULL::float8[] AS x, 'a' AS y",
     ("bad", "out", "y", "x"), {}, "22004", "NULL features"),
    ("CREATE TABLE bad AS SELECT ARRAY[1.0, 'NaN']::float8[] AS x, 'a' AS y",
     ("bad", "out", "y", "x"), {}, "22000", "NaN or infinite"),
    ("CREATE TABLE bad AS SELECT ARRAY[1.0, 'Infinity']::float8[] AS x, 'a' AS y",
     ("bad", "out", "y", "x"), {}, "22000", "NaN or infinite"),
    ("CREATE TABLE bad AS SELECT ARRAY[1.0, 2.0]::float8[] AS x, 'a' AS y "
     "UNION ALL SELECT ARRAY[1.0]::float8[], 'b'", ("bad", "out", "y", "x"), {}, "22000", "differ in shape"),
    ("CREATE TABLE bad AS SELECT ARRAY['a', 'b'] AS x, 'a' AS y",
     ("bad", "out", "y", "x"), {}, "42804", "which is not a numeric array"),
    ("CREATE TABLE bad AS SELECT ARRAY[1.0]::float8[] AS x, 'a' AS y WHERE false",
     ("bad", "out", "y", "x"), {}, "22000", "is empty"),
    ("CREATE TABLE bad AS SELECT ARRAY[1.0]::float8[] AS x, 'a'::text AS y",
     ("bad", "out", "y", "x"), {"regression": True}, "42804", "regression needs numbers"),
    ("CREATE TABLE bad AS SELECT ARRAY[1.0]::float8[] AS x, 'NaN'::float8 AS y",
     ("bad", "out", "y", "x"), {}, "22000", "NaN labels"),
    ("CREATE TABLE bad AS SELECT ARRAY[i]::float8[] AS x, i / 7.0 AS y FROM generate_series(1, 300) i",
     ("bad", "out", "y", "x"), {}, "22023", "300 distinct values in 300 rows"),
    (None, ("iris", "out", "class_text", "attributes"), {"num_classes": [2]}, "22023",
     "num_classes 2 is less than the 3 classes"),
    (None, ("iris", "out", "class_text", "attributes"), {"normalizing_const": 0.0}, "22023",
     "normalizing_const must be a positive number"),
    (None, ("iris", "out", "class_text", "attributes"), {"buffer_size": -1}, "22023",
     "buffer_size must be a positive number"),
    (None, ("iris", "out", "class_text", "attributes"), {"distribution_rules": "gpu_segments"},
     "0A000", "'gpu_segments' is not supported"),
    (None, ("iris", "out", "class_text", "attributes"), {"distribution_rules": "some"},
     "22023", "not understood"),
])
def test_bad_input(conn, data, setup, args, named, sqlstate, message):
    conn.execute("DROP TABLE IF EXISTS bad")
    if setup:
        conn.execute(setup)
    diag = _error(conn, "training_preprocessor_dl", *args, **named)
    assert diag.sqlstate == sqlstate, diag.message_primary
    assert message in diag.message_primary
    assert diag.message_hint
    _nothing_left(conn, "out")


def test_output_table_exists(conn, data):
    conn.execute("CREATE TABLE IF NOT EXISTS taken (x int)")
    diag = _error(conn, "training_preprocessor_dl", "iris", "taken", "class_text", "attributes")
    assert diag.sqlstate == "42P07" and "already exists" in diag.message_primary
    assert conn.execute("SELECT count(*) FROM taken").fetchone()[0] == 0
    _nothing_left(conn, "taken_summary")


def test_validation_with_an_unknown_label(conn, data):
    _drop(conn, "iris_packed")
    _call(conn, "training_preprocessor_dl", "iris", "iris_packed", "class_text", "attributes",
          distribution_rules="2")
    conn.execute("CREATE TABLE IF NOT EXISTS iris_odd AS SELECT attributes, "
                 "CASE WHEN id = 7 THEN 'daisy' ELSE class_text END AS class_text FROM iris")
    diag = _error(conn, "validation_preprocessor_dl", "iris_odd", "out", "class_text", "attributes",
                  "iris_packed")
    assert diag.sqlstate == "22023" and "'daisy'" in diag.message_primary
    _nothing_left(conn, "out")


def test_validation_with_another_feature_shape(conn, data):
    _drop(conn, "iris_packed")
    _call(conn, "training_preprocessor_dl", "iris", "iris_packed", "class_text", "attributes",
          distribution_rules="2")
    conn.execute("CREATE TABLE IF NOT EXISTS iris_short AS SELECT attributes[1:3] AS attributes, class_text FROM iris")
    diag = _error(conn, "validation_preprocessor_dl", "iris_short", "out", "class_text",
                  "attributes", "iris_packed")
    assert diag.sqlstate == "42804" and "shape [3]" in diag.message_primary
    _nothing_left(conn, "out")


def test_validation_needs_a_training_table(conn, data):
    diag = _error(conn, "validation_preprocessor_dl", "iris", "out", "class_text", "attributes", "iris")
    assert diag.sqlstate == "42P01" and "no summary table" in diag.message_primary


@pytest.mark.parametrize("function", ["training_preprocessor_dl", "validation_preprocessor_dl"])
def test_usage(conn, function):
    for call in (sql.SQL("SELECT madlib_mop.{}()"), sql.SQL("SELECT madlib_mop.{}('help')")):
        text = conn.execute(call.format(sql.Identifier(function))).fetchone()[0]
        assert text.startswith(function) and "source_table" in text and "output_table" in text
    other = conn.execute(sql.SQL("SELECT madlib_mop.{}('nonsense')").format(sql.Identifier(function))).fetchone()[0]
    assert other.startswith("No such option")
