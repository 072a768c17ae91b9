"""Packing logic without a database: the float4_pack format, the shuffle, the buffer layout."""

from __future__ import annotations

import numpy as np
import pytest

from madlib_mop.runtime import packing


def _float4_pack(rows: np.ndarray) -> bytes:
    """What the float4_pack aggregate returns for these rows (header, then float32 values)."""
    shape = rows.shape[1:]
    header = np.array([len(shape), *shape], dtype=np.int32).tobytes()
    return header + rows.astype(np.float32).tobytes()


@pytest.mark.parametrize("shape", [(4,), (8, 8, 1), (2, 3)])
def test_unpack_float4_gives_back_the_rows(shape):
    rows = np.random.default_rng(0).normal(size=(5, *shape)).astype(np.float32)
    unpacked = packing.unpack_float4(_float4_pack(rows), 5)
    assert unpacked.shape == (5, *shape)
    assert np.array_equal(unpacked, rows)


def test_unpack_float4_checks_the_row_count():
    with pytest.raises(ValueError, match="not 4"):
        packing.unpack_float4(_float4_pack(np.zeros((3, 2))), 4)


def test_shuffle_is_a_seeded_permutation():
    first = packing.shuffled_positions(1000, seed=3)
    assert sorted(first.tolist()) == list(range(1000))
    assert np.array_equal(first, packing.shuffled_positions(1000, seed=3))
    assert not np.array_equal(first, packing.shuffled_positions(1000, seed=4))
    assert not np.array_equal(first, np.arange(1000))


@pytest.mark.parametrize(("rows", "buffer_size", "segments"),
                         [(150, 50, 2), (1000, 7, 3), (10, 100, 4), (5, 1, 5), (1_000_003, 10_000, 2)])
def test_buffers_cover_every_row_evenly(rows, buffer_size, segments):
    layout = packing.buffer_layout(rows, buffer_size, segments)
    assert layout[0].start == 0 and layout[-1].stop == rows
    assert all(a.stop == b.start for a, b in zip(layout, layout[1:]))
    sizes = [b.rows for b in layout]
    assert max(sizes) - min(sizes) <= 1
    assert max(sizes) <= max(buffer_size, -(-rows // segments))
    per_segment = np.bincount([b.segment for b in layout], minlength=segments)
    assert per_segment.min() >= 1 and per_segment.max() - per_segment.min() <= 1
    assert [b.buffer_id for b in layout] == list(range(len(layout)))


def test_fewer_rows_than_segments_leave_segments_empty():
    layout = packing.buffer_layout(3, 10, 4)
    assert [(b.rows, b.segment) for b in layout] == [(1, 0), (1, 1), (1, 2)]


@pytest.mark.parametrize(("rows", "size", "segments", "sizes"),
                         [(17, 5, 1, [5, 5, 5, 2]), (17, 5, 2, [5, 5, 5, 2]), (10, 5, 1, [5, 5]),
                          (3, 10, 2, [3])])
def test_a_given_buffer_size_fills_buffers_as_madlib_does(rows, size, segments, sizes):
    layout = packing.buffer_layout(rows, size, segments, full=True)
    assert [b.rows for b in layout] == sizes
    assert [b.segment for b in layout] == [b % segments for b in range(len(sizes))]
    assert layout[0].start == 0 and layout[-1].stop == rows
    assert all(a.stop == b.start for a, b in zip(layout, layout[1:]))


def test_default_buffer_size():
    # About 4 MiB of features, at most 10,000 rows, at most rows/segments.
    assert packing.default_buffer_size(1_000_000, 64 * 4, 2) == 10_000
    assert packing.default_buffer_size(1_000_000, 784 * 4, 2) == 4 * 1024 * 1024 // (784 * 4)
    assert packing.default_buffer_size(150, 16, 2) == 75


def test_one_hot():
    assert packing.one_hot(np.array([2, 0]), 4).tolist() == [[0, 0, 1, 0], [1, 0, 0, 0]]
