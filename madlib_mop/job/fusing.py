"""Which of a job's models hop as fused groups (madlib_mop.fuse_models).

Models that can train as one program (`runtime.fusion.fusion_key`: one architecture,
optimizer class, loss, batch size, ...) form a fusion class; the schedule fuses the models
of a class that its rotation sends along the same path in an epoch (`job.schedule`).

The setting, recorded with the job when it starts (a resumed job keeps it):
- `off`: every model trains alone, as before fusion existed.
- `on`: every class fuses.
- `auto` (the default): a class fuses where it pays by `bench/bench_fusion.py`'s measures.
  A fused step saves TensorFlow's per-operation cost, not arithmetic: a class fuses when its
  weights times its batch size is at most AUTO_LIMIT (measured with one thread, a pair of
  models: 0.70x-0.86x the unfused time from 4,810 weights at batch 64 to 17,226 at batch
  512 (8.8 M), 0.92x for 85,002 weights at batch 32; above it, 85,002 weights at batch 128
  (10.9 M) to 512 and 167,178 at 256, 1.04x-1.07x).  And each worker traces a fused
  program once per group size (about 0.4 s, kept for the session's later jobs), which a
  short job does not earn back: a class fuses when its models train enough steps per
  segment in the job to earn it back twice (`steps_to_pay`).  A fused step's fixed cost is
  shared by its models: a model's step saves about UNFUSED_STEP_MS - FUSED_STEP_MS / K
  (0.04 ms in a pair, 0.09-0.23 ms in a group of 16), so a pair needs 20,000 steps of its
  models and a group of 16 about 6,300.

Models fuse on this server and on segment servers whose extension trains fused groups
(`engine.base.Engine.without_fusion`: a fused call there fetches each model's state from
where its last visit left it, as a visit alone does).
A person's clone of a model that fuses hops in its source's groups (`job.schedule.fusion_groups`)
where its configuration is of its source's class (`clone_class`: a changed learning rate
keeps it, a changed batch size does not); models a searcher or a person adds train alone.  The classes are a
function of the models' configurations, their weights' count and the setting, decided
when the job is made and recorded with it (`decided`: `orders` "fused"), and of its
recorded clones, so a resumed job forms the same groups.
"""

from __future__ import annotations

import collections
import dataclasses
import math
from typing import Any, Callable, Iterable

from madlib_mop import errors
from madlib_mop.db import packed, settings
from madlib_mop.errors import MadlibMopError
from madlib_mop.job import memory
from madlib_mop.job.schedule import MAX_GROUP
from madlib_mop.runtime import fusion, training

FUSE_SETTING = "madlib_mop.fuse_models"
CHOICES = ("auto", "on", "off")
AUTO_LIMIT = 9_000_000  # weights x batch size of one model's step
# The fixed costs of a step (one thread, small MLPs; bench_fusion): of a model alone, and of a
# fused step whatever its models' count; and a worker's tracing of a fused program.
UNFUSED_STEP_MS = 0.14
FUSED_STEP_MS = 0.2
TRACE_SECONDS = 0.4
MAX_EVALUATION_GROUP = 16  # models in one fused evaluation or prediction (the schedule's MAX_GROUP)
# A fused evaluation decodes each buffer once for all its models and builds one program
# (traced once per worker session, kept for its later calls) where an unfused one builds
# and compiles every model at every call: `auto` fuses as `on` does.  Measured (this
# machine, 2 workers): never slower, even a session's first call on 150 rows (iris, 8
# models: 13.6-15.7 s against 15.0-16.3 s unfused, then 0.05 s against 2.9 s); 0.18x on
# 200,000 rows (bench_fused_jobs, W5s: 16 models).
# A fused program holds its models' variables stacked (optimizer slots too): models of at
# most this many bytes of weights evaluate (and predict) fused, a group at most 16 times that (x3).
FUSED_INFERENCE_WEIGHT_BYTES = 4 * 1024 * 1024


def fuse_models(plpy: Any) -> str:
    """madlib_mop.fuse_models: auto (the default), on or off."""
    value = (settings.setting(plpy, FUSE_SETTING) or "auto").strip().lower()
    if value not in CHOICES:
        raise MadlibMopError(f"setting {FUSE_SETTING} = '{value}' is not one of auto, on, off",
                             sqlstate=errors.INVALID_PARAMETER_VALUE,
                             hint=f"SET {FUSE_SETTING} = off (or RESET {FUSE_SETTING}).")
    return value


