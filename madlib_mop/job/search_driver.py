"""The job's search as the coordinator meets it: the pruner's decisions at iteration
boundaries (recorded, shown, turned into schedule changes) and the configurations a
searcher proposes joining the running job."""

from __future__ import annotations

from typing import Any, Callable

from madlib_mop import errors
from madlib_mop.engine.base import Engine
from madlib_mop.errors import MadlibMopError
from madlib_mop.grammar.model_config import Config
from madlib_mop.job import metrics, outputs, plan, schedule
from madlib_mop.job.keras_work import KerasWork
from madlib_mop.job.store import JobStore, ModelRecord
from madlib_mop.runtime import training
from madlib_mop.search import setup
from madlib_mop.search.base import Decision, NoPruner, Pruner, Report, Searcher


class JobSearch:
    """The searcher, the pruner and the objective of a job (rebuilt from its recorded
    arguments, so a resumed job decides as the first run did), over the coordinator's
    models, schedule and store."""

    def __init__(self, plpy: Any, store: JobStore, engine: Engine, models: dict[int, ModelRecord],
                 dispatcher: schedule.Dispatcher, validated: bool, notice: Callable[[str], None],
                 keras: KerasWork):
        self.plpy, self.store, self.engine, self.notice = plpy, store, engine, notice
        self.keras = keras  # a proposal's facts and initial state (`job.keras_work`)
        self.models, self.schedule = models, dispatcher
        self.job, self.args = store.job, store.job.arguments
        self.searcher, self.pruner, self.objective = setup.search_of_job(
            self.args.automl, self.args.pruner, self.args.num_iterations,
            {k: m.compile_params for k, m in models.items()}, validated)
        self.pruner.start(sorted(models))
        self.also_due = frozenset(self.pruner.required_iterations())
        self.asked = 0  # configurations the searcher proposed in this run
        self.stopped: dict[int, tuple[int, str]] = {}  # mst_key -> (iteration, why)
        self.gone: set[int] = set()  # diverged or failed
        self.decisions = SearchDecisions(self.searcher, self.pruner, dispatcher, self._decided)
        self.pruning = not isinstance(self.pruner, NoPruner)

    def lost(self, mst_key: int) -> None:
        """The model stopped for a cause of its own (it diverged, or failed): it reports
        nothing more.  The searcher counts it as a failed configuration; held decisions
        that waited for its reports go on when nothing else can come (`release_all`)."""
        self.gone.add(mst_key)
        if self.searcher is not None:
            self.searcher.lost(mst_key)

    def record_stops(self, stops: dict[int, tuple[int, str]]) -> None:
        """Models a person stopped (steering): mst_key -> (its last iteration, why)."""
        self.stopped.update(stops)

    def trains_on(self, mst_key: int) -> bool:
        """A stopped model trains on (a person gave it more iterations); whether it was
        stopped."""
        return self.stopped.pop(mst_key, None) is not None

    def keep_best(self, partitions: int) -> None:
        """madlib_keras_automl's end: the model selection table keeps the best model only
        (among those that did not diverge or fail).  Other jobs keep their tables as they are."""
        if not self.args.automl:
            return
        kept = {k: m for k, m in self.models.items() if k not in self.gone}
        best = outputs.keep_best(self.store, kept, self.objective, self.job.num_segments,
                                 self.args.metrics_compute_frequency, self.args.num_iterations,
                                 partitions, self.also_due)
        self.notice(f"best configuration: mst_key {best} by {self.objective.describe()}; "
                    f"kept in {self.job.model_selection_table}")

    def decided_at(self, iteration: int) -> bool:
        """Does the pruner decide after this iteration (its metrics are computed)?"""
        return self.pruning and 0 < iteration < self.args.num_iterations and metrics.due(
            iteration, self.args.metrics_compute_frequency, self.args.num_iterations,
            self.also_due)

    def _decided(self, report: Report, decision: Decision, why: str | None) -> None:
        """A pruner's decision about a model at an iteration: recorded and shown."""
        key, iteration = report.mst_key, report.iteration
        labels = self.pruner.labels(key, iteration)
        if decision is Decision.STOP:
            self.stopped[key] = (iteration, why)
            self.store.record_stop(key, iteration, why, labels)
            self.notice(f"mst_key {key} stopped: {why}")
            return
        if labels:
            self.store.update_info(key, labels)
        priority = self.pruner.priority(key, iteration)
        if priority > self.schedule.progress[key].priority:
            self.schedule.prefer(key, priority)
            self.notice(f"mst_key {key} goes on after iteration {iteration} "
                         f"({self.objective.label} {self.objective.value(report):.6g})")

    def ask(self) -> None:
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
                        f"job {self.job.job_id}: the searcher proposed {config} as mst_key {key}, "
                        f"which the job recorded as {model.model_id}, {model.compile_params}, "
                        f"{model.fit_params}", sqlstate=errors.DATA_EXCEPTION,
                        hint="The job's tables were changed; start the job again.")
                continue
            self.models[key] = self._add_model(key, config)
            rounds = self.args.num_iterations * self.models[key].epochs
            self.schedule.add(key, schedule.added_model_orders(key, self.job.num_segments, rounds, self.job.seed))
            self.pruner.start(sorted(self.models))
            added = True
            self.notice(f"mst_key {key} enters: model_id {config.model_id}, "
                         f"{config.compile_params}, {config.fit_params}")
        if added:
            self.engine.prepare_job(self.plpy, self.job, self.store.model_rows)  # segment servers learn the new models

    def _add_model(self, key: int, config: Config) -> ModelRecord:
        """A proposed configuration, checked against the data, with its initial state (drawn
        from the job's seed and its mst_key, as those of the models the job started with)."""
        arch, weights = self.store.architecture(config.model_id)
        entry = {"mst_key": key, "model_id": config.model_id, "model_arch": arch,
                 "compile_params": config.compile_params, "fit_params": config.fit_params,
                 "weights": weights}
        plan.check_config(self.plpy, entry, self.job.source_table, self.args, self.keras)
        ((_, blob),) = self.keras.initial_states([training.ModelSpec.of(entry, plan.custom_of(self.args))],
                                                 self.job.seed)
        self.store.add_model(entry, blob)
        return self.store.model_record(key, config.model_id, config.compile_params,
                                       config.fit_params)


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

    def report_curves(self, mst_key: int, curves: metrics.Curves, validated: bool) -> None:
        """The model's computed iterations (`metrics.curves`) not reported yet."""
        for index, iteration in enumerate(curves.iterations):
            if not self.has(mst_key, iteration):
                self.report(Report(mst_key, iteration, curves.training[index],
                                   curves.validation[index] if validated else None))

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
