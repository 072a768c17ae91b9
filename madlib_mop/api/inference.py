"""Evaluate and predict (MADlib's madlib_keras_evaluate, madlib_keras_predict,
madlib_keras_predict_byom), run on worker sessions in parallel and in batches.

The calling session checks the arguments and creates the output table through its own
connection; workers (one per partition of the test data: the packed table's segments for
evaluate, ranges of blocks of the plain table for predict) read their part in chunks,
run Keras on whole chunks, and return (evaluate) or insert (predict) their results.  If any
part fails, the output table is dropped: nothing half-written is left.
"""

from __future__ import annotations

import contextlib
import json
from typing import Any

import numpy as np
from psycopg import sql
from psycopg.types.json import Jsonb

from madlib_mop import errors
from madlib_mop.api import deployments
from madlib_mop.db import catalog, packed, scan, segments, settings, worker_session
from madlib_mop.engine.base import Engine
from madlib_mop.engine.cluster import ClusterEngine, engine_for, on_server, slot_session
from madlib_mop.engine.local import LocalEngine
from madlib_mop.engine.pool import run_all
from madlib_mop.preprocess.source import feature_columns
from madlib_mop.grammar import model_config
from madlib_mop.job import fusing, keras_work, outputs, plan, temporary
from madlib_mop.runtime import keras_json
from madlib_mop.runtime.tf_runtime import worker_threads
from madlib_mop.segment.inference import PREDICT_SHAPE_HINT
from madlib_mop.segment.models import ModelRef, architecture_model, summary_of, trained_models
from madlib_mop.errors import MadlibMopError



# ---- running on workers -------------------------------------------------------------------

def _run_parallel(plpy: Any, calls: list, engine: Engine | None = None) -> list[Any]:
    """The calls (worker -> result) on the engine's inference workers, concurrently (on
    this server as many as its pool gives, each taking the next call); a cancel of this
    call cancels them."""
    engine = engine or LocalEngine(plpy)
    workers = engine.inference_workers(len(calls))
    try:
        return run_all(workers, calls, lambda: plpy.execute("SELECT 1"))
    finally:
        engine.keep_inference(workers)


def _facts(plpy: Any, ref: ModelRef) -> dict:
    """The model's input shape, outputs and parameters, asked of a worker session
    (`job.keras_work`: this session does not import TensorFlow)."""
    with keras_work.for_session(plpy) as keras:
        facts = keras.facts([{"mst_key": ref.mst_key or 0, "model_arch": ref.model_arch,
                              "compile_params": ref.compile_params or "loss='mse'", "fit_params": ""}])
    return next(iter(facts.values()))


def _worker_count(plpy: Any) -> int:
    """The setting, else the CPU count; at most a quarter of the server's connections (as
    segments, see segment_count)."""
    return max(1, min(settings.default_segments(plpy), settings.worker_session_limit(plpy)))


# Weights above this size are not sent with each predict call to workers that can read the
# model table themselves.
SHIPPED_WEIGHTS_BYTES = 64 * 1024 * 1024


def _too_big_to_ship(refs: list[ModelRef]) -> bool:
    """Weights too big for one value of a call (`job.outputs`): only workers of this server
    that read them from the model table themselves can use them."""
    return any(len(r.weights) > outputs.WEIGHTS_VALUE_BYTES for r in refs)


def _refuse_shipping(ref: ModelRef) -> None:
    raise MadlibMopError(
        f"the weights of {ref.model_table} ({len(ref.weights) / 2**20:.0f} MB) are too big to "
        "be sent with a call: workers read such weights from the model table, which must be "
        "an ordinary table of this server, and the data must be too",
        sqlstate=errors.FEATURE_NOT_SUPPORTED,
        hint="Keep the model table out of pg_temp and run on data of this server (not on "
             "segment servers).")


# ---- evaluate -----------------------------------------------------------------------------

def evaluate(plpy: Any, model_table: str, test_table: str, output_table: str,
             use_gpus: bool | None = False, mst_key: int | None = None) -> None:
    model_table, mst_key = deployments.resolve(plpy, model_table, mst_key)
    _evaluate(plpy, model_table, test_table, output_table, use_gpus, mst_key, all_models=False)


