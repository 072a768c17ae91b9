"""Models of several inputs and outputs (MADlib 2's multi-io): 'a, b' as independent_varname
and 'y1, y2' as dependent_varname pack each column apart; fit, fit_multiple, evaluate and
predict feed them to a functional model's inputs and outputs in that order; a hop and a
resume give the same bits, and a replay the same weights; mistakes are refused before anything is written.

The data is MADlib's own multi-io set-up: iris with its attributes squared as a second input
and its class twice as a second output (`iris_mult` of MADlib's madlib_keras_iris.setup)."""

from __future__ import annotations

import numpy as np
import pytest

from madlib_mop.tools.replay import replay
from tests.conftest import (ADAM, connect, coordinator_killed_mid_job, iris_mult_table, iris_table,
                            mlp_json, notebook_functions, psql_error, psql_rows, two_in_two_out_json)
from tests.docs import block, page


@pytest.fixture(scope="module")
def data(extension_dsn):
    with connect(extension_dsn) as conn:
        iris_table(conn, "iris_source", madlib_names=True)
        iris_mult_table(conn, "iris_source")
        conn.execute("SELECT load_keras_model('arch', %s::json)", (two_in_two_out_json(),))
        conn.execute("SELECT load_keras_model('arch', %s::json)", (mlp_json(4, 8, 3),))
        conn.execute("SELECT load_keras_model('arch', %s::json)", (two_in_two_out_json(outputs=1),))
        conn.execute("SELECT training_preprocessor_dl('iris_mult', 'iris_mult_packed', "
                     "'class_text, class_text2', 'attributes, attributes2', NULL, 255, "
                     "distribution_rules => '2')")
        conn.execute("SELECT validation_preprocessor_dl('iris_mult', 'iris_mult_val', "
                     "'class_text, class_text2', 'attributes, attributes2', 'iris_mult_packed')")
    return extension_dsn


def _fit(dsn: str, out: str, *, warm_start: bool = False) -> None:
    with connect(dsn) as conn:
        conn.execute("SELECT madlib_keras_fit('iris_mult_packed', %s, 'arch', 1, %s, "
                     "'batch_size=5, epochs=3', 2, NULL, 'iris_mult_val', 1, %s)",
                     (out, ADAM.replace("accuracy", "categorical_accuracy"), warm_start))


def test_each_column_is_packed_apart_with_madlib_summary(data):
    with connect(data) as conn:
        columns = [r[0] for r in conn.execute(
            "SELECT attname FROM pg_attribute WHERE attrelid = 'iris_mult_packed'::regclass "
            "AND attnum > 0 ORDER BY attnum")]
        assert columns == ["__dist_key__", "attributes", "attributes2", "class_text", "class_text2",
                           "attributes_shape", "attributes2_shape", "class_text_shape",
                           "class_text2_shape", "buffer_id"]
        summary = conn.execute("SELECT dependent_varname, independent_varname, dependent_vartype, "
                               "class_text_class_values, class_text2_class_values, num_classes, "
                               "normalizing_const FROM iris_mult_packed_summary").fetchone()
        classes = ["Iris-setosa", "Iris-versicolor", "Iris-virginica"]
        assert summary == (["class_text", "class_text2"], ["attributes", "attributes2"],
                           ["text", "text"], classes, classes, [3, 3], 255.0)
        # Every row once, each input of its own row (the second is the first squared), both
        # divided by the normalizing constant.
        rows = conn.execute("SELECT sum(attributes_shape[1]), bool_and(attributes_shape = "
                            "attributes2_shape), bool_and(class_text_shape = ARRAY[attributes_shape[1], 3]) "
                            "FROM iris_mult_packed").fetchone()
        assert rows == (150, True, True)
        x, x2 = conn.execute("SELECT attributes, attributes2 FROM iris_mult_packed "
                             "ORDER BY buffer_id LIMIT 1").fetchone()
        first, second = np.frombuffer(x, "<f4"), np.frombuffer(x2, "<f4")
        assert np.allclose((first * 255) ** 2, second * 255, rtol=1e-5)


