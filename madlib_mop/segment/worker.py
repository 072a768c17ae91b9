"""Segment workers: what runs in the sessions an engine opens for a job (`_mop_train`,
`_mop_evaluate`, `_mop_warm_up`).

A worker session lives for the whole job (or until the server's pool takes it back).  It
imports TensorFlow once (with cores / segments threads), decodes its segments' buffers once
and keeps them
(unless they exceed the memory budget, then it reads them per sub-epoch), and keeps one
compiled Keras model with traced training and evaluation loops per program key
(`training.Program`: the models that differ only in learning rate share one), into which
each call restores the state it is given.  A call gets the model's state, trains one
sub-epoch (or evaluates) and returns the new state: the caller commits it (see
`madlib_mop.engine.base` for the contract).

Caches are keyed by (job id, owner): a session serves one job at a time, and any of its
segments (a job may have fewer workers than segments); its decoded buffers, of all the
segments it serves, stay within madlib_mop.worker_memory_mb.

On this server a worker looks its job up in the `jobs` table.  A worker on a segment server
has no job row there: the engine ships the job's description when it opens the session
(`_mop_segment_job`), and the worker reads its segment's table of that server.
"""

from __future__ import annotations

import contextlib
import os
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator


from madlib_mop import errors
from madlib_mop.db import catalog, packed, segments as segment_servers
from madlib_mop.engine.base import VisitRecord
from madlib_mop.json_values import finite_json
from madlib_mop.job import memory, repository, store
from madlib_mop.job import state_store
from madlib_mop.runtime import fused_program, fusion, model_facts, staging, training
from madlib_mop.runtime.custom_functions import CustomFunctions
from madlib_mop.segment import features, kept_states, models
from madlib_mop.errors import MadlibMopError
from madlib_mop.runtime.buffers import Buffer, PackedColumns, buffer_bytes, rows_of, scan_partition
from madlib_mop.runtime.tf_runtime import import_tensorflow, worker_threads



@dataclass
class JobContext:
    job_id: int
    seed: int
    segments: int
    tables: dict  # the per-job tables it reads (models: the configurations)
    train: PackedData
    validation: PackedData | None
    budget_bytes: int
    specs: dict[int, training.ModelSpec] = field(default_factory=dict)
    buffers: dict[tuple[str, int], list[Buffer]] = field(default_factory=dict)
    states: state_store.StateStore | None = None  # on the job's server: its state store
    # Models with a frozen prefix train on its features (`runtime.staging`), unless the job
    # was started with madlib_mop.stage_frozen_layers = off.
    staged: bool = True
    features: dict[tuple, features.Staged] = field(default_factory=dict)
    digests: dict[int, str] = field(default_factory=dict)  # mst_key -> its prefix's digest
    custom: CustomFunctions | None = None  # the job's custom losses and metrics, loaded
    # A fusion class's inference cost (ms per row), timed on this worker (`evaluate_fused`)
    inference_ms: dict[tuple, float] = field(default_factory=dict)
    # On a segment server: the job's store token, when its visits keep their states here
    # (`segment.kept_states`)
    store: str | None = None


_contexts: dict[tuple[int, str], JobContext] = {}  # (job_id, owner)
# Compiled models by program key, kept from one job to the next of this session (a session
# is one role's): a job whose models were trained here before does not trace again.  A new
# job keeps only the programs its own models use, so memory follows the current job.
_programs: dict[tuple, training.Program] = {}  # (program key, staged)
# Fused programs (`train_fused`) by (fusion key, models), kept likewise.
_fused: dict[tuple, Any] = {}


def _adopt(plpy: Any, ctx: "JobContext") -> None:
    """`ctx` becomes the session's one job."""
    keys = {(spec.program_key, ctx.staged) for spec in ctx.specs.values()}
    for key in [k for k in _programs if k not in keys]:
        del _programs[key]
    fused = {fusion.fusion_class(spec) for spec in ctx.specs.values()}
    for key in [k for k in _fused if k[0] not in fused]:
        del _fused[key]
    _contexts.clear()
    features.forget(plpy)


@dataclass(frozen=True)
class PackedData:
    table: str  # the packed table's qualified, quoted name
    columns: PackedColumns
    # On a segment server: segment -> the table of that server holding its rows.
    partitions: dict[int, str] = field(default_factory=dict)