def evaluate_multiple(plpy: Any, model_table: str, test_table: str, output_table: str,
                      use_gpus: bool | None = False) -> None:
    _evaluate(plpy, model_table, test_table, output_table, use_gpus, None, all_models=True)


def _no_gpus(use_gpus: bool | None) -> None:
    if use_gpus:
        raise MadlibMopError("use_gpus: this server has no GPU support configured",
                             sqlstate=errors.FEATURE_NOT_SUPPORTED, hint="Pass use_gpus => FALSE.")


def _refuse_other_data(plpy, ref: ModelRef, test: dict, x_cols: list, y_cols: list) -> None:
    """A test table packed unlike the model's training data is refused (42804)."""
    facts = _facts(plpy, ref)
    keras_json.require_input_shapes(facts["input_shapes"], test["input_shapes"], x_cols,
                                    test["packed_table"],
                                    hint="Evaluate on data packed like the training data.")
    if len(y_cols) != len(ref.output_classes):
        raise MadlibMopError(
            f"the model has {len(ref.output_classes)} outputs, {test['packed_table']} has "
            f"{len(y_cols)} label columns ({', '.join(y_cols)})", sqlstate=errors.DATATYPE_MISMATCH,
            hint="Evaluate on data packed like the model's training data.")
    trained_for = "classification" if ref.class_values is not None else "regression"
    if test["label_kind"] != trained_for:
        raise MadlibMopError(
            f"the model was trained for {trained_for}, {test['packed_table']} holds "
            f"{test['label_kind']} labels", sqlstate=errors.DATATYPE_MISMATCH,
            hint="Evaluate on data packed like the model's training data.")
    for (_, trained), found in zip(ref.output_classes, test["output_class_values"]):
        if test["label_kind"] == "classification" and trained and \
                [str(v) for v in found] != [str(v) for v in trained]:
            raise MadlibMopError(f"{test['packed_table']} has other class values than the model",
                                 sqlstate=errors.DATATYPE_MISMATCH,
                                 hint="Pack the test data with validation_preprocessor_dl() against "
                                      "the model's training table.")


