"""A job's store: its catalog row and per-job tables, on the coordinator's server.

All of a running job's SQL goes through `JobStore`, over the coordinator's own session
(autocommit: what it writes is committed at once, so other sessions see progress and a
failure loses nothing recorded).  A sub-epoch counts once `record_visit` has committed the
visit's record; its new state is then in the job's store (`job.state_store`: between hops
in a file of the server, at each iteration's end also in the state table).

The job's tables are declared in `job.tables`.  The module's functions are the calling
session's SQL on `jobs` (through PL/Python: finding, creating and abandoning jobs); the
running job's goes through `JobStore`.
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass, field
from typing import Any

import psycopg
from psycopg.pq import TransactionStatus
from psycopg import sql

from madlib_mop import errors
from madlib_mop.db import catalog, worker_session
from madlib_mop.engine.base import VisitRecord
from madlib_mop.json_values import finite_json
from madlib_mop.errors import MadlibMopError
from madlib_mop.job import outputs, tables as job_tables
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


class JobRowUpdates:
    """The job's `jobs` row as its coordinator changes it (a part of `JobStore`): state,
    progress, workers and queue position, errors."""

    schema: sql.Identifier
    job_id: int
    db: psycopg.Connection

    def q(self, statement: sql.Composable | str, params: tuple = ()) -> psycopg.Cursor:
        return self.db.execute(statement, params)

    def _update_job(self, assignments: str, params: tuple = ()) -> psycopg.Cursor:
        return self.q(sql.SQL("UPDATE {}.jobs SET " + assignments + ", updated_at = now() "
                              "WHERE job_id = %s").format(self.schema), params + (self.job_id,))

    def mark_running(self, pid: int) -> float:
        """State 'running'; returns when the job first started (epoch seconds)."""
        cursor = self.q(sql.SQL(
            "UPDATE {}.jobs SET state = 'running', coordinator_pid = %s, "
            "started_at = coalesce(started_at, now()), last_error = NULL, updated_at = now() "
            "WHERE job_id = %s RETURNING extract(epoch FROM started_at)::float8").format(self.schema),
            (pid, self.job_id))
        return cursor.fetchone()[0]

    def queued(self, position: int) -> None:
        """Waiting for a worker session: its place in the server's queue (1 is next)."""
        self._update_job("state = 'queued', queue_position = %s", (position,))

    def running_on(self, workers: int) -> None:
        self._update_job("state = 'running', queue_position = NULL, workers = %s", (workers,))

    def progress(self, subepochs_done: int, subepochs_total: int, counts: dict[str, int]) -> None:
        """Sub-epochs done and planned (pruners and searchers change the plan), and the
        models training, waiting, stopped (by a pruner), finished and failed (diverged, or
        failed on every retry)."""
        self._update_job("subepochs_done = %s, subepochs_total = %s, num_models = %s, "
                         "models_training = %s, models_waiting = %s, models_stopped = %s, "
                         "models_finished = %s, models_failed = %s",
                         (subepochs_done, subepochs_total, sum(counts.values()),
                          counts["models_training"], counts["models_waiting"],
                          counts["models_stopped"], counts["models_finished"],
                          counts["models_failed"]))

    def note_error(self, text: str) -> None:
        self._update_job("last_error = %s", (text,))

    def finish(self) -> None:
        self.states.writer.drain()
        self._update_job("state = 'finished', finished_at = now(), last_error = NULL")
        self.states.hops.remove_job()  # every state it still needs is in its state table

    def close(self, error: BaseException | None = None) -> None:
        if error is not None and not self.db.closed:
            try:
                self.q(sql.SQL("UPDATE {}.jobs SET state = %s, last_error = coalesce(%s, last_error), "
                               "updated_at = now() WHERE job_id = %s AND state <> 'finished'")
                       .format(self.schema),
                       ("failed" if isinstance(error, MadlibMopError) else "interrupted",
                        str(error)[:2000], self.job_id))
            except psycopg.Error:
                pass
        self.db.close()


