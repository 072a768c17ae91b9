"""Steering a running job from SQL, as a person watching it would:

    stop_model(job_id, mst_key)                                   train it no further
    clone_model(job_id, mst_key, compile_params, fit_params)      a new configuration that
                                                                  starts from its current state
    add_model_config(job_id, model_id, compile_params, fit_params) a new configuration
    set_model_iterations(job_id, mst_key, num_iterations)         fewer or more iterations

Each call checks the request here (the job is the caller's, the model is the job's, the
parameters parse and the configuration fits the data) and records it in `steering` with who
and when; the job's coordinator applies it at the model's next iteration boundary and
records where (`job.steering`), so that a resumed or replayed job does the same.  Only the
job's owner steers it (a superuser too must SET ROLE to it).
"""

from __future__ import annotations

import json
from typing import Any

from madlib_mop import errors
from madlib_mop.db import catalog
from madlib_mop.errors import MadlibMopError
from madlib_mop.grammar import model_config
from madlib_mop.job import keras_work, plan, repository, store
from madlib_mop.job.record import JobRecord, JobState

_OPEN = frozenset(JobState) - {JobState.FINISHED}
MAX_ITERATIONS_FACTOR = 10  # a model's iterations: at most this many times the job's


def _job(plpy: Any, job_id: int | None) -> JobRecord:
    if job_id is None:
        raise MadlibMopError("job_id must name a job", sqlstate=errors.NULL_VALUE_NOT_ALLOWED,
                             hint=f"SELECT job_id, model_output_table FROM "
                                  f"{catalog.extension_schema(plpy)}.job_progress; lists your jobs.")
    job = repository.own_job(plpy, job_id)
    if job.state not in _OPEN:
        raise MadlibMopError(f"job {job_id} is {job.state}: there is nothing left to steer",
                             sqlstate=errors.INVALID_PARAMETER_VALUE,
                             hint="Steer a job while it runs, or before it is resumed; warm_start "
                                  "continues a finished one.")
    arguments = job.arguments
    if arguments.automl or arguments.pruner:
        # Their searcher and pruner decide from every model's reports: a person's models and
        # stops would change what they decided, and a resumed job would decide otherwise.
        raise MadlibMopError(f"job {job_id} is steered by its "
                             + ("automl search" if arguments.automl else "pruner"),
                             sqlstate=errors.FEATURE_NOT_SUPPORTED,
                             hint="Steer a madlib_keras_fit_multiple_model job without a pruner.")
    return job


def _model(plpy: Any, job: JobRecord, mst_key: int | None) -> dict:
    models = catalog.qualified_name(plpy, list(job.table_names["models"]))
    found = store.job_models(plpy, models, mst_key) if mst_key is not None else []
    if not found:
        raise MadlibMopError(f"mst_key {mst_key} is not a model of job {job.job_id}",
                             sqlstate=errors.INVALID_PARAMETER_VALUE,
                             hint=f"SELECT mst_key, status FROM "
                                  f"{catalog.qualified_name(plpy, list(job.table_names['info']))};")
    return found[0]


def _request(plpy: Any, job: JobRecord, action: str, mst_key: int | None, params: dict, when: str) -> int:
    action_id = plpy.execute(plpy.prepare(
        f"INSERT INTO {catalog.extension_schema(plpy)}.steering (job_id, action, mst_key, params) "
        "VALUES ($1, $2, $3, $4) RETURNING action_id", ["bigint", "text", "integer", "jsonb"]),
        [job.job_id, action, mst_key, json.dumps(params)])[0]["action_id"]
    plpy.notice(f"steering action {action_id} recorded: job {job.job_id} applies it {when}"
                + ("" if job.state in (JobState.RUNNING, JobState.QUEUED) else " once it is resumed"))
    return action_id


def _check_config(plpy: Any, job: JobRecord, config: dict) -> None:
    """The configuration parses and its model fits the job's data (as a searcher's does);
    its losses and metrics are built in or functions the job's object table holds."""
    arguments = job.arguments
    model_config.parse_compile_params(config["compile_params"], custom_names=tuple(
        (arguments.custom_functions or {}).get("digests", ())))
    model_config.fit_params_from(model_config.parse_keyword_text(config["fit_params"], "fit_params"),
                                 config["fit_params"] or "")
    with keras_work.for_session(plpy) as keras:
        plan.check_config(plpy, config, job.source_table, arguments, keras)


