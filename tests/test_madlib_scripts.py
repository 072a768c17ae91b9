"""MADlib scripts beyond the documentation's examples, run as psql runs a script file:
autocommit, one statement after another, no pauses.  Functional Keras 2 models, a
distribution_rules table, segments without rows, summaries of older MADlib versions,
outputs in pg_temp, warm start across architectures of the same shapes, what the
summaries hold, model selection tables, one-hot validation labels and MADlib's error
phrases."""

from __future__ import annotations

import json

import numpy as np
import psycopg
import pytest

from tests.conftest import connect, iris_table, psql_rows, psql_script

COMPILE = "loss='categorical_crossentropy', optimizer='Adam(lr=0.05)', metrics=['accuracy']"


def _keras2_dense(name: str, units: int, activation: str, inbound: str, trainable: bool = True) -> dict:
    """A Dense layer as tf.keras 2.2.4-tf wrote it in a functional model: initializers with
    a dtype, the layer's name beside its config, inbound nodes as nested lists."""
    return {"class_name": "Dense", "name": name, "inbound_nodes": [[[inbound, 0, 0, {}]]], "config": {
        "kernel_initializer": {"class_name": "VarianceScaling", "config": {
            "dtype": "float32", "distribution": "uniform", "scale": 1.0, "seed": None, "mode": "fan_in"}},
        "name": name, "kernel_constraint": None, "bias_regularizer": None, "bias_constraint": None,
        "dtype": "float32", "activation": activation, "trainable": trainable,
        "kernel_regularizer": None, "bias_initializer": {"class_name": "Zeros", "config": {"dtype": "float32"}},
        "units": units, "use_bias": True, "activity_regularizer": None}}


def keras2_functional(frozen: bool = False) -> str:
    """A single-input functional model 4 -> 8 -> 3 in Keras 2.2.4-tf's JSON; `frozen`: its
    hidden layer has trainable false (the second model of a transfer-learning pair)."""
    return json.dumps({"class_name": "Model", "keras_version": "2.2.4-tf", "backend": "tensorflow",
                       "config": {"name": "model", "layers": [
                           {"class_name": "InputLayer", "name": "input_1", "inbound_nodes": [], "config": {
                               "dtype": "float32", "batch_input_shape": [None, 4], "name": "input_1",
                               "sparse": False}},
                           _keras2_dense("dense", 8, "relu", "input_1", trainable=not frozen),
                           _keras2_dense("dense_1", 3, "softmax", "dense")],
                           "input_layers": [["input_1", 0, 0]], "output_layers": [["dense_1", 0, 0]]}})


@pytest.fixture(scope="module")
def dsn(extension_dsn):
    with connect(extension_dsn) as conn:
        iris_table(conn)
        conn.execute("SELECT load_keras_model('arch', %s::json)", (keras2_functional(),))
        conn.execute("SELECT load_keras_model('arch', %s::json)", (keras2_functional(frozen=True),))
    return extension_dsn



def _refused(dsn: str, statement: str) -> psycopg.errors.Error:
    with connect(dsn) as conn, pytest.raises(psycopg.Error) as raised:
        conn.execute(statement)
    return raised.value


def _weights(conn, table: str, where: str = "") -> np.ndarray:
    blob = conn.execute(f"SELECT model_weights FROM {table} {where}").fetchone()[0]
    return np.frombuffer(blob, dtype=np.float32)


# ---- functional Keras 2 models, and warm start across architectures -----------------------

def test_keras2_functional_models_train_hop_warm_start_and_predict(dsn):
    out = psql_rows(dsn, f"""
        SELECT training_preprocessor_dl('iris', 'f_packed', 'class_text', 'attributes',
                                        distribution_rules => '2');
        SELECT madlib_keras_fit('f_packed', 'f_model', 'arch', 1, $${COMPILE}$$,
                                $$batch_size=10, epochs=1$$, 3);
        SELECT array_length(training_loss, 1), num_segments FROM f_model_summary;
        SELECT madlib_keras_predict('f_model', 'iris', 'id', 'attributes', 'f_pred', 'response');
        SELECT count(*) FROM f_pred;
        -- transfer learning as MADlib's scripts do it: model 2 is model 1 with its hidden
        -- layer frozen, given model 1's trained weights
        UPDATE arch SET model_weights = (SELECT model_weights FROM f_model) WHERE model_id = 2;
        SELECT madlib_keras_fit('f_packed', 'f_transfer', 'arch', 2, $${COMPILE}$$,
                                $$batch_size=10, epochs=1$$, 2);
        """)
    assert out == ["1|2", "150"]
    with connect(dsn) as conn:
        trained, transferred = _weights(conn, "f_model"), _weights(conn, "f_transfer")
        hidden = 4 * 8 + 8  # the frozen layer's kernel and bias come first
        assert np.array_equal(trained[:hidden], transferred[:hidden])
        assert not np.array_equal(trained[hidden:], transferred[hidden:])


