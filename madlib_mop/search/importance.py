"""Which hyperparameters mattered: Optuna's importance evaluators over a job's models.

Each model is a completed trial: its hyperparameters (as the grammar reads its configuration,
plus its architecture's model_id) and its value of the objective.  Only the hyperparameters
that differ between the models are asked about (one that never changed explains nothing).
Numbers are continuous (on a log scale when they are positive and span at least a factor of
10, as learning rates are searched), anything else is categorical.

fANOVA (Optuna's default: a seeded random forest over the models' values, so the same job
gives the same answer) or PED-ANOVA (how the best models' values of each hyperparameter
differ from all the models').  Too few models, or models that all scored the same, give an
error rather than numbers: an importance computed from them would be noise.
"""

from __future__ import annotations

import logging
import warnings
from typing import Any, Mapping, Sequence

from madlib_mop import errors
from madlib_mop.errors import MadlibMopError

# PED-ANOVA compares the top 10% of models (at least 2) with all of them: with fewer than 4
# models its answer is 0 for every hyperparameter, and fANOVA's forest has nothing to split.
MIN_MODELS = 4
EVALUATORS = ("fanova", "ped_anova")  # Optuna's default first
TOP_MODELS = 5


def _distribution(values: list[Any]):
    import optuna

    numbers = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values)
    if numbers:
        low, high = float(min(values)), float(max(values))
        return optuna.distributions.FloatDistribution(low, high, log=low > 0 and high / low >= 10)
    return optuna.distributions.CategoricalDistribution(sorted({_category(v) for v in values}))


def _category(value: Any) -> str:
    return "default" if value is None else str(value)


def varying(configs: Sequence[Mapping[str, Any]]) -> list[str]:
    """The hyperparameters whose value is not the same in every configuration (a key that
    some configurations lack counts as a value of its own), in name order."""
    names = sorted({name for config in configs for name in config})
    return [name for name in names
            if len({repr(config.get(name)) for config in configs}) > 1]


def target_quantile(models: int) -> float:
    """PED-ANOVA's top quantile: Optuna's 10%, but at least 5 models (its documentation's
    advice for a stable answer), and at most half of them (the top must differ from all)."""
    return min(0.5, max(0.1, TOP_MODELS / models))


def _evaluator(name: str, seed: int, models: int):
    import optuna

    if name == "ped_anova":
        with warnings.catch_warnings():  # experimental in Optuna 4.9 (pinned in pyproject.toml)
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            return optuna.importance.PedAnovaImportanceEvaluator(target_quantile=target_quantile(models))
    return optuna.importance.FanovaImportanceEvaluator(seed=seed)


def importances(configs: Sequence[Mapping[str, Any]], values: Sequence[float], maximize: bool,
                evaluator: str = "fanova", seed: int = 0) -> list[tuple[str, float]]:
    """(hyperparameter, importance) best first, importances summing to 1 (ties by name).

    `configs[i]` are model i's hyperparameters and `values[i]` its objective value (finite)."""
    import optuna

    if evaluator not in EVALUATORS:
        raise MadlibMopError(f"evaluator {evaluator!r} is not known", sqlstate=errors.INVALID_PARAMETER_VALUE,
                             hint="Use 'fanova' (the default) or 'ped_anova'.")
    if len(configs) < MIN_MODELS:
        raise MadlibMopError(
            f"{len(configs)} model(s) with a value of the objective: at least {MIN_MODELS} are needed "
            "to tell which hyperparameters mattered", sqlstate=errors.DATA_EXCEPTION,
            hint="Train more configurations (a bigger grid, or num_configs).")
    names = varying(configs)
    if not names:
        raise MadlibMopError("every model has the same hyperparameters: none can explain a difference",
                             sqlstate=errors.DATA_EXCEPTION,
                             hint="Importance compares configurations that differ.")
    if max(values) - min(values) <= 1e-12 * max(1.0, abs(max(values))):
        raise MadlibMopError("every model scored the same: no hyperparameter made a difference to "
                             "explain", sqlstate=errors.DATA_EXCEPTION,
                             hint="Train longer, or name another objective.")
    optuna.logging.set_verbosity(logging.WARNING)
    distributions = {name: _distribution([config.get(name) for config in configs]) for name in names}
    study = optuna.create_study(direction="maximize" if maximize else "minimize")
    for config, value in zip(configs, values):
        params = {}
        for name, distribution in distributions.items():
            raw = config.get(name)
            params[name] = _category(raw) if isinstance(
                distribution, optuna.distributions.CategoricalDistribution) else float(raw)
        study.add_trial(optuna.trial.create_trial(params=params, distributions=distributions,
                                                  value=float(value)))
    found = optuna.importance.get_param_importances(study, evaluator=_evaluator(evaluator, seed, len(configs)),
                                                    normalize=True)
    if not any(v > 0 for v in found.values()):
        raise MadlibMopError("the models' results do not single out any hyperparameter",
                             sqlstate=errors.DATA_EXCEPTION,
                             hint="Train more configurations, or try the other evaluator.")
    return sorted(((name, float(v)) for name, v in found.items()),
                  key=lambda item: (-item[1], item[0]))

