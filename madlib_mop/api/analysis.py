"""After the search: which hyperparameters mattered, the trade-offs between objectives, and
a job's history as rows any BI tool reads.

    hyperparameter_importance(model_output_table, objective, evaluator, iteration)
    pareto_front(model_output_table, objectives)
    _mop_intermediate_values(job_id)      behind the view intermediate_values
    _mop_optimization_history(job_id)     behind the view optimization_history

Everything is read as the caller: a model output table and its `_info` with the caller's
rights, a job through `jobs` (each role sees its own).  Models' values come from `_info`,
whose metric series the job writes as models finish iterations, so all of this works on a
running job as far as it has gone.
"""

from __future__ import annotations

import math
from typing import Any

from madlib_mop import errors
from madlib_mop.db import catalog
from madlib_mop.errors import MadlibMopError
from madlib_mop.grammar import model_config
from madlib_mop.job import repository
from madlib_mop.job.record import JobRecord
from madlib_mop.json_values import json_value
from madlib_mop.search import importance as importance_of, pareto
from madlib_mop.search.objective import Objective, direction_of, objective_from
from madlib_mop.search.setup import search_of_job

# Columns of `_info` that are costs: lower is better.
_COSTS = ("inference_ms_per_row", "parameter_count", "training_seconds", "model_size")
_INFO = ("SELECT mst_key, model_id, compile_params, fit_params, metrics_iters, metrics_elapsed_time, "
         "training_metrics_all, validation_metrics_all, metrics_type, "
         "to_jsonb(i)->>'status' AS status, stopped_iteration FROM {} i ORDER BY mst_key")


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value)


class JobResults:
    """A job's models as its `_info` has them, and the objective they are judged by."""

    def __init__(self, plpy: Any, info_name: str, objective: Objective):
        self.objective = objective
        self.models = [dict(r) for r in plpy.execute(_INFO.format(info_name))]

    def series(self, model: dict) -> list[tuple[int, float | None, dict, dict]]:
        """(iteration, elapsed seconds, training metrics, validation metrics) per computed
        iteration of a model."""
        training = json_value(model["training_metrics_all"]) or {}
        validation = json_value(model["validation_metrics_all"]) or {}
        elapsed = model["metrics_elapsed_time"] or []
        rows = []
        for k, iteration in enumerate(model["metrics_iters"] or []):
            rows.append((iteration, elapsed[k] if k < len(elapsed) else None,
                         {n: v[k] for n, v in training.items() if k < len(v)},
                         {n: v[k] for n, v in validation.items() if k < len(v)}))
        return rows

    def value(self, training: dict, validation: dict) -> float | None:
        values = validation if self.objective.source == "validation" else training
        value = values.get(self.objective.metric)
        return float(value) if _finite(value) else None


def job_of(plpy: Any, table: catalog.Table) -> JobRecord | None:
    """The caller's latest job that wrote `table` (None: another role's, not a job's, or a
    row whose arguments are not a job's: an analysis reads what it can)."""
    try:
        return repository.job_writing(plpy, catalog.name_parts(plpy, table.oid))
    except MadlibMopError:
        return None


def _job_objective(job: JobRecord | None, compile_params: list[str], has_validation: bool) -> Objective:
    """The objective the job judged its models by (its pruner's or automl's metric); without
    a job row, the loss, as a job without either."""
    if job is not None:
        arguments = job.arguments
        try:
            return search_of_job(arguments.automl, arguments.pruner, arguments.num_iterations,
                                 dict(enumerate(compile_params)), has_validation).objective
        except MadlibMopError:  # a job whose arguments an earlier version recorded
            pass
    return Objective("loss", "validation" if has_validation else "training", False)


def info_of(plpy: Any, table: catalog.Table) -> catalog.Table:
    """The `_info` table of a model selection job's output (readable by the caller)."""
    info = plpy.execute(plpy.prepare(
        "SELECT to_regclass(format('%I.%I', n.nspname, c.relname || '_info'))::oid AS oid "
        "FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.oid = $1", ["oid"]),
        [table.oid])[0]["oid"]
    if info is None or "validation_metrics_all" not in catalog.columns(plpy, catalog.Table(int(info), "")):
        raise MadlibMopError(f"{table.name} is not the output of a model selection job",
                             sqlstate=errors.INVALID_PARAMETER_VALUE,
                             hint="Pass the model_output_table of madlib_keras_fit_multiple_model or "
                                  "madlib_keras_automl (its <out>_info holds the models' results).")
    return catalog.sibling_table(plpy, table, "_info")