def _packed(plpy: Any, table: str, partitions: int) -> PackedData:
    """The job's packed table; `partitions`, as the job recorded them, are also the modulus
    of a table packed by MADlib (never recomputed: a resumed job reads the same buffers)."""
    summary = packed.read_summary(plpy, table, argument="packed table")
    x, y = packed.packed_columns(summary)
    modulus = partitions if packed.partition_modulus(summary) is not None else None
    return PackedData(summary["packed_table"],
                      PackedColumns(x, y, summary["label_kind"] == "classification", modulus))


def _budget_bytes(plpy: Any, use_caching: bool, models_bytes: int = 0) -> int:
    """What decoded buffers may take: madlib_mop.worker_memory_mb less the job's models
    (`job.memory`).  use_caching => FALSE: none, buffers are read for every sub-epoch."""
    if not use_caching:
        return 0
    return max(0, memory.budget_mb(plpy) * 1024 * 1024 - models_bytes)


def ship(plpy: Any, description: dict) -> None:
    """A segment server's session gets its job (see `engine.cluster.job_description`):
    kept for the current role only, replacing any other job of this session."""
    role = plpy.execute("SELECT current_user AS r")[0]["r"]
    import_tensorflow(threads=worker_threads(description["local_segments"]))

    def data(part: dict | None) -> PackedData | None:
        if part is None:
            return None
        return PackedData(part["table"], PackedColumns(*part["columns"]),
                          {int(k): catalog.qualified_name(plpy, v)
                           for k, v in part["partitions"].items()})

    ctx = JobContext(description["job_id"], description["seed"], description["segments"],
                     {}, data(description["train"]), data(description["validation"]),
                     _budget_bytes(plpy, description["use_caching"]),
                     staged=description.get("stage_frozen_layers", True))
    for m in description["models"]:
        ctx.specs[m["mst_key"]] = training.ModelSpec.of(m)
    if description.get("store"):  # its visits keep their states here (`segment.kept_states`)
        kept = kept_states.hops(plpy, description["store"])
        kept.remove_other_runs({r["oid"] for r in plpy.execute("SELECT oid FROM pg_catalog.pg_database")})
        kept.create()
        ctx.states, ctx.store = state_store.StateStore(None, kept), description["store"]
    _adopt(plpy, ctx)
    _contexts[(ctx.job_id, role)] = ctx
    _shipped.add((ctx.job_id, role))


_shipped: set[tuple[int, str]] = set()  # the contexts a segment server's session was given


def context(plpy: Any, job_id: int) -> JobContext:
    if _shipped:
        role = plpy.execute("SELECT current_user AS r")[0]["r"]
        if (job_id, role) in _shipped and (job_id, role) in _contexts:
            return _contexts[(job_id, role)]
    # Looked up at every call, as the current role: a backend's cache never serves a job to
    # a role that does not own it (also not after SET ROLE), nor one that no longer exists.
    job = repository.own_job(plpy, job_id)
    if (job_id, job.owner) in _contexts:
        return _contexts[(job_id, job.owner)]
    tables = {key: catalog.qualified_name(plpy, list(parts)) for key, parts in job.table_names.items()}
    import_tensorflow(threads=worker_threads(job.num_segments))
    ctx = JobContext(job_id, job.seed, job.num_segments, tables,
                     _packed(plpy, job.source_table, job.num_segments),
                     _packed(plpy, job.validation_table, job.validation_partitions)
                     if job.validation_table else None,
                     0)
    arguments = job.arguments
    ctx.custom = models.custom_functions(plpy, arguments.custom_functions)
    for row in store.job_models(plpy, tables["models"]):
        ctx.specs[row["mst_key"]] = training.ModelSpec.of(row, ctx.custom)
    durable = state_store.StateTable(state_store.plpy_executor(plpy), tables["state"])
    ctx.states = state_store.StateStore(
        durable, state_store.HopFiles.of(lambda q: plpy.execute(q)[0].popitem()[1], job_id))
    ctx.budget_bytes = _budget_bytes(plpy, arguments.use_caching is not False,
                                     memory.models_bytes(list(ctx.specs.values()), durable.sizes()))
    ctx.staged = arguments.stage_frozen_layers
    _adopt(plpy, ctx)  # a backend serves one job at a time: drop another job's caches
    _shipped.clear()
    _contexts[(job_id, job.owner)] = ctx
    return ctx


