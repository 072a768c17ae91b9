"""Pruners: which models of a running job stop early, decided at iteration boundaries.

All three rank models against each other (by an `Objective`) at the same iteration, among a
group whose size is known in advance, so a decision never depends on which model reported
first: a model is kept (or stopped) as soon as that is certain whatever the missing
reports will say, and waits otherwise.

- `MedianPruner`: from iteration `warmup` on, every `interval` iterations, a model worse than
  the median of the models that reached the iteration stops (at least `min_models` of them).
- `SuccessiveHalvingPruner`: rungs at min_iterations * eta^j iterations; at each rung the best
  1/eta of the models that reached it go on.
- `HyperbandPruner`: successive halving within each Hyperband bracket (`hyperband`).
"""

from __future__ import annotations

from typing import Mapping, Sequence

from madlib_mop import errors
from madlib_mop.errors import MadlibMopError
from madlib_mop.grammar.model_config import parse_keyword_text
from madlib_mop.search.base import Decision, Pruner, Report
from madlib_mop.search.hyperband import Rung, bracket_rungs
from madlib_mop.search.objective import Objective


def rank_decision(objective: Objective, report: Report, group: Mapping[int, Report],
                  group_size: int, keep: int) -> Decision:
    """Keep the best `keep` of a group of `group_size` models (`group`: the reports in so
    far, the model's own included): STOP or CONTINUE once certain, else WAIT."""
    better = sum(1 for other in group.values()
                 if other.mst_key != report.mst_key and objective.better(other, report))
    missing = group_size - len(group)
    if better >= keep:
        return Decision.STOP
    if better + missing < keep:
        return Decision.CONTINUE
    return Decision.WAIT


class RankingPruner(Pruner):
    """Shared bookkeeping: the job's models, and why each stopped."""

    def __init__(self, objective: Objective):
        self.objective = objective
        self.models: list[int] = []
        self.reasons: dict[int, str] = {}

    def start(self, models: Sequence[int]) -> None:
        self.models = sorted(models)

    def reason(self, report: Report) -> str:
        return self.reasons.get(report.mst_key, super().reason(report))

    def _stop(self, report: Report, why: str) -> Decision:
        self.reasons[report.mst_key] = why
        return Decision.STOP


