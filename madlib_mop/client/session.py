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

import sys
from typing import Callable

import pandas as pd
import psycopg
import sqlalchemy as sa

from madlib_mop.client import frames
from madlib_mop.client.errors import JobCancelled, ServerError, server_error
from madlib_mop.client.progress import JobProgress, notices_to, train_with_progress
from madlib_mop.client.routines import RoutineCatalog

# The routines that start or continue a training job: their calls get a progress bar.
TRAINING_ROUTINES = frozenset({
    "madlib_keras_fit_multiple_model", "madlib_keras_fit", "madlib_keras_automl",
    "fit_multiple", "automl", "resume", "resume_job",
})

__all__ = ["Client", "JobCancelled", "ServerError", "make_engine"]


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
        self.catalog = RoutineCatalog(self.engine, self.schema)
        self.routines = self.catalog.routines

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
        return self.catalog.help(name)

    def call(self, name: str, /, *args, **kwargs):
        """Call routine `name`; returns its value (a DataFrame for set-returning ones,
        None for void).  Training routines show progress unless `progress=False`."""
        statement, params, routine = self.catalog.statement(name, args, kwargs)
        if name in TRAINING_ROUTINES:
            try:
                return train_with_progress(self.engine, self.schema, statement, params,
                                           self.progress, self._print_notice)
            except sa.exc.DBAPIError as error:
                raise server_error(error) from None
        with self.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            with notices_to(conn, self._print_notice):
                try:
                    result = conn.execute(sa.text(statement), params)
                except sa.exc.DBAPIError as error:
                    raise server_error(error) from None
                if routine.kind == "p" or routine.returns_void:
                    return None
                if routine.returns_set:
                    return pd.DataFrame(result.mappings().all())
                return result.scalar()

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

    def optimization_history(self, job: int | str) -> pd.DataFrame:
        with self.engine.connect() as conn:
            return frames.optimization_history(conn, self.schema, frames.job_ref(conn, self.schema, job))

    def visits(self, job: int | str) -> pd.DataFrame:
        with self.engine.connect() as conn:
            return frames.visits(conn, frames.job_ref(conn, self.schema, job))

    def close(self) -> None:
        self.engine.dispose()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
