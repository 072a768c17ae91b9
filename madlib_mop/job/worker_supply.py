"""A job's worker sessions from the server's pool (`engine.server_slots`): waiting in the
queue for a first one, taking free slots up to one worker per segment as they come, and
giving one back while other calls wait, so that every waiting job gets a turn.

Which workers a job has never changes its results (`job.assignment`), so they may come
and go at any hop.
"""

from __future__ import annotations

import time
from typing import Any, Callable

from madlib_mop.engine import server_slots
from madlib_mop.engine.base import Engine
from madlib_mop.engine.pool import WorkerPool
from madlib_mop.errors import MadlibMopError
from madlib_mop.job.store import JobStore

ADJUST_SECONDS = 2.0  # how often a running job looks at the queue


def warm_up(pool: WorkerPool, index: int, segments: int) -> None:
    pool.submit(index, None, lambda worker: worker.warm_up(segments), report=False)


def wait_for_workers(plpy: Any, store: JobStore, engine: Engine, pool: WorkerPool, segments: int,
                     interruption: Callable[[], None], notice: Callable[[str], None]) -> None:
    """The job has no worker: it waits in the server's queue, shown as 'queued' with its
    position, until it is its turn (`server_slots.wait_in_queue`)."""
    def shown(position: int, cap: int, first: bool, elsewhere: int) -> None:
        store.queued(position)
        taken = engine.waiting_for() or server_slots.taken_text(cap, elsewhere)
        notice(f"job {store.job_id} is queued for a worker session (position {position}; {taken})" if first else
               f"job {store.job_id}: queue position {position}")

    try:
        workers = server_slots.wait_in_queue(
            plpy, store.conninfo, store.schema_name, store.job_id, segments,
            lambda n: engine.new_workers(n, 0), shown, interruption,
            hint=f"CALL {store.schema_name}.resume({store.job_id}) later")
    except MadlibMopError as error:
        error.message = f"job {store.job_id} {error.message}"
        raise
    for worker in workers:
        warm_up(pool, pool.add(worker), segments)


class WorkerSupply:
    """A running job's workers as the queue changes: while other calls wait, a job with
    more than one worker gives one back (the first that is free); while none waits, a job
    with fewer workers than segments takes free slots."""

    def __init__(self, plpy: Any, store: JobStore, engine: Engine, pool: WorkerPool, segments: int):
        self.plpy, self.store, self.engine, self.pool, self.S = plpy, store, engine, pool, segments
        self.looked = time.monotonic()

    def adjust(self, running: dict) -> None:
        """`running`: the job's calls in flight, by worker index."""
        if not self.engine.pooled or time.monotonic() - self.looked < ADJUST_SECONDS:
            return
        self.looked = time.monotonic()
        live = self.pool.live()
        if server_slots.waiting_calls(self.plpy):
            idle = [index for index in live if index not in running]
            if len(live) > 1 and idle:
                self.pool.retire(idle[-1])
                self.store.running_on(len(live) - 1)
        elif len(live) < self.S:
            added = self.engine.new_workers(self.S - len(live), len(self.pool.threads))
            for worker in added:
                warm_up(self.pool, self.pool.add(worker), self.S)
            if added:
                self.store.running_on(len(live) + len(added))
