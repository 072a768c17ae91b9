"""A person steering a running job: the requests `api.steering` records in `steering`, as
the coordinator meets them.

A request is applied where the model it acts on is between iterations (its state there is
kept: `state_store`), so that what it does is defined by the model's own progress, not by
timing:

    stop        the model trains to the end of its current iteration, then no further
    iterations  its iterations in all become num_iterations (not fewer than it has begun)
    clone       at its next iteration boundary, a new model (the next free mst_key) starts
                from its state there, with the request's compile and fit params: the whole
                state when the compile params are the source's, else its weights and a new
                optimizer (as warm start does); it trains the job's num_iterations, on its
                source's path from there (`schedule.model_orders`), in its source's fused
                groups where it is of its source's class (`fusing.clone_class`)
    add         a new model, at once, as a searcher's configuration joins

Each applied request records the iteration it took effect after (and the model it made), in
the transaction that makes the change, so a resumed job starts with the same models and
iteration targets (`targets`, `added`) and replaying a model's visits gives its weights.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable

from psycopg import sql

from madlib_mop.errors import MadlibMopError
from madlib_mop.job import fusing, plan, schedule
from madlib_mop.engine.base import Engine
from madlib_mop.job.events import JobEvents
from madlib_mop.job.search_driver import JobSearch
from madlib_mop.job.store import JobStore, ModelRecord
from madlib_mop.runtime import state, training

POLL_SECONDS = 0.5  # how often a running job looks for new requests (an indexed read)


@dataclass
class Request:
    action_id: int
    action: str
    mst_key: int | None
    params: dict
    owner: str
    applied: bool = False
    applied_iteration: int | None = None  # None when applied: it changed nothing
    new_mst_key: int | None = None


def load(store: JobStore) -> list[Request]:
    rows = store.execute(sql.SQL("SELECT action_id, action, mst_key, params, owner, applied_at IS NOT NULL, "
                           "applied_iteration, new_mst_key FROM {}.steering WHERE job_id = %s "
                           "ORDER BY action_id").format(store.schema), (store.job_id,)).fetchall()
    return [Request(*row) for row in rows]


def targets(requests: list[Request]) -> dict[int, int]:
    """mst_key -> its iterations in all, as the applied stops and changes left them."""
    found: dict[int, int] = {}
    for request in requests:
        if request.action in ("stop", "iterations") and request.applied_iteration is not None:
            found[request.mst_key] = request.applied_iteration
    return found


def stops(requests: list[Request]) -> dict[int, tuple[int, str]]:
    """mst_key -> (iteration, why) of the models the last applied request left stopped."""
    found: dict[int, tuple[int, str]] = {}
    for request in requests:
        if request.action == "iterations" and request.applied_iteration is not None:
            found.pop(request.mst_key, None)
        elif request.action == "stop" and request.applied_iteration is not None:
            found[request.mst_key] = (request.applied_iteration, stop_reason(request))
    return found


def resumed(store: JobStore, models: dict[int, ModelRecord]) -> list[Request]:
    """The job's requests; the models' iterations as the applied ones left them (a row
    naming no model of the job changes nothing)."""
    requests = load(store)
    for mst_key, iterations in targets(requests).items():
        if mst_key in models and isinstance(iterations, int) and iterations >= 0:
            models[mst_key].iterations = iterations
    return requests


def _whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def stop_reason(request: Request) -> str:
    return f"stopped by {request.owner} (steering action {request.action_id})"


def added(requests: list[Request]) -> set[int]:
    """The models clones and adds made."""
    return {r.new_mst_key for r in requests if r.applied and r.new_mst_key is not None}


def clone_sources(requests: list[Request], models: dict[int, ModelRecord], job: Any
                  ) -> dict[int, tuple[int, int]]:
    """clone -> (its source, the source's sub-epochs done when it was made), of a job
    (`record.JobRecord`) whose clones go their sources' paths (`fusing.clones_follow`;
    else none)."""
    if not fusing.clones_follow(job):
        return {}
    return {r.new_mst_key: (r.mst_key, r.applied_iteration * models[r.mst_key].per_iteration)
            for r in requests if r.action == "clone" and r.applied and r.new_mst_key in models
            and r.mst_key in models and r.applied_iteration is not None}


class JobSteering:
    """The job's requests: the applied ones (read at the start), the others applied as the
    models they act on reach iteration boundaries."""

    def __init__(self, plpy: Any, store: JobStore, requests: list[Request], notice: Callable[[str], None],
                 *, models: dict[int, ModelRecord], dispatcher: schedule.Dispatcher, search: JobSearch,
                 engine: Engine, events: JobEvents):
        """The coordinator's models, dispatcher, search and engine; `events`: what it is
        told when a model's iterations change."""
        self.plpy, self.store, self.notice = plpy, store, notice
        self.models, self.schedule, self.search, self.engine = models, dispatcher, search, engine
        self.events = events
        self.keras = search.keras  # an added model's facts and state: the job's (`job.keras_work`)
        self.search.record_stops({k: v for k, v in stops(requests).items() if k in self.models})
        self.added = added(requests)  # models made by requests: not of the job's rotations
        self.follow = fusing.clones_follow(store.job)
        self.clones = clone_sources(requests, models, store.job)  # they go their sources' paths
        self.pending = [r for r in requests if not r.applied]
        self.seen = {r.action_id for r in requests}  # ids are drawn at insert, not commit
        self.polled = 0.0

    # ---- when ----
    def poll(self, now: bool = False) -> bool:
        """New requests (at most every POLL_SECONDS, unless `now`), and those that can be
        applied now; True if one was."""
        if now or time.monotonic() - self.polled >= POLL_SECONDS:
            self.polled = time.monotonic()
            fresh = [r for r in load(self.store) if r.action_id not in self.seen and not r.applied]
            self.seen |= {r.action_id for r in fresh}
            self.pending += fresh
        return self.apply(None)

    def apply(self, mst_key: int | None) -> bool:
        """Apply the pending requests that can be (of model `mst_key` only, if given), in
        the order they were made; True if one was."""
        applied = False
        for request in list(self.pending):
            if mst_key is not None and request.mst_key != mst_key:
                continue
            if self._apply(request):
                self.pending.remove(request)
                applied = True
        return applied

    def finish(self) -> None:
        """The job ends: what is still pending (or came since the last look) is recorded as
        too late."""
        for request in [r for r in load(self.store) if not r.applied]:
            self._record(request, None, None, "not applied: the job had finished")
        self.pending = []

    def changed(self, model: ModelRecord) -> None:
        """The model's iterations changed (or it was added): its new last iteration may be
        the one it has ended, whose validation is then due; its rows and the job's totals."""
        self.events.queue_evals(model, len(model.visits) // model.per_iteration)
        self.events.publish(model)
        self.events.report_progress()

    def _between_iterations(self, key: int) -> bool:
        model, progress = self.models[key], self.schedule.progress[key]
        return not progress.busy and progress.done % model.per_iteration == 0

    def _apply(self, request: Request) -> bool:
        """Apply the request if it can be now; one the job cannot apply (rows are written by
        the role, not only through api.steering) is recorded as refused, and the job goes on."""
        try:
            if self.store.job.arguments.automl or self.store.job.arguments.pruner:  # as api.steering refuses
                raise MadlibMopError("a job of a searcher or a pruner is not steered")
            if request.action == "iterations" and not _whole(request.params.get("num_iterations")):
                raise MadlibMopError(f"num_iterations {request.params.get('num_iterations')!r} is not "
                                     "a whole number of iterations")
            return self._apply_checked(request)
        except Exception as error:  # noqa: BLE001 (any failure: the request is refused, the job goes on)
            self._record(request, None, None, f"refused: {getattr(error, 'message', None) or error!r}")
            self.notice(f"steering action {request.action_id} refused: {getattr(error, 'message', None) or error!r}")
            return True

    def _apply_checked(self, request: Request) -> bool:
        if request.action == "add":
            return self._new_model(request, None)
        key = request.mst_key
        if key not in self.models:  # not a model of the job (the request was checked: a replaced job)
            self._record(request, None, None, f"mst_key {key} is not a model of this job")
            return True
        progress, model = self.schedule.progress[key], self.models[key]
        if key in self.search.gone:
            self._record(request, None, None, f"not applied: mst_key {key} had diverged or failed")
            return True
        if request.action == "clone":
            if not self._between_iterations(key) and progress.done < self.schedule.total[key]:
                return False  # at its next boundary (`apply(key)` after each of its hops)
            return self._new_model(request, key)
        # stop, iterations: from the end of the iteration under way
        begun = -(-(progress.done + progress.busy) // model.per_iteration)
        wanted = begun if request.action == "stop" else max(begun, request.params["num_iterations"])
        self._set_iterations(model, wanted)
        self.changed(model)  # its last iteration may be the one it has just ended
        with self.store.atomic():
            if request.action == "stop":
                self.search.record_stops({key: (wanted, stop_reason(request))})
                self.store.record_stop(key, wanted, stop_reason(request), {})
                self._record(request, wanted, None, f"trains no further than iteration {wanted}")
            else:
                if self.search.trains_on(key):  # it was stopped
                    self.store.update_info(key, {"status": "training", "stopped_iteration": None,
                                                 "stop_reason": None})
                self._record(request, wanted, None, f"trains {wanted} iterations in all")
        self.notice(f"mst_key {key}: {request.action} applied (steering action {request.action_id}, "
                    f"by {request.owner}): {wanted} iterations in all")
        return True

    # ---- what ----
    def _set_iterations(self, model: ModelRecord, iterations: int) -> None:
        rounds = iterations * model.epochs
        orders = None
        if rounds > len(self.schedule.orders[model.mst_key]):
            initial = schedule.started_with(self.models, self.store.job.arguments.initial_models,
                                            self.added)
            orders = schedule.model_orders(model.mst_key, initial, self.store.job.num_segments, rounds,
                                           self.store.job.seed, self.schedule.classes, self.clones)
        self.schedule.limit(model.mst_key, rounds * self.store.job.num_segments, orders)
        model.iterations = iterations

    def _new_model(self, request: Request, source: int | None) -> bool:
        """A clone of `source` at its current step, or an added configuration."""
        job = self.store.job
        key = max([*self.models, getattr(self.search.searcher, "num_configs", 0)]) + 1
        if source is None:
            arch, weights = self.store.architecture(request.params["model_id"], request.params["model_arch_table"])
            entry = {"mst_key": key, "model_id": request.params["model_id"], "model_arch": arch,
                     "compile_params": request.params["compile_params"],
                     "fit_params": request.params["fit_params"], "weights": weights}
            at = None
        else:
            origin = self.models[source]
            at = self.schedule.progress[source].done
            arch = self.store.model_architecture(source)
            entry = {"mst_key": key, "model_id": origin.model_id, "model_arch": arch,
                     "compile_params": request.params["compile_params"],
                     "fit_params": request.params["fit_params"], "weights": None}
        plan.check_config(self.plpy, entry, job.source_table, job.arguments, self.keras)
        blob = self._initial_state(entry, source, at)
        rounds = job.arguments.num_iterations * training.ModelSpec.of(entry).epochs
        iteration = None if source is None else at // self.models[source].per_iteration
        with self.store.atomic():
            self.store.add_model(entry, blob)
            self._record(request, iteration, key,
                         f"mst_key {key} made" + ("" if source is None else f" from mst_key {source} "
                                                   f"after iteration {iteration}"))
        self.added.add(key)
        self.models[key] = self.store.model_record(key, entry["model_id"], entry["compile_params"],
                                                   entry["fit_params"])
        # (a clone's point as its request records it: a resumed job's `clone_sources`)
        fused = self._schedule(key, entry, source,
                               None if source is None else iteration * self.models[source].per_iteration, rounds)
        self.search.pruner.start(sorted(self.models))
        self.engine.prepare_job(self.plpy, job, self.store.model_rows)  # segment servers learn it
        self.changed(self.models[key])
        self.notice(f"mst_key {key} enters (steering action {request.action_id}, by {request.owner}): "
                    + (f"a clone of mst_key {source} after iteration {iteration}, " if source else "")
                    + f"{entry['compile_params']}, {entry['fit_params']}"
                    + ("" if fused is None or len(fused) < 2 else f"; it trains fused with its source's group {fused}"))
        return True

    def _schedule(self, key: int, entry: dict, source: int | None, at: int | None, rounds: int
                  ) -> tuple[int, ...] | None:
        """The new model's orders: a clone's, its source's from `at` on (its first group is
        returned: its source's, or itself alone); an added model's, of its own."""
        job = self.store.job
        if source is None or not self.follow:
            self.schedule.add(key, schedule.added_model_orders(key, job.num_segments, rounds, job.seed))
            return None
        self.clones[key] = (source, at)
        initial = schedule.started_with(self.models, job.arguments.initial_models, self.added)
        origin = self.models[source]
        joined = fusing.clone_class(self.schedule.fusion, {
            "mst_key": source, "model_arch": entry["model_arch"], "compile_params": origin.compile_params,
            "fit_params": origin.fit_params}, entry)
        self.schedule.add(key, schedule.model_orders(key, initial, job.num_segments, rounds, job.seed,
                                                     self.schedule.classes, self.clones),
                          offset=schedule.clock_offsets(self.clones)[key], fusion=joined, source=source)
        return self.schedule.group(key, 0)

    def _initial_state(self, entry: dict, source: int | None, at: int | None) -> bytes:
        """A clone's: the source's state (whole when compiled the same, else its weights and
        a new optimizer); an added model's: drawn from the job's seed and its mst_key."""
        if source is not None:
            blob = bytes(self.store.state_at(source, at))
            if entry["compile_params"] == self.models[source].compile_params:
                return blob
            entry["weights"] = bytes(state.madlib_weights(blob))
        ((_, blob),) = self.keras.initial_states(
            [training.ModelSpec.of(entry, plan.custom_of(self.store.job.arguments))], self.store.job.seed)
        return blob

    def _record(self, request: Request, iteration: int | None, new_key: int | None, outcome: str) -> None:
        request.applied, request.applied_iteration, request.new_mst_key = True, iteration, new_key
        self.store.execute(sql.SQL("UPDATE {}.steering SET applied_at = now(), applied_iteration = %s, "
                             "new_mst_key = %s, outcome = %s WHERE action_id = %s").format(self.store.schema),
                     (iteration, new_key, outcome, request.action_id))

