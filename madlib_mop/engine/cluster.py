"""The several-servers engine: the segments of a packed table are foreign-table partitions
stored on segment servers (`madlib_mop.db.segments`); each worker is a session on the server
that holds its segment, as the calling role, and reads only that server's table.

A segment server has no row of the job: when a worker opens its session it sends the job's
description (`job_description`: seeds, model configurations, where the segment's rows are).
A visit's new state stays on the server where it was trained; the next visit's worker
fetches it from there (`segment.kept_states`, `engine.segment_states`, `engine.kept_calls`),
and the call and its answer carry decisions and records, not states; so do a fused group's
calls, each of its models' states found so.  A state the coordinator has (step 0,
a model gone back to a durable state) or must carry (between servers that cannot reach
each other) goes to the worker's server a piece per call first: a state of any size.  A
server whose extension predates kept states gets the state with the call and returns the
new one (`_mop_train` / `_mop_evaluate`, as on one server).
"""

from __future__ import annotations

import concurrent.futures
import io
import secrets
import time
from typing import Any, Callable

import psycopg
from psycopg import sql
from psycopg.types.json import Jsonb

from madlib_mop import errors
from madlib_mop.db import catalog, packed, segments, worker_session
from madlib_mop.db.segments import Partition, SegmentServer
from madlib_mop.engine.base import Engine, Worker, as_error
from madlib_mop.json_values import json_value
from madlib_mop.engine import idle_workers, server_slots
from madlib_mop.engine.segment_states import SegmentStates, store_token
from madlib_mop.engine.kept_calls import KeptStateCalls
from madlib_mop.engine.local import LocalWorker, NoSlot
from madlib_mop.errors import MadlibMopError


# The calls that need the job's description in the session.
JOB_FUNCTIONS = ("_mop_train", "_mop_evaluate", "_mop_segment_train", "_mop_segment_validate",
                 "_mop_segment_receive", "_mop_segment_train_fused", "_mop_segment_validate_fused")


