"""The local engine: every segment is a partition of one server's packed table, every
worker a session of that same server, opened by the caller's backend as the caller
(`madlib_mop.db.worker_session`)."""

from __future__ import annotations

import time
from typing import Any

import psycopg
from psycopg.types.json import Jsonb
from psycopg import sql

from madlib_mop.db import catalog, worker_session
from madlib_mop.engine.base import Engine, VisitRecord, Worker, json_value

# Worker sessions kept for the calling session's later calls, by connection string (which
# names the role, the database and the session settings): a kept session never serves
# another role.  Training workers also by segment count (it sized their thread pools).
_inference_pool: dict[str, list["LocalWorker"]] = {}
_training_pool: dict[tuple[str, int], list["LocalWorker"]] = {}


class LocalWorker(Worker):
    def __init__(self, conninfo: str, schema: str, segment: int, label: str):
        self.conninfo, self.schema, self.segment, self.label = conninfo, schema, segment, label
        self._connection: psycopg.Connection | None = None
        self._named: str | None = None

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
        return worker_session.connect(self.conninfo)

    def _call(self, function: str, *args: Any, columns: str = "*"):
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

    def warm_up(self, segments: int) -> None:
        self._call("_mop_warm_up", segments)

    def train(self, job_id, mst_key, step, segment, model_state):
        started = time.perf_counter()
        new_state, result = self._call("_mop_train", job_id, mst_key, step, segment, model_state)
        record = VisitRecord.from_json(result)
        # The call as the coordinator saw it: the sub-epoch plus the round trip.
        record.seconds["call"] = time.perf_counter() - started
        return bytes(new_state), record

    def evaluate(self, job_id, mst_key, step, partition, model_state):
        return json_value(self._call("_mop_evaluate", job_id, mst_key, step, partition, model_state)[0])

    def evaluate_models(self, task, partition):
        return json_value(self._call("_mop_infer_evaluate", Jsonb(task), partition)[0])

    def predict_blocks(self, task, first_block, last_block, weights):
        return json_value(self._call("_mop_infer_predict", Jsonb(task),
                                first_block, last_block, weights)[0])

    def cancel(self) -> None:
        if self._connection is not None and not self._connection.closed:
            try:
                self._connection.cancel_safe()
            except Exception:
                pass

    def close(self) -> None:
        if self._connection is not None:
            self._connection.close()
            self._connection = None

    @property
    def usable(self) -> bool:
        return self._connection is None or not (self._connection.closed or self._connection.broken)


class LocalEngine(Engine):
    def __init__(self, plpy: Any):
        self.conninfo = worker_session.conninfo(plpy)
        self.schema = catalog.extension_schema(plpy)

    def worker(self, segment: int, label: str) -> LocalWorker:
        return LocalWorker(self.conninfo, self.schema, segment, label)

    def training_workers(self, segments: int) -> list[Worker]:
        """Kept for the session's next job: its workers find TensorFlow imported and the
        functions of the models they trained before traced."""
        key = (self.conninfo, segments)
        kept = _training_pool.get(key, [])
        workers = [w if w.usable else self.worker(s, f"madlib_mop worker segment {s}")
                   for s, w in enumerate(kept)]
        workers += [self.worker(s, f"madlib_mop worker segment {s}")
                    for s in range(len(workers), segments)]
        _training_pool[key] = workers
        return list(workers)

    def inference_workers(self, count: int) -> list[Worker]:
        """Sessions kept for this session's later calls: TensorFlow is imported and the
        model built once per worker, not once per call."""
        pool = [w for w in _inference_pool.get(self.conninfo, []) if w.usable]
        while len(pool) < count:
            pool.append(self.worker(len(pool), f"madlib_mop inference worker {len(pool)}"))
        _inference_pool[self.conninfo] = pool
        return pool[:count]
