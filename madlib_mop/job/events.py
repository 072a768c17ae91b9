"""What the coordinator's parts (steering, model failures) tell it, by name: the
coordinator implements `JobEvents`, and its parts are given it when they are made, so none
of them is wired by position or has fields filled in later."""

from __future__ import annotations

from typing import Protocol

from madlib_mop.job.store import ModelRecord


class JobEvents(Protocol):
    def queue_evals(self, model: ModelRecord, iteration: int) -> None:
        """The model's validation passes of `iteration`, if due."""

    def publish(self, model: ModelRecord) -> None:
        """The model's rows in the output tables, as of its latest durable state."""

    def report_progress(self) -> None:
        """The job's row and NOTICEs: model counts and sub-epochs."""

    def model_lost(self, mst_key: int) -> None:
        """The model stopped for a cause of its own: the search counts it as failed."""
