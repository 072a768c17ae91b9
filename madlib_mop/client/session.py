"""`Client`: the extension's SQL functions from Python, through SQLAlchemy.

    from madlib_mop.client import Client
    mop = Client("postgresql+psycopg://alice@dbhost/analytics")   # or an Engine, or a libpq DSN
    mop.madlib_keras_fit_multiple_model(source_table="iris_packed", model_output_table="iris_models",
                                        model_selection_table="mst", num_iterations=10)
    mop.leaderboard("iris_models")

Every function and procedure of the extension is a method taking keyword (or positional)
arguments, called with PostgreSQL's named notation; the server's errors are raised as
`ServerError` with SQLSTATE, message, detail and hint.  The calls that train (fit,
fit_multiple, automl, resume) show a progress bar read from `job_progress` by a second
connection, and Ctrl-C cancels the job on the server and says how to continue it.
"""

from __future__ import annotations

import contextlib
import json
import sys
import threading
from dataclasses import dataclass
from typing import Any, Callable

import pandas as pd
import psycopg
import sqlalchemy as sa

from madlib_mop.client import frames
from madlib_mop.client.progress import JobProgress

# The routines that start or continue a training job: their calls get a progress bar.
TRAINING_ROUTINES = frozenset({
    "madlib_keras_fit_multiple_model", "madlib_keras_fit", "madlib_keras_automl",
    "fit_multiple", "automl", "resume", "resume_job",
})


class ServerError(Exception):
    """An error the server raised: its SQLSTATE, message, detail and hint."""

    def __init__(self, sqlstate: str | None, message: str, detail: str | None = None,
                 hint: str | None = None):
        self.sqlstate, self.message, self.detail, self.hint = sqlstate, message, detail, hint
        text = f"[{sqlstate}] {message}" if sqlstate else message
        if detail:
            text += f"\nDETAIL: {detail}"
        if hint:
            text += f"\nHINT: {hint}"
        super().__init__(text)


class JobCancelled(KeyboardInterrupt):
    """Ctrl-C during a training call: the job was cancelled on the server and can continue."""

    def __init__(self, job_id: int | None, schema: str, done: str = ""):
        self.job_id = job_id
        if job_id is None:
            message = ("cancelled before its job was running; the same call again starts it, or "
                       "continues it if it was recorded")
        else:
            message = (f"job {job_id} cancelled{done}; continue it with mop.resume({job_id}), "
                       f"CALL {schema}.resume({job_id}), or the same call again")
        super().__init__(message)


@dataclass(frozen=True)
class Routine:
    name: str
    kind: str  # 'f' function, 'p' procedure
    arguments: tuple[tuple[str, str], ...]  # (name, type), input arguments in order
    returns_set: bool
    returns_void: bool


def server_error(error: BaseException) -> BaseException:
    """SQLAlchemy's wrapped driver error as a ServerError (others unchanged)."""
    original = getattr(error, "orig", error)
    diag = getattr(original, "diag", None)
    if diag is None or getattr(diag, "sqlstate", None) is None:
        return error
    return ServerError(diag.sqlstate, diag.message_primary or str(original),
                       diag.message_detail, diag.message_hint)


def make_engine(target: "str | sa.Engine | None") -> sa.Engine:
    """An Engine from an Engine, a SQLAlchemy URL (postgresql+psycopg://...), a libpq
    connection string or URI (postgresql://..., 'host=... dbname=...'), or None: libpq's
    environment (PGHOST, PGUSER, PGDATABASE, ...)."""
    if isinstance(target, sa.Engine):
        return target
    if target and "+" in target.split("://", 1)[0]:
        return sa.create_engine(target)
    # psycopg reads the libpq string (and PG* variables) itself.
    conninfo = target or ""
    return sa.create_engine("postgresql+psycopg://", creator=lambda: psycopg.connect(conninfo))


