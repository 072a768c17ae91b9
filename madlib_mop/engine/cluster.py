"""The several-servers engine: the segments of a packed table are foreign-table partitions
stored on segment servers (`madlib_mop.db.segments`); each worker is a session on the server
that holds its segment, as the calling role, and reads only that server's table.

The model state travels coordinator -> worker -> coordinator with each call, as on one
server (the engine contract): a finished sub-epoch counts once the coordinator has committed
it.  A segment server has no row of the job: when a worker opens its session it sends the
job's description (`job_description`: seeds, model configurations, where the segment's rows
are), then the calls are the same `_mop_train` / `_mop_evaluate` as on one server.
"""

from __future__ import annotations

import time
from typing import Any, Callable

from psycopg import sql
from psycopg.types.json import Jsonb

from madlib_mop import errors
from madlib_mop.db import catalog, packed, segments, worker_session
from madlib_mop.db.segments import Partition, SegmentServer
from madlib_mop.engine.base import Engine, Worker, as_error
from madlib_mop.json_values import json_value
from madlib_mop.engine import server_slots
from madlib_mop.engine.local import LocalWorker, NoSlot
from madlib_mop.errors import MadlibMopError


class ClusterWorker(LocalWorker):
    """A session on one segment server."""

    def __init__(self, conninfo: str, schema: str, segment: int, label: str,
                 server: SegmentServer, local_segments: int, refused_hint: str):
        super().__init__(conninfo, schema, segment, label)
        self.server, self.local_segments, self.refused_hint = server, local_segments, refused_hint
        self.job: dict | None = None  # the description its session must have
        self._job_sent = None  # (the session that got it, the description it got)

    @property
    def where(self) -> str:
        return self.server.label

    def _open(self):
        """A session of the segment server on a slot of that server's own pool: its cap
        (`madlib_mop.max_worker_sessions` there) counts these sessions as its own."""
        connection = segments.connect(self.conninfo, self.server, self.refused_hint)
        schema = sql.Identifier(self.schema)
        cap = connection.execute(sql.SQL("SELECT {}._mop_worker_cap()").format(schema)).fetchone()[0]
        if server_slots.take_slot(connection, self.schema, cap) is None:
            connection.close()
            raise NoSlot(f"all {cap} worker sessions of {self.server.label} are taken",
                         sqlstate=errors.CONNECTION_FAILURE,
                         hint=f"It waits for one; madlib_mop.max_worker_sessions on {self.server.label} "
                              "is its cap.")
        return connection

    def _call(self, function: str, *args: Any, columns: str = "*"):
        if function in ("_mop_train", "_mop_evaluate") and self.job is not None:
            session = self._session()
            # A new session gets the job first; so does a session whose job has changed
            # since (a searcher added models: the engine prepared the job again).
            if self._job_sent is None or self._job_sent[0] is not session or self._job_sent[1] is not self.job:
                super()._call("_mop_segment_job",
                              Jsonb(dict(self.job, local_segments=self.local_segments)))
                self._job_sent = (session, self.job)
        return super()._call(function, *args, columns=columns)

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
        self._workers: list[ClusterWorker] = []
        self.full: str | None = None  # the segment server that had no slot free, if one had none
        self.tried = 0.0
        self._inference: list[ClusterWorker] = []

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
        worker.job = self.job
        self._workers.append(worker)
        return worker

    def prepare_job(self, plpy: Any, job: Any, models: Callable[[], list[dict]]) -> None:
        self.job = job_description(plpy, job, models(), self.partitions)
        for worker in self._workers:
            worker.job = self.job

    def training_workers(self, segments: int) -> list[Worker]:
        """One worker per segment, each on a slot of its segment server's pool; none when a
        server has no slot free (the job then waits in the queue, `new_workers`): a segment
        is served only by its own server's sessions."""
        workers = [self.worker(s, f"madlib_mop worker segment {s}") for s in range(segments)]
        self.full = next((w.server.label for w in workers if not w.open_with_slot()), None)
        if self.full is None:
            return workers
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

    def inference_workers(self, count: int) -> list[Worker]:
        """Worker i is on the server of partition i (opened per call: a cluster's sessions
        are not kept between calls)."""
        return [self.worker(i, f"madlib_mop inference worker {i}") for i in range(count)]


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
