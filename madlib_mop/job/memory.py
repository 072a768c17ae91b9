"""What one worker session of a job needs in memory, estimated before the job starts.

A worker holds TensorFlow and Keras (`server_pool.BASE_MB`), one compiled program per
program key with its variables, and for each call the state it restores and the state it
captures: about three copies of the largest state of each key.  It caches decoded buffers
up to madlib_mop.worker_memory_mb (the rest are read per sub-epoch).  The server's memory
for worker sessions (`server_pool.MEMORY_FRACTION` of the machine's) is shared by the cap:
a job whose workers would need more than that share is refused before it is created.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from madlib_mop import errors
from madlib_mop.db import settings
from madlib_mop.engine import server_pool
from madlib_mop.errors import MadlibMopError
from madlib_mop.runtime import training

MB = 1024 * 1024
STATE_COPIES = 3  # the program's variables, the state restored, the state captured
DEFAULT_BUDGET_MB = 4096  # madlib_mop.worker_memory_mb's default (segment.worker)


@dataclass(frozen=True)
class WorkerMemory:
    base_mb: float  # TensorFlow and Keras
    models_mb: float  # programs and states
    buffers_mb: float  # decoded buffers kept
    share_mb: float  # what one worker session may count on: the machine's, divided by the cap
    cap: int

    @property
    def total_mb(self) -> float:
        return self.base_mb + self.models_mb + self.buffers_mb

    def describe(self) -> str:
        return (f"each worker session needs about {self.total_mb:.0f} MB (TensorFlow "
                f"{self.base_mb:.0f}, models {self.models_mb:.2f}, buffers {self.buffers_mb:.2f}) "
                f"of the {self.share_mb:.0f} MB each of this server's {self.cap} may use")


def estimate(plpy: Any, configs: list[dict], states: dict[int, bytes], packed_tables: list[str],
             use_caching: bool) -> WorkerMemory:
    largest: dict[tuple, int] = {}
    for config in configs:
        key = training.ModelSpec.of(config).program_key
        largest[key] = max(largest.get(key, 0), len(states[config["mst_key"]]))
    models = STATE_COPIES * sum(largest.values()) / MB
    budget = settings.whole_number(plpy, "madlib_mop.worker_memory_mb", minimum=0, strict=False)
    # A packed table is partitioned: its rows are in its partitions (foreign ones count 0).
    size = plpy.prepare("SELECT coalesce(sum(pg_catalog.pg_total_relation_size(relid)), 0) AS b "
                        "FROM pg_catalog.pg_partition_tree($1::regclass)", ["text"])
    data = sum(int(plpy.execute(size, [t])[0]["b"]) for t in packed_tables) / MB
    buffers = min(data, DEFAULT_BUDGET_MB if budget is None else budget) if use_caching else 0.0
    cap = server_pool.cap(plpy)
    return WorkerMemory(float(server_pool.BASE_MB), models, buffers, server_pool.slot_share_mb(cap), cap)


def check(need: WorkerMemory) -> None:
    """Refuse a job whose worker sessions cannot fit their share of the server's memory."""
    if need.total_mb <= need.share_mb:
        return
    raise MadlibMopError(
        f"this job's worker sessions would each need about {need.total_mb:.0f} MB; each of this "
        f"server's {need.cap} worker sessions may use {need.share_mb:.0f} MB",
        sqlstate=errors.INSUFFICIENT_RESOURCES,
        detail=need.describe(),
        hint="Train fewer or smaller architectures per job, lower madlib_mop.worker_memory_mb "
             "(buffers are then read per sub-epoch), or ask a superuser to lower "
             "madlib_mop.max_worker_sessions (fewer sessions, more memory each).")
