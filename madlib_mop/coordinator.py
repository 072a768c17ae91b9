"""The coordinator: one model selection job (madlib_keras_fit_multiple_model).

It runs in the backend of the session that called the fit.  It checks the inputs, records
the job, then opens one worker connection per segment (a backend of the server holding the
segment; on one server, loopback connections to the same database) and dispatches
sub-epochs to them without a barrier (`schedule.Dispatcher`).  Each worker call commits the
model state it produced together with its metrics, so everything finished survives a
failure; a worker that fails or dies has its sub-epoch run again on a new connection, and a
coordinator that dies leaves a job that `resume` (or the same fit call again) continues.
The job's bookkeeping and the MADlib output tables (`<out>`, `<out>_summary`, `<out>_info`)
are written through the coordinator's own connection, committed as the job goes, so other
sessions see progress while it runs (view `job_progress`).

Per-job tables, next to the output table:
    <out>_mop_models   the configurations as the job started (mst_key, architecture, params)
    <out>_mop_state    model states (mst_key, step, state): step = sub-epochs completed
    <out>_mop_visits   every finished sub-epoch: segment, rows, loss/metrics, timings
    <out>_mop_evals    every finished validation pass over one validation partition
"""

from __future__ import annotations

import json
import os
import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import psycopg
from psycopg import sql

from madlib_mop import (catalog, errors, model_config, plpy_bridge, preprocessor, schedule, state,
                        training, worker_session)
from madlib_mop.errors import MadlibMopError

MAX_ATTEMPTS = 3
JOB_TABLES = ("models", "state", "visits", "evals")
# <out>_info: MADlib's 17 columns, then madlib_mop's (all metrics by name, timings).
INFO_COLUMNS = [
    ("mst_key", "integer PRIMARY KEY"), ("model_id", "integer"), ("compile_params", "text"),
    ("fit_params", "text"), ("model_type", "text"), ("model_size", "double precision"),
    ("metrics_elapsed_time", "double precision[]"), ("metrics_type", "text[]"),
    ("loss_type", "text"), ("training_metrics_final", "double precision"),
    ("training_loss_final", "double precision"), ("training_metrics", "double precision[]"),
    ("training_loss", "double precision[]"), ("validation_metrics_final", "double precision"),
    ("validation_loss_final", "double precision"), ("validation_metrics", "double precision[]"),
    ("validation_loss", "double precision[]"), ("metrics_iters", "integer[]"),
    ("training_metrics_all", "jsonb"), ("validation_metrics_all", "jsonb"),
    ("training_seconds", "double precision"), ("subepochs_done", "integer"),
]
# madlib_keras_fit: the info columns its summary repeats (all but mst_key).
SINGLE_SUMMARY_COLUMNS = tuple(name for name, _ in INFO_COLUMNS[1:] if name != "metrics_iters")


# ---- worker connections --------------------------------------------------------------------

@dataclass
class Task:
    kind: str  # "train" or "evaluate"
    mst_key: int
    step: int
    segment: int  # the worker that runs it
    partition: int  # the data partition it reads (= segment when training)
    attempt: int = 1
    started: float = 0.0