def _evaluate(plpy, model_table, test_table, output_table, use_gpus, mst_key, all_models):
    _no_gpus(use_gpus)
    refs = trained_models(plpy, model_table, mst_key, all_models=all_models)
    test = packed.read_summary(plpy, test_table, argument="test_table")
    # A temporary model table (a script's pg_temp.model) is read here; its weights go with
    # the calls, as they go to segment servers.
    ship_weights = catalog.is_temporary(plpy, refs[0].model_oid)
    inputs = {"test_table": catalog.resolve_table(plpy, test["packed_oid"])}
    if not ship_weights:
        inputs["model_table"] = catalog.resolve_table(plpy, refs[0].model_oid)
    catalog.committed(plpy, inputs, packed=tuple(inputs))
    out = catalog.new_table(plpy, output_table, argument="output_table")
    out.must_not_exist(plpy)
    x_cols, y_cols = packed.packed_columns(test)
    _refuse_other_data(plpy, refs[0], test, x_cols, y_cols)
    # Custom losses and metrics of the fit: checked here, loaded by the workers.
    custom = plan.custom_functions_of(plpy, refs[0].object_table, [r.compile_params for r in refs], test)
    engine = engine_for(plpy, test["packed_oid"], lambda: LocalEngine(plpy))
    if isinstance(engine, ClusterEngine) or ship_weights:
        if _too_big_to_ship(refs):
            _refuse_shipping(refs[0])
        # A segment server has neither the model table nor the summary: they come with the call.
        partitions = ({str(k): part.name for k, part in engine.partitions.items()}
                      if isinstance(engine, ClusterEngine) else
                      {str(k): catalog.name_parts(plpy, test["packed_oid"])
                       for k in range(test["num_segments"])})
        task = {"models": [{"mst_key": r.mst_key, "model_arch": r.model_arch,
                            "compile_params": r.compile_params} for r in refs],
                "columns": [x_cols, y_cols, test["label_kind"] == "classification",
                            packed.partition_modulus(test)],
                "partitions": partitions, "weights": [r.weights for r in refs],
                "custom_functions": custom}
    else:
        task = {"model_table": refs[0].model_oid, "mst_keys": [r.mst_key for r in refs],
                "test_table": test["packed_oid"], "modulus": packed.partition_modulus(test),
                "custom_functions": custom}
    # Models of one fusion class evaluate as one program (madlib_mop.fuse_models); custom
    # functions are loaded by each worker, and evaluate alone.
    setting = "off" if custom else fusing.fuse_models(plpy)
    task["fused_groups"] = fusing.inference_groups(
        setting, [ref.spec() for ref in refs], [None if r.weights is None else len(r.weights) for r in refs])
    parts = _run_parallel(plpy, [lambda worker, p=p: worker.evaluate_models(task, p)
                                 for p in range(test["num_segments"])], engine)
    fused = sum(len(group) for group in task["fused_groups"])
    if fused:
        plpy.notice(f"{'madlib_keras_evaluate_multiple_model' if all_models else 'madlib_keras_evaluate'}: "
                    f"{fused} of {len(refs)} models evaluated fused, in {len(task['fused_groups'])} "
                    f"group{'s' if len(task['fused_groups']) > 1 else ''} ({fusing.FUSE_SETTING} = {setting})")
    rows = []
    for index, ref in enumerate(refs):
        per_model = [part[index] for part in parts if part[index]["rows"]]
        total = sum(p["rows"] for p in per_model)
        means = {k: sum(p["metrics"][k] * p["rows"] for p in per_model) / total
                 for k in per_model[0]["metrics"]}
        params = model_config.parse_compile_params(ref.compile_params, custom_names=None)
        metrics = list(params.metrics)
        rows.append((ref.mst_key, means.get("loss"), means.get(metrics[0]) if metrics else None,
                     metrics or None, params.loss, json.dumps(means)))
    key = "mst_key integer, " if all_models else ""
    plpy.execute(f"CREATE TABLE {out.quoted} ({key}loss double precision, metric double precision, "
                 "metrics_type text[], loss_type text, metrics jsonb)")
    insert = plpy.prepare(
        f"INSERT INTO {out.quoted} VALUES ({'$1, ' if all_models else ''}"
        + ", ".join(f"${i}" for i in range(2 if all_models else 1, 7 if all_models else 6)) + ")",
        (["integer"] if all_models else []) + ["float8", "float8", "text[]", "text", "jsonb"])
    for row in rows:
        plpy.execute(insert, list(row) if all_models else list(row[1:]))








# ---- predict ------------------------------------------------------------------------------

