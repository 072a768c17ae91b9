"""Tables packed in key order, so that new rows can be appended to them.

`training_preprocessor_dl(..., key_column => 'id')` (and validation_preprocessor_dl's)
places every row by its rank in key order (`packing.block_positions`): ranks are cut into
blocks of one buffer per segment, and a block's rows are spread over its buffers by a
permutation seeded by (seed, block).  `preprocessor_dl_append` packs the rows whose key is
above the last one packed: the block that was not full yet is read back from the packed
table, completed, and written again; new blocks follow.  The packed table then holds, buffer
for buffer, what packing the grown table whole gives, and no buffer written before is read
or written again except that one block's.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from madlib_mop import errors
from madlib_mop.db import catalog, packed
from madlib_mop.errors import MadlibMopError
from madlib_mop.json_values import json_value
from madlib_mop.preprocess.buffers import Encoding, Packed, buffer_values, encode_rows
from madlib_mop.preprocess.source import SourceReader, encode
from madlib_mop.runtime import packing


SUMMARY_COLUMN = packed.KEY_ORDER_COLUMN  # the summary's jsonb column


# Types whose order is the same in every database: numbers, dates and times, and text in
# byte order (`COLLATE "C"`).
ORDERED_CATEGORIES = {"N": "number", "D": "date or time", "S": "text"}


@dataclass(frozen=True)
class KeyOrder:
    """How a table was packed in key order, as its summary records it."""

    column: str  # the key column's name in the source
    type: str  # its type, as format_type gives it
    last: str | None  # the last key packed, as text (None: no row yet)
    rows: int  # rows packed, all of them with keys up to `last`
    buffer_size: int  # rows of a block's buffer
    training: bool  # training data (rows spread by the seed) or validation data

    def as_json(self) -> dict:
        return dataclasses.asdict(self)

    @staticmethod
    def of(recorded: Any) -> "KeyOrder":
        return KeyOrder(**json_value(recorded))


def key_column(plpy: Any, table: catalog.Table, name: str | None) -> catalog.Column:
    """The key column: a column of the source whose type orders the same everywhere."""
    column = catalog.column(plpy, table, name, argument="key_column")
    if column.category not in ORDERED_CATEGORIES:
        raise MadlibMopError(
            f'key_column "{name}" has type {column.type}, which does not order rows',
            sqlstate=errors.DATATYPE_MISMATCH,
            detail="Rows are packed in key order: the key is a number, a date or time, or text.",
            hint="Use a column that grows with each new row, such as an id or a timestamp.")
    return column


@dataclass(frozen=True)
class NewRows:
    """The source's rows above the last key packed, copied in key order."""

    table: catalog.Table  # a temporary table: scanned in key order
    rows: int
    first: str | None  # the first and last key, as text
    last: str | None

    def drop(self, plpy: Any) -> None:
        plpy.execute(f"DROP TABLE {self.table.name}")


def copy_in_key_order(plpy: Any, table: catalog.Table, key: catalog.Column, names: list[str],
                      after: str | None) -> NewRows:
    """The rows of `table` whose key is above `after` (every row when None): their key and
    the columns `names`, copied into a temporary table in key order, which a scan by blocks
    reads in that order.  A NULL key, or a key twice, is refused: a row's place is its rank."""
    q = plpy.quote_ident
    column = q(key.name)
    ordered = f'{column} COLLATE "C"' if key.category == "S" else column
    where = "" if after is None else f" WHERE {ordered} > CAST({plpy.quote_literal(after)} AS {key.type})"
    # The last key is kept as text: written and read under the same settings, whatever the
    # session's (a pg_cron job's DateStyle may be another than the analyst's).
    before = plpy.execute(
        "SELECT current_setting('DateStyle') AS d, current_setting('IntervalStyle') AS i, "
        "current_setting('extra_float_digits') AS f, set_config('DateStyle', 'ISO, YMD', true), "
        "set_config('IntervalStyle', 'iso_8601', true), set_config('extra_float_digits', '3', true)")[0]
    try:
        return _copy(plpy, table, key, names, column, ordered, where)
    finally:
        plpy.execute(plpy.prepare("SELECT set_config('DateStyle', $1, true), set_config('IntervalStyle', $2, true), "
                                  "set_config('extra_float_digits', $3, true)", ["text", "text", "text"]),
                     [before["d"], before["i"], before["f"]])


