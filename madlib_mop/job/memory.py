"""What one worker session of a job needs in memory, estimated before the job starts.

A worker holds TensorFlow and Keras (`server_slots.BASE_MB`), one compiled program per
program key with its variables, and for each call the state it restores and the state it
captures: about three copies of the largest state of each key.  madlib_mop.worker_memory_mb
is what a worker may hold beyond TensorFlow: its models first, and decoded buffers in what
the models leave (the rest are read per sub-epoch; 0 keeps none).  A job whose models alone
need more is refused before it is created, as is one whose workers would need more than their share of
the server's memory for worker sessions (`server_slots.MEMORY_FRACTION` of the machine's,
shared by the cap).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from madlib_mop import errors
from madlib_mop.db import settings
from madlib_mop.engine import server_slots
from madlib_mop.errors import MadlibMopError
from madlib_mop.runtime import training

MB = 1024 * 1024
STATE_COPIES = 3  # the program's variables, the state restored, the state captured
BUDGET_SETTING = "madlib_mop.worker_memory_mb"
DEFAULT_BUDGET_MB = 4096  # its default


@dataclass(frozen=True)
class WorkerLimits:
    """What a job's worker sessions may use on the server they run on."""
    cap: int  # its madlib_mop.max_worker_sessions (or the machine's)
    share_mb: float  # the machine's memory for worker sessions, divided by the cap
    budget_mb: float  # its madlib_mop.worker_memory_mb
    where: str = "this server"

    def as_json(self) -> dict:
        return {"cap": self.cap, "share_mb": self.share_mb, "budget_mb": self.budget_mb}


def limits_here(plpy: Any) -> WorkerLimits:
    """This server's limits (`_mop_worker_limits`: a segment server's, for its coordinator)."""
    cap = server_slots.cap(plpy)
    return WorkerLimits(cap, server_slots.slot_share_mb(cap), float(budget_mb(plpy)))


def limits_of(found: list[tuple[str, dict]]) -> list[WorkerLimits]:
    """Servers' limits as `Engine.worker_limits` gives them (none: this server's count)."""
    return [WorkerLimits(int(v["cap"]), float(v["share_mb"]), float(v["budget_mb"]), where)
            for where, v in found]


@dataclass(frozen=True)
class WorkerMemory:
    base_mb: float  # TensorFlow and Keras
    models_mb: float  # programs and states
    buffers_mb: float  # decoded buffers kept
    share_mb: float  # what one worker session may count on: the machine's, divided by the cap
    cap: int
    budget_mb: float = float(DEFAULT_BUDGET_MB)  # madlib_mop.worker_memory_mb
    where: str = "this server"  # whose limits these are

    @property
    def total_mb(self) -> float:
        return self.base_mb + self.models_mb + self.buffers_mb

    def describe(self) -> str:
        return (f"each worker session needs about {self.total_mb:.0f} MB (TensorFlow "
                f"{self.base_mb:.0f}, models {self.models_mb:.2f}, buffers {self.buffers_mb:.2f}) "
                f"of the {self.share_mb:.0f} MB each of {self.where}'s {self.cap} may use")


def models_bytes(specs: list[training.ModelSpec], state_bytes: dict[int, int]) -> int:
    """What a worker holds for a job's models: STATE_COPIES of the largest state of each
    program key (`state_bytes`: mst_key -> a state's size)."""
    largest: dict[tuple, int] = {}
    for spec in specs:
        if spec.mst_key in state_bytes:
            largest[spec.program_key] = max(largest.get(spec.program_key, 0), state_bytes[spec.mst_key])
    return STATE_COPIES * sum(largest.values())


# Each optimizer's variables per trainable weight (Keras 3), for the estimate made before
# any state exists; one not listed counts none (the estimate is then a lower bound, and the
# states' real sizes are checked as they are made).
OPTIMIZER_SLOTS = {"Adam": 2, "AdamW": 2, "Adamax": 2, "Nadam": 2, "Adadelta": 2, "Ftrl": 2,
                   "Lamb": 2, "Adagrad": 1, "Lion": 1, "RMSprop": 1}