def _spec(plpy: Any, ctx: JobContext, mst_key: int) -> training.ModelSpec:
    """A model of the job; one a searcher added after this session read the job's models
    is read now (a segment server's session is shipped the job again instead)."""
    if mst_key not in ctx.specs and ctx.tables:
        for row in store.job_models(plpy, ctx.tables["models"], mst_key):
            ctx.specs[mst_key] = training.ModelSpec.of(row, ctx.custom)
    if mst_key not in ctx.specs:
        raise MadlibMopError(f"job {ctx.job_id} has no model {mst_key}", sqlstate=errors.DATA_EXCEPTION,
                             hint="The job's tables were changed; start the job again.")
    return ctx.specs[mst_key]


def _program(plpy: Any, ctx: JobContext, mst_key: int) -> training.Program:
    """The compiled model that trains `mst_key`, shared with the job's models of the same
    program key (the caller restores the model's state into it)."""
    spec = _spec(plpy, ctx, mst_key)
    key = (spec.program_key, ctx.staged)
    if key not in _programs:
        _programs[key] = staging.program_for(spec, ctx.staged)
    return _programs[key]


def _held_bytes(ctx: JobContext) -> int:
    """What the worker keeps decoded: its segments' buffers and staged features."""
    return (sum(buffer_bytes(b) for kept in ctx.buffers.values()
                for b in kept if b.in_memory) + features.held_bytes(ctx.features))


def _trained_on(plpy: Any, ctx: JobContext, data: PackedData, segment: int, mst_key: int,
                program: training.Program, buffers: list[Buffer]) -> tuple[list[Buffer], dict | None]:
    """What the restored model trains or is evaluated on: its segment's buffers, or for a
    staged model their features (computed when this worker has not yet), with the report."""
    if not isinstance(program, staging.StagedProgram):
        return buffers, None
    if mst_key not in ctx.digests:  # frozen: a model's prefix is the same all its job long
        ctx.digests[mst_key] = program.held_prefix or program.digest()
    if program.held_prefix is None:  # a whole state was restored: its prefix is the model's
        program.held_prefix = ctx.digests[mst_key]
    # Keyed by the table that holds the segment's rows (on a segment server, its own).
    table = data.partitions.get(segment, data.table)
    staged, report = features.staged_buffers(
        plpy, ctx.features, ctx.job_id, (table, segment, ctx.digests[mst_key]), buffers,
        program, data.columns.classification, max(0, ctx.budget_bytes - _held_bytes(ctx)))
    return staged, report.to_dict()


def _buffers(plpy: Any, ctx: JobContext, data: PackedData, segment: int) -> list[Buffer]:
    """The segment's buffers: decoded once and kept, or read each time when they do not fit
    the memory budget (worker_memory_mb)."""
    key = (data.table, segment)
    if key not in ctx.buffers:
        # One budget for all the segments a worker serves (it may serve several: a job
        # can have fewer workers than segments).
        held = _held_bytes(ctx)
        ctx.buffers[key] = scan_partition(plpy, data.partitions.get(segment, data.table),
                                          data.columns, segment, max(0, ctx.budget_bytes - held))
    return ctx.buffers[key]


@contextlib.contextmanager
def _state(ctx: JobContext, mst_key: int, step: int, model_state: bytes | None) -> Iterator[Any]:
    """The state a call restores: the one it was given, else the job's stored one (its hop
    file mapped, not read whole: views of it must not outlive the block)."""
    if model_state is not None:
        yield model_state
        return
    if ctx.states is None:  # a segment server's session: states come with the call
        raise MadlibMopError(f"job {ctx.job_id}: no state given for model {mst_key}",
                             sqlstate=errors.INVALID_PARAMETER_VALUE,
                             hint="A segment server's worker is given the state with the call.")
    with ctx.states.mapped(mst_key, step, whole=False) as blob:
        yield state_store.found(blob, mst_key, step)


