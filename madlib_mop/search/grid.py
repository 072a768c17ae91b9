"""Grid and random search over MADlib's parameter grids (generate_model_configs).

A grid maps each compile or fit parameter to a list of choices, or (random search only) to
a distribution `[low, high, 'linear' | 'log' | 'log_near_one']`; `optimizer_params_list`
lists optimizer dicts, one of which is chosen per configuration.
"""

from __future__ import annotations

import itertools
import math
from typing import Any

import numpy as np

from madlib_mop import errors
from madlib_mop.errors import MadlibMopError
from madlib_mop.grammar.model_config import (COMPILE_KEYS, DEFAULT_OPTIMIZER, Config, Optimizer,
                                             check_keys, compile_params_from, fit_params_from,
                                             fit_params_text, make_optimizer, parse_optimizer)
from madlib_mop.search.base import Searcher

DISTRIBUTIONS = ("linear", "log", "log_near_one")


def is_distribution(values: list) -> bool:
    """[low, high, 'linear' | 'log' | 'log_near_one']: sample, do not enumerate."""
    return len(values) > 1 and isinstance(values[-1], str) and not any(
        isinstance(v, str) for v in values[:-1])


def check_distribution(key: str, values: list) -> tuple[float, float, str]:
    if len(values) != 3 or values[2] not in DISTRIBUTIONS or not all(
            isinstance(v, (int, float)) and not isinstance(v, bool) for v in values[:2]) \
            or not values[0] < values[1]:
        raise MadlibMopError(
            f"'{key}': {values!r} is not a distribution",
            sqlstate=errors.INVALID_PARAMETER_VALUE,
            hint="Write [lower_bound, upper_bound, 'linear' | 'log' | 'log_near_one'] "
                 "with lower_bound < upper_bound.")
    low, high, kind = values
    if kind == "log" and low <= 0 or kind == "log_near_one" and not (0 <= low < high < 1):
        raise MadlibMopError(
            f"'{key}': bounds {low}, {high} do not fit '{kind}' sampling",
            sqlstate=errors.INVALID_PARAMETER_VALUE,
            hint="'log' needs 0 < low; 'log_near_one' needs 0 <= low < high < 1.")
    return float(low), float(high), kind


def optimizer_dicts(grid: dict) -> list[dict]:
    if "optimizer_params_list" in grid:
        dicts = grid["optimizer_params_list"]
        overlap = {k for d in dicts if isinstance(d, dict) for k in d} & (set(grid) - {"optimizer_params_list"})
        if not all(isinstance(d, dict) and d for d in dicts) or overlap:
            raise MadlibMopError(
                "'optimizer_params_list' must be a list of non-empty dicts of optimizer "
                "arguments, which appear nowhere else in the grid",
                sqlstate=errors.INVALID_PARAMETER_VALUE,
                hint="e.g. 'optimizer_params_list': [{'optimizer': ['Adam'], 'lr': [0.001, 0.01]}]")
        return dicts
    if "optimizer" in grid:
        return [{"optimizer": grid["optimizer"]}]
    return [{"optimizer": [DEFAULT_OPTIMIZER]}]


def compile_keys(grid: dict) -> list[str]:
    keys = [k for k in grid if k not in ("optimizer_params_list", "optimizer")]
    check_keys({k: None for k in keys}, COMPILE_KEYS, "compile_params_grid", repr(grid))
    return keys


def optimizer_from(choice: dict, text: str) -> Optimizer:
    """An optimizer from one choice of an optimizer dict: {'optimizer': 'Adam', 'lr': 0.01}."""
    name = choice.get("optimizer", DEFAULT_OPTIMIZER)
    if isinstance(name, str) and "(" in name:
        base = parse_optimizer(name)
        return make_optimizer(base.name, base.arguments + tuple(
            (k, v) for k, v in choice.items() if k != "optimizer"), text)
    return make_optimizer(name, [(k, v) for k, v in choice.items() if k != "optimizer"], text)


def compile_params_text(optimizer: Optimizer, values: dict, text: str) -> str:
    # (names a grid's object table holds are checked by its caller: `api.model_catalog`, a job)
    return str(compile_params_from({"optimizer": optimizer, **values}, text, custom_names=None))


def _flat_items(grid: dict):
    for key, values in grid.items():
        if key == "optimizer_params_list":
            for optimizer_dict in values:
                if isinstance(optimizer_dict, dict):
                    yield from optimizer_dict.items()
        else:
            yield key, values