def test_warm_start_from_another_architecture_of_the_same_shapes(dsn):
    """MADlib warm-starts the weights whenever the shapes match: here model 1's output is
    continued with architecture 2 (its hidden layer frozen), whose optimizer has other
    variables.  The weights carry over, the optimizer starts afresh, a NOTICE says so, and
    the frozen layer does not move."""
    notices: list[str] = []
    with connect(dsn, notices) as conn:
        conn.execute("SELECT training_preprocessor_dl('iris', 'w_packed', 'class_text', 'attributes')")
        conn.execute(f"SELECT madlib_keras_fit('w_packed', 'w_model', 'arch', 1, $${COMPILE}$$, "
                     "'batch_size=10', 2)")
        before = _weights(conn, "w_model")
        conn.execute(f"SELECT madlib_keras_fit('w_packed', 'w_model', 'arch', 2, $${COMPILE}$$, "
                     "'batch_size=10', 1, warm_start => TRUE)")
        after = _weights(conn, "w_model")
        assert any("warm_start: model(s) 1 continue from their stored weights" in n for n in notices)
        assert np.array_equal(before[:40], after[:40]) and not np.array_equal(before[40:], after[40:])
        assert conn.execute("SELECT state FROM jobs WHERE model_output_table = 'public.w_model' "
                            "ORDER BY job_id DESC LIMIT 1").fetchone()[0] == "finished"
        # The same architecture and compile_params: the whole state goes on (optimizer too);
        # another learning rate: the weights alone, again with a NOTICE.
        notices.clear()
        conn.execute(f"SELECT madlib_keras_fit('w_packed', 'w_model', 'arch', 2, $${COMPILE}$$, "
                     "'batch_size=10', 1, warm_start => TRUE)")
        assert not any("warm_start" in n for n in notices)
        conn.execute("SELECT madlib_keras_fit('w_packed', 'w_model', 'arch', 2, %s, "
                     "'batch_size=10', 1, warm_start => TRUE)", (COMPILE.replace("0.05", "0.01"),))
        assert any("warm_start: model(s) 1 continue" in n for n in notices)
        after = _weights(conn, "w_model")
        other = json.loads(keras2_functional())
        other["config"]["layers"][1]["config"]["units"] = 5
        conn.execute("SELECT load_keras_model('arch', %s::json)", (json.dumps(other),))
    error = _refused(dsn, f"SELECT madlib_keras_fit('w_packed', 'w_model', 'arch', 3, $${COMPILE}$$, "
                          "'batch_size=10', 1, warm_start => TRUE)")
    assert error.diag.sqlstate == "22023" and "do not fit its architecture" in error.diag.message_primary
    with connect(dsn) as conn:  # refused before a job was made: the output is as it was
        assert np.array_equal(_weights(conn, "w_model"), after)


# ---- segments ------------------------------------------------------------------------------

def test_distribution_rules_naming_a_table_of_segments(dsn):
    notices: list[str] = []
    with connect(dsn, notices) as conn:
        conn.execute("CREATE TABLE segments_to_use AS SELECT 2 AS dbid, 'sdw1'::text AS hostname")
        conn.execute("SELECT training_preprocessor_dl('iris', 'd_packed', 'class_text', 'attributes', "
                     "NULL, 1.0, NULL, 'segments_to_use')")
        assert conn.execute("SELECT num_segments, distribution_rules FROM d_packed_summary").fetchone() \
            == (1, "segments_to_use")
    assert any("segments_to_use lists 1 segment(s)" in n for n in notices)
    error = _refused(dsn, "SELECT training_preprocessor_dl('iris', 'd2', 'class_text', 'attributes', "
                          "NULL, 1.0, NULL, 'no_such_rules')")
    assert error.diag.sqlstate == "22023" and "table listing the segments" in error.diag.message_hint


