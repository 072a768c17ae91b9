"""Importing and configuring TensorFlow inside a server backend.

TensorFlow is imported once per backend process (PL/Python keeps the interpreter for the
life of the session), so the first call in a session pays the import and later calls do not.
"""

from __future__ import annotations

import contextlib
import gc
import os
import sys
from types import ModuleType

_configured_threads: int | None = None

# Keras imports scikit-learn (for its scikit-learn wrappers), matplotlib and OpenCV (for its
# plotting helpers), pandas (to slice data frames), IPython (to edit files in a notebook),
# and TensorFlow's own old Keras SciPy (for sparse inputs), each when it is installed, as
# they are in the runtime next to the demo and the benchmarks.  The server uses none of
# these, and they were 2.2 s of the 7.5 s the runtime's interpreter took to import
# TensorFlow and Keras on a 2-core machine (5.0 s without).  Each import is optional
# (try/except ImportError), so they are hidden while TensorFlow and Keras are first
# imported; importing them afterwards (a custom function that wants SciPy) works as usual.
OPTIONAL_EXTRAS = ("sklearn", "matplotlib", "cv2", "pandas", "IPython", "scipy")


@contextlib.contextmanager
def _without(names: tuple[str, ...]):
    hidden = [name for name in names if name not in sys.modules]
    for name in hidden:
        sys.modules[name] = None  # import raises ImportError
    try:
        yield
    finally:
        for name in hidden:
            if sys.modules.get(name, 0) is None:
                del sys.modules[name]


def configured_threads() -> int | None:
    """The intra-op threads TensorFlow runs in this process (None: not imported yet)."""
    return _configured_threads


def available_cores() -> int:
    """The cores this server may run on: those of its CPU affinity (a server pinned to some
    cores with taskset, a container's cpuset), else the machine's."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def worker_threads(segments: int) -> int:
    """A worker's threads when `segments` workers share the server's cores (1: all)."""
    return max(1, available_cores() // max(1, segments))


def import_tensorflow(threads: int | None = None) -> ModuleType:
    """Import TensorFlow with `threads` intra-op threads (default: all cores).

    The thread counts can only be set before TensorFlow runs its first operation, so the
    first call in a backend decides them for the life of that backend.
    """
    global _configured_threads
    first = "tensorflow" not in sys.modules
    if first:
        _refuse_next_to_jit()
    # The interpreter embedded in PostgreSQL has no sys.argv; absl (used by TensorFlow)
    # reads it at import.
    if not hasattr(sys, "argv"):
        sys.argv = ["postgres"]
    # TensorFlow's C++ start-up banner would land in the server log for every backend.
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    with _without(OPTIONAL_EXTRAS):
        import tensorflow as tf
        import keras  # noqa: F401  (imported by TensorFlow's own import; here under the guard)
    if first:
        # TensorFlow's and Keras' modules are some 400,000 objects that live as long as
        # the process: every full collection walked them (0.13 s each here; `model_facts`
        # collects after the facts and after the step-0 states of a job, evaluate after
        # each model).  Frozen, a collection walks what came after them.
        gc.collect()
        gc.freeze()

    if _configured_threads is None:
        wanted = threads or available_cores()
        try:
            tf.config.threading.set_intra_op_parallelism_threads(wanted)
            tf.config.threading.set_inter_op_parallelism_threads(min(2, wanted))
        except RuntimeError:
            # TensorFlow already ran in this process (a client program that imported it
            # first): its thread pools are fixed, keep them.
            wanted = tf.config.threading.get_intra_op_parallelism_threads() or wanted
        _configured_threads = wanted
    return tf


def _refuse_next_to_jit() -> None:
    """PostgreSQL's JIT compiler (llvmjit) and TensorFlow each bring their own LLVM; loaded
    into one server process they crash it, and with it every session.  A session that has
    JIT-compiled a query must not import TensorFlow."""
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as maps:
            loaded = any("llvmjit" in line for line in maps)
    except OSError:
        return
    if loaded:
        from madlib_mop import errors
        from madlib_mop.errors import MadlibMopError

        raise MadlibMopError(
            "this session has used PostgreSQL's JIT compiler, which cannot share a process "
            "with TensorFlow",
            sqlstate=errors.OBJECT_NOT_IN_PREREQUISITE_STATE,
            detail="Both bring their own LLVM; loading TensorFlow now would crash the server.",
            hint="Run the call in a new session, and turn JIT off where madlib_mop runs: "
                 "ALTER DATABASE ... SET jit = off (or jit = off in postgresql.conf).")


def make_deterministic(seed: int) -> None:
    """Seed Python, NumPy and TensorFlow and ask for deterministic kernels."""
    tf = import_tensorflow()
    import keras

    keras.utils.set_random_seed(seed)
    tf.config.experimental.enable_op_determinism()