def _restore(ctx: JobContext, program: training.Program, blob: Any) -> None:
    """The state into the program; a staged model's head state with its prefix's, kept in the
    job's store (where the model does not hold it already)."""
    program.restore(blob, ctx.states.hops.mapped_prefix if ctx.states is not None else None)


def _write_hop(ctx: JobContext, program: training.Program, mst_key: int, step: int) -> int:
    """The state into its hop file, a part at a time: a staged model's without its frozen
    prefix, whose weights never change (kept once per job and digest).  Its bytes."""
    hops = ctx.states.hops
    if isinstance(program, staging.StagedProgram) and program.held_prefix is not None:
        hops.keep_prefix(program.held_prefix, program.write_prefix)
        hops.write(mst_key, step, program.write_head)
    else:
        hops.write(mst_key, step, program.write_state)
    return hops.path(mst_key, step).stat().st_size


def train(plpy: Any, job_id: int, mst_key: int, step: int, segment: int,
          model_state: bytes | None) -> dict:
    """One sub-epoch of model `mst_key` on `segment` from `model_state` (its state after
    `step` sub-epochs): {new_state, result}.  Without `model_state` (a worker of the job's
    own server) the state is read from the job's store and the new one written there
    (`job.state_store`): new_state is then NULL."""
    started = time.perf_counter()
    ctx = context(plpy, job_id)
    setup = time.perf_counter()  # TensorFlow's import and the job's context: once per worker
    buffers = _buffers(plpy, ctx, ctx.train, segment)
    read = time.perf_counter()
    program = _program(plpy, ctx, mst_key)
    built = time.perf_counter()  # a program's first visit on this worker builds its model
    traced_before = program.traced
    with _state(ctx, mst_key, step, model_state) as blob:
        loaded = time.perf_counter()
        _restore(ctx, program, blob)
    del blob, model_state
    restored = time.perf_counter()
    buffers, staged = _trained_on(plpy, ctx, ctx.train, segment, mst_key, program, buffers)
    staging_seconds = time.perf_counter() - restored
    # In memory: the whole segment in one fit call; streamed: a buffer's worth at a time.
    chunk_rows = None if all(b.in_memory for b in buffers) else max(b.rows for b in buffers)
    outcome = training.train_subepoch(program, ctx.specs[mst_key], buffers, ctx.seed, step,
                                      ctx.train.columns.classification, chunk_rows)
    trained = time.perf_counter()
    diverged = training.divergence(outcome.means()) or program.nonfinite()
    # A diverged model's state is not kept: the model stops.  Without a store (a segment
    # server's worker of a coordinator that carries states) the new state goes back.
    if diverged or ctx.states is None:
        new_state = b"" if diverged else program.capture()
    else:  # straight into the hop file, a part at a time (save is then the whole write)
        state_bytes = _write_hop(ctx, program, mst_key, step + 1)
        new_state = None
    captured = saved = time.perf_counter()
    if new_state is not None:
        new_state = bytes(new_state)  # PL/Python returns bytes as bytea
        state_bytes = len(new_state)
    # build: the compiled model, on a program's first visit on this worker;
    # load: the state from the job's store (its hop file mapped, else the state table);
    # restore: into the model; stage: a staged model's features, when this call computed them;
    # save: out of the model (into the hop file on the job's own
    # server, a part at a time); keep: 0 (written by save).
    result = VisitRecord(
        outcome.rows, outcome.means(), segment, os.getpid(), chunk_rows is None, time.time(),
        {"setup": setup - started, "read": read - setup, "build": built - read, "load": loaded - built,
         "restore": restored - loaded, "stage": staging_seconds, "train": outcome.seconds_train,
         "other": trained - restored - staging_seconds - outcome.seconds_train,
         "save": captured - trained,
         "keep": saved - captured, "total": saved - started}, diverged, staged,
        program.traced - traced_before, state_bytes).to_json()
    return {"new_state": new_state, "result": result}


def _fused_program(plpy: Any, ctx: JobContext, mst_keys: list[int]) -> fused_program.FusedProgram:
    """The fused program of these models (`runtime.fusion`: one key), kept by key and size."""
    specs = [_spec(plpy, ctx, key) for key in mst_keys]
    key = (fusion.fusion_class(specs[0]), len(specs))
    if key[0] is None or any(fusion.fusion_class(s) != key[0] for s in specs):
        raise MadlibMopError(f"job {ctx.job_id}: models {mst_keys} cannot train as one program",
                             sqlstate=errors.INVALID_PARAMETER_VALUE,
                             hint="The job's tables were changed; start the job again.")
    if key not in _fused:
        _fused[key] = fused_program.FusedProgram(specs[0], len(specs))
    return _fused[key]