def _copy(plpy: Any, table: catalog.Table, key: catalog.Column, names: list[str], column: str,
          ordered: str, where: str) -> NewRows:
    q = plpy.quote_ident
    nulls = plpy.execute(f"SELECT count(*) AS n FROM {table.name} WHERE {column} IS NULL")[0]["n"]
    if nulls:
        raise MadlibMopError(f"{table.name} has {nulls} rows whose key_column {key.name} is NULL",
                             sqlstate=errors.NULL_VALUE_NOT_ALLOWED,
                             detail="Rows are packed in key order: a row without a key has no place.",
                             hint="Give those rows a key, or leave them out with a view.")
    scratch = q(f"madlib_mop_keyed_{table.oid}")
    if plpy.execute(f"SELECT to_regclass('pg_temp.{scratch}') IS NOT NULL AS e")[0]["e"]:
        plpy.execute(f"DROP TABLE pg_temp.{scratch}")  # left by a call this session rolled back
    kept = [column] + [q(name) for name in names if name != key.name]
    plpy.execute(f"CREATE TEMP TABLE {scratch} AS SELECT {', '.join(kept)} FROM {table.name}"
                 f"{where} ORDER BY {ordered}")
    copied = catalog.resolve_table(plpy, f"pg_temp.{scratch}")
    counted = plpy.execute(f"SELECT count(*) AS n, count(DISTINCT {column}) AS keys, "
                           f"min({ordered})::text AS first, max({ordered})::text AS last "
                           f"FROM {copied.name}")[0]
    if counted["keys"] != counted["n"]:
        twice = plpy.execute(f"SELECT {column}::text AS k FROM {copied.name} GROUP BY 1 "
                             "HAVING count(*) > 1 LIMIT 3")
        plpy.execute(f"DROP TABLE {copied.name}")
        raise MadlibMopError(
            f"key_column {key.name} of {table.name} is not unique: "
            + ", ".join(row["k"] for row in twice) + " and others" * (len(twice) == 3),
            sqlstate=errors.UNIQUE_VIOLATION,
            detail="Rows are packed in key order: two rows of one key have no order between them.",
            hint="Use a unique column (a primary key, or a timestamp with an id in a view).")
    return NewRows(copied, counted["n"], counted["first"], counted["last"])


def write_blocks(reader: SourceReader, table_name: str, encoding: Encoding, first_rank: int,
                 carried: tuple[list, list] | None, buffer_size: int, segments: int,
                 seed: int | None, write: Callable[[list], None]) -> Packed:
    """Write the blocks of rows `first_rank` on: the rows `reader` gives (in key order,
    encoded here), after `carried` (the encoded rows the last block already holds, in rank
    order).  Returns what was written."""
    per_block = segments * buffer_size
    block, held = first_rank // per_block, first_rank % per_block
    pending_x, pending_y = ([list([x]) for x in carried[0]], [list([y]) for y in carried[1]]) \
        if carried else (None, None)
    class_index = [{value: i for i, value in enumerate(label.class_values)} for label in encoding.labels]
    written = Packed({}, {}, 0, [tuple(shape) for shape in encoding.expected_shapes or []])
    for chunk_x, chunk_y in reader.chunks():
        shapes = [tuple(x.shape[1:]) for x in chunk_x]
        if not written.feature_shapes:
            written.feature_shapes = shapes
        elif shapes != written.feature_shapes:
            if encoding.expected_shapes is not None:
                raise MadlibMopError(
                    f"the features of {table_name} have shape "
                    f"{', '.join(str(list(s)) for s in shapes)}, the packed table's "
                    f"{', '.join(str(list(s)) for s in written.feature_shapes)}",
                    sqlstate=errors.DATATYPE_MISMATCH,
                    hint="New rows need the feature shape of the rows packed before.")
            raise reader.ragged(written.feature_shapes[0], shapes[0])
        codes = [encode(values, index, table_name, label) if label.as_codes else values
                 for label, index, values in zip(encoding.labels, class_index, chunk_y)]
        xs, ys = encode_rows(encoding, chunk_x, codes)
        if pending_x is None:
            pending_x, pending_y = [[] for _ in xs], [[] for _ in ys]
        for kept, values in zip(pending_x + pending_y, xs + ys):
            kept.append(values)
        held += xs[0].shape[0]
        while held >= per_block:
            xs, ys = _cut(pending_x, per_block), _cut(pending_y, per_block)
            _write_block(block, xs, ys, buffer_size, segments, seed, write, written)
            block, held = block + 1, held - per_block
    if held:
        _write_block(block, _cut(pending_x, held), _cut(pending_y, held), buffer_size, segments,
                     seed, write, written)
    return written