class WorkerThread(threading.Thread):
    """Holds one worker connection and runs the tasks given to it, one at a time.

    It touches no plpy (PL/Python allows that only in the backend's main thread): it
    executes SQL over its own libpq connection and reports to the coordinator's queue.
    """

    def __init__(self, conninfo: str, schema: str, job_id: int | None, segment: int,
                 results: queue.Queue):
        super().__init__(daemon=True, name=f"madlib_mop worker {segment}")
        self.conninfo, self.schema, self.job_id, self.segment = conninfo, schema, job_id, segment
        self.results, self.inbox = results, queue.Queue()
        self.connection: psycopg.Connection | None = None
        self.named_for: int | None = None

    def _connect(self) -> psycopg.Connection:
        if self.connection is None or self.connection.closed:
            self.connection = worker_session.connect(self.conninfo)
            self.named_for = None
        if self.named_for != self.job_id:  # the job's id may come after the warm-up
            self.connection.execute(
                "SELECT set_config('application_name', %s, false)",
                (f"madlib_mop worker job {self.job_id} segment {self.segment}",))
            self.named_for = self.job_id
        return self.connection

    def run(self) -> None:
        while True:
            task = self.inbox.get()
            if task is None:
                break
            try:
                if task.kind == "warm_up":  # TensorFlow's import, while the job is created
                    self._connect().execute(sql.SQL("SELECT {}._mop_warm_up(%s)").format(
                        sql.Identifier(self.schema)), (task.partition,))
                    continue
                function = "_mop_train" if task.kind == "train" else "_mop_evaluate"
                query = sql.SQL("SELECT {}.{}(%s, %s, %s, %s)").format(
                    sql.Identifier(self.schema), sql.Identifier(function))
                row = self._connect().execute(
                    query, (self.job_id, task.mst_key, task.step, task.partition)).fetchone()
                self.results.put((task, row[0], None))
            except Exception as error:  # reported to the coordinator, which decides
                if self.connection is not None and (self.connection.closed or self.connection.broken):
                    self.connection = None
                if task.kind != "warm_up":  # a failed warm-up shows again in the first task
                    self.results.put((task, None, error))
        if self.connection is not None:
            self.connection.close()

    def stop(self) -> None:
        if self.connection is not None and not self.connection.closed:
            try:
                self.connection.cancel_safe()
            except Exception:
                pass
        self.inbox.put(None)


# ---- the job -------------------------------------------------------------------------------

@dataclass
class Plan:
    """Everything checked before a job starts."""

    source: dict  # summary of the packed training table
    validation: dict | None
    model_selection_table: str
    model_arch_table: str
    configs: list[dict]  # mst_key, model_id, model_arch, compile_params, fit_params, weights
    num_iterations: int
    frequency: int
    epochs: dict  # mst_key -> fit epochs (passes per iteration)
    out: catalog.NewTable
    arguments: dict


def _summary(plpy: Any, table: str, argument: str) -> dict:
    return preprocessor.read_summary(plpy, table, argument=argument)


def _check_model(plpy: Any, config: dict, source: dict) -> None:
    """Does the model fit the data: input shape, output width, loss?"""
    from madlib_mop import keras_json

    spec = training.ModelSpec(config["mst_key"], config["model_arch"], config["compile_params"],
                              config["fit_params"], config["weights"])
    fit = spec.fit
    for key in ("steps_per_epoch", "initial_epoch"):
        if key in fit:
            raise MadlibMopError(
                f"mst_key {config['mst_key']}: fit_params {key} is not supported by model hopping",
                sqlstate=errors.FEATURE_NOT_SUPPORTED,
                hint="Every sub-epoch is one pass over a segment; remove it from fit_params.")
    model = keras_json.build_model(keras_json.parse_model_json(config["model_arch"]))
    shape = keras_json.input_shape(model)
    if [d for d in shape] != list(source["feature_shape"]):
        raise MadlibMopError(
            f"model {config['model_id']} (mst_key {config['mst_key']}) takes input of shape "
            f"{shape}, the features of {source['packed_table']} have shape {list(source['feature_shape'])}",
            sqlstate=errors.DATATYPE_MISMATCH,
            hint="Load an architecture whose input shape is the feature shape.")
    outputs = model.output_shape[-1]
    params = spec.compile
    classification = source["label_kind"] == "classification"
    width = source["num_classes"][0] if classification else None
    if classification:
        if params.loss in training.SPARSE_LOSSES or outputs != 1:
            if outputs != width:
                raise MadlibMopError(
                    f"model {config['model_id']} (mst_key {config['mst_key']}) has {outputs} "
                    f"outputs, the labels of {source['packed_table']} have {width} classes",
                    sqlstate=errors.DATATYPE_MISMATCH,
                    hint=f"Give the last layer {width} units.")
        else:
            raise MadlibMopError(
                f"mst_key {config['mst_key']}: loss {params.loss} with 1 output does not fit "
                f"{width} one-hot classes", sqlstate=errors.DATATYPE_MISMATCH,
                hint=f"Give the last layer {width} units.")
    else:
        if params.loss in training.SPARSE_LOSSES or params.loss in (
                "categorical_crossentropy", "categorical_focal_crossentropy", "categorical_hinge"):
            raise MadlibMopError(
                f"mst_key {config['mst_key']}: loss {params.loss} needs class labels, "
                f"{source['packed_table']} holds regression targets",
                sqlstate=errors.DATATYPE_MISMATCH,
                hint="Use a regression loss such as mean_squared_error.")


