"""MADlib's converters between arrays and the bytes of its packed buffers.

MADlib stores a buffer as NumPy's `ndarray.tobytes()`: the values in row-major order (a
multi-dimensional array flattened), in the machine's byte order, 4 bytes per real (float32)
and 2 per smallint (int16), no header.  These read and write exactly that, with NumPy, as
MADlib does, so that tables packed by MADlib can be read here and the reverse.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from madlib_mop import errors
from madlib_mop.errors import MadlibMopError

DTYPES = {"real": np.float32, "smallint": np.int16}


def array_to_bytea(plpy: Any, values: list, element: str) -> bytes:
    """A real[] or smallint[] (PL/Python's nested lists for several dimensions) as bytes."""
    array = np.asarray(values, dtype=object).ravel()
    if any(value is None for value in array):
        raise MadlibMopError(
            "convert_array_to_bytea: the array holds NULL elements",
            sqlstate=errors.NULL_VALUE_NOT_ALLOWED,
            detail=f"Packed values are raw {np.dtype(DTYPES[element]).name} bytes, which have no NULL.",
            hint=f"Replace the NULLs first, e.g. with array_replace(x, NULL, 0::{element}).")
    return array.astype(DTYPES[element]).tobytes()


def bytea_to_array(plpy: Any, data: bytes, element: str) -> list:
    """Bytes of float32 or int16 values as a one-dimensional real[] or smallint[]."""
    dtype = np.dtype(DTYPES[element])
    if len(data) % dtype.itemsize:
        other = "smallint" if element == "real" else "real"
        raise MadlibMopError(
            f"convert_bytea_to_{element}_array: {len(data)} bytes are not a whole number of "
            f"{dtype.itemsize}-byte {dtype.name} values",
            sqlstate=errors.INVALID_PARAMETER_VALUE,
            hint=f"Pass the bytes of {dtype.name} values; {np.dtype(DTYPES[other]).name} bytes "
                 f"are read by convert_bytea_to_{other}_array.")
    return np.frombuffer(data, dtype=dtype).tolist()
