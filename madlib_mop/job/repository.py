"""`jobs`, the catalog of model selection jobs: the one module that reads and writes it.

Reads give `JobRecord`s (`job.record`).  A job that is run, resumed, steered, replayed or
replaced is one of the current role's own (`owner = current_user`): row-level security
does not bind a superuser, who must not act on a job another role recorded, since the
table names a job row stores are put into SQL and would run with the superuser's rights.
Analyses read any job row-level security shows them (`job_writing`, `job_results_of`):
they read a job's arguments, and its `_info` only where the caller may.

Two kinds of callers: the calling session, through PL/Python (finding, creating and
abandoning jobs), and a running job's coordinator, over its own autocommitted session
(`JobRowUpdates`, a part of `job.store.JobStore`).
"""

from __future__ import annotations

import json
from typing import Any

import psycopg
from psycopg import sql
from psycopg.rows import dict_row, tuple_row

from madlib_mop import errors
from madlib_mop.db import catalog, worker_session
from madlib_mop.errors import MadlibMopError
from madlib_mop.job.record import JobRecord, JobState
from madlib_mop.job.state_store import HopFiles

_OWN = "owner = current_user"


def _not_found(job_id: int, schema: str) -> MadlibMopError:
    return MadlibMopError(f"job {job_id} does not exist (or is another role's)",
                          sqlstate=errors.INVALID_PARAMETER_VALUE,
                          hint=f"SELECT * FROM {schema}.job_progress; lists your jobs. A job "
                               "runs as its owner: SET ROLE to it to resume another's.")


# ---- the calling session's reads and writes (PL/Python) ---------------------------------------

# A backend's prepared reads of `jobs`, by their text (which names the extension's schema):
# every hop of a job looks its job up again (`segment.worker.context`), and preparing the
# read took longer than running it.  The server plans a statement again when `jobs` changes.
_plans: dict[str, Any] = {}


def _select(plpy: Any, where: str, types: list[str], values: list, *, last: bool = False,
            any_owner: bool = False) -> list[JobRecord]:
    text = (f"SELECT * FROM {catalog.extension_schema(plpy)}.jobs WHERE {'TRUE' if any_owner else _OWN} "
            f"AND {where} ORDER BY job_id DESC{' LIMIT 1' if last else ''}")
    if text not in _plans:
        _plans[text] = plpy.prepare(text, types)
    return [JobRecord.of(row) for row in plpy.execute(_plans[text], values)]


def own_job(plpy: Any, job_id: int) -> JobRecord:
    """One of the current role's jobs (refused with a HINT when it has none of that id)."""
    found = _select(plpy, "job_id = $1", ["bigint"], [job_id])
    if not found:
        raise _not_found(job_id, catalog.extension_schema(plpy))
    return found[0]


def latest_job(plpy: Any, output: str, states: tuple[JobState, ...] | None = None,
               unfinished: bool = False) -> JobRecord | None:
    """The current role's latest job of the output table `output` (quoted, as jobs record
    it): in one of `states`, or unfinished."""
    which = f"state <> '{JobState.FINISHED}'" if unfinished else "state = ANY($2)"
    found = _select(plpy, f"model_output_table = $1 AND {which}", ["text", "text[]"],
                    [output, [str(s) for s in states or ()]], last=True)
    return found[0] if found else None


def latest_own_job(plpy: Any) -> JobRecord | None:
    """The current role's most recent job in this database, whatever its state."""
    found = _select(plpy, "TRUE", [], [], last=True)
    return found[0] if found else None


def find_job(plpy: Any, output: str, unfinished: bool) -> JobRecord | None:
    """The current role's latest unfinished, or finished, job of the output table."""
    return latest_job(plpy, output, (JobState.FINISHED,), unfinished=unfinished)


def job_writing(plpy: Any, parts: list[str]) -> JobRecord | None:
    """The latest job (that row-level security shows the caller) whose output is the table
    (schema, name) `parts`."""
    found = _select(plpy, "tables->'output' = to_jsonb($1::text[])", ["text[]"], [parts], last=True,
                    any_owner=True)
    return found[0] if found else None


def unfinished_of_family(plpy: Any, family: str) -> list[JobRecord]:
    """The current role's unfinished jobs of one output family (if_output_exists =>
    'new_version'), latest first."""
    return _select(plpy, f"state <> '{JobState.FINISHED}' AND arguments->>'output_family' = $1",
                   ["text"], [family])