def stop_model(plpy: Any, job_id: int, mst_key: int) -> int:
    job = _job(plpy, job_id)
    _model(plpy, job, mst_key)
    return _request(plpy, job, "stop", mst_key, {}, f"when mst_key {mst_key} ends its current iteration")


def set_model_iterations(plpy: Any, job_id: int, mst_key: int, num_iterations: int) -> int:
    job = _job(plpy, job_id)
    _model(plpy, job, mst_key)
    most = MAX_ITERATIONS_FACTOR * job.arguments.num_iterations
    if num_iterations is None or not 1 <= num_iterations <= most:
        raise MadlibMopError(f"num_iterations must be between 1 and {most}, not {num_iterations}",
                             sqlstate=errors.INVALID_PARAMETER_VALUE,
                             hint=f"The model's iterations in all, counted from the start (at most "
                                  f"{MAX_ITERATIONS_FACTOR} times the job's); stop_model() stops it where it is.")
    return _request(plpy, job, "iterations", mst_key, {"num_iterations": num_iterations},
                    f"to mst_key {mst_key} (not before the end of its current iteration)")


def clone_model(plpy: Any, job_id: int, mst_key: int, compile_params: str | None = None,
                fit_params: str | None = None) -> int:
    job = _job(plpy, job_id)
    source = _model(plpy, job, mst_key)
    config = {"mst_key": 0, "model_id": source["model_id"], "model_arch": source["model_arch"],
              "compile_params": compile_params if compile_params is not None else source["compile_params"],
              "fit_params": fit_params if fit_params is not None else source["fit_params"]}
    _check_config(plpy, job, config)
    return _request(plpy, job, "clone", mst_key,
                    {"compile_params": config["compile_params"], "fit_params": config["fit_params"]},
                    f"when mst_key {mst_key} ends its current iteration, from its state then")


def add_model_config(plpy: Any, job_id: int, model_id: int, compile_params: str, fit_params: str) -> int:
    job = _job(plpy, job_id)
    arch_oid = _architecture_table(plpy, job)
    arch_table = catalog.qualified_name(plpy, catalog.name_parts(plpy, arch_oid))
    rows = plpy.execute(plpy.prepare(f"SELECT model_arch::text AS model_arch FROM {arch_table} "
                                     "WHERE model_id = $1", ["integer"]), [model_id])
    if not rows:
        raise MadlibMopError(f"model_id {model_id} is not in {arch_table}", sqlstate=errors.INVALID_PARAMETER_VALUE,
                             hint=f"SELECT model_id, name FROM {arch_table}; lists the architectures.")
    config = {"mst_key": 0, "model_id": model_id, "model_arch": rows[0]["model_arch"],
              "compile_params": compile_params, "fit_params": fit_params}
    _check_config(plpy, job, config)
    return _request(plpy, job, "add", None,
                    {"model_id": model_id, "model_arch_table": catalog.name_parts(plpy, arch_oid),
                     "compile_params": compile_params, "fit_params": fit_params}, "at once")


def _architecture_table(plpy: Any, job: JobRecord) -> int:
    """The oid of the job's architecture table: automl's, or the one its model selection
    table's summary names."""
    arguments = job.arguments
    if arguments.automl:
        return catalog.resolve_table(plpy, catalog.qualified_name(plpy, arguments.automl["model_arch_table"]),
                                     argument="model_arch_table").oid
    selection = catalog.resolve_table(plpy, job.model_selection_table, argument="model_selection_table")
    found = catalog.summary_of(plpy, selection)
    if not found or not found[1] or "model_arch_table" not in found[1][0]:
        raise MadlibMopError(f"{selection.name} has no summary naming its model_arch_table",
                             sqlstate=errors.UNDEFINED_TABLE,
                             hint="Add a configuration to a job of a model selection table made by "
                                  "generate_model_configs or load_model_selection_table.")
    return catalog.resolve_table(plpy, found[1][0]["model_arch_table"], argument="model_arch_table").oid
