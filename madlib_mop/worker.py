"""Segment workers: what runs in the server backends the coordinator connects for a job.

A worker backend lives for the whole job and serves one segment.  It imports TensorFlow
once (with cores / segments threads), decodes its segment's buffers once and keeps them
(unless they exceed the memory budget, then it reads them per sub-epoch), and keeps one
compiled Keras model per configuration, into which each call restores the state it is
given.  A call reads the model's state at `step` from the job's state table, trains one
sub-epoch (or evaluates) and writes the state at `step + 1`; that write is committed when
the call returns, so a finished sub-epoch is never lost.

Caches are keyed by job id: a backend serves one job (its connection is the job's own).
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from madlib_mop import catalog, errors, preprocessor, training
from madlib_mop.errors import MadlibMopError
from madlib_mop.tf_runtime import import_tensorflow

MEMORY_SETTING = "madlib_mop.worker_memory_mb"
DEFAULT_MEMORY_MB = 4096


@dataclass
class PackedData:
    table: str  # regclass text of the packed table
    feature_column: str
    label_column: str
    classification: bool


@dataclass
class JobContext:
    job_id: int
    seed: int
    segments: int
    tables: dict  # per-job tables: state, models
    train: PackedData
    validation: PackedData | None
    budget_bytes: int
    specs: dict[int, training.ModelSpec] = field(default_factory=dict)
    models: dict[int, Any] = field(default_factory=dict)
    buffers: dict[tuple[str, int], list[training.Buffer]] = field(default_factory=dict)


_contexts: dict[tuple[int, str], JobContext] = {}  # (job_id, owner)


def _packed(plpy: Any, table: str) -> PackedData:
    summary = preprocessor.read_summary(plpy, table, argument="packed table")
    x, y = preprocessor.packed_columns(summary)
    return PackedData(summary["packed_table"], x, y, summary["label_kind"] == "classification")


def context(plpy: Any, job_id: int) -> JobContext:
    # Looked up at every call, as the current role: a backend's cache never serves a job to
    # a role that does not own it (also not after SET ROLE), nor one that no longer exists.
    rows = plpy.execute(plpy.prepare(
        f"SELECT * FROM {catalog.extension_schema(plpy)}.jobs WHERE job_id = $1 "
        "AND owner = current_user", ["bigint"]), [job_id])
    if rows and (job_id, rows[0]["owner"]) in _contexts:
        return _contexts[(job_id, rows[0]["owner"])]
    if not rows:
        raise MadlibMopError(f"job {job_id} does not exist (or is another role's)",
                             sqlstate=errors.INVALID_PARAMETER_VALUE,
                             hint="SELECT * FROM madlib_mop.job_progress; lists your jobs.")
    job = rows[0]
    tables = json.loads(job["tables"])
    setting = plpy.execute(f"SELECT current_setting('{MEMORY_SETTING}', true) AS v")[0]["v"]
    budget = int(setting) if setting and setting.isdigit() else DEFAULT_MEMORY_MB
    if json.loads(job["arguments"]).get("use_caching") is False:
        budget = 0  # use_caching => FALSE: read the buffers for every sub-epoch
    import_tensorflow(threads=max(1, (os.cpu_count() or 1) // job["num_segments"]))
    ctx = JobContext(job_id, job["seed"], job["num_segments"], tables,
                     _packed(plpy, job["source_table"]),
                     _packed(plpy, job["validation_table"]) if job["validation_table"] else None,
                     budget * 1024 * 1024)
    for row in plpy.execute(f"SELECT * FROM {tables['models']}"):
        ctx.specs[row["mst_key"]] = training.ModelSpec(
            row["mst_key"], row["model_arch"], row["compile_params"], row["fit_params"],
            row["initial_weights"])
    _contexts.clear()  # a backend serves one job at a time: drop another job's caches
    _contexts[(job_id, job["owner"])] = ctx
    return ctx


def _model(ctx: JobContext, mst_key: int):
    if mst_key not in ctx.models:
        ctx.models[mst_key] = training.build_model(ctx.specs[mst_key], ctx.seed)
    return ctx.models[mst_key]


def _decode(row: dict, data: PackedData) -> tuple[np.ndarray, np.ndarray]:
    x = np.frombuffer(row["x"], dtype="<f4").reshape(row["xs"])
    label_dtype = "<i2" if data.classification else "<f4"
    return x, np.frombuffer(row["y"], dtype=label_dtype).reshape(row["ys"])


def _buffers(plpy: Any, ctx: JobContext, data: PackedData, segment: int) -> list[training.Buffer]:
    """The segment's buffers: decoded once and kept, or read each time when they do not fit
    the memory budget (worker_memory_mb)."""
    key = (data.table, segment)
    if key in ctx.buffers:
        return ctx.buffers[key]
    q = plpy.quote_ident
    columns = (f"{q(data.feature_column)} AS x, {q(data.label_column)} AS y, "
               f"{q(data.feature_column + '_shape')} AS xs, {q(data.label_column + '_shape')} AS ys")
    listing = plpy.execute(plpy.prepare(
        f"SELECT buffer_id, {q(data.feature_column + '_shape')}[1] AS rows, "
        f"octet_length({q(data.feature_column)}) AS bytes FROM {data.table} "
        "WHERE __dist_key__ = $1 ORDER BY buffer_id", ["integer"]), [segment])
    if sum(r["bytes"] for r in listing) <= ctx.budget_bytes:
        rows = plpy.execute(plpy.prepare(
            f"SELECT {columns} FROM {data.table} WHERE __dist_key__ = $1 ORDER BY buffer_id",
            ["integer"]), [segment])
        buffers = []
        for row in rows:
            decoded = _decode(row, data)
            buffers.append(training.Buffer(len(decoded[0]), lambda d=decoded: d))
    else:
        plan = plpy.prepare(f"SELECT {columns} FROM {data.table} "
                            "WHERE __dist_key__ = $1 AND buffer_id = $2", ["integer", "integer"])
        buffers = [training.Buffer(r["rows"], lambda b=r["buffer_id"]: _decode(
            plpy.execute(plan, [segment, b])[0], data), in_memory=False) for r in listing]
    ctx.buffers[key] = buffers
    return buffers


def _read_state(plpy: Any, ctx: JobContext, mst_key: int, step: int) -> bytes:
    rows = plpy.execute(plpy.prepare(
        f"SELECT state FROM {ctx.tables['state']} WHERE mst_key = $1 AND step = $2",
        ["integer", "integer"]), [mst_key, step])
    if not rows:
        raise MadlibMopError(f"job {ctx.job_id}: no state of model {mst_key} at step {step}",
                             sqlstate=errors.DATA_EXCEPTION,
                             hint="The job's state table was changed; start the job again.")
    return rows[0]["state"]


def train(plpy: Any, job_id: int, mst_key: int, step: int, segment: int) -> str:
    """One sub-epoch of model `mst_key` on `segment`, from its state at `step`."""
    started = time.perf_counter()
    ctx = context(plpy, job_id)
    setup = time.perf_counter()  # TensorFlow's import and the job's context: once per worker
    buffers = _buffers(plpy, ctx, ctx.train, segment)
    read = time.perf_counter()
    model = _model(ctx, mst_key)
    training.restore_state(model, _read_state(plpy, ctx, mst_key, step))
    restored = time.perf_counter()
    # In memory: the whole segment in one fit call; streamed: a buffer's worth at a time.
    chunk_rows = None if all(b.in_memory for b in buffers) else max(b.rows for b in buffers)
    outcome = training.train_subepoch(model, ctx.specs[mst_key], buffers, ctx.seed, step,
                                      ctx.train.classification, chunk_rows)
    trained = time.perf_counter()
    new_state = training.capture_state(model)
    saved = time.perf_counter()
    result = json.dumps({
        "rows": outcome.rows, "metrics": outcome.means(), "segment": segment, "pid": os.getpid(),
        "in_memory": chunk_rows is None,
        "finished_at": time.time(),
        "seconds": {"setup": setup - started, "read": read - setup, "restore": restored - read,
                    "train": outcome.seconds_train,
                    "other": trained - restored - outcome.seconds_train,
                    "save": saved - trained, "total": saved - started}})
    # The new state and the record of this visit are committed together, when the call
    # returns: a finished sub-epoch is either wholly recorded or not at all.
    plpy.execute(plpy.prepare(
        f"INSERT INTO {ctx.tables['state']} (mst_key, step, state) VALUES ($1, $2, $3) "
        "ON CONFLICT (mst_key, step) DO NOTHING", ["integer", "integer", "bytea"]),
        [mst_key, step + 1, new_state])
    plpy.execute(plpy.prepare(
        f"INSERT INTO {ctx.tables['visits']} (mst_key, step, segment, result) VALUES ($1, $2, $3, $4) "
        "ON CONFLICT (mst_key, step) DO NOTHING", ["integer", "integer", "integer", "jsonb"]),
        [mst_key, step, segment, result])
    return result


def evaluate(plpy: Any, job_id: int, mst_key: int, step: int, partition: int) -> str:
    """Validation loss and metrics of model `mst_key` at `step` on one validation partition."""
    started = time.perf_counter()
    ctx = context(plpy, job_id)
    if ctx.validation is None:
        raise MadlibMopError(f"job {job_id} has no validation table",
                             sqlstate=errors.INVALID_PARAMETER_VALUE,
                             hint="Only the jobs of a fit given a validation_table evaluate.")
    buffers = _buffers(plpy, ctx, ctx.validation, partition)
    model = _model(ctx, mst_key)
    training.restore_state(model, _read_state(plpy, ctx, mst_key, step))
    outcome = training.evaluate(model, ctx.specs[mst_key], buffers, ctx.validation.classification)
    result = json.dumps({"rows": outcome.rows, "metrics": outcome.means(), "pid": os.getpid(),
                         "finished_at": time.time(),
                         "seconds": {"total": time.perf_counter() - started}})
    plpy.execute(plpy.prepare(
        f"INSERT INTO {ctx.tables['evals']} (mst_key, step, partition, result) "
        "VALUES ($1, $2, $3, $4) ON CONFLICT (mst_key, step, partition) DO NOTHING",
        ["integer", "integer", "integer", "jsonb"]), [mst_key, step, partition, result])
    return result


def warm_up(plpy: Any, segments: int) -> None:
    """Import TensorFlow (with cores / segments threads) before the job's first sub-epoch."""
    import_tensorflow(threads=max(1, (os.cpu_count() or 1) // max(1, segments)))
    import keras  # noqa: F401  (Keras' own import is part of the wait)