def output_recorded(plpy: Any, output: str) -> bool:
    """Whether a job of the current role records `output` as its output table."""
    return bool(plpy.execute(plpy.prepare(
        f"SELECT 1 FROM {catalog.extension_schema(plpy)}.jobs WHERE {_OWN} AND model_output_table = $1",
        ["text"]), [output]))


def job_results_of(plpy: Any, job_id: int) -> JobRecord | None:
    """A job as a view of every job reads it (row-level security: a role's own; a
    superuser's: any, whose `_info` it then reads only where it has the right)."""
    found = _select(plpy, "job_id = $1", ["bigint"], [job_id], any_owner=True)
    return found[0] if found else None


def is_running(plpy: Any, job_id: int) -> bool:
    """job_progress's state: its coordinator's session is alive."""
    return plpy.execute(plpy.prepare(
        f"SELECT state FROM {catalog.extension_schema(plpy)}.job_progress WHERE job_id = $1",
        ["bigint"]), [job_id])[0]["state"] == JobState.RUNNING


def existing_tables(plpy: Any, job: JobRecord) -> list[str]:
    """The job's tables that exist, quoted."""
    return plpy.execute(plpy.prepare(
        "SELECT coalesce(array_agg(format('%I.%I', v->>0, v->>1)), '{}') AS names "
        "FROM jsonb_each($1::jsonb) AS t(k, v) "
        "WHERE to_regclass(format('%I.%I', v->>0, v->>1)) IS NOT NULL", ["text"]),
        [json.dumps(job.table_names)])[0]["names"]


def tables_exist(plpy: Any, job: JobRecord) -> bool:
    """Whether the tables a job cannot go on without exist."""
    present = set(existing_tables(plpy, job))
    return all(catalog.qualified_name(plpy, list(job.table_names[t])) in present
               for t in ("output", "info", "state", "visits"))


def abandon(plpy: Any, job_id: int, why: str) -> None:
    """An unfinished job whose tables are gone cannot continue: record why, through a
    session of its own so that it stays recorded whatever the calling one does next."""
    schema = sql.Identifier(catalog.extension_schema_name(plpy))
    with worker_session.connect(worker_session.conninfo(plpy)) as db:
        db.execute(sql.SQL("UPDATE {}.jobs SET state = %s, last_error = %s, updated_at = now() "
                           "WHERE job_id = %s").format(schema),
                   (str(JobState.FAILED), f"abandoned: {why}", job_id))
        HopFiles.of(lambda q: db.execute(q).fetchone()[0], job_id).remove_job()


def insert_job(db: psycopg.Connection, schema: str, values: dict) -> int:
    """A new `jobs` row (in the creating transaction of `db`); its job_id."""
    return db.execute(sql.SQL("INSERT INTO {}.jobs ({}) VALUES ({}) RETURNING job_id").format(
        sql.Identifier(schema), sql.SQL(", ").join(map(sql.Identifier, values)),
        sql.SQL(", ").join(sql.Placeholder() * len(values))), tuple(values.values())).fetchone()[0]


# ---- over a session of psycopg's (a coordinator's, a tool's) ------------------------------------

def read_own(db: psycopg.Connection, schema: str, job_id: int) -> JobRecord:
    """One of the connected role's jobs."""
    with db.cursor(row_factory=dict_row) as cursor:
        row = cursor.execute(sql.SQL(f"SELECT * FROM {{}}.jobs WHERE job_id = %s AND {_OWN}")
                             .format(sql.Identifier(schema)), (job_id,)).fetchone()
    if row is None:
        raise _not_found(job_id, schema)
    return JobRecord.of(row)


def own_job_writing(db: psycopg.Connection, model_output_table: str) -> JobRecord | None:
    """The connected role's latest job whose output table is `model_output_table` (as
    users write it)."""
    with db.cursor(row_factory=tuple_row) as cursor:  # whatever rows `db` gives
        schema = cursor.execute("SELECT quote_ident(n.nspname) FROM pg_extension e "
                                "JOIN pg_namespace n ON n.oid = e.extnamespace "
                                "WHERE e.extname = 'madlib_mop'").fetchone()[0]
    with db.cursor(row_factory=dict_row) as cursor:
        row = cursor.execute(
            f"SELECT j.* FROM {schema}.jobs j WHERE j.model_output_table = ("  # quoted by the server
            "SELECT quote_ident(n.nspname) || '.' || quote_ident(c.relname) FROM pg_class c "
            "JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.oid = to_regclass(%s)) "
            f"AND j.{_OWN} ORDER BY job_id DESC LIMIT 1", (model_output_table,)).fetchone()
    return None if row is None else JobRecord.of(row)