def test_tables_with_fewer_rows_than_segments(dsn):
    """A one-row validation table and a three-row training table on 4 segments: empty
    segments train, validate and predict nothing, and the job finishes."""
    out = psql_rows(dsn, f"""
        CREATE TABLE one_row AS SELECT * FROM iris WHERE id = 7;
        CREATE TABLE three_rows AS SELECT * FROM iris WHERE id IN (7, 60, 120);
        SELECT training_preprocessor_dl('three_rows', 'e_packed', 'class_text', 'attributes',
                                        distribution_rules => '4');
        SELECT validation_preprocessor_dl('one_row', 'e_valid', 'class_text', 'attributes', 'e_packed');
        SELECT rows_per_segment FROM e_packed_summary;
        SELECT madlib_keras_fit('e_packed', 'e_model', 'arch', 1, $${COMPILE}$$, 'batch_size=1', 2,
                                validation_table => 'e_valid');
        SELECT array_length(validation_loss, 1), validation_metrics_final IS NOT NULL FROM e_model_summary;
        SELECT madlib_keras_evaluate('e_model', 'e_valid', 'e_eval');
        SELECT madlib_keras_predict('e_model', 'one_row', 'id', 'attributes', 'e_pred', 'response');
        SELECT id FROM e_pred;
        """)
    assert out == ["{1,1,1,0}", "1|t", "7"]


# ---- inputs as older MADlib versions and scripts write them ---------------------------------

def test_summary_without_num_classes(dsn):
    """A table packed by MADlib 1.x: its summary has a class_values column and no
    num_classes; both are taken from what is there."""
    out = psql_rows(dsn, f"""
        SELECT training_preprocessor_dl('iris', 'n_ours', 'class_text', 'attributes');
        CREATE TABLE n_old AS SELECT attributes, class_text, attributes_shape, class_text_shape,
                                     buffer_id FROM n_ours;
        CREATE TABLE n_old_summary AS SELECT 'iris'::text AS source_table, 'n_old'::text AS output_table,
            'class_text'::text AS dependent_varname, 'attributes'::text AS independent_varname,
            'text'::text AS dependent_vartype, class_text_class_values AS class_values,
            buffer_size, 1.0::real AS normalizing_const FROM n_ours_summary;
        SELECT madlib_keras_fit('n_old', 'n_model', 'arch', 1, $${COMPILE}$$, 'batch_size=10', 1);
        SELECT num_classes, class_text_class_values FROM n_model_summary;
        """)
    assert out == ["{3}|{setosa,versicolor,virginica}"]


def test_outputs_in_pg_temp(dsn):
    """Models, evaluations and predictions written into the session's pg_temp: the work
    is done in ordinary tables that are copied into pg_temp and dropped; a temporary input
    is refused with a HINT."""
    out = psql_rows(dsn, f"""
        SELECT training_preprocessor_dl('iris', 't_packed', 'class_text', 'attributes');
        SELECT madlib_keras_fit('t_packed', 'pg_temp.iris_model', 'arch', 1, $${COMPILE}$$,
                                'batch_size=10', 2);
        SELECT count(*), min(mst_key) FROM pg_temp.iris_model;
        SELECT model, array_length(training_loss, 1) FROM pg_temp.iris_model_summary;
        SELECT madlib_keras_evaluate('pg_temp.iris_model', 't_packed', 'pg_temp.iris_eval');
        SELECT loss > 0 FROM pg_temp.iris_eval;
        SELECT madlib_keras_predict('pg_temp.iris_model', 'iris', 'id', 'attributes', 'pg_temp.iris_pred');
        SELECT count(*) FROM pg_temp.iris_pred;
        SELECT count(*) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
        WHERE c.relname LIKE '%iris_model%' AND n.nspname NOT LIKE 'pg_temp%';
        """)
    assert out == ["1|1", "pg_temp.iris_model|1", "t", "450", "0"]  # the last: none left
    with connect(dsn) as conn:  # another session sees none of them
        assert conn.execute("SELECT to_regclass('pg_temp.iris_model')").fetchone()[0] is None
        assert conn.execute("SELECT count(*) FROM pg_tables WHERE tablename LIKE '_mop_tmp%'").fetchone()[0] == 0
    done = psql_script(dsn, """
        CREATE TEMP TABLE temp_iris AS SELECT * FROM iris;
        SELECT madlib_keras_fit('t_packed', 't_model', 'arch', 1, $$loss='mse', optimizer='SGD'$$, 'batch_size=10', 1);
        SELECT madlib_keras_predict('t_model', 'temp_iris', 'id', 'attributes', 't_pred');
        """)
    assert done.returncode != 0 and "temporary table, which worker sessions cannot read" in done.stderr
    assert "CREATE TABLE ... AS SELECT" in done.stderr
    # A call that fails mid-job (cancelled here) leaves no ordinary table behind either.
    done = psql_script(dsn, f"""
        SET statement_timeout = '8s';
        SELECT madlib_keras_fit('t_packed', 'pg_temp.slow_model', 'arch', 1, $${COMPILE}$$,
                                'batch_size=1', 2000);
        """)
    assert done.returncode != 0 and "statement timeout" in done.stderr
    with connect(dsn) as conn:
        assert conn.execute("SELECT count(*) FROM pg_tables WHERE tablename LIKE '_mop_tmp%'").fetchone()[0] == 0
        assert conn.execute("SELECT state, last_error FROM jobs WHERE model_output_table LIKE "
                            "'%slow_model'").fetchone() == ("failed", "abandoned: its output was temporary")