def plan_job(plpy: Any, source_table: str, model_output_table: str, model_selection_table: str,
             num_iterations: int, use_gpus: bool | None, validation_table: str | None,
             metrics_compute_frequency: int | None, warm_start: bool | None, name: str | None,
             description: str | None, use_caching: bool | None, seed: int | None) -> Plan:
    if use_gpus:
        raise MadlibMopError("use_gpus: this server has no GPU support configured",
                             sqlstate=errors.FEATURE_NOT_SUPPORTED,
                             hint="Pass use_gpus => FALSE.")
    if num_iterations is None or num_iterations < 1:
        raise MadlibMopError(f"num_iterations must be at least 1, not {num_iterations}",
                             sqlstate=errors.INVALID_PARAMETER_VALUE,
                             hint="Pass the number of passes over the data, e.g. 10.")
    frequency = num_iterations if metrics_compute_frequency is None else metrics_compute_frequency
    if not 1 <= frequency <= num_iterations:
        raise MadlibMopError(
            f"metrics_compute_frequency must be between 1 and num_iterations ({num_iterations})",
            sqlstate=errors.INVALID_PARAMETER_VALUE,
            hint="Pass NULL (metrics after the last iteration) or a number in that range.")
    source = _summary(plpy, source_table, "source_table")
    validation = _summary(plpy, validation_table, "validation_table") if validation_table else None
    if validation is not None:
        for key in ("label_kind", "feature_shape", "normalizing_const", "class_values", "num_classes"):
            if validation[key] != source[key]:
                raise MadlibMopError(
                    f"validation_table {validation['packed_table']} does not match "
                    f"{source['packed_table']}: {key} differs",
                    sqlstate=errors.DATATYPE_MISMATCH,
                    hint="Pack the validation data with validation_preprocessor_dl(..., "
                         f"training_preprocessor_table => '{source_table}').")
    mst = catalog.resolve_table(plpy, model_selection_table, argument="model_selection_table")
    missing = [c for c in ("mst_key", "model_id", "compile_params", "fit_params")
               if c not in catalog.columns(plpy, mst)]
    summary_row = plpy.execute(plpy.prepare(
        "SELECT (SELECT quote_ident(n.nspname) || '.' || quote_ident(c.relname || '_summary') "
        "WHERE to_regclass(format('%I.%I', n.nspname, c.relname || '_summary')) IS NOT NULL) AS s "
        "FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.oid = $1",
        ["oid"]), [mst.oid])[0]["s"]
    if missing or summary_row is None:
        raise MadlibMopError(
            f"model_selection_table {mst.name} was not made by generate_model_configs",
            sqlstate=errors.UNDEFINED_TABLE if summary_row is None else errors.UNDEFINED_COLUMN,
            hint="Create it with generate_model_configs() or load_model_selection_table().")
    arch_name = plpy.execute(f"SELECT model_arch_table FROM {summary_row}")[0]["model_arch_table"]
    arch = catalog.resolve_table(plpy, arch_name, argument="model_arch_table")
    configs = [dict(r) for r in plpy.execute(
        f"SELECT m.mst_key, m.model_id, m.compile_params, m.fit_params, "
        f"a.model_arch::text AS model_arch, a.model_weights AS weights "
        f"FROM {mst.name} m LEFT JOIN {arch.name} a ON a.model_id = m.model_id ORDER BY m.mst_key")]
    if not configs:
        raise MadlibMopError(f"model_selection_table {mst.name} is empty",
                             sqlstate=errors.DATA_EXCEPTION,
                             hint="Fill it with generate_model_configs().")
    for config in configs:
        if config["model_arch"] is None:
            raise MadlibMopError(f"model_id {config['model_id']} is not in {arch.name}",
                                 sqlstate=errors.INVALID_PARAMETER_VALUE,
                                 hint="Load the architecture with load_keras_model().")
        _check_model(plpy, config, source)
    out = catalog.new_table(plpy, model_output_table, argument="model_output_table")
    for suffix in ("_summary", "_info") + tuple(f"_mop_{t}" for t in JOB_TABLES):
        out.sibling(suffix, plpy)  # checks the names fit
    arguments = {"source_table": source_table, "model_output_table": model_output_table,
                 "model_selection_table": model_selection_table, "num_iterations": num_iterations,
                 "validation_table": validation_table, "metrics_compute_frequency": frequency,
                 "warm_start": bool(warm_start), "name": name, "description": description,
                 "use_caching": use_caching is not False, "seed": int(seed or 0)}
    epochs = {c["mst_key"]: model_config.parse_fit_params(c["fit_params"]).get("epochs", 1)
              for c in configs}
    return Plan(source, validation, mst.name, arch.name, configs, num_iterations, frequency,
                epochs, out, arguments)