class ClusterWorker(KeptStateCalls, LocalWorker):
    """A session on one segment server: one of the role's idle sessions there, taken up
    through a relaying session (`engine.relay`), else a new one on a slot of that server's
    pool."""

    def __init__(self, conninfo: str, schema: str, segment: int, label: str,
                 server: SegmentServer, local_segments: int, refused_hint: str):
        super().__init__(conninfo, schema, segment, label)
        self.server, self.local_segments, self.refused_hint = server, local_segments, refused_hint
        self.job: dict | None = None  # the description its session must have
        self._job_sent = None  # (the session that got it, the description it got)
        self.relayed: int | None = None  # the adopted idle session's process id, if one
        self.states: SegmentStates | None = None  # where the job's kept states are
        # The segment servers its session fetches states from itself; None: its server's
        # extension predates kept states (the coordinator carries them both ways).
        self.peers: set[str] | None = None
        self.receives = True  # its server takes carried states in pieces (`_carry`)

    @property
    def where(self) -> str:
        return self.server.label

    def _open(self):
        """The role's idle session of the segment server (TensorFlow imported, programs
        traced), else a new session on a slot of that server's own pool: its cap
        (`madlib_mop.max_worker_sessions` there) counts these sessions as its own."""
        connection = segments.connect(self.conninfo, self.server, self.refused_hint)
        schema = sql.Identifier(self.schema)
        try:
            self.relayed = _adopted_there(connection, schema, self.local_segments, self.label)
            if self.relayed is not None:
                return connection
            cap = connection.execute(sql.SQL("SELECT {}._mop_worker_cap()").format(schema)).fetchone()[0]
            if server_slots.take_slot(connection, self.schema, cap) is None and not _reclaimed(
                    connection, self.schema, cap):
                raise NoSlot(f"all {cap} worker sessions of {self.server.label} are taken",
                             sqlstate=errors.CONNECTION_FAILURE,
                             hint=f"It waits for one; madlib_mop.max_worker_sessions on {self.server.label} "
                                  "is its cap.")
        except BaseException:
            connection.close()
            raise
        return connection

    def _call(self, function: str, *args: Any, columns: str = "*"):
        if function in JOB_FUNCTIONS and self.job is not None:
            self._send_job()
        return self._one_call(function, args, columns)

    def _send_job(self) -> None:
        """A new session gets the job first; so does a session whose job has changed since
        (a searcher added models: the engine prepared the job again).  It says which other
        segment servers it fetches states from."""
        session = self._session()
        if self._job_sent is not None and self._job_sent[0] is session and self._job_sent[1] is self.job:
            return
        self._one_call("_mop_segment_job", (Jsonb(dict(self.job, local_segments=self.local_segments)),))
        self.peers = None
        if self.job.get("store"):
            try:
                (peers,) = self._one_call("_mop_segment_peers", (self.job["servers"],))
                self.peers = set(peers or ())
            except psycopg.Error as error:
                if error.sqlstate != errors.UNDEFINED_FUNCTION:
                    raise
        self._job_sent = (session, self.job)

    def initial_states(self, request, weights, token):
        """Built on the worker's server into files of a request of its own, then read a piece
        per call (`read_in_pieces`): a step-0 state of any size (not one value, at most 1 GB)."""
        if token is not None:
            return super().initial_states(request, weights, token)
        own = secrets.token_hex(16)
        _, sizes = super().initial_states(request, weights, own)
        states = read_in_pieces(lambda key, offset: self._call("_mop_initial_state_piece", own, key, offset),
                                [model["mst_key"] for model in request["models"]], sizes, self.where)
        # (there, the request's files then stay in that server's folder of new states)
        return (states, sizes) if states is not None else super().initial_states(request, weights, None)

    def _one_call(self, function: str, args: tuple, columns: str = "*"):
        session = self._session()
        if self.relayed is None:
            return super()._call(function, *args, columns=columns)
        values, blobs = idle_workers.encode(list(args))
        try:
            result, out = session.execute(
                sql.SQL("SELECT * FROM {}._mop_relay_call(%s, %s, %s)").format(sql.Identifier(self.schema)),
                (function, Jsonb(values), blobs), binary=True).fetchone()
        except psycopg.Error as error:
            # The adopted session lost (08006 from the relay), or the relaying one: the
            # next call opens a session again.
            # (08001 is the adopted session's own call failing to reach another server: kept)
            if session.closed or session.broken or (
                    (error.sqlstate or "").startswith("08") and error.sqlstate != errors.UNABLE_TO_CONNECT):
                self.close()
            raise
        return tuple(idle_workers.decode(json_value(result), [bytes(b) for b in out or []]))

    def idle(self, seconds: int | None) -> int | None:
        """Back to idleness on its server, for that server's madlib_mop.worker_idle_seconds
        (`seconds` is the coordinator's: not used)."""
        if self.relayed is None:
            return super().idle(None)
        connection, self._connection, self.relayed = self._connection, None, None
        if connection is None or connection.closed or connection.broken:
            return None
        try:
            return connection.execute(sql.SQL("SELECT {}._mop_relay_release()").format(
                sql.Identifier(self.schema))).fetchone()[0]
        except psycopg.Error:  # not kept: closing the relaying session ends it
            return None
        finally:
            connection.close()

    def close(self) -> None:
        """Closing the relaying session ends the session it adopted as well."""
        self.relayed = None
        super().close()

    def serves(self, segment: int) -> bool:
        return segment == self.segment

    def warm_up(self, segments_count: int) -> None:
        self._call("_mop_warm_up", self.local_segments)

    def evaluate_models(self, task, partition):
        weights = task["weights"]
        shipped = {k: v for k, v in task.items() if k != "weights"}
        return json_value(self._call("_mop_segment_evaluate", Jsonb(shipped), partition, weights)[0])

    def predict_blocks(self, task, first_block, last_block, weights):
        raise MadlibMopError("predicting on a segment server is not supported",
                             sqlstate=errors.FEATURE_NOT_SUPPORTED,
                             hint="Predict from a table of the coordinator.")


def read_in_pieces(piece_at: Callable[[int, int], tuple], mst_keys: list[int], sizes: list[int],
                   where: str) -> list[bytes] | None:
    """Step-0 states a segment server's worker wrote to files of a request, read a piece
    per call (`piece_at(mst_key, offset)`: `_mop_initial_state_piece`, which removes a file
    once its end is read; on a failure, those not read are removed so).  None: that
    server's extension predates this (its files stay in its folder of new states)."""
    states = []
    try:
        for mst_key, size in zip(mst_keys, sizes):
            blob = io.BytesIO()
            while blob.tell() < size:
                (piece,) = piece_at(mst_key, blob.tell())
                if not piece:
                    raise MadlibMopError(f"{where}: the step-0 state of model {mst_key} ended after "
                                         f"{blob.tell()} of its {size} bytes", sqlstate=errors.DATA_EXCEPTION,
                                         hint="Start the job again.")
                blob.write(piece)
            states.append(blob.getvalue())
    except BaseException as error:
        if isinstance(error, psycopg.Error) and error.sqlstate == errors.UNDEFINED_FUNCTION:
            return None
        _removed_there(piece_at, mst_keys[len(states):], sizes[len(states):])
        raise
    return states