def test_fit_evaluate_predict_and_warm_start(data):
    _fit(data, "model")
    with connect(data) as conn:
        summary = conn.execute(
            "SELECT dependent_varname, class_text_class_values, class_text2_class_values, "
            "training_loss_final, training_metrics_final, validation_metrics_final, metrics_type, "
            "training_loss[1] FROM model_summary").fetchone()
        assert summary[0] == ["class_text", "class_text2"] and summary[1] == summary[2]
        assert summary[3] > 0 and 0 <= summary[4] <= 1 and 0 <= summary[5] <= 1
        assert summary[6] == ["categorical_accuracy"]
        conn.execute("SELECT madlib_keras_evaluate('model', 'iris_mult_val', 'evaluated')")
        loss, metric, metrics = conn.execute("SELECT loss, metric, metrics FROM evaluated").fetchone()
        # The metric is the mean of the outputs' metrics; the loss Keras' total (their sum).
        per_output = [metrics["dense_4_categorical_accuracy"], metrics["dense_5_categorical_accuracy"]]
        assert metric == pytest.approx(sum(per_output) / 2, abs=1e-9)
        assert loss == pytest.approx(metrics["dense_4_loss"] + metrics["dense_5_loss"], rel=1e-5)
        # The validation pass of the last iteration is this evaluation.
        assert summary[5] == pytest.approx(metric, abs=1e-6)

        conn.execute("SELECT madlib_keras_predict('model', 'iris_mult', 'id', 'attributes, attributes2', "
                     "'predicted', 'response')")
        rows = conn.execute("SELECT class_name, count(*), avg((p.class_value = i.class_text)::int) "
                            "FROM predicted p JOIN iris_mult i USING (id) GROUP BY 1 ORDER BY 1").fetchall()
        assert [(name, count) for name, count, _ in rows] == [("class_text", 150), ("class_text2", 150)]
        # The predictions are the evaluated model's: each output's accuracy is evaluate's.
        for (_, _, accuracy), evaluated in zip(rows, per_output):
            assert float(accuracy) == pytest.approx(evaluated, abs=1e-6)
        conn.execute("SELECT madlib_keras_predict('model', 'iris_mult', 'id', 'attributes, attributes2', "
                     "'probabilities', 'prob')")
        sums = conn.execute("SELECT class_name, min(s), max(s), count(*) FROM (SELECT id, class_name, "
                            "sum(prob) AS s FROM probabilities GROUP BY 1, 2) t GROUP BY 1").fetchall()
        assert all(count == 150 and abs(low - 1) < 1e-5 and abs(high - 1) < 1e-5
                   for _, low, high, count in sums)
        before = conn.execute("SELECT model_weights FROM model").fetchone()[0]
    _fit(data, "model", warm_start=True)
    with connect(data) as conn:
        after, first = conn.execute("SELECT model_weights, training_loss[1] FROM model, model_summary").fetchone()
        # It went on from the trained weights: its first iteration beats the first one's.
        assert after != before and first < summary[7]


