"""Metric arithmetic of a job: pure functions over recorded visits and evaluations.

A visit result (one sub-epoch) and an evaluation result (one validation partition) are
dicts with at least `rows`, `metrics` (name -> mean over the rows) and `finished_at`
(seconds since the epoch).  Nothing here touches the database.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Mapping, Sequence


def due(iteration: int, frequency: int, iterations: int, also: frozenset = frozenset()) -> bool:
    """Are metrics computed after `iteration` (every `frequency`-th, the last, and those a
    pruner decides at: `also`)?"""
    return iteration % frequency == 0 or iteration == iterations or iteration in also


def due_at(step: int, per_iteration: int, frequency: int, iterations: int,
           also: frozenset = frozenset()) -> bool:
    """Are metrics computed after `step` sub-epochs (an iteration's end that is `due`)?"""
    iteration, within = divmod(step, per_iteration)
    return not within and due(iteration, frequency, iterations, also)


def due_iterations(finished: int, frequency: int, iterations: int,
                   also: frozenset = frozenset()) -> list[int]:
    """The iterations up to `finished` whose metrics are computed."""
    return [i for i in range(1, finished + 1) if due(i, frequency, iterations, also)]


def weighted(results: Sequence[Mapping]) -> dict:
    """Row-weighted means of the loss and metrics of several visits or evaluations.  A
    segment without rows (a table with fewer rows than segments) has none to weigh."""
    results = [r for r in results if r["rows"]]
    if not results:
        return {}
    rows = sum(r["rows"] for r in results)
    names = results[0]["metrics"].keys()
    return {n: sum(r["metrics"][n] * r["rows"] for r in results) / rows for n in names}


def last(values: Sequence | None):
    return values[-1] if values else None


def series(rows: Sequence[Mapping], name: str) -> list | None:
    return [r.get(name) for r in rows] if rows else None


@dataclass
class Curves:
    """A model's metrics per computed iteration, as far as they are complete."""

    iterations: list[int] = field(default_factory=list)
    training: list[dict] = field(default_factory=list)  # weighted means per iteration
    validation: list[dict] = field(default_factory=list)  # [] without validation
    elapsed: list[float] = field(default_factory=list)  # seconds from the job's start
    # ms per row of each validation pass (`inference_ms_per_row`): the model's inference
    # cost; None where no worker timed it (an earlier version's, or an empty partition)
    inference_ms: list[float | None] = field(default_factory=list)

    def final(self, kind: str, name: str | None):
        rows = self.training if kind == "training" else self.validation
        return last(series(rows, name)) if name is not None else None


def curves(visits: Mapping[int, Mapping], evals: Mapping[tuple[int, int], Mapping],
           segments: int, epochs: int, frequency: int, iterations: int, partitions: int,
           started_at: float, also: frozenset = frozenset()) -> Curves:
    """Per computed iteration: the training means over the iteration's last pass over the
    data (its last fit epoch: `segments` visits), the validation means over all validation
    partitions, and when both were done.  Stops at the first iteration whose validation is
    still running."""
    per_iteration = segments * epochs
    result = Curves()
    for i in due_iterations(len(visits) // per_iteration, frequency, iterations, also):
        steps = range(i * per_iteration - segments, i * per_iteration)
        training = weighted([visits[s] for s in steps])
        finished_at = max(visits[s]["finished_at"] for s in steps)
        validation = None
        if partitions:
            found = [evals.get((i * per_iteration, p)) for p in range(partitions)]
            if not all(found):
                break
            validation = weighted(found)
            finished_at = max([finished_at] + [e["finished_at"] for e in found])
            result.inference_ms.append(inference_ms_per_row(found))
        result.iterations.append(i)
        result.training.append(training)
        if validation is not None:
            result.validation.append(validation)
        result.elapsed.append(finished_at - started_at)
    return result


def inference_ms_per_row(evals: Sequence[Mapping]) -> float | None:
    """Milliseconds per row of one validation pass: the best of its partitions' (each the
    best of a few timed runs on one worker, which other work can only slow down)."""
    found = [e["ms_per_row"] for e in evals if e.get("ms_per_row") is not None]
    return min(found) if found else None


def epoch_loss(visits: Mapping[int, Mapping], epoch: int, segments: int) -> float | None:
    """The training loss of a model's pass number `epoch` (1-based), if it is complete."""
    steps = range((epoch - 1) * segments, epoch * segments)
    if not all(s in visits for s in steps):
        return None
    return weighted([visits[s] for s in steps]).get("loss", math.nan)


def eta(elapsed: float, done_now: int, done_at_start: int, total: int) -> float:
    """Seconds left, from the rate of the sub-epochs finished since the job (re)started."""
    fresh = done_now - done_at_start
    return elapsed / fresh * (total - done_now) if fresh > 0 else math.nan