def fusion_classes(configs: Iterable[dict], setting: str,
                   parameters: Callable[[list[dict]], dict[int, int]],
                   steps: Callable[[dict], float]) -> dict[int, int]:
    """mst_key -> its fusion class, for the models that may fuse under `setting` (configs:
    mst_key, model_arch, compile_params, fit_params; `parameters`: each config's weights'
    count, and `steps`: its steps per segment in the job, asked only for `auto`).  Classes
    are numbered in the order of their first model."""
    if setting == "off":
        return {}
    keys = {}
    for config in sorted(configs, key=lambda c: c["mst_key"]):
        key = fusion.fusion_class(training.ModelSpec.of(config))
        if key is not None:
            keys[config["mst_key"]] = key
    if setting == "auto" and keys:
        by_key = {c["mst_key"]: c for c in configs if c["mst_key"] in keys}
        work: dict[str, float] = {}
        for k, v in keys.items():
            work[v] = work.get(v, 0.0) + steps(by_key[k])
        sizes = collections.Counter(keys.values())
        keys = {k: v for k, v in keys.items() if work[v] >= steps_to_pay(sizes[v])}
        # (the weights' count is asked of a worker: only for the classes long enough to pay)
        counts = parameters([by_key[k] for k in keys]) if keys else {}
        keys = {k: v for k, v in keys.items()
                if counts[k] * training.ModelSpec.of(by_key[k]).fit.get("batch_size", 32) <= AUTO_LIMIT}
    numbers: dict[str, int] = {}
    return {k: numbers.setdefault(v, len(numbers)) for k, v in keys.items()}


def steps_to_pay(models: int) -> float:
    """Steps of a class of `models` models (all of theirs, per segment in the job) that earn
    back twice a worker's tracing of their fused program: each model's step saves the
    unfused step's fixed cost less its share of the fused step's.  A class of more than
    MAX_GROUP models is counted as groups of MAX_GROUP (the schedule's last, smaller group
    traces a program of its own and saves less a step: an estimate, not a bound)."""
    group = min(max(models, 2), MAX_GROUP)
    return 2 * TRACE_SECONDS * 1000 / (UNFUSED_STEP_MS - FUSED_STEP_MS / group)


def job_classes(plpy: Any, job: Any, engine: Any, initial: set[int], model_rows: Callable[[], list[dict]],
                keras: Any, clones: dict[int, tuple[int, int]]) -> dict[int, int]:
    """A job's fusion classes (`job`: its `record.JobRecord`): of the models it started
    with, as it recorded them when it was made (`decided`), and of its `clones`
    (`with_clones`).  A job that fuses is refused (0A000) where its engine's workers
    cannot (`engine.base.Engine.without_fusion`: a segment server whose extension was
    taken back to an older version): unfused, its models would not train to the bits it
    started to.  A job made before jobs recorded them works them out again: of the models
    it started with (`initial`), on this server (jobs on segment servers did not fuse)."""
    orders = job.arguments.orders
    if isinstance(orders, dict) and "fused" in orders:
        found = {key: number for number, members in enumerate(orders["fused"]) for key in members}
    elif engine.stores_states:
        configs = [row for row in model_rows() if row["mst_key"] in initial]
        found = _decide(plpy, job.arguments, job.source_table, job.num_segments, configs, keras)
    else:
        found = {}
    joined = with_clones(found, clones, model_rows)
    missing = engine.without_fusion() if _several(joined) else []
    if missing:
        raise MadlibMopError(f"job {job.job_id} trains models as fused groups, as decided when it was "
                             f"made, and {', '.join(missing)} cannot",
                             sqlstate=errors.FEATURE_NOT_SUPPORTED,
                             hint=f"ALTER EXTENSION madlib_mop UPDATE on {', '.join(missing)}, then resume the job.")
    return joined


