"""Apache MADlib's documented deep-learning examples, run as MADlib's docs write them
(tests/madlib_doc_examples.py: the statements, in the docs' order).

Each test checks the columns MADlib's docs show for an output table (ours may have more:
MADlib's set must be a subset, except where the doc shows a whole table whose columns are
fixed, such as evaluate's and predict's) and a few sanity values.  The tests only read what
the examples kept; a statement that failed is kept too, and the tests reading its output fail
with the statement and its error.
"""

from __future__ import annotations

import math

import psycopg
import pytest

from tests import madlib_doc_examples as examples
from tests.madlib_doc_examples import Example, Output


CLASSES = ["Iris-setosa", "Iris-versicolor", "Iris-virginica"]
# The docs show metrics_type {accuracy} where compile_params say metrics=['categorical_accuracy']
# (their outputs come from an older run of the statements); the metric compiled is named either way.
METRICS_TYPES = (["accuracy"], ["categorical_accuracy"])

# ---- MADlib's documented output columns -------------------------------------------------------

# input_data_preprocessor.sql_in, "<output_table>_summary" (and the iris example's output).
PACKED_SUMMARY_COLUMNS = {
    "source_table", "output_table", "dependent_varname", "independent_varname",
    "dependent_vartype", "class_text_class_values", "buffer_size", "normalizing_const",
    "num_classes", "distribution_rules", "__internal_gpu_config__",
}
# input_data_preprocessor.sql_in, "Output Tables" (packed table) for the iris columns.
PACKED_COLUMNS = {"attributes", "class_text", "attributes_shape", "class_text_shape", "buffer_id"}
# keras_model_arch_table.sql_in, model arch table columns.
ARCH_COLUMNS = {"model_id", "model_arch", "model_weights", "name", "description"}
# madlib_keras.sql_in, step 4 "SELECT * FROM iris_model_summary" (every row of the result).
FIT_SUMMARY_COLUMNS = {
    "source_table", "model", "dependent_varname", "independent_varname", "model_arch_table",
    "model_id", "compile_params", "fit_params", "num_iterations", "validation_table",
    "object_table", "metrics_compute_frequency", "name", "description", "model_type",
    "model_size", "start_training_time", "end_training_time", "metrics_elapsed_time",
    "madlib_version", "num_classes", "dependent_vartype", "normalizing_const", "metrics_type",
    "loss_type", "training_metrics_final", "training_loss_final", "training_metrics",
    "training_loss", "validation_metrics_final", "validation_loss_final", "validation_metrics",
    "validation_loss", "metrics_iters", "class_text_class_values",
}
# madlib_keras.sql_in, single-model output table: model_weights BYTEA8, model_arch JSON.
FIT_MODEL_COLUMNS = {"model_weights", "model_arch"}
# madlib_keras.sql_in step 5 result (the whole table).
EVALUATE_COLUMNS = ["loss", "metric", "metrics_type", "loss_type"]
# madlib_keras.sql_in step 6 result (the whole table); 'response' drops rank.
PREDICT_COLUMNS = ["id", "class_name", "class_value", "prob", "rank"]
RESPONSE_COLUMNS = ["id", "class_name", "class_value", "prob"]
# madlib_keras_model_selection.sql_in results.
MST_COLUMNS = ["mst_key", "model_id", "compile_params", "fit_params"]
# madlib_keras_fit_multiple_model.sql_in: model output table, _info header, _summary example.
MULTI_MODEL_COLUMNS = {"mst_key", "model_weights", "model_arch"}
MULTI_INFO_COLUMNS = [
    "mst_key", "model_id", "compile_params", "fit_params", "model_type", "model_size",
    "metrics_elapsed_time", "metrics_type", "loss_type", "training_metrics_final",
    "training_loss_final", "training_metrics", "training_loss", "validation_metrics_final",
    "validation_loss_final", "validation_metrics", "validation_loss",
]
MULTI_SUMMARY_COLUMNS = {
    "source_table", "validation_table", "model", "model_info", "dependent_varname",
    "independent_varname", "model_arch_table", "model_selection_table", "object_table",
    "num_iterations", "metrics_compute_frequency", "warm_start", "name", "description",
    "start_training_time", "end_training_time", "madlib_version", "num_classes",
    "class_text_class_values", "dependent_vartype", "normalizing_const", "metrics_iters",
}



