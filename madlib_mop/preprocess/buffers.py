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
    """How rows become buffers, the same wherever they are packed: one label per output
    of the model, one feature shape per input."""
    labels: list[Label]
    classes: list[int | None]  # per label: one-hot width (None: regression targets)
    normalizing_const: float
    budget: int  # bytes of rows held at once
    expected_shapes: list | None  # validation: the training data's feature shapes

    def as_json(self) -> dict:
        return {"classes": self.classes, "normalizing_const": self.normalizing_const,
                "labels": [{"kind": label.kind,
                            # numeric's values go as text: JSON has no decimal, and a float
                            # is another value
                            "class_values": [str(v) if isinstance(v, Decimal) else v
                                             for v in label.class_values],
                            "null_unmatched": label.null_unmatched} for label in self.labels],
                "expected_shapes": self.expected_shapes}



@dataclass
class Packed:
    """What a packing wrote: per segment rows and buffers, the largest buffer, the shape of
    each input's features."""
    rows_per_segment: dict[int, int]
    buffers_per_segment: dict[int, int]
    max_buffer_rows: int
    feature_shapes: list[tuple]

    @property
    def buffers(self) -> int:
        return sum(self.buffers_per_segment.values())

    @property
    def feature_shape(self) -> tuple:
        """The first input's (the summary's feature_shape)."""
        return self.feature_shapes[0]

    @staticmethod
    def of(layout: list, feature_shapes: list) -> "Packed":
        packed = Packed({}, {}, max(b.rows for b in layout), [tuple(s) for s in feature_shapes])
        for buffer in layout:
            packed.rows_per_segment[buffer.segment] = packed.rows_per_segment.get(buffer.segment, 0) + buffer.rows
            packed.buffers_per_segment[buffer.segment] = packed.buffers_per_segment.get(buffer.segment, 0) + 1
        return packed


def write_buffers(plpy: Any, reader: SourceReader, table_name: str, rows: int,
                  positions: np.ndarray, encoding: Encoding, begin) -> Packed:
    """Read every row once per memory-sized wave, place it at its shuffled position and
    write the wave's buffers.  `begin(feature_shapes)` (at the first chunk) creates the
    output and gives (buffer layout, a function writing one buffer's row, buffer size)."""
    labels, layout, shapes, write = encoding.labels, None, None, None
    class_index = [{value: i for i, value in enumerate(label.class_values)} for label in labels]
    wave_start, wave_rows = 0, None  # wave_rows: set at the first chunk, for every wave
    while wave_start < rows:
        wave_x = wave_y = None  # the last wave's rows are let go before the next is allocated
        seen = 0
        for chunk_x, chunk_y in reader.chunks():
            n = chunk_x[0].shape[0]
            if shapes is None:
                shapes = [tuple(x.shape[1:]) for x in chunk_x]
                if encoding.expected_shapes is not None and [list(s) for s in shapes] != encoding.expected_shapes:
                    raise MadlibMopError(
                        f"the features of {table_name} have shape{'s' if len(shapes) > 1 else ''} "
                        f"{', '.join(str(list(s)) for s in shapes)}, the training data's "
                        f"{', '.join(str(s) for s in encoding.expected_shapes)}",
                        sqlstate=errors.DATATYPE_MISMATCH,
                        hint="Validation rows need the same feature shape as the training rows.")
                layout, write, buffer_size = begin(shapes)
                row_bytes = sum(4 * math.prod(shape) for shape in shapes)
                wave_rows = max(int(buffer_size), encoding.budget // max(1, row_bytes))
            else:
                for shape, x in zip(shapes, chunk_x):
                    if tuple(x.shape[1:]) != shape:
                        raise reader.ragged(shape, x.shape[1:])
            if wave_x is None:
                # The wave ends on a buffer boundary so that buffers are written whole.
                wave_stop = _wave_stop(layout, wave_start, wave_rows)
                wave_x = [np.empty((wave_stop - wave_start, *shape), dtype=np.float32) for shape in shapes]
                wave_y = [np.empty(wave_stop - wave_start, dtype=np.int64) if label.as_codes
                          else np.empty((wave_stop - wave_start, y.shape[1]), dtype=np.float32)
                          for label, y in zip(labels, chunk_y)]
            where = positions[seen: seen + n]
            mask = (where >= wave_start) & (where < wave_stop)
            for x, values in zip(wave_x, chunk_x):
                x[where[mask] - wave_start] = values[mask]
            for label, index, y, values in zip(labels, class_index, wave_y, chunk_y):
                if label.as_codes:
                    values = encode(values, index, table_name, label)
                y[where[mask] - wave_start] = values[mask]
            seen += n
        if seen != rows:
            raise MadlibMopError(f"{table_name} changed while it was being packed",
                                 sqlstate=errors.DATA_EXCEPTION,
                                 detail=f"Counted {rows} rows, then read {seen}.",
                                 hint="Pack a table that is not being written to.")
        _write_wave(layout, wave_start, wave_stop, wave_x, wave_y, encoding, write)
        wave_start = wave_stop
    return Packed.of(layout, shapes)


def _write_wave(layout: list, wave_start: int, wave_stop: int, wave_x: list, wave_y: list,
                encoding: Encoding, write) -> None:
    """Write the wave's buffers: the features of each input, then the labels of each
    output, their shapes, the buffer's id and segment.  (A function of its own: no view
    into the wave outlives it, so the next wave is not allocated while this one is still
    held.)"""
    for buffer in layout:
        if wave_start <= buffer.start < wave_stop:
            cut = slice(buffer.start - wave_start, buffer.stop - wave_start)
            xs, ys = encode_rows(encoding, [x[cut] for x in wave_x], [y[cut] for y in wave_y])
            write(buffer_values(xs, ys, buffer.buffer_id, buffer.segment))


def encode_rows(encoding: Encoding, xs: list, ys: list) -> tuple[list, list]:
    """Rows as a buffer stores them: each input's features divided by the normalizing
    constant, as little-endian float32; each output's labels one-hot as int16 (classes:
    `ys` holds their codes) or float32 targets."""
    if encoding.normalizing_const != 1.0:
        xs = [x / np.float32(encoding.normalizing_const) for x in xs]
    encoded = []
    for label, classes, y in zip(encoding.labels, encoding.classes, ys):
        if label.as_codes:
            y = packing.one_hot(y, classes).astype("<i2")
        elif label.one_hot:
            y = y.astype("<i2")
        encoded.append(y)
    return [x.astype("<f4") for x in xs], encoded


def buffer_values(xs: list, ys: list, buffer_id: int, segment: int) -> list:
    """A buffer's row, in the order `PackedOutput.insert_sql` takes it."""
    return ([x.tobytes() for x in xs] + [y.tobytes() for y in ys]
            + [list(x.shape) for x in xs] + [list(y.shape) for y in ys] + [buffer_id, segment])


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
