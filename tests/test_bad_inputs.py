"""Bad input across every function: each call fails with its SQLSTATE (never XX000, the
code of an unexpected internal error), a message and a HINT, and leaves nothing behind (no
table, no row in the catalogs, no job).  One table of cases; each case is one call."""

from __future__ import annotations

from dataclasses import dataclass

import psycopg
import pytest

import keras

COMPILE = "loss='categorical_crossentropy', optimizer='Adam(lr=0.01)', metrics=['accuracy']"
GRID = ("$${'loss': ['categorical_crossentropy'], 'optimizer_params_list': "
        "[{'optimizer': ['Adam'], 'lr': [0.01]}], 'metrics': ['accuracy']}$$")
FIT_GRID = "$${'batch_size': [16], 'epochs': [1]}$$"


def _mlp(inputs: int) -> str:
    return keras.Sequential([keras.Input((inputs,)), keras.layers.Dense(8, activation="relu"),
                             keras.layers.Dense(3, activation="softmax")]).to_json()


LAMBDA = ('{"class_name": "Sequential", "config": {"name": "s", "layers": ['
          '{"class_name": "InputLayer", "config": {"batch_shape": [null, 4], "name": "i"}}, '
          '{"class_name": "Lambda", "config": {"name": "l", "function": '
          '["4wEAAAAAAAAA", null, null]}}]}, "keras_version": "3.0.0", "backend": "tensorflow"}')
FOREIGN = ('{"class_name": "Sequential", "config": {"name": "s", "layers": ['
           '{"class_name": "InputLayer", "config": {"batch_shape": [null, 4], "name": "i"}}, '
           '{"module": "os", "class_name": "system", "config": {"name": "x"}}]}, '
           '"keras_version": "3.0.0", "backend": "tensorflow"}')


@dataclass(frozen=True)
class Case:
    name: str
    statement: str
    sqlstate: str
    setting: str | None = None  # SET before the call (RESET after)


FIT = "SELECT madlib_keras_fit_multiple_model"
PRE = "SELECT training_preprocessor_dl"
VAL = "SELECT validation_preprocessor_dl"
GEN = "SELECT generate_model_configs"
LMS = "SELECT load_model_selection_table"
EVAL = "SELECT madlib_keras_evaluate"
PRED = "SELECT madlib_keras_predict"

