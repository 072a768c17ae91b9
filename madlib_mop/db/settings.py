"""Reading the server's and madlib_mop's settings (GUCs), one way."""

from __future__ import annotations

import os
from typing import Any

from madlib_mop import errors
from madlib_mop.errors import MadlibMopError


# The segments a default packing makes, and evaluate's and predict's parts; also what a
# prewarmed session's TensorFlow threads are sized for.
SEGMENTS = "madlib_mop.segments"


def default_segments(plpy: Any) -> int:
    """madlib_mop.segments (a bad value counts as unset), else one per CPU."""
    return whole_number(plpy, SEGMENTS, strict=False) or os.cpu_count() or 1


def setting(plpy: Any, name: str) -> str | None:
    """The setting's value in this session, None when unset or empty."""
    row = plpy.execute(plpy.prepare("SELECT pg_catalog.current_setting($1, true) AS v", ["text"]),
                       [name])[0]
    return row["v"] or None


def whole_number(plpy: Any, name: str, *, minimum: int = 1, strict: bool = True) -> int | None:
    """A setting that must be a whole number >= minimum: None when unset; a bad value
    raises (strict) or counts as unset."""
    value = setting(plpy, name)
    if value is None:
        return None
    if value.strip().isdigit() and int(value) >= minimum:
        return int(value)
    if not strict:
        return None
    raise MadlibMopError(f"setting {name} = '{value}' is not a whole number of at least {minimum}",
                         sqlstate=errors.INVALID_PARAMETER_VALUE,
                         hint=f"SET {name} = 2 (or RESET {name}).")


def worker_session_limit(plpy: Any) -> int:
    """How many worker sessions one job or prediction may open: a quarter of the server's
    connections, so that one role's work cannot take every connection slot."""
    return max(1, int(setting(plpy, "max_connections")) // 4)