def _cut(pending: list[list[np.ndarray]], rows: int) -> list[np.ndarray]:
    """The first `rows` rows of each column's pending arrays, taken off them."""
    taken = []
    for arrays in pending:
        whole = np.concatenate(arrays) if len(arrays) > 1 else arrays[0]
        taken.append(whole[:rows])
        arrays[:] = [whole[rows:]] if whole.shape[0] > rows else []
    return taken


def _write_block(block: int, xs: list, ys: list, buffer_size: int, segments: int,
                 seed: int | None, write, written: Packed) -> None:
    """One block's buffers: row r of the block goes to its position (`block_positions`);
    a segment's buffer holds its positions' rows in position order."""
    positions = packing.block_positions(block, xs[0].shape[0], buffer_size, segments, seed)
    order = np.argsort(positions, kind="stable")
    segment_of = positions[order] // buffer_size
    for segment in np.unique(segment_of):
        rows = order[segment_of == segment]
        buffer_id = block * segments + int(segment)
        write(buffer_values([x[rows] for x in xs], [y[rows] for y in ys], buffer_id, int(segment)))
        written.rows_per_segment[int(segment)] = written.rows_per_segment.get(int(segment), 0) + len(rows)
        written.buffers_per_segment[int(segment)] = written.buffers_per_segment.get(int(segment), 0) + 1
        written.max_buffer_rows = max(written.max_buffer_rows, len(rows))


def carried_rows(plpy: Any, packed_table: catalog.Table, names: tuple[list[str], list[str]],
                 classification: bool, key_order: KeyOrder, segments: int,
                 seed: int | None) -> tuple[list, list] | None:
    """The rows the table's last block holds when it is not full: read back from its
    buffers as they are stored, in rank order (the inverse of `_write_block`)."""
    per_block = segments * key_order.buffer_size
    block, held = key_order.rows // per_block, key_order.rows % per_block
    if held == 0:
        return None
    q = plpy.quote_ident
    features, labels = names
    columns = [q(n) for n in features + labels] + [q(n + "_shape") for n in features + labels]
    rows = plpy.execute(plpy.prepare(
        f"SELECT {', '.join(columns)} FROM {packed_table.name} WHERE buffer_id >= $1 "
        "ORDER BY buffer_id", ["integer"]), [block * segments])
    kinds = ["<f4"] * len(features) + ["<i2" if classification else "<f4"] * len(labels)
    stored = [np.concatenate([np.frombuffer(row[n], dtype=kind)
                              .reshape(row[n + "_shape"]) for row in rows])
              for n, kind in zip(features + labels, kinds)]
    if stored[0].shape[0] != held:
        raise MadlibMopError(
            f"{packed_table.name} holds {stored[0].shape[0]} rows in its last block, its summary "
            f"says {held}", sqlstate=errors.DATA_EXCEPTION,
            hint="The packed table was changed by hand: pack the source again.")
    order = np.argsort(packing.block_positions(block, held, key_order.buffer_size, segments, seed),
                       kind="stable")
    in_rank_order = []
    for values in stored:
        ranked = np.empty_like(values)
        ranked[order] = values
        in_rank_order.append(ranked)
    return in_rank_order[:len(features)], in_rank_order[len(features):]


def delete_block(plpy: Any, packed_table: catalog.Table, key_order: KeyOrder, segments: int) -> int:
    """Delete the buffers of the last block when it is not full (`carried_rows` holds its
    rows); how many were deleted."""
    per_block = segments * key_order.buffer_size
    if key_order.rows % per_block == 0:
        return 0
    deleted = plpy.execute(plpy.prepare(f"DELETE FROM {packed_table.name} WHERE buffer_id >= $1",
                                        ["integer"]), [key_order.rows // per_block * segments])
    return deleted.nrows()


def record(plpy: Any, summary_table: str, key_order: KeyOrder) -> None:
    """Write the key order into the summary `summary_table` (an SQL name): a column only
    tables packed in key order have."""
    if not plpy.execute(plpy.prepare("SELECT 1 FROM pg_catalog.pg_attribute WHERE attrelid = $1::regclass "
                                     "AND attname = $2 AND NOT attisdropped", ["text", "text"]),
                        [summary_table, SUMMARY_COLUMN]):
        plpy.execute(f"ALTER TABLE {summary_table} ADD COLUMN {SUMMARY_COLUMN} jsonb")
    plpy.execute(plpy.prepare(f"UPDATE {summary_table} SET {SUMMARY_COLUMN} = $1", ["jsonb"]),
                 [json.dumps(key_order.as_json())])