def _removed_there(piece_at: Callable[[int, int], tuple], mst_keys: list[int], sizes: list[int]) -> None:
    """The files of states not read, removed where the server still answers (reading at
    their end removes them)."""
    for mst_key, size in zip(mst_keys, sizes):
        try:
            piece_at(mst_key, size)
        except Exception:
            return


def _adopted_there(connection: psycopg.Connection, schema: sql.Identifier, local_segments: int,
                   label: str) -> int | None:
    """The process id of the role's idle session that the session adopted on its server
    (`engine.relay`), None if none (or the server's extension predates the relay)."""
    try:
        return connection.execute(sql.SQL("SELECT {}._mop_relay_adopt(%s, %s)").format(schema),
                                  (local_segments, label)).fetchone()[0]
    except psycopg.errors.UndefinedFunction:
        return None


def _reclaimed(connection: psycopg.Connection, schema: str, cap: int) -> bool:
    """Did the session take a slot that idle sessions of its segment server gave back?
    Queued there, it makes them end, as a call of that server would (other roles', or
    the role's own whose threads do not fit), for a few seconds at most."""
    queue = server_slots.Queue(None, schema, None, db=connection)
    try:
        while time.monotonic() - queue.since < server_slots.RECLAIM_SECONDS:
            holders = queue.idle_holders()  # (before the slot is tried: one ending between is not missed)
            if server_slots.take_slot(connection, schema, cap) is not None:
                return True
            if not holders:
                return False
            time.sleep(0.1)
        return False
    finally:
        queue.leave()


def slot_session(plpy: Any, server: SegmentServer) -> psycopg.Connection:
    """A new session on `server` on a slot of its pool, for work that needs a session of its
    own there (predict's temporary table where a table lies): while the server has none
    free, it waits, a NOTICE naming the server, trying once a second, up to
    madlib_mop.queue_timeout_seconds."""
    schema = catalog.extension_schema_name(plpy)
    timeout, since, said = server_slots.queue_timeout(plpy), time.monotonic(), False
    connection = segments.session(plpy, server)
    try:
        cap = connection.execute(sql.SQL("SELECT {}._mop_worker_cap()").format(sql.Identifier(schema))).fetchone()[0]
        while server_slots.take_slot(connection, schema, cap) is None and not _reclaimed(connection, schema, cap):
            if not said:
                plpy.notice(f"madlib_mop: queued for a worker session of {server.label} "
                            f"(all {cap} of its worker sessions are taken)")
                said = True
            if timeout is not None and time.monotonic() - since > timeout:
                raise MadlibMopError(f"waited {timeout}s for a worker session of {server.label}",
                                     sqlstate=errors.INSUFFICIENT_RESOURCES,
                                     detail=f"All {cap} worker sessions of {server.label} are taken.",
                                     hint=f"Call it again later, or SET {server_slots.QUEUE_TIMEOUT_SETTING} "
                                          "higher (0: no limit).")
            plpy.execute("SELECT pg_catalog.pg_sleep(1)")
    except BaseException:
        connection.close()
        raise
    return connection