class JobStore(JobRowUpdates):
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
            self.job = self._job_row()
            self.tables = identifiers(self.job["tables"])
            self._lock()
            table = job_tables.state_table(self.db, self.tables["state"])
            hops = HopFiles.of(lambda q: self.q(q).fetchone()[0], job_id)
            hops.remove_other_runs({oid for (oid,) in self.q("SELECT oid FROM pg_catalog.pg_database")})
            hops.create()
            self.states = StateStore(table, hops, DurableWriter(
                lambda: worker_session.connect(
                    conninfo, application_name=f"madlib_mop coordinator job {job_id} states"),
                table.table, hops,
                lambda db, mst_key, weights: outputs.store_weights(db, self.tables, mst_key, weights)))
        except BaseException:
            self.db.close()
            raise

    def close(self, error: BaseException | None = None) -> None:
        if hasattr(self, "states"):
            self.states.writer.close(abandon=error is not None)
        super().close(error)

    def _job_row(self) -> dict:
        cursor = self.q(sql.SQL("SELECT * FROM {}.jobs WHERE job_id = %s AND owner = current_user")
                        .format(self.schema), (self.job_id,))
        row = cursor.fetchone()
        if row is None:
            raise MadlibMopError(f"job {self.job_id} does not exist (or is another role's)",
                                 sqlstate=errors.INVALID_PARAMETER_VALUE,
                                 hint="SELECT * FROM madlib_mop.job_progress; lists your jobs.")
        return dict(zip([c.name for c in cursor.description], row))

    def _lock(self) -> None:
        # lock_key: a random number only the owner can read, so no other role can take the
        # lock first and block the job.
        locked = self.q(sql.SQL("SELECT pg_try_advisory_lock(lock_key) FROM {}.jobs "
                                "WHERE job_id = %s").format(self.schema), (self.job_id,)).fetchone()[0]
        if not locked:
            raise MadlibMopError(f"job {self.job_id} is running in another session",
                                 sqlstate=errors.INVALID_PARAMETER_VALUE,
                                 hint="Watch it in madlib_mop.job_progress; it is resumable "
                                      "if that session ends.")

    def display(self, key: str) -> str:
        """One of the job's tables as users write its name (quoted only where needed)."""
        return self.q("SELECT quote_ident(%s) || '.' || quote_ident(%s)",
                      tuple(self.job["tables"][key])).fetchone()[0]

    # ---- reading ----
    def load_models(self) -> dict[int, ModelRecord]:
        t = self.tables
        models = {}
        for mst_key, model_id, compile_params, fit_params in self.q(sql.SQL(
                "SELECT mst_key, model_id, compile_params, fit_params FROM {} ORDER BY mst_key")
                .format(t["models"])):
            models[mst_key] = self.model_record(mst_key, model_id, compile_params, fit_params)
        for mst_key, step, result in self.q(sql.SQL(
                "SELECT mst_key, step, result FROM {}").format(t["visits"])):
            models[mst_key].visits[step] = result
        for mst_key, step, partition, result in self.q(sql.SQL(
                "SELECT mst_key, step, partition, result FROM {}").format(t["evals"])):
            models[mst_key].evals[(step, partition)] = result
        for model in models.values():
            _back_to_a_kept_state(self, model)
            _make_latest_durable(self, model)
        return models

    def model_record(self, mst_key: int, model_id: int, compile_params: str,
                     fit_params: str) -> ModelRecord:
        epochs = model_config.fit_epochs(fit_params)
        return ModelRecord(mst_key, model_id, compile_params, fit_params, epochs,
                           epochs * self.job["num_segments"], self.job["arguments"]["num_iterations"])

    def model_rows(self) -> list[dict]:
        """The models table's configurations (model_arch as JSON text), without their
        initial weights: what a segment server's workers are shipped."""
        cursor = self.q(sql.SQL("SELECT mst_key, model_arch::text AS model_arch, "
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
            self.q(job_tables.VISITS.insert(self.tables["visits"], conflict=True),
                   (mst_key, step, segment, result.to_json()))

    def record_eval(self, mst_key: int, step: int, partition: int, result: dict) -> None:
        self.q(job_tables.EVALS.insert(self.tables["evals"], conflict=True),
               (mst_key, step, partition, finite_json(result)))

    def update_info(self, mst_key: int, columns: dict) -> None:
        """Columns of a model's `_info` row (a pruner's labels, such as Hyperband's s and i)."""
        self.q(sql.SQL("UPDATE {} SET ({}) = ROW({}) WHERE mst_key = %s").format(
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
        self.q(sql.SQL("ALTER TABLE {} ADD COLUMN IF NOT EXISTS status text, {}").format(
            self.tables["info"], sql.SQL(", ").join(
                sql.SQL("ADD COLUMN IF NOT EXISTS {} {}").format(sql.Identifier(n), sql.SQL(kind))
                for n, kind in outputs.NEWER_INFO_COLUMNS)))
        return self.q(sql.SQL("SELECT mst_key, status, stop_reason FROM {} ORDER BY mst_key")
                      .format(self.tables["info"])).fetchall()

    def record_lost(self, mst_key: int, status: str | None, completed: int | None,
                    reason: str | None) -> None:
        """A model stopped for a cause of its own (status 'diverged' or 'failed', after
        `completed` iterations), in `<out>_info` and the job's row; status None: it trains
        again (a failed model, when the job is resumed)."""
        with self.atomic():
            self.update_info(mst_key, {"status": status or "training",
                                       "stopped_iteration": completed, "stop_reason": reason})
            failures = (sql.SQL("coalesce(model_failures, '{}') || jsonb_build_object(%s::text, %s::text)")
                        if status else sql.SQL("model_failures - %s::text"))
            params = (mst_key, reason) if status else (mst_key,)
            self.q(sql.SQL("UPDATE {}.jobs SET model_failures = {} WHERE job_id = %s").format(
                self.schema, failures), params + (self.job_id,))

    def architecture(self, model_id: int, table: list[str] | None = None) -> tuple[str, bytes | None]:
        """An architecture of the job's model_arch_table (madlib_keras_automl's, or `table`:
        the [schema, table] a steering request recorded): its JSON and initial weights."""
        arch_table = sql.Identifier(*(table or self.job["arguments"]["automl"]["model_arch_table"]))
        row = self.q(sql.SQL("SELECT model_arch::text, model_weights FROM {} WHERE model_id = %s")
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

        automl = self.job["arguments"].get("automl")
        config = (entry["mst_key"], entry["model_id"], entry["compile_params"], entry["fit_params"])
        with self.atomic():
            job_tables.add_model(self.db, self.tables, entry, blob)
            outputs.add_model(self.db, self.tables, entry, blob)
            if automl:
                self.q(sql.SQL("INSERT INTO {} (mst_key, model_id, compile_params, fit_params) "
                               "VALUES (%s, %s, %s, %s)").format(
                    sql.Identifier(*automl["model_selection_table"])), config)

    def model_architecture(self, mst_key: int) -> str:
        """A model's architecture (JSON text) as the job recorded it."""
        return self.q(sql.SQL("SELECT model_arch::text FROM {} WHERE mst_key = %s").format(
            self.tables["models"]), (mst_key,)).fetchone()[0]

# ---- the calling session's SQL on `jobs` (PL/Python) ------------------------------------------

def own_job(plpy: Any, job_id: int) -> dict:
    """The `jobs` row of one of the current role's jobs (`tables` and `arguments` as JSON
    text, as PL/Python reads them)."""
    schema = catalog.extension_schema(plpy)
    rows = plpy.execute(plpy.prepare(f"SELECT * FROM {schema}.jobs WHERE job_id = $1 "
                                     "AND owner = current_user", ["bigint"]), [job_id])
    if not rows:
        raise MadlibMopError(f"job {job_id} does not exist (or is another role's)",
                             sqlstate=errors.INVALID_PARAMETER_VALUE,
                             hint=f"SELECT * FROM {schema}.job_progress; lists your jobs. A job "
                                  "runs as its owner: SET ROLE to it to resume another's.")
    return dict(rows[0])


def job_models(plpy: Any, models_table: str, mst_key: int | None = None) -> list[dict]:
    """A job's models table's rows (`models_table` quoted), or the one of `mst_key`."""
    return [dict(r) for r in plpy.execute(plpy.prepare(
        f"SELECT * FROM {models_table} WHERE $1::integer IS NULL OR mst_key = $1 ORDER BY mst_key",
        ["integer"]), [mst_key])]


def latest_job(plpy: Any, output: str, states: tuple[str, ...] | None = None,
               unfinished: bool = False) -> dict | None:
    """The current role's latest job of the output table `output` (quoted, as jobs record
    it): in one of `states`, or unfinished.  owner: row-level security does not bind a
    superuser, who must not continue a job another role recorded (its stored table names
    would run with the superuser's rights)."""
    which = "state <> 'finished'" if unfinished else "state = ANY($2)"
    rows = plpy.execute(plpy.prepare(
        f"SELECT * FROM {catalog.extension_schema(plpy)}.jobs WHERE model_output_table = $1 "
        f"AND owner = current_user AND {which} ORDER BY job_id DESC LIMIT 1", ["text", "text[]"]),
        [output, list(states or ())])
    return dict(rows[0]) if rows else None


def find_job(plpy: Any, output: str, unfinished: bool) -> dict | None:
    """The current role's latest unfinished, or finished, job of the output table."""
    return latest_job(plpy, output, ("finished",), unfinished=unfinished)


def tables_exist(plpy: Any, job: dict) -> bool:
    """Whether the tables a job cannot go on without exist."""
    tables = json.loads(job["tables"])
    present = set(existing_tables(plpy, job))
    return all(catalog.qualified_name(plpy, tables[t]) in present
               for t in ("output", "info", "state", "visits"))


def unfinished_of_family(plpy: Any, family: str) -> list[dict]:
    """The current role's unfinished jobs of one output family (if_output_exists =>
    'new_version'), latest first."""
    return [dict(r) for r in plpy.execute(plpy.prepare(
        f"SELECT job_id, arguments, tables FROM {catalog.extension_schema(plpy)}.jobs "
        "WHERE owner = current_user AND state <> 'finished' "
        "AND arguments->>'output_family' = $1 ORDER BY job_id DESC", ["text"]), [family])]


def output_recorded(plpy: Any, output: str) -> bool:
    """Whether a job of the current role records `output` as its output table."""
    return bool(plpy.execute(plpy.prepare(
        f"SELECT 1 FROM {catalog.extension_schema(plpy)}.jobs WHERE owner = current_user "
        "AND model_output_table = $1", ["text"]), [output]))


def is_running(plpy: Any, job_id: int) -> bool:
    """job_progress's state: its coordinator's session is alive."""
    return plpy.execute(plpy.prepare(
        f"SELECT state FROM {catalog.extension_schema(plpy)}.job_progress WHERE job_id = $1",
        ["bigint"]), [job_id])[0]["state"] == "running"


def existing_tables(plpy: Any, job: dict) -> list[str]:
    """The job's tables that exist, quoted."""
    return plpy.execute(plpy.prepare(
        "SELECT coalesce(array_agg(format('%I.%I', v->>0, v->>1)), '{}') AS names "
        "FROM jsonb_each($1::jsonb) AS t(k, v) "
        "WHERE to_regclass(format('%I.%I', v->>0, v->>1)) IS NOT NULL", ["text"]),
        [job["tables"]])[0]["names"]


def _back_to_a_kept_state(store: JobStore, model: ModelRecord) -> None:
    """A model whose latest state is lost (it was between hops when the server restarted:
    `job.state_store`) goes back to its last durable one: the visits and validation passes
    after it are forgotten, and trained again to the same bits."""
    step = len(model.visits)
    if store.states.available(model.mst_key, step):
        return
    kept = store.states.table.last_step(model.mst_key, step)
    if kept is None:
        raise MadlibMopError(f"job {store.job_id}: no state of model {model.mst_key}",
                             sqlstate=errors.DATA_EXCEPTION,
                             hint="The job's state table was changed; start the job again.")
    with store.atomic():
        store.q(sql.SQL("DELETE FROM {} WHERE mst_key = %s AND step >= %s").format(
            store.tables["visits"]), (model.mst_key, kept))
        store.q(sql.SQL("DELETE FROM {} WHERE mst_key = %s AND step > %s").format(
            store.tables["evals"]), (model.mst_key, kept))
    model.visits = {k: v for k, v in model.visits.items() if k < kept}
    model.evals = {k: v for k, v in model.evals.items() if k[0] <= kept}


def _make_latest_durable(store: JobStore, model: ModelRecord) -> None:
    """A model's latest iteration end whose copy into the state table was not made (the
    coordinator stopped first) is queued again."""
    end = len(model.visits) // model.per_iteration * model.per_iteration
    if end and store.states.hops.holds(model.mst_key, end) and \
            store.states.table.last_step(model.mst_key, end) != end:
        store.states.writer.submit(model.mst_key, end)


def abandon(plpy: Any, job_id: int, why: str) -> None:
    """An unfinished job whose tables are gone cannot continue: record why, through a
    session of its own so that it stays recorded whatever the calling one does next."""
    schema = sql.Identifier(catalog.extension_schema_name(plpy))
    with worker_session.connect(worker_session.conninfo(plpy)) as db:
        db.execute(sql.SQL("UPDATE {}.jobs SET state = 'failed', last_error = %s, updated_at = now() "
                           "WHERE job_id = %s").format(schema), (f"abandoned: {why}", job_id))
        HopFiles.of(lambda q: db.execute(q).fetchone()[0], job_id).remove_job()


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


def insert_job(db: psycopg.Connection, schema: str, values: dict) -> int:
    """A new `jobs` row (in the creating transaction of `db`); its job_id."""
    return db.execute(sql.SQL("INSERT INTO {}.jobs ({}) VALUES ({}) RETURNING job_id").format(
        sql.Identifier(schema), sql.SQL(", ").join(map(sql.Identifier, values)),
        sql.SQL(", ").join(sql.Placeholder() * len(values))), tuple(values.values())).fetchone()[0]
