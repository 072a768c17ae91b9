"""Chunks of blocks for TID range scans (madlib_mop.db.scan), without a database."""

from __future__ import annotations

from madlib_mop.db import scan


def test_chunks_cover_the_blocks_once_and_end_at_the_last():
    chunks = list(scan.block_chunks(3, 10, chunk_bytes=3 * scan.BLOCK_BYTES))
    assert chunks == [("(3,0)", "(6,0)"), ("(6,0)", "(9,0)"), ("(9,0)", "(10,0)")]
    assert list(scan.block_chunks(5, 5)) == []
    assert list(scan.block_chunks(0, 2, chunk_bytes=1)) == [("(0,0)", "(1,0)"), ("(1,0)", "(2,0)")]
