"""A job's progress bar, read from `job_progress` by a connection of its own.

The job's coordinator commits its progress with every hop, so another session sees epochs
done, the plan's total (pruners and searchers change it), the model counts and the best
metric so far while the call runs.  The bar is tqdm's (a terminal, or a notebook widget
through tqdm.auto).
"""

from __future__ import annotations

import contextlib
import threading
import time
from typing import Any, Callable

import pandas as pd
import psycopg
import sqlalchemy as sa
from tqdm.auto import tqdm

from madlib_mop.client import frames
from madlib_mop.client.errors import JobCancelled
from madlib_mop.job.record import JobState

RUNNING = (JobState.CREATED, JobState.RUNNING)


class JobProgress:
    """Follows one job: given by its id (watch), or as the running job whose coordinator is
    backend `coordinator_pid` (a call made by this client)."""

    def __init__(self, engine: sa.Engine, schema: str, *, job_id: int | None = None,
                 coordinator_pid: int | None = None, show: bool = True, interval: float = 1.0):
        self.engine, self.schema, self.show, self.interval = engine, schema, show, interval
        self.job_id, self.coordinator_pid = job_id, coordinator_pid
        self.bar: tqdm | None = None
        self.row: dict[str, Any] | None = None
        self.ref: frames.JobRef | None = None
        self._lock = threading.Lock()
        self._conn = engine.connect().execution_options(isolation_level="AUTOCOMMIT")
        self._since = self._conn.execute(sa.text("SELECT clock_timestamp()")).scalar()

    def find_job(self) -> int | None:
        """The job the call started or continued: coordinated by its backend and marked
        running since this object was made (it may have ended since: short jobs do).  A
        pooled backend may have coordinated other jobs before; one the call abandoned
        (its tables dropped) is marked failed now, and is not it."""
        if self.job_id is None and self.coordinator_pid is not None:
            self.job_id = self._conn.execute(sa.text(
                f"SELECT job_id FROM {frames.quote(self.schema)}.jobs "
                "WHERE coordinator_pid = :pid AND state IN (:running, :finished, :interrupted) "
                "AND updated_at >= :since "
                "ORDER BY job_id DESC LIMIT 1"),
                {"pid": self.coordinator_pid, "since": self._since, "running": JobState.RUNNING.value,
                 "finished": JobState.FINISHED.value, "interrupted": JobState.INTERRUPTED.value}).scalar()
        return self.job_id

    def _read(self) -> None:
        if self.find_job() is None:
            return
        row = self._conn.execute(sa.text(
            f"SELECT * FROM {frames.quote(self.schema)}.job_progress WHERE job_id = :id"),
            {"id": self.job_id}).mappings().first()
        if row is None:
            return
        self.row = dict(row)
        if self.ref is None:
            self.ref = frames.job_ref(self._conn, self.schema, self.job_id)

    def best(self) -> str:
        """'best validation accuracy 0.9749 (mst_key 7)' from the job's info table."""
        if self.ref is None:
            return ""
        try:
            info = pd.read_sql_query(sa.text(
                "SELECT mst_key, metrics_type, training_loss_final, training_metrics_final, "
                f"validation_loss_final, validation_metrics_final FROM {self.ref.table('info')}"),
                self._conn)
        except sa.exc.DBAPIError:
            return ""  # the table is gone (dropped while watched)
        column, higher = frames.objective(self.ref, info)
        values = info.dropna(subset=[column])
        if values.empty:
            return ""
        top = values.sort_values(column, ascending=not higher).iloc[0]
        split, kind = column.split("_")[0], column.split("_")[1]
        metric_types = top["metrics_type"]
        name = metric_types[0] if kind == "metrics" and metric_types else "loss"
        return f"best {split} {name} {top[column]:.4f} (mst_key {int(top['mst_key'])})"

    def _draw(self) -> None:
        row = self.row
        if row is None or not self.show:
            return
        total = float(row["epochs_total"] or 0)
        done = float(row["epochs_done"] or 0)
        with self._lock:
            if self.bar is None:
                self.bar = tqdm(total=total, initial=done, unit="epoch",
                                desc=f"job {self.job_id}", dynamic_ncols=True,
                                bar_format="{desc}: {percentage:3.0f}%|{bar}| {n:.2f}/{total:.2f} "
                                           "epochs [{elapsed}<{remaining}{postfix}]")
            self.bar.total = total
            self.bar.n = done
            parts = [f"{row['models']} models"]
            if row.get("models_stopped"):
                parts.append(f"{row['models_stopped']} stopped")
            best = self.best()
            if best:
                parts.append(best)
            if row["state"] not in RUNNING:
                parts.append(row["state"])
            self.bar.set_postfix_str(", ".join(parts), refresh=False)
            self.bar.refresh()

    def notice(self, text: str) -> None:
        """A NOTICE of the call, printed above the bar."""
        with self._lock:
            if self.bar is not None:
                self.bar.write(text)
            else:
                tqdm.write(text)

    def follow(self, done: threading.Event | None) -> str:
        """Update the bar until `done` is set (a call of ours), or until the job is no longer
        running (watch); returns the job's state then."""
        first = True
        while True:
            if done is not None:
                finished = done.wait(self.interval)
            else:
                finished = False
                if not first:
                    time.sleep(self.interval)
            first = False
            self._read()
            self._draw()
            state = self.row["state"] if self.row else None
            if finished or (done is None and (state is None or state not in RUNNING)):
                if done is None and state is None:
                    raise LookupError(f"job {self.job_id} not found")
                return state or "unknown"

    def close(self) -> None:
        with self._lock:
            if self.bar is not None:
                self.bar.close()
                self.bar = None
        self._conn.close()


