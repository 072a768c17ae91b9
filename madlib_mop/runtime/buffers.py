"""Packed buffers: the one decoder of a packed table's rows, and the one way to scan a
partition of it (used by the segment workers, evaluate, and replay).

A packed row holds a minibatch buffer: features as little-endian float32 bytes with their
shape, labels as int16 one-hot bytes (classification) or float32 bytes (regression); a
table packed for a model of several inputs or outputs has a feature column per input and a
label column per output.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import numpy as np


@dataclass
class Buffer:
    rows: int
    # (features, labels) of the buffer: arrays, or lists (one per input, one per output)
    load: Callable[[], tuple[Any, Any]]
    in_memory: bool = True  # False: load() reads the table
    buffer_id: int | None = None


@dataclass(frozen=True)
class PackedColumns:
    """A packed table's feature columns (one per input of the model) and label columns (one
    per output), as the summary names them."""
    features: tuple[str, ...]
    labels: tuple[str, ...]
    classification: bool
    modulus: int | None = None  # a table packed by MADlib: buffer b is on segment b % modulus

    def __post_init__(self):  # from JSON (a job's description): lists
        object.__setattr__(self, "features", tuple(self.features))
        object.__setattr__(self, "labels", tuple(self.labels))

    @property
    def several(self) -> bool:
        """A model of several inputs or outputs: features and labels decode as lists."""
        return len(self.features) > 1 or len(self.labels) > 1

    def in_partition(self, parameter: str = "$1") -> str:
        """SQL true for the rows of the partition `parameter` gives (a placeholder)."""
        return (f"__dist_key__ = {parameter}" if self.modulus is None
                else f"buffer_id % {int(self.modulus)} = {parameter}")

    def select_list(self, quote: Callable[[str], str]) -> str:
        """The columns decode() needs (x0, xs0, ... y0, ys0, ...), and the buffer's id."""
        parts = [f"{quote(name)} AS x{i}, {quote(name + '_shape')} AS xs{i}"
                 for i, name in enumerate(self.features)]
        parts += [f"{quote(name)} AS y{i}, {quote(name + '_shape')} AS ys{i}"
                  for i, name in enumerate(self.labels)]
        return ", ".join(parts + ["buffer_id"])

    def bytes_sql(self, quote: Callable[[str], str]) -> str:
        """SQL: a row's bytes of features."""
        return " + ".join(f"octet_length({quote(name)})" for name in self.features)

    def decode(self, row: Any) -> tuple:
        """(features, labels) of one row of select_list(): arrays, or lists of arrays (one
        per input, one per output) for a model of several."""
        label_dtype = "<i2" if self.classification else "<f4"
        xs = [np.frombuffer(row[f"x{i}"], dtype="<f4").reshape(row[f"xs{i}"])
              for i in range(len(self.features))]
        ys = [np.frombuffer(row[f"y{i}"], dtype=label_dtype).reshape(row[f"ys{i}"])
              for i in range(len(self.labels))]
        return (xs, ys) if self.several else (xs[0], ys[0])


def decode(row: Any, classification: bool) -> tuple[np.ndarray, np.ndarray]:
    """(features, labels) of one row with keys x, y, xs, ys (one input, one output)."""
    x = np.frombuffer(row["x"], dtype="<f4").reshape(row["xs"])
    label_dtype = "<i2" if classification else "<f4"
    return x, np.frombuffer(row["y"], dtype=label_dtype).reshape(row["ys"])


def buffer_bytes(buffer: Buffer) -> int:
    """The bytes of a buffer's decoded features and labels."""
    return sum(array.nbytes for part in buffer.load()
               for array in (part if isinstance(part, list) else [part]))


def rows_of(x) -> int:
    """The rows of a buffer's features (an array, or one per input)."""
    return len(x[0]) if isinstance(x, list) else len(x)


def in_memory(rows, columns: PackedColumns) -> list[Buffer]:
    """Buffers decoded now and kept."""
    buffers = []
    for row in rows:
        decoded = columns.decode(row)
        buffers.append(Buffer(rows_of(decoded[0]), lambda d=decoded: d, buffer_id=row["buffer_id"]))
    return buffers


def scan_partition(plpy: Any, table: str, columns: PackedColumns, partition: int,
                   budget_bytes: float = float("inf")) -> list[Buffer]:
    """A partition's buffers in buffer_id order, in PL/Python: decoded at once if they fit
    `budget_bytes`, else each read from the table when loaded.  `table` is a qualified,
    quoted name."""
    q = plpy.quote_ident
    select = columns.select_list(q)
    if budget_bytes == float("inf"):
        listing = None
    else:
        listing = plpy.execute(plpy.prepare(
            f"SELECT buffer_id, {q(columns.features[0] + '_shape')}[1] AS rows, "
            f"{columns.bytes_sql(q)} AS bytes FROM {table} "
            f"WHERE {columns.in_partition()} ORDER BY buffer_id", ["integer"]), [partition])
    if listing is None or sum(r["bytes"] for r in listing) <= budget_bytes:
        return in_memory(plpy.execute(plpy.prepare(
            f"SELECT {select} FROM {table} WHERE {columns.in_partition()} ORDER BY buffer_id",
            ["integer"]), [partition]), columns)
    plan = plpy.prepare(f"SELECT {select} FROM {table} WHERE {columns.in_partition()} AND buffer_id = $2",
                        ["integer", "integer"])
    return [Buffer(r["rows"], lambda b=r["buffer_id"]: columns.decode(
        plpy.execute(plan, [partition, b])[0]), in_memory=False,
        buffer_id=r["buffer_id"]) for r in listing]