def test_fit_multiple_resumes_to_the_same_bits(data):
    with connect(data) as conn:
        conn.execute("SELECT load_model_selection_table('arch', 'mst', ARRAY[1], ARRAY[%s, %s], "
                     "ARRAY['batch_size=8, epochs=1'])", (ADAM, ADAM.replace("0.01", "0.05")))

    def fit(out: str) -> None:
        with connect(data) as conn:
            conn.execute("SELECT madlib_keras_fit_multiple_model('iris_mult_packed', %s, 'mst', 3, "
                         "FALSE, 'iris_mult_val')", (out,))

    fit("grid")
    with connect(data) as conn:
        job_id = coordinator_killed_mid_job(conn, "grid_resumed", 5, lambda: fit("grid_resumed"))
        conn.execute("CALL resume(%s)", (job_id,))
        pairs = conn.execute("SELECT a.model_weights = b.model_weights, a.model_weights IS NOT NULL "
                             "FROM grid a JOIN grid_resumed b USING (mst_key)").fetchall()
        assert pairs == [(True, True), (True, True)]
        info = conn.execute("SELECT count(*) FROM grid_info WHERE status = 'finished' "
                            "AND validation_metrics_final BETWEEN 0 AND 1").fetchone()[0]
        assert info == 2
        conn.execute("SELECT madlib_keras_evaluate_multiple_model('grid', 'iris_mult_val', 'grid_eval')")
        assert conn.execute("SELECT count(*) FROM grid_eval WHERE metric BETWEEN 0 AND 1").fetchone()[0] == 2
        # Replayed from its recorded visits, outside the database: the stored weights.
        stored = np.frombuffer(conn.execute("SELECT model_weights FROM grid WHERE mst_key = 2")
                               .fetchone()[0], dtype=np.float32)
        assert np.max(np.abs(replay(conn, "grid", 2) - stored)) <= 1e-6


def test_predict_byom_of_two_outputs(data):
    _fit(data, "byom_source")
    with connect(data) as conn:
        conn.execute("INSERT INTO arch (model_arch, model_weights, name) SELECT model_arch, "
                     "model_weights, 'trained' FROM byom_source")
        model_id = conn.execute("SELECT max(model_id) FROM arch").fetchone()[0]
        conn.execute("SELECT madlib_keras_predict_byom('arch', %s, 'iris_mult', 'id', "
                     "'attributes, attributes2', 'byom', 'response', NULL, "
                     "ARRAY[ARRAY['a', 'b', 'c'], ARRAY['d', 'e', 'f']], 255, 2)", (model_id,))
        names = conn.execute("SELECT class_name, array_agg(DISTINCT class_value ORDER BY class_value) "
                             "FROM byom GROUP BY 1 ORDER BY 1").fetchall()
        assert [name for name, _ in names] == ["dependent_var_0", "dependent_var_1"]
        assert set(names[0][1]) <= {"a", "b", "c"} and set(names[1][1]) <= {"d", "e", "f"}
        # The same model's predictions, under the names and classes given.
        conn.execute("SELECT madlib_keras_predict('byom_source', 'iris_mult', 'id', "
                     "'attributes, attributes2', 'direct', 'response')")
        mismatched = conn.execute(
            "SELECT count(*) FROM direct d JOIN byom b ON b.id = d.id AND b.class_name = "
            "'dependent_var_' || (CASE d.class_name WHEN 'class_text' THEN 0 ELSE 1 END) "
            "WHERE array_position(ARRAY['Iris-setosa', 'Iris-versicolor', 'Iris-virginica'], d.class_value) "
            "<> array_position(CASE d.class_name WHEN 'class_text' THEN ARRAY['a', 'b', 'c'] "
            "ELSE ARRAY['d', 'e', 'f'] END, b.class_value)").fetchone()[0]
        assert mismatched == 0