def lock(db: psycopg.Connection, schema: sql.Identifier, job_id: int) -> None:
    """The job's advisory lock, for as long as `db` lives: one coordinator per job.
    lock_key is a random number only the owner can read, so no other role can take the
    lock first and block the job."""
    with db.cursor(row_factory=tuple_row) as cursor:
        locked = cursor.execute(sql.SQL("SELECT pg_try_advisory_lock(lock_key) FROM {}.jobs "
                                        "WHERE job_id = %s").format(schema), (job_id,)).fetchone()[0]
    if not locked:
        raise MadlibMopError(f"job {job_id} is running in another session",
                             sqlstate=errors.INVALID_PARAMETER_VALUE,
                             hint="Watch it in madlib_mop.job_progress; it is resumable "
                                  "if that session ends.")


class JobRowUpdates:
    """The job's `jobs` row as its coordinator changes it (a part of `JobStore`): state,
    progress, workers and queue position, errors, models lost."""

    schema: sql.Identifier
    job_id: int
    db: psycopg.Connection

    def execute(self, statement: sql.Composable | str, params: tuple = ()) -> psycopg.Cursor:
        return self.db.execute(statement, params)

    def _update_job(self, assignments: str, params: tuple = ()) -> psycopg.Cursor:
        return self.execute(sql.SQL("UPDATE {}.jobs SET " + assignments + ", updated_at = now() "
                              "WHERE job_id = %s").format(self.schema), params + (self.job_id,))

    def mark_running(self, pid: int) -> float:
        """State 'running'; returns when the job first started (epoch seconds)."""
        cursor = self.execute(sql.SQL(
            "UPDATE {}.jobs SET state = %s, coordinator_pid = %s, "
            "started_at = coalesce(started_at, now()), last_error = NULL, updated_at = now() "
            "WHERE job_id = %s RETURNING extract(epoch FROM started_at)::float8").format(self.schema),
            (str(JobState.RUNNING), pid, self.job_id))
        return cursor.fetchone()[0]

    def queued(self, position: int) -> None:
        """Waiting for a worker session: its place in the server's queue (1 is next)."""
        self._update_job("state = %s, queue_position = %s", (str(JobState.QUEUED), position))

    def running_on(self, workers: int) -> None:
        self._update_job("state = %s, queue_position = NULL, workers = %s", (str(JobState.RUNNING), workers))

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

    def note_model_failure(self, mst_key: int, lost: bool, reason: str | None) -> None:
        """What happened to a model that stopped for a cause of its own (`lost`), or that
        it trains again."""
        failures = (sql.SQL("coalesce(model_failures, '{}') || jsonb_build_object(%s::text, %s::text)")
                    if lost else sql.SQL("model_failures - %s::text"))
        params = (mst_key, reason) if lost else (mst_key,)
        self.execute(sql.SQL("UPDATE {}.jobs SET model_failures = {} WHERE job_id = %s").format(
            self.schema, failures), params + (self.job_id,))

    def mark_finished(self) -> None:
        self._update_job("state = %s, finished_at = now(), last_error = NULL", (str(JobState.FINISHED),))

    def close(self, error: BaseException | None = None) -> None:
        """The session ends; after an error the job is recorded failed (an error of the
        package's: its cause is in the job) or interrupted (resumable as it was)."""
        if error is not None and not self.db.closed:
            state = JobState.FAILED if isinstance(error, MadlibMopError) else JobState.INTERRUPTED
            try:
                self.execute(sql.SQL("UPDATE {}.jobs SET state = %s, last_error = coalesce(%s, last_error), "
                               "updated_at = now() WHERE job_id = %s AND state <> %s")
                       .format(self.schema),
                       (str(state), str(error)[:2000], self.job_id, str(JobState.FINISHED)))
            except psycopg.Error:
                pass
        if not self.db.closed:
            # The job's lock and its data locks go now: a backend releases them when it
            # exits, which is after the close returns (an append right after the job would
            # find them held).
            try:
                self.execute("SELECT pg_advisory_unlock_all()")
            except psycopg.Error:
                pass
        self.db.close()
