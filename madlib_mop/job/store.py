"""A job's store: its catalog row and per-job tables, on the coordinator's server.

All of a running job's SQL goes through `JobStore`, over the coordinator's own session
(autocommit: what it writes is committed at once, so other sessions see progress and a
failure loses nothing recorded).  A sub-epoch counts once `record_visit` has committed the
visit's record; its new state is then in the job's store (`job.state_store`: between hops
in a file of the server, at each iteration's end also in the state table).

The job's tables are declared in `job.tables`; its `jobs` row is read and written by
`job.repository` alone (`JobStore.job` is its `JobRecord`).  The module's functions read a
job's per-job tables from the calling session.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any

import psycopg
from psycopg.pq import TransactionStatus
from psycopg import sql

from madlib_mop import errors
from madlib_mop.db import packed, worker_session
from madlib_mop.engine.base import VisitRecord
from madlib_mop.json_values import finite_json
from madlib_mop.errors import MadlibMopError
from madlib_mop.job import outputs, repository, tables as job_tables
from madlib_mop.job.state_store import DurableWriter, HopFiles, StateStore, found
from madlib_mop.job.tables import identifiers
from madlib_mop.grammar import model_config

@dataclass
class ModelRecord:
    """What the coordinator keeps of one model while the job runs."""

    mst_key: int
    model_id: int
    compile_params: str
    fit_params: str
    epochs: int  # fit epochs: rounds per iteration
    per_iteration: int  # sub-epochs per iteration: segments x epochs
    iterations: int  # in all: the job's num_iterations, unless a person steering it changed them
    visits: dict = field(default_factory=dict)  # step -> visit result
    evals: dict = field(default_factory=dict)  # (step, partition) -> eval result
    published_step: int = 0  # the step whose weights <out> holds
    pruned_below: int = 1  # states of steps 1 .. pruned_below - 1 are deleted
    # The step whose state the job's store here holds for the model's next call, though its
    # visit left it on a segment server (a resumed job went back to it); None: the visit's.
    state_here: int | None = None


class JobStore(repository.JobRowUpdates):
    """Contract: opened for a job of the current role (another role's job is refused) and
    holding the job's advisory lock for as long as it is open (a second coordinator is
    refused); every write is committed when the method returns; `record_visit` writes the
    visit's record (and a durable state the coordinator was sent) in one transaction;
    nothing deletes a state that a pending validation or replay still needs (the caller
    says which: `StateStore.iteration_done`)."""

    def __init__(self, conninfo: str, schema: str, job_id: int):
        self.schema, self.schema_name = sql.Identifier(schema), schema
        self.conninfo, self.job_id = conninfo, job_id
        self.db = worker_session.connect(conninfo,
                                         application_name=f"madlib_mop coordinator job {job_id}")
        try:
            self.job = repository.read_own(self.db, schema, job_id)
            self.tables = identifiers(self.job.table_names)
            repository.lock(self.db, self.schema, job_id)
            inputs = {"source_table": self.job.source_table, "validation_table": self.job.validation_table}
            packed.hold_data(self.db, list(inputs.values()))
            if self.job.arguments.packed_rows:
                packed.check_not_grown(self.db, job_id, inputs, self.job.arguments.packed_rows)
            table = job_tables.state_table(self.db, self.tables["state"])
            hops = HopFiles.of(lambda q: self.execute(q).fetchone()[0], job_id)
            hops.remove_other_runs({oid for (oid,) in self.execute("SELECT oid FROM pg_catalog.pg_database")})
            hops.create()
            self.states = StateStore(table, hops, DurableWriter(
                lambda: worker_session.connect(
                    conninfo, application_name=f"madlib_mop coordinator job {job_id} states"),
                table.table, hops,
                lambda db, mst_key, weights: outputs.store_weights(db, self.tables, mst_key, weights)))
        except BaseException:
            self.db.close()
            raise

    def finish(self) -> None:
        self.states.writer.drain()
        self.mark_finished()
        self.states.hops.remove_job()  # every state it still needs is in its state table

    def close(self, error: BaseException | None = None) -> None:
        if hasattr(self, "states"):
            self.states.writer.close(abandon=error is not None)
            if self.states.hops.elsewhere is not None:
                self.states.hops.elsewhere.close()
        super().close(error)

    def display(self, key: str) -> str:
        """One of the job's tables as users write its name (quoted only where needed)."""
        return self.execute("SELECT quote_ident(%s) || '.' || quote_ident(%s)",
                      tuple(self.job.table_names[key])).fetchone()[0]

    # ---- reading ----
    def load_models(self) -> dict[int, ModelRecord]:
        t = self.tables
        models = {}
        for mst_key, model_id, compile_params, fit_params in self.execute(sql.SQL(
                "SELECT mst_key, model_id, compile_params, fit_params FROM {} ORDER BY mst_key")
                .format(t["models"])):
            models[mst_key] = self.model_record(mst_key, model_id, compile_params, fit_params)
        for mst_key, step, result in self.execute(sql.SQL(
                "SELECT mst_key, step, result FROM {}").format(t["visits"])):
            models[mst_key].visits[step] = result
        for mst_key, step, partition, result in self.execute(sql.SQL(
                "SELECT mst_key, step, partition, result FROM {}").format(t["evals"])):
            models[mst_key].evals[(step, partition)] = result
        if self.states.hops.elsewhere is not None:  # where states kept on segment servers are
            self.states.hops.elsewhere.models = models
        for model in models.values():
            _back_to_a_kept_state(self, model)
            _make_latest_durable(self, model)
        return models

    def model_record(self, mst_key: int, model_id: int, compile_params: str,
                     fit_params: str) -> ModelRecord:
        epochs = model_config.fit_epochs(fit_params)
        return ModelRecord(mst_key, model_id, compile_params, fit_params, epochs,
                           epochs * self.job.num_segments, self.job.arguments.num_iterations)

    def model_rows(self) -> list[dict]:
        """The models table's configurations (model_arch as JSON text), without their
        initial weights: what a segment server's workers are shipped."""
        cursor = self.execute(sql.SQL("SELECT mst_key, model_arch::text AS model_arch, "
                                "compile_params, fit_params FROM {} ORDER BY mst_key")
                        .format(self.tables["models"]))
        return [dict(zip([c.name for c in cursor.description], row)) for row in cursor]

    def state_at(self, mst_key: int, step: int) -> bytes:
        return found(self.states.read(mst_key, step), mst_key, step)

    # ---- recording ----
    @contextlib.contextmanager
    def atomic(self, pipelined: bool = False):
        """What is written inside commits together (a hop's record, its model's rows, the
        job's progress); `pipelined`: its statements go to the server without waiting for
        each one's answer (psycopg's pipeline mode).  Nested: the outer one decides."""
        if self.db.info.transaction_status != TransactionStatus.IDLE:
            yield
            return
        with self.db.pipeline() if pipelined else contextlib.nullcontext():
            with self.db.transaction():
                yield

    def record_visit(self, mst_key: int, step: int, segment: int, result: VisitRecord) -> None:
        """The visit's record: a finished sub-epoch counts from its commit on.  The state
        it left is in the job's hop files already (written by the worker, or by the
        coordinator for a segment server's worker)."""
        with self.atomic():
            self.execute(job_tables.VISITS.insert(self.tables["visits"], conflict=True),
                   (mst_key, step, segment, result.to_json()))

    def record_eval(self, mst_key: int, step: int, partition: int, result: dict) -> None:
        self.execute(job_tables.EVALS.insert(self.tables["evals"], conflict=True),
               (mst_key, step, partition, finite_json(result)))

    def update_info(self, mst_key: int, columns: dict) -> None:
        """Columns of a model's `_info` row (a pruner's labels, such as Hyperband's s and i)."""
        self.execute(sql.SQL("UPDATE {} SET ({}) = ROW({}) WHERE mst_key = %s").format(
            self.tables["info"], sql.SQL(", ").join(map(sql.Identifier, columns)),
            sql.SQL(", ").join(sql.Placeholder() * len(columns))),
            tuple(columns.values()) + (mst_key,))

    def record_stop(self, mst_key: int, iteration: int, reason: str, labels: dict) -> None:
        """A pruner stopped the model after `iteration`: its state and metrics so far stay."""
        self.update_info(mst_key, {"stopped_iteration": iteration, "stop_reason": reason,
                                   "status": "stopped", **labels})

    def model_statuses(self) -> list[tuple[int, str | None, str | None]]:
        """(mst_key, status, stop_reason) of every model in `<out>_info`.  An `_info` made
        by an earlier version gets its newer columns here."""
        self.execute(sql.SQL("ALTER TABLE {} ADD COLUMN IF NOT EXISTS status text, {}").format(
            self.tables["info"], sql.SQL(", ").join(
                sql.SQL("ADD COLUMN IF NOT EXISTS {} {}").format(sql.Identifier(n), sql.SQL(kind))
                for n, kind in outputs.NEWER_INFO_COLUMNS)))
        return self.execute(sql.SQL("SELECT mst_key, status, stop_reason FROM {} ORDER BY mst_key")
                      .format(self.tables["info"])).fetchall()

    def record_lost(self, mst_key: int, status: str | None, completed: int | None,
                    reason: str | None) -> None:
        """A model stopped for a cause of its own (status 'diverged' or 'failed', after
        `completed` iterations), in `<out>_info` and the job's row; status None: it trains
        again (a failed model, when the job is resumed)."""
        with self.atomic():
            self.update_info(mst_key, {"status": status or "training",
                                       "stopped_iteration": completed, "stop_reason": reason})
            self.note_model_failure(mst_key, status is not None, reason)

    def architecture(self, model_id: int, table: list[str] | None = None) -> tuple[str, bytes | None]:
        """An architecture of the job's model_arch_table (madlib_keras_automl's, or `table`:
        the [schema, table] a steering request recorded): its JSON and initial weights."""
        arch_table = sql.Identifier(*(table or self.job.arguments.automl["model_arch_table"]))
        row = self.execute(sql.SQL("SELECT model_arch::text, model_weights FROM {} WHERE model_id = %s")
                     .format(arch_table), (model_id,)).fetchone()
        if row is None:
            raise MadlibMopError(f"model_id {model_id} is not in {arch_table.as_string(self.db)}",
                                 sqlstate=errors.INVALID_PARAMETER_VALUE,
                                 hint="Load the architecture with load_keras_model(), then resume.")
        return row[0], None if row[1] is None else bytes(row[1])

    def add_model(self, entry: dict, blob: bytes) -> None:
        """A model a searcher proposed (or a person added) joins the job (`entry`: mst_key,
        model_id, model_arch, compile_params, fit_params, weights; `blob`: its initial
        state): its rows in the job's tables, the output tables and automl's model selection
        table (a fit's is the user's input: left as it is), in one transaction."""
        from madlib_mop.job import outputs

        automl = self.job.arguments.automl
        config = (entry["mst_key"], entry["model_id"], entry["compile_params"], entry["fit_params"])
        with self.atomic():
            job_tables.add_model(self.db, self.tables, entry, blob)
            outputs.add_model(self.db, self.tables, entry, blob)
            if automl:
                self.execute(sql.SQL("INSERT INTO {} (mst_key, model_id, compile_params, fit_params) "
                               "VALUES (%s, %s, %s, %s)").format(
                    sql.Identifier(*automl["model_selection_table"])), config)

    def model_architecture(self, mst_key: int) -> str:
        """A model's architecture (JSON text) as the job recorded it."""
        return self.execute(sql.SQL("SELECT model_arch::text FROM {} WHERE mst_key = %s").format(
            self.tables["models"]), (mst_key,)).fetchone()[0]