def _restored_fused(plpy: Any, ctx: JobContext, mst_keys: list[int], steps: list[int]
                    ) -> tuple[fused_program.FusedProgram, float]:
    """The models' fused program, with each model's state after its `steps` sub-epochs (from
    the job's store) restored into it; and when it was built (before the states were read)."""
    if len(steps) != len(mst_keys):
        raise MadlibMopError(f"job {ctx.job_id}: {len(mst_keys)} models and {len(steps)} steps",
                             sqlstate=errors.INVALID_PARAMETER_VALUE,
                             hint="Give one step per model, in the order of mst_keys.")
    program = _fused_program(plpy, ctx, mst_keys)
    built = time.perf_counter()
    with contextlib.ExitStack() as stack:
        program.restore([stack.enter_context(_state(ctx, key, step, None)) for key, step in zip(mst_keys, steps)])
    return program, built


def train_fused(plpy: Any, job_id: int, mst_keys: list[int], steps: list[int], segment: int) -> list[str]:
    """One sub-epoch of the models `mst_keys` (one fusion group of the schedule, each after
    its `steps` sub-epochs) on `segment`, trained as one fused program: each model's state read
    from and written to the job's store as `train` does (on a segment server, its hop files:
    `segment.kept_states.train_fused`), one visit's record per model."""
    started = time.perf_counter()
    ctx = context(plpy, job_id)
    if ctx.states is None:
        raise MadlibMopError(f"job {job_id}: fused training reads its states where this session keeps them",
                             sqlstate=errors.INVALID_PARAMETER_VALUE,
                             hint="A segment server's session trains fused groups of a job given with its store.")
    setup = time.perf_counter()
    buffers = _buffers(plpy, ctx, ctx.train, segment)
    read = time.perf_counter()
    program, built = _restored_fused(plpy, ctx, mst_keys, steps)
    restored = time.perf_counter()
    specs = [ctx.specs[key] for key in mst_keys]
    in_memory = all(b.in_memory for b in buffers)
    outcomes, _ = fused_program.train_fused_subepoch(program, specs, buffers, ctx.seed, steps,
                                                     ctx.train.columns.classification)
    trained = time.perf_counter()
    results = []
    blobs, nonfinite = program.capture_checked()
    for index, (key, step, outcome, blob) in enumerate(zip(mst_keys, steps, outcomes, blobs)):
        diverged = training.divergence(outcome.means()) or nonfinite.get(index)
        if not diverged:
            ctx.states.hops.write(key, step + 1, blob)
        results.append((key, outcome, diverged, 0 if diverged else len(blob)))
    saved = time.perf_counter()
    # Each model's record has its share of the call's seconds (their sum is the call's), and
    # `fused`: the models that shared the call.
    share = 1.0 / len(mst_keys)
    seconds = {"setup": setup - started, "read": read - setup, "build": built - read, "load": 0.0,
               "restore": restored - built, "stage": 0.0, "train": trained - restored, "other": 0.0,
               "save": saved - trained, "keep": 0.0, "total": saved - started}
    seconds = {name: value * share for name, value in seconds.items()}
    return [VisitRecord(outcome.rows, outcome.means(), segment, os.getpid(), in_memory,
                        time.time(), dict(seconds, fused=float(len(mst_keys))), diverged, None, 0,
                        state_bytes, list(mst_keys)).to_json()
            for key, outcome, diverged, state_bytes in results]


