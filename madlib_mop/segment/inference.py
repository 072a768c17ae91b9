"""Evaluate and predict in worker sessions: one partition of a packed table
(`_mop_infer_evaluate`; on a segment server, `_mop_segment_evaluate`), or a range of blocks
of a plain table (`_mop_infer_predict`), as `api.inference` hands them out."""

from __future__ import annotations

import gc
import hashlib
import json
import time
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from madlib_mop.db import catalog, packed, scan
from madlib_mop.preprocess.source import feature_columns, source_error
from madlib_mop.runtime import fused_program, fusion, keras_json, packing, training
from madlib_mop.runtime.buffers import PackedColumns, scan_partition
from madlib_mop.runtime.tf_runtime import import_tensorflow
from madlib_mop.segment.models import ModelRef, build, custom_functions, trained_models


PREDICT_BATCH = 4096
PREDICT_SHAPE_HINT = ("Pass the feature column the model was trained on, each row an array of "
                      "the model's input shape.")
# A model this big stays built in an idle worker for the session's next prediction; a
# bigger one is built per call rather than held (idle workers count against the server's
# memory, `engine.server_slots`).
CACHED_WEIGHTS_BYTES = 256 * 1024 * 1024


def worker_evaluate(plpy: Any, task: str, partition: int) -> str:
    """Loss and metrics of each model over one partition of a packed table."""
    task = json.loads(task)
    test = packed.read_summary(plpy, task["test_table"], argument="test_table")
    x_col, y_col = packed.packed_columns(test)
    classification = test["label_kind"] == "classification"
    buffers = scan_partition(plpy, test["packed_table"], PackedColumns(
        x_col, y_col, classification, task["modulus"]), partition)
    refs = [trained_models(plpy, task["model_table"], k, all_models=True)[0] for k in task["mst_keys"]]
    custom = custom_functions(plpy, task.get("custom_functions"))
    for ref in refs:
        ref.custom = custom
    return _evaluate_on(refs, buffers, classification, task.get("fused_groups", []))


def segment_evaluate(plpy: Any, task: str, partition: int, weights: list[bytes]) -> str:
    """worker_evaluate on a segment server: the models, their weights and where the
    partition's rows are come with the call."""
    task = json.loads(task)
    columns = PackedColumns(*task["columns"])
    buffers = scan_partition(plpy, catalog.qualified_name(plpy, task["partitions"][str(partition)]),
                             columns, partition)
    # (custom functions only where the object table is: this server, a temporary model table)
    custom = custom_functions(plpy, task.get("custom_functions"))
    refs = [ModelRef(None, m["mst_key"], m["model_arch"], bytes(w), m["compile_params"], None,
                     1.0, columns.labels[0], custom=custom) for m, w in zip(task["models"], weights)]
    return _evaluate_on(refs, buffers, columns.classification, task.get("fused_groups", []))


def _evaluate_on(refs: list[ModelRef], buffers: list, classification: bool,
                 groups: list[list[int]]) -> str:
    """Each model's rows and metrics; the models of each of `groups` (indices into refs,
    from `job.fusing.inference_groups`) evaluated as one fused program."""
    results: list[dict | None] = [None] * len(refs)
    for group in groups:
        specs = [refs[i].spec() for i in group]
        program = _fused_program(specs)
        program.load_weights([refs[i].weights for i in group])
        for index, outcome in zip(group, fused_program.evaluate_fused(program, specs, buffers,
                                                                      classification)):
            results[index] = {"rows": outcome.rows, "metrics": outcome.means()}
    for index, ref in enumerate(refs):
        if results[index] is not None:
            continue
        model = build(ref, compile_model=True)
        outcome = training.evaluate(training.Program(model), ref.spec(), buffers, classification)
        results[index] = {"rows": outcome.rows, "metrics": outcome.means()}
        refs[index] = model = None  # one model in memory at a time (a model may be GBs)
        gc.collect()  # (a program and its model refer to each other)
    return json.dumps(results)


# Fused evaluation programs by (fusion class, models): traced once per worker session, kept
# for its later calls while they hold at most CACHED_WEIGHTS_BYTES of variables in all (an
# idle worker's memory counts against the server's, as its kept models' does).
_fused: dict[tuple, fused_program.FusedProgram] = {}


def _fused_program(specs: list[training.ModelSpec]) -> fused_program.FusedProgram:
    key = (fusion.fusion_class(specs[0]), len(specs))
    if key not in _fused:
        program = fused_program.FusedProgram(specs[0], len(specs))
        if sum(map(_variable_bytes, _fused.values())) + _variable_bytes(program) > CACHED_WEIGHTS_BYTES:
            _fused.clear()
        _fused[key] = program
    return _fused[key]


