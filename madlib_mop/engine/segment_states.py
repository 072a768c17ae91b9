"""The coordinator's side of states kept on segment servers (`segment.kept_states`).

A job whose segments are on segment servers leaves each model's state where its last visit
ran.  The coordinator knows where from the visits' records (`VisitRecord.kept_on`), tells
the next visit's worker (`locate`), and reads a state itself only when it needs one:

- the durable copy of each iteration's end, and the weights published with it
  (`state_store.DurableWriter`, through `HopFiles.fetch`): once per model and iteration;
- for a worker whose server cannot reach the one that keeps the state (no foreign server
  or user mapping for it there): the coordinator carries the state, as before;
- a steering clone's source state, and validation of a state the model has left since.

It reads over sessions of its own on the segment servers, as the role (one per server and
thread: the coordinator's loop, the durable writer and the workers' threads read at once),
in pieces of 4 MB, never one value over 1 GB.
"""

from __future__ import annotations

import io
import threading
import time
from typing import Any

import psycopg
from psycopg import sql

from madlib_mop import errors
from madlib_mop.db import catalog, segments
from madlib_mop.engine.base import as_error, session_lost


def store_token(plpy: Any, job_id: int) -> str:
    """The name of a job's states on segment servers: this coordinator's identity (the
    extension's `coordinator_id`) and the job, so that two coordinators' jobs never meet."""
    schema = catalog.extension_schema(plpy)
    identity = plpy.execute(f"SELECT id::text AS id FROM {schema}.coordinator_id")[0]["id"]
    return f"{identity}-{int(job_id)}"


class SegmentStates:
    """Where a job's states kept on segment servers are, and reading them (see the module's
    docstring).  `models`: the coordinator's `store.ModelRecord`s (`JobStore.load_models`
    sets it)."""

    def __init__(self, engine: Any, store: str):
        self.engine, self.store = engine, store
        self.models: dict = {}
        self._local = threading.local()
        self._opened: list[tuple[str, psycopg.Connection]] = []  # (server, session)
        self._lock = threading.Lock()
        self.wait_seconds = 300.0  # the coordinator's madlib_mop.segment_wait_seconds
        self._closed = False

    def locate(self, mst_key: int, step: int) -> str | None:
        """The segment server that keeps the model's state after `step` sub-epochs (None:
        the job's store here has it: step 0, or a state a resumed job went back to)."""
        model = self.models.get(mst_key)
        if model is None or step == 0 or model.state_here == step:
            return None
        visit = model.visits.get(step - 1)
        return None if visit is None else visit.get("kept_on")

    def current(self, mst_key: int, step: int) -> str | None:
        """`locate` for the model's latest state (the one its next visit trains from); a
        state it has left since is read through the job's store, which keeps what
        validation still needs."""
        model = self.models.get(mst_key)
        return self.locate(mst_key, step) if model is not None and len(model.visits) == step else None

    def _session(self, name: str) -> psycopg.Connection:
        sessions = self._local.__dict__.setdefault("sessions", {})
        connection = sessions.get(name)
        if connection is None or connection.closed or connection.broken:
            connection = segments.connect(self.engine.conninfo[name], self.engine.servers[name],
                                          self.engine.hints[name],
                                          application_name="madlib_mop coordinator states")
            sessions[name] = connection
            with self._lock:
                self._opened.append((name, connection))
        return connection

    def _function(self, name: str) -> sql.Composed:
        return sql.SQL("{}.{}").format(sql.Identifier(self.engine.schema), sql.Identifier(name))

    def copy(self, mst_key: int, step: int, handle: Any, patient: bool = False) -> int:
        """The state, from the segment server that keeps it, written to `handle` a piece at
        a time: its bytes.  `patient` (the durable writer, the coordinator's loop): a server
        that does not answer is waited for, trying again with back-off for up to
        `wait_seconds`, as its segment's calls wait (`job.failures.RetryPolicy`)."""
        name = self.locate(mst_key, step)
        server = self.engine.servers[name]
        since, delay = time.monotonic(), 0.5
        while True:
            handle.seek(0)
            handle.truncate()
            written = 0
            try:
                cursor = self._session(name).cursor(binary=True)
                for (piece,) in cursor.stream(sql.SQL("SELECT {}(%s, %s, %s, true)").format(
                        self._function("_mop_segment_state")), (self.store, mst_key, step), binary=True):
                    handle.write(piece)
                    written += len(piece)
                break
            except (psycopg.Error, errors.MadlibMopError) as error:
                failure = as_error(error) if getattr(error, "sqlstate", None) else segments.unreachable(server, error)
                if not (patient and session_lost(failure)) or self._closed \
                        or time.monotonic() - since > self.wait_seconds:
                    raise failure from None
            time.sleep(delay)
            delay = min(10.0, 2 * delay)
        return written

    def read(self, mst_key: int, step: int) -> bytes:
        """The state's bytes (to carry them to a worker that cannot fetch them itself)."""
        buffer = io.BytesIO()
        self.copy(mst_key, step, buffer)
        return buffer.getvalue()

    def holds(self, mst_key: int, step: int) -> bool:
        """Does the segment server that should keep it still have the state (a server
        restarted since has none; one that does not answer counts as none)?"""
        name = self.locate(mst_key, step)
        if name is None or name not in self.engine.servers:
            return False
        try:
            (held,) = self._session(name).execute(sql.SQL("SELECT {}(%s, %s, %s)").format(
                self._function("_mop_segment_states_held")), (self.store, [mst_key], [step])).fetchone()
        except (psycopg.Error, errors.MadlibMopError):
            return False
        return bool(held and held[0])

    def forget(self) -> None:
        """The job ended: its states go from every segment server (one that does not answer
        keeps them until it restarts: a job started there then removes an earlier run's)."""
        for name in self.engine.servers:
            # A session the job's threads opened there (they are done: the durable writer
            # drained, the workers released), else a new one.
            with self._lock:
                opened = [c for n, c in self._opened if n == name and not (c.closed or c.broken)]
            try:
                connection = opened[0] if opened else self._session(name)
                connection.execute(sql.SQL("SELECT {}(%s)").format(
                    self._function("_mop_segment_forget")), (self.store,))
            except (psycopg.Error, errors.MadlibMopError):
                pass
        self.close()

    def close(self) -> None:
        self._closed = True
        with self._lock:
            opened, self._opened = self._opened, []
        for _, connection in opened:
            connection.close()