def decided(plpy: Any, plan: Any, engine: Any, keras: Any, weight_bytes: dict[str, int],
            limits: list[memory.WorkerLimits]) -> Any:
    """The plan (`job.plan.Plan`) with its models' fusion classes recorded in its arguments'
    `orders` ("fused": the mst_keys of each class, in the order of their first model), so
    that the job, resumed by a later version or with other facts, fuses as it started.
    None fuse where the engine's workers cannot (`Engine.without_fusion`: a segment
    server's extension older than fused training), nor where a fused call would not fit
    madlib_mop.worker_memory_mb of the servers its workers run on (`fused_need`; `limits`:
    the segment servers', `Engine.worker_limits`, else this server's; `weight_bytes`:
    architecture -> its weights' bytes, `plan.check_models`).  Each with a NOTICE."""
    classes = _decide(plpy, plan.arguments, plan.source["packed_table"], plan.source["num_segments"],
                      plan.configs, keras)
    missing = engine.without_fusion() if _several(classes) else []
    if missing:
        plpy.notice(f"{FUSE_SETTING}: the models train unfused: {', '.join(missing)} cannot train fused "
                    "groups (its extension predates them)",
                    hint=f"ALTER EXTENSION madlib_mop UPDATE on {', '.join(missing)}.")
        classes = {}
    bounds = [(limit.budget_mb, limit.where) for limit in limits] or [(memory.budget_mb(plpy), "this server")]
    # (0 keeps no buffers: not a bound)
    budget, where = min(((mb, at) for mb, at in bounds if mb > 0), default=(0, ""))
    need = fused_need(classes, plan.configs, plan.source, weight_bytes)
    if budget > 0 and need is not None and need[0] > budget:
        plpy.notice(f"{FUSE_SETTING}: the models train unfused: a fused call would hold about "
                    f"{need[0]:.0f} MB (its segment's rows decoded, {need[1]:.0f} MB, and the "
                    f"models' states) of the {budget:.0f} MB of madlib_mop.worker_memory_mb on {where}")
        classes = {}
    members: list[list[int]] = [[] for _ in set(classes.values())]
    for key in sorted(classes):
        members[classes[key]].append(int(key))
    orders = dict(plan.arguments.orders, fused=members)
    return dataclasses.replace(plan, arguments=plan.arguments.replace(orders=orders))


def _several(classes: dict[int, int]) -> bool:
    """Has a class two models or more (one that fuses)?"""
    return len(set(classes.values())) < len(classes)


def decoded_segment_bytes(source: dict) -> int | None:
    """What a fused call holds of the largest segment of a packed table (`source`: its
    summary) decoded, at most: its features as float32 three times (the buffers', their
    concatenation and the traced loop's copy of it, the concatenation freed once copied),
    its labels as int16 and float32 twice, and the order of its rows of each of a group's
    MAX_GROUP models as int32 twice (the array and the loop's copy of it, the array freed
    once copied) (`fused_program.train_fused_subepoch`, which holds the segment whole
    where the unfused loop streams it); None where the summary does not say (a table
    packed by MADlib)."""
    rows, shape = source.get("rows_per_segment"), source.get("feature_shape")
    if not rows or not shape:
        return None
    labels = sum(source.get("num_classes") or [1])
    return max(rows) * (3 * 4 * math.prod(shape) + 10 * labels + 2 * 4 * MAX_GROUP)


def fused_need(classes: dict[int, int], configs: list[dict], source: dict, weight_bytes: dict[str, int]
               ) -> tuple[float, float] | None:
    """(MB a worker holds to train the fused `classes`: the job's models as `job.memory`
    counts them, each class's stacked states (a group's: MAX_GROUP models, as a person's
    clones may fill it) and the decoded segment; the decoded segment's MB), or None when
    nothing fuses or the segment's size is not known."""
    held = decoded_segment_bytes(source)
    if not classes or held is None:
        return None
    states = {c["mst_key"]: memory.estimated_state_bytes(c, weight_bytes[c["model_arch"]])
              for c in configs if c["model_arch"] in weight_bytes}
    models = memory.models_bytes([training.ModelSpec.of(c) for c in configs], states)
    for number in set(classes.values()):
        members = [states.get(k, 0) for k, v in classes.items() if v == number]
        models += memory.STATE_COPIES * MAX_GROUP * max(members)
    return (models + held) / memory.MB, held / memory.MB