def _unqualified(name: str) -> str:
    return name.rsplit(".", 1)[-1]


# ---- 4.1 madlib_keras.sql_in "Examples" -> "Classification" -----------------------------------

@pytest.fixture(scope="module")
def classification(conn) -> Example:
    return examples.classification(conn)


@pytest.mark.parametrize("call", [
    "madlib_mop.madlib_keras_fit()",
    "madlib_mop.madlib_keras_fit('help')",
    "madlib_mop.madlib_keras_evaluate()",
    "madlib_mop.madlib_keras_predict('help')",
    "madlib_mop.madlib_keras_predict_byom()",
])
def test_help_forms_return_text(conn, call):
    text = conn.execute(f"SELECT {call}").fetchone()[0]
    assert isinstance(text, str) and text.strip()


def test_iris_data_and_split(classification):
    assert classification["iris_data"].rows == [(150,)]
    assert classification["split"].rows == [(120,)]  # the doc's "count 120"
    assert classification["test_count"].rows == [(30,)]


def test_training_preprocessor_summary(classification):
    out = classification["train_packed_summary"]
    assert PACKED_SUMMARY_COLUMNS <= set(out.columns), PACKED_SUMMARY_COLUMNS - set(out.columns)
    row = out.one()
    assert (row["source_table"], row["output_table"]) == ("iris_train", "iris_train_packed")
    assert row["dependent_varname"] == ["class_text"]
    assert row["independent_varname"] == ["attributes"]
    assert row["dependent_vartype"] == ["character varying"]
    assert row["class_text_class_values"] == CLASSES
    assert row["num_classes"] == [3]
    assert row["normalizing_const"] == 1
    assert row["distribution_rules"] == "all_segments"


def test_validation_preprocessor_summary(classification):
    out = classification["test_packed_summary"]
    assert PACKED_SUMMARY_COLUMNS <= set(out.columns), PACKED_SUMMARY_COLUMNS - set(out.columns)
    row = out.one()
    assert (row["source_table"], row["output_table"]) == ("iris_test", "iris_test_packed")
    assert row["class_text_class_values"] == CLASSES
    assert row["num_classes"] == [3]
    assert row["normalizing_const"] == 1


@pytest.mark.parametrize("step, rows", [("train_packed", 120), ("test_packed", 30)])
def test_packed_tables(classification, step, rows):
    out = classification[step]
    assert PACKED_COLUMNS <= set(out.columns), PACKED_COLUMNS - set(out.columns)
    shapes = out.column("attributes_shape")
    assert sum(s[0] for s in shapes) == rows and {tuple(s[1:]) for s in shapes} == {(4,)}
    assert {tuple(s[1:]) for s in out.column("class_text_shape")} == {(3,)}
    assert sorted(out.column("buffer_id")) == list(range(len(out.rows)))


def test_load_keras_model(classification):
    out = classification["arch"]
    assert ARCH_COLUMNS <= set(out.columns), ARCH_COLUMNS - set(out.columns)
    row = out.one()
    assert (row["model_id"], row["name"], row["description"]) == (1, "Sophie", "A simple model")
    assert row["model_weights"] is None


def test_fit_summary(classification):
    out = classification["fit_summary"]
    assert FIT_SUMMARY_COLUMNS <= set(out.columns), FIT_SUMMARY_COLUMNS - set(out.columns)
    row = out.one()
    assert (row["source_table"], row["model"], row["model_id"]) == ("iris_train_packed", "iris_model", 1)
    assert _unqualified(row["model_arch_table"]) == "model_arch_library"  # see test_summaries_name_tables_as_given
    assert row["dependent_varname"] == ["class_text"] and row["independent_varname"] == ["attributes"]
    assert row["compile_params"].strip() == (
        "loss='categorical_crossentropy', optimizer='adam', metrics=['categorical_accuracy']")
    assert row["fit_params"].strip() == "batch_size=5, epochs=3"
    assert (row["num_iterations"], row["metrics_compute_frequency"], row["metrics_iters"]) == (10, 10, [10])
    assert row["validation_table"] is None and row["validation_metrics_final"] is None
    assert row["model_type"] == "madlib_keras" and row["model_size"] > 0
    assert row["start_training_time"] <= row["end_training_time"]
    assert row["num_classes"] == [3] and row["class_text_class_values"] == CLASSES
    assert row["dependent_vartype"] == ["character varying"] and row["normalizing_const"] == 1
    assert row["metrics_type"] in METRICS_TYPES
    assert row["loss_type"] == "categorical_crossentropy"
    assert len(row["training_metrics"]) == len(row["training_loss"]) == len(row["metrics_elapsed_time"]) == 1
    assert row["training_metrics"][-1] == row["training_metrics_final"]
    assert 0 <= row["training_metrics_final"] <= 1 and math.isfinite(row["training_loss_final"])


