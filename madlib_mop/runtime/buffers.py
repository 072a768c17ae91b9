"""Packed buffers: the one decoder of a packed table's rows, and the one way to scan a
partition of it (used by the segment workers, evaluate, and replay).

A packed row holds a minibatch buffer: features as little-endian float32 bytes with their
shape, labels as int16 one-hot bytes (classification) or float32 bytes (regression).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import numpy as np


@dataclass
class Buffer:
    rows: int
    load: Callable[[], tuple[np.ndarray, np.ndarray]]  # (features, labels) of the buffer
    in_memory: bool = True  # False: load() reads the table
    buffer_id: int | None = None


@dataclass(frozen=True)
class PackedColumns:
    feature: str
    label: str
    classification: bool
    modulus: int | None = None  # a table packed by MADlib: buffer b is on segment b % modulus

    def in_partition(self, parameter: str = "$1") -> str:
        """SQL true for the rows of the partition `parameter` gives (a placeholder)."""
        return (f"__dist_key__ = {parameter}" if self.modulus is None
                else f"buffer_id % {int(self.modulus)} = {parameter}")

    def select_list(self, quote: Callable[[str], str]) -> str:
        """The columns decode() needs, as x, y, xs, ys, and the buffer's id."""
        return (f"{quote(self.feature)} AS x, {quote(self.label)} AS y, "
                f"{quote(self.feature + '_shape')} AS xs, {quote(self.label + '_shape')} AS ys, buffer_id")


def decode(row: Any, classification: bool) -> tuple[np.ndarray, np.ndarray]:
    """(features, labels) of one packed row with keys x, y, xs, ys."""
    x = np.frombuffer(row["x"], dtype="<f4").reshape(row["xs"])
    label_dtype = "<i2" if classification else "<f4"
    return x, np.frombuffer(row["y"], dtype=label_dtype).reshape(row["ys"])


def in_memory(rows, classification: bool) -> list[Buffer]:
    """Buffers decoded now and kept."""
    buffers = []
    for row in rows:
        decoded = decode(row, classification)
        buffers.append(Buffer(len(decoded[0]), lambda d=decoded: d, buffer_id=row.get("buffer_id")))
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
            f"SELECT buffer_id, {q(columns.feature + '_shape')}[1] AS rows, "
            f"octet_length({q(columns.feature)}) AS bytes FROM {table} "
            f"WHERE {columns.in_partition()} ORDER BY buffer_id", ["integer"]), [partition])
    if listing is None or sum(r["bytes"] for r in listing) <= budget_bytes:
        return in_memory(plpy.execute(plpy.prepare(
            f"SELECT {select} FROM {table} WHERE {columns.in_partition()} ORDER BY buffer_id",
            ["integer"]), [partition]), columns.classification)
    plan = plpy.prepare(f"SELECT {select} FROM {table} WHERE {columns.in_partition()} AND buffer_id = $2",
                        ["integer", "integer"])
    return [Buffer(r["rows"], lambda b=r["buffer_id"]: decode(
        plpy.execute(plan, [partition, b])[0], columns.classification), in_memory=False,
        buffer_id=r["buffer_id"]) for r in listing]