CASES = [
    # training_preprocessor_dl
    Case("pre: missing source", f"{PRE}('nope', 'o1', 'y', 'x')", "42P01"),
    Case("pre: NULL source", f"{PRE}(NULL, 'o1', 'y', 'x')", "22023"),
    Case("pre: empty output name", f"{PRE}('src', '', 'y', 'x')", "22023"),
    Case("pre: output exists", f"{PRE}('src', 'packed', 'y', 'x')", "42P07"),
    Case("pre: missing label column", f"{PRE}('src', 'o1', 'nope', 'x')", "42703"),
    Case("pre: missing feature column", f"{PRE}('src', 'o1', 'y', 'nope')", "42703"),
    Case("pre: injection in source", f"{PRE}('src; DROP TABLE src', 'o1', 'y', 'x')", "42P01"),
    Case("pre: injection in output", f"""{PRE}('src', 'o1"; DROP TABLE src; --', 'y', 'x')""", "22023"),
    Case("pre: injection in label", f"{PRE}('src', 'o1', 'y); DROP TABLE src; --', 'x')", "22023"),
    Case("pre: injection in features", f"{PRE}('src', 'o1', 'y', 'x FROM src; DROP TABLE src; --')", "22023"),
    Case("pre: buffer_size 0", f"{PRE}('src', 'o1', 'y', 'x', 0)", "22023"),
    Case("pre: buffer_size negative", f"{PRE}('src', 'o1', 'y', 'x', -5)", "22023"),
    Case("pre: normalizing_const 0", f"{PRE}('src', 'o1', 'y', 'x', 16, 0)", "22023"),
    Case("pre: normalizing_const NaN", f"{PRE}('src', 'o1', 'y', 'x', 16, 'NaN')", "22023"),
    Case("pre: normalizing_const infinite", f"{PRE}('src', 'o1', 'y', 'x', 16, 'Infinity')", "22023"),
    Case("pre: num_classes too few", f"{PRE}('src', 'o1', 'y', 'x', num_classes => ARRAY[2])", "22023"),
    Case("pre: NaN features", f"{PRE}('src_nan', 'o1', 'y', 'x')", "22000"),
    Case("pre: NULL feature array", f"{PRE}('src_null', 'o1', 'y', 'x')", "22004"),
    Case("pre: ragged arrays", f"{PRE}('src_ragged', 'o1', 'y', 'x')", "22000"),
    Case("pre: text features", f"{PRE}('src_text', 'o1', 'y', 'x')", "42804"),
    Case("pre: bad distribution_rules", f"{PRE}('src', 'o1', 'y', 'x', 16, distribution_rules => 'everywhere')", "22023"),
    Case("pre: zero segments", f"{PRE}('src', 'o1', 'y', 'x', 16, distribution_rules => '0')", "22023"),
    Case("pre: more segments than the server serves", f"{PRE}('src', 'o1', 'y', 'x', 16, "
         "distribution_rules => '1000')", "22023"),
    Case("pre: empty table", f"{PRE}('src_empty', 'o1', 'y', 'x')", "22000"),
    Case("pre: output name too long", f"{PRE}('src', '{'o' * 70}', 'y', 'x')", "22023"),
    Case("pre: output in a missing schema", f"{PRE}('src', 'nowhere.o1', 'y', 'x')", "3F000"),
    # validation_preprocessor_dl
    Case("val: missing training summary", f"{VAL}('src', 'v1', 'y', 'x', 'nope')", "42P01"),
    Case("val: not a packed table", f"{VAL}('src', 'v1', 'y', 'x', 'src')", "42P01"),
    Case("val: unknown class", f"{VAL}('src_newclass', 'v1', 'y', 'x', 'packed')", "22023"),
    Case("val: other feature shape", f"{VAL}('src5', 'v1', 'y', 'x', 'packed')", "42804"),
    # load_keras_model / delete_keras_model
    Case("load: empty JSON object", "SELECT load_keras_model('arch', '{}')", "22023"),
    Case("load: not a model", "SELECT load_keras_model('arch', '{\"a\": 1}')", "22023"),
    Case("load: Lambda layer", f"SELECT load_keras_model('arch', '{LAMBDA}')", "22023"),
    Case("load: foreign class", f"SELECT load_keras_model('arch', '{FOREIGN}')", "22023"),
    Case("load: NULL architecture", "SELECT load_keras_model('arch', NULL)", "22004"),
    Case("load: weights of the wrong size", "SELECT load_keras_model('arch', (SELECT model_arch FROM arch "
         "WHERE model_id = 1), '\\x00010203'::bytea)", "22023"),
    Case("load: injection in table name", "SELECT load_keras_model('arch; DROP TABLE src', "
         "(SELECT model_arch FROM arch WHERE model_id = 1))", "22023"),
    Case("load: into a table that is not a catalog", "SELECT load_keras_model('src', (SELECT model_arch "
         "FROM arch WHERE model_id = 1))", "42703"),
    Case("delete: missing model", "SELECT delete_keras_model('arch', 999)", "22023"),
    Case("delete: missing table", "SELECT delete_keras_model('nope', 1)", "42P01"),
    # generate_model_configs
    Case("gen: negative learning rate", f"{GEN}('arch', 'g1', ARRAY[1], $${{'loss': ['mse'], "
         "'optimizer_params_list': [{'optimizer': ['Adam'], 'lr': [-0.01]}], 'metrics': []}$$, "
         f"{FIT_GRID})", "22023"),
    Case("gen: negative epsilon", f"{GEN}('arch', 'g1', ARRAY[1], $${{'loss': ['mse'], "
         "'optimizer_params_list': [{'optimizer': ['Adam'], 'epsilon': [-1e-7]}], 'metrics': []}$$, "
         f"{FIT_GRID})", "22023"),
    Case("gen: negative learning rate sampled", f"{GEN}('arch', 'g1', ARRAY[1], $${{'loss': ['mse'], "
         "'optimizer_params_list': [{'optimizer': ['Adam'], 'lr': [-0.1, 0.1, 'linear']}], "
         f"'metrics': []}}$$, {FIT_GRID}, 'random', 5, 1)", "22023"),
    Case("gen: momentum above 1", f"{GEN}('arch', 'g1', ARRAY[1], $${{'loss': ['mse'], "
         "'optimizer_params_list': [{'optimizer': ['SGD'], 'momentum': [1.5]}], 'metrics': []}$$, "
         f"{FIT_GRID})", "22023"),
    Case("gen: malformed grid", f"{GEN}('arch', 'g1', ARRAY[1], '{{loss: [', {FIT_GRID})", "42601"),
    Case("gen: code in the grid", f"{GEN}('arch', 'g1', ARRAY[1], "
         "$${'loss': [__import__('os').system('id')]}$$, " + f"{FIT_GRID})", "42601"),
    Case("gen: unknown optimizer", f"{GEN}('arch', 'g1', ARRAY[1], $${{'loss': ['mse'], "
         "'optimizer_params_list': [{'optimizer': ['Turbo']}], 'metrics': []}$$, "
         f"{FIT_GRID})", "22023"),
    Case("gen: unknown loss", f"{GEN}('arch', 'g1', ARRAY[1], $${{'loss': ['nope'], "
         "'optimizer_params_list': [{'optimizer': ['Adam']}], 'metrics': []}$$, "
         f"{FIT_GRID})", "22023"),
    Case("gen: unknown metric", f"{GEN}('arch', 'g1', ARRAY[1], $${{'loss': ['mse'], "
         "'optimizer_params_list': [{'optimizer': ['Adam']}], 'metrics': ['nope']}$$, "
         f"{FIT_GRID})", "22023"),
    Case("gen: batch_size 0", f"{GEN}('arch', 'g1', ARRAY[1], {GRID}, "
         "$${'batch_size': [0], 'epochs': [1]}$$)", "22023"),
    Case("gen: negative epochs", f"{GEN}('arch', 'g1', ARRAY[1], {GRID}, "
         "$${'batch_size': [8], 'epochs': [-1]}$$)", "22023"),
    Case("gen: unknown fit key", f"{GEN}('arch', 'g1', ARRAY[1], {GRID}, "
         "$${'batch_size': [8], 'callback': ['x']}$$)", "22023"),
    Case("gen: a callback that is no call", f"{GEN}('arch', 'g1', ARRAY[1], {GRID}, "
         "$${'batch_size': [8], 'callbacks': ['x']}$$)", "42601"),
    Case("gen: unknown search type", f"{GEN}('arch', 'g1', ARRAY[1], {GRID}, {FIT_GRID}, 'magic')", "22023"),
    Case("gen: random without num_configs", f"{GEN}('arch', 'g1', ARRAY[1], {GRID}, {FIT_GRID}, 'random')", "22023"),
    Case("gen: negative num_configs", f"{GEN}('arch', 'g1', ARRAY[1], {GRID}, {FIT_GRID}, 'random', -3)", "22023"),
    Case("gen: model id not in catalog", f"{GEN}('arch', 'g1', ARRAY[42], {GRID}, {FIT_GRID})", "22023"),
    Case("gen: empty model id list", f"{GEN}('arch', 'g1', ARRAY[]::int[], {GRID}, {FIT_GRID})", "22023"),
    Case("gen: distribution low above high", f"{GEN}('arch', 'g1', ARRAY[1], $${{'loss': ['mse'], "
         "'optimizer_params_list': [{'optimizer': ['Adam'], 'lr': [0.1, 0.01, 'log']}], "
         f"'metrics': []}}$$, {FIT_GRID}, 'random', 2)", "22023"),
    Case("gen: log distribution from 0", f"{GEN}('arch', 'g1', ARRAY[1], $${{'loss': ['mse'], "
         "'optimizer_params_list': [{'optimizer': ['Adam'], 'lr': [0, 0.1, 'log']}], "
         f"'metrics': []}}$$, {FIT_GRID}, 'random', 2)", "22023"),
    Case("gen: missing object_table", f"{GEN}('arch', 'g1', ARRAY[1], {GRID}, {FIT_GRID}, "
         "object_table => 'custom_functions')", "42P01"),
    Case("gen: object_table that holds no functions", f"{GEN}('arch', 'g1', ARRAY[1], {GRID}, "
         f"{FIT_GRID}, object_table => 'src')", "42703"),
    Case("gen: append models of another catalog", f"{GEN}('arch2', 'mst', ARRAY[1], {GRID}, "
         f"{FIT_GRID})", "22023"),
    Case("gen: injection in output name", f"{GEN}('arch', 'g1; DROP TABLE src', ARRAY[1], {GRID}, "
         f"{FIT_GRID})", "22023"),
    # load_model_selection_table
    Case("lms: injection in compile params", f"{LMS}('arch', 'l1', ARRAY[1], ARRAY[$$loss='x'); "
         "DROP TABLE src; --$$], ARRAY['batch_size=8'])", "42601"),
    Case("lms: code in compile params", f"{LMS}('arch', 'l1', ARRAY[1], ARRAY[$$loss=open('/etc/passwd')"
         "$$], ARRAY['batch_size=8'])", "42601"),
    Case("lms: NULL compile params", f"{LMS}('arch', 'l1', ARRAY[1], ARRAY[NULL]::varchar[], "
         "ARRAY['batch_size=8'])", "22023"),
    Case("lms: NaN learning rate", f"{LMS}('arch', 'l1', ARRAY[1], ARRAY[$$loss='mse', "
         "optimizer='Adam(lr=float(\"nan\"))'$$], ARRAY['batch_size=8'])", "42601"),
    # madlib_keras_fit_multiple_model / madlib_keras_fit / resume
    Case("fit: zero iterations", f"{FIT}('packed', 'f1', 'mst', 0)", "22023"),
    Case("fit: negative iterations", f"{FIT}('packed', 'f1', 'mst', -2)", "22023"),
    Case("fit: NULL iterations", f"{FIT}('packed', 'f1', 'mst', NULL)", "22023"),
    Case("fit: source not packed", f"{FIT}('src', 'f1', 'mst', 1)", "42P01"),
    Case("fit: missing configurations", f"{FIT}('packed', 'f1', 'nope', 1)", "42P01"),
    Case("fit: not a configuration table", f"{FIT}('packed', 'f1', 'src', 1)", "42P01"),
    Case("fit: missing validation table", f"{FIT}('packed', 'f1', 'mst', 1, FALSE, 'nope')", "42P01"),
    Case("fit: GPUs", f"{FIT}('packed', 'f1', 'mst', 1, TRUE)", "0A000"),
    Case("fit: metrics frequency 0", f"{FIT}('packed', 'f1', 'mst', 1, FALSE, 'valid', 0)", "22023"),
    Case("fit: model input of another shape", f"{FIT}('packed', 'f1', 'mst5', 1)", "22023"),
    Case("fit: output exists", f"{FIT}('packed', 'model', 'mst', 1)", "42P07"),
    Case("fit: warm start of nothing", f"{FIT}('packed', 'f1', 'mst', 1, warm_start => TRUE)", "42P01"),
    Case("fit: worker_conninfo sets the role", f"{FIT}('packed', 'f1', 'mst', 1)", "42501",
         "SET madlib_mop.worker_conninfo = 'user=someone_else'"),
    Case("fit: worker_conninfo not a conninfo", f"{FIT}('packed', 'f1', 'mst', 1)", "22023",
         "SET madlib_mop.worker_conninfo = 'this is not = = a conninfo'"),
    Case("fit: worker_conninfo timeout not a number", f"{FIT}('packed', 'f1', 'mst', 1)", "22023",
         "SET madlib_mop.worker_conninfo = 'connect_timeout=soon'"),
    Case("fit: worker memory not a number", f"{FIT}('packed', 'f1', 'mst', 1)", "22023",
         "SET madlib_mop.worker_memory_mb = 'lots'"),
    Case("fit single: empty compile params", "SELECT madlib_keras_fit('packed', 'f1', 'arch', 1, '', "
         "'batch_size=8', 1)", "22023"),
    Case("fit single: missing model id", f"SELECT madlib_keras_fit('packed', 'f1', 'arch', 77, "
         f"$${COMPILE}$$, 'batch_size=8', 1)", "22023"),
    Case("resume: no such job", "CALL resume(987654321)", "22023"),
    # evaluate / predict
    Case("eval: missing model table", f"{EVAL}('nope', 'valid', 'e1')", "42P01"),
    Case("eval: test table not packed", f"{EVAL}('model', 'src', 'e1')", "42P01"),
    Case("eval: mst_key not in the model table", f"{EVAL}('model2', 'valid', 'e1', FALSE, 99)", "22023"),
    Case("eval: output exists", f"{EVAL}('model', 'valid', 'src')", "42P07"),
    Case("pred: unknown pred_type", f"{PRED}('model', 'src', 'id', 'x', 'p1', 'guess')", "22023"),
    Case("pred: negative pred_type", f"{PRED}('model', 'src', 'id', 'x', 'p1', '-1')", "22023"),
    Case("pred: missing id column", f"{PRED}('model', 'src', 'nope', 'x', 'p1')", "42703"),
    Case("pred: missing feature column", f"{PRED}('model', 'src', 'id', 'nope', 'p1')", "42703"),
    Case("pred: injection in feature column", f"{PRED}('model', 'src', 'id', 'x FROM src; DROP TABLE src; "
         "--', 'p1')", "22023"),
    Case("pred: output exists", f"{PRED}('model', 'src', 'id', 'x', 'src')", "42P07"),
    Case("pred: features of another shape", f"{PRED}('model', 'src5', 'id', 'x', 'p1')", "22023"),
    Case("pred byom: missing model id", "SELECT madlib_keras_predict_byom('arch', 99, 'src', 'id', 'x', 'p1')", "22023"),
    Case("pred byom: class values of another count", "SELECT madlib_keras_predict_byom('arch', 3, 'src', "
         "'id', 'x', 'p1', class_values => ARRAY['a', 'b'])", "42804"),
    Case("pred byom: model without weights", "SELECT madlib_keras_predict_byom('arch', 1, 'src', "
         "'id', 'x', 'p1')", "22004"),
    Case("pred: no mst_key for several models", f"{PRED}('model2', 'src', 'id', 'x', 'p1')", "22023"),
    Case("eval: mst_key for a single model", f"{EVAL}('model', 'valid', 'e1', FALSE, 1)", "22023"),
    Case("eval multiple: missing model table", "SELECT madlib_keras_evaluate_multiple_model('nope', "
         "'valid', 'e1')", "42P01"),
    Case("pred byom: missing architecture table", "SELECT madlib_keras_predict_byom('nope', 1, 'src', "
         "'id', 'x', 'p1')", "42P01"),
    Case("fit procedure: zero iterations", "CALL fit_multiple('packed', 'f1', 'mst', 0)", "22023"),
    Case("resume_job: no such job", "SELECT resume_job(987654321)", "22023"),
    Case("fit single: missing object_table", f"SELECT madlib_keras_fit('packed', 'f1', 'arch', 1, "
         f"$${COMPILE}$$, 'batch_size=8', 1, object_table => 'custom_functions')", "42P01"),
    # packing and unpacking (C)
    Case("unpack: bytes that are no float32 values", "SELECT float4_unpack('\\x010203'::bytea)", "22P03"),
    Case("unpack: bytes that are no int32 values", "SELECT int4_unpack('\\x0102030405'::bytea)", "22P03"),
    Case("pack: NULL features", "SELECT float4_pack(x) FROM src_null", "22004"),
    Case("pack: arrays of other shapes", "SELECT float4_pack(x) FROM src_ragged", "22000"),
    Case("pack: NaN", "SELECT float4_pack(x) FROM src_nan", "22000"),
    # usage texts and the runtime check
    Case("usage: unknown function", "SELECT usage('no_such_function')", "42704"),
    Case("runtime_check: missing table", "SELECT runtime_check('nope', 'y', 'x')", "42P01"),
    Case("runtime_check: zero epochs", "SELECT runtime_check('src', 'y', 'x', 0)", "22023"),
]