def test_fit_model_table(classification):
    out = classification["fit_model"]
    assert FIT_MODEL_COLUMNS <= set(out.columns), FIT_MODEL_COLUMNS - set(out.columns)
    row = out.one()
    assert len(row["model_weights"]) == 193 * 4  # the doc's "Total params: 193", float32


def test_evaluate(classification):
    out = classification["evaluate"]
    # MADlib's four columns, in its order; madlib_mop adds `metrics` (every metric by name, README)
    assert out.columns[:4] == EVALUATE_COLUMNS
    row = out.one()
    assert row["metrics_type"] in METRICS_TYPES and row["loss_type"] == "categorical_crossentropy"
    assert 0 <= row["metric"] <= 1 and row["loss"] >= 0


def _by_id(out: Output) -> dict:
    groups: dict = {}
    for row in out.dicts():
        groups.setdefault(row["id"], []).append(row)
    return groups


def test_predict_prob_default(classification):
    out = classification["predict"]
    assert out.columns == PREDICT_COLUMNS
    assert len(out.rows) == 90  # the doc's "(90 rows)": 30 test ids x 3 classes
    for rows in _by_id(out).values():
        assert {r["class_name"] for r in rows} == {"class_text"}
        assert sorted(r["class_value"] for r in rows) == CLASSES
        assert [r["rank"] for r in rows] == [1, 2, 3]  # ORDER BY id, rank
        assert [r["prob"] for r in rows] == sorted((r["prob"] for r in rows), reverse=True)
        assert abs(sum(r["prob"] for r in rows) - 1) < 1e-5


def test_predict_accuracy_queries(classification):
    wrong = classification["predict_misclassified"].one()["count"]
    accuracy = classification["predict_accuracy"].one()["test_accuracy_percent"]
    assert 0 <= wrong <= 30
    assert float(accuracy) == pytest.approx((30 - wrong) * 100 / 30, abs=0.01)


def test_predict_response(classification):
    out = classification["iris_predict_response"]
    assert out.columns == RESPONSE_COLUMNS
    top = {r["id"]: (r["class_value"], r["prob"]) for r in classification["predict"].dicts() if r["rank"] == 1}
    assert {r["id"]: (r["class_value"], r["prob"]) for r in out.dicts()} == top


def test_predict_null_pred_type_is_prob(classification):
    out = classification["iris_predict_null"]
    assert out.columns == PREDICT_COLUMNS and len(out.rows) == 90


@pytest.mark.parametrize("step", ["iris_predict_top2", "iris_predict_top2_short"])
def test_predict_integer_pred_type_keeps_top_k(classification, step):
    out = classification[step]
    assert out.columns == PREDICT_COLUMNS
    groups = _by_id(out)
    assert len(groups) == 30 and all(sorted(r["rank"] for r in rows) == [1, 2] for rows in groups.values())
    expected = {(r["id"], r["class_value"]) for r in classification["predict"].dicts() if r["rank"] <= 2}
    assert {(r["id"], r["class_value"]) for r in out.dicts()} == expected


@pytest.mark.parametrize("step", ["iris_predict_threshold", "iris_predict_threshold_short"])
def test_predict_threshold_pred_type_keeps_prob_above(classification, step):
    out = classification[step]
    assert out.columns == PREDICT_COLUMNS
    assert all(r["prob"] > 0.5 for r in out.dicts())
    expected = {(r["id"], r["class_value"]) for r in classification["predict"].dicts() if r["prob"] > 0.5}
    assert {(r["id"], r["class_value"]) for r in out.dicts()} == expected