def job_models(plpy: Any, models_table: str, mst_key: int | None = None) -> list[dict]:
    """A job's models table's rows (`models_table` quoted), or the one of `mst_key`."""
    return [dict(r) for r in plpy.execute(plpy.prepare(
        f"SELECT * FROM {models_table} WHERE $1::integer IS NULL OR mst_key = $1 ORDER BY mst_key",
        ["integer"]), [mst_key])]


def _back_to_a_kept_state(store: JobStore, model: ModelRecord) -> None:
    """A model whose latest state is lost (it was between hops when the server restarted:
    `job.state_store`) goes back to its last durable one: the visits and validation passes
    after it are forgotten, and trained again to the same bits."""
    step = len(model.visits)
    elsewhere = store.states.hops.elsewhere
    if elsewhere is not None and elsewhere.holds(model.mst_key, step):
        return
    if store.states.available(model.mst_key, step):
        model.state_here = step
        return
    kept = store.states.table.last_step(model.mst_key, step)
    if kept is None:
        raise MadlibMopError(f"job {store.job_id}: no state of model {model.mst_key}",
                             sqlstate=errors.DATA_EXCEPTION,
                             hint="The job's state table was changed; start the job again.")
    with store.atomic():
        store.execute(sql.SQL("DELETE FROM {} WHERE mst_key = %s AND step >= %s").format(
            store.tables["visits"]), (model.mst_key, kept))
        store.execute(sql.SQL("DELETE FROM {} WHERE mst_key = %s AND step > %s").format(
            store.tables["evals"]), (model.mst_key, kept))
    model.visits = {k: v for k, v in model.visits.items() if k < kept}
    model.evals = {k: v for k, v in model.evals.items() if k[0] <= kept}
    model.state_here = kept