def test_mistakes_are_refused_before_anything_is_written(data):
    # A model of two inputs on data of one feature column.
    with connect(data) as conn:
        conn.execute("SELECT training_preprocessor_dl('iris_mult', 'one_input', 'class_text', "
                     "'attributes', distribution_rules => '2')")
    error = psql_error(data, "SELECT madlib_keras_fit('one_input', 'wrong', 'arch', 1, "
                             f"$${ADAM}$$, 'batch_size=5, epochs=1', 1);")
    assert error["sqlstate"] == "22023" and "has 2 inputs" in error["message"]
    assert "number of inputs does not match" in error["message"]
    # A model of one input on data of two feature columns; of one output on two label columns.
    error = psql_error(data, "SELECT madlib_keras_fit('iris_mult_packed', 'wrong', 'arch', 2, "
                             f"$${ADAM}$$, 'batch_size=5, epochs=1', 1);")
    assert error["sqlstate"] == "22023" and "has 1 inputs" in error["message"]
    error = psql_error(data, "SELECT madlib_keras_fit('iris_mult_packed', 'wrong', 'arch', 3, "
                             f"$${ADAM}$$, 'batch_size=5, epochs=1', 1);")
    assert error["sqlstate"] == "42804" and "2 label columns" in error["message"]
    # num_classes: one entry per output.
    error = psql_error(data, "SELECT training_preprocessor_dl('iris_mult', 'wrong_packed', "
                             "'class_text, class_text2', 'attributes, attributes2', NULL, 1, "
                             "ARRAY[3]);")
    assert error["sqlstate"] == "22023" and "one number per label column" in error["hint"]
    # Validation data with other columns than the training data's.
    error = psql_error(data, "SELECT validation_preprocessor_dl('iris_mult', 'wrong_val', "
                             "'class_text', 'attributes, attributes2', 'iris_mult_packed');")
    assert error["sqlstate"] == "22023" and "training data" in error["message"]
    # Predict with one feature column for a model of two inputs.
    error = psql_error(data, "SELECT madlib_keras_predict('model', 'iris_mult', 'id', 'attributes', "
                             "'wrong_predicted');")
    assert error["sqlstate"] == "22023" and "has 2 inputs" in error["message"]
    assert psql_rows(data, "SELECT count(*) FROM pg_class WHERE relname LIKE 'wrong%';") == ["0"]


# A loss and a metric as a Keras user writes them in a notebook (for load_custom_function).
NOTEBOOK = """
import keras

def halved_crossentropy(y_true, y_pred):
    return 0.5 * keras.losses.categorical_crossentropy(y_true, y_pred)

def top_probability(y_true, y_pred):
    return keras.ops.max(y_pred, axis=-1)
"""


