"""A worker's staged features (`runtime.staging`): a segment's rows through a frozen prefix,
computed once per (packed table, segment, prefix digest) and kept for the job.

They are kept decoded when they fit what the worker's memory budget leaves, else spilled
to a temporary table of the worker's session (`pg_temp.mop_staged_features`) and read a
buffer at a time, like a segment's buffers that do not fit; they are removed when the
session takes another job (`forget`), or ends.  A spill is
written by the call that computes it: if that call fails, its transaction and the rows go,
and the next call computes them again (the transaction that wrote them is asked for).
Without the right to create temporary tables the features are computed at every call (the
results are the same).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from madlib_mop import errors
from madlib_mop.errors import MadlibMopError
from madlib_mop.runtime.buffers import Buffer, decode
from madlib_mop.runtime.staging import StagedProgram

SPILL_TABLE = "pg_temp.mop_staged_features"


@dataclass
class Staged:
    buffers: list[Buffer]
    bytes: int
    spilled_by: str | None = None  # the transaction that wrote the spilled rows


@dataclass
class Report:
    """What a call says of the features it trained on (the visit's `staged`)."""

    prefix: str
    layers: int
    computed: bool
    spilled: bool
    bytes: int
    seconds: float = 0.0

    def to_dict(self) -> dict:
        return {"prefix": self.prefix[:16], "layers": self.layers, "computed": self.computed,
                "spilled": self.spilled, "bytes": self.bytes, "seconds": self.seconds}


def _still_there(plpy: Any, staged: Staged) -> bool:
    if staged.spilled_by is None:
        return True
    status = plpy.execute(plpy.prepare("SELECT pg_catalog.pg_xact_status($1::xid8) AS s", ["text"]),
                          [staged.spilled_by])[0]["s"]
    return status in ("committed", "in progress")


def _spill(plpy: Any, job_id: int, key: tuple, raw: list[Buffer], program: StagedProgram,
           classification: bool) -> Staged | None:
    """Features written to the session's temporary table; None when it cannot be made."""
    # Not CREATE ... IF NOT EXISTS: its NOTICE would go to a session kept idle for its role,
    # whose client is gone, and end it.
    try:
        if not _spill_table_exists(plpy):
            with plpy.subtransaction():
                plpy.execute(f"CREATE TEMPORARY TABLE {SPILL_TABLE.split('.')[1]} ("
                             "job_id bigint, source text, segment integer, prefix text, buffer integer, "
                             "x bytea, xs integer[], y bytea, ys integer[], "
                             "PRIMARY KEY (job_id, source, segment, prefix, buffer))")
                # Float bytes do not compress: out of line without trying, as packed tables.
                plpy.execute(f"ALTER TABLE {SPILL_TABLE} ALTER COLUMN x SET STORAGE EXTERNAL")
    except Exception as error:  # no TEMPORARY right on the database: computed per call
        if getattr(error, "sqlstate", None) == errors.INSUFFICIENT_PRIVILEGE:
            return None
        raise
    table, segment, digest = key
    # (only rows whose writer's status is no longer known can be there: replaced, not a
    # primary key violation)
    plpy.execute(plpy.prepare(f"DELETE FROM {SPILL_TABLE} WHERE job_id = $1 AND source = $2 "
                              "AND segment = $3 AND prefix = $4",
                              ["bigint", "text", "integer", "text"]), [job_id, table, segment, digest])
    insert = plpy.prepare(f"INSERT INTO {SPILL_TABLE} VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)",
                          ["bigint", "text", "integer", "text", "integer", "bytea", "integer[]",
                           "bytea", "integer[]"])
    select = plpy.prepare(f"SELECT x, xs, y, ys FROM {SPILL_TABLE} WHERE job_id = $1 AND source = $2 "
                          "AND segment = $3 AND prefix = $4 AND buffer = $5",
                          ["bigint", "text", "integer", "text", "integer"])

    def read(number: int):
        rows = plpy.execute(select, [job_id, table, segment, digest, number])
        if not rows:  # (the transaction that wrote them is checked before every call's use)
            raise MadlibMopError(f"job {job_id}: the spilled features of buffer {number} of segment "
                                 f"{segment} are gone", sqlstate=errors.DATA_EXCEPTION,
                                 hint="Resume the job: its workers compute them again.")
        return decode(rows[0], classification)

    buffers, total = [], 0
    for number, buffer in enumerate(raw):
        x, y = buffer.load()
        features = program.features(x)
        plpy.execute(insert, [job_id, table, segment, digest, number, features.tobytes(),
                              list(features.shape), y.tobytes(), list(y.shape)])
        total += features.nbytes
        buffers.append(Buffer(buffer.rows, lambda n=number: read(n), in_memory=False))
        del x, features
    xid = plpy.execute("SELECT pg_catalog.pg_current_xact_id()::text AS x")[0]["x"]
    return Staged(buffers, total, spilled_by=xid)


def _through(program: StagedProgram, x, y) -> tuple:
    return program.features(x), y


def staged_buffers(plpy: Any, cache: dict, job_id: int, key: tuple, raw: list[Buffer],
                   program: StagedProgram, classification: bool, free_bytes: int) -> tuple[list[Buffer], Report]:
    """The features of `raw` (a segment's buffers) for the restored model of `program`,
    keyed by (table, segment, digest) in `cache`: computed now when not there yet."""
    started = time.perf_counter()
    staged = cache.get(key)
    computed = staged is None or not _still_there(plpy, staged)
    if computed:
        need = program.feature_bytes(sum(b.rows for b in raw))
        staged = None
        if need <= free_bytes:
            kept = []
            for buffer in raw:
                x, y = buffer.load()
                kept.append(Buffer(buffer.rows, lambda d=(program.features(x), y): d))
            staged = Staged(kept, need)
        else:
            staged = _spill(plpy, job_id, key, raw, program, classification)
        if staged is None:  # computed for this call alone: not kept
            lazy = [Buffer(b.rows, lambda b=b: _through(program, *b.load()), False) for b in raw]
            return lazy, Report(key[2], program.cut, True, False, 0, time.perf_counter() - started)
        cache[key] = staged
    return staged.buffers, Report(key[2], program.cut, computed, staged.spilled_by is not None,
                                  staged.bytes, time.perf_counter() - started)


def _spill_table_exists(plpy: Any) -> bool:
    return plpy.execute(f"SELECT pg_catalog.to_regclass('{SPILL_TABLE}') IS NOT NULL AS e")[0]["e"]


def forget(plpy: Any) -> None:
    """Another job's spilled features go: a worker session is kept for its role's next job."""
    if _spill_table_exists(plpy):
        plpy.execute(f"TRUNCATE {SPILL_TABLE}")


def held_bytes(cache: dict) -> int:
    """What the kept (not spilled) features take."""
    return sum(s.bytes for s in cache.values() if s.spilled_by is None)
