"""The metric that decides (which models a pruner stops, which configuration is best), and
its direction.

Named as `<source>_<metric>`: `validation_loss`, `training_accuracy`, or just `accuracy`
(on the validation data when the job has some, else on the training data).  Losses and
errors are minimised, accuracies and the like maximised; a metric whose direction cannot be
told from its name needs `direction => 'maximize' | 'minimize'`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable

from madlib_mop import errors
from madlib_mop.errors import MadlibMopError
from madlib_mop.search.base import Report

_MINIMISED = ("loss", "error", "crossentropy", "hinge", "divergence", "poisson", "cosh",
              "mean_squared", "mean_absolute")
_MAXIMISED = ("accuracy", "auc", "precision", "recall", "f1", "iou", "r2", "fbeta")
SOURCES = ("validation", "training")


@dataclass(frozen=True)
class Objective:
    metric: str  # as in a report: 'loss' or a compile metric's name
    source: str  # 'validation' or 'training'
    maximize: bool

    @property
    def label(self) -> str:
        return f"{self.source}_{self.metric}"

    def value(self, report: Report) -> float:
        """The report's value; NaN when missing or not a number (always the worst)."""
        values = report.validation if self.source == "validation" else report.training
        value = (values or {}).get(self.metric)
        return float(value) if isinstance(value, (int, float)) else math.nan

    def rank_key(self, report: Report) -> tuple:
        """Sorts best first; NaN last; ties by mst_key, so that rankings never depend on
        the order reports came in."""
        value = self.value(report)
        if math.isnan(value):
            return (1, 0.0, report.mst_key)
        return (0, -value if self.maximize else value, report.mst_key)

    def better(self, a: Report, b: Report) -> bool:
        return self.rank_key(a) < self.rank_key(b)

    def describe(self) -> str:
        return f"{self.label} ({'higher' if self.maximize else 'lower'} is better)"


def direction_of(metric: str) -> bool | None:
    """True: maximised, False: minimised, None: cannot tell from the name."""
    name = metric.lower()
    if any(word in name for word in _MINIMISED):
        return False
    if any(word in name for word in _MAXIMISED):
        return True
    return None


def objective_from(metric: str | None, direction: str | None, has_validation: bool,
                   compile_metrics: Iterable[Iterable[str]], argument: str) -> Objective:
    """The objective a user named (None: the loss, on validation data when there is some).

    `compile_metrics`: every configuration's metric names; the objective must be one that
    every configuration reports."""
    text = (metric or "loss").strip()
    source = "validation" if has_validation else "training"
    name = text
    for prefix in SOURCES:
        if text.startswith(prefix + "_"):
            source, name = prefix, text[len(prefix) + 1:]
    if source == "validation" and not has_validation:
        raise MadlibMopError(
            f"{argument}: metric {text} needs a validation_table", sqlstate=errors.INVALID_PARAMETER_VALUE,
            hint=f"Pass validation_table, or metric=training_{name}.")
    per_config = [set(names) | {"loss"} for names in compile_metrics]
    if any(name not in names for names in per_config):
        reported = sorted(set.intersection(*per_config)) if per_config else ["loss"]
        raise MadlibMopError(
            f"{argument}: metric {name!r} is not reported by every configuration",
            sqlstate=errors.INVALID_PARAMETER_VALUE,
            hint=f"Name one of {', '.join(reported)} (prefixed by validation_ or training_ if "
                 "you like), or add it to every configuration's metrics.")
    if direction is None:
        maximize = direction_of(name)
        if maximize is None:
            raise MadlibMopError(
                f"{argument}: cannot tell whether {name} is better high or low",
                sqlstate=errors.INVALID_PARAMETER_VALUE,
                hint="Add direction=maximize or direction=minimize.")
    elif direction in ("maximize", "minimize"):
        maximize = direction == "maximize"
    else:
        raise MadlibMopError(f"{argument}: direction must be maximize or minimize, not {direction!r}",
                             sqlstate=errors.INVALID_PARAMETER_VALUE,
                             hint="direction=maximize (accuracy) or direction=minimize (loss).")
    return Objective(name, source, maximize)