def test_madlibs_multi_io_script_runs_as_psql_runs_it(data):
    """MADlib's own multi-io test script (madlib_keras_multi_io), in our words: arguments by
    position as it passes them, evaluate and a predict with a probability threshold (use_gpus
    FALSE), warm start, transfer learning by copying trained weights into an architecture
    table, a custom loss and metric from an object table; and fit_multiple, which MADlib
    refuses for such models and which trains here."""
    loaded = "\n".join(
        f"SELECT load_custom_function('mio_fns', decode('{blob.hex()}', 'hex'), '{name}', 'a notebook''s');"
        for name, blob in notebook_functions(NOTEBOOK, ("halved_crossentropy", "top_probability")).items())
    compile_params = "$$ loss='categorical_crossentropy', optimizer='adam', metrics=['categorical_accuracy'] $$::text"
    out = psql_rows(data, f"""
        SELECT madlib_keras_fit('iris_mult_packed', 'mio_model', 'arch', 1, {compile_params},
                                $$ batch_size=5, epochs=3 $$::text, 2, NULL, 'iris_mult_val');
        SELECT madlib_keras_evaluate('mio_model', 'iris_mult_val', 'mio_eval', FALSE);
        SELECT madlib_keras_predict('mio_model', 'iris_mult', 'id', 'attributes, attributes2',
                                    'mio_pred', 0.5, FALSE);
        CREATE TABLE mio_first AS SELECT training_loss, training_loss_final FROM mio_model_summary;
        SELECT madlib_keras_fit('iris_mult_packed', 'mio_model', 'arch', 1, {compile_params},
                                $$ batch_size=5, epochs=3 $$::text, 2, NULL, 'iris_mult_val', 1, TRUE);
        CREATE TABLE arch_multi AS SELECT * FROM arch WHERE model_id = 1;
        UPDATE arch_multi SET model_weights = (SELECT model_weights FROM mio_model);
        SELECT madlib_keras_fit('iris_mult_packed', 'mio_transfer', 'arch_multi', 1, {compile_params},
                                $$ batch_size=5, epochs=3 $$::text, 2, NULL, 'iris_mult_val');
        {loaded}
        SELECT madlib_keras_fit('iris_mult_packed', 'mio_custom', 'arch', 1,
            $$ loss='halved_crossentropy', optimizer='adam', metrics=['top_probability'] $$::text,
            $$ batch_size=5, epochs=3 $$::text, 2, FALSE, NULL, 1, NULL, NULL, NULL, 'mio_fns');
        SELECT load_model_selection_table('arch', 'mio_mst', ARRAY[1],
            ARRAY[$$loss='categorical_crossentropy', optimizer='Adam(lr=0.01)', metrics=['categorical_accuracy']$$],
            ARRAY[$$batch_size=16, epochs=1$$]);
        SELECT madlib_keras_fit_multiple_model('iris_mult_packed', 'mio_multi', 'mio_mst', 3, FALSE);

        SELECT 'eval', loss > 0, metric BETWEEN 0 AND 1 FROM mio_eval;
        SELECT madlib_keras_predict('mio_model', 'iris_mult', 'id', 'attributes, attributes2',
                                    'mio_pred_low', 0.3, FALSE);
        SELECT 'pred', (SELECT count(*) FROM mio_pred),
            (SELECT count(*) FROM (SELECT id, class_name, class_value, prob FROM mio_pred_low WHERE prob >= 0.5
                                   EXCEPT SELECT id, class_name, class_value, prob FROM mio_pred) missing),
            (SELECT count(*) FROM (SELECT id, class_name, class_value, prob FROM mio_pred
                                   EXCEPT SELECT id, class_name, class_value, prob FROM mio_pred_low) extra);
        SELECT 'pred', class_name, count(DISTINCT id), min(prob) >= 0.3 FROM mio_pred_low GROUP BY 2 ORDER BY 2;
        SELECT 'warm', m.training_loss[1] < f.training_loss[1] FROM mio_model_summary m, mio_first f;
        SELECT 'transfer', t.training_loss[1] < f.training_loss[1] FROM mio_transfer_summary t, mio_first f;
        SELECT 'custom', metrics_type, training_metrics_final BETWEEN 0 AND 1, training_loss_final > 0
        FROM mio_custom_summary;
        SELECT 'multi', array_length(training_loss, 1), array_length(training_metrics, 1)
        FROM mio_multi_info;
        """)
    assert out[0] == "eval|t|t"
    # A row per output, input row and class whose probability reaches the threshold: the
    # 0.5 table holds exactly the rows of the 0.3 one at 0.5 or more (after 3 epochs on
    # inputs divided by 255, MADlib's set-up, the model is unsure and these may be none).
    assert out[1].split("|")[2:] == ["0", "0"], out
    pred = [line.split("|") for line in out[2:4]]
    assert [p[1] for p in pred] == ["class_text", "class_text2"] and all(p[3] == "t" for p in pred)
    assert all(int(p[2]) >= 75 for p in pred), out
    # Warm start and transfer continue from trained weights: their first iteration's loss
    # is below the first run's first iteration.
    assert out[4:6] == ["warm|t", "transfer|t"]
    assert out[6] == "custom|{top_probability}|t|t"
    assert out[7] == "multi|1|1"  # 3 iterations, metrics computed at the last


