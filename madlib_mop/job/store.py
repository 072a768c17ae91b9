"""A job's store: its catalog row and per-job tables, on the coordinator's server.

All of a running job's SQL goes through `JobStore`, over the coordinator's own session
(autocommit: what it writes is committed at once, so other sessions see progress and a
failure loses nothing recorded).  A sub-epoch counts once `record_visit` has committed the
new state with the visit's record.

Per-job tables, next to the output table:
    <out>_mop_models   the configurations as the job started (mst_key, architecture, params)
    <out>_mop_state    model states (mst_key, step, state): step = sub-epochs completed
    <out>_mop_visits   every finished sub-epoch: segment, rows, loss/metrics, timings
    <out>_mop_evals    every finished validation pass over one validation partition

The `jobs` row names its tables as [schema, table] pairs (never SQL text); `names()` turns
them into `psycopg.sql.Identifier`s.
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass, field
import psycopg
from psycopg.pq import TransactionStatus
from psycopg import sql

from madlib_mop import errors
from madlib_mop.db import worker_session
from madlib_mop.errors import MadlibMopError
from madlib_mop.runtime import model_config

JOB_TABLES = ("models", "state", "visits", "evals")
# Every table of a job, by key: the suffix its name adds to the output table's.
TABLE_SUFFIXES = {"output": "", "summary": "_summary", "info": "_info",
                  **{t: f"_mop_{t}" for t in JOB_TABLES}}


def identifiers(tables: dict) -> dict[str, sql.Identifier]:
    """The jobs row's {key: [schema, table]} as identifiers."""
    return {key: sql.Identifier(*parts) for key, parts in tables.items()}


@dataclass
class ModelRecord:
    """What the coordinator keeps of one model while the job runs."""

    mst_key: int
    model_id: int
    compile_params: str
    fit_params: str
    epochs: int  # fit epochs: rounds per iteration
    visits: dict = field(default_factory=dict)  # step -> visit result
    evals: dict = field(default_factory=dict)  # (step, partition) -> eval result
    state: bytes | None = None  # the latest state (after len(visits) sub-epochs)
    published_step: int = 0  # the step whose weights <out> holds
    pruned_below: int = 1  # states of steps 1 .. pruned_below - 1 are deleted


