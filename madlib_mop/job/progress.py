"""What a running job shows: its model counts (job_progress) and a NOTICE per epoch, or per
tenth of the work planned when models stop and enter (no common epoch then)."""

from __future__ import annotations

import time
from typing import Callable

from madlib_mop.job import metrics, schedule
from madlib_mop.job.store import JobStore, ModelRecord


class JobProgress:
    def __init__(self, models: dict[int, ModelRecord], dispatcher: schedule.Dispatcher,
                 segments: int, epochs: int, stopped: dict, failed, searching: bool,
                 notice: Callable[[str], None]):
        self.models, self.schedule, self.S, self.epochs = models, dispatcher, segments, epochs
        self.stopped, self.failed = stopped, failed  # by the pruner; for a cause of their own
        self.searching, self.notice = searching, notice
        self.started, self.done_at_start = time.monotonic(), self.done()
        self.reported = (10 * self.done() // max(dispatcher.planned_total(), 1) if searching
                         else min((len(m.visits) for m in models.values() if m.mst_key not in failed),
                                  default=0) // segments)

    def done(self) -> int:
        return sum(len(m.visits) for m in self.models.values())

    def report_to(self, store: JobStore) -> None:
        """The job's row: sub-epochs done and planned, models by state."""
        store.progress(self.done(), self.schedule.planned_total(), self.counts())

    def counts(self) -> dict[str, int]:
        """Models training, waiting (not started, or held for a decision), stopped early,
        finished, and failed (diverged, or failed on every retry)."""
        counts = dict.fromkeys(("models_training", "models_waiting", "models_stopped",
                                "models_finished", "models_failed"), 0)
        for key, progress in self.schedule.progress.items():
            if key in self.failed:
                counts["models_failed"] += 1
            elif key in self.stopped:
                counts["models_stopped"] += 1
            elif progress.done >= self.schedule.total[key]:
                counts["models_finished"] += 1
            elif progress.held or (progress.done == 0 and not progress.busy):
                counts["models_waiting"] += 1
            else:
                counts["models_training"] += 1
        return counts

    def after_visit(self) -> None:
        if self.searching:
            return self._tenths()
        epoch = min((len(m.visits) for m in self.models.values() if m.mst_key not in self.failed),
                    default=0) // self.S
        if epoch <= self.reported:
            return
        self.reported = epoch
        losses = [(loss, m.mst_key) for m in self.models.values() if m.mst_key not in self.failed
                  and (loss := metrics.epoch_loss(m.visits, epoch, self.S)) is not None]
        best = min(losses) if losses else (float("nan"), None)
        elapsed = time.monotonic() - self.started
        eta = metrics.eta(elapsed, self.done(), self.done_at_start, self.schedule.planned_total())
        self.notice(
            f"epoch {epoch}/{self.epochs}: "
            f"{len(self.models)} models on {self.S} segments, best training loss {best[0]:.4f} "
            f"(mst_key {best[1]}), elapsed {elapsed:.1f}s, ETA {eta:.1f}s")

    def _tenths(self) -> None:
        """With models stopping and entering, epochs are no common measure: a NOTICE per
        tenth of the work planned so far."""
        total = self.schedule.planned_total()
        tenth = 10 * self.done() // max(total, 1)
        if tenth <= self.reported:
            return
        self.reported = tenth
        counts = self.counts()
        elapsed = time.monotonic() - self.started
        eta = metrics.eta(elapsed, self.done(), self.done_at_start, total)
        self.notice(
            f"{10 * tenth}% of the work planned so far: {len(self.models)} models "
            f"({counts['models_training']} training, {counts['models_waiting']} waiting, "
            f"{counts['models_stopped']} stopped, {counts['models_finished']} finished), "
            f"elapsed {elapsed:.1f}s, ETA {eta:.1f}s")
