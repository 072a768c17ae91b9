"""Models and calls that fail: a call runs again (`RetryPolicy`), a model that diverges
or fails the same way on every retry stops alone (`ModelFailures`), and the job finishes
the others.  A job fails as a whole only for causes that touch every model (its tables,
privileges, a server that does not come back) or when no model is left.
"""

from __future__ import annotations

import time
from typing import Any, Callable


from madlib_mop import errors
from madlib_mop.db import catalog, settings
from madlib_mop.engine.base import failure_sqlstate, session_lost
from madlib_mop.errors import MadlibMopError
from madlib_mop.job.events import JobEvents
from madlib_mop.job.store import JobStore

# A model's status in `<out>_info` once it stopped for a cause of its own.
DIVERGED, FAILED = "diverged", "failed"


class RetryPolicy:
    """A failed call runs again on a fresh session, up to MAX_ATTEMPTS times; an error
    that a retry cannot fix (the data, the model, privileges, authentication) is final at
    once.  A final error stops the model alone (`ModelFailures`) unless it touches every
    model, then the job.

    A lost session (its server stopped, restarted or cut off: no SQLSTATE, class 08 or
    57P0x) makes the segment wait, retrying with back-off, until its server answers again
    or `madlib_mop.segment_wait_seconds` have passed; then the job stops with an error
    naming the server and stays resumable.  A session that could not be opened is no
    attempt of the call; one lost during the call is (a call that crashes its server is not
    run for ever)."""

    MAX_ATTEMPTS = 3
    FINAL_CLASSES = ("22", "42", "0A", "28", "58")
    # Final errors that end the job rather than the model: missing or changed tables and
    # privileges (42), authentication (28), the database or schema (3D, 3F), the server's
    # files (58: a job's state files, `job.state_store`) and a full disk.
    JOB_CLASSES = ("42", "28", "3D", "3F", "58")
    JOB_SQLSTATES = (errors.DISK_FULL,)
    WAIT_SETTING = "madlib_mop.segment_wait_seconds"
    DEFAULT_WAIT_SECONDS = 300
    MAX_DELAY = 10.0

    @classmethod
    def for_job(cls, plpy: Any, job_id: int) -> "RetryPolicy":
        wait = settings.whole_number(plpy, cls.WAIT_SETTING, minimum=0)
        return cls(job_id, catalog.extension_schema(plpy),
                   cls.DEFAULT_WAIT_SECONDS if wait is None else wait)

    def __init__(self, job_id: int, schema: str, wait_seconds: float = DEFAULT_WAIT_SECONDS):
        self.job_id, self.schema, self.wait_seconds = job_id, schema, wait_seconds
        self.lost_since: dict[int, tuple[float, int]] = {}  # segment -> (first loss, losses)

    @staticmethod
    def message(error: BaseException) -> str:
        return str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__

    @classmethod
    def lost(cls, error: BaseException) -> bool:
        return session_lost(error)

    @classmethod
    def connecting(cls, error: BaseException) -> bool:
        """The session could not be opened: the call did not run."""
        sqlstate = failure_sqlstate(error)
        return sqlstate == errors.CANNOT_CONNECT_NOW or (isinstance(error, MadlibMopError)
                                      and sqlstate == errors.CONNECTION_FAILURE)

    def answered(self, segment: int) -> None:
        self.lost_since.pop(segment, None)

    def delay(self, task: Any, where: str, message: str) -> float:
        """Seconds to wait before the segment's next call; raises once it waited too long."""
        since, losses = self.lost_since.get(task.segment, (time.monotonic(), 0))
        self.lost_since[task.segment] = (since, losses + 1)
        if time.monotonic() - since > self.wait_seconds:
            raise MadlibMopError(
                f"job {self.job_id}: {where} has not answered for {self.wait_seconds:g}s "
                f"(segment {task.segment}): {message}",
                sqlstate=errors.CONNECTION_FAILURE,
                hint=f"When it is back, CALL {self.schema}.resume({self.job_id}); finished "
                     f"sub-epochs are kept. SET {self.WAIT_SETTING} to wait longer.")
        return 0.0 if losses == 0 else min(self.MAX_DELAY, 0.5 * 2 ** losses)

    def after(self, task: Any, error: BaseException, where: Callable[[], str],
              notice: Callable[[str], None]) -> tuple[int, float | None]:
        """After a failed call: the number of its next attempt and, when its session was
        lost, how long its segment waits first; raises if the job cannot go on."""
        message = self.message(error)
        if self.lost(error):
            attempt = task.attempt
            if not self.connecting(error):
                self.check(task, error, message)
                attempt += 1
            place = where()
            delay = self.delay(task, place, message)
            notice(f"madlib_mop: job {self.job_id}: segment {task.segment}: {place} did not answer "
                   f"({message}); retrying in {delay:g}s (for up to {self.wait_seconds:g}s)")
            return attempt, delay
        self.check(task, error, message)
        notice(f"madlib_mop: job {self.job_id}: {task.kind} of mst_key {task.mst_key} on "
               f"segment {task.segment} failed ({message}); running it again")
        return task.attempt + 1, None

    @classmethod
    def touches_every_model(cls, error: BaseException) -> bool:
        """A final error that no model can train past: a table, a privilege, the server."""
        sqlstate = failure_sqlstate(error)
        return cls.lost(error) or (sqlstate is not None and (sqlstate[:2] in cls.JOB_CLASSES
                                                             or sqlstate in cls.JOB_SQLSTATES))

    def check(self, task: Any, error: BaseException, message: str) -> None:
        """Raises if the call is not to be run again."""
        sqlstate = failure_sqlstate(error)
        final = sqlstate is not None and (sqlstate[:2] in self.FINAL_CLASSES or sqlstate in self.JOB_SQLSTATES)
        if task.attempt >= self.MAX_ATTEMPTS or final:
            raise MadlibMopError(
                f"job {self.job_id}: {task.kind} of mst_key {task.mst_key} on segment "
                f"{task.segment} failed {task.attempt} times: {message}",
                sqlstate=sqlstate if final else errors.DATA_EXCEPTION,
                hint=f"Fix the cause, then CALL {self.schema}.resume({self.job_id}); finished "
                     "sub-epochs are kept.")