@contextlib.contextmanager
def notices_to(conn: sa.Connection, sink: Callable[[str], None]):
    """The server's NOTICEs on `conn`, as 'NOTICE: text', to `sink` while the block runs."""
    raw = conn.connection.dbapi_connection
    handler = lambda diag: sink(f"{diag.severity}: {diag.message_primary}")  # noqa: E731
    raw.add_notice_handler(handler)
    try:
        yield
    finally:
        raw.remove_notice_handler(handler)


def train_with_progress(engine: sa.Engine, schema: str, statement: str, params: dict,
                        show: bool, print_notice: Callable[[str], None]) -> None:
    """Run a training call on one connection while another shows its job's progress;
    Ctrl-C cancels it on the server (JobCancelled).  The call's own error is raised as it
    came (the caller restates the server's)."""
    outcome: dict[str, BaseException | None] = {"error": None}
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        raw = conn.connection.dbapi_connection
        pid = conn.execute(sa.text("SELECT pg_backend_pid()")).scalar()
        progress = JobProgress(engine, schema, coordinator_pid=pid, show=show)
        done = threading.Event()

        def run():
            try:
                conn.execute(sa.text(statement), params)
            except BaseException as error:  # handed to the calling thread
                outcome["error"] = error
            finally:
                done.set()

        with notices_to(conn, progress.notice if show else print_notice):
            worker = threading.Thread(target=run, name="madlib_mop call", daemon=True)
            worker.start()
            cancelled = False
            try:
                progress.follow(done)
            except KeyboardInterrupt:
                cancelled = True
                raw.cancel_safe()
                # The call ends soon after the cancel; until it has, the connection is
                # its own (another Ctrl-C sends the cancel again).
                while True:
                    try:
                        if done.wait(0.5):
                            break
                    except KeyboardInterrupt:
                        raw.cancel_safe()
                progress.find_job()  # the bar polls: it may not have seen the job yet
            finally:
                progress.close()
            worker.join()
    error = outcome["error"]
    if cancelled and isinstance(getattr(error, "orig", None), psycopg.errors.QueryCanceled):
        raise JobCancelled(*_cancelled_job(engine, schema, progress)) from None
    if error is not None:
        raise error


def _cancelled_job(engine: sa.Engine, schema: str, progress: JobProgress) -> tuple[int | None, str, str]:
    """(job id, schema, ' after x of y epochs') of a cancelled call, read anew."""
    if progress.job_id is None:
        return None, schema, ""
    with engine.connect() as conn:
        row = conn.execute(sa.text(
            f"SELECT epochs_done, epochs_total FROM {frames.quote(schema)}.job_progress "
            "WHERE job_id = :id"), {"id": progress.job_id}).first()
    done = f" after {float(row[0]):g} of {float(row[1]):g} epochs" if row else ""
    return progress.job_id, schema, done
