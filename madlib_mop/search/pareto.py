"""Trade-offs between objectives: the models no other model beats on every one.

A model dominates another when it is at least as good on every objective and better on one;
the Pareto front is the set of models nothing dominates (models with equal values are all
on it or all off it).  Objectives are `'<column> [max|min]'` of a job's `_info` table.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from madlib_mop import errors
from madlib_mop.errors import MadlibMopError


@dataclass(frozen=True)
class ColumnObjective:
    """An `_info` column to maximise or minimise (the search's objective is search.objective.Objective)."""
    column: str
    maximize: bool

    def __str__(self) -> str:
        return f"{self.column} {'max' if self.maximize else 'min'}"


def parse(texts: Sequence[str] | None, direction_of) -> list[ColumnObjective]:
    """['validation_metrics_final max', 'inference_ms_per_row'] -> ColumnObjectives; a column
    without a direction gets `direction_of(column)` (True: max, False: min, None: unknown)."""
    if not texts or len(texts) < 2:
        raise MadlibMopError("pareto_front needs at least two objectives", sqlstate=errors.INVALID_PARAMETER_VALUE,
                             hint="e.g. ARRAY['validation_metrics_final max', 'inference_ms_per_row min']")
    found = []
    for text in texts:
        words = str(text or "").split()
        if not 1 <= len(words) <= 2 or (len(words) == 2 and words[1].lower() not in ("max", "min")):
            raise MadlibMopError(f"objective {text!r} is not '<column> [max|min]'",
                                 sqlstate=errors.INVALID_PARAMETER_VALUE,
                                 hint="e.g. 'validation_metrics_final max' or 'inference_ms_per_row min'")
        maximize = words[1].lower() == "max" if len(words) == 2 else direction_of(words[0])
        if maximize is None:
            raise MadlibMopError(f"objective {words[0]}: cannot tell whether higher or lower is better",
                                 sqlstate=errors.INVALID_PARAMETER_VALUE,
                                 hint=f"Write '{words[0]} max' or '{words[0]} min'.")
        found.append(ColumnObjective(words[0], maximize))
    if len({o.column for o in found}) < len(found):
        raise MadlibMopError("an objective is named twice", sqlstate=errors.INVALID_PARAMETER_VALUE,
                             hint="Name each column once.")
    return found


def dominates(a: Sequence[float], b: Sequence[float], maximize: Sequence[bool]) -> bool:
    """Is point a at least as good as b everywhere and better somewhere?"""
    better = False
    for x, y, up in zip(a, b, maximize):
        if (x < y) if up else (x > y):
            return False
        better = better or x != y
    return better


def front(points: Sequence[Sequence[float]], maximize: Sequence[bool]) -> list[int]:
    """Indices of the non-dominated points, in order: sorted by the first objective (best
    first), a point is on the front unless one of the front found so far dominates it --
    a point can only be dominated by one sorted before it or equal to it on that objective."""
    sign = [-1.0 if up else 1.0 for up in maximize]
    order = sorted(range(len(points)), key=lambda i: [s * v for s, v in zip(sign, points[i])])
    kept: list[int] = []
    for i in order:
        if not any(dominates(points[j], points[i], maximize) for j in kept):
            kept.append(i)
    return sorted(kept)