def _pred_type(value: str | int | float | None) -> Any:
    """'prob' | 'response' | k (int, top k classes) | threshold (float in [0, 1)); MADlib's
    numeric overloads pass numbers, its text one may hold a number too."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        text = repr(value)
    else:
        text = (value or "prob").strip()
    if text.lower() in ("prob", "response"):
        return text.lower()
    try:
        number = float(text)
    except ValueError:
        number = None
    if number is not None and number.is_integer() and "." not in text and number >= 1:
        return int(number)
    if number is not None and 0.0 <= number < 1.0:
        return number
    raise MadlibMopError(
        f"pred_type '{value}' is not valid: Invalid value for pred_type param ({value})",
        sqlstate=errors.INVALID_PARAMETER_VALUE,
        hint="Pass 'response', 'prob', an integer k > 0 (top k classes) or a probability "
             "threshold in [0, 1).")


def _byom_class_values(class_values: list | None, outputs: int) -> list:
    """MADlib's class_values is two-dimensional (a row per output, NULL-padded to the
    longest); a 1-D array is one row.  One list (or None) per output."""
    if class_values is None or not class_values:
        return [None] * outputs
    rows = class_values if isinstance(class_values[0], list) else [class_values]
    if len(rows) != outputs:
        raise MadlibMopError(
            f"class_values has {len(rows)} rows, dependent_count is {outputs}: one row per output "
            "of the model", sqlstate=errors.INVALID_PARAMETER_VALUE,
            hint="Pass ARRAY[ARRAY['a', 'b'], ARRAY['c', 'd']] for two outputs (pad shorter rows "
                 "with NULL), and dependent_count => 2.")
    if outputs == 1:
        return [list(rows[0])]
    trimmed = []
    for row in rows:  # a 2-D array's padding
        row = list(row)
        while row and row[-1] is None:
            row.pop()
        trimmed.append(row)
    return trimmed


def predict(plpy: Any, model_table: str, test_table: str, id_col: str, independent_varname: str,
            output_table: str, pred_type: str | None = "prob", use_gpus: bool | None = False,
            mst_key: int | None = None) -> None:
    _no_gpus(use_gpus)
    # A deployment's name stands for the model deployed under it now (api/deployments).
    model_table, mst_key = deployments.resolve(plpy, model_table, mst_key)
    ref = trained_models(plpy, model_table, mst_key)[0]
    _predict(plpy, ref, test_table, id_col, independent_varname, output_table, pred_type)


def predict_byom(plpy: Any, model_arch_table: str, model_id: int, test_table: str, id_col: str,
                 independent_varname: str, output_table: str, pred_type: str | None = "prob",
                 use_gpus: bool | None = False, class_values: list | None = None,
                 normalizing_const: float | None = None, dependent_count: int | None = 1) -> None:
    _no_gpus(use_gpus)
    count = 1 if dependent_count is None else int(dependent_count)
    if count < 1:
        raise MadlibMopError(f"dependent_count {dependent_count} must be at least 1",
                             sqlstate=errors.INVALID_PARAMETER_VALUE,
                             hint="Pass the number of outputs of the model (1, the default).")
    per_output = _byom_class_values(class_values, count)
    ref = architecture_model(plpy, model_arch_table, model_id)
    if normalizing_const is not None and not normalizing_const > 0:
        raise MadlibMopError("normalizing_const must be positive",
                             sqlstate=errors.INVALID_PARAMETER_VALUE, hint="Pass NULL for 1.0.")
    ref.normalizing_const = float(normalizing_const or 1.0)
    facts = _facts(plpy, ref)
    keras_json.check_weight_bytes(facts["parameters"], ref.weights)
    if len(facts["output_widths"]) != count:
        raise MadlibMopError(
            f"the model has {len(facts['output_widths'])} outputs, dependent_count is {count}",
            sqlstate=errors.INVALID_PARAMETER_VALUE,
            hint=f"Pass dependent_count => {len(facts['output_widths'])}.")
    # MADlib: classes 0..n-1 when none are given; outputs named dependent_var(_<i>)
    per_output = [values if values is not None else [str(i) for i in range(width)]
                  for values, width in zip(per_output, facts["output_widths"])]
    names = ["dependent_var"] if count == 1 else [f"dependent_var_{i}" for i in range(count)]
    ref.class_values, ref.dependent_varname = per_output[0], names[0]
    ref.outputs = list(zip(names, per_output)) if count > 1 else None
    _predict(plpy, ref, test_table, id_col, independent_varname, output_table, pred_type)


def predict_multiple(plpy: Any, model_table: str, test_table: str, id_col: str,
                     independent_varname: str, output_table: str, pred_type: str | None = "prob",
                     use_gpus: bool | None = False, mst_keys: list[int] | None = None) -> None:
    """madlib_keras_predict of each model of a multi-model output (or of `mst_keys`) into
    one table keyed by mst_key: each worker reads its rows once for all the models, and
    the models of one fusion class predict as one program (madlib_mop.fuse_models)."""
    _no_gpus(use_gpus)
    table = catalog.resolve_table(plpy, model_table, argument="model_table")
    if "compile_params" in summary_of(plpy, table):
        raise MadlibMopError(f"model_table {table.name} holds the one model of madlib_keras_fit",
                             sqlstate=errors.INVALID_PARAMETER_VALUE,
                             hint="Predict with madlib_keras_predict.")
    if catalog.is_temporary(plpy, table.oid):
        raise MadlibMopError(
            f"model_table {table.name} is temporary: the workers that predict read the models "
            "from the model table themselves", sqlstate=errors.FEATURE_NOT_SUPPORTED,
            hint="Predict from an ordinary table, or model by model with madlib_keras_predict.")
    wanted = None if mst_keys is None else list(dict.fromkeys(int(k) for k in mst_keys if k is not None))
    if wanted == []:
        raise MadlibMopError("mst_keys names no model", sqlstate=errors.INVALID_PARAMETER_VALUE,
                             hint="Pass NULL for every model, or keys of the table's models.")
    # Sized before any weights are read (those of a model over 1,000 MB are in pieces).
    sized = plpy.execute(plpy.prepare(
        f"SELECT coalesce(sum(octet_length(model_weights)), 0) AS size, "
        f"coalesce(bool_or(model_weights IS NULL), false) AS in_pieces FROM {table.name} "
        "WHERE $1::int[] IS NULL OR mst_key = ANY($1)", ["integer[]"]), [wanted])[0]
    size, in_pieces = sized["size"], sized["in_pieces"]
    if in_pieces or size > MULTIPLE_PREDICT_WEIGHTS_BYTES:
        raise MadlibMopError(
            f"the models hold {'over 1,000 MB' if in_pieces else f'{size / 2**20:.0f} MB'} of weights: "
            f"each worker holds every model at once, at most {MULTIPLE_PREDICT_WEIGHTS_BYTES // 2**20} MB",
            sqlstate=errors.PROGRAM_LIMIT_EXCEEDED,
            hint="Pass fewer mst_keys, or predict model by model with madlib_keras_predict.")
    refs = (trained_models(plpy, table.oid, None, all_models=True) if wanted is None
            else [trained_models(plpy, table.oid, key)[0] for key in wanted])
    _predict(plpy, refs, test_table, id_col, independent_varname, output_table, pred_type)


# Each worker of a multi-model predict holds every model built at once (one pass over the
# rows for all): their weights together at most this.
MULTIPLE_PREDICT_WEIGHTS_BYTES = 1024 * 1024 * 1024


def _predict(plpy, refs: ModelRef | list[ModelRef], test_table, id_col, independent_varname,
             output_table, pred_type):
    # Workers insert the predictions: into an ordinary table first when the output is
    # temporary (`job.temporary`).
    with temporary.output(plpy, output_table, "output_table") as output:
        _predict_into(plpy, refs, test_table, id_col, independent_varname, output, pred_type)


def _predict_into(plpy, refs: ModelRef | list[ModelRef], test_table, id_col, independent_varname,
                  output_table, pred_type):
    """Predict with one model (a ModelRef), or with each of a list, keyed by mst_key."""
    keyed = isinstance(refs, list)
    refs = refs if keyed else [refs]
    ref = refs[0]
    kind = _pred_type(pred_type)
    source = catalog.resolve_table(plpy, test_table, argument="test_table")
    catalog.committed(plpy, {"test_table": source})
    id_column = catalog.column(plpy, source, id_col, argument="id_col")
    features = feature_columns(plpy, source, independent_varname)
    out = catalog.new_table(plpy, output_table, argument="output_table")
    out.must_not_exist(plpy)
    facts: dict[str, dict] = {}
    for r in refs:  # (asked once per architecture)
        if r.model_arch not in facts:
            facts[r.model_arch] = _facts(plpy, r)
    first = plpy.execute("SELECT " + ", ".join(f"{f.expression} AS x{i}" for i, f in enumerate(features))
                         + f" FROM {source.name} LIMIT 1")
    if not first:
        raise MadlibMopError(f"test_table: Input table '{source.name}' is empty", sqlstate=errors.DATA_EXCEPTION,
                             hint="Predict on a table with rows.")
    # The first row here, for a clear error before any worker starts; the workers check
    # every row (`segment.inference.worker_predict`).
    for found in facts.values():
        keras_json.require_input_shapes(
            found["input_shapes"], [np.asarray(first[0][f"x{i}"], dtype=object).shape for i in range(len(features))],
            [f.packed_column for f in features], source.name, hint=PREDICT_SHAPE_HINT)
    classification = ref.class_values is not None
    outputs = _outputs(ref, facts[ref.model_arch], classification)
    for other in refs[1:]:  # (one summary: each model checked against it)
        _outputs(other, facts[other.model_arch], classification)
    columns = _prediction_columns(plpy.quote_ident(id_col), id_column.base_type, classification,
                                  kind, len(outputs), keyed)
    lying = segments.source_parts(plpy, source)
    if keyed and lying is not None:
        raise MadlibMopError(
            f"test_table {source.name} lies on segment servers: several models predict only "
            "rows of this server", sqlstate=errors.FEATURE_NOT_SUPPORTED,
            hint="Predict model by model with madlib_keras_predict(..., mst_key => k).")
    blocks = scan.table_blocks(plpy, source.oid) if source.kind in ("r", "m") else None
    if lying is None and blocks is None:
        raise MadlibMopError(f"test_table {source.name} is not a table",
                             sqlstate=errors.FEATURE_NOT_SUPPORTED,
                             hint="Predict from a table or materialized view (CREATE TABLE ... AS "
                                  "SELECT from the view).")
    # Names, never SQL text: the worker derives its statements as this call did.  The task
    # whole (every check of it passed) before the output table exists.
    task = {"model_arch": ref.model_arch, "outputs": outputs, "normalizing_const": ref.normalizing_const,
            "source": source.oid, "id_col": id_col, "independent_varname": independent_varname,
            "output": [out.schema, out.name], "pred_type": kind}
    weights = _models_for_workers(plpy, refs, keyed, lying is None, task)
    conninfo = worker_session.conninfo(plpy)
    with worker_session.connect(conninfo) as db:
        db.execute(f"CREATE TABLE {out.quoted} {columns}")
    if lying is not None:
        try:
            _predict_where_it_lies(plpy, lying, task, weights, out, columns, conninfo)
        except BaseException:
            with worker_session.connect(conninfo) as db:
                db.execute(f"DROP TABLE IF EXISTS {out.quoted}")
            raise
        return
    workers = max(1, min(_worker_count(plpy), int(blocks) or 1))
    step = -(-int(blocks) // workers) if blocks else 1
    task["threads"] = worker_threads(workers)
    try:
        _run_parallel(plpy, [lambda worker, w=w: worker.predict_blocks(task, w * step, (w + 1) * step,
                                                                        weights)
                             for w in range(workers)])
    except BaseException:
        with worker_session.connect(conninfo) as db:
            db.execute(f"DROP TABLE IF EXISTS {out.quoted}")
        raise
    fused = sum(len(group) for group in task.get("fused_groups", []))
    if fused:
        plpy.notice(f"madlib_keras_predict_multiple_model: {fused} of {len(refs)} models predicted "
                    f"fused, in {len(task['fused_groups'])} group{'s' if len(task['fused_groups']) > 1 else ''} "
                    f"({fusing.FUSE_SETTING} = {fusing.fuse_models(plpy)})")


def _models_for_workers(plpy: Any, refs: list[ModelRef], keyed: bool, here: bool, task: dict
                        ) -> bytes | None:
    """The models into the task: several (`keyed`) by their keys in the model table, which
    the workers read, with their fused groups; one by its key, and the weights each call
    sends (None: the workers read them, `_weights_for_workers`)."""
    if not keyed:
        task["mst_key"] = refs[0].mst_key
        return _weights_for_workers(plpy, refs[0], here, task)
    catalog.committed(plpy, {"model_table": catalog.resolve_table(plpy, refs[0].model_oid)})
    task.update(mst_keys=[r.mst_key for r in refs], model_table=refs[0].model_oid,
                fused_groups=fusing.inference_groups(fusing.fuse_models(plpy), [r.spec() for r in refs],
                                                     [len(r.weights) for r in refs]))
    for r in refs:
        r.weights = None  # not held here while the workers run
    return None


def _prediction_columns(id_col: str, id_type: str, classification: bool, kind: Any, outputs: int,
                        keyed: bool) -> str:
    """The output table's columns (`id_col` quoted): MADlib's, after mst_key when keyed."""
    key = "mst_key integer, " if keyed else ""
    if classification:
        rank = ", rank integer" if kind != "response" else ""
        return f"({key}{id_col} {id_type}, class_name text, class_value text, prob double precision{rank})"
    if outputs > 1:  # regression targets of several outputs: a row per output
        return f"({key}{id_col} {id_type}, class_name text, prediction double precision[])"
    return f"({key}{id_col} {id_type}, prediction double precision[])"


def _outputs(ref: ModelRef, facts: dict, classification: bool) -> list[dict]:
    """Each output's name (the predictions' class_name) and class values (None: targets),
    checked against the model's outputs."""
    widths = facts["output_widths"]
    if len(widths) != len(ref.output_classes):
        raise MadlibMopError(f"the model has {len(widths)} outputs, its summary names "
                             f"{len(ref.output_classes)} labels", sqlstate=errors.DATATYPE_MISMATCH,
                             hint="Predict with the model table its fit wrote.")
    outputs = []
    for (name, values), width in zip(ref.output_classes, widths):
        if classification and not values:  # one-hot labels, no num_classes: positions
            values = [str(i) for i in range(width)]
        if classification and width != len(values):
            raise MadlibMopError(f"the model has {width} outputs but {len(values)} class values"
                                 + (f" ({name})" if len(widths) > 1 else ""),
                                 sqlstate=errors.DATATYPE_MISMATCH,
                                 hint="Pass one class value per output of the model.")
        outputs.append({"class_name": name,
                        "class_values": [None if v is None else str(v) for v in values]
                        if classification else None})
    return outputs