def evaluate(plpy: Any, job_id: int, mst_key: int, step: int, partition: int,
             model_state: bytes | None) -> str:
    """Validation loss and metrics of `model_state` (model `mst_key` after `step`
    sub-epochs) on one validation partition."""
    started = time.perf_counter()
    ctx = context(plpy, job_id)
    if ctx.validation is None:
        raise MadlibMopError(f"job {job_id} has no validation table",
                             sqlstate=errors.INVALID_PARAMETER_VALUE,
                             hint="Only the jobs of a fit given a validation_table evaluate.")
    buffers = _buffers(plpy, ctx, ctx.validation, partition)
    read = time.perf_counter()
    program = _program(plpy, ctx, mst_key)
    built = time.perf_counter()
    with _state(ctx, mst_key, step, model_state) as blob:
        _restore(ctx, program, blob)
    del blob
    restored = time.perf_counter()
    raw = buffers
    buffers, staged = _trained_on(plpy, ctx, ctx.validation, partition, mst_key, program, buffers)
    features_ready = time.perf_counter()
    outcome = training.evaluate(program, ctx.specs[mst_key], buffers,
                                ctx.validation.columns.classification)
    evaluated = time.perf_counter()
    if staged is not None and outcome.seconds_per_row is not None:
        outcome.seconds_per_row += program.prefix_seconds_per_row(lambda: raw[0].load()[0])
    seconds = {"read": read - started, "build": built - read, "restore": restored - built,
               "stage": features_ready - restored, "evaluate": evaluated - features_ready,
               "cost": time.perf_counter() - evaluated, "total": time.perf_counter() - started}
    return finite_json({"rows": outcome.rows, "metrics": outcome.means(), "pid": os.getpid(),
                        "finished_at": time.time(), "diverged": training.divergence(outcome.means()),
                        "ms_per_row": None if outcome.seconds_per_row is None
                        else 1000.0 * outcome.seconds_per_row,
                        "seconds": seconds, "staged": staged})


def evaluate_fused(plpy: Any, job_id: int, mst_keys: list[int], steps: list[int], partition: int) -> list[str]:
    """`evaluate` of the models of one fused call (`VisitRecord.fused_with`), each after
    its `steps` sub-epochs, as one program over the partition's rows: each model's result, in
    their order.  Their inference cost is their architecture's, which they share: timed once
    per worker and job, on the first model alone, as `evaluate` times it."""
    started = time.perf_counter()
    ctx = context(plpy, job_id)
    if ctx.validation is None or ctx.states is None:
        raise MadlibMopError(f"job {job_id}: fused validation reads the states where this session keeps "
                             "them, and the job's validation table",
                             sqlstate=errors.INVALID_PARAMETER_VALUE,
                             hint="Only the fused models of a fit given a validation_table evaluate fused.")
    buffers = _buffers(plpy, ctx, ctx.validation, partition)
    read = time.perf_counter()
    program, built = _restored_fused(plpy, ctx, mst_keys, steps)
    restored = time.perf_counter()
    classification = ctx.validation.columns.classification
    outcomes = fused_program.evaluate_fused(program, [ctx.specs[key] for key in mst_keys], buffers,
                                            classification)
    evaluated = time.perf_counter()
    cost_class = fusion.fusion_class(ctx.specs[mst_keys[0]])
    if cost_class not in ctx.inference_ms and buffers:
        alone = _program(plpy, ctx, mst_keys[0])
        with _state(ctx, mst_keys[0], steps[0], None) as blob:
            _restore(ctx, alone, blob)
        timed = training.evaluate(alone, ctx.specs[mst_keys[0]], buffers[:1], classification)
        if timed.seconds_per_row is not None:
            ctx.inference_ms[cost_class] = 1000.0 * timed.seconds_per_row
    share = 1.0 / len(mst_keys)  # each model's share of the call's seconds
    seconds = {"read": read - started, "build": built - read, "restore": restored - built, "stage": 0.0,
               "evaluate": evaluated - restored, "cost": time.perf_counter() - evaluated,
               "total": time.perf_counter() - started}
    seconds = {name: value * share for name, value in seconds.items()}
    return [finite_json({"rows": outcome.rows, "metrics": outcome.means(), "pid": os.getpid(),
                         "finished_at": time.time(), "diverged": training.divergence(outcome.means()),
                         "ms_per_row": ctx.inference_ms.get(cost_class), "seconds": seconds,
                         "staged": None, "fused_with": list(mst_keys)})
            for outcome in outcomes]


def warm_up(plpy: Any, segments: int) -> None:
    """Import TensorFlow (with cores / segments threads) before the job's first sub-epoch."""
    import_tensorflow(threads=worker_threads(segments))
    import keras  # noqa: F401  (Keras' own import is part of the wait)


