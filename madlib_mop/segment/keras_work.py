"""A worker session's answers to the Keras questions of a calling session
(`runtime.model_facts`): the caller sends the configurations, never code, and gets shapes,
sizes and step-0 states back.  The functions read no table and run as the worker session's
role (the caller's)."""

from __future__ import annotations

import contextlib
import json
import os
from typing import Any

from madlib_mop import errors
from madlib_mop.errors import MadlibMopError
from madlib_mop.runtime.state import PIECE_BYTES
from madlib_mop.json_values import json_value
from madlib_mop.runtime import model_facts as facts
from madlib_mop.runtime.tf_runtime import import_tensorflow


def model_facts(plpy: Any, request: Any) -> str:
    request = json_value(request)
    import_tensorflow(request.get("threads"))
    return json.dumps(facts.facts(request))


def initial_states(plpy: Any, request: Any, weights: list[bytes | None] | None,
                   token: str | None) -> dict:
    request = json_value(request)
    import_tensorflow(request.get("threads"))
    states, sizes = facts.initial_states(request, weights, token)
    return {"states": states, "sizes": sizes}


def initial_state_piece(plpy: Any, token: str, mst_key: int, at_byte: int) -> bytes:
    """The piece at byte `at_byte` of a step-0 state `initial_states` wrote to the files of
    request `token`: how a coordinator reads one from a segment server, whatever its size
    (a returned state is one value, at most 1 GB).  The last piece removes the file, and
    the request's folder once it is empty."""
    directory = facts.request_directory(token)
    path = directory / f"{int(mst_key)}.state"
    if int(at_byte) < 0:
        raise MadlibMopError(f"at_byte {at_byte} is negative", sqlstate=errors.INVALID_PARAMETER_VALUE,
                             hint="Only madlib_mop's own calls use this function.")
    try:
        with open(path, "rb") as handle:
            size = os.fstat(handle.fileno()).st_size
            handle.seek(int(at_byte))
            piece = handle.read(PIECE_BYTES)
    except FileNotFoundError:
        raise MadlibMopError(f"no step-0 state of model {mst_key} in request {token}",
                             sqlstate=errors.UNDEFINED_FILE,
                             hint="Only madlib_mop's own calls use this function, after "
                                  "_mop_initial_states wrote the request's states.") from None
    if int(at_byte) + len(piece) >= size:
        path.unlink(missing_ok=True)
        with contextlib.suppress(OSError):
            directory.rmdir()
    return piece