def _variable_bytes(program: fused_program.FusedProgram) -> int:
    return sum(int(np.prod(v.shape, dtype=np.int64)) * v.dtype.size for v in program.stacked)


_models: dict[tuple, Any] = {}


def worker_predict(plpy: Any, task: str, first_block: int, last_block: int, weights: bytes) -> str:
    """Predict the rows in blocks [first_block, last_block) and insert them into the output,
    a chunk of rows (one float4_pack) at a time, by one model or (a task of `mst_keys`,
    `api.inference.predict_multiple`) by each of several, each chunk read once for all.
    Predictions go back to SQL as bytes (float4_unpack, int4_unpack): no Python object
    per value."""
    task = json.loads(task)
    predictors = (_models_predictors(plpy, task) if "mst_keys" in task
                  else [_model_predictor(plpy, task, weights)])
    del weights
    schema = catalog.extension_schema(plpy)
    source = catalog.resolve_table(  # an oid here; [schema, table] on a segment server
        plpy, catalog.qualified_name(plpy, task["source"]) if isinstance(task["source"], list)
        else task["source"], argument="test_table")
    features = feature_columns(plpy, source, task["independent_varname"])
    id_type = catalog.column(plpy, source, task["id_col"], argument="id_col").base_type
    output = ".".join(plpy.quote_ident(part) for part in task["output"])
    chunk = plpy.prepare(
        "SELECT count(*) AS n, "
        + ", ".join(f"{schema}.float4_pack({f.expression}) AS x{i}" for i, f in enumerate(features))
        + f", array_agg({plpy.quote_ident(task['id_col'])}) AS ids FROM {source.name} "
        "WHERE ctid >= $1::tid AND ctid < $2::tid", ["text", "text"])
    outputs, keyed = task["outputs"], "mst_keys" in task
    insert = _insert_plan(plpy, schema, output, f"{id_type}[]", task["pred_type"], outputs, keyed)
    rows_done, started = 0, time.perf_counter()
    for bounds in scan.block_chunks(first_block, last_block):
        try:
            row = plpy.execute(chunk, list(bounds))[0]
        except plpy.SPIError as error:  # float4_pack's: NULL features, rows of several shapes
            raise source_error(error, source) from None
        if not row["n"]:
            continue
        n = row["n"]
        # (float4_pack: every row of a chunk has one shape)
        xs = [packing.unpack_float4(row[f"x{i}"], n) for i in range(len(features))]
        xs = [x / np.float32(task["normalizing_const"]) for x in xs]
        for predictor in predictors:
            keras_json.require_input_shapes(predictor.shapes, [x.shape[1:] for x in xs],
                                            [f.packed_column for f in features], source.name,
                                            hint=PREDICT_SHAPE_HINT)
            for mst_key, predictions in zip(predictor.mst_keys, predictor.predict(xs)):
                key = [mst_key] if keyed else []
                for said, values in zip(outputs, predictions):
                    values = values.reshape(n, -1)
                    if said["class_values"] is not None:
                        _insert_classes(plpy, insert, task["pred_type"], row["ids"], values,
                                        said["class_values"], said["class_name"], key)
                    else:
                        plpy.execute(insert, [row["ids"], values.astype("=f4").tobytes(), values.shape[1]]
                                     + ([said["class_name"]] if len(outputs) > 1 else []) + key)
        rows_done += n
    return json.dumps({"rows": rows_done, "seconds": time.perf_counter() - started})


@dataclass
class Predictor:
    """Models that predict a chunk together: their keys (None: a call of one model), their
    input shapes, and `predict(xs)`: for each model, its predictions of each output."""

    mst_keys: list[int | None]
    shapes: list
    predict: Callable[[list[np.ndarray]], list[list[np.ndarray]]]


def _keras_predictor(model: Any, mst_key: int | None) -> Predictor:
    several = len(model.outputs) > 1

    def predict(xs: list[np.ndarray]) -> list[list[np.ndarray]]:
        predictions = model.predict(xs if len(xs) > 1 else xs[0], batch_size=PREDICT_BATCH, verbose=0)
        return [list(predictions) if several else [predictions]]
    return Predictor([mst_key], keras_json.input_shapes(model), predict)


def _model_predictor(plpy: Any, task: dict, weights: bytes | None) -> Predictor:
    """The task's one model, kept built for this worker session's later calls when small."""
    if weights is None:  # too big to come with the call: read from the model table
        weights = trained_models(plpy, task["model_table"], task["mst_key"], all_models=True)[0].weights
    weights = memoryview(weights)
    # (a big one is not hashed either)
    key = ((task["model_arch"], hashlib.sha256(weights).hexdigest())
           if len(weights) <= CACHED_WEIGHTS_BYTES else None)
    model = _models.get(key)
    if model is None:
        _models.clear()
        gc.collect()
        outputs = task["outputs"]
        ref = ModelRef(None, task["mst_key"], task["model_arch"], weights, None,
                       outputs[0]["class_values"], task["normalizing_const"], outputs[0]["class_name"])
        model = build(ref, compile_model=False, threads=task["threads"])
        if key is not None:
            _models[key] = model
    return _keras_predictor(model, task["mst_key"])