def trace_latest_job(plpy: Any) -> int:
    """In a session kept ready for its role (`engine.prewarm`): build and trace the programs
    of the role's most recent job in this database, so that its next job of the same
    configurations (a pg_cron firing, a notebook run again) starts without tracing.  Each
    program goes once through a visit's own path on the first rows of the job's data: its
    state captured, written and restored, one training pass (a minibatch and one row more)
    and evaluations (an evaluation batch), so that its functions are traced and their
    graphs and kernels prepared for the data's dtypes and shapes.  A visit restores the whole state, so what
    those rows changed is never seen.  Left out: a job with custom functions (their
    objects load only in the job's own sessions), one whose data is on segment servers or
    gone, and staged programs (they train on features).  How many programs it traced."""
    job = repository.latest_own_job(plpy)
    if job is None or job.arguments.custom_functions or not repository.tables_exist(plpy, job):
        return 0
    try:
        source = catalog.resolve_table(plpy, job.source_table, argument="source_table")
        if segment_servers.placement(plpy, source) is not None:
            return 0
        ctx = context(plpy, job.job_id)
    except MadlibMopError:  # its data was dropped or changed since: nothing to trace for
        return 0
    train_rows = _first_buffer(plpy, ctx.train)
    if train_rows is None:  # no rows: nothing a visit would run
        return 0
    valid_rows = _first_buffer(plpy, ctx.validation) if ctx.validation is not None else None
    traced, parameters = set(), {}
    for mst_key, spec in sorted(ctx.specs.items()):
        key = (spec.program_key, ctx.staged)
        if key in traced:
            continue
        program = _program(plpy, ctx, mst_key)
        if isinstance(program, staging.StagedProgram):
            continue
        parameters[spec.program_key] = program.model.count_params()
        program.state.trace()
        rows = train_rows(spec.fit.get("batch_size", 32) + 1)
        training.train_subepoch(program, spec, [rows], ctx.seed, 0, ctx.train.columns.classification)
        # Training metrics are an evaluation of the training data; validation data may
        # differ in dtype (one-hot against class labels) and so have a function of its own.
        # Both over a buffer's first EVALUATION_BATCH rows: a visit evaluates in batches of that
        # many, and a batch shape's first run costs (0.3 s per W4 ResNet, 8 of them a
        # session: what made a prewarmed session's first W4 job 7-9% slower).
        batch = training.EVALUATION_BATCH
        training.evaluate(program, spec, [train_rows(batch)], ctx.train.columns.classification)
        if valid_rows is not None:
            training.evaluate(program, spec, [valid_rows(batch)], ctx.validation.columns.classification)
        traced.add(key)
    _keep_initial_states(ctx, parameters)
    return len(traced)


def _keep_initial_states(ctx: JobContext, parameters: dict[tuple, int]) -> None:
    """The job's models' step-0 states, built now and kept by `model_facts` (small models'
    alone): a job of the same configurations and seed gets them without building its models.
    A job started from given weights (warm start, transfer) is not built ahead."""
    # (weights and two optimizer slots of 4 bytes per parameter: a state's size, about)
    small = [spec for _, spec in sorted(ctx.specs.items()) if spec.initial_weights is None
             and 0 < 3 * 4 * parameters.get(spec.program_key, 0) <= model_facts.KEPT_STATES_BYTES // 8]
    request = {"seed": ctx.seed, "models": [{"mst_key": s.mst_key, "model_arch": s.model_arch,
                                             "compile_params": s.compile_params, "fit_params": s.fit_params}
                                            for s in small]}
    for _ in model_facts.each_state(request, None):
        pass


def _first_buffer(plpy: Any, data: PackedData) -> Callable[[int], Buffer] | None:
    """The first buffer of a packed table: a function giving a buffer of its first n rows."""
    rows = plpy.execute(f"SELECT {data.columns.select_list(plpy.quote_ident)} FROM {data.table} "
                        "ORDER BY buffer_id LIMIT 1")
    if not rows:
        return None
    x, y = data.columns.decode(rows[0])

    def first(n: int) -> Buffer:
        part = (training.each(x, lambda v: v[:n]), training.each(y, lambda v: v[:n]))
        return Buffer(rows_of(part[0]), lambda: part)
    return first
