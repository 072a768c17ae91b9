"""The one place where PL/Python's `plpy` meets the runtime.

Each function body in `udf/` is a call `run(plpy, function, ...)`.  Runtime functions take
`plpy` as their first argument, so they can be called with any object offering the same
methods (execute, prepare, quote_ident, notice).  A `MadlibMopError` becomes a PostgreSQL
error with its SQLSTATE, DETAIL and HINT; any other exception propagates unchanged (SPI
errors keep their own SQLSTATE).

`run` also pins the search_path for the call, as PostgreSQL advises for extension
functions: while the runtime runs, it is `pg_catalog, pg_temp`, so no look-alike function,
operator or type in a schema of the caller's path can stand in for a built-in one (every
name of the extension is schema-qualified).  A SET clause on the function would do the same
but would hide the caller's search_path, which the user's table names are resolved against
(`caller_search_path`), and a procedure that commits cannot have one.  The pin is
transaction-local, so a procedure renews it after each commit (`renew_pin`).
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Callable, Iterator

from madlib_mop.errors import MadlibMopError

SAFE_SEARCH_PATH = "pg_catalog, pg_temp"
_error_classes: dict[int, type] = {}


@dataclass(frozen=True)
class Caller:
    """The caller's name resolution, as it was when the call began."""

    search_path: str
    current_schema: str | None


_callers: list[Caller] = []  # a stack: calls of the extension from within the extension


def caller() -> Caller | None:
    """The outermost call's name resolution (None outside a call, e.g. in unit tests)."""
    return _callers[0] if _callers else None


def _pin(plpy: Any, path: str) -> None:
    plpy.execute("SELECT pg_catalog.set_config('search_path', "
                 f"{plpy.quote_literal(path)}, true)")


def renew_pin(plpy: Any) -> None:
    """After a commit (the pin ended with its transaction)."""
    if _callers:
        _pin(plpy, SAFE_SEARCH_PATH)


@contextmanager
def caller_search_path(plpy: Any) -> Iterator[None]:
    """Run a look-up of a user's name as the caller would see it.  Only fully qualified
    built-ins may run inside (e.g. pg_catalog.to_regclass)."""
    outer = caller()
    if outer is None:
        yield
        return
    _pin(plpy, outer.search_path)
    try:
        yield
    finally:
        _pin(plpy, SAFE_SEARCH_PATH)


def run_pure(plpy: Any, function: Callable[..., Any], *args: Any) -> Any:
    """`run` for a function of its arguments alone (no SQL, no TensorFlow): IMMUTABLE and
    PARALLEL SAFE, so it may neither set settings nor pin the search_path."""
    try:
        return function(plpy, *args)
    except MadlibMopError as error:
        raise _reported(plpy, error) from None


@dataclass(frozen=True)
class SpiError:
    """What a plpy.SPIError says: PL/Python keeps the DETAIL and HINT of the error in its
    `spidata` tuple (internal position, detail, hint, ...), not in attributes."""

    sqlstate: str | None
    message: str
    detail: str | None
    hint: str | None

    @staticmethod
    def of(error: Any) -> "SpiError":
        spidata = getattr(error, "spidata", None) or ()
        return SpiError(getattr(error, "sqlstate", None),
                        str(error.args[0]) if error.args else str(error),
                        spidata[1] if len(spidata) > 1 else None,
                        spidata[2] if len(spidata) > 2 else None)


def _reported(plpy: Any, error: MadlibMopError) -> Exception:
    """The PL/Python error that reports `error` with its SQLSTATE, detail and hint."""
    reported = _error_class(plpy)(error.message)
    reported.sqlstate = error.sqlstate
    if error.detail is not None:
        reported.detail = error.detail
    if error.hint is not None:
        reported.hint = error.hint
    return reported


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
    # JIT compiler's: JIT stays off in this session from now on.  (The functions' declarations
    # also SET jit = off; a procedure, which commits, cannot: this is what covers CALLs.)
    row = plpy.execute("SELECT pg_catalog.set_config('jit', 'off', false), "
                       "pg_catalog.current_setting('search_path') AS path, "
                       "pg_catalog.current_schema() AS schema")[0]
    _callers.append(Caller(row["path"], row["schema"]))
    _pin(plpy, SAFE_SEARCH_PATH)
    try:
        return function(plpy, *args, **kwargs)
    except MadlibMopError as error:
        raise _reported(plpy, error) from None
    finally:
        _callers.pop()
        try:  # back to the caller's path (an error's rollback would restore it anyway)
            _pin(plpy, row["path"])
        except Exception:
            pass