def results_of(plpy: Any, model_output_table: str, objective: str | None) -> JobResults:
    table = catalog.resolve_table(plpy, model_output_table, argument="model_output_table")
    results = JobResults(plpy, info_of(plpy, table).name, Objective("loss", "training", False))
    has_validation = any(json_value(m["validation_metrics_all"]) for m in results.models)
    compile_params = [m["compile_params"] for m in results.models]
    if objective is None or not objective.strip():
        results.objective = _job_objective(job_of(plpy, table), compile_params, has_validation)
    else:
        words = objective.split()
        direction = {"max": "maximize", "min": "minimize"}.get(words[-1].lower()) if len(words) == 2 else None
        results.objective = objective_from(
            words[0], direction, has_validation,
            [model_config.parse_compile_params(c, custom_names=None).metrics for c in compile_params], "objective")
    return results


def ranked_models(results: JobResults, threshold: float | None = None) -> list[tuple[dict, float, float]]:
    """The job's usable models, best first by its objective ((model, value, when its last
    iteration ended)): those that neither diverged nor failed, have finished an iteration, and
    (`threshold`) whose value is at least as good; ties by mst_key."""
    goal, ranked = results.objective, []
    for model in results.models:
        series = results.series(model)
        if model["status"] in ("diverged", "failed") or not series:
            continue
        value = results.value(series[-1][2], series[-1][3])
        if value is None or (threshold is not None and (value < threshold if goal.maximize else value > threshold)):
            continue
        ranked.append((model, value, series[-1][1] or 0.0))
    return sorted(ranked, key=lambda c: ((-c[1] if goal.maximize else c[1]), c[0]["mst_key"]))


def _trials(results: JobResults, iteration: int | None) -> tuple[list[dict], list[float]]:
    """Each counted model's hyperparameters and value: finished models at their last
    iteration, or every model at `iteration`."""
    configs, values = [], []
    for model in results.models:
        series = results.series(model)
        if iteration is not None:
            series = [s for s in series if s[0] == iteration]
        elif model["status"] != "finished":
            continue
        value = results.value(series[-1][2], series[-1][3]) if series else None
        if value is not None:
            configs.append({"model_id": model["model_id"],
                            **model_config.hyperparameters(model["compile_params"], model["fit_params"])})
            values.append(value)
    return configs, values


def _values_per_iteration(results: JobResults) -> dict[int, int]:
    """iteration -> how many models have a value of the objective there."""
    counts: dict[int, int] = {}
    for model in results.models:
        for iteration, _, training, validation in results.series(model):
            if results.value(training, validation) is not None:
                counts[iteration] = counts.get(iteration, 0) + 1
    return counts


def hyperparameter_importance(plpy: Any, model_output_table: str, objective: str | None = None,
                              evaluator: str | None = "fanova", iteration: int | None = None
                              ) -> list[tuple[str, float]]:
    """(hyperparameter, importance) of a job's models, most important first.  A model counts
    with its value of the objective at its last iteration once it finished (as Optuna counts
    completed trials, not pruned ones), or at `iteration` for every model that reached it.
    When too few finished (a pruner stopped the others, or the job still trains), the
    models are compared at the last iteration enough of them reached, and a NOTICE says so."""
    results = results_of(plpy, model_output_table, objective)
    counts = _values_per_iteration(results)
    if iteration is not None and iteration not in counts:
        raise MadlibMopError(
            f"iteration {iteration}: no model of {model_output_table} has a value of "
            f"{results.objective.label} there", sqlstate=errors.INVALID_PARAMETER_VALUE,
            hint="Its models have values at iterations " + (", ".join(map(str, sorted(counts))) or "none yet") + ".")
    configs, values = _trials(results, iteration)
    shared = [i for i, n in counts.items() if n >= importance_of.MIN_MODELS]
    if iteration is None and len(configs) < importance_of.MIN_MODELS and shared:
        iteration = max(shared)
        plpy.notice(f"{len(configs)} model(s) finished: comparing the {counts[iteration]} models at "
                    f"iteration {iteration}, the last that at least {importance_of.MIN_MODELS} reached "
                    "(iteration => k picks another)")
        configs, values = _trials(results, iteration)
    try:
        return importance_of.importances(configs, values, results.objective.maximize,
                                         evaluator or "fanova")
    except MadlibMopError as error:
        if any(m["status"] == "training" for m in results.models):
            error.hint = f"{error.hint or ''} The job is still training: its models count as they finish.".strip()
        raise


def _direction(column: str, metric: str | None) -> bool | None:
    if column in _COSTS or "loss" in column:
        return False
    if "metrics" in column and metric:
        return direction_of(metric)
    return None


