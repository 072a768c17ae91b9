"""Custom losses and metrics as MADlib keeps them: dill-serialised Python callables, one row
each of an object table (`load_custom_function`).

Unpickling such bytes runs whatever code they hold, as the server's operating-system user.
This module only turns bytes into callables and back; whether bytes may be unpickled at all
is decided before, from the catalog (`db.custom_functions`: who owns the table, who wrote the
row).  Checking that bytes are a pickle (`check_pickle`) runs none of their code.
"""

from __future__ import annotations

import functools
import hashlib
import io
import pickletools
from dataclasses import dataclass, field
from typing import Any, Callable

from madlib_mop import errors
from madlib_mop.errors import MadlibMopError


@dataclass(frozen=True)
class CustomFunctions:
    """The custom functions a job uses: name -> SHA-256 of its bytes (what the job recorded,
    so that a resumed job runs the same code), and, in a worker, the callables."""

    table: str  # the object table, qualified (for messages)
    digests: dict[str, str]
    objects: dict[str, Callable] = field(default_factory=dict)

    def key(self, names: tuple[str, ...]) -> tuple:
        """What of these functions a compiled program depends on."""
        return tuple((n, self.digests[n]) for n in names if n in self.digests)


def callables(custom: CustomFunctions | None, names: tuple[str, ...]) -> dict[str, Callable]:
    """name -> callable for the custom functions among `names`: the loaded object, or where
    none was loaded (the calling session builds initial states: compiling calls no loss or
    metric, and a state holds no trace of them), a stand-in that refuses to be called."""
    if custom is None:
        return {}
    return {name: custom.objects.get(name) or _not_loaded(name, custom.table)
            for name in names if name in custom.digests}


def _not_loaded(name: str, table: str) -> Callable:
    def refuse(*_: Any) -> Any:
        raise MadlibMopError(f"custom function {name!r} of {table} was not loaded here",
                             sqlstate=errors.DATA_EXCEPTION,
                             hint="Only worker sessions run custom functions; report this.")
    refuse.__name__ = name
    return refuse


def digest(blob: bytes) -> str:
    return hashlib.sha256(bytes(blob)).hexdigest()


def check_pickle(blob: bytes | None, name: str) -> None:
    """The bytes are one whole pickle (read opcode by opcode, nothing built or run):
    MADlib's 'Invalid function object' otherwise."""
    if blob is None:
        raise MadlibMopError("object is NULL: function object cannot be NULL",
                             sqlstate=errors.NULL_VALUE_NOT_ALLOWED,
                             hint="Pass dill.dumps(function) as the object.")
    stream = io.BytesIO(bytes(blob))
    try:
        for _ in pickletools.genops(stream):
            pass
        whole = stream.read() == b""
    except Exception:  # pickletools raises ValueError, and others, on bytes that are no pickle
        whole = False
    if not whole:
        raise MadlibMopError(f"the object of {name!r} is not a pickle: Invalid function object",
                             sqlstate=errors.INVALID_PARAMETER_VALUE,
                             hint="Pass the bytes of dill.dumps(function), e.g. from Python: "
                                  "psycopg with dill.dumps(my_loss) as a parameter.")


def unpickle(name: str, blob: bytes, table: str) -> Callable:
    """The callable the bytes hold.  Runs their code: only for rows `db.custom_functions`
    found written by a role allowed to run code on the server."""
    import dill

    try:
        loaded = dill.loads(bytes(blob))
    except Exception as error:
        raise MadlibMopError(f"custom function {name!r} of {table} cannot be loaded: {error}",
                             sqlstate=errors.DATA_EXCEPTION,
                             hint="Load it again from the Python version and packages of the "
                                  "server (dill.dumps in a session of the same runtime).") from None
    if not callable(loaded):
        raise MadlibMopError(f"custom function {name!r} of {table} is a {type(loaded).__name__}, "
                             "not a function", sqlstate=errors.DATA_EXCEPTION,
                             hint="Load a function of (y_true, y_pred).")
    return loaded


def top_k_accuracy(y_true: Any, y_pred: Any, k: int) -> Any:
    """Keras' top-k categorical accuracy, per row (what load_top_k_accuracy_function loads)."""
    import keras

    return keras.metrics.top_k_categorical_accuracy(y_true, y_pred, k=k)


def top_k_object(k: int) -> bytes:
    """The object load_top_k_accuracy_function stores: `top_k_accuracy` with its k, pickled
    by reference to this module (no code of its own in the bytes)."""
    import dill

    return dill.dumps(functools.partial(top_k_accuracy, k=int(k)))


def keras_metric(name: str, function: Callable) -> Any:
    """A custom metric function as a Keras metric reported under its object table name."""
    import keras

    return keras.metrics.MeanMetricWrapper(function, name=name)