class MedianPruner(RankingPruner):
    def __init__(self, objective: Objective, warmup: int = 1, interval: int = 1, min_models: int = 4):
        super().__init__(objective)
        self.warmup, self.interval, self.min_models = warmup, interval, min_models
        self.stopped_at: dict[int, int] = {}

    def decide(self, report: Report, peers: Mapping[int, Report]) -> Decision:
        t = report.iteration
        if t < self.warmup or (t - self.warmup) % self.interval:
            return Decision.CONTINUE
        # Every model not stopped before iteration t reaches it: wait for all of them.
        expected = [m for m in self.models if self.stopped_at.get(m, t) >= t]
        if any(m not in peers for m in expected):
            return Decision.WAIT
        if len(expected) < self.min_models:
            return Decision.CONTINUE
        ranked = sorted((peers[m] for m in expected), key=self.objective.rank_key)
        # Stopped: worse than the median, i.e. in the worse half (the middle one of an odd
        # number is kept).
        if ranked.index(report) < (len(ranked) + 1) // 2:
            return Decision.CONTINUE
        self.stopped_at[report.mst_key] = t
        middle = ranked[(len(ranked) - 1) // 2]
        return self._stop(report, f"{self.objective.label} {self.objective.value(report):.6g} "
                                  f"at iteration {t} is worse than the median of {len(ranked)} "
                                  f"models ({self.objective.value(middle):.6g})")


class SuccessiveHalvingPruner(RankingPruner):
    def __init__(self, objective: Objective, num_iterations: int, eta: int = 3, min_iterations: int = 1):
        super().__init__(objective)
        self.eta, self.min_iterations, self.num_iterations = eta, min_iterations, num_iterations

    def rungs(self) -> list[int]:
        """The iterations where models are ranked (the last iteration is none)."""
        found, r = [], self.min_iterations
        while r < self.num_iterations:
            found.append(r)
            r *= self.eta
        return found

    def required_iterations(self) -> set[int]:
        return set(self.rungs())

    def _sizes(self) -> list[int]:
        sizes = [len(self.models)]
        for _ in self.rungs():
            sizes.append(max(1, sizes[-1] // self.eta))
        return sizes

    def decide(self, report: Report, peers: Mapping[int, Report]) -> Decision:
        rungs = self.rungs()
        if report.iteration not in rungs:
            return Decision.CONTINUE
        j = rungs.index(report.iteration)
        sizes = self._sizes()
        decision = rank_decision(self.objective, report, peers, sizes[j], sizes[j + 1])
        if decision is Decision.STOP:
            return self._stop(report, f"not among the best {sizes[j + 1]} of {sizes[j]} by "
                                      f"{self.objective.label} at iteration {report.iteration}")
        return decision

    def priority(self, mst_key: int, iteration: int) -> int:
        return sum(1 for r in self.rungs() if r <= iteration)


class HyperbandPruner(RankingPruner):
    """Each model belongs to a bracket; within it, at rung i (r_i iterations done) the best
    n_{i+1} of its n_i models go on; a bracket's last rung ends its models."""

    def __init__(self, objective: Objective, brackets: Mapping[int, int], R: int, eta: int,
                 skip_last: int, num_iterations: int):
        super().__init__(objective)
        self.brackets = dict(brackets)
        self.rungs: dict[int, list[Rung]] = bracket_rungs(R, eta, skip_last)
        self.num_iterations = num_iterations

    def required_iterations(self) -> set[int]:
        return {rung.r_i for rungs in self.rungs.values() for rung in rungs}

    def _rung(self, mst_key: int, iteration: int) -> tuple[list[Rung], int] | None:
        rungs = self.rungs[self.brackets[mst_key]]
        for index, rung in enumerate(rungs):
            if rung.r_i == iteration:
                return rungs, index
        return None

    def decide(self, report: Report, peers: Mapping[int, Report]) -> Decision:
        found = self._rung(report.mst_key, report.iteration)
        if found is None:
            return Decision.CONTINUE
        rungs, i = found
        s = self.brackets[report.mst_key]
        if i == len(rungs) - 1:  # the bracket's last rung
            if report.iteration >= self.num_iterations:
                return Decision.CONTINUE  # its training ends here anyway
            return self._stop(report, f"bracket {s} ends at {report.iteration} iterations")
        group = {k: r for k, r in peers.items() if self.brackets.get(k) == s}
        decision = rank_decision(self.objective, report, group, rungs[i].n_i, rungs[i + 1].n_i)
        if decision is Decision.STOP:
            return self._stop(report, f"bracket {s} round {i}: not among the best "
                                      f"{rungs[i + 1].n_i} of {rungs[i].n_i} by "
                                      f"{self.objective.label} after {report.iteration} iterations")
        return decision

    def round_of(self, mst_key: int, iteration: int) -> int:
        """MADlib's `i`: the last round the model completed (0 before the first ends)."""
        return max(0, self.priority(mst_key, iteration) - 1)

    def priority(self, mst_key: int, iteration: int) -> int:
        """Rounds completed: models promoted further train first."""
        return sum(1 for rung in self.rungs[self.brackets[mst_key]] if rung.r_i <= iteration)

    def labels(self, mst_key: int, iteration: int) -> dict:
        return {"s": self.brackets[mst_key], "i": self.round_of(mst_key, iteration)}


PRUNERS = ("median", "successive_halving")


def pruner_from(text: str | None, num_iterations: int, objective_of) -> Pruner | None:
    """fit_multiple's `pruner` argument: 'median, warmup=2, interval=1, min_models=4' or
    'successive_halving, eta=3, min_iterations=1', each with optional metric=...,
    direction=...; `objective_of(metric, direction)` checks and returns the objective."""
    if text is None or not text.strip():
        return None
    name, _, rest = text.strip().partition(",")
    name = name.strip().lower()
    if name not in PRUNERS:
        raise MadlibMopError(f"pruner {name!r} is unknown", sqlstate=errors.INVALID_PARAMETER_VALUE,
                             hint="pruner => 'median' or 'successive_halving', with options "
                                  "such as 'median, warmup=2, metric=validation_accuracy'.")
    options = parse_keyword_text(rest, "pruner", names_are_strings=True)
    objective = objective_of(options.pop("metric", None), options.pop("direction", None))
    allowed = {"median": ("warmup", "interval", "min_models"),
               "successive_halving": ("eta", "min_iterations")}[name]
    for key, value in options.items():
        if key not in allowed:
            raise MadlibMopError(f"pruner {name}: unknown option {key}",
                                 sqlstate=errors.INVALID_PARAMETER_VALUE,
                                 hint=f"Options of {name}: {', '.join(allowed + ('metric', 'direction'))}.")
        if not isinstance(value, int) or isinstance(value, bool) or value < (2 if key == "eta" else 1):
            raise MadlibMopError(f"pruner {name}: {key} must be a whole number of at least "
                                 f"{2 if key == 'eta' else 1}, not {value!r}",
                                 sqlstate=errors.INVALID_PARAMETER_VALUE,
                                 hint=f"e.g. '{name}, {key}={3 if key == 'eta' else 2}'")
    if name == "median":
        return MedianPruner(objective, **options)
    return SuccessiveHalvingPruner(objective, num_iterations, **options)