def pareto_front(plpy: Any, model_output_table: str, objectives: list[str] | None
                 ) -> list[tuple[int, list[float]]]:
    """The models of a job that no other model beats on every objective (columns of
    `_info`), with their values in the objectives' order."""
    table = catalog.resolve_table(plpy, model_output_table, argument="model_output_table")
    info = info_of(plpy, table)
    columns = catalog.columns(plpy, info)
    metric = next((m["metrics_type"][0] for m in plpy.execute(
        f"SELECT metrics_type FROM {info.name} WHERE metrics_type IS NOT NULL LIMIT 1")), None) \
        if "metrics_type" in columns else None
    wanted = pareto.parse(objectives, lambda column: _direction(column, metric))
    for objective in wanted:
        column = columns.get(objective.column)
        if column is None or not column.is_numeric:
            numeric = sorted(n for n, c in columns.items() if c.is_numeric and n != "mst_key")
            raise MadlibMopError(
                f"{info.name} has no numeric column {objective.column}",
                sqlstate=errors.UNDEFINED_COLUMN if column is None else errors.DATATYPE_MISMATCH,
                hint="Objectives are numeric columns of _info: " + ", ".join(numeric) + ".")
    rows = plpy.execute("SELECT mst_key, " + ", ".join(
        f"{plpy.quote_ident(o.column)}::float8 AS {plpy.quote_ident('v%d' % k)}"
        for k, o in enumerate(wanted)) + f" FROM {info.name} ORDER BY mst_key")
    keys, points = [], []
    for row in rows:
        point = [row[f"v{k}"] for k in range(len(wanted))]
        if all(_finite(v) for v in point):  # a model without a value is on no front
            keys.append(row["mst_key"])
            points.append(point)
    return [(keys[i], points[i]) for i in pareto.front(points, [o.maximize for o in wanted])]


def _job_results(plpy: Any, job_id: int) -> JobResults | None:
    """A job of the caller's, as `JobResults`; None when its `_info` is gone or unreadable
    (a view over every job never fails for one job's tables)."""
    try:
        job = repository.job_results_of(plpy, job_id)
    except MadlibMopError:  # a row whose arguments are not a job's
        return None
    if job is None or "info" not in job.table_names:
        return None
    schema, name = job.table_names["info"]
    found = plpy.execute(plpy.prepare(
        "SELECT c.oid FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
        "WHERE n.nspname = $1 AND c.relname = $2 AND has_table_privilege(c.oid, 'SELECT')",
        ["name", "name"]), [schema, name])
    if not found:
        return None
    info_name = f"{plpy.quote_ident(schema)}.{plpy.quote_ident(name)}"
    results = JobResults(plpy, info_name, Objective("loss", "training", False))
    results.objective = _job_objective(job, [m["compile_params"] for m in results.models],
                                       job.validation_table is not None)
    return results


def intermediate_values(plpy: Any, job_id: int) -> list[dict]:
    """Each model's metrics at each computed iteration, and where a pruner stopped it."""
    results = _job_results(plpy, job_id)
    if results is None:
        return []
    rows = []
    for model in results.models:
        for iteration, elapsed, training, validation in results.series(model):
            rows.append({
                "mst_key": model["mst_key"], "iteration": iteration, "elapsed_seconds": elapsed,
                "objective": results.objective.label, "value": results.value(training, validation),
                "training_loss": training.get("loss"), "validation_loss": validation.get("loss"),
                "metric": (model["metrics_type"] or [None])[0],
                "training_metric": training.get((model["metrics_type"] or [None])[0]),
                "validation_metric": validation.get((model["metrics_type"] or [None])[0]),
                "status": model["status"],
                "pruned": model["status"] == "stopped" and model["stopped_iteration"] == iteration})
    return rows


def optimization_history(plpy: Any, job_id: int) -> list[dict]:
    """Every (model, iteration) value of the objective in the order they were reached, with
    the best so far in time and the best of all models up to that iteration."""
    results = _job_results(plpy, job_id)
    if results is None:
        return []
    better = max if results.objective.maximize else min
    reports = sorted(((elapsed if elapsed is not None else math.inf, model["mst_key"], iteration,
                       results.value(training, validation))
                      for model in results.models
                      for iteration, elapsed, training, validation in results.series(model)),
                     key=lambda r: (r[0], r[1], r[2]))
    by_iteration: dict[int, float] = {}
    for _, _, iteration, value in reports:
        if value is not None:
            by_iteration[iteration] = better(by_iteration.get(iteration, value), value)
    rows, best, best_key = [], None, None
    for number, (elapsed, key, iteration, value) in enumerate(reports, start=1):
        if value is not None and (best is None or better(best, value) != best):
            best, best_key = value, key
        reached = [v for i, v in by_iteration.items() if i <= iteration]
        rows.append({"report": number, "elapsed_seconds": None if elapsed == math.inf else elapsed,
                     "mst_key": key, "iteration": iteration, "objective": results.objective.label,
                     "value": value, "best_value": best, "best_mst_key": best_key,
                     "best_value_by_iteration": better(reached) if reached else None})
    return rows
