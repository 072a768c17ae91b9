"""The byte format of a model's whole training state, the thing that hops between segments.

    b"MOPSTATE" | uint16 format version | uint32 header length | header (JSON) | arrays

The header lists every array (kind, name, dtype, shape) in order; the arrays follow, raw,
little-endian.  Kinds:
    weights    model.get_weights(), in order (MADlib's model_weights: these, as float32)
    variables  the model's other variables (e.g. random seed generator states)
    optimizer  the optimizer's variables: iteration counter, moments, ...
Decoding checks the magic, the version and the sizes; restoring into a model checks that
the layout is the model's own (`check_layout`).  Plain NumPy: the coordinator reads weights
out of a state without TensorFlow.
"""

from __future__ import annotations

import json
import math
import struct
from dataclasses import dataclass
from typing import Iterator

import numpy as np

MAGIC = b"MOPSTATE"
FORMAT_VERSION = 1
KINDS = ("weights", "variables", "optimizer")
_PREFIX = struct.Struct("<HI")
# A state goes into the table in pieces of this size: under PostgreSQL's 1 GB for one value
# or message, and small, because libpq (non-blocking, as psycopg runs it) moves what it has
# not sent yet to the front of its buffer after every partial write, which costs the
# square of one message's size over a Unix socket: 1.12 GB in pieces of 256 MB took 40.6 s
# here, of 64 MB 11.0 s, of 16 MB 5.6 s, of 4 MB 4.5 s.
PIECE_BYTES = 4 * 1024 * 1024


class StateFormatError(ValueError):
    """Bytes that are not a state of this format, or of another model."""


@dataclass
class Entry:
    kind: str
    name: str
    array: np.ndarray


def encode(entries: list[Entry], meta: dict | None = None) -> bytearray:
    """The state's bytes, each array copied once, into its place (a state may be GBs)."""
    layout, arrays = [], []
    for entry in entries:
        if entry.kind not in KINDS:
            raise ValueError(f"unknown kind {entry.kind}")
        array = np.asarray(entry.array)
        little = array.astype(array.dtype.newbyteorder("<"), copy=False)
        layout.append(layout_item(entry.kind, entry.name, little.dtype, array.shape))
        arrays.append(little)
    head = _head(layout, meta)
    blob = bytearray(len(head) + sum(a.nbytes for a in arrays))
    blob[:len(head)] = head
    offset = len(head)
    for array in arrays:
        np.frombuffer(blob, np.uint8, array.nbytes, offset)[:] = \
            np.ascontiguousarray(array).reshape(-1).view(np.uint8)
        offset += array.nbytes
    return blob


def _head(layout: list[dict], meta: dict | None) -> bytes:
    header = json.dumps({"format": FORMAT_VERSION, "layout": layout, "meta": meta or {}},
                        separators=(",", ":")).encode()
    return MAGIC + _PREFIX.pack(FORMAT_VERSION, len(header)) + header


def layout_item(kind: str, name: str, dtype: np.dtype, shape: tuple) -> dict:
    """One array's entry in the header (dtype little-endian)."""
    return {"kind": kind, "name": name, "dtype": np.dtype(dtype).newbyteorder("<").str,
            "shape": list(shape)}


def assemble(layout: list[dict], payload: bytes, meta: dict | None = None) -> bytes:
    """The bytes of a state from its header's layout and its arrays' bytes, in order."""
    return _head(layout, meta) + payload


def split(blob: bytes) -> tuple[dict, int]:
    """The header and where the arrays' bytes begin; checks the magic, the version and that
    the arrays' bytes are exactly as long as the layout says."""
    if blob[: len(MAGIC)] != MAGIC:
        raise StateFormatError("not a madlib_mop model state (bad magic)")
    version, length = _PREFIX.unpack_from(blob, len(MAGIC))
    if version != FORMAT_VERSION:
        raise StateFormatError(f"model state format {version}, this version reads {FORMAT_VERSION}")
    start = len(MAGIC) + _PREFIX.size
    header = json.loads(blob[start: start + length])
    size = sum(_nbytes(item) for item in header["layout"])
    if start + length + size > len(blob):
        raise StateFormatError("model state is truncated")
    if start + length + size < len(blob):
        raise StateFormatError("model state has trailing bytes")
    return header, start + length


def _nbytes(item: dict) -> int:
    # (math.prod of Python ints: numpy's costs more than a small state's copy at every hop)
    return math.prod(item["shape"]) * np.dtype(item["dtype"]).itemsize


def decode(blob: bytes | bytearray) -> tuple[list[Entry], dict]:
    """The arrays, as views of `blob` (not copied)."""
    header, offset = split(blob)
    entries = []
    for item in header["layout"]:
        dtype = np.dtype(item["dtype"])
        count = int(np.prod(item["shape"], dtype=np.int64))
        array = np.frombuffer(blob, dtype=dtype, count=count, offset=offset).reshape(item["shape"])
        entries.append(Entry(item["kind"], item["name"], array))
        offset += count * dtype.itemsize
    return entries, header["meta"]