class ModelFailures:
    """The job's models that diverged or failed: recorded in `<out>_info` (status,
    stopped_iteration, stop_reason) and in the job's row (models_failed, model_failures)
    when they stop, so that a resumed job keeps a diverged model stopped.  A failed model
    (its calls failed on every retry) trains again when the job is resumed: its cause may
    have been fixed meanwhile; a diverged one would diverge again, the same bits."""

    def __init__(self, store: JobStore, notice: Callable[[str], None], events: JobEvents):
        self.store, self.notice, self.events = store, notice, events
        self.lost: dict[int, str] = {}  # mst_key -> what happened, as recorded
        for mst_key, status, reason in store.model_statuses():
            if status == DIVERGED:
                self.lost[mst_key] = reason
            elif status == FAILED:
                store.record_lost(mst_key, None, None, None)

    def __contains__(self, mst_key: int) -> bool:
        return mst_key in self.lost

    def stop(self, mst_key: int, status: str, completed: int, where: str, reason: str) -> str:
        """The model stops as `status` after `completed` iterations; `where`: the call in
        which it happened.  Recorded at once (committed)."""
        text = f"{status} {where}: {reason}"
        self.lost[mst_key] = text
        self.store.record_lost(mst_key, status, completed, text)
        self.notice(f"mst_key {mst_key} {text}")
        return text

    def lose(self, task: Any, model: Any, status: str, reason: str, dispatcher: Any,
             work: Any) -> None:
        """The coordinator's model stops: no longer dispatched, its waiting validation
        passes dropped, recorded with the job's progress, and the search told."""
        if task.kind == "train":
            dispatcher.retry(task.mst_key, task.segment)
        dispatcher.stop(task.mst_key)
        work.drop_model(task.mst_key)
        iteration = task.step // model.per_iteration + (task.kind == "train")
        where = (f"in iteration {iteration} (sub-epoch {task.step + 1}, segment {task.segment})"
                 if task.kind == "train" else f"in the validation of iteration {iteration}")
        with self.store.atomic():
            self.stop(task.mst_key, status, len(model.visits) // model.per_iteration, where, reason)
            self.events.report_progress()
        self.events.model_lost(task.mst_key)

    def call_failed(self, task: Any, error: BaseException, retry: RetryPolicy, where: Callable[[], str],
                    notice: Callable[[str], None], models: dict, dispatcher: Any, work: Any) -> None:
        """A call failed: run again after the retry policy's delay (the segment waits for
        its server when the session was lost), or, its attempts spent, its models are lost
        (an error that touches every model stops the job)."""
        self.store.note_error(f"{task.kind} mst_key {','.join(map(str, task.fused or [task.mst_key]))} "
                              f"step {task.step} segment {task.segment} attempt {task.attempt}: "
                              f"{RetryPolicy.message(error)}")
        try:
            attempt, delay = retry.after(task, error, where, notice)
        except MadlibMopError:
            if RetryPolicy.touches_every_model(error):
                raise
            why = f"{RetryPolicy.message(error)} (after {task.attempt} attempt{'s' * (task.attempt > 1)})"
            for one in task.each():
                if one.mst_key not in self:  # (a fused validation pass keeps its lost models)
                    self.lose(one, models[one.mst_key], FAILED, why, dispatcher, work)
            return
        if delay is not None:
            work.paused_until[task.segment] = time.monotonic() + delay
        if task.kind == "train":
            for one in task.each():
                dispatcher.retry(one.mst_key, task.segment)
                if one.mst_key in self:  # lost while the call ran (its validation)
                    dispatcher.stop(one.mst_key)
            work.attempts[(task.mst_key, task.step)] = attempt
        else:
            task.attempt = attempt
            work.pending_evals.append(task)

    def check_at_end(self, models: int, warning: Callable[[str], None]) -> None:
        """At the job's end: an error if no model is left, else a WARNING naming those that
        stopped for a cause of their own."""
        if not self.lost:
            return
        listed = "; ".join(f"mst_key {k} {why}" for k, why in sorted(self.lost.items()))
        if len(self.lost) == models:
            raise MadlibMopError(
                f"job {self.store.job_id}: every model diverged or failed: {listed}"[:2000],
                sqlstate=errors.DATA_EXCEPTION,
                hint="Lower the learning rate, or fix the configurations, and train again; "
                     "a model whose calls failed trains again on resume.")
        warning(f"job {self.store.job_id}: {len(self.lost)} of {models} models stopped "
                f"for a cause of their own: {listed}"[:2000])