class Client:
    """A connection to a database where the extension is installed."""

    def __init__(self, target: "str | sa.Engine | None" = None, *, schema: str | None = None,
                 progress: bool = True, notices: Callable[[str], None] | None = None):
        self.engine = make_engine(target)
        self.progress = progress
        self._print_notice = notices or (lambda text: print(text, file=sys.stderr))
        with self.engine.connect() as conn:
            found = conn.execute(sa.text(
                "SELECT extnamespace::regnamespace::text FROM pg_extension "
                "WHERE extname = 'madlib_mop'")).scalar()
        if found is None and schema is None:
            raise ServerError(None, "the extension madlib_mop is not installed in this database",
                              hint="CREATE EXTENSION madlib_mop SCHEMA madlib_mop CASCADE")
        self.schema = schema or found
        self.routines = self._routines()

    # ---- the extension's routines ------------------------------------------------------
    def _routines(self) -> dict[str, list[Routine]]:
        with self.engine.connect() as conn:
            rows = conn.execute(sa.text(
                "SELECT p.proname, p.prokind, p.proretset, p.prorettype = 'void'::regtype AS void, "
                "  coalesce(p.proargnames, '{}') AS names, "
                "  coalesce(p.proargmodes::text[], '{}') AS modes, "
                "  ARRAY(SELECT format_type(t, NULL) FROM unnest(p.proargtypes) t) AS types "
                "FROM pg_proc p JOIN pg_depend d ON d.classid = 'pg_proc'::regclass AND d.objid = p.oid "
                "JOIN pg_extension e ON e.oid = d.refobjid AND e.extname = 'madlib_mop' "
                "WHERE d.deptype = 'e' AND p.proname NOT LIKE '\\_%' "
                "ORDER BY p.proname, p.pronargs")).all()
        routines: dict[str, list[Routine]] = {}
        for name, kind, retset, void, names, modes, types in rows:
            input_names = [n for k, n in enumerate(names)
                           if not modes or modes[k] in ("i", "b", "v")]
            routines.setdefault(name, []).append(Routine(
                name, kind, tuple(zip(input_names, types)), retset, void))
        return routines

    def __getattr__(self, name: str):
        routines = self.__dict__.get("routines", {})
        if name in routines:
            def call(*args, **kwargs):
                return self.call(name, *args, **kwargs)
            call.__name__ = name
            call.__doc__ = self.help(name)
            return call
        raise AttributeError(f"{type(self).__name__} has no attribute {name!r}"
                             + (f"; the extension has no routine {name}" if routines else ""))

    def __dir__(self):
        return sorted(set(super().__dir__()) | set(self.routines))

    def help(self, name: str) -> str:
        """The signatures of routine `name`."""
        return "\n".join(
            f"{'CALL ' if r.kind == 'p' else ''}{self.schema}.{name}("
            + ", ".join(f"{a} {t}" for a, t in r.arguments) + ")"
            for r in self.routines.get(name, []))

    def _candidates(self, name: str, args: tuple, kwargs: dict) -> list[Routine]:
        """The signatures of `name` these arguments fit (by count and names)."""
        candidates = [r for r in self.routines.get(name, [])
                      if len(r.arguments) >= len(args) + len(kwargs)
                      and set(kwargs) <= {a for a, _ in r.arguments[len(args):]}]
        if not candidates:
            raise TypeError(f"{self.schema}.{name} takes no such arguments; it has:\n"
                            + (self.help(name) or "(no such routine)"))
        return candidates

    def _statement(self, name: str, args: tuple, kwargs: dict) -> tuple[str, dict, Routine]:
        candidates = self._candidates(name, args, kwargs)
        routine = candidates[0]
        # The declared types are cast to when one signature fits (so that a Python int
        # reaches an integer[] parameter); between overloads, the server chooses.
        typed = len(candidates) == 1
        parts, params = [], {}
        types = dict(routine.arguments)
        for k, value in enumerate(args):
            arg, kind = routine.arguments[k]
            parts.append(self._bind(f"a{k}", value, kind if typed else None, params))
        for arg, value in kwargs.items():
            parts.append(f"{frames.quote(arg)} => " + self._bind(arg, value, types[arg] if typed else None, params))
        call = f"{frames.quote(self.schema)}.{frames.quote(name)}({', '.join(parts)})"
        if routine.kind == "p":
            return f"CALL {call}", params, routine
        if routine.returns_set:
            return f"SELECT * FROM {call}", params, routine
        return f"SELECT {call}", params, routine

    @staticmethod
    def _bind(key: str, value: Any, kind: str | None, params: dict) -> str:
        if isinstance(value, (dict, list)) and kind in ("text", "character varying", "json", "jsonb"):
            value = json.dumps(value)  # a grid or parameter list given as Python data
        params[key] = value
        return f"CAST(:{key} AS {kind})" if kind else f":{key}"

    def call(self, name: str, /, *args, **kwargs):
        """Call routine `name`; returns its value (a DataFrame for set-returning ones,
        None for void).  Training routines show progress unless `progress=False`."""
        statement, params, routine = self._statement(name, args, kwargs)
        if name in TRAINING_ROUTINES:
            return self._train(statement, params)
        with self.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            with self._notices(conn, self._print_notice):
                try:
                    result = conn.execute(sa.text(statement), params)
                except sa.exc.DBAPIError as error:
                    raise server_error(error) from None
                if routine.kind == "p" or routine.returns_void:
                    return None
                if routine.returns_set:
                    return pd.DataFrame(result.mappings().all())
                return result.scalar()

    @staticmethod
    @contextlib.contextmanager
    def _notices(conn: sa.Connection, sink: Callable[[str], None]):
        """The server's NOTICEs on `conn`, as 'NOTICE: text', to `sink` while the block runs."""
        raw = conn.connection.dbapi_connection
        handler = lambda diag: sink(f"{diag.severity}: {diag.message_primary}")  # noqa: E731
        raw.add_notice_handler(handler)
        try:
            yield
        finally:
            raw.remove_notice_handler(handler)

    # ---- training calls with progress ---------------------------------------------------
    def _train(self, statement: str, params: dict) -> None:
        """Run a training call on one connection while another shows its job's progress;
        Ctrl-C cancels it on the server."""
        outcome: dict[str, BaseException | None] = {"error": None}
        with self.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            raw = conn.connection.dbapi_connection
            pid = conn.execute(sa.text("SELECT pg_backend_pid()")).scalar()
            progress = JobProgress(self.engine, self.schema, coordinator_pid=pid,
                                   show=self.progress)
            done = threading.Event()

            def run():
                try:
                    conn.execute(sa.text(statement), params)
                except BaseException as error:  # handed to the calling thread
                    outcome["error"] = error
                finally:
                    done.set()

            with self._notices(conn, progress.notice if self.progress else self._print_notice):
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
            raise JobCancelled(*self._cancelled_job(progress)) from None
        if error is not None:
            raise (server_error(error) if isinstance(error, sa.exc.DBAPIError) else error) from None

    def _cancelled_job(self, progress: JobProgress) -> tuple[int | None, str, str]:
        """(job id, schema, ' after x of y epochs') of a cancelled call, read anew."""
        if progress.job_id is None:
            return None, self.schema, ""
        with self.engine.connect() as conn:
            row = conn.execute(sa.text(
                f"SELECT epochs_done, epochs_total FROM {frames.quote(self.schema)}.job_progress "
                "WHERE job_id = :id"), {"id": progress.job_id}).first()
        done = f" after {float(row[0]):g} of {float(row[1]):g} epochs" if row else ""
        return progress.job_id, self.schema, done

    def resume(self, job_id: int) -> None:
        """Continue an interrupted job (CALL resume)."""
        self.call("resume", job_id)

    def watch(self, job: int | str, *, interval: float = 1.0) -> str:
        """Show a running job's progress until it ends; returns its final state."""
        with self.engine.connect() as conn:
            ref = frames.job_ref(conn, self.schema, job)
        progress = JobProgress(self.engine, self.schema, job_id=ref.job_id, show=True,
                               interval=interval)
        try:
            return progress.follow(None)
        finally:
            progress.close()

    # ---- results --------------------------------------------------------------------------
    def job(self, job: int | str) -> frames.JobRef:
        with self.engine.connect() as conn:
            return frames.job_ref(conn, self.schema, job)

    def jobs(self) -> pd.DataFrame:
        with self.engine.connect() as conn:
            return frames.jobs(conn, self.schema)

    def leaderboard(self, job: int | str) -> pd.DataFrame:
        with self.engine.connect() as conn:
            return frames.leaderboard(conn, frames.job_ref(conn, self.schema, job))

    def curves(self, job: int | str) -> pd.DataFrame:
        with self.engine.connect() as conn:
            return frames.curves(conn, frames.job_ref(conn, self.schema, job))

    def visits(self, job: int | str) -> pd.DataFrame:
        with self.engine.connect() as conn:
            return frames.visits(conn, frames.job_ref(conn, self.schema, job))

    def close(self) -> None:
        self.engine.dispose()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
