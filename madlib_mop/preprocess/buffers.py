"""Writing buffers: rows placed at their shuffled positions, one memory-sized wave at a
time, cut into buffers of float32 features and int16 one-hot (or float32) labels."""

from __future__ import annotations

import math
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

import numpy as np

from madlib_mop import errors
from madlib_mop.db import settings
from madlib_mop.errors import MadlibMopError
from madlib_mop.preprocess.source import Label, SourceReader, encode
from madlib_mop.runtime import packing


DEFAULT_MEMORY_MB = 1024


MEMORY_SETTING = "madlib_mop.preprocessor_memory_mb"


def budget(plpy: Any) -> int:
    """Bytes of rows a packing holds at once (madlib_mop.preprocessor_memory_mb)."""
    return (settings.whole_number(plpy, MEMORY_SETTING) or DEFAULT_MEMORY_MB) * 1024 * 1024



@dataclass
class Encoding:
    """How rows become buffers, the same wherever they are packed."""
    label: Label
    classes: int | None
    normalizing_const: float
    budget: int  # bytes of rows held at once
    expected_shape: list | None  # validation: the training data's feature shape

    def as_json(self) -> dict:
        return {"classes": self.classes, "normalizing_const": self.normalizing_const,
                "label": self.label.kind,
                # numeric's values go as text: JSON has no decimal, and a float is another value
                "class_values": [str(v) if isinstance(v, Decimal) else v
                                 for v in self.label.class_values],
                "null_unmatched": self.label.null_unmatched,
                "expected_shape": self.expected_shape}



@dataclass
class Packed:
    """What a packing wrote: per segment rows and buffers, the largest buffer, the shape."""
    rows_per_segment: dict[int, int]
    buffers_per_segment: dict[int, int]
    max_buffer_rows: int
    feature_shape: tuple

    @property
    def buffers(self) -> int:
        return sum(self.buffers_per_segment.values())

    @staticmethod
    def of(layout: list, feature_shape: tuple) -> "Packed":
        packed = Packed({}, {}, max(b.rows for b in layout), tuple(feature_shape))
        for buffer in layout:
            packed.rows_per_segment[buffer.segment] = packed.rows_per_segment.get(buffer.segment, 0) + buffer.rows
            packed.buffers_per_segment[buffer.segment] = packed.buffers_per_segment.get(buffer.segment, 0) + 1
        return packed


def write_buffers(plpy: Any, reader: SourceReader, table_name: str, rows: int,
                  positions: np.ndarray, encoding: Encoding, begin) -> Packed:
    """Read every row once per memory-sized wave, place it at its shuffled position and
    write the wave's buffers.  `begin(feature_shape)` (at the first chunk) creates the output
    and gives (buffer layout, a function writing one buffer's row, buffer size)."""
    label, layout, feature_shape, write = encoding.label, None, None, None
    class_index = {value: i for i, value in enumerate(label.class_values)}
    wave_start, wave_rows = 0, None  # wave_rows: set at the first chunk, for every wave
    while wave_start < rows:
        wave_x = wave_y = None  # the last wave's rows are let go before the next is allocated
        seen = 0
        for chunk_x, chunk_y in reader.chunks():
            n = chunk_x.shape[0]
            if feature_shape is None:
                feature_shape = tuple(chunk_x.shape[1:])
                if encoding.expected_shape is not None and list(feature_shape) != encoding.expected_shape:
                    raise MadlibMopError(
                        f"the features of {table_name} have shape {list(feature_shape)}, "
                        f"the training data's {encoding.expected_shape}",
                        sqlstate=errors.DATATYPE_MISMATCH,
                        hint="Validation rows need the same feature shape as the training rows.")
                layout, write, buffer_size = begin(feature_shape)
                wave_rows = max(int(buffer_size), encoding.budget // max(1, 4 * math.prod(feature_shape)))
            elif tuple(chunk_x.shape[1:]) != feature_shape:
                raise reader.ragged(feature_shape, chunk_x.shape[1:])
            if wave_x is None:
                # The wave ends on a buffer boundary so that buffers are written whole.
                wave_stop = _wave_stop(layout, wave_start, wave_rows)
                wave_x = np.empty((wave_stop - wave_start, *feature_shape), dtype=np.float32)
                wave_y = (np.empty(wave_stop - wave_start, dtype=np.int64) if label.as_codes
                          else np.empty((wave_stop - wave_start, chunk_y.shape[1]), dtype=np.float32))
            where = positions[seen: seen + n]
            mask = (where >= wave_start) & (where < wave_stop)
            wave_x[where[mask] - wave_start] = chunk_x[mask]
            if label.as_codes:
                codes = encode(chunk_y, class_index, table_name, label)
                wave_y[where[mask] - wave_start] = codes[mask]
            else:
                wave_y[where[mask] - wave_start] = chunk_y[mask]
            seen += n
        if seen != rows:
            raise MadlibMopError(f"{table_name} changed while it was being packed",
                                 sqlstate=errors.DATA_EXCEPTION,
                                 detail=f"Counted {rows} rows, then read {seen}.",
                                 hint="Pack a table that is not being written to.")
        _write_wave(layout, wave_start, wave_stop, wave_x, wave_y, encoding, feature_shape, write)
        wave_start = wave_stop
    return Packed.of(layout, feature_shape)


def _write_wave(layout: list, wave_start: int, wave_stop: int, wave_x: np.ndarray,
                wave_y: np.ndarray, encoding: Encoding, feature_shape: tuple, write) -> None:
    """Write the wave's buffers.  (A function of its own: no view into the wave outlives
    it, so the next wave is not allocated while this one is still held.)"""
    label = encoding.label
    for buffer in layout:
        if wave_start <= buffer.start < wave_stop:
            x = wave_x[buffer.start - wave_start: buffer.stop - wave_start]
            y = wave_y[buffer.start - wave_start: buffer.stop - wave_start]
            if encoding.normalizing_const != 1.0:
                x = x / np.float32(encoding.normalizing_const)
            if label.as_codes:
                y = packing.one_hot(y, encoding.classes).astype("<i2")
            elif label.one_hot:
                y = y.astype("<i2")
            write([x.astype("<f4").tobytes(), y.tobytes(), [buffer.rows, *feature_shape],
                   list(y.shape), buffer.buffer_id, buffer.segment])


def _wave_stop(layout: list, wave_start: int, wave_rows: int) -> int:
    """The end of the wave that starts at `wave_start`: whole buffers, at most `wave_rows`
    rows unless one buffer alone is larger."""
    stop = wave_start
    for buffer in layout:
        if buffer.start < wave_start:
            continue
        if stop > wave_start and buffer.stop - wave_start > wave_rows:
            break
        stop = buffer.stop
    return stop