def _make_latest_durable(store: JobStore, model: ModelRecord) -> None:
    """A model's latest iteration end whose copy into the state table was not made (the
    coordinator stopped first) is queued again."""
    end = len(model.visits) // model.per_iteration * model.per_iteration
    elsewhere = store.states.hops.elsewhere
    if end and (store.states.hops.holds(model.mst_key, end) or (
            elsewhere is not None and elsewhere.holds(model.mst_key, end))) and \
            store.states.table.last_step(model.mst_key, end) != end:
        store.states.writer.submit(model.mst_key, end)


def last_states(db: psycopg.Connection, state_table: sql.Identifier) -> dict[int, bytes]:
    """Every model's latest durable state in a job's state table (none if the table is
    gone)."""
    if not db.execute("SELECT to_regclass(%s)", (state_table.as_string(db),)).fetchone()[0]:
        return {}
    table = job_tables.state_table(db, state_table)
    latest = db.execute(sql.SQL("SELECT mst_key, max(step) FROM {} GROUP BY mst_key ORDER BY mst_key")
                        .format(state_table)).fetchall()
    return {mst_key: table.read(mst_key, step) for mst_key, step in latest}


def compile_params_of(db: psycopg.Connection, models_table: sql.Identifier) -> dict[int, str]:
    """Each model's compile_params in a job's models table (none if the table is gone)."""
    if not db.execute("SELECT to_regclass(%s)", (models_table.as_string(db),)).fetchone()[0]:
        return {}
    return dict(db.execute(sql.SQL("SELECT mst_key, compile_params FROM {}").format(models_table)).fetchall())