def test_a_table_madlib_packed_for_several_inputs_and_outputs(data):
    """A table as MADlib 2 packs one for a model of two inputs and outputs (each column
    apart, no segment column, its summary without madlib_mop's columns) trains, evaluates
    and predicts; its buffers are read by segment buffer_id % S."""
    compile_params = ADAM.replace("accuracy", "categorical_accuracy")
    out = psql_rows(data, f"""
        CREATE TABLE by_madlib AS SELECT attributes, attributes2, class_text, class_text2,
            attributes_shape, attributes2_shape, class_text_shape, class_text2_shape, buffer_id
        FROM iris_mult_packed;
        CREATE TABLE by_madlib_summary AS SELECT source_table, 'by_madlib'::text AS output_table,
            dependent_varname, independent_varname, dependent_vartype, class_text_class_values,
            class_text2_class_values, buffer_size, normalizing_const, num_classes
        FROM iris_mult_packed_summary;
        SELECT madlib_keras_fit('by_madlib', 'by_madlib_model', 'arch', 1,
                                $${compile_params}$$, 'batch_size=5', 2);
        SELECT madlib_keras_evaluate('by_madlib_model', 'by_madlib', 'by_madlib_eval');
        SELECT madlib_keras_predict('by_madlib_model', 'iris_mult', 'id', 'attributes, attributes2',
                                    'by_madlib_pred', 'response');
        SELECT class_text_class_values = class_text2_class_values, array_length(training_loss, 1)
        FROM by_madlib_model_summary;
        SELECT metric BETWEEN 0 AND 1, metrics ? 'dense_5_categorical_accuracy' FROM by_madlib_eval;
        SELECT class_name, count(*) FROM by_madlib_pred GROUP BY 1 ORDER BY 1;
        """)
    assert out == ["t|1", "t|t", "class_text|150", "class_text2|150"]
    # Each segment trained on the buffers whose id modulo the job's segments is its own.
    placed = psql_rows(data, """
        CREATE TABLE by_madlib_first_epoch AS
            SELECT v.segment, sum((v.result->>'rows')::int) AS rows FROM by_madlib_model_mop_visits v
            WHERE v.step < (SELECT num_segments FROM by_madlib_model_summary) GROUP BY 1;
        SELECT (SELECT count(*) FROM by_madlib_first_epoch), (SELECT num_segments FROM by_madlib_model_summary),
               (SELECT count(*) FROM (TABLE by_madlib_first_epoch EXCEPT
                   SELECT buffer_id % (SELECT num_segments FROM by_madlib_model_summary), sum(attributes_shape[1])
                   FROM by_madlib GROUP BY 1) d);""")
    segments, recorded, misplaced = placed[0].split("|")
    assert segments == recorded and int(segments) >= 1 and misplaced == "0", placed
    # The same table without a label's shape column is refused, naming what it expects.
    error = psql_error(data, """
        CREATE TABLE by_madlib_bad AS SELECT attributes, attributes2, class_text, class_text2,
            attributes_shape, attributes2_shape, class_text_shape, buffer_id FROM by_madlib;
        CREATE TABLE by_madlib_bad_summary AS SELECT * FROM by_madlib_summary;
        SELECT madlib_keras_fit('by_madlib_bad', 'bad_model', 'arch', 1, $$loss='mse', optimizer='adam'$$,
                                'batch_size=5', 1);""")
    assert error["sqlstate"] == "22000" and "class_text2_shape" in error["detail"]


def test_the_guides_walkthrough_runs_as_a_script(extension_dsn):
    """docs/model-selection.md's statements, as a psql script (autocommit), on iris and a
    model of two inputs and two outputs in `arch`."""
    with connect(extension_dsn) as conn:
        conn.execute("CREATE SCHEMA guide")
        conn.execute("SET search_path = guide, madlib_mop")
        iris_table(conn)
        conn.execute("SELECT load_keras_model('arch', %s::json)", (two_in_two_out_json(),))
    guide = "SET search_path = guide, madlib_mop;\n"
    rows = psql_rows(extension_dsn, guide + block(page("model-selection.md"),
                                                   "### Models of several inputs and outputs"))
    accuracies = dict(row.split("|") for row in rows[-2:])
    assert set(accuracies) == {"class_text", "class_text2"}
    assert all(0 <= float(v) <= 1 for v in accuracies.values())
    with connect(extension_dsn) as conn:
        metric, metrics = conn.execute("SELECT metric, metrics FROM guide.iris_mult_evaluated").fetchone()
        assert metric == pytest.approx((metrics["dense_4_accuracy"] + metrics["dense_5_accuracy"]) / 2)
        # Evaluated on the same rows the accuracies of the predictions were counted on.
        assert metrics["dense_4_accuracy"] == pytest.approx(float(accuracies["class_text"]), abs=1e-6)