def test_predict_byom_response(classification):
    assert classification["byom_weights"].one()["same"] is True
    out = classification["byom"]
    assert out.columns == RESPONSE_COLUMNS
    assert len(out.rows) == 30  # the doc's "(30 rows)"
    assert {r["class_name"] for r in out.dicts()} == {"dependent_var"}
    # the same weights as iris_model, the same rows: the same answers
    expected = {r["id"]: r["class_value"] for r in classification["iris_predict_response"].dicts()}
    assert {r["id"]: r["class_value"] for r in out.dicts()} == expected
    got = {r["id"]: r["prob"] for r in out.dicts()}
    for r in classification["iris_predict_response"].dicts():
        assert got[r["id"]] == pytest.approx(r["prob"], abs=1e-6)
    wrong = classification["byom_misclassified"].one()["count"]
    truth = {r["id"]: r["class_text"] for r in classification["iris_test"].dicts()}
    assert wrong == sum(truth[i] != v for i, v in expected.items())
    accuracy = classification["byom_accuracy"].one()["test_accuracy_percent"]
    assert float(accuracy) == pytest.approx((30 - wrong) * 100 / 30, abs=0.01)


def test_predict_byom_without_class_values(classification):
    out = classification["byom_no_class_values"]
    assert out.columns == PREDICT_COLUMNS  # pred_type defaults to 'prob'
    assert len(out.rows) == 90 and set(out.column("class_value")) == {"0", "1", "2"}


@pytest.mark.parametrize("step", ["byom_prob", "byom_dependent_count"])
def test_predict_byom_prob(classification, step):
    out = classification[step]
    assert out.columns == PREDICT_COLUMNS
    groups = _by_id(out)
    assert len(groups) == 30
    for rows in groups.values():
        assert sorted(r["class_value"] for r in rows) == CLASSES
        assert abs(sum(r["prob"] for r in rows) - 1) < 1e-5
    expected = {(r["id"], r["class_value"], r["rank"]) for r in classification["predict"].dicts()}
    assert {(r["id"], r["class_value"], r["rank"]) for r in out.dicts()} == expected


def test_predict_byom_integer_and_threshold(classification):
    top2, above = classification["byom_top2"], classification["byom_threshold"]
    assert top2.columns == above.columns == PREDICT_COLUMNS
    predict = classification["predict"].dicts()
    assert {(r["id"], r["class_value"]) for r in top2.dicts()} == {
        (r["id"], r["class_value"]) for r in predict if r["rank"] <= 2}
    assert {(r["id"], r["class_value"]) for r in above.dicts()} == {
        (r["id"], r["class_value"]) for r in predict if r["prob"] > 0.5}


# ---- 4.2 madlib_keras.sql_in "Classification with Other Parameters" ---------------------------

@pytest.fixture(scope="module")
def other_parameters(classification) -> Example:
    return examples.other_parameters(classification)


def test_fit_with_validation(other_parameters):
    out = other_parameters["fit_summary"]
    assert FIT_SUMMARY_COLUMNS <= set(out.columns), FIT_SUMMARY_COLUMNS - set(out.columns)
    row = out.one()
    assert (row["validation_table"], row["metrics_compute_frequency"]) == ("iris_test_packed", 3)
    assert (row["name"], row["description"]) == ("Sophie L.", "Simple MLP for iris dataset")
    assert row["metrics_iters"] == [3, 6, 9, 10]  # as the doc shows
    for name in ("metrics_elapsed_time", "training_metrics", "training_loss",
                 "validation_metrics", "validation_loss"):
        assert len(row[name]) == 4, name
    assert row["validation_metrics"][-1] == row["validation_metrics_final"]
    assert row["validation_loss"][-1] == row["validation_loss_final"]
    assert 0 <= row["validation_metrics_final"] <= 1


def test_predict_prob_explicit(other_parameters):
    out = other_parameters["predict"]
    assert out.columns == PREDICT_COLUMNS
    groups = _by_id(out)
    assert len(groups) == 30 and all(sorted(r["rank"] for r in rows) == [1, 2, 3] for rows in groups.values())


def test_warm_start(other_parameters):
    cold = other_parameters["fit_summary"].one()
    row = other_parameters["warm_summary"].one()
    assert (row["num_iterations"], row["metrics_compute_frequency"]) == (5, 1)
    assert row["metrics_iters"] == [1, 2, 3, 4, 5]  # as the doc shows
    assert len(row["training_metrics"]) == len(row["validation_metrics"]) == 5
    # "the loss and accuracy values pick up from where the previous run left off"
    assert row["training_loss"][0] < cold["training_loss"][0]


