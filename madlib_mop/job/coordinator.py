"""The coordinator: the loop of one model selection job.

It runs in the backend of the session that called the fit.  Free segments get work (a
pending validation pass, else the sub-epoch the schedule gives them); results come back
from the engine's workers in any order; every finished sub-epoch is committed in the
store (new state and record together) before it counts; at each model's iteration
boundary the metrics are published, the searcher told and the pruner asked.  A failed
call is run again (`RetryPolicy`); a coordinator that dies leaves a job that `resume` (or
the same fit call again) continues from what the store holds.
"""

from __future__ import annotations

import contextlib
import os
import time
from typing import Any

from madlib_mop import errors
from madlib_mop.db import catalog, worker_session
from madlib_mop.engine.base import Engine, VisitRecord
from madlib_mop.engine.pool import WorkerPool
from madlib_mop.errors import MadlibMopError
from madlib_mop.job import fusing, metrics, outputs, schedule, steering
from madlib_mop.job.assignment import Task, WorkAssignment
from madlib_mop.job.worker_supply import WorkerSupply, wait_for_workers, warm_up
from madlib_mop.job.failures import DIVERGED, ModelFailures, RetryPolicy
from madlib_mop.job.progress import JobProgress
from madlib_mop.job.search_driver import JobSearch
from madlib_mop.job.keras_work import KerasWork
from madlib_mop.job.store import JobStore, ModelRecord
from madlib_mop import plpy_bridge


def start_pool(engine: Engine, segments: int) -> WorkerPool:
    """Up to one worker per segment (the server's pool may give fewer, or none: the job
    then waits for one), told to import TensorFlow at once (it takes seconds), so that this
    overlaps with the job's creation (a no-op for workers this session kept warm)."""
    pool = WorkerPool([])
    for worker in engine.training_workers(segments):
        warm_up(pool, pool.add(worker), segments)
    return pool


def interruption_point(plpy: Any, can_commit: bool) -> None:
    """A query lets PostgreSQL act on a cancel or terminate request for this session; a
    CALL commits what it did so far."""
    plpy.execute("SELECT 1")
    if can_commit:
        commit_call(plpy)


def commit_call(plpy: Any) -> None:
    """CALL fit_multiple commits as it goes, so that it holds no snapshot for hours."""
    try:
        plpy.commit()
        plpy_bridge.renew_pin(plpy)
    except plpy.SPIError as error:
        # Only "invalid transaction termination" says the CALL runs in a transaction
        # block; a cancel request acted on at the commit is an interruption, as elsewhere.
        if getattr(error, "sqlstate", None) != errors.INVALID_TRANSACTION_TERMINATION:
            raise
        raise MadlibMopError(
            "CALL fit_multiple cannot run inside a transaction block", sqlstate=errors.ACTIVE_SQL_TRANSACTION,
            hint="Run CALL outside BEGIN ... COMMIT, or use SELECT "
                 "madlib_keras_fit_multiple_model(...).") from None


def state_for_call(engine: Engine, store: JobStore, mst_key: int, step: int) -> bytes | None:
    """What a call is given of the model's state: nothing when the engine's workers read the
    job's store themselves (they run on this server) or when the model's current state is
    kept on a segment server (its worker fetches it, `engine.segment_states`), else its
    bytes."""
    elsewhere = store.states.hops.elsewhere
    if engine.stores_states:
        return None
    # A state the model has left since is carried when this server has a copy (the durable
    # one, which validation keeps), never read from a segment server in the loop's thread.
    if elsewhere is not None and elsewhere.locate(mst_key, step) is not None and (
            elsewhere.current(mst_key, step) or not store.states.available(mst_key, step)):
        return None
    return store.state_at(mst_key, step)


def kept_elsewhere(engine: Engine, plpy: Any, job: Any, retry: RetryPolicy) -> Any:
    """Where the states that segment servers keep are read from (None: the workers' store is
    this server's); it waits for a segment server as the segments' calls do."""
    elsewhere = engine.kept_states(plpy, job)
    if elsewhere is not None:
        elsewhere.wait_seconds = retry.wait_seconds
    return elsewhere


