"""The one place where PL/Python's `plpy` meets the runtime.

Each function body in `udf/` is a call `run(plpy, function, ...)`.  Runtime functions take
`plpy` as their first argument, so they can be called with any object offering the same
methods (execute, prepare, quote_ident, notice).  A `MadlibMopError` becomes a PostgreSQL
error with its SQLSTATE, DETAIL and HINT; any other exception propagates unchanged (SPI
errors keep their own SQLSTATE).
"""

from __future__ import annotations

from typing import Any, Callable

from madlib_mop.errors import MadlibMopError

_error_classes: dict[int, type] = {}


def _error_class(plpy: Any) -> type:
    """A subclass of plpy.Error that PL/Python reports as 'madlib_mop: <message>'.

    PL/Python prefixes an uncaught exception's message with its class name, qualified by
    its module unless that is `builtins`; plpy.error() would give 'plpy.Error: ...'.
    PL/Python reads sqlstate, detail and hint from the attributes of any plpy.Error.
    """
    key = id(plpy.Error)
    if key not in _error_classes:
        _error_classes[key] = type("madlib_mop", (plpy.Error,), {"__module__": "builtins"})
    return _error_classes[key]


def run(plpy: Any, function: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    # Sessions that use madlib_mop may load TensorFlow, whose LLVM cannot live next to the
    # JIT compiler's: JIT stays off in this session from now on.
    plpy.execute("SELECT set_config('jit', 'off', false)")
    try:
        return function(plpy, *args, **kwargs)
    except MadlibMopError as error:
        reported = _error_class(plpy)(error.message)
        reported.sqlstate = error.sqlstate
        if error.detail is not None:
            reported.detail = error.detail
        if error.hint is not None:
            reported.hint = error.hint
        raise reported from None