def _models_predictors(plpy: Any, task: dict) -> list[Predictor]:
    """The task's models, read from the model table: each of its fused groups one
    program (kept as evaluation's are), every other model built alone; all held at once
    (the caller bounds their weights, `api.inference.MULTIPLE_PREDICT_WEIGHTS_BYTES`)."""
    _models.clear()
    import_tensorflow(threads=task["threads"])  # (before a fused program's first import)
    refs = [trained_models(plpy, task["model_table"], k, all_models=True)[0] for k in task["mst_keys"]]
    predictors, grouped, used = [], set(), set()
    for group in task["fused_groups"]:
        specs = [refs[i].spec() for i in group]
        program = _fused_program(specs)
        if id(program) in used:  # two groups of one class and size: each its own weights
            program = fused_program.FusedProgram(specs[0], len(specs))
        used.add(id(program))
        program.load_weights([refs[i].weights for i in group])
        grouped.update(group)
        # K models' activations at once: a K-th of the rows per batch
        batch = max(1, PREDICT_BATCH // len(group))
        predictors.append(Predictor(
            [refs[i].mst_key for i in group], keras_json.input_shapes(program.template),
            lambda xs, program=program, batch=batch: [[values] for values in program.predict(xs[0], batch)]))
    for index, ref in enumerate(refs):
        if index not in grouped:
            predictors.append(_keras_predictor(build(ref, compile_model=False, threads=task["threads"]),
                                               ref.mst_key))
    return predictors


def _insert_plan(plpy: Any, schema: str, output: str, ids_type: str, kind: Any, outputs: list,
                 keyed: bool = False):
    """The INSERT of a chunk's predictions of one output: classes as rows ([mst_key,] id,
    class_name, class_value, prob[, rank]), or targets as arrays ([mst_key,] id[,
    class_name], prediction); the model's key is the last parameter."""
    if outputs[0]["class_values"] is not None:
        ranked = kind != "response"
        types = [ids_type, "text", "text[]", "bytea", "bytea"] + (["bytea"] if ranked else [])
        key = f"${len(types) + 1}, " if keyed else ""
        return plpy.prepare(
            f"INSERT INTO {output} SELECT {key}u.i, $2, $3[u.k + 1], u.p"
            f"{', u.r' if ranked else ''} FROM unnest($1, {schema}.int4_unpack($4), "
            f"{schema}.float4_unpack($5){f', {schema}.int4_unpack($6)' if ranked else ''}) "
            f"AS u(i, k, p{', r' if ranked else ''})", types + (["integer"] if keyed else []))
    named = len(outputs) > 1
    types = [ids_type, "bytea", "integer"] + (["text"] if named else [])
    key = f"${len(types) + 1}, " if keyed else ""
    return plpy.prepare(
        f"INSERT INTO {output} SELECT {key}$1[g], {'$4, ' if named else ''}v[(g - 1) * $3 + 1 : g * $3] "
        f"FROM generate_subscripts($1, 1) AS g, "
        f"CAST({schema}.float4_unpack($2) AS double precision[]) AS v",
        types + (["integer"] if keyed else []))


def _insert_classes(plpy, insert, kind, ids, probabilities, class_values, class_name, key: list) -> None:
    """One row per (id, class) kept by pred_type, with the class's rank by probability
    (`key`: the model's mst_key, or nothing)."""
    n, k = probabilities.shape
    if kind == "response":
        best = np.argmax(probabilities, axis=1)
        plpy.execute(insert, [ids, class_name, class_values, best.astype("=i4").tobytes(),
                              probabilities[np.arange(n), best].astype("=f4").tobytes()] + key)
        return
    order = np.argsort(-probabilities, axis=1, kind="stable")
    ranks = np.empty_like(order)
    ranks[np.arange(n)[:, None], order] = np.arange(1, k + 1)
    if isinstance(kind, int):
        keep = ranks <= kind
    elif isinstance(kind, float):
        keep = probabilities > kind
    else:
        keep = np.ones((n, k), dtype=bool)
    rows, columns = np.nonzero(keep)
    plpy.execute(insert, [np.asarray(ids, dtype=object)[rows].tolist(), class_name, class_values,
                          columns.astype("=i4").tobytes(),
                          probabilities[rows, columns].astype("=f4").tobytes(),
                          ranks[rows, columns].astype("=i4").tobytes()] + key)