class ClusterEngine(Engine):
    shares_files = False
    def __init__(self, plpy: Any, table: catalog.Table, partitions: dict[int, Partition]):
        self.table, self.partitions = table, partitions
        self.schema = catalog.extension_schema(plpy)
        role = plpy.execute("SELECT current_user AS r")[0]["r"]
        extra, options = worker_session.session_settings(plpy)
        self.servers: dict[str, SegmentServer] = {}
        self.conninfo: dict[str, str] = {}
        self.hints: dict[str, str] = {}
        for partition in partitions.values():
            if partition.server is None:
                raise MadlibMopError(
                    f"segment {partition.segment} of {table.name} is on this server, others on "
                    "segment servers", sqlstate=errors.FEATURE_NOT_SUPPORTED,
                    hint="Pack the table again: all its segments on segment servers, or none.")
            name = partition.server.name
            if name not in self.conninfo:
                self.servers[name] = partition.server
                self.conninfo[name] = segments.worker_conninfo(plpy, partition.server, extra, options)
                self.hints[name] = segments.refused_hint(partition.server, role)
        self.job: dict | None = None
        self.states: SegmentStates | None = None  # a job's kept states (`kept_states`)
        self._workers: list[ClusterWorker] = []
        self.full: str | None = None  # the segment server that had no slot free, if one had none
        self.tried = 0.0
        self._inference: list[ClusterWorker] = []
        self._answers: tuple[list, list[str]] | None = None  # (`_asked`)

    def _server(self, segment: int) -> SegmentServer:
        if segment not in self.partitions:
            raise MadlibMopError(f"{self.table.name} has no partition for segment {segment}",
                                 sqlstate=errors.DATA_EXCEPTION,
                                 hint="Pack the table again with training_preprocessor_dl().")
        return self.partitions[segment].server

    def worker(self, segment: int, label: str) -> ClusterWorker:
        server = self._server(segment)
        local = sum(1 for p in self.partitions.values() if p.server.name == server.name)
        worker = ClusterWorker(self.conninfo[server.name], self.schema, segment, label, server,
                               local, self.hints[server.name])
        worker.job, worker.states = self.job, self.states
        self._workers.append(worker)
        return worker

    def kept_states(self, plpy: Any, job: Any) -> SegmentStates:
        """The job's states stay on the segment servers where their visits ran."""
        self.states = SegmentStates(self, store_token(plpy, job.job_id))
        for worker in self._workers:
            worker.states = self.states
        return self.states

    def worker_limits(self) -> list[tuple[str, dict]]:
        """Each segment server's; one whose extension predates the question is not counted."""
        return self._asked()[0]

    def without_fusion(self) -> list[str]:
        """The segment servers whose extension predates fused training (0.21.0)."""
        return self._asked()[1]

    def _asked(self) -> tuple[list[tuple[str, dict]], list[str]]:
        """What a job asks each segment server before it starts (`worker_limits`,
        `without_fusion`): once, over one session per server, the servers at once (a new
        session's first question loads the extension's Python: about 0.2 s)."""
        if self._answers is None:
            answers = at_once(list(self.servers.items()), lambda named: self._ask(*named))
            self._answers = ([(f"segment server {name}", found) for (name, _), (found, _) in
                              zip(self.servers.items(), answers) if found is not None],
                             [server.label for server, (_, fuses) in zip(self.servers.values(), answers)
                              if not fuses])
        return self._answers

    def _ask(self, name: str, server: SegmentServer) -> tuple[dict | None, bool]:
        """(its limits, None where its extension predates them; does it train fused groups?)"""
        with segments.connect(self.conninfo[name], server, self.hints[name],
                              application_name="madlib_mop coordinator") as session:
            fuses = session.execute("SELECT to_regproc(%s) IS NOT NULL",
                                    (f"{self.schema}._mop_segment_train_fused",)).fetchone()[0]
            try:
                (found,) = session.execute(sql.SQL("SELECT {}._mop_worker_limits()").format(
                    sql.Identifier(self.schema))).fetchone()
            except psycopg.Error as error:
                if error.sqlstate != errors.UNDEFINED_FUNCTION:
                    raise as_error(error) from None
                return None, bool(fuses)
        return json_value(found), bool(fuses)

    def prepare_job(self, plpy: Any, job: Any, models: Callable[[], list[dict]]) -> None:
        self.job = job_description(plpy, job, models(), self.partitions)
        if self.states is not None:
            self.job.update(store=self.states.store, servers=sorted(self.servers))
        for worker in self._workers:
            worker.job = self.job

    def training_workers(self, segments: int) -> list[Worker]:
        """One worker per segment, each on a slot of its segment server's pool; none when a
        server has no slot free (the job then waits in the queue, `new_workers`): a segment
        is served only by its own server's sessions."""
        workers = [self.worker(s, f"madlib_mop worker segment {s}") for s in range(segments)]
        # The servers at once (each login and adoption loads the extension's Python there);
        # a server's own workers one after the other, as they take up its idle sessions and
        # slots in turn.
        by_server = [[w for w in workers if w.server.name == name] for name in dict.fromkeys(
            w.server.name for w in workers)]
        try:
            slots = at_once(by_server, lambda its: [worker.open_with_slot() for worker in its])
        except BaseException:
            self.keep_idle([w for w in workers if w.relayed is not None], segments)
            for worker in workers:
                worker.close()
            self._workers = [w for w in self._workers if w not in workers]
            raise
        self.full = next((w.server.label for its, taken in zip(by_server, slots)
                          for w, slot in zip(its, taken) if not slot), None)
        if self.full is None:
            return workers
        self.keep_idle([w for w in workers if w.relayed is not None], segments)
        for worker in workers:
            worker.close()
        self._workers = [w for w in self._workers if w not in workers]
        return []

    def new_workers(self, count: int, first: int) -> list[Worker]:
        """A waiting job's workers: all its segments' or none (`training_workers`), tried
        once a second (each try logs in on every segment server)."""
        if time.monotonic() - self.tried < 1.0:
            return []
        self.tried = time.monotonic()
        return self.training_workers(len(self.partitions))

    def waiting_for(self) -> str | None:
        return None if self.full is None else f"all worker sessions of {self.full} are taken"

    def keep_idle(self, workers: list[Worker], segments: int) -> None:
        """The job ended: its sessions wait, each on its segment server, for the role's next
        call there (`LocalWorker.idle`, `engine.relay`), as long as that server's
        madlib_mop.worker_idle_seconds says."""
        for worker in workers:
            if isinstance(worker, ClusterWorker) and worker.usable:
                worker.idle(None)

    def inference_workers(self, count: int) -> list[Worker]:
        """Worker i is on the server of partition i (an idle session of the role there, else
        a new one on a slot)."""
        return [self.worker(i, f"madlib_mop inference worker {i}") for i in range(count)]

    def keep_inference(self, workers: list[Worker]) -> None:
        self.keep_idle(workers, len(workers))


