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

import os
import time
from dataclasses import dataclass
from typing import Any

import psycopg

from madlib_mop import errors
from madlib_mop.db import catalog, settings, worker_session
from madlib_mop.engine.base import Engine, Worker, failure_sqlstate
from madlib_mop.engine.pool import WorkerPool
from madlib_mop.errors import MadlibMopError
from madlib_mop.job import metrics, outputs, plan, schedule
from madlib_mop.job.store import JobStore, ModelRecord
from madlib_mop import plpy_bridge
from madlib_mop.runtime import training
from madlib_mop.grammar.model_config import Config
from madlib_mop.search import setup
from madlib_mop.search.base import Decision, NoPruner, Pruner, Report, Searcher


@dataclass
class Task:
    kind: str  # "train" or "evaluate"
    mst_key: int
    step: int
    segment: int  # the worker that runs it
    partition: int  # the data partition it reads (= segment when training)
    state: bytes  # the model's state after `step` sub-epochs
    attempt: int = 1

    def __call__(self, worker: Worker, job_id: int):
        if self.kind == "train":
            return worker.train(job_id, self.mst_key, self.step, self.partition, self.state)
        return worker.evaluate(job_id, self.mst_key, self.step, self.partition, self.state)


def start_pool(engine: Engine, segments: int) -> WorkerPool:
    """One worker per segment, told to import TensorFlow at once (it takes seconds), so that
    this overlaps with the job's creation (a no-op for workers this session kept warm)."""
    pool = WorkerPool(engine.training_workers(segments))
    for index in range(segments):
        pool.submit(index, None, lambda worker: worker.warm_up(segments), report=False)
    return pool


class RetryPolicy:
    """A failed call runs again on a fresh session, up to MAX_ATTEMPTS times; errors that
    a retry cannot fix (the data, the model, privileges, authentication) end the job.

    A lost session (its server stopped, restarted or cut off: no SQLSTATE, class 08 or
    57P0x) makes the segment wait, retrying with back-off, until its server answers again
    or `madlib_mop.segment_wait_seconds` have passed; then the job stops with an error
    naming the server and stays resumable.  A session that could not be opened is no
    attempt of the call; one lost during the call is (a call that crashes its server is not
    run for ever)."""

    MAX_ATTEMPTS = 3
    FINAL_CLASSES = ("22", "42", "0A", "28")
    LOST_STATES = ("57P01", "57P02", "57P03")
    WAIT_SETTING = "madlib_mop.segment_wait_seconds"
    DEFAULT_WAIT_SECONDS = 300
    MAX_DELAY = 10.0

    def __init__(self, job_id: int, schema: str, wait_seconds: float = DEFAULT_WAIT_SECONDS):
        self.job_id, self.schema, self.wait_seconds = job_id, schema, wait_seconds
        self.lost_since: dict[int, tuple[float, int]] = {}  # segment -> (first loss, losses)

    @staticmethod
    def message(error: BaseException) -> str:
        return str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__

    @classmethod
    def lost(cls, error: BaseException) -> bool:
        sqlstate = failure_sqlstate(error)
        if sqlstate is None:
            return isinstance(error, psycopg.OperationalError)
        return sqlstate[:2] == "08" or sqlstate in cls.LOST_STATES

    @classmethod
    def connecting(cls, error: BaseException) -> bool:
        """The session could not be opened: the call did not run."""
        sqlstate = failure_sqlstate(error)
        return sqlstate == "57P03" or (isinstance(error, MadlibMopError)
                                      and sqlstate == errors.CONNECTION_FAILURE)

    def answered(self, segment: int) -> None:
        self.lost_since.pop(segment, None)

    def delay(self, task: Task, where: str, message: str) -> float:
        """Seconds to wait before the segment's next call; raises once it waited too long."""
        since, losses = self.lost_since.get(task.segment, (time.monotonic(), 0))
        self.lost_since[task.segment] = (since, losses + 1)
        if time.monotonic() - since > self.wait_seconds:
            raise MadlibMopError(
                f"job {self.job_id}: {where} has not answered for {self.wait_seconds:g}s "
                f"(segment {task.segment}): {message}",
                sqlstate=errors.CONNECTION_FAILURE,
                hint=f"When it is back, CALL {self.schema}.resume({self.job_id}); finished "
                     f"sub-epochs are kept. SET {self.WAIT_SETTING} to wait longer.")
        return 0.0 if losses == 0 else min(self.MAX_DELAY, 0.5 * 2 ** losses)

    def check(self, task: Task, error: BaseException, message: str) -> None:
        """Raises if the job cannot go on."""
        sqlstate = failure_sqlstate(error)
        final = sqlstate is not None and sqlstate[:2] in self.FINAL_CLASSES
        if task.attempt >= self.MAX_ATTEMPTS or final:
            raise MadlibMopError(
                f"job {self.job_id}: {task.kind} of mst_key {task.mst_key} on segment "
                f"{task.segment} failed {task.attempt} times: {message}",
                sqlstate=sqlstate if final else errors.DATA_EXCEPTION,
                hint=f"Fix the cause, then CALL {self.schema}.resume({self.job_id}); finished "
                     "sub-epochs are kept.")