def estimated_state_bytes(config: dict, weight_bytes: int) -> int:
    """A configuration's state size from its weights' (`plan.check_models`) and its optimizer."""
    optimizer = training.ModelSpec.of(config).compile.optimizer
    arguments = optimizer.written_arguments()  # (as written: no Keras needed here)
    slots = OPTIMIZER_SLOTS.get(optimizer.name, 0)
    slots += bool(arguments.get("momentum")) + bool(arguments.get("amsgrad")) + bool(arguments.get("centered"))
    return weight_bytes * (1 + slots)


def budget_mb(plpy: Any) -> int:
    """madlib_mop.worker_memory_mb, or its default."""
    budget = settings.whole_number(plpy, BUDGET_SETTING, minimum=0, strict=False)
    return DEFAULT_BUDGET_MB if budget is None else budget


def estimate(plpy: Any, configs: list[dict], state_bytes: dict[int, int], packed_tables: list[str],
             use_caching: bool, limits: WorkerLimits | None = None) -> WorkerMemory:
    """`state_bytes`: mst_key -> its state's size, of the models known so far.  `limits`:
    of the server the workers run on (a segment server's), else this one's."""
    models = models_bytes([training.ModelSpec.of(c) for c in configs], state_bytes) / MB
    limits = limits or limits_here(plpy)
    budget = limits.budget_mb
    # A packed table is partitioned: its rows are in its partitions (foreign ones count 0).
    size = plpy.prepare("SELECT coalesce(sum(pg_catalog.pg_total_relation_size(relid)), 0) AS b "
                        "FROM pg_catalog.pg_partition_tree($1::regclass)", ["text"])
    data = sum(int(plpy.execute(size, [t])[0]["b"]) for t in packed_tables) / MB
    buffers = min(data, max(0.0, budget - models)) if use_caching else 0.0
    return WorkerMemory(float(server_slots.BASE_MB), models, buffers, limits.share_mb,
                        limits.cap, float(budget), limits.where)


def checked(plpy: Any, configs: list[dict], state_bytes: dict[int, int], packed_tables: list[str],
            use_caching: bool, servers: list[WorkerLimits]) -> WorkerMemory:
    """`estimate` for each server the workers run on (`servers`; none: this one), each
    checked (`check`): the one with the least room left."""
    needs = [estimate(plpy, configs, state_bytes, packed_tables, use_caching, limits)
             for limits in servers or [None]]
    for need in needs:
        check(need)
    return min(needs, key=lambda need: need.share_mb - need.total_mb)


def check(need: WorkerMemory) -> None:
    """Refuse a job whose models do not fit madlib_mop.worker_memory_mb, or whose worker
    sessions cannot fit their share of the server's memory."""
    # 0 is the knob that keeps no buffers (they are read per sub-epoch), not a bound.
    if need.budget_mb > 0 and need.models_mb > need.budget_mb:
        wanted = math.ceil(need.models_mb / 64) * 64 + 64  # the models, and room for buffers
        raise MadlibMopError(
            f"this job's models need about {need.models_mb:.0f} MB in each worker session, more "
            f"than {BUDGET_SETTING} ({need.budget_mb:.0f} MB)",
            sqlstate=errors.INSUFFICIENT_RESOURCES,
            detail=f"A worker holds about {STATE_COPIES} copies of the largest model state of "
                   "each program (architecture and optimizer): its variables, the state it "
                   "restores and the state it saves. " + need.describe() + ".",
            hint=f"SET {BUDGET_SETTING} = {wanted}; (each worker session may use "
                 f"{need.share_mb:.0f} MB in all, TensorFlow's {need.base_mb:.0f} included), or "
                 "train smaller models.")
    if need.total_mb <= need.share_mb:
        return
    raise MadlibMopError(
        f"this job's worker sessions would each need about {need.total_mb:.0f} MB; each of "
        f"{need.where}'s {need.cap} worker sessions may use {need.share_mb:.0f} MB",
        sqlstate=errors.INSUFFICIENT_RESOURCES,
        detail=need.describe(),
        hint="Train fewer or smaller architectures per job, lower madlib_mop.worker_memory_mb "
             "(buffers are then read per sub-epoch), or ask a superuser to lower "
             "madlib_mop.max_worker_sessions (fewer sessions, more memory each).")