class JobStore:
    """Contract: opened for a job of the current role (another role's job is refused) and
    holding the job's advisory lock for as long as it is open (a second coordinator is
    refused); every write is committed when the method returns; `record_visit` writes the
    new state and the visit's record in one transaction; nothing deletes a state that a
    pending validation or replay still needs (the caller says which: `prune_states`)."""

    def __init__(self, conninfo: str, schema: str, job_id: int):
        self.schema = sql.Identifier(schema)
        self.job_id = job_id
        self.db = worker_session.connect(conninfo,
                                         application_name=f"madlib_mop coordinator job {job_id}")
        try:
            self.job = self._job_row()
            self.tables = identifiers(self.job["tables"])
            self._lock()
        except BaseException:
            self.db.close()
            raise

    def q(self, statement: sql.Composable | str, params: tuple = ()) -> psycopg.Cursor:
        return self.db.execute(statement, params)

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
            epochs = model_config.parse_fit_params(fit_params).get("epochs", 1)
            models[mst_key] = ModelRecord(mst_key, model_id, compile_params, fit_params, epochs)
        for mst_key, step, result in self.q(sql.SQL(
                "SELECT mst_key, step, result FROM {}").format(t["visits"])):
            models[mst_key].visits[step] = result
        for mst_key, step, partition, result in self.q(sql.SQL(
                "SELECT mst_key, step, partition, result FROM {}").format(t["evals"])):
            models[mst_key].evals[(step, partition)] = result
        for model in models.values():
            model.state = self.state_at(model.mst_key, len(model.visits))
        return models

    def state_at(self, mst_key: int, step: int) -> bytes:
        row = self.q(sql.SQL("SELECT state FROM {} WHERE mst_key = %s AND step = %s").format(
            self.tables["state"]), (mst_key, step)).fetchone()
        if row is None:
            raise MadlibMopError(f"job {self.job_id}: no state of model {mst_key} at step {step}",
                                 sqlstate=errors.DATA_EXCEPTION,
                                 hint="The job's state table was changed; start the job again.")
        return bytes(row[0])

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

    def record_visit(self, mst_key: int, step: int, segment: int, new_state: bytes,
                     result: dict) -> None:
        """The new state and the visit's record, in one transaction: a finished sub-epoch
        is either wholly recorded or not at all."""
        with self.atomic():
            self.q(sql.SQL("INSERT INTO {} (mst_key, step, state) VALUES (%s, %s, %s) "
                           "ON CONFLICT (mst_key, step) DO NOTHING").format(self.tables["state"]),
                   (mst_key, step + 1, new_state))
            self.q(sql.SQL("INSERT INTO {} (mst_key, step, segment, result) VALUES (%s, %s, %s, %s) "
                           "ON CONFLICT (mst_key, step) DO NOTHING").format(self.tables["visits"]),
                   (mst_key, step, segment, json.dumps(result)))

    def record_eval(self, mst_key: int, step: int, partition: int, result: dict) -> None:
        self.q(sql.SQL("INSERT INTO {} (mst_key, step, partition, result) VALUES (%s, %s, %s, %s) "
                       "ON CONFLICT (mst_key, step, partition) DO NOTHING").format(self.tables["evals"]),
               (mst_key, step, partition, json.dumps(result)))

    def prune_states(self, mst_key: int, keep_from: int) -> None:
        """Delete the states between the initial one (kept for replay) and `keep_from`."""
        self.q(sql.SQL("DELETE FROM {} WHERE mst_key = %s AND step > 0 AND step < %s").format(
            self.tables["state"]), (mst_key, keep_from))

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

    def progress(self, subepochs_done: int, subepochs_total: int, counts: dict[str, int]) -> None:
        """Sub-epochs done and planned (pruners and searchers change the plan), and the
        models training, waiting, stopped and finished."""
        self._update_job("subepochs_done = %s, subepochs_total = %s, num_models = %s, "
                         "models_training = %s, models_waiting = %s, models_stopped = %s, "
                         "models_finished = %s",
                         (subepochs_done, subepochs_total, sum(counts.values()),
                          counts["models_training"], counts["models_waiting"],
                          counts["models_stopped"], counts["models_finished"]))

    def update_info(self, mst_key: int, columns: dict) -> None:
        """Columns of a model's `_info` row (a pruner's labels, such as Hyperband's s and i)."""
        self.q(sql.SQL("UPDATE {} SET ({}) = ROW({}) WHERE mst_key = %s").format(
            self.tables["info"], sql.SQL(", ").join(map(sql.Identifier, columns)),
            sql.SQL(", ").join(sql.Placeholder() * len(columns))),
            tuple(columns.values()) + (mst_key,))

    def record_stop(self, mst_key: int, iteration: int, reason: str, labels: dict) -> None:
        """A pruner stopped the model after `iteration`: its state and metrics so far stay."""
        self.update_info(mst_key, {"stopped_iteration": iteration, "stop_reason": reason, **labels})

    def architecture(self, model_id: int) -> tuple[str, bytes | None]:
        """An architecture of the job's model_arch_table (madlib_keras_automl's): its JSON
        and initial weights."""
        arch_table = sql.Identifier(*self.job["arguments"]["automl"]["model_arch_table"])
        row = self.q(sql.SQL("SELECT model_arch::text, model_weights FROM {} WHERE model_id = %s")
                     .format(arch_table), (model_id,)).fetchone()
        if row is None:
            raise MadlibMopError(f"model_id {model_id} is not in {arch_table.as_string(self.db)}",
                                 sqlstate=errors.INVALID_PARAMETER_VALUE,
                                 hint="Load the architecture with load_keras_model(), then resume.")
        return row[0], None if row[1] is None else bytes(row[1])

    def add_model(self, entry: dict, blob: bytes) -> None:
        """A model a searcher proposed joins the job (`entry`: mst_key, model_id,
        model_arch, compile_params, fit_params, weights; `blob`: its initial state): its rows
        in the job's tables, the output tables and the model selection table, in one
        transaction."""
        from madlib_mop.job import outputs

        mst = sql.Identifier(*self.job["arguments"]["automl"]["model_selection_table"])
        config = (entry["mst_key"], entry["model_id"], entry["compile_params"], entry["fit_params"])
        with self.atomic():
            self.q(sql.SQL("INSERT INTO {} VALUES (%s, %s, %s, %s, %s, %s)").format(self.tables["models"]),
                   (entry["mst_key"], entry["model_id"], entry["model_arch"], entry["compile_params"],
                    entry["fit_params"], entry["weights"]))
            self.q(sql.SQL("INSERT INTO {} VALUES (%s, %s, %s)").format(self.tables["state"]),
                   (entry["mst_key"], 0, blob))
            outputs.add_model(self.db, self.tables, entry, blob)
            self.q(sql.SQL("INSERT INTO {} (mst_key, model_id, compile_params, fit_params) "
                           "VALUES (%s, %s, %s, %s)").format(mst), config)

    def note_error(self, text: str) -> None:
        self._update_job("last_error = %s", (text,))

    def finish(self) -> None:
        self._update_job("state = 'finished', finished_at = now(), last_error = NULL")

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