def _decide(plpy: Any, arguments: Any, source_table: str, num_segments: int, configs: list[dict],
            keras: Any) -> dict[int, int]:
    """The classes of `configs` that fuse (`fusion_classes`), without custom functions."""
    if arguments.fuse_models == "off" or arguments.custom_functions:
        return {}
    rows = 0
    if arguments.fuse_models == "auto":  # a table packed by MADlib does not say: none fuse
        rows = packed.read_summary(plpy, source_table, argument="source_table").get("num_rows") or 0

    def steps(config: dict) -> float:  # a model's minibatches per segment over the job
        spec = training.ModelSpec.of(config)
        batch = spec.fit.get("batch_size", 32)
        return -(-rows // (batch * num_segments)) * spec.epochs * arguments.num_iterations
    return fusion_classes(configs, arguments.fuse_models, lambda asked: {
        key: facts["parameters"] for key, facts in keras.facts(asked).items()}, steps)


def clone_class(fusion_of: dict[int, int], source: dict, clone: dict) -> int | None:
    """The fusion class (of `fusion_of`, model -> class) a clone hops in: its source's, where
    the source fuses and the clone's configuration (mst_key, model_arch, compile_params,
    fit_params) is of the source's class; else None (it trains alone)."""
    if source["mst_key"] not in fusion_of:
        return None
    found = fusion.fusion_class(training.ModelSpec.of(clone))
    same = found is not None and found == fusion.fusion_class(training.ModelSpec.of(source))
    return fusion_of[source["mst_key"]] if same else None


def with_clones(fusion_of: dict[int, int], clones: dict[int, tuple[int, int]],
                model_rows: Callable[[], list[dict]]) -> dict[int, int]:
    """`fusion_of` with the classes of a resumed job's clones (clone -> (source, step),
    `job.steering.clone_sources`) as `clone_class` gave them when they were made."""
    if not clones or not fusion_of:
        return fusion_of
    configs = {row["mst_key"]: row for row in model_rows()}
    joined = dict(fusion_of)
    for clone in sorted(clones):  # (a clone of a clone after its source)
        found = clone_class(joined, configs[clones[clone][0]], configs[clone])
        if found is not None:
            joined[clone] = found
    return joined


def path_grouping(configs: Iterable[dict], custom_functions: bool) -> dict:
    """What a new job records of how it draws its models' paths (`job.schedule.visit_orders`,
    `JobArguments.orders`): the models (mst_keys) of each fusion class of two or more, from
    the configurations alone, whatever madlib_mop.fuse_models is; and that a person's
    clones go their sources' paths (`job.schedule.model_orders`).  Recorded, not worked
    out again when the job is resumed: a later version that fuses more layers keeps a
    resumed job's orders.  No class with custom functions (their models never fuse)."""
    classes: dict[str, list[int]] = {}
    if not custom_functions:
        for config in sorted(configs, key=lambda c: c["mst_key"]):
            key = fusion.fusion_class(training.ModelSpec.of(config))
            if key is not None:
                classes.setdefault(key, []).append(int(config["mst_key"]))
    return {"by_class": [members for members in classes.values() if len(members) > 1],
            "clones": "source_path"}


def clones_follow(job: Any) -> bool:
    """Whether the job's clones go their sources' paths (a job started before jobs recorded
    so draws a clone's orders from a stream of its own)."""
    orders = job.arguments.orders
    return isinstance(orders, dict) and orders.get("clones") == "source_path"


def path_classes(job: Any) -> dict[int, int] | None:
    """The classes a job draws its models' paths by (mst_key -> its class's number, for the
    models of a class of two or more), as it recorded them; None for a job that draws
    rotations (one started before jobs recorded how)."""
    orders = job.arguments.orders
    if not isinstance(orders, dict):
        return None
    return {key: number for number, members in enumerate(orders["by_class"]) for key in members}


def inference_groups(setting: str, specs: list[training.ModelSpec], weight_bytes: list[int | None]
                     ) -> list[list[int]]:
    """The models (indices into `specs`) that evaluate and predict as fused groups unless
    `setting` is off: those of one fusion class (`runtime.fusion`; the fit's batch size does not matter
    to an evaluation) whose weights (`weight_bytes`, None: kept in pieces) are small, at
    least two, at most MAX_EVALUATION_GROUP a group."""
    if setting == "off":
        return []
    classes: dict[str, list[int]] = {}
    for index, (spec, size) in enumerate(zip(specs, weight_bytes)):
        key = fusion.fusion_class(spec) if size is not None and size <= FUSED_INFERENCE_WEIGHT_BYTES else None
        if key is not None:
            classes.setdefault(key, []).append(index)
    groups = []
    for members in classes.values():
        groups += [members[start:start + MAX_EVALUATION_GROUP]
                   for start in range(0, len(members), MAX_EVALUATION_GROUP)
                   if len(members[start:start + MAX_EVALUATION_GROUP]) > 1]
    return groups
