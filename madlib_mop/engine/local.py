"""The local engine: every segment is a partition of one server's packed table, every
worker a session of that same server, opened by the caller's backend as the caller
(`madlib_mop.db.worker_session`)."""

from __future__ import annotations

import time
from typing import Any

import psycopg
from psycopg.types.json import Jsonb
from psycopg import sql

from madlib_mop import errors
from madlib_mop.db import catalog, worker_session
from madlib_mop.engine import idle_workers, server_slots
from madlib_mop.engine.idle_workers import Adopted
from madlib_mop.engine.base import Engine, VisitRecord, Worker
from madlib_mop.json_values import json_value
from madlib_mop.errors import MadlibMopError
from madlib_mop.runtime.tf_runtime import worker_threads

class NoSlot(MadlibMopError):
    """Every worker slot of the server is taken (`engine.server_slots`)."""


class LocalWorker(Worker):
    """A worker session of this server: one this call opened (a libpq connection), or an
    idle one of its role that it adopted (`engine.idle_workers`: its calls go over the
    idle session's socket).  An adopted session that is lost is replaced, at the next
    call, by a new one on a slot of the pool."""

    def __init__(self, conninfo: str, schema: str, segment: int, label: str,
                 cap: int | None = None, adopted: Adopted | None = None):
        self.conninfo, self.schema, self.segment, self.label = conninfo, schema, segment, label
        self.cap = cap  # the server's cap on worker sessions: its session takes a slot
        self._connection: psycopg.Connection | None = None
        self._adopted = adopted
        self._named: str | None = label if adopted is not None else None

    def open_with_slot(self) -> bool:
        """Open the session now; False (and nothing open) if no slot is free."""
        try:
            self._session()
            return True
        except NoSlot:
            return False

    def idle(self, seconds: int | None) -> int | None:
        """Keep the session for this role's next call, from any session: it waits in
        `_mop_idle` (the CALL is sent, and the connection let go: the session outlives it)
        until adopted, a queued call or `seconds` (then it ends and its slot is free; None:
        its server's madlib_mop.worker_idle_seconds).
        Its process id, None if there is no session to keep."""
        adopted, self._adopted = self._adopted, None
        if adopted is not None:
            return adopted.release(seconds) if adopted.usable else None
        if self._connection is None or self._connection.closed or self._connection.broken:
            return None
        connection, self._connection = self._connection, None
        try:
            pid = connection.info.backend_pid
            # Off before the hand-over: the connection is let go at once, and a check armed
            # at the CALL's start could end the session before `_mop_idle` turns it off.
            connection.execute("SET client_connection_check_interval = 0")
            kept = sql.Literal(None if seconds is None else int(seconds))
            connection.pgconn.send_query(
                sql.SQL("CALL {}._mop_idle({})").format(sql.Identifier(self.schema), kept).as_bytes(connection))
            return pid
        except psycopg.Error:  # a session in no state to be kept: it ends
            return None
        finally:
            connection.close()

    def rename(self, label: str) -> None:
        self.label = label

    def _session(self) -> psycopg.Connection:
        if self._connection is None or self._connection.closed:
            self._connection = self._open()
            self._named = None
        if self._named != self.label:  # a job's id may come after the warm-up
            self._connection.execute("SELECT set_config('application_name', %s, false)",
                                     (self.label,))
            self._named = self.label
        return self._connection

    def _open(self) -> psycopg.Connection:
        connection = worker_session.connect(self.conninfo)
        if self.cap is not None and server_slots.take_slot(connection, self.schema, self.cap) is None:
            connection.close()
            raise NoSlot(f"all {self.cap} worker sessions of this server are taken",
                         sqlstate=errors.CONNECTION_FAILURE,
                         hint="It waits for one; madlib_mop.max_worker_sessions is the cap.")
        return connection

    def _call(self, function: str, *args: Any, columns: str = "*"):
        if self._adopted is not None:
            return self._adopted_call(function, args)
        query = sql.SQL("SELECT {} FROM {}.{}({})").format(
            sql.SQL(columns), sql.Identifier(self.schema), sql.Identifier(function),
            sql.SQL(", ").join(sql.Placeholder() * len(args)))
        try:
            # Binary results: a state comes back as its bytes, not as twice as many hex digits.
            return self._session().execute(query, args, binary=True).fetchone()
        except Exception:
            if self._connection is not None and (self._connection.closed or self._connection.broken):
                self._connection = None
            raise

    def _adopted_call(self, function: str, args: tuple):
        adopted = self._adopted
        if self._named != self.label:
            adopted.rename(self.label)
            self._named = self.label
        try:
            return adopted.call(function, args)
        finally:
            if not adopted.usable:  # lost: the next call opens a session of its own
                self._adopted, self._named = None, None

    def warm_up(self, segments: int) -> None:
        self._call("_mop_warm_up", segments)

    def trace_latest_job(self) -> int:
        """The session's role's latest job's programs, traced (`segment.worker`): how many."""
        return int(self._call("_mop_trace_latest_job")[0])

    def train(self, job_id, mst_key, step, segment, model_state):
        started = time.perf_counter()
        new_state, result = self._call("_mop_train", job_id, mst_key, step, segment, model_state)
        record = VisitRecord.from_json(result)
        # The call as the coordinator saw it: the sub-epoch plus the round trip.
        record.seconds["call"] = time.perf_counter() - started
        return (None if new_state is None else bytes(new_state)), record

    def train_fused(self, job_id, mst_keys, steps, segment, model_states):
        # (`model_states`: none; a worker of this server reads the job's store)
        started = time.perf_counter()
        (results,) = self._call("_mop_train_fused", job_id, list(mst_keys), list(steps), segment)
        records = [VisitRecord.from_json(result) for result in results]
        for record in records:  # each model's share of the call as the coordinator saw it
            record.seconds["call"] = (time.perf_counter() - started) / len(records)
        return [(None, record) for record in records]

    def evaluate(self, job_id, mst_key, step, partition, model_state):
        return json_value(self._call("_mop_evaluate", job_id, mst_key, step, partition, model_state)[0])

    def evaluate_fused(self, job_id, mst_keys, steps, partition, model_states):
        (results,) = self._call("_mop_evaluate_fused", job_id, list(mst_keys), list(steps), partition)
        return [json_value(result) for result in results]

    def evaluate_models(self, task, partition):
        if "weights" in task:  # the models come with the call (a temporary model table)
            shipped = {k: v for k, v in task.items() if k != "weights"}
            return json_value(self._call("_mop_segment_evaluate", Jsonb(shipped), partition,
                                         task["weights"])[0])
        return json_value(self._call("_mop_infer_evaluate", Jsonb(task), partition)[0])

    def predict_blocks(self, task, first_block, last_block, weights):
        return json_value(self._call("_mop_infer_predict", Jsonb(task),
                                first_block, last_block, weights)[0])

    def model_facts(self, request):
        return json_value(self._call("_mop_model_facts", Jsonb(request))[0])

    def initial_states(self, request, weights, token):
        given = None if all(w is None for w in weights) else list(weights)
        states, sizes = self._call("_mop_initial_states", Jsonb(request), given, token)
        return [None if s is None else bytes(s) for s in (states or [None] * len(sizes))], list(sizes)

    def cancel(self) -> None:
        adopted = self._adopted  # (another thread may let it go meanwhile)
        if adopted is not None:
            adopted.cancel()
        elif self._connection is not None and not self._connection.closed:
            try:
                self._connection.cancel_safe()
            except Exception:
                pass

    def close(self) -> None:
        if self._adopted is not None:
            self._adopted.end()
            self._adopted = None
        if self._connection is not None:
            self._connection.close()
            self._connection = None

    @property
    def usable(self) -> bool:
        if self._adopted is not None:
            return self._adopted.usable
        return self._connection is None or not (self._connection.closed or self._connection.broken)