def _weights_for_workers(plpy: Any, ref: ModelRef, here: bool, task: dict) -> bytes | None:
    """The weights each predict call sends, or None where the workers read them from the
    model table themselves (`task` then names it): big ones, when the model table is an
    ordinary table and the data is this server's (`here`).  A big value costs much more
    sent with every call (`runtime.state.PIECE_BYTES`)."""
    if (here and ref.model_oid is not None and len(ref.weights) > SHIPPED_WEIGHTS_BYTES
            and not catalog.is_temporary(plpy, ref.model_oid)):
        catalog.committed(plpy, {"model_table": catalog.resolve_table(plpy, ref.model_oid)})
        task["model_table"] = ref.model_oid
        ref.weights = None  # not held here while the workers run
        return None
    if _too_big_to_ship([ref]):
        _refuse_shipping(ref)
    return bytes(ref.weights)


def _predict_where_it_lies(plpy: Any, lying: dict, task: dict, weights: bytes, out, columns: str,
                           conninfo: str) -> None:
    """Predict a test table whose rows lie on segment servers: each server predicts its rows
    (the same worker_predict, into a temporary table there), and only the predictions come
    here, copied into the output table."""
    schema = catalog.extension_schema(plpy)
    target = sql.Identifier(out.schema, out.name)
    parts = [(server, dict(task, source=table, output=["pg_temp", "madlib_mop_predictions"],
                           threads=worker_threads(len(lying))))
             for server, tables in ((p.server, p.tables) for p in lying.values())
             for table in tables]

    def predict_there(session, server, part: dict) -> None:
        try:
            session.execute(f"CREATE TEMP TABLE IF NOT EXISTS madlib_mop_predictions {columns}")
            session.execute("TRUNCATE pg_temp.madlib_mop_predictions")
            table = sql.Identifier(*part["source"])
            kind, blocks, rows = session.execute(sql.SQL(
                "SELECT c.relkind, pg_catalog.pg_relation_size(c.oid) / "
                "pg_catalog.current_setting('block_size')::int, (SELECT count(*) FROM {}) "
                "FROM pg_catalog.pg_class c WHERE c.oid = {}::regclass").format(
                table, sql.Literal(table.as_string(session)))).fetchone()
            if kind not in ("r", "m"):
                raise MadlibMopError(
                    f"{'.'.join(part['source'])} on {server.label} is not a table",
                    sqlstate=errors.FEATURE_NOT_SUPPORTED,
                    hint="Predict from foreign tables that point at tables of their server.")
            done = session.execute(f"SELECT {schema}._mop_infer_predict(%s, 0, %s, %s)",
                                   (Jsonb(part), blocks + 1, weights), binary=True).fetchone()[0]
            if done["rows"] != rows:
                raise MadlibMopError(f"{'.'.join(part['source'])} on {server.label} changed "
                                     "while it was predicted", sqlstate=errors.DATA_EXCEPTION,
                                     detail=f"Counted {rows} rows, predicted {done['rows']}.",
                                     hint="Predict from a table that is not being written to.")
            with worker_session.connect(conninfo) as here:
                with session.cursor().copy("COPY pg_temp.madlib_mop_predictions TO STDOUT") as rows_there, \
                        here.cursor().copy(sql.SQL("COPY {} FROM STDIN").format(target)) as sink:
                    for data in rows_there:
                        sink.write(data)
        except Exception as error:
            raise on_server(server, error) from None

    with contextlib.ExitStack() as stack:
        sessions = [stack.enter_context(slot_session(plpy, server)) for server, _ in parts]
        run_all(sessions, [lambda session, server=server, part=part: predict_there(session, server, part)
                           for server, part in parts], lambda: plpy.execute("SELECT 1"))






