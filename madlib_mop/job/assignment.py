"""Which worker runs what next: a job's calls (sub-epochs and validation passes) given to
its free worker sessions.

A job may have fewer workers than segments (the server's pool of worker sessions is capped,
`engine.server_slots`; `job.worker_supply` gets the job its workers): a free worker then
serves any segment whose data it may read (on this server, every one), preferring the
segment it served last, whose buffers it holds decoded.  Which worker runs a call never
changes its result (the contract of `engine.base.Worker`), so the weights are the same bits
on any number of workers.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from typing import Callable

from madlib_mop.engine.base import Worker
from madlib_mop.engine.pool import WorkerPool
from madlib_mop.job import schedule


@dataclass
class Task:
    kind: str  # "train" or "evaluate"
    mst_key: int  # a fused call's: its first model's
    step: int
    segment: int  # where it runs: the segment whose server (and, training, whose data) it needs
    partition: int  # the data partition it reads (= segment when training)
    state: bytes | None  # the model's state after `step` sub-epochs (None: the worker finds it)
    attempt: int = 1
    worker: int = -1  # the pool's index of the worker running it
    fused: tuple[int, ...] = ()  # a fused call's models (`schedule`)
    steps: tuple[int, ...] = ()  # a fused call's: each model's own step (a clone's is not its source's)
    states: tuple[bytes | None, ...] = ()  # a fused call's: each model's, as `state`

    def __call__(self, worker: Worker, job_id: int):
        if self.fused and self.kind == "evaluate":
            return worker.evaluate_fused(job_id, self.fused, self.steps, self.partition, self.states)
        if self.fused:
            return worker.train_fused(job_id, self.fused, self.steps, self.partition, self.states)
        if self.kind == "train":
            return worker.train(job_id, self.mst_key, self.step, self.partition, self.state)
        return worker.evaluate(job_id, self.mst_key, self.step, self.partition, self.state)

    def each(self) -> list["Task"]:
        """One task per model it trains (a fused call's models; else itself)."""
        states = self.states or (None,) * len(self.fused)
        return [dataclasses.replace(self, mst_key=key, step=step, fused=(), steps=(), states=(), state=state)
                for key, step, state in zip(self.fused, self.steps, states)] or [self]

    def step_of(self, mst_key: int) -> int:
        """The step of one of its models."""
        return self.steps[self.fused.index(mst_key)] if self.fused else self.step


class WorkAssignment:
    """The job's calls in flight (by worker), validation passes waiting for a worker,
    segments paused after a lost session, and the attempt numbers of retried visits."""

    def __init__(self, dispatcher: schedule.Dispatcher, segments: int, job_id: int,
                 state_of: Callable[[int], bytes | None]):
        self.schedule, self.S, self.job_id, self.state_of = dispatcher, segments, job_id, state_of
        self.running: dict[int, Task] = {}  # worker index -> its call
        self.pending_evals: list[Task] = []
        self.paused_until: dict[int, float] = {}  # segment -> when it may be called again
        self.attempts: dict[tuple[int, int], int] = {}  # (mst_key, step) -> next attempt
        self.last_segment: dict[int, int] = {}  # worker index -> the segment it served last

    def dispatch(self, pool: WorkerPool) -> bool:
        """Give every free worker work; False when nothing runs and nothing is waiting."""
        now = time.monotonic()
        busy = {task.segment for task in self.running.values()}
        for index in pool.live():
            if index in self.running:
                continue
            for segment in self._segments_for(pool, index, busy, now):
                task = self._task_on(segment)
                if task is not None:
                    task.worker = index
                    self.running[index] = task
                    self.last_segment[index] = segment
                    busy.add(segment)
                    pool.submit(index, task, lambda worker, t=task: t(worker, self.job_id))
                    break
        return bool(self.running) or bool(self.paused_until)

    def _segments_for(self, pool: WorkerPool, index: int, busy: set[int], now: float) -> list[int]:
        worker = pool.threads[index].worker
        free = []
        for segment in range(self.S):
            # (busy in the schedule too: a fused call's models are recorded one by one)
            if segment in busy or segment in self.schedule.busy_segments or not worker.serves(segment):
                continue
            if self.paused_until.get(segment, now) > now:
                continue
            self.paused_until.pop(segment, None)
            free.append(segment)
        last = self.last_segment.get(index, index)
        return sorted(free, key=lambda s: (s != last, s))

    def _task_on(self, segment: int) -> Task | None:
        task = next((t for t in self.pending_evals if t.segment == segment), None)
        if task is not None:
            self.pending_evals.remove(task)
            return task
        given = self.schedule.next_visit(segment)
        if given is None:
            return None
        models, step = given
        if len(models) > 1:
            return Task("train", models[0], step, segment, segment, None,
                        self.attempts.get((models[0], step), 1), fused=models,
                        steps=tuple(self.schedule.step_of(m, models[0], step) for m in models),
                        states=tuple(self.state_of(m) for m in models))
        return Task("train", models[0], step, segment, segment, self.state_of(models[0]),
                    self.attempts.get((models[0], step), 1))

    def ended(self, task: Task) -> None:
        del self.running[task.worker]

    def drop_model(self, mst_key: int) -> None:
        """A lost model's validation passes are not run; a fused one still is, with the
        model in it: its partners' results depend on the models they are evaluated with."""
        self.pending_evals = [t for t in self.pending_evals if t.fused or t.mst_key != mst_key]

    def steps_needed(self, mst_key: int) -> list[int]:
        """The steps of the model's states that validation passes still need."""
        return [t.step_of(mst_key) for t in self.pending_evals + list(self.running.values())
                if t.kind == "evaluate" and mst_key in (t.fused or (t.mst_key,))]

    def queue_evals(self, models: dict, model, step: int, partitions: int, lost,
                    due: Callable[[object, int], bool], state: Callable[[int, int], bytes | None]) -> None:
        """The validation passes of `model` (a `store.ModelRecord` of `models`) after `step`
        sub-epochs that are not recorded: with its partners (`eval_partners`) one fused pass
        per partition, queued once for all of them; else its own.  Each is given
        `state(mst_key, step)` (None: its worker finds it)."""
        step_of = lambda k: self.schedule.step_of(k, model.mst_key, step)  # noqa: E731
        partners = eval_partners(models, model, step, due, step_of)
        if len(partners) > 1:
            steps = tuple(step_of(k) for k in partners)
            queued = {t.partition for t in self.pending_evals + list(self.running.values())
                      if t.kind == "evaluate" and t.fused == partners and t.steps == steps}
            missing = {p for k, own in zip(partners, steps) if k not in lost for p in range(partitions)
                       if (own, p) not in models[k].evals and p not in queued}
            states = tuple(state(k, own) for k, own in zip(partners, steps)) if missing else ()
            self.pending_evals += [Task("evaluate", partners[0], steps[0], p % self.S, p, None,
                                        fused=partners, steps=steps, states=states)
                                   for p in sorted(missing)]
            return
        missing = [p for p in range(partitions) if (step, p) not in model.evals]
        given = state(model.mst_key, step) if missing else None
        self.pending_evals += [Task("evaluate", model.mst_key, step, p % self.S, p, given) for p in missing]


def eval_partners(models: dict, model, step: int, due: Callable[[object, int], bool],
                  step_of: Callable[[int], int]) -> tuple[int, ...]:
    """The models a validation pass of `model` after `step` sub-epochs evaluates with, as
    one program: of the fused call that trained its last sub-epoch (`VisitRecord.fused_with`),
    those whose visit counted and whose validation is `due` then (it among them), else
    itself.  `step_of(k)`: partner k's own step then (a clone's differs).  Decided from the
    recorded visits alone, so a resumed job evaluates with the same partners (a model's
    bits depend on them)."""
    fused_with = (model.visits.get(step - 1) or {}).get("fused_with") or ()
    partners = tuple(k for k in fused_with if k in models and (step_of(k) - 1) in models[k].visits
                     and due(models[k], step_of(k)))
    return partners if model.mst_key in partners else (model.mst_key,)