# ---- the coordinator -----------------------------------------------------------------------

@dataclass
class ModelRecord:
    """What the coordinator keeps of one model while the job runs."""

    mst_key: int
    model_id: int
    compile_params: str
    fit_params: str
    epochs: int  # fit epochs: rounds per iteration
    visits: dict = field(default_factory=dict)  # step -> visit result
    evals: dict = field(default_factory=dict)  # (step, partition) -> eval result
    published_step: int = 0  # the step whose weights <out> holds
    pruned_below: int = 1  # states of steps 1 .. pruned_below - 1 are deleted


def start_workers(plpy: Any, segments: int) -> tuple[list[WorkerThread], queue.Queue]:
    """One worker session per segment, told to import TensorFlow at once (it takes seconds),
    so that this overlaps with the job's creation."""
    results: queue.Queue = queue.Queue()
    conninfo, schema = worker_session.conninfo(plpy), catalog.extension_schema(plpy)
    workers = [WorkerThread(conninfo, schema, None, s, results) for s in range(segments)]
    for worker in workers:
        worker.start()
        worker.inbox.put(Task("warm_up", 0, 0, worker.segment, segments))
    return workers, results


class Coordinator:
    def __init__(self, plpy: Any, job: dict, can_commit: bool,
                 workers: tuple[list[WorkerThread], queue.Queue] | None = None):
        self.plpy = plpy
        self.started_workers = workers
        self.job = job
        self.job_id = job["job_id"]
        self.can_commit = can_commit
        self.tables = json.loads(job["tables"])
        self.segments = job["num_segments"]
        self.schema = catalog.extension_schema(plpy)
        self.conninfo = worker_session.conninfo(plpy)
        self.args = json.loads(job["arguments"])
        self.attempts: dict[tuple[int, int], int] = {}
        self.db = worker_session.connect(
            self.conninfo, application_name=f"madlib_mop coordinator job {self.job_id}")
        locked = self.db.execute(f"SELECT pg_try_advisory_lock(lock_key) FROM {self.schema}.jobs "
                                 "WHERE job_id = %s", (self.job_id,)).fetchone()[0]
        if not locked:
            self.db.close()
            raise MadlibMopError(f"job {self.job_id} is running in another session",
                                 sqlstate=errors.INVALID_PARAMETER_VALUE,
                                 hint="Watch it in madlib_mop.job_progress; it is resumable "
                                      "if that session ends.")

    # -- bookkeeping I/O (committed at once) --
    def q(self, statement: str, params: tuple = ()):
        return self.db.execute(statement, params)

    def load_models(self) -> dict[int, ModelRecord]:
        models = {}
        for mst_key, model_id, compile_params, fit_params in self.q(
                f"SELECT mst_key, model_id, compile_params, fit_params FROM {self.tables['models']} "
                "ORDER BY mst_key"):
            epochs = model_config.parse_fit_params(fit_params).get("epochs", 1)
            models[mst_key] = ModelRecord(mst_key, model_id, compile_params, fit_params, epochs)
        for mst_key, step, result in self.q(
                f"SELECT mst_key, step, result FROM {self.tables['visits']}"):
            models[mst_key].visits[step] = result
        for mst_key, step, partition, result in self.q(
                f"SELECT mst_key, step, partition, result FROM {self.tables['evals']}"):
            models[mst_key].evals[(step, partition)] = result
        return models

    def run(self) -> None:
        S = self.segments
        iterations = self.args["num_iterations"]
        frequency = self.args["metrics_compute_frequency"]
        self.models = self.load_models()
        rounds = {m.mst_key: iterations * m.epochs for m in self.models.values()}
        longest = max(rounds.values())
        orders = schedule.visit_orders(list(self.models), S, longest, self.job["seed"])
        orders = {k: o[: rounds[k]] for k, o in orders.items()}
        done = {k: len(m.visits) for k, m in self.models.items()}
        dispatcher = schedule.Dispatcher(orders, S, done)
        validation_partitions = self.job["validation_partitions"] or 0
        self.total_subepochs = sum(len(o) * S for o in orders.values())
        self.started = time.monotonic()
        self.done_at_start = sum(done.values())
        self.job["started_epoch"] = self.q(
            f"UPDATE {self.schema}.jobs SET state = 'running', coordinator_pid = %s, "
            "started_at = coalesce(started_at, now()), last_error = NULL, updated_at = now() "
            "WHERE job_id = %s RETURNING extract(epoch FROM started_at)::float8",
            (os.getpid(), self.job_id)).fetchone()[0]
        if self.can_commit:
            self._commit()

        pending_evals: list[Task] = []
        for model in self.models.values():
            for iteration in range(1, len(model.visits) // (S * model.epochs) + 1):
                pending_evals += self._evals_due(model, iteration, frequency, iterations,
                                                 validation_partitions)
        for model in self.models.values():
            self._publish(model, frequency, iterations)
        workers, results = self.started_workers or start_workers(self.plpy, S)
        for worker in workers:
            worker.job_id = self.job_id
        running: dict[int, Task] = {}
        reported_epoch = min(done[k] // S for k in done)
        try:
            while True:
                for segment in range(S):
                    if segment in running:
                        continue
                    task = next((t for t in pending_evals if t.segment == segment), None)
                    if task is not None:
                        pending_evals.remove(task)
                    else:
                        given = dispatcher.next_visit(segment)
                        if given is not None:
                            task = Task("train", given[0], given[1], segment, segment,
                                        self.attempts.get(given, 1))
                    if task is not None:
                        task.started = time.monotonic()
                        running[segment] = task
                        workers[segment].inbox.put(task)
                if not running:
                    break
                try:
                    task, result, error = results.get(timeout=1.0)
                except queue.Empty:
                    continue
                finally:
                    self._check_interrupts()
                del running[task.segment]
                if error is not None:
                    self._failed(task, error, dispatcher, pending_evals)
                    continue
                result = json.loads(result) if isinstance(result, str) else result
                model = self.models[task.mst_key]
                if task.kind == "evaluate":
                    model.evals[(task.step, task.partition)] = result
                else:
                    dispatcher.finish(task.mst_key, task.segment, result["seconds"]["total"])
                    model.visits[task.step] = result
                    completed = task.step + 1
                    if completed % (S * model.epochs) == 0:
                        iteration = completed // (S * model.epochs)
                        pending_evals += self._evals_due(model, iteration, frequency, iterations,
                                                         validation_partitions)
                    epoch = min(len(m.visits) // S for m in self.models.values())
                    if epoch > reported_epoch:
                        reported_epoch = epoch
                        self._notice_epoch(epoch, max(rounds.values()))
                self._publish(model, frequency, iterations)
                self._progress()
        finally:
            for worker in workers:
                worker.stop()
        self._finish()

    def _evals_due(self, model: ModelRecord, iteration: int, frequency: int, iterations: int,
                   partitions: int) -> list[Task]:
        if not partitions or not _metrics_due(iteration, frequency, iterations):
            return []
        step = iteration * self.segments * model.epochs
        return [Task("evaluate", model.mst_key, step, p % self.segments, p)
                for p in range(partitions) if (step, p) not in model.evals]

    def _failed(self, task: Task, error: Exception, dispatcher: schedule.Dispatcher,
                pending_evals: list[Task]) -> None:
        message = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        self.q(f"UPDATE {self.schema}.jobs SET last_error = %s, updated_at = now() WHERE job_id = %s",
               (f"{task.kind} mst_key {task.mst_key} step {task.step} segment {task.segment} "
                f"attempt {task.attempt}: {message}", self.job_id))
        sqlstate = (error.sqlstate if isinstance(error, MadlibMopError)
                    else getattr(getattr(error, "diag", None), "sqlstate", None))
        # Errors that a retry cannot fix: the data, the model, privileges, authentication.
        user_error = sqlstate is not None and sqlstate[:2] in ("22", "42", "0A", "28")
        if task.attempt >= MAX_ATTEMPTS or user_error:
            raise MadlibMopError(
                f"job {self.job_id}: {task.kind} of mst_key {task.mst_key} on segment "
                f"{task.segment} failed {task.attempt} times: {message}",
                sqlstate=sqlstate if user_error else errors.DATA_EXCEPTION,
                hint=f"Fix the cause, then CALL {self.schema}.resume({self.job_id}); finished "
                     "sub-epochs are kept.")
        self.plpy.notice(f"madlib_mop: job {self.job_id}: {task.kind} of mst_key {task.mst_key} on "
                         f"segment {task.segment} failed ({message}); running it again")
        if task.kind == "train":
            dispatcher.retry(task.mst_key, task.segment)
            self.attempts[(task.mst_key, task.step)] = task.attempt + 1
        else:
            pending_evals.append(Task("evaluate", task.mst_key, task.step, task.segment,
                                      task.partition, task.attempt + 1))

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
        except Exception:
            raise MadlibMopError(
                "CALL fit_multiple cannot run inside a transaction block",
                sqlstate="25001",
                hint="Run CALL outside BEGIN ... COMMIT, or use SELECT "
                     "madlib_keras_fit_multiple_model(...).") from None

    def _progress(self) -> None:
        done = sum(len(m.visits) for m in self.models.values())
        self.q(f"UPDATE {self.schema}.jobs SET subepochs_done = %s, updated_at = now() "
               "WHERE job_id = %s", (done, self.job_id))

    def _notice_epoch(self, epoch: int, epochs: int) -> None:
        S = self.segments
        losses = []
        for model in self.models.values():
            steps = range((epoch - 1) * S, epoch * S)
            if all(s in model.visits for s in steps):
                losses.append((_weighted([model.visits[s] for s in steps]).get("loss", np.nan),
                               model.mst_key))
        best = min(losses) if losses else (float("nan"), None)
        elapsed = time.monotonic() - self.started
        done = sum(len(m.visits) for m in self.models.values())
        fresh = done - self.done_at_start
        eta = elapsed / fresh * (self.total_subepochs - done) if fresh else float("nan")
        self.plpy.notice(
            f"madlib_keras_fit_multiple_model: epoch {epoch}/{epochs}: {len(self.models)} models "
            f"on {S} segments, best training loss {best[0]:.4f} (mst_key {best[1]}), "
            f"elapsed {elapsed:.1f}s, ETA {eta:.1f}s")

    # -- outputs --
    def _publish(self, model: ModelRecord, frequency: int, iterations: int) -> None:
        """Update <out>_info and <out> for the model's iterations done so far."""
        S = self.segments
        per_iteration = S * model.epochs
        finished = len(model.visits) // per_iteration
        due = iters = [i for i in range(1, finished + 1) if _metrics_due(i, frequency, iterations)]
        metric_names = list(model_config.parse_compile_params(model.compile_params).metrics)
        training_rows, validation_rows, elapsed = [], [], []
        partitions = self.job["validation_partitions"] or 0
        for i in iters:
            # The iteration's last pass over the data (its last fit epoch).
            steps = range(i * per_iteration - S, i * per_iteration)
            training_rows.append(_weighted([model.visits[s] for s in steps]))
            finished_at = max(model.visits[s]["finished_at"] for s in steps)
            evals = [model.evals.get((i * per_iteration, p)) for p in range(partitions)]
            if partitions and all(evals):
                validation_rows.append(_weighted(evals))
                finished_at = max([finished_at] + [e["finished_at"] for e in evals])
            elif partitions:
                break  # validation of this iteration still running: publish up to here
            elapsed.append(finished_at - self.job["started_epoch"])
        iters = iters[: len(elapsed)]
        training_rows = training_rows[: len(elapsed)]

        def series(rows, name):
            return [r.get(name) for r in rows] if rows else None

        first = metric_names[0] if metric_names else None
        # Time the model's sub-epochs took, without each worker's one-off start-up.
        training_seconds = sum(v["seconds"]["total"] - v["seconds"].get("setup", 0.0)
                               for v in model.visits.values())
        self.q(sql.SQL("""
            UPDATE {info} SET metrics_elapsed_time = %s,
                training_metrics_final = %s, training_loss_final = %s,
                training_metrics = %s, training_loss = %s,
                validation_metrics_final = %s, validation_loss_final = %s,
                validation_metrics = %s, validation_loss = %s,
                metrics_iters = %s, training_metrics_all = %s, validation_metrics_all = %s,
                training_seconds = %s, subepochs_done = %s
            WHERE mst_key = %s""").format(info=sql.SQL(self.tables["info"])), (
            elapsed,
            _last(series(training_rows, first)), _last(series(training_rows, "loss")),
            series(training_rows, first), series(training_rows, "loss"),
            _last(series(validation_rows, first)) if partitions else None,
            _last(series(validation_rows, "loss")) if partitions else None,
            series(validation_rows, first) if partitions else None,
            series(validation_rows, "loss") if partitions else None,
            iters,
            json.dumps({n: series(training_rows, n) for n in ["loss"] + metric_names}),
            json.dumps({n: series(validation_rows, n) for n in ["loss"] + metric_names}) if partitions else None,
            training_seconds, len(model.visits), model.mst_key))
        if self.args.get("single"):
            columns = sql.SQL(", ").join(sql.Identifier(n) for n in SINGLE_SUMMARY_COLUMNS)
            self.q(sql.SQL("UPDATE {summary} s SET ({c}) = (SELECT {c} FROM {info} i "
                           "WHERE i.mst_key = %s)").format(
                summary=sql.SQL(self.tables["summary"]), info=sql.SQL(self.tables["info"]),
                c=columns), (model.mst_key,))
        if finished:
            step = finished * per_iteration
            if step != model.published_step:  # once per iteration, not once per hop
                blob = self.q(f"SELECT state FROM {self.tables['state']} "
                              "WHERE mst_key = %s AND step = %s", (model.mst_key, step)).fetchone()
                if blob is not None:
                    self.q(sql.SQL("UPDATE {} SET model_weights = %s WHERE mst_key = %s").format(
                        sql.SQL(self.tables["output"])), (state.madlib_weights(blob[0]), model.mst_key))
                    model.published_step = step
            self._prune(model, step, due, partitions)

    def _prune(self, model: ModelRecord, latest: int, due: list[int], partitions: int) -> None:
        """Keep the initial state (replay), the latest, and those validation still needs."""
        per_iteration = self.segments * model.epochs
        waiting = [i * per_iteration for i in due
                   if any((i * per_iteration, p) not in model.evals for p in range(partitions))]
        keep_from = min([latest] + waiting)
        if keep_from > model.pruned_below:
            self.q(f"DELETE FROM {self.tables['state']} WHERE mst_key = %s AND step > 0 AND step < %s",
                   (model.mst_key, keep_from))
            model.pruned_below = keep_from

    def _finish(self) -> None:
        self.q(sql.SQL("UPDATE {} SET end_training_time = now()").format(
            sql.SQL(self.tables["summary"])))
        self.q(f"UPDATE {self.schema}.jobs SET state = 'finished', finished_at = now(), "
               "updated_at = now(), last_error = NULL WHERE job_id = %s", (self.job_id,))
        elapsed = time.monotonic() - self.started
        self.plpy.notice(f"madlib_keras_fit_multiple_model: job {self.job_id} finished: "
                         f"{len(self.models)} models in {elapsed:.1f}s; results in "
                         f"{self.tables['output']}, {self.tables['info']}")

    def close(self, error: BaseException | None = None) -> None:
        if error is not None and not self.db.closed:
            try:
                self.q(f"UPDATE {self.schema}.jobs SET state = %s, last_error = coalesce(%s, last_error), "
                       "updated_at = now() WHERE job_id = %s AND state <> 'finished'",
                       ("failed" if isinstance(error, MadlibMopError) else "interrupted",
                        str(error)[:2000], self.job_id))
            except psycopg.Error:
                pass
        self.db.close()


def _metrics_due(iteration: int, frequency: int, iterations: int) -> bool:
    return iteration % frequency == 0 or iteration == iterations


def _weighted(results: list[dict]) -> dict:
    """Row-weighted means of the loss and metrics of several visits or evaluations."""
    rows = sum(r["rows"] for r in results)
    names = results[0]["metrics"].keys()
    return {n: sum(r["metrics"][n] * r["rows"] for r in results) / rows for n in names}


def _last(values: list | None):
    return values[-1] if values else None
