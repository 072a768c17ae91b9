"""madlib_keras_fit_multiple_model, fit_multiple, madlib_keras_fit and resume: the calls
that start or continue a job (its lifecycle is `job.lifecycle`'s)."""

from __future__ import annotations

from typing import Any

from madlib_mop import errors
from madlib_mop.errors import MadlibMopError
from madlib_mop.job import lifecycle, temporary
from madlib_mop.job.plan import plan_job


def fit_multiple_model(plpy: Any, source_table: str, model_output_table: str,
                       model_selection_table: str, num_iterations: int, use_gpus: bool = False,
                       validation_table: str | None = None,
                       metrics_compute_frequency: int | None = None, warm_start: bool = False,
                       name: str | None = None, description: str | None = None,
                       use_caching: bool = True, seed: int = 0, pruner: str | None = None,
                       if_output_exists: str | None = "error", *,
                       can_commit: bool = False, single: bool = False) -> None:
    extra = {"single": True} if single else {}
    if pruner is not None and pruner.strip():
        extra["pruner"] = pruner.strip()
    policy = _output_policy(if_output_exists, warm_start)
    if (warm_start or policy != "error") and \
            temporary.is_temporary(plpy, model_output_table, "model_output_table"):
        raise MadlibMopError("a temporary model_output_table is not continued or versioned",
                             sqlstate=errors.FEATURE_NOT_SUPPORTED,
                             hint="Train into an ordinary table to use warm_start or "
                                  "if_output_exists => 'new_version'.")
    with temporary.output(plpy, model_output_table, "model_output_table",
                          ("", "_summary", "_info"), job_output=True) as output:
        plan = plan_job(plpy, source_table, output, model_selection_table, num_iterations,
                        use_gpus, validation_table, metrics_compute_frequency, warm_start, name,
                        description, use_caching, seed, extra=extra, policy=policy)
        lifecycle.run_plan(plpy, plan, warm_start, can_commit, "madlib_keras_fit_multiple_model")


OUTPUT_POLICIES = ("error", "new_version")


def _output_policy(if_output_exists: str | None, warm_start: bool | None) -> str:
    """What a call does when its model_output_table holds a finished job: 'error' (MADlib's
    behaviour), or 'new_version': train into the next free `<out>_v<N>`.  Either way, an
    unfinished job of the same call is continued (a scheduled run picks up where an
    interrupted one stopped)."""
    policy = (if_output_exists or "error").strip().lower()
    if policy not in OUTPUT_POLICIES:
        raise MadlibMopError(f"if_output_exists must be 'error' or 'new_version', not {if_output_exists!r}",
                             sqlstate=errors.INVALID_PARAMETER_VALUE,
                             hint="Pass 'error' or 'new_version' (train into <out>_v2, _v3, ...).")
    if policy == "new_version" and warm_start:
        raise MadlibMopError("if_output_exists => 'new_version' and warm_start => TRUE exclude "
                             "each other", sqlstate=errors.INVALID_PARAMETER_VALUE,
                             hint="warm_start continues the existing output itself: pass one of them.")
    return policy


def resume(plpy: Any, job_id: int, *, can_commit: bool = False) -> None:
    lifecycle.resume(plpy, job_id, can_commit=can_commit)


SINGLE_FIT_CONFIGS = "pg_temp.madlib_mop_fit_configs"


def fit_single_model(plpy: Any, source_table: str, model: str, model_arch_table: str,
                     model_id: int, compile_params: str, fit_params: str | None,
                     num_iterations: int, use_gpus: bool = False,
                     validation_table: str | None = None,
                     metrics_compute_frequency: int | None = None, warm_start: bool = False,
                     name: str | None = None, description: str | None = None,
                     object_table: str | None = None, seed: int = 0) -> None:
    """madlib_keras_fit: one configuration, trained by the same engine (it hops over the
    segments like any model; with one model, one segment trains at a time).  Outputs:
    <model> (mst_key 1, model_weights, model_arch), <model>_summary with MADlib's
    single-model columns (the per-iteration arrays), and <model>_info."""
    from madlib_mop.api.model_catalog import load_model_selection_table

    if compile_params is None or not compile_params.strip():
        raise MadlibMopError("compile_params is empty: Compile parameters cannot be empty or NULL",
                             sqlstate=errors.INVALID_PARAMETER_VALUE,
                             hint="e.g. $$loss='categorical_crossentropy', optimizer='Adam(lr=0.01)', "
                                  "metrics=['accuracy']$$")
    for table in (SINGLE_FIT_CONFIGS, SINGLE_FIT_CONFIGS + "_summary"):
        # (to_regclass first: DROP ... IF EXISTS notices a session's missing pg_temp schema)
        if plpy.execute(f"SELECT to_regclass('{table}') IS NOT NULL AS e")[0]["e"]:
            plpy.execute(f"DROP TABLE {table}")
    load_model_selection_table(plpy, model_arch_table, SINGLE_FIT_CONFIGS, [model_id],
                               [compile_params], [fit_params or ""], object_table)
    fit_multiple_model(plpy, source_table, model, SINGLE_FIT_CONFIGS, num_iterations, use_gpus,
                       validation_table, metrics_compute_frequency, warm_start, name,
                       description, True, seed, single=True)
