"""Scanning a table in chunks of physical blocks (TID range scans): the preprocessor packs
and predict reads rows this way, a bounded amount of memory at a time."""

from __future__ import annotations

from typing import Any, Iterator

CHUNK_BYTES = 32 * 1024 * 1024
BLOCK_BYTES = 8192


def table_blocks(plpy: Any, oid: int) -> int:
    """The table's size in blocks."""
    return int(plpy.execute(plpy.prepare(
        "SELECT pg_catalog.pg_relation_size($1::oid) / "
        "pg_catalog.current_setting('block_size')::bigint AS b", ["oid"]), [oid])[0]["b"])


def block_chunks(first: int, last: int, chunk_bytes: int = CHUNK_BYTES) -> Iterator[tuple[str, str]]:
    """TID bounds (lower inclusive, upper exclusive) of the chunks of blocks [first, last),
    for `WHERE ctid >= $1::tid AND ctid < $2::tid`."""
    span = max(1, chunk_bytes // BLOCK_BYTES)
    for start in range(first, last, span):
        yield f"({start},0)", f"({min(start + span, last)},0)"