def layout_of(entries: list[Entry]) -> list[tuple[str, tuple]]:
    """Kinds and shapes, in order.  Names are informative only: Keras numbers them by how
    many models a process has built (dense_3/kernel)."""
    return [(e.kind, tuple(e.array.shape)) for e in entries]


def header_layout(header: dict) -> list[tuple[str, tuple]]:
    """`layout_of` read from a header (`split`), without decoding the arrays."""
    return [(item["kind"], tuple(item["shape"])) for item in header["layout"]]


def check_layout(found: list[tuple[str, tuple]], expected: list[tuple[str, tuple]]) -> None:
    """Two layouts (`layout_of`, `header_layout`) must be the same model's."""
    if found != expected:
        raise StateFormatError("model state does not fit this model: its variables differ")


# A *head state* is a staged model's state without its frozen prefix's weights
# (`runtime.staging`), which never change: they are kept once per job and prefix, as a
# state of their own whose meta names their digest, and a head state's meta names that
# digest and where the prefix's entries go in the whole state.  Hop files of the job's own
# server may be head states; everything else (the state table, outputs, a shipped state)
# is whole, made by `compose`.
def head_meta(digest: str, entries: list[int]) -> dict:
    return {"prefix": {"digest": digest, "entries": list(entries)}}


def prefix_meta(digest: str) -> dict:
    return {"digest": digest}


def head_prefix(header: dict) -> str | None:
    """The digest of the prefix a head state (`split`'s header) leaves out; None: whole."""
    prefix = header["meta"].get("prefix")
    return None if prefix is None else str(prefix["digest"])


def left_out_prefix(blob: bytes | bytearray | memoryview) -> str | None:
    """`head_prefix` of a state's bytes; None also for bytes that are not a state (decoding
    them says what is wrong with them)."""
    if blob[:len(MAGIC)] != MAGIC:
        return None
    return head_prefix(split(blob)[0])


def compose(head: bytes | bytearray | memoryview, prefix: bytes | bytearray | memoryview) -> bytearray:
    """The whole state of a head state and its prefix's state, each array copied once."""
    head_header, head_offset = split(head)
    prefix_header, prefix_offset = split(prefix)
    meta = dict(head_header["meta"])
    where = meta.pop("prefix")
    slots = set(where["entries"])
    total = len(head_header["layout"]) + len(prefix_header["layout"])
    if (prefix_header["meta"].get("digest") != where["digest"]
            or sorted(slots) != list(where["entries"]) or len(slots) != len(prefix_header["layout"])
            or not all(0 <= int(slot) < total for slot in slots)):
        raise StateFormatError("the frozen layers' state is not the one this head state was cut from")
    sources = {False: (head, iter(head_header["layout"]), [head_offset]),
               True: (prefix, iter(prefix_header["layout"]), [prefix_offset])}
    layout, spans = [], []
    for index in range(total):
        blob, items, offset = sources[index in slots]
        item = next(items)
        layout.append(item)
        spans.append((blob, offset[0], _nbytes(item)))
        offset[0] += _nbytes(item)
    start = _head(layout, meta)
    whole = bytearray(len(start) + sum(size for _, _, size in spans))
    whole[:len(start)] = start
    position = len(start)
    for blob, offset, size in spans:
        whole[position:position + size] = memoryview(blob)[offset:offset + size]
        position += size
    return whole


WEIGHT_BYTES = 4  # a value of MADlib's model_weights: float32


def madlib_weights(blob: bytes | bytearray | memoryview) -> bytes | memoryview:
    """MADlib's model_weights: the float32 values of get_weights(), concatenated.  Weights
    come first in a state: when they are float32 already, this is a view of `blob`'s bytes
    (a state may be GBs), else a converted copy."""
    header, offset = split(blob)
    layout = header["layout"]
    count = 0
    while count < len(layout) and layout[count]["kind"] == "weights":
        count += 1
    if all(item["dtype"] == "<f4" for item in layout[:count]):
        size = sum(int(np.prod(item["shape"], dtype=np.int64)) * 4 for item in layout[:count])
        return memoryview(blob)[offset:offset + size]
    entries, _ = decode(blob)
    weights = [e.array.astype("<f4").ravel() for e in entries if e.kind == "weights"]
    return np.concatenate(weights).tobytes() if weights else b""


def pieces(blob: bytes | memoryview) -> Iterator[tuple[int, bytes]]:
    """(piece number, bytes) of a state, each at most PIECE_BYTES."""
    view = memoryview(blob)
    for number, start in enumerate(range(0, max(1, len(view)), PIECE_BYTES)):
        yield number, bytes(view[start:start + PIECE_BYTES])