def test_summaries_hold_what_madlib_writes(dsn):
    out = psql_rows(dsn, """
        SELECT training_preprocessor_dl('iris', 's_packed', 'class_text', 'attributes');
        SELECT madlib_keras_fit('s_packed', 's_model', 'arch', 1,
                                $$ loss='categorical_crossentropy', optimizer='adam' $$,
                                $$ batch_size=5, epochs=1 $$, 1);
        SELECT '[' || compile_params || ']', '[' || fit_params || ']',
               training_metrics IS NULL, validation_metrics IS NULL FROM s_model_summary;
        CREATE TABLE iris_onehot AS SELECT id, attributes,
            ARRAY[class_text = 'setosa', class_text = 'versicolor', class_text = 'virginica']::int[] AS y
        FROM iris;
        SELECT training_preprocessor_dl('iris_onehot', 's_onehot', 'y', 'attributes');
        SELECT y_class_values IS NULL, num_classes IS NULL FROM s_onehot_summary;
        SELECT madlib_keras_fit('s_onehot', 's_onehot_model', 'arch', 1, $$loss='categorical_crossentropy',
                                optimizer='adam'$$, 'batch_size=10', 1);
        CREATE TABLE iris17 AS SELECT * FROM iris WHERE id < 17;
        SELECT training_preprocessor_dl('iris17', 's17', 'class_text', 'attributes', 5,
                                        distribution_rules => '1');
        SELECT string_agg(attributes_shape[1]::text, ',' ORDER BY buffer_id) FROM s17;
        """)
    assert out == ["[ loss='categorical_crossentropy', optimizer='adam' ]|[ batch_size=5, epochs=1 ]|t|t",
                   "t|t", "5,5,5,2"]


def test_model_selection_tables_as_madlib_keeps_them(dsn):
    out = psql_rows(dsn, """
        SELECT load_model_selection_table('arch', 'm_mst', ARRAY[1],
            ARRAY[$$loss='categorical_crossentropy', optimizer='Adam(lr=0.01)', metrics=['accuracy']$$,
                  $$optimizer='Adam(lr=0.01)', metrics=['accuracy'], loss='categorical_crossentropy'$$],
            ARRAY[$$batch_size=10, epochs=1$$, $$epochs=1, batch_size=10$$]);
        SELECT 'configs', count(*) FROM m_mst;
        SELECT generate_model_configs('arch', 'm_grid', ARRAY[1],
            $${'loss': ['categorical_crossentropy'], 'optimizer_params_list': [{'optimizer': ['Adam'], 'lr': [0.01]}],
               'metrics': ['accuracy']}$$,
            $${'batch_size': [10], 'epochs': [1], 'callbacks': ['[TensorBoard(log_dir="/tmp/logs/fit")]']}$$);
        SELECT fit_params FROM m_grid;
        DROP TABLE m_grid_summary;
        SELECT generate_model_configs('arch', 'm_grid', ARRAY[2],
            $${'loss': ['categorical_crossentropy'], 'optimizer_params_list': [{'optimizer': ['SGD'], 'lr': [0.01]}],
               'metrics': ['accuracy']}$$, $${'batch_size': [10], 'epochs': [1]}$$);
        SELECT 'summary', model_arch_table FROM m_grid_summary;
        SELECT training_preprocessor_dl('iris', 'm_packed', 'class_text', 'attributes');
        SELECT madlib_keras_automl('m_packed', 'm_automl', 'arch', 'm_automl_mst', ARRAY[1],
            $${'loss': ['categorical_crossentropy'], 'optimizer_params_list': [{'optimizer': ['Adam'], 'lr': [0.001, 0.1, 'log']}],
               'metrics': ['accuracy']}$$, $${'batch_size': [10], 'epochs': [1]}$$,
            'hyperband', 'R=2, eta=2, skip_last=1');
        SELECT 'gpus', use_gpus FROM m_automl_summary;
        """)
    assert out[0] == "configs|1" and "TensorBoard(log_dir='/tmp/logs/fit')" in out[1]
    assert out[2:] == ["summary|public.arch", "gpus|f"]
    error = _refused(dsn, """SELECT madlib_keras_automl('m_packed', 'm_automl2', 'arch', 'm_automl_mst', ARRAY[1],
        $${'loss': ['categorical_crossentropy'], 'optimizer_params_list': [{'optimizer': ['Adam'], 'lr': [0.001, 0.1, 'log']}],
           'metrics': ['accuracy']}$$, $${'batch_size': [10], 'epochs': [1]}$$, 'hyperband', 'R=2, eta=2')""")
    assert error.diag.sqlstate == "42P07" and "already exists" in error.diag.message_primary