class LocalEngine(Engine):
    """Training workers take slots of the server's pool (`engine.server_slots`): a job gets
    the sessions it kept warm and the free slots, and waits in the queue for one when it
    has none."""

    pooled = True
    stores_states = True

    def without_fusion(self) -> list[str]:
        return []

    def __init__(self, plpy: Any, say_cap: bool = True):
        """`say_cap`: the NOTICE of a cap per database (a call's own engine says it; one that
        only looks for an idle session does not say it twice)."""
        self.plpy = plpy
        self.conninfo = worker_session.conninfo(plpy)
        self.schema = catalog.extension_schema(plpy)
        self.schema_name = catalog.extension_schema_name(plpy)
        self.cap = server_slots.cap(plpy)
        if say_cap and not server_slots.pool(plpy).shared:
            plpy.notice(f"madlib_mop: the cap of {self.cap} worker sessions counts this database's only",
                        detail="The extension's library is not in shared_preload_libraries: each database "
                               "has its own slots and queue.",
                        hint="ALTER SYSTEM SET shared_preload_libraries = 'madlib_mop' (with the libraries "
                             "already there), then restart the server.")
        self.idle_seconds = server_slots.idle_seconds(plpy)
        self.settings = worker_session.forwarded_settings(plpy)

    def worker(self, segment: int, label: str) -> LocalWorker:
        return LocalWorker(self.conninfo, self.schema, segment, label)

    def training_workers(self, segments: int) -> list[Worker]:
        """Idle sessions of this role whose TensorFlow is sized for a job of this many
        segments (TensorFlow imported, the programs of the models they trained before
        traced), then free slots, up to one per segment; none when calls are queued for
        slots (they go first)."""
        workers = self._adopted(segments, worker_threads(segments), "madlib_mop worker")
        return workers + self._free_slots(segments - len(workers), len(workers), "madlib_mop worker")

    def _adopted(self, count: int, threads: int | None, label: str) -> list[Worker]:
        """This role's idle sessions, unless calls wait for slots: they go first (the idle
        sessions then end and give theirs back), as for free slots."""
        self.plpy.execute(idle_workers.FRESH)
        if count <= 0 or server_slots.waiting_calls(self.plpy):
            return []
        labels = [f"{label} {index}" for index in range(count)]
        return [LocalWorker(self.conninfo, self.schema, index, labels[index], self.cap, adopted)
                for index, adopted in enumerate(
                    idle_workers.adopt(self.plpy, count, threads, self.settings, labels))]

    def _free_slots(self, count: int, first: int, label: str) -> list[Worker]:
        """New sessions on the slots free now (none while calls are queued: they go first),
        and on those that other sessions' idle workers give back."""
        workers: list[Worker] = []
        if not server_slots.waiting_calls(self.plpy):
            workers += self.new_workers(count, first, label)
        if len(workers) < count and server_slots.idle_holders(self.plpy):
            workers += self._reclaim(count - len(workers), first + len(workers), label)
        return workers

    def _reclaim(self, count: int, first: int, label: str) -> list[Worker]:
        """Slots that other sessions' idle workers hold: queued, the job makes them end
        (`server_slots.idle`), and takes the slots in its turn, for a few seconds at most."""
        queue = server_slots.Queue(self.conninfo, self.schema_name, None)
        workers: list[Worker] = []
        try:
            while len(workers) < count and time.monotonic() - queue.since < server_slots.RECLAIM_SECONDS:
                # Idle holders counted before the free slots: a session that ends between
                # the two looks is then among the free, never missed by both.
                holders = queue.idle_holders()
                position, free, waiting = queue.turn(self.cap)
                taken = self.new_workers(server_slots.share(position, free, waiting, count - len(workers)),
                                         first + len(workers), label) if position <= free else []
                workers += taken
                # Nothing more to come: no idle session left to end, no slot left free.
                if not holders and free - len(taken) <= 0:
                    break
                self.plpy.execute("SELECT pg_catalog.pg_sleep(0.1)")
        finally:
            queue.leave()
        return workers

    def new_workers(self, count: int, first: int, label: str = "madlib_mop worker") -> list[Worker]:
        """Up to `count` new sessions, as many as slots are free."""
        workers: list[Worker] = []
        for index in range(first, first + count):
            worker = LocalWorker(self.conninfo, self.schema, index, f"{label} {index}", self.cap)
            if not worker.open_with_slot():
                break
            workers.append(worker)
        return workers

    def keep_idle(self, workers: list[Worker], segments: int) -> None:
        """The job ended: its sessions wait for this role's next call (`LocalWorker.idle`)."""
        self._idle(workers)

    def _idle(self, workers: list[Worker]) -> None:
        if not self.idle_seconds:  # madlib_mop.worker_idle_seconds = 0: none is kept
            for worker in workers:
                worker.close()
            return
        idle_workers.wait_listening([worker.idle(self.idle_seconds) for worker in workers
                                     if isinstance(worker, LocalWorker) and worker.usable])

    def idle_workers(self, count: int, label: str) -> list[Worker]:
        """Up to `count` of this role's idle sessions (any: evaluate and predict size their
        threads as they can)."""
        return self._adopted(count, None, label)

    def inference_workers(self, count: int) -> list[Worker]:
        """Up to `count` sessions of the server's pool (evaluate and predict spread their
        parts over those they get): this role's idle ones first (TensorFlow imported),
        then free slots; with none, the call waits in the queue."""
        label = "madlib_mop inference worker"
        workers = self.idle_workers(count, label)
        workers += self._free_slots(count - len(workers), len(workers), label)
        if workers:
            return workers

        def shown(position: int, cap: int, first: bool, elsewhere: int) -> None:
            if first:
                self.plpy.notice(f"madlib_mop: queued for a worker session (position {position}; "
                                 f"{server_slots.taken_text(cap, elsewhere)})")
        return server_slots.wait_in_queue(
            self.plpy, self.conninfo, self.schema_name, None, count,
            lambda n: self.new_workers(n, 0, label), shown,
            lambda: self.plpy.execute("SELECT 1"), hint="Call it again later")

    def keep_inference(self, workers: list[Worker]) -> None:
        """After an evaluation or prediction: its sessions wait for this role's next call."""
        self._idle(workers)
