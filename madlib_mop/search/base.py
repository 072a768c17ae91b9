"""The contracts of search: a Searcher decides which configurations a job trains, a Pruner
which of its models stop early.

Both are consulted by the coordinator at iteration boundaries only, with recorded results,
and never see timing: reports arrive in the order of (iteration, mst_key) completion as
recorded, and a decision that needs other models' results waits for them (see
`Decision.WAIT`).  Search never touches scheduling, storage or workers: the coordinator
turns its answers into schedule changes.
"""

from __future__ import annotations

import abc
import enum
from dataclasses import dataclass
from typing import Mapping, Sequence

from madlib_mop.grammar.model_config import Config


@dataclass(frozen=True)
class Report:
    """What one model achieved in one iteration (row-weighted means over the data)."""

    mst_key: int
    iteration: int
    training: Mapping[str, float]  # 'loss' and the compile metrics
    validation: Mapping[str, float] | None  # None: the job has no validation table


class Searcher(abc.ABC):
    """Which configurations to train (ask / tell, as in Optuna's samplers).

    Contract:
    - `ask()` returns the next configuration to train, or None when it has nothing to
      propose now.  None is not final: after more `tell()`s it may propose again;
      `finished()` says whether it ever will.
    - `tell(report)` gives the searcher one model's result of one iteration.  The
      coordinator calls it once per (model, computed iteration), in a fixed order.
    - Deterministic: the same seed and the same sequence of `tell()`s give the same
      sequence of `ask()` answers (a resumed job replays its recorded reports).
    - Configurations are validated `Config`s (model_id, compile_params, fit_params) of
      the job's model architecture table.
    """

    @abc.abstractmethod
    def ask(self) -> Config | None: ...

    def tell(self, report: Report) -> None:  # searchers that do not learn ignore results
        return None

    def lost(self, mst_key: int) -> None:
        """The configuration of `mst_key` diverged or failed: it reports nothing more."""
        return None

    @abc.abstractmethod
    def finished(self) -> bool: ...


class Decision(enum.Enum):
    CONTINUE = "continue"
    STOP = "stop"
    WAIT = "wait"  # needs other models' reports of this iteration first


class Pruner(abc.ABC):
    """Which models stop early.

    Contract:
    - `decide(report, peers)` is called when a model's metrics of an iteration are
      complete.  `peers` are the reports of the same iteration already complete, of all
      models (the model's own included), keyed by mst_key.
    - CONTINUE: the model trains on; STOP: it trains no further (its last state and
      metrics stay the job's result for it, `reason()` says why); WAIT: the decision needs
      reports not there yet; the model is held (not dispatched) and `decide` is asked
      again, in (iteration, mst_key) order, whenever another report or decision comes.
    - Deterministic: the answer depends only on the reports given, never on time.
    - The coordinator stops models, the pruner never touches the schedule.
    """

    def start(self, models: Sequence[int]) -> None:
        """The job's models (mst_keys), before any report (and again after a model is added)."""
        return None

    @abc.abstractmethod
    def decide(self, report: Report, peers: Mapping[int, Report]) -> Decision: ...

    def reason(self, report: Report) -> str:
        return f"pruned after iteration {report.iteration}"

    def required_iterations(self) -> set[int]:
        """Iterations whose metrics the pruner needs, besides those the job computes."""
        return set()

    def priority(self, mst_key: int, iteration: int) -> int:
        """Models of a higher priority are trained first (e.g. those promoted further)."""
        return 0

    def labels(self, mst_key: int, iteration: int) -> dict:
        """Columns of the model's `_info` row the pruner keeps up to date (e.g. a round)."""
        return {}


class NoPruner(Pruner):
    """The default: every model trains for all its iterations."""

    def decide(self, report: Report, peers: Mapping[int, Report]) -> Decision:
        return Decision.CONTINUE