class Coordinator:
    """One job's loop, in the calling session's backend (the module's docstring): workers through
    the pool, records through the store, decisions through its search, NOTICEs through its progress."""

    def __init__(self, plpy: Any, job_id: int, can_commit: bool, engine: Engine,
                 pool: WorkerPool | None = None):
        self.plpy, self.can_commit, self.engine, self.pool = plpy, can_commit, engine, pool
        self.store = JobStore(worker_session.conninfo(plpy), catalog.extension_schema_name(plpy), job_id)
        self.job, self.job_id = self.store.job, job_id
        self.args, self.S = self.job.arguments, self.job.num_segments
        self.partitions = self.job.validation_partitions or 0
        self.retry = RetryPolicy.for_job(plpy, job_id)
        self._notice = lambda text: plpy.notice(f"madlib_keras_fit_multiple_model: {text}")

    def run(self) -> None:
        self._start()
        try:
            while self._dispatch():
                outcome = self.pool.next_result(timeout=1.0)
                interruption_point(self.plpy, self.can_commit)
                if outcome is not None:
                    self._handle(*outcome)
                self.steering.poll()
                self.supply.adjust(self.work.running)
        except BaseException:
            self.pool.stop()
            raise
        self.pool.release()  # idle now: the sessions stay warm for this session's next job
        self.engine.keep_idle(self.pool.workers(), self.S)
        self._finish()

    # ---- the loop's steps ----
    def _start(self) -> None:
        self.store.states.hops.elsewhere = kept_elsewhere(self.engine, self.plpy, self.job, self.retry)
        self.models: dict[int, ModelRecord] = self.store.load_models()
        requests = steering.resumed(self.store, self.models)  # a person's, applied as before
        rounds = {m.mst_key: m.iterations * m.epochs for m in self.models.values()}
        added, clones = steering.added(requests), steering.clone_sources(requests, self.models, self.job)
        self.initial = set(schedule.started_with(rounds, self.args.initial_models, added))
        self.schedule = schedule.dispatcher_for(rounds, {k: len(m.visits) for k, m in self.models.items()},
                                                self.S, self.job.seed, self.args.initial_models, added,
                                                fusing.path_classes(self.job), clones)
        self.started_epoch = self.store.mark_running(os.getpid())
        self.search = JobSearch(self.plpy, self.store, self.engine, self.models, self.schedule, bool(self.partitions),
                                self._notice, KerasWork.for_job(lambda: self.pool, self.engine, self.plpy))
        self.steering = steering.JobSteering(self.plpy, self.store, requests, self._notice,
                                             models=self.models, dispatcher=self.schedule,
                                             search=self.search, engine=self.engine, events=self)
        self.failures = ModelFailures(self.store, self._notice, events=self)
        for mst_key in self.failures.lost:  # diverged before the job was resumed
            self.schedule.stop(mst_key)
            self.search.lost(mst_key)
        self.work = WorkAssignment(self.schedule, self.S, self.job_id, lambda k: state_for_call(
            self.engine, self.store, k, len(self.models[k].visits)))
        self.progress = JobProgress(self.models, self.schedule, self.S, max(rounds.values()),
                                    self.search.stopped, self.failures,
                                    self.search.searcher is not None or self.search.pruning,
                                    self._notice)
        if self.can_commit:
            commit_call(self.plpy)
        for model in list(self.models.values()):
            finished = len(model.visits) // model.per_iteration
            for iteration in range(1, finished + 1):
                self.queue_evals(model, iteration)
            self.publish(model)
            iteration, within = divmod(len(model.visits), model.per_iteration)
            if (not within and self.search.decided_at(iteration)
                    and not self.search.decisions.has(model.mst_key, iteration)):
                self.schedule.hold(model.mst_key)  # its validation, then the decision, come first
        self.search.ask()
        self.progress.report_to(self.store)
        self.engine.prepare_job(self.plpy, self.job, self.store.model_rows)
        if self.pool is None:
            self.pool = start_pool(self.engine, self.S)
        if not self.pool.live():
            wait_for_workers(self.plpy, self.store, self.engine, self.pool, self.S,
                             lambda: interruption_point(self.plpy, self.can_commit), self._notice)
        self.schedule.fuse(fusing.job_classes(self.plpy, self.job, self.engine, self.initial,
                                              self.store.model_rows, self.search.keras, self.steering.clones))
        self.store.running_on(len(self.pool.live()))
        self.supply = WorkerSupply(self.plpy, self.store, self.engine, self.pool, self.S)
        for index, thread in enumerate(self.pool.threads):
            thread.worker.rename(f"madlib_mop worker job {self.job_id} #{index}")

    def _dispatch(self) -> bool:
        """Give free workers work; False when nothing runs or is left (held models go on then)."""
        return self.work.dispatch(self.pool) or (self.search.decisions.release_all() and self._dispatch()) \
            or (self.steering.poll(now=True) and self._dispatch())

    def _handle(self, task: Task, value: Any, error: BaseException | None) -> None:
        self.work.ended(task)
        if task.kind == "evaluate" and not task.fused and task.mst_key in self.failures:  # lost since
            return
        if error is not None:  # run again, or its models are lost
            where = lambda: self.pool.threads[task.worker].worker.where  # noqa: E731
            return self.failures.call_failed(task, error, self.retry, where, self.plpy.notice, self.models,
                                             self.schedule, self.work)
        self.retry.answered(task.segment)
        if task.kind == "evaluate":  # a fused pass's models (lost ones too) commit together
            with self.store.atomic() if task.fused else contextlib.nullcontext():
                for one, result in zip(task.each(), value if task.fused else [value]):
                    self._evaluated(one, result)
            return self.search.ask()
        # A fused call's models (lost ones too) commit together: a resumed job fuses them alike.
        with self.store.atomic() if task.fused else contextlib.nullcontext():
            trained = [(one, result, self._trained(one, new_state, result))
                       for one, (new_state, result) in zip(task.each(), value if task.fused else [value])]
            trained = [(one, result, boundary) for one, result, boundary in trained if boundary is not None]
            if any(boundary is False for *_, boundary in trained):  # not where the pruner decides:
                self._dispatch()  # the segment's next sub-epoch starts while this one is recorded
            # The results, the outputs they change (at an iteration's end), the progress.
            with self.store.atomic(pipelined=True):
                for one, result, boundary in trained:
                    model = self.models[one.mst_key]
                    self.store.record_visit(one.mst_key, one.step, one.segment, result)
                    if boundary:
                        self.queue_evals(model, (one.step + 1) // model.per_iteration)
                        self.publish(model)
                self.progress.report_to(self.store)
        self.search.ask()
        for one, _, boundary in trained:
            self.store.states.visit_recorded(one.mst_key, one.step, self.models[one.mst_key].per_iteration)
            self.progress.after_visit()
            if boundary:  # a person's requests that wait for the model to end an iteration
                self.steering.apply(one.mst_key)

    def _evaluated(self, task: Task, value: dict) -> None:
        """A model's validation pass on one partition came back."""
        model = self.models[task.mst_key]
        if task.mst_key in self.failures or (task.step, task.partition) in model.evals:
            return  # lost since, or (a fused pass of a resumed job) recorded before
        if value.get("diverged"):
            return self.failures.lose(task, model, DIVERGED, value["diverged"], self.schedule, self.work)
        with self.store.atomic(pipelined=True):
            self.store.record_eval(task.mst_key, task.step, task.partition, value)
            model.evals[(task.step, task.partition)] = value
            self.publish(model)
            self.progress.report_to(self.store)

    def _trained(self, task: Task, new_state: bytes | None, result: VisitRecord) -> bool | None:
        """A model's sub-epoch came back: did it end an iteration (None: the model is lost)?"""
        model = self.models[task.mst_key]
        if task.mst_key in self.failures:  # lost while it trained (its validation)
            self.schedule.retry(task.mst_key, task.segment)
            self.schedule.stop(task.mst_key)
            return None
        if result.diverged:
            self.failures.lose(task, model, DIVERGED, result.diverged, self.schedule, self.work)
            return None
        model.visits[task.step] = result.as_dict()
        if new_state is not None:  # a segment server's worker sent it back
            self.store.states.hops.write(task.mst_key, task.step + 1, new_state)
        self.schedule.finish(task.mst_key, task.segment, result.seconds["total"])
        boundary = (task.step + 1) % model.per_iteration == 0
        if boundary and self.search.decided_at((task.step + 1) // model.per_iteration):
            # The pruner decides once its validation is done; the model waits (no extra work).
            self.schedule.hold(task.mst_key)
        return boundary

    # ---- JobEvents (`job.events`): what the coordinator's parts tell it ----
    def report_progress(self) -> None:
        self.progress.report_to(self.store)

    def model_lost(self, mst_key: int) -> None:
        self.search.lost(mst_key)

    def queue_evals(self, model: ModelRecord, iteration: int) -> None:
        due = lambda of, step: metrics.due_at(step, of.per_iteration,  # noqa: E731
                                              self.args.metrics_compute_frequency, of.iterations,
                                              self.search.also_due)
        step = iteration * model.per_iteration
        if self.partitions and due(model, step):
            self.work.queue_evals(self.models, model, step, self.partitions, self.failures, due,
                                  lambda key, at: state_for_call(self.engine, self.store, key, at))

    def publish(self, model: ModelRecord) -> None:
        """Bring the model's output rows up to date, then hand its new reports to search."""
        curves = metrics.curves(model.visits, model.evals, self.S, model.epochs, self.args.metrics_compute_frequency,
                                model.iterations, self.partitions, self.started_epoch, self.search.also_due)
        outputs.publish(self.store, model, curves, self.partitions, self.args.single)
        finished = len(model.visits) // model.per_iteration
        if not finished:
            return
        self.store.states.iteration_done(model, finished * model.per_iteration,
                                         self.work.steps_needed(model.mst_key))
        self.search.decisions.report_curves(model.mst_key, curves, bool(self.partitions))

    def _finish(self) -> None:
        self.steering.finish()
        self.progress.report_to(self.store)
        self.failures.check_at_end(len(self.models), self.plpy.warning)
        outputs.finish(self.store)
        self.search.keep_best(self.partitions)
        self.store.finish()
        self._notice(f"job {self.job_id} finished: {len(self.models)} models in "
                     f"{time.monotonic() - self.progress.started:.1f}s; results in "
                     f"{self.store.display('output')}, {self.store.display('info')}")

    def close(self, error: BaseException | None = None) -> None:
        self.store.close(error)