@pytest.fixture(scope="module")
def bad(conn):
    conn.execute("SET search_path = public, madlib_mop")
    rows = "FROM generate_series(1, 60) i"
    features = "ARRAY[i % 7, i % 5, i % 3, i % 11]::real[]"
    conn.execute(f"CREATE TABLE src AS SELECT i AS id, {features} AS x, (i % 3)::text AS y {rows}")
    conn.execute(f"CREATE TABLE src5 AS SELECT i AS id, ARRAY[i, i, i, i, i]::real[] AS x, "
                 f"(i % 3)::text AS y {rows}")
    conn.execute(f"CREATE TABLE src_newclass AS SELECT i AS id, {features} AS x, (i % 4)::text AS y {rows}")
    conn.execute(f"CREATE TABLE src_nan AS SELECT i AS id, CASE WHEN i = 7 THEN "
                 f"ARRAY['NaN', 1, 2, 3]::real[] ELSE {features} END AS x, (i % 3)::text AS y {rows}")
    conn.execute(f"CREATE TABLE src_null AS SELECT i AS id, CASE WHEN i = 7 THEN NULL ELSE "
                 f"{features} END AS x, (i % 3)::text AS y {rows}")
    conn.execute(f"CREATE TABLE src_ragged AS SELECT i AS id, CASE WHEN i = 7 THEN "
                 f"ARRAY[1, 2]::real[] ELSE {features} END AS x, (i % 3)::text AS y {rows}")
    conn.execute(f"CREATE TABLE src_text AS SELECT i AS id, i::text AS x, (i % 3)::text AS y {rows}")
    conn.execute("CREATE TABLE src_empty (id int, x real[], y text)")
    conn.execute("SELECT training_preprocessor_dl('src', 'packed', 'y', 'x', 16, distribution_rules => '2')")
    conn.execute("SELECT validation_preprocessor_dl('src', 'valid', 'y', 'x', 'packed')")
    conn.execute("SELECT load_keras_model('arch', %s::json)", (_mlp(4),))
    conn.execute("SELECT load_keras_model('arch', %s::json)", (_mlp(5),))
    conn.execute(f"{LMS}('arch', 'mst', ARRAY[1], ARRAY[$${COMPILE}$$], ARRAY['batch_size=16'])")
    conn.execute(f"{LMS}('arch', 'mst5', ARRAY[2], ARRAY[$${COMPILE}$$], ARRAY['batch_size=16'])")
    conn.execute("SELECT load_keras_model('arch2', %s::json)", (_mlp(4),))
    model = keras.models.model_from_json(_mlp(4))
    weights = b"".join(w.astype("float32").tobytes() for w in model.get_weights())
    conn.execute("SELECT load_keras_model('arch', %s::json, %s)", (_mlp(4), weights))  # id 3
    conn.execute(f"SELECT madlib_keras_fit('packed', 'model', 'arch', 1, $${COMPILE}$$, "
                 "'batch_size=16', 1)")
    conn.execute(f"{LMS}('arch', 'mst2', ARRAY[1], ARRAY[$${COMPILE}$$, $${COMPILE.replace('0.01', '0.1')}$$], "
                 "ARRAY['batch_size=16'])")
    conn.execute(f"{FIT}('packed', 'model2', 'mst2', 1)")
    return conn


