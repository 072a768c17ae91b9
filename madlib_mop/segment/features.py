"""A worker's staged features (`runtime.staging`): a segment's rows through a frozen prefix,
computed once per (packed table, segment, prefix digest, buffer) and kept.

Each buffer's features are written to the extension's table `staged_features` by the
worker session that needs them first, and read from there by every other one: the job's
other workers (a worker that takes a model due on another segment), and the role's later
jobs over the same table and prefix (the next cycle over a table that grew computes its new
buffers alone).  A worker keeps them decoded when they fit what its memory budget leaves,
else reads them a buffer at a time.  Rows are written by the call that computes them: if
that call fails, its transaction and the rows go, and the next call computes them again
(the transaction that wrote them is asked for).

Where that table is missing (a segment server of an earlier version) the features are kept
for the job by the worker session alone, spilled to its temporary table
(`pg_temp.mop_staged_features`) when they do not fit; without the right to create
temporary tables they are computed at every call (the results are the same).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from madlib_mop import errors
from madlib_mop.db import catalog
from madlib_mop.errors import MadlibMopError
from madlib_mop.runtime.buffers import Buffer, decode
from madlib_mop.runtime.staging import StagedProgram

SPILL_TABLE = "pg_temp.mop_staged_features"


STORE = "staged_features"  # the extension's table of staged features kept across jobs


@dataclass
class Staged:
    buffers: list[Buffer]
    bytes: int
    spilled_by: str | None = None  # the transaction that wrote the rows the buffers read
    in_memory: bool = True  # False: a buffer at a time from a table


@dataclass
class Report:
    """What a call says of the features it trained on (the visit's `staged`)."""

    prefix: str
    layers: int
    computed: bool
    spilled: bool
    bytes: int
    seconds: float = 0.0
    computed_buffers: int | None = None  # of the segment's buffers, computed by this call
    stored_buffers: int | None = None  # read from staged_features, computed before

    def to_dict(self) -> dict:
        found = {"prefix": self.prefix[:16], "layers": self.layers, "computed": self.computed,
                 "spilled": self.spilled, "bytes": self.bytes, "seconds": self.seconds}
        if self.computed_buffers is not None:
            found.update(computed_buffers=self.computed_buffers, stored_buffers=self.stored_buffers)
        return found


def _store_name(plpy: Any) -> str | None:
    """The extension's `staged_features`, qualified; None where it is missing.  (Looked up
    in the extension's schema alone: to_regclass refuses a schema the role may not use.)"""
    name = f"{catalog.extension_schema(plpy)}.{STORE}"
    found = plpy.execute(plpy.prepare("SELECT to_regclass($1) IS NOT NULL AS e", ["text"]), [name])[0]["e"]
    return name if found else None


def _from_store(plpy: Any, store: str, source: int, key: tuple, raw: list[Buffer], program: StagedProgram,
                classification: bool, keep: bool) -> tuple[Staged, int]:
    """The features of `raw` (of the table `source`) from `store`: those there read, the
    others computed and written; kept decoded (`keep`) or read a buffer at a time.  And how
    many were computed."""
    _, segment, digest = key
    where = "owner = current_user AND source = $1 AND segment = $2 AND prefix = $3"
    types = ["oid", "integer", "text"]
    present = {(r["buffer_id"], r["rows"]) for r in plpy.execute(plpy.prepare(
        f"SELECT buffer_id, rows FROM {store} WHERE {where}", types), [source, segment, digest])}
    select = plpy.prepare(f"SELECT x, xs, y, ys FROM {store} WHERE {where} AND buffer_id = $4 AND rows = $5",
                          types + ["integer", "integer"])
    stale = plpy.prepare(f"DELETE FROM {store} WHERE {where} AND buffer_id = $4 AND rows <> $5",
                         types + ["integer", "integer"])
    insert = plpy.prepare(f"INSERT INTO {store} (source, segment, prefix, buffer_id, rows, x, xs, y, ys) "
                          "VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9) ON CONFLICT DO NOTHING",
                          types + ["integer", "integer", "bytea", "integer[]", "bytea", "integer[]"])

    def read(buffer_id: int, rows: int):
        found = plpy.execute(select, [source, segment, digest, buffer_id, rows])
        if not found:  # (the transaction that wrote them is checked before every call's use)
            raise MadlibMopError(f"the staged features of buffer {buffer_id} of segment {segment} are gone",
                                 sqlstate=errors.DATA_EXCEPTION,
                                 hint="Resume the job: its workers compute them again.")
        return decode(found[0], classification)

    buffers, total, computed = [], 0, 0
    for buffer in raw:
        ident = (buffer.buffer_id, buffer.rows)
        if ident in present:
            kept = read(*ident) if keep else None
        else:
            x, y = buffer.load()
            features = program.features(x)
            plpy.execute(stale, [source, segment, digest, *ident])
            plpy.execute(insert, [source, segment, digest, *ident, features.tobytes(), list(features.shape),
                                  y.tobytes(), list(y.shape)])
            kept, computed = ((features, y) if keep else None), computed + 1
            del x
        total += program.feature_bytes(buffer.rows)
        buffers.append(Buffer(buffer.rows, lambda d=kept: d) if keep else
                       Buffer(buffer.rows, lambda i=ident: read(*i), in_memory=False))
    written = (plpy.execute("SELECT pg_catalog.pg_current_xact_id()::text AS x")[0]["x"]
               if computed else None)
    return Staged(buffers, total, spilled_by=written, in_memory=keep), computed


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
    return Staged(buffers, total, spilled_by=xid, in_memory=False)


def _through(program: StagedProgram, x, y) -> tuple:
    return program.features(x), y


def staged_buffers(plpy: Any, cache: dict, job_id: int, key: tuple, raw: list[Buffer],
                   program: StagedProgram, classification: bool, free_bytes: int) -> tuple[list[Buffer], Report]:
    """The features of `raw` (a segment's buffers) for the restored model of `program`,
    keyed by (table, segment, digest) in `cache`: computed now when not there yet."""
    started = time.perf_counter()
    staged = cache.get(key)
    computed = staged is None or not _still_there(plpy, staged)
    store = _store_name(plpy) if computed and all(b.buffer_id is not None for b in raw) else None
    source = store and plpy.execute(plpy.prepare("SELECT to_regclass($1)::oid AS o", ["text"]), [key[0]])[0]["o"]
    if source is not None:
        need = program.feature_bytes(sum(b.rows for b in raw))
        staged, count = _from_store(plpy, store, source, key, raw, program, classification, need <= free_bytes)
        cache[key] = staged
        return staged.buffers, Report(key[2], program.cut, count > 0, not staged.in_memory, staged.bytes,
                                      time.perf_counter() - started, count, len(raw) - count)
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
    return staged.buffers, Report(key[2], program.cut, computed, not staged.in_memory,
                                  staged.bytes, time.perf_counter() - started)


def _spill_table_exists(plpy: Any) -> bool:
    return plpy.execute(f"SELECT pg_catalog.to_regclass('{SPILL_TABLE}') IS NOT NULL AS e")[0]["e"]


def forget(plpy: Any) -> None:
    """Another job's spilled features go: a worker session is kept for its role's next job.
    And the role's kept features of tables since dropped."""
    if _spill_table_exists(plpy):
        plpy.execute(f"TRUNCATE {SPILL_TABLE}")
    store = _store_name(plpy)
    if store is not None:
        plpy.execute(f"DELETE FROM {store} s WHERE owner = current_user AND NOT EXISTS "
                     "(SELECT 1 FROM pg_catalog.pg_class c WHERE c.oid = s.source)")


def held_bytes(cache: dict) -> int:
    """What the kept (not spilled) features take."""
    return sum(s.bytes for s in cache.values() if s.in_memory)
