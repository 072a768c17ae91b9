"""Outputs in pg_temp.  MADlib scripts write models, predictions and evaluations into the
calling session's temporary schema (`'pg_temp.iris_model'`).  Worker sessions, and the
coordinator's own session, cannot see another session's temporary tables, so the work is
written into ordinary tables of the caller's current schema, named `_mop_tmp<pid>_<name>`;
when it has ended, the calling session copies them into its temporary tables of the given
names and drops them.  A failed call drops them too: a temporary output is not resumed.
"""

from __future__ import annotations

import contextlib
import json
from typing import Any, Iterator

from madlib_mop import errors
from madlib_mop.db import catalog
from madlib_mop.errors import MadlibMopError

PREFIX = "_mop_tmp"


def is_temporary(plpy: Any, name: str | None, argument: str) -> bool:
    return bool(name and name.strip()) and catalog.new_table(plpy, name, argument=argument).schema == "pg_temp"


@contextlib.contextmanager
def output(plpy: Any, name: str, argument: str, suffixes: tuple[str, ...] = ("",),
           job_output: bool = False) -> Iterator[str]:
    """The name to write the output(s) into: `name` itself, or for a pg_temp name an
    ordinary table's, copied into pg_temp.<name><suffix> for each suffix once the block
    ends.  `job_output`: the staged name is a job's output, whose job tables go too."""
    if not is_temporary(plpy, name, argument):
        yield name
        return
    wanted = catalog.new_table(plpy, name, argument=argument)
    for suffix in suffixes:
        wanted.sibling(suffix, plpy).must_not_exist(plpy)
    pid = plpy.execute("SELECT pg_catalog.pg_backend_pid() AS p")[0]["p"]
    staged = catalog.new_table(plpy, plpy.quote_ident(f"{PREFIX}{pid}_{wanted.name}"),
                               argument=argument)
    _check_length(plpy, staged, wanted, argument, job_output)
    _drop(plpy, staged, suffixes, job_output)  # left by an earlier call of this session
    try:
        yield staged.quoted
        for suffix in suffixes:
            source, target = staged.sibling(suffix, plpy), wanted.sibling(suffix, plpy)
            plpy.execute(f"CREATE TEMP TABLE {plpy.quote_ident(target.name)} AS "
                         f"SELECT * FROM {source.quoted}")
        _rename_in_summary(plpy, wanted, staged)
    finally:
        _drop(plpy, staged, suffixes, job_output)


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


def _rename_in_summary(plpy: Any, wanted: catalog.NewTable, staged: catalog.NewTable) -> None:
    """The summary names the model table and its _info as the caller named them."""
    summary = wanted.sibling("_summary", plpy)
    if not summary.exists(plpy):
        return
    have = {row["attname"] for row in plpy.execute(plpy.prepare(
        "SELECT attname FROM pg_catalog.pg_attribute WHERE attrelid = $1::regclass "
        "AND attnum > 0 AND NOT attisdropped", ["text"]), [summary.quoted])}
    for column, value in (("model", f"pg_temp.{wanted.name}"),
                          ("model_info", f"pg_temp.{wanted.name}_info")):
        if column in have:
            plpy.execute(plpy.prepare(f"UPDATE {summary.quoted} SET {column} = $1", ["text"]), [value])


def _drop(plpy: Any, staged: catalog.NewTable, suffixes: tuple[str, ...], job_output: bool) -> None:
    """The staged outputs, and (a job's output) the job's tables, which this session owns.
    A job that ended unfinished is recorded as abandoned."""
    tables = [staged.sibling(suffix, plpy).quoted for suffix in suffixes]
    if job_output:
        from madlib_mop.job import store

        job = store.find_job(plpy, staged.quoted, unfinished=True)
        if job is not None:
            store.abandon(plpy, job["job_id"], "its output was temporary")
        for found in (job, store.find_job(plpy, staged.quoted, unfinished=False)):
            if found is not None:
                tables += [".".join(plpy.quote_ident(p) for p in parts)
                           for parts in json.loads(found["tables"]).values()]
    for table in dict.fromkeys(tables):
        if plpy.execute(plpy.prepare("SELECT to_regclass($1) IS NOT NULL AS e", ["text"]),
                        [table])[0]["e"]:
            plpy.execute(f"DROP TABLE {table}")
