"""Outputs in pg_temp.  MADlib scripts write models, predictions and evaluations into the
calling session's temporary schema (`'pg_temp.iris_model'`).  Worker sessions, and the
coordinator's own session, cannot see another session's temporary tables, so the work is
written into ordinary tables of the caller's current schema, named `_mop_tmp<token>_<name>`;
when it has ended, the calling session copies them into its temporary tables of the given
names.  The ordinary tables (and a job's own tables) are then dropped by a session of
their own, which commits at once, so that a failed call leaves none behind; those the
copies read are locked by the calling transaction and are dropped in it.  A temporary
output is not resumed.
"""

from __future__ import annotations

import contextlib
import secrets
from typing import Any, Iterator

import psycopg

from madlib_mop import errors
from madlib_mop.db import catalog, worker_session
from madlib_mop.errors import MadlibMopError
from madlib_mop.job import repository

PREFIX = "_mop_tmp"


def is_temporary(plpy: Any, name: str | None, argument: str) -> bool:
    """Whether `name` is a table of the session's temporary schema (`pg_temp.x`, or an
    unqualified name whose search_path starts with pg_temp)."""
    if not (name and name.strip()):
        return False
    schema = catalog.new_table(plpy, name, argument=argument).schema
    return schema == "pg_temp" or schema.startswith("pg_temp_")


@contextlib.contextmanager
def output(plpy: Any, name: str, argument: str, suffixes: tuple[str, ...] = ("",),
           job_output: bool = False) -> Iterator[str]:
    """The name to write the output(s) into: `name` itself, or for a temporary name an
    ordinary table's, copied into pg_temp.<name><suffix> for each suffix once the block
    ends.  `job_output`: the staged name is a job's output, whose job tables go too."""
    if not is_temporary(plpy, name, argument):
        yield name
        return
    wanted = catalog.new_table(plpy, name, argument=argument)
    for suffix in suffixes:
        wanted.sibling(suffix, plpy).must_not_exist(plpy)
    # A token of fixed width: a name that fits, fits in every session.
    staged = catalog.new_table(plpy, plpy.quote_ident(f"{PREFIX}{secrets.token_hex(4)}_{wanted.name}"),
                               argument=argument)
    _check_length(plpy, staged, wanted, argument, job_output)
    staged.must_not_exist(plpy)  # the caller may create tables in its current schema
    plpy.notice(f"{argument} pg_temp.{wanted.name} is temporary: written as {staged.quoted}, "
                "then copied into pg_temp")
    copied = False
    try:
        yield staged.quoted
        for suffix in suffixes:
            source, target = staged.sibling(suffix, plpy), wanted.sibling(suffix, plpy)
            plpy.execute(f"CREATE TEMP TABLE {plpy.quote_ident(target.name)} AS "
                         f"SELECT * FROM {source.quoted}")
        copied = True
        if "_summary" in suffixes:
            _rename_in_summary(plpy, wanted, name)
    finally:
        _drop(plpy, staged, suffixes, job_output, copied)


def _check_length(plpy: Any, staged: catalog.NewTable, wanted: catalog.NewTable, argument: str,
                  job_output: bool) -> None:
    from madlib_mop.job.tables import TABLE_SUFFIXES

    longest = max(len(s.encode()) for s in TABLE_SUFFIXES.values()) if job_output else len(b"_summary")
    added = len(staged.name.encode()) - len(wanted.name.encode())
    if len(staged.name.encode()) + longest > 63:
        raise MadlibMopError(
            f'{argument} "{wanted.name}" is too long for a temporary output',
            sqlstate=errors.INVALID_PARAMETER_VALUE,
            detail=f"It is written as {staged.name} first, with suffixes such as _summary added.",
            hint=f"Use a name of at most {63 - longest - added} bytes.")


def _rename_in_summary(plpy: Any, wanted: catalog.NewTable, given: str) -> None:
    """The summary names the model table and its _info as the caller named them."""
    summary = wanted.sibling("_summary", plpy)
    have = {row["attname"] for row in plpy.execute(plpy.prepare(
        "SELECT attname FROM pg_catalog.pg_attribute WHERE attrelid = $1::regclass "
        "AND attnum > 0 AND NOT attisdropped", ["text"]), [summary.quoted])}
    info = f"pg_temp.{plpy.quote_ident(wanted.name + '_info')}"
    for column, value in (("model", given), ("model_info", info)):
        if column in have:
            plpy.execute(plpy.prepare(f"UPDATE {summary.quoted} SET {column} = $1", ["text"]), [value])


def _drop(plpy: Any, staged: catalog.NewTable, suffixes: tuple[str, ...], job_output: bool,
          copied: bool) -> None:
    """The staged outputs, and (a job's output) the job's tables, dropped and committed in a
    session of their own; a job that ended unfinished is recorded as abandoned.  Outputs
    just `copied` are locked by this call's transaction until it ends: those are dropped
    in it (waiting for it from another session would never end)."""
    outputs = [staged.sibling(suffix, plpy).quoted for suffix in suffixes]
    tables = [] if copied else list(outputs)
    if job_output:
        job = repository.find_job(plpy, staged.quoted, unfinished=True)
        if job is not None:
            repository.abandon(plpy, job.job_id, "its output was temporary")
        for found in (job, repository.find_job(plpy, staged.quoted, unfinished=False)):
            if found is not None:
                tables += [".".join(plpy.quote_ident(p) for p in parts)
                           for parts in found.table_names.values()]
    here = outputs if copied else []
    with worker_session.connect(worker_session.conninfo(plpy)) as db:
        db.execute("SET lock_timeout = '5s'")  # a lock this call holds after all: below
        for table in dict.fromkeys(t for t in tables if t not in here):
            try:
                db.execute(f"DROP TABLE IF EXISTS {table}")
            except psycopg.errors.LockNotAvailable:
                here.append(table)
    for table in here:
        plpy.execute(f"DROP TABLE IF EXISTS {table}")