class Coordinator:
    def __init__(self, plpy: Any, job_id: int, can_commit: bool, engine: Engine,
                 pool: WorkerPool | None = None):
        self.plpy, self.can_commit, self.engine, self.pool = plpy, can_commit, engine, pool
        self.store = JobStore(worker_session.conninfo(plpy), catalog.extension_schema_name(plpy), job_id)
        self.job, self.job_id = self.store.job, job_id
        self.args, self.S = self.job["arguments"], self.job["num_segments"]
        self.partitions = self.job["validation_partitions"] or 0
        wait = settings.whole_number(plpy, RetryPolicy.WAIT_SETTING, minimum=0)
        self.retry = RetryPolicy(job_id, catalog.extension_schema(plpy),
                                 RetryPolicy.DEFAULT_WAIT_SECONDS if wait is None else wait)
        self.paused_until: dict[int, float] = {}  # segment -> when it may be called again
        self.attempts: dict[tuple[int, int], int] = {}
        self.running: dict[int, Task] = {}
        self.pending_evals: list[Task] = []
        self.stopped: dict[int, tuple[int, str]] = {}  # mst_key -> (iteration, why)

    def run(self) -> None:
        self._start()
        try:
            while self._dispatch():
                outcome = self.pool.next_result(timeout=1.0)
                self._check_interrupts()
                if outcome is not None:
                    self._handle(*outcome)
        except BaseException:
            self.pool.stop()
            raise
        self.pool.release()  # idle now: the sessions stay warm for this session's next job
        self._finish()

    # ---- the loop's steps ----
    def _start(self) -> None:
        self.models: dict[int, ModelRecord] = self.store.load_models()
        iterations = self.args["num_iterations"]
        rounds = {m.mst_key: iterations * m.epochs for m in self.models.values()}
        # Models a searcher added while the job ran have orders of their own (drawn the same
        # whenever they are added), so that a resumed job gives every model the orders it had.
        initial = [k for k in self.models if k <= self.args.get("initial_models", k)]
        orders = schedule.visit_orders(initial, self.S, max(rounds[k] for k in initial), self.job["seed"])
        for key in set(self.models) - set(initial):
            orders[key] = schedule.added_model_orders(key, self.S, rounds[key], self.job["seed"])
        self.schedule = schedule.Dispatcher({k: o[: rounds[k]] for k, o in orders.items()}, self.S,
                                            {k: len(m.visits) for k, m in self.models.items()})
        self.epochs = max(rounds.values())
        self.started, self.done_at_start = time.monotonic(), self._done()
        self.started_epoch = self.store.mark_running(os.getpid())
        self.searcher, self.pruner, self.objective = setup.search_of_job(self.args, {
            k: m.compile_params for k, m in self.models.items()}, bool(self.partitions))
        self.pruner.start(sorted(self.models))
        self.also_due = frozenset(self.pruner.required_iterations())
        self.asked = 0  # configurations the searcher proposed in this run
        self.decisions = SearchDecisions(self.searcher, self.pruner, self.schedule, self._decided)
        # Jobs that stop or add models show progress in tenths of the work (no common epoch).
        self.pruning = not isinstance(self.pruner, NoPruner)
        self.searching = self.searcher is not None or self.pruning
        self.reported_epoch = (10 * self._done() // self.schedule.planned_total() if self.searching
                               else min(len(m.visits) for m in self.models.values()) // self.S)
        if self.can_commit:
            self._commit()
        for model in list(self.models.values()):
            finished = len(model.visits) // model.per_iteration
            for iteration in range(1, finished + 1):
                self._queue_evals(model, iteration, None)
            self._publish(model)
            iteration, within = divmod(len(model.visits), model.per_iteration)
            if not within and self._decided_at(iteration) and not self.decisions.has(model.mst_key, iteration):
                self.schedule.hold(model.mst_key)  # its validation, then the decision, come first
        self._ask()
        self.store.progress(self._done(), self.schedule.planned_total(), self._counts())
        self.engine.prepare_job(self.plpy, self.job, self.store.model_rows())
        if self.pool is None:
            self.pool = start_pool(self.engine, self.S)
        for index, thread in enumerate(self.pool.threads):
            thread.worker.rename(f"madlib_mop worker job {self.job_id} segment {index}")

    def _dispatch(self) -> bool:
        """Give every free segment work; False when nothing runs and nothing is left."""
        now = time.monotonic()
        for segment in range(self.S):
            if segment in self.running:
                continue
            if self.paused_until.get(segment, now) > now:
                continue
            self.paused_until.pop(segment, None)
            task = next((t for t in self.pending_evals if t.segment == segment), None)
            if task is not None:
                self.pending_evals.remove(task)
            elif (given := self.schedule.next_visit(segment)) is not None:
                mst_key, step = given
                task = Task("train", mst_key, step, segment, segment, self.models[mst_key].state,
                            self.attempts.get(given, 1))
            if task is not None:
                self.running[segment] = task
                self.pool.submit(segment, task, lambda worker, t=task: t(worker, self.job_id))
        if not self.running and not self.paused_until and self.decisions.release_all():
            return self._dispatch()  # no report can come: held models go on
        return bool(self.running) or bool(self.paused_until)

    def _handle(self, task: Task, value: Any, error: BaseException | None) -> None:
        del self.running[task.segment]
        if error is not None:
            return self._failed(task, error)
        self.retry.answered(task.segment)
        model = self.models[task.mst_key]
        boundary = False  # the hop completed one of the model's iterations
        if task.kind == "train":
            new_state, result = value
            model.visits[task.step], model.state = result.as_dict(), new_state
            self.schedule.finish(task.mst_key, task.segment, result.seconds["total"])
            completed = task.step + 1
            boundary = completed % model.per_iteration == 0
            iteration = completed // model.per_iteration
            if boundary and self._decided_at(iteration):
                # The pruner decides on this iteration's report, once its validation is done:
                # until then the model trains no further (a model it stops has no extra work).
                self.schedule.hold(task.mst_key)
            if not boundary:
                # The segment's next sub-epoch starts while this one is recorded.  Its
                # result is handled after this one's commit; if the commit fails the job
                # stops and nothing after it counts.  Not at an iteration boundary, where
                # the pruner may stop or hold the model first.
                self._dispatch()
        # The result, the outputs it changes and the progress: one transaction, its statements
        # sent together.  Within an iteration a hop changes no output but the progress: the
        # model's rows are published when it completes an iteration or is validated.
        with self.store.atomic(pipelined=True):
            if task.kind == "evaluate":
                self.store.record_eval(task.mst_key, task.step, task.partition, value)
                model.evals[(task.step, task.partition)] = value
            else:
                self.store.record_visit(task.mst_key, task.step, task.segment, new_state, result)
                if boundary:
                    self._queue_evals(model, completed // model.per_iteration, new_state)
            if task.kind == "evaluate" or boundary:
                self._publish(model)
            self.store.progress(self._done(), self.schedule.planned_total(), self._counts())
        self._ask()
        if task.kind == "train":
            self._notice_epoch()

    def _failed(self, task: Task, error: BaseException) -> None:
        message = RetryPolicy.message(error)
        self.store.note_error(f"{task.kind} mst_key {task.mst_key} step {task.step} segment "
                              f"{task.segment} attempt {task.attempt}: {message}")
        if RetryPolicy.lost(error):  # the session was lost: wait for the server
            attempt = task.attempt
            if not RetryPolicy.connecting(error):
                self.retry.check(task, error, message)
                attempt += 1
            where = self.pool.threads[task.segment].worker.where
            delay = self.retry.delay(task, where, message)
            self.paused_until[task.segment] = time.monotonic() + delay
            self.plpy.notice(
                f"madlib_mop: job {self.job_id}: segment {task.segment}: {where} did not answer "
                f"({message}); retrying in {delay:g}s (for up to "
                f"{self.retry.wait_seconds:g}s)")
        else:
            self.retry.check(task, error, message)
            self.plpy.notice(f"madlib_mop: job {self.job_id}: {task.kind} of mst_key {task.mst_key} on "
                             f"segment {task.segment} failed ({message}); running it again")
            attempt = task.attempt + 1
        if task.kind == "train":
            self.schedule.retry(task.mst_key, task.segment)
            self.attempts[(task.mst_key, task.step)] = attempt
        else:
            task.attempt = attempt
            self.pending_evals.append(task)

    def _queue_evals(self, model: ModelRecord, iteration: int, state: bytes | None) -> None:
        if not self.partitions or not metrics.due(iteration, self.args["metrics_compute_frequency"],
                                                  self.args["num_iterations"], self.also_due):
            return
        step = iteration * model.per_iteration
        missing = [p for p in range(self.partitions) if (step, p) not in model.evals]
        if missing and state is None:
            state = self.store.state_at(model.mst_key, step)
        self.pending_evals += [Task("evaluate", model.mst_key, step, p % self.S, p, state)
                               for p in missing]

    # ---- iteration boundaries ----
    def _publish(self, model: ModelRecord) -> None:
        """Bring the model's output rows up to date, then hand its new reports to search."""
        curves = metrics.curves(model.visits, model.evals, self.S, model.epochs,
                                self.args["metrics_compute_frequency"], self.args["num_iterations"],
                                self.partitions, self.started_epoch, self.also_due)
        outputs.publish(self.store, model, curves, self.partitions, bool(self.args.get("single")))
        finished = len(model.visits) // model.per_iteration
        if not finished:
            return
        step = finished * model.per_iteration
        if step != model.published_step:  # once per iteration, not once per hop
            blob = model.state if len(model.visits) == step else self.store.state_at(model.mst_key, step)
            outputs.publish_weights(self.store, model.mst_key, blob)
            model.published_step = step
        # Keep the initial state (replay), the latest, and those validation still needs.
        waiting = [t.step for t in self.pending_evals + list(self.running.values())
                   if t.kind == "evaluate" and t.mst_key == model.mst_key]
        keep_from = min([step] + waiting)
        if keep_from > model.pruned_below:
            self.store.prune_states(model.mst_key, keep_from)
            model.pruned_below = keep_from
        for index, iteration in enumerate(curves.iterations):
            if not self.decisions.has(model.mst_key, iteration):
                self.decisions.report(Report(model.mst_key, iteration, curves.training[index],
                                    curves.validation[index] if self.partitions else None))

    def _decided_at(self, iteration: int) -> bool:
        """Does the pruner decide after this iteration (its metrics are computed)?"""
        return self.pruning and 0 < iteration < self.args["num_iterations"] and metrics.due(
            iteration, self.args["metrics_compute_frequency"], self.args["num_iterations"],
            self.also_due)

    def _decided(self, report: Report, decision: Decision, why: str | None) -> None:
        """A pruner's decision about a model at an iteration: recorded and shown."""
        key, iteration = report.mst_key, report.iteration
        labels = self.pruner.labels(key, iteration)
        if decision is Decision.STOP:
            self.stopped[key] = (iteration, why)
            self.store.record_stop(key, iteration, why, labels)
            self._notice(f"mst_key {key} stopped: {why}")
            return
        if labels:
            self.store.update_info(key, labels)
        priority = self.pruner.priority(key, iteration)
        if priority > self.schedule.progress[key].priority:
            self.schedule.prefer(key, priority)
            self._notice(f"mst_key {key} goes on after iteration {iteration} "
                         f"({self.objective.label} {self.objective.value(report):.6g})")

    def _ask(self) -> None:
        """New configurations from the searcher join the job (a resumed job's searcher
        proposes again those it had: they must be the models the job has)."""
        added = False
        while self.searcher is not None and (config := self.searcher.ask()) is not None:
            self.asked += 1
            key = self.asked
            model = self.models.get(key)
            if model is not None:
                if Config(model.model_id, model.compile_params, model.fit_params) != config:
                    raise MadlibMopError(
                        f"job {self.job_id}: the searcher proposed {config} as mst_key {key}, "
                        f"which the job recorded as {model.model_id}, {model.compile_params}, "
                        f"{model.fit_params}", sqlstate=errors.DATA_EXCEPTION,
                        hint="The job's tables were changed; start the job again.")
                continue
            self.models[key] = self._add_model(key, config)
            rounds = self.args["num_iterations"] * self.models[key].epochs
            self.schedule.add(key, schedule.added_model_orders(key, self.S, rounds, self.job["seed"]))
            self.pruner.start(sorted(self.models))
            added = True
            self._notice(f"mst_key {key} enters: model_id {config.model_id}, "
                         f"{config.compile_params}, {config.fit_params}")
        if added:
            self.engine.prepare_job(self.plpy, self.job, self.store.model_rows())  # segment servers learn the new models

    def _add_model(self, key: int, config: Config) -> ModelRecord:
        """A proposed configuration, checked against the data, with its initial state (drawn
        from the job's seed and its mst_key, as those of the models the job started with)."""
        arch, weights = self.store.architecture(config.model_id)
        entry = {"mst_key": key, "model_id": config.model_id, "model_arch": arch,
                 "compile_params": config.compile_params, "fit_params": config.fit_params,
                 "weights": weights}
        plan.check_config(self.plpy, entry, self.job["source_table"])
        blob = training.initial_states([training.ModelSpec.of(entry)], self.job["seed"])[key]
        self.store.add_model(entry, blob)
        return self.store.model_record(key, config.model_id, config.compile_params,
                                       config.fit_params, state=blob)

    def _counts(self) -> dict[str, int]:
        """Models training, waiting (not started, or held for a decision), stopped early,
        and finished."""
        counts = dict.fromkeys(("models_training", "models_waiting", "models_stopped",
                                "models_finished"), 0)
        for key, progress in self.schedule.progress.items():
            if key in self.stopped:
                counts["models_stopped"] += 1
            elif progress.done >= self.schedule.total[key]:
                counts["models_finished"] += 1
            elif progress.held or (progress.done == 0 and not progress.busy):
                counts["models_waiting"] += 1
            else:
                counts["models_training"] += 1
        return counts

    # ---- session, progress ----
    def _check_interrupts(self) -> None:
        # A query lets PostgreSQL act on a cancel or terminate request for this session.
        self.plpy.execute("SELECT 1")
        if self.can_commit:
            self._commit()

    def _commit(self) -> None:
        """CALL fit_multiple commits as it goes, so that it holds no snapshot for hours."""
        try:
            self.plpy.commit()
            plpy_bridge.renew_pin(self.plpy)
        except self.plpy.SPIError as error:
            # Only "invalid transaction termination" says the CALL runs in a transaction
            # block; a cancel request acted on at the commit is an interruption, as elsewhere.
            if getattr(error, "sqlstate", None) != "2D000":
                raise
            raise MadlibMopError(
                "CALL fit_multiple cannot run inside a transaction block", sqlstate="25001",
                hint="Run CALL outside BEGIN ... COMMIT, or use SELECT "
                     "madlib_keras_fit_multiple_model(...).") from None

    def _done(self) -> int:
        return sum(len(m.visits) for m in self.models.values())

    def _notice_epoch(self) -> None:
        if self.searching:
            return self._notice_search_progress()
        epoch = min(len(m.visits) for m in self.models.values()) // self.S
        if epoch <= self.reported_epoch:
            return
        self.reported_epoch = epoch
        losses = [(loss, m.mst_key) for m in self.models.values()
                  if (loss := metrics.epoch_loss(m.visits, epoch, self.S)) is not None]
        best = min(losses) if losses else (float("nan"), None)
        elapsed = time.monotonic() - self.started
        eta = metrics.eta(elapsed, self._done(), self.done_at_start, self.schedule.planned_total())
        self._notice(
            f"epoch {epoch}/{self.epochs}: "
            f"{len(self.models)} models on {self.S} segments, best training loss {best[0]:.4f} "
            f"(mst_key {best[1]}), elapsed {elapsed:.1f}s, ETA {eta:.1f}s")

    def _notice_search_progress(self) -> None:
        """With models stopping and entering, epochs are no common measure: a NOTICE per
        tenth of the work planned so far."""
        total = self.schedule.planned_total()
        tenth = 10 * self._done() // max(total, 1)
        if tenth <= self.reported_epoch:
            return
        self.reported_epoch = tenth
        counts = self._counts()
        elapsed = time.monotonic() - self.started
        eta = metrics.eta(elapsed, self._done(), self.done_at_start, total)
        self._notice(
            f"{10 * tenth}% of the work planned so far: {len(self.models)} models "
            f"({counts['models_training']} training, {counts['models_waiting']} waiting, "
            f"{counts['models_stopped']} stopped, {counts['models_finished']} finished), "
            f"elapsed {elapsed:.1f}s, ETA {eta:.1f}s")

    def _finish(self) -> None:
        self.store.progress(self._done(), self.schedule.planned_total(), self._counts())
        outputs.finish(self.store)
        if self.args.get("automl"):
            best = outputs.keep_best(self.store, self.models, self.objective, self.S,
                                     self.args["metrics_compute_frequency"],
                                     self.args["num_iterations"], self.partitions, self.also_due)
            self._notice(f"best configuration: mst_key {best} by {self.objective.describe()}; "
                         f"kept in {self.job['model_selection_table']}")
        self.store.finish()
        self._notice(f"job {self.job_id} finished: {len(self.models)} models in "
                     f"{time.monotonic() - self.started:.1f}s; results in "
                     f"{self.store.display('output')}, {self.store.display('info')}")

    def _notice(self, text: str) -> None:
        self.plpy.notice(f"madlib_keras_fit_multiple_model: {text}")

    def close(self, error: BaseException | None = None) -> None:
        self.store.close(error)


class SearchDecisions:
    """Hands each (model, iteration) report to the searcher and the pruner, once, and
    turns the pruner's answers into schedule changes (stop, hold while it waits).  Held
    decisions are asked again, in (iteration, mst_key) order, after every report and every
    decision, until none changes: the outcome depends on the reports, not on their order.

    A resumed job hands over each model's reports at once, so a later iteration's decision
    may come before an earlier one's (which waited for other models' reports): the model
    trained past that earlier iteration, its decision is moot and is not passed on."""

    def __init__(self, searcher: Searcher | None, pruner: Pruner, dispatcher: schedule.Dispatcher,
                 decided):
        self.searcher, self.pruner, self.schedule, self.decided = searcher, pruner, dispatcher, decided
        self.reports: dict[int, dict[int, Report]] = {}  # iteration -> mst_key -> report
        self.waiting: set[tuple[int, int]] = set()  # (iteration, mst_key) held for the pruner
        self.latest: dict[int, int] = {}  # mst_key -> the last iteration decided about it

    def has(self, mst_key: int, iteration: int) -> bool:
        return mst_key in self.reports.get(iteration, {})

    def report(self, report: Report) -> None:
        self.reports.setdefault(report.iteration, {})[report.mst_key] = report
        if self.searcher is not None:
            self.searcher.tell(report)
        self.waiting.add((report.iteration, report.mst_key))
        changed = True
        while changed:
            changed = False
            for iteration, mst_key in sorted(self.waiting):
                if self.decide(self.reports[iteration][mst_key]):
                    changed = True

    def decide(self, report: Report) -> bool:
        """True if the pruner decided (the model no longer waits)."""
        if self.latest.get(report.mst_key, 0) > report.iteration:
            self.waiting.discard((report.iteration, report.mst_key))
            return True
        decision = self.pruner.decide(report, self.reports[report.iteration])
        self.schedule.hold(report.mst_key, decision is Decision.WAIT)
        if decision is Decision.WAIT:
            return False
        self.waiting.discard((report.iteration, report.mst_key))
        if decision is Decision.STOP:
            self.schedule.stop(report.mst_key)
        self.latest[report.mst_key] = max(report.iteration, self.latest.get(report.mst_key, 0))
        self.decided(report, decision, self.pruner.reason(report) if decision is Decision.STOP else None)
        return True

    def release_all(self) -> bool:
        """No report can come any more: held models go on.  False if none was held."""
        if not self.waiting:
            return False
        for _, mst_key in sorted(self.waiting):
            self.schedule.hold(mst_key, False)
        self.waiting.clear()
        return True
