"""Hyperopt-style search (MADlib's automl_method 'hyperopt'): TPE or random sampling with
Optuna's samplers through its ask-and-tell interface, asked one configuration at a time.

Configurations are numbered in the order they are asked; the n-th becomes mst_key n + 1.
The first `parallelism` are proposed at once; configuration n (n >= parallelism) is
proposed once configurations 0 .. n - parallelism have finished, from exactly their final
results, by a sampler seeded from (random_state, n).  So each configuration depends on
the seed and recorded results only, never on which model finished first, and a resumed job
proposes the same ones again.

The search space is MADlib's grids: a list is a categorical choice, [low, high, 'linear' |
'log' | 'log_near_one'] a distribution; `optimizer_params_list` chooses one optimizer dict,
whose parameters are then sampled (as conditional parameters).
"""

from __future__ import annotations

import logging

import numpy as np

from madlib_mop.grammar.model_config import Config, fit_params_from, fit_params_text
from madlib_mop.search.base import Report, Searcher
from madlib_mop.search.grid import (check_distribution, compile_keys, compile_params_text, optimizer_dicts,
                                    optimizer_from, is_distribution)
from madlib_mop.search.objective import Objective

ALGORITHMS = ("tpe", "rand")
_STREAM = 0x7E5  # separates the sampler seeds from the job's other random streams


def _suggest(trial, name: str, values: list):
    """One parameter's value from a trial: a distribution is sampled, a list chosen from
    (by index: Optuna's choices must be plain scalars), a single value taken as it is."""
    if is_distribution(values):
        low, high, kind = check_distribution(name, values)
        if kind == "log_near_one":  # 1 - x, log-uniform in x
            return 1.0 - trial.suggest_float(f"1-{name}", 1.0 - high, 1.0 - low, log=True)
        return trial.suggest_float(name, low, high, log=kind == "log")
    if len(values) == 1:
        return values[0]
    return values[trial.suggest_categorical(name, list(range(len(values))))]


class SearchSpace:
    """MADlib's grids as Optuna parameters."""

    def __init__(self, model_ids: list[int], compile_grid: dict, fit_grid: dict):
        self.model_ids, self.compile_grid, self.fit_grid = model_ids, compile_grid, fit_grid
        self.text = repr(compile_grid)
        self.keys = compile_keys(compile_grid)
        self.optimizer_dicts = optimizer_dicts(compile_grid)

    def size(self) -> int | None:
        """How many distinct configurations the grids hold (None: a distribution, unbounded)."""
        lists = [self.model_ids] + [self.compile_grid[k] for k in self.keys] + list(self.fit_grid.values())
        optimizer_lists = [list(d.values()) for d in self.optimizer_dicts]
        if any(is_distribution(v) for v in lists + [v for d in optimizer_lists for v in d]):
            return None
        product = 1
        for values in lists:
            product *= len(values)
        return product * sum(int(np.prod([len(v) for v in d])) for d in optimizer_lists)

    def config(self, trial) -> Config:
        model_id = _suggest(trial, "model_id", self.model_ids)
        index = _suggest(trial, "optimizer_params_list", list(range(len(self.optimizer_dicts))))
        optimizer_dict = self.optimizer_dicts[index]
        suffix = f"_{index + 1}" if len(self.optimizer_dicts) > 1 else ""
        optimizer = optimizer_from({k: _suggest(trial, k + suffix, v)
                                   for k, v in optimizer_dict.items()}, self.text)
        compile_text = compile_params_text(
            optimizer, {k: _suggest(trial, k, self.compile_grid[k]) for k in self.keys}, self.text)
        fit = fit_params_from({k: _suggest(trial, k, v) for k, v in self.fit_grid.items()},
                              repr(self.fit_grid))
        return Config(int(model_id), compile_text, fit_params_text(fit))


class OptunaSearcher(Searcher):
    def __init__(self, space: SearchSpace, objective: Objective, num_configs: int,
                 num_iterations: int, algorithm: str, random_state: int, parallelism: int,
                 startup_configs: int):
        self.space, self.objective = space, objective
        self.num_configs, self.num_iterations = num_configs, num_iterations
        self.algorithm, self.seed = algorithm, random_state
        self.parallelism, self.startup_configs = parallelism, startup_configs
        self.asked: list[tuple[dict, dict, Config]] = []  # params, distributions, config
        self.results: dict[int, float] = {}  # configuration number -> final objective value

    def tell(self, report: Report) -> None:
        if report.iteration == self.num_iterations:
            self.results[report.mst_key - 1] = self.objective.value(report)

    def lost(self, mst_key: int) -> None:
        self.results[mst_key - 1] = float("nan")  # a failed trial (see `ask`)

    def finished(self) -> bool:
        return len(self.asked) >= self.num_configs

    def ready(self) -> bool:
        """Can the next configuration be proposed now?"""
        n = len(self.asked)
        return n < self.num_configs and all(j in self.results for j in range(n - self.parallelism + 1))

    def ask(self) -> Config | None:
        if not self.ready():
            return None
        import optuna

        optuna.logging.set_verbosity(logging.WARNING)
        n = len(self.asked)
        known = range(n - self.parallelism + 1)
        seen = {config for *_, config in self.asked}
        for attempt in range(100):
            seed = int(np.random.SeedSequence([self.seed, _STREAM, n, attempt]).generate_state(1)[0])
            # TPE may keep proposing configurations already tried (on a small, discrete grid
            # it settles on the best few): after 10 such attempts, a random one.
            if self.algorithm == "tpe" and attempt < 10:
                sampler = optuna.samplers.TPESampler(seed=seed, n_startup_trials=self.startup_configs)
            else:
                sampler = optuna.samplers.RandomSampler(seed=seed)
            study = optuna.create_study(
                sampler=sampler, direction="maximize" if self.objective.maximize else "minimize")
            for j in known:
                params, distributions, _ = self.asked[j]
                value = self.results[j]
                study.add_trial(optuna.trial.create_trial(
                    params=params, distributions=distributions,
                    # A failed result (NaN) counts as a failed trial: TPE learns nothing from it.
                    value=None if value != value else value,
                    state=optuna.trial.TrialState.FAIL if value != value else optuna.trial.TrialState.COMPLETE))
            trial = study.ask()
            config = self.space.config(trial)
            if config not in seen:
                self.asked.append((dict(trial.params), dict(trial.distributions), config))
                return config
        # Nearly every configuration was tried: the search ends here.
        self.num_configs = n
        return None