def test_transfer_learning(other_parameters):
    arch = other_parameters["transfer_arch"]
    assert [(r["model_id"], r["name"]) for r in arch.dicts()] == [(1, "Sophie"), (2, "Maria")]
    row = other_parameters["transfer_summary"].one()
    assert (row["model_id"], row["metrics_iters"]) == (2, [10])
    initial = arch.dicts()[1]["model_weights"]
    trained = other_parameters["transfer_model"].one()["model_weights"]
    assert len(initial) == len(trained) == 193 * 4
    # the frozen first layer (kernel 4x10 then bias 10, float32) did not move
    assert bytes(initial[:200]) in bytes(trained)
    assert initial != trained


# ---- 4.3 keras_model_arch_table.sql_in: load_keras_model examples -----------------------------

@pytest.fixture(scope="module")
def arch_table(other_parameters) -> Example:
    return examples.arch_table(other_parameters)


def test_load_keras_model_counts(arch_table):
    assert arch_table["count1"].rows == [(1,)]
    assert arch_table["count2"].rows == [(2,)]


@pytest.mark.xfail(
    strict=True, raises=psycopg.errors.AmbiguousColumn,
    reason="the doc's statement is not valid PostgreSQL: in `SET model_weights = model_weights "
           "FROM iris_model`, model_weights is in both tables (AmbiguousColumn, on any server)")
def test_load_weights_from_a_previous_run(arch_table):
    assert arch_table["weights"].rows == [(1, "Sophie", "A simple model", False),
                                          (2, "Maria", "Also a simple model", True)]


@pytest.mark.xfail(
    strict=True, raises=psycopg.errors.ExternalRoutineException,
    reason="the doc's PL/Python body does not compile on Python 3: `from tensorflow.keras.layers "
           "import *` inside the function PL/Python wraps it in is a SyntaxError ('import * only "
           "allowed at module level'); its ndarray.tostring() is gone in NumPy 2 too")
def test_load_weights_with_plpython(arch_table):
    assert [(r[0], r[3]) for r in arch_table["plpython"].rows] == [(1, False), (2, True), (3, True)]


def test_load_weights_with_a_client(arch_table):
    arch_table["client"]
    rows = arch_table["client_listing"].rows
    before = arch_table["before_client"].rows
    assert rows[:-1] == before and rows[-1][3] is True  # one more, with weights: the doc's "Grace | Model y | t"


def test_delete_keras_model(arch_table):
    before = [r[0] for r in arch_table["client_listing"].rows]
    assert [r[0] for r in arch_table["delete"].rows] == [i for i in before if i != 1]


# ---- 4.7 madlib_keras_model_selection.sql_in: generate_model_configs, load_model_selection_table

@pytest.fixture(scope="module")
def model_selection(arch_table) -> Example:
    return examples.model_selection(arch_table)


def _check_mst(out: Output, rows: int) -> list[dict]:
    assert out.columns[:4] == MST_COLUMNS, out.columns
    assert out.column("mst_key") == list(range(1, rows + 1))
    configs = out.dicts()
    assert len({(c["model_id"], c["compile_params"], c["fit_params"]) for c in configs}) == rows
    return configs


def test_model_selection_architectures(model_selection):
    assert model_selection["arch"].rows == [(1, "Sophie", "MLP with 1 hidden layer"),
                                            (2, "Maria", "MLP with 2 hidden layers")]


def test_generate_model_configs_grid(model_selection):
    # 2 models x 2 optimizers x 2 learning rates x 2 batch sizes x 1 epochs value
    configs = _check_mst(model_selection["grid"], 2 * 2 * 2 * 2 * 1)
    assert sorted(c["model_id"] for c in configs) == [1] * 8 + [2] * 8
    for c in configs:
        assert "loss='categorical_crossentropy'" in c["compile_params"]
        assert "epochs=10" in c["fit_params"]
    optimizers = {c["compile_params"].split("optimizer=")[1].split("'")[1] for c in configs}
    assert optimizers == {"Adam(lr=0.001)", "Adam(lr=0.01)", "SGD(lr=0.001)", "SGD(lr=0.01)"}
    batch_sizes = {c["fit_params"].split("batch_size=")[1].split(",")[0].strip() for c in configs}
    assert batch_sizes == {"64", "128"}
    summary = model_selection["grid_summary"]
    assert "model_arch_table" in summary.columns
    assert _unqualified(summary.one()["model_arch_table"]) == "model_arch_library"