def test_one_hot_validation_labels_for_text_training_labels(dsn):
    notices: list[str] = []
    with connect(dsn, notices) as conn:
        conn.execute("CREATE TABLE v_onehot AS SELECT id, attributes, ARRAY[class_text = 'setosa', "
                     "class_text = 'versicolor', class_text = 'virginica']::int[] AS class_text FROM iris")
        conn.execute("SELECT training_preprocessor_dl('iris', 'v_packed', 'class_text', 'attributes')")
        conn.execute("SELECT training_preprocessor_dl('v_onehot', 'v_valid', 'class_text', 'attributes')")
        conn.execute("SELECT validation_preprocessor_dl('iris', 'v_valid_text', 'class_text', "
                     "'attributes', 'v_packed')")
        for valid in ("v_valid", "v_valid_text"):
            conn.execute("SELECT load_model_selection_table('arch', %s, ARRAY[1], ARRAY[%s], "
                         "ARRAY['batch_size=10'])", (f"{valid}_mst", COMPILE))
            conn.execute("SELECT madlib_keras_fit_multiple_model('v_packed', %s, %s, 2, FALSE, %s)",
                         (f"{valid}_out", f"{valid}_mst", valid))
        one_hot, text = (conn.execute(f"SELECT validation_loss FROM {v}_out_info").fetchone()[0]
                         for v in ("v_valid", "v_valid_text"))
    # The same rows and classes, in other buffers (the one-hot table was shuffled by
    # training_preprocessor_dl): the same losses but for the order of the sums.
    assert one_hot == pytest.approx(text, rel=1e-6)
    assert any("positions of its one-hot labels are the classes of" in n for n in notices)


@pytest.mark.parametrize(("statement", "sqlstate", "phrase"), [
    ("SELECT training_preprocessor_dl(NULL, 'x', 'class_text', 'attributes')", "22023",
     "NULL/empty input table name"),
    ("SELECT training_preprocessor_dl('', 'x', 'class_text', 'attributes')", "22023",
     "NULL/empty input table name"),
    ("SELECT training_preprocessor_dl('iris', '', 'class_text', 'attributes')", "22023",
     "NULL/empty output table name"),
    ("SELECT training_preprocessor_dl('iris', NULL, 'class_text', 'attributes')", "22023",
     "NULL/empty output table name"),
    ("SELECT training_preprocessor_dl('iris', 'x', 'class_text', 'no_column')", "42703",
     "Column 'no_column' does not exist in table 'public.iris'"),
    ("SELECT training_preprocessor_dl('iris', 'x', 'class_text', 'attributes', 0)", "22023",
     "The buffer size has to be a positive integer or NULL"),
    ("SELECT training_preprocessor_dl('iris', 'x', 'class_text', 'attributes', NULL, -1)", "22023",
     "The normalizing constant has to be a positive integer or NULL"),
    ("SELECT training_preprocessor_dl('iris', 'x', 'class_text', 'attributes', NULL, 1, ARRAY[2])",
     "22023", "Invalid num_classes value specified"),
    ("SELECT load_model_selection_table('arch', 'x', ARRAY[9], ARRAY[$$loss='mse', optimizer='SGD'$$], "
     "ARRAY['batch_size=1'])", "22023", "One or more model_id of [9] not found in table public.arch"),
    ("SELECT delete_keras_model('arch', 9)", "22023", "Model id 9 not found"),
    ("SELECT madlib_keras_fit('iris', 'x', 'arch', 1, '', '', 1)", "22023",
     "Compile parameters cannot be empty or NULL"),
])
def test_madlib_error_phrases(dsn, statement, sqlstate, phrase):
    """Our message, with MADlib's words for the same mistake in it."""
    error = _refused(dsn, statement)
    assert error.diag.sqlstate == sqlstate and phrase in error.diag.message_primary
    assert error.diag.message_hint