def _sample(values: list, key: str, rng) -> Any:
    if is_distribution(values):
        low, high, kind = check_distribution(key, values)
        if kind == "linear":
            return float(rng.uniform(low, high))
        if kind == "log":
            return float(10 ** rng.uniform(math.log10(low), math.log10(high)))
        return float(1 - 10 ** rng.uniform(math.log10(1 - high), math.log10(1 - low)))
    choice = values[int(rng.integers(len(values)))]
    return choice.item() if hasattr(choice, "item") else choice


class GridSearcher(Searcher):
    """Every combination, model_id x compile choices x fit choices, each asked once."""

    def __init__(self, model_ids: list[int], compile_grid: dict, fit_grid: dict):
        for grid in (compile_grid, fit_grid):
            for key, values in _flat_items(grid):
                if is_distribution(values) and values[-1] in DISTRIBUTIONS:
                    raise MadlibMopError(
                        f"'{key}': grid search cannot sample from a distribution",
                        sqlstate=errors.INVALID_PARAMETER_VALUE,
                        hint="Use search_type => 'random', or list the values.")
        text = repr(compile_grid)
        compile_texts = []
        keys = compile_keys(compile_grid)
        for optimizer_dict in optimizer_dicts(compile_grid):
            names = list(optimizer_dict)
            for choice in itertools.product(*(optimizer_dict[k] for k in names)):
                optimizer = optimizer_from(dict(zip(names, choice)), text)
                for values in itertools.product(*(compile_grid[k] for k in keys)):
                    compile_texts.append(compile_params_text(optimizer, dict(zip(keys, values)), text))
        fit_keys = list(fit_grid)
        fit_texts = [
            fit_params_text(fit_params_from(dict(zip(fit_keys, values)), repr(fit_grid)))
            for values in itertools.product(*(fit_grid[k] for k in fit_keys))]
        self._configs = iter([Config(m, c, f) for m in model_ids
                              for c in dict.fromkeys(compile_texts) for f in dict.fromkeys(fit_texts)])
        self._done = False

    def ask(self) -> Config | None:
        config = next(self._configs, None)
        self._done = config is None
        return config

    def finished(self) -> bool:
        return self._done


class RandomSearcher(Searcher):
    """Distinct configurations drawn with a generator seeded by random_state; at most
    `num_configs` of them."""

    def __init__(self, model_ids: list[int], compile_grid: dict, fit_grid: dict,
                 num_configs: int, random_state: int | None):
        self._rng = np.random.default_rng(random_state)
        self._model_ids, self._compile_grid, self._fit_grid = model_ids, compile_grid, fit_grid
        self._text = repr(compile_grid)
        self._keys = compile_keys(compile_grid)
        self._optimizer_dicts = optimizer_dicts(compile_grid)
        self._limit = num_configs
        self._seen: set[Config] = set()

    def ask(self) -> Config | None:
        if self.finished():
            return None
        rng = self._rng
        for _ in range(100 * self._limit):
            model_id = self._model_ids[int(rng.integers(len(self._model_ids)))]
            optimizer_dict = self._optimizer_dicts[int(rng.integers(len(self._optimizer_dicts)))]
            optimizer = optimizer_from({k: _sample(v, k, rng) for k, v in optimizer_dict.items()},
                                      self._text)
            compile_text = compile_params_text(
                optimizer, {k: _sample(self._compile_grid[k], k, rng) for k in self._keys}, self._text)
            fit = fit_params_from({k: _sample(v, k, rng) for k, v in self._fit_grid.items()},
                                  repr(self._fit_grid))
            config = Config(model_id, compile_text, fit_params_text(fit))
            if config not in self._seen:
                self._seen.add(config)
                return config
        raise MadlibMopError(
            f"could only draw {len(self._seen)} distinct configurations of {self._limit}",
            sqlstate=errors.INVALID_PARAMETER_VALUE,
            hint="The grids hold fewer combinations: ask for fewer, or widen the grids.")

    def finished(self) -> bool:
        return len(self._seen) >= self._limit


def all_configs(searcher: Searcher) -> list[Config]:
    """Everything a searcher that needs no results proposes (grid, random)."""
    configs = []
    while (config := searcher.ask()) is not None:
        configs.append(config)
    return configs
