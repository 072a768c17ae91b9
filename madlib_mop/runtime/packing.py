"""Packing rows into minibatch buffers: pure logic, no database.

The preprocessor reads the source table in chunks; each chunk arrives as the output of
the float4_pack aggregate (src/float4_pack.c), which NumPy reads without a Python loop.
Rows are shuffled once by a seeded permutation and cut into buffers; buffer b lives on
segment b mod S, so segments hold buffer counts that differ by at most one.

A packed buffer stores its features as little-endian float32 bytes of shape
(rows, *feature_shape) and its labels of shape (rows, k): int16 one-hot over the class
values for classification, float32 targets for regression (`madlib_mop.runtime.buffers`
decodes both).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np


# A buffer of about this many bytes of features when the user gives no buffer_size.
DEFAULT_BUFFER_BYTES = 4 * 1024 * 1024
MAX_DEFAULT_BUFFER_ROWS = 10_000


def unpack_float4(blob: bytes, rows: int) -> np.ndarray:
    """Read the output of the float4_pack aggregate: int32 ndim, int32 dims[ndim], then
    rows * prod(dims) float32 values (the server's byte order, i.e. this process's)."""
    ndim = int(np.frombuffer(blob, dtype=np.int32, count=1)[0])
    shape = tuple(int(v) for v in np.frombuffer(blob, dtype=np.int32, count=ndim, offset=4))
    values = np.frombuffer(blob, dtype=np.float32, offset=4 * (1 + ndim))
    if values.size != rows * math.prod(shape):
        raise ValueError(f"float4_pack output holds {values.size} values, not {rows} x {shape}")
    return values.reshape((rows, *shape))


def shuffled_positions(rows: int, seed: int) -> np.ndarray:
    """position[i] = where row i (in scan order) goes in the shuffled order."""
    order = np.random.default_rng(seed).permutation(rows)
    positions = np.empty(rows, dtype=np.int64)
    positions[order] = np.arange(rows, dtype=np.int64)
    return positions


def default_buffer_size(rows: int, row_bytes: int, segments: int) -> int:
    """Rows per buffer when the user gives none: about 4 MiB of features, at most 10,000
    rows, and at least one buffer per segment."""
    by_bytes = max(1, DEFAULT_BUFFER_BYTES // max(1, row_bytes))
    return max(1, min(by_bytes, MAX_DEFAULT_BUFFER_ROWS, math.ceil(rows / segments)))


@dataclass(frozen=True)
class Buffer:
    buffer_id: int
    start: int  # first shuffled position
    stop: int  # one past the last
    segment: int

    @property
    def rows(self) -> int:
        return self.stop - self.start


def buffer_layout(rows: int, buffer_size: int, segments: int, *, full: bool = False) -> list[Buffer]:
    """Cut `rows` shuffled rows into buffers; buffer b goes to segment b mod segments.

    `full` (a buffer_size the user gave): as MADlib fills them, every buffer holds
    buffer_size rows but the last, which holds the rest (17 rows of size 5: 5, 5, 5, 2).
    Else (the default size): ceil(rows / buffer_size) buffers, raised to one per segment
    where there are rows enough, with rows spread evenly (like numpy.array_split), so no
    buffer is a small remainder.  With fewer buffers than segments, the last segments are
    empty.
    """
    if rows == 0:
        return []
    if full:
        return [Buffer(b, start, min(start + buffer_size, rows), b % segments)
                for b, start in enumerate(range(0, rows, buffer_size))]
    count = max(min(segments, rows), math.ceil(rows / buffer_size))
    base, extra = divmod(rows, count)
    layout, start = [], 0
    for buffer_id in range(count):
        stop = start + base + (1 if buffer_id < extra else 0)
        layout.append(Buffer(buffer_id, start, stop, buffer_id % segments))
        start = stop
    return layout


def keyed_buffer_size(row_bytes: int) -> int:
    """Rows per buffer of a table packed in key order when the user gives none: as
    `default_buffer_size`, but not bounded by the rows of the first packing, which a table
    that grows soon outgrows."""
    return max(1, min(DEFAULT_BUFFER_BYTES // max(1, row_bytes), MAX_DEFAULT_BUFFER_ROWS))


def block_positions(block: int, rows: int, buffer_size: int, segments: int,
                    seed: int | None) -> np.ndarray:
    """Where the first `rows` rows (in key order) of block `block` of a table packed in key
    order go: a position in the block's `segments * buffer_size` slots, of which slots
    [s * buffer_size, (s + 1) * buffer_size) are segment s's buffer.

    Row r of the table (in key order) is row r % P of block r // P (P = segments *
    buffer_size), so a row's place depends on its rank and the seed alone: packing the
    table whole, or its first rows and then the rest (`preprocessor_dl_append`), puts every
    row in the same buffer at the same place.  Training data is spread by a permutation
    seeded by (seed, block); validation data (`seed` None) fills segment 0's buffer first.
    A block that is not full yet gives each segment at most one buffer's rows more than
    another."""
    slots = segments * buffer_size
    if seed is None:
        return np.arange(rows, dtype=np.int64)
    return np.random.default_rng([int(seed), int(block)]).permutation(slots)[:rows].astype(np.int64)


def one_hot(codes: np.ndarray, classes: int) -> np.ndarray:
    """Rows of `classes` zeros with a one at each code; a code of -1 (a label that is no
    class) stays all zeros."""
    encoded = np.zeros((codes.size, classes), dtype=np.float32)
    rows = np.flatnonzero(codes >= 0)
    encoded[rows, codes[rows]] = 1.0
    return encoded
