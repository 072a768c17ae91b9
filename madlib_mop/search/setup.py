"""A job's search, rebuilt from its recorded arguments whenever its coordinator starts (a
resumed job gets the same searcher and pruner, which replay the recorded results)."""

from __future__ import annotations

from typing import Mapping, NamedTuple

from madlib_mop.grammar import model_config
from madlib_mop.search import hyperband
from madlib_mop.search.base import NoPruner, Pruner, Searcher
from madlib_mop.search.objective import Objective, objective_from  # noqa: F401 (re-exported)
from madlib_mop.search.pruners import HyperbandPruner, pruner_from
from madlib_mop.search.tpe import OptunaSearcher, SearchSpace


class Search(NamedTuple):
    searcher: Searcher | None
    pruner: Pruner
    objective: Objective


def objective_for(metric: str | None, direction: str | None, compile_params: Mapping[int, str] | list,
                  has_validation: bool, argument: str) -> Objective:
    texts = compile_params.values() if isinstance(compile_params, Mapping) else compile_params
    return objective_from(metric, direction, has_validation,
                          [model_config.parse_compile_params(t, custom_names=None).metrics for t in texts], argument)


def hyperband_brackets(R: int, eta: int, skip_last: int) -> dict[int, int]:
    """mst_key -> bracket: bracket s_max gets the first n of its round 0, and so on (MADlib's
    numbering)."""
    brackets, key = {}, 0
    for s, rungs in hyperband.bracket_rungs(R, eta, skip_last).items():
        for _ in range(rungs[0].n_i):
            key += 1
            brackets[key] = s
    return brackets


def search_of_job(automl: Mapping | None, pruner_text: str | None, iterations: int,
                  compile_params: Mapping[int, str], has_validation: bool) -> Search:
    """The search a job's recorded arguments describe: madlib_keras_automl's (`automl`), or
    a fit's pruner (`pruner_text`), over `iterations` iterations."""
    if automl is None:
        def objective_of(metric, direction):
            return objective_for(metric, direction, compile_params, has_validation, "pruner")
        pruner = pruner_from(pruner_text, iterations, objective_of)
        return Search(None, pruner or NoPruner(), pruner.objective if pruner else objective_of(None, None))
    params = automl["params"]
    # Every configuration the grid can give must report the objective.
    objective = objective_from(params.get("metric"), params.get("direction"), has_validation,
                               automl["metric_choices"], "automl_params")
    if automl["method"] == "hyperband":
        R, eta, skip_last = params["R"], params["eta"], params["skip_last"]
        return Search(None, HyperbandPruner(objective, hyperband_brackets(R, eta, skip_last), R,
                                            eta, skip_last, iterations), objective)
    space = SearchSpace(automl["model_id_list"],
                        model_config.parse_grid(automl["compile_params_grid"], "compile_params_grid"),
                        model_config.parse_fit_grid(automl["fit_params_grid"]))
    searcher = OptunaSearcher(space, objective, params["num_configs"], iterations, params["algorithm"],
                              automl["random_state"] or 0, params["parallelism"], params["startup_configs"])
    return Search(searcher, NoPruner(), objective)