def at_once(items: list, call: Callable[[Any], Any]) -> list:
    """`call` of each item, each in a thread of its own (work on several segment servers,
    over psycopg sessions only: never plpy, which belongs to the calling thread); the results
    in order, or the first failure once all have ended."""
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, len(items))) as threads:
        futures = [threads.submit(call, item) for item in items]
    return [future.result() for future in futures]


def on_server(server: SegmentServer, error: BaseException) -> MadlibMopError:
    """A failure of work on a segment server, its message naming the server."""
    failure = as_error(error)
    if server.label in failure.message:
        return failure
    return MadlibMopError(f"{server.label}: {failure.message}", sqlstate=failure.sqlstate,
                          detail=failure.detail, hint=failure.hint)


def engine_for(plpy: Any, packed_table: str | int, local: Any) -> Engine:
    """The engine of a packed table: `local` (a callable giving the local engine) unless its
    segments are on segment servers."""
    table = catalog.resolve_table(plpy, packed_table, argument="source_table")
    partitions = segments.placement(plpy, table)
    return local() if partitions is None else ClusterEngine(plpy, table, partitions)


def _shipped_data(plpy: Any, table_name: str, partitions: dict[int, Partition],
                  train: dict[int, Partition] | None) -> dict:
    summary = packed.read_summary(plpy, table_name, argument="packed table")
    x, y = packed.packed_columns(summary)
    if train is not None:
        for p, part in partitions.items():
            worker_server = train[p % len(train)].server
            if part.server is None or part.server.name != worker_server.name:
                raise MadlibMopError(
                    f"partition {p} of validation table {summary['packed_table']} is not on "
                    f"{worker_server.label}, where the training segment that evaluates it is",
                    sqlstate=errors.FEATURE_NOT_SUPPORTED,
                    hint="Pack the validation table with validation_preprocessor_dl() against "
                         "this training table (it places partitions with the segments).")
    return {"table": summary["packed_table"],
            "columns": [x, y, summary["label_kind"] == "classification"],
            "partitions": {str(p): part.name for p, part in partitions.items()}}


def job_description(plpy: Any, job: Any, models: list[dict], partitions: dict[int, Partition]) -> dict:
    """What a segment server's worker needs of a job: its `jobs` row (`job.record.JobRecord`,
    as the coordinator's store reads it) and its models (mst_key, model_arch, compile_params, fit_params)."""
    validation = None
    if job.validation_table:
        table = catalog.resolve_table(plpy, job.validation_table, argument="validation_table")
        placed = segments.placement(plpy, table)
        if placed is None:
            raise MadlibMopError(
                f"validation table {table.name} is on this server, the training data on "
                "segment servers", sqlstate=errors.FEATURE_NOT_SUPPORTED,
                hint="Pack it with validation_preprocessor_dl() against the training table.")
        validation = _shipped_data(plpy, job.validation_table, placed, partitions)
    return {"job_id": job.job_id, "seed": job.seed, "segments": job.num_segments,
            "use_caching": job.arguments.use_caching is not False,
            "stage_frozen_layers": job.arguments.stage_frozen_layers,
            "train": _shipped_data(plpy, job.source_table, partitions, None),
            "validation": validation,
            "models": models}