def _state(conn) -> tuple:
    """Everything a failed call could leave: relations anywhere but the system's, catalog
    rows, jobs."""
    relations = conn.execute(
        "SELECT n.nspname, c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
        "WHERE n.nspname NOT IN ('pg_catalog', 'information_schema') "
        "AND n.nspname NOT LIKE 'pg_toast%' ORDER BY 1, 2").fetchall()
    counts = conn.execute("SELECT (SELECT count(*) FROM arch), (SELECT count(*) FROM mst), "
                          "(SELECT count(*) FROM src), (SELECT count(*) FROM madlib_mop.jobs)").fetchone()
    return relations, counts


def test_there_are_enough_cases():
    assert len(CASES) >= 60
    assert len({case.name for case in CASES}) == len(CASES)


@pytest.mark.parametrize("case", CASES, ids=[case.name for case in CASES])
def test_bad_input_is_refused_cleanly(bad, case):
    before = _state(bad)
    if case.setting:
        bad.execute(case.setting)
    try:
        with pytest.raises(psycopg.Error) as caught:
            bad.execute(case.statement)
    finally:
        if case.setting:
            bad.execute("RESET " + case.setting.split()[1])
    diag = caught.value.diag
    assert diag.sqlstate != "XX000", diag.message_primary
    assert (diag.sqlstate, bool(diag.message_primary)) == (case.sqlstate, True), diag.message_primary
    assert diag.message_hint, f"no HINT for: {diag.message_primary}"
    assert _state(bad) == before