def test_generate_model_configs_per_optimizer(model_selection):
    # 2 models x (SGD + SGD x 2 lr x 1 momentum + Adam x 2 lr x 1 decay) x 2 batch sizes
    _check_mst(model_selection["per_optimizer"], 2 * (1 + 2 + 2) * 2)


def test_generate_model_configs_random(model_selection):
    configs = _check_mst(model_selection["random"], 20)  # num_configs
    assert {c["model_id"] for c in configs} <= {1, 2}
    assert all(("SGD(" in c["compile_params"]) != ("Adam(" in c["compile_params"]) for c in configs)


def test_generate_model_configs_incremental(model_selection):
    # "note that mst_key continues where it left off": 16 grid rows then 20 random ones
    configs = _check_mst(model_selection["incremental"], 36)
    assert [c["compile_params"] for c in configs[:16]] == model_selection["grid"].column("compile_params")


def test_load_model_selection_table(model_selection):
    configs = _check_mst(model_selection["load_mst"], 12)
    compile_params = [
        "loss='categorical_crossentropy',optimizer='Adam(lr=0.1)',metrics=['categorical_accuracy']",
        "loss='categorical_crossentropy', optimizer='Adam(lr=0.01)',metrics=['categorical_accuracy']",
        "loss='categorical_crossentropy',optimizer='Adam(lr=0.001)',metrics=['categorical_accuracy']",
    ]
    # the doc's order: model_id, then compile params, then fit params; strings kept verbatim
    assert [(c["model_id"], c["compile_params"], c["fit_params"]) for c in configs] == [
        (m, cp, fp) for m in (1, 2) for cp in compile_params
        for fp in ("batch_size=4,epochs=1", "batch_size=8,epochs=1")]
    assert _unqualified(model_selection["load_mst_summary"].one()["model_arch_table"]) == "model_arch_library"


# ---- 4.8 madlib_keras_fit_multiple_model.sql_in ------------------------------------------------

@pytest.fixture(scope="module")
def fit_multiple(model_selection) -> Example:
    return examples.fit_multiple(model_selection)


def test_fit_multiple_preprocessing(fit_multiple):
    for step in ("train_packed_summary", "test_packed_summary"):
        out = fit_multiple[step]
        assert PACKED_SUMMARY_COLUMNS <= set(out.columns), PACKED_SUMMARY_COLUMNS - set(out.columns)
        assert out.one()["class_text_class_values"] == CLASSES


def test_fit_multiple_configs(fit_multiple):
    # 2 models x 3 learning rates x 2 batch sizes x 1 epochs value
    configs = _check_mst(fit_multiple["mst"], 12)
    assert [c["model_id"] for c in configs] == [1] * 6 + [2] * 6
    summary = fit_multiple["mst_summary"]
    assert {"model_arch_table", "object_table"} <= set(summary.columns)
    assert _unqualified(summary.one()["model_arch_table"]) == "model_arch_library"
    assert summary.one()["object_table"] is None


def test_fit_multiple_summary(fit_multiple):
    out = fit_multiple["summary"]
    assert MULTI_SUMMARY_COLUMNS <= set(out.columns), MULTI_SUMMARY_COLUMNS - set(out.columns)
    row = out.one()
    assert (row["source_table"], row["model"]) == ("iris_train_packed", "iris_multi_model")
    assert [_unqualified(row[c]) for c in ("model_info", "model_arch_table", "model_selection_table")] == [
        "iris_multi_model_info", "model_arch_library", "mst_table"]
    assert row["validation_table"] is None and row["warm_start"] is False
    assert (row["num_iterations"], row["metrics_compute_frequency"], row["metrics_iters"]) == (10, 10, [10])
    assert row["class_text_class_values"] == CLASSES
    assert row["dependent_varname"] == ["class_text"] and row["independent_varname"] == ["attributes"]
    assert row["dependent_vartype"] == ["character varying"] and row["normalizing_const"] == 1
    assert row["start_training_time"] <= row["end_training_time"]


def test_fit_multiple_info(fit_multiple):
    out = fit_multiple["info"]
    assert set(MULTI_INFO_COLUMNS) <= set(out.columns), set(MULTI_INFO_COLUMNS) - set(out.columns)
    rows = out.dicts()
    assert sorted(r["mst_key"] for r in rows) == list(range(1, 13))
    configs = {c["mst_key"]: c for c in fit_multiple["mst"].dicts()}
    for r in rows:
        config = configs[r["mst_key"]]
        assert (r["model_id"], r["compile_params"], r["fit_params"]) == (
            config["model_id"], config["compile_params"], config["fit_params"])
        assert r["model_type"] == "madlib_keras" and r["model_size"] > 0
        assert r["metrics_type"] in METRICS_TYPES and r["loss_type"] == "categorical_crossentropy"
        assert len(r["training_metrics"]) == len(r["training_loss"]) == len(r["metrics_elapsed_time"]) == 1
        assert r["validation_metrics"] is None and r["validation_metrics_final"] is None
    finals = [(r["training_metrics_final"], r["training_loss_final"]) for r in rows]
    assert finals == sorted(finals, key=lambda f: (-f[0], f[1]))  # the doc's ORDER BY


def test_fit_multiple_model_table(fit_multiple):
    out = fit_multiple["models"]
    assert MULTI_MODEL_COLUMNS <= set(out.columns), MULTI_MODEL_COLUMNS - set(out.columns)
    sizes = {r["mst_key"]: len(r["model_weights"]) for r in out.dicts()}
    assert sizes == {k: 4 * (193 if k <= 6 else 303) for k in range(1, 13)}  # the doc's param counts


def test_fit_multiple_evaluate(fit_multiple):
    out = fit_multiple["evaluate"]
    assert out.columns[:4] == EVALUATE_COLUMNS
    row = out.one()
    assert row["metrics_type"] in METRICS_TYPES and row["loss_type"] == "categorical_crossentropy"
    assert 0 <= row["metric"] <= 1


def test_fit_multiple_predict_response(fit_multiple):
    out = fit_multiple["predict"]
    assert out.columns == RESPONSE_COLUMNS
    assert len(out.rows) == 30 and set(out.column("class_value")) <= set(CLASSES)
    wrong = fit_multiple["misclassified"].one()["count"]
    accuracy = fit_multiple["accuracy"].one()["test_accuracy_percent"]
    assert float(accuracy) == pytest.approx((30 - wrong) * 100 / 30, abs=0.01)


def test_fit_multiple_with_validation_and_caching(fit_multiple):
    row = fit_multiple["other_summary"].one()
    assert (row["validation_table"], row["metrics_compute_frequency"], row["metrics_iters"]) == (
        "iris_test_packed", 3, [3, 6, 9, 10])
    assert (row["name"], row["description"]) == ("Sophie L.", "Model selection for iris dataset")
    info = fit_multiple["other_info"].dicts()
    assert len(info) == 12
    for r in info:
        for name in ("training_metrics", "training_loss", "validation_metrics", "validation_loss"):
            assert len(r[name]) == 4, name
        assert r["validation_metrics"][-1] == r["validation_metrics_final"]


def test_fit_multiple_predict_prob(fit_multiple):
    out = fit_multiple["other_predict"]
    assert out.columns == PREDICT_COLUMNS and len(out.rows) == 90  # the doc's "(90 rows)"


def test_fit_multiple_warm_start(fit_multiple):
    row = fit_multiple["warm_summary"].one()
    assert (row["num_iterations"], row["warm_start"], row["metrics_iters"]) == (3, True, [1, 2, 3])
    info = fit_multiple["warm_info"].dicts()
    assert len(info) == 12 and all(len(r["validation_loss"]) == 3 for r in info)


# ---- names in the summaries -------------------------------------------------------------------

def test_summaries_name_other_tables_schema_qualified(classification, model_selection, fit_multiple):
    """A documented difference: the tables a summary refers to (model_arch_table, model_info,
    model_selection_table) are written schema-qualified, so that they name the same tables
    whatever the reader's search_path; source_table and model stay as the call gave them."""
    assert classification["fit_summary"].one()["model_arch_table"] == "public.model_arch_library"
    assert model_selection["grid_summary"].one()["model_arch_table"] == "public.model_arch_library"
    row = fit_multiple["summary"].one()
    assert (row["model_info"], row["model_arch_table"], row["model_selection_table"]) == (
        "public.iris_multi_model_info", "public.model_arch_library", "public.mst_table")
    assert (row["source_table"], row["model"]) == ("iris_train_packed", "iris_multi_model")
