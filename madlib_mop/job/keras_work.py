"""The calling session's Keras questions, answered without importing TensorFlow here.

A call needs Keras for a few things before and while its workers train: each
configuration's input shape and outputs (checked against the data), its weights' size (the
memory estimate and the `_info` table), its state's layout (a warm start), and each
model's step-0 state.  Imported in the calling session, TensorFlow would stay there for the
rest of the session: some 250 MB that `madlib_mop.max_worker_sessions` does not count.

So they are asked (`runtime.model_facts`) of:
1. a worker session of the call (`ask`): the job's own, whose TensorFlow is being imported
   anyway while the job is created; for evaluate, predict, steering and load_keras_model an
   idle one of the role, else one opened on a free slot and left idle afterwards;
2. else (the server's pool has no free session for this call yet), a helper process of
   the server's Python (`python -m madlib_mop.runtime.model_facts`), which ends when it
   has answered and gives its memory back.

Facts are kept for the session (by architecture text, and program for layouts): a
session's next call on the same architectures asks nobody.  States are deterministic
(drawn from the job's seed and the mst_key), so where they are built does not change them.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

import psycopg

import madlib_mop
from madlib_mop import errors
from madlib_mop.engine.base import Worker, as_error
from madlib_mop.db import settings
from madlib_mop.engine import server_slots
from madlib_mop.engine.local import LocalEngine
from madlib_mop.errors import MadlibMopError
from madlib_mop.runtime import training
from madlib_mop.runtime.model_facts import request_directory

# (architecture text) -> its facts; (program key) -> its state's layout.  Small values.
_facts: dict[str, dict] = {}
_layouts: dict[tuple, list] = {}
KEPT_FACTS = 256
HELPER_SECONDS = 600


class KerasWork:
    """Where this call's Keras questions go.  `ask(call)`: runs call(worker) on one worker
    session of the call and returns its value (None: no worker; the helper process
    answers); `shares_files`: that worker writes to this server's data directory;
    `poll`: run while waiting, so that a cancel of the call takes effect; `ask_each(calls_for)`
    (a job's): calls_for(n) gives n calls, one for each of n of the call's workers (those
    running nothing now, or all when every one is busy), which run them at once; their
    values in order (None: no worker)."""

    def __init__(self, ask: Callable[[Callable[[Worker], Any]], Any] | None,
                 shares_files: bool = True, poll: Callable[[], None] = lambda: None,
                 ask_each: Callable[[Callable[[int], list]], list | None] | None = None):
        self.ask, self.shares_files, self.poll, self.ask_each = ask, shares_files, poll, ask_each

    @classmethod
    def for_job(cls, pool_of: Callable[[], Any], engine: Any, plpy: Any) -> "KerasWork":
        """A job's: the first live worker of its pool (`pool_of()`, an `engine.pool.WorkerPool`
        or None) while it has one, for step-0 states its ready workers at once (`ask_each`),
        else the helper process."""
        poll = lambda: plpy.execute("SELECT 1")  # noqa: E731  (a cancel of the call takes effect)

        def ask(call):
            pool = pool_of()
            return pool.call(call, poll) if pool is not None and pool.live() else None

        def ask_each(calls_for):
            pool = pool_of()
            ready = pool.ready() if pool is not None else []
            return pool.call_each(calls_for(len(ready)), poll, ready) if ready else None
        return cls(ask, engine.shares_files, poll, ask_each)

    def _asked(self, call: Callable[[Worker], Any]) -> tuple[bool, Any]:
        """(answered, value): a worker's answer, or not answered (no worker, or it was lost)."""
        return self._answered(None if self.ask is None else lambda: self.ask(call))

    def _answered(self, asking: Callable[[], Any] | None) -> tuple[bool, Any]:
        """(answered, value) of asking(): not answered when there is nobody to ask, no
        worker, or a worker's session was lost (the helper process then answers)."""
        if asking is None:
            return False, None
        try:
            value = asking()
        except psycopg.OperationalError:  # the session was lost: the helper answers
            return False, None
        except MadlibMopError:
            raise
        except Exception as error:  # an error the worker reported (its SQLSTATE kept)
            raise as_error(error, "See the server log.") from None
        return value is not None, value

    # ---- facts -----------------------------------------------------------------------

    def facts(self, configs: Iterable[dict], custom: dict | None = None,
              layouts: bool = False) -> dict[int, dict]:
        """mst_key -> input_shape, inputs, outputs, weight_bytes, parameters (and layout)."""
        configs = list(configs)
        specs = {c["mst_key"]: training.ModelSpec.of(c) for c in configs}
        missing = [c for c in configs if c["model_arch"] not in _facts
                   or (layouts and specs[c["mst_key"]].program_key not in _layouts)]
        if missing:
            request = {"models": [_model(c) for c in missing], "custom": custom, "layouts": layouts}
            answered, found = self._asked(lambda worker: worker.model_facts(request))
            if not answered:
                found = self._helper({"kind": "facts", **request})["facts"]
            for config, answer in zip(missing, found):
                _keep(_facts, config["model_arch"], {k: v for k, v in answer.items()
                                                     if k not in ("mst_key", "layout")})
                if layouts:
                    _keep(_layouts, specs[config["mst_key"]].program_key, answer["layout"])
        return {key: dict(_facts[spec.model_arch], mst_key=key,
                          **({"layout": _layouts[spec.program_key]} if layouts else {}))
                for key, spec in specs.items()}

    # ---- initial states ----------------------------------------------------------------

    def initial_states(self, specs: list[training.ModelSpec], seed: int) -> Iterator[tuple[int, bytes]]:
        """(mst_key, step-0 state) of each spec in turn, in the specs' order (one state held
        at a time: a state may be GBs)."""
        if not specs:
            return
        custom = specs[0].custom
        request = {"models": [_model(vars(s)) for s in specs], "seed": int(seed),
                   "custom": None if custom is None else {"name": custom.table, "digests": custom.digests}}
        weights = [s.initial_weights for s in specs]
        if not self.shares_files and self.ask is not None:
            # A segment server's worker: its files are not ours; one state per answer.
            for index, spec in enumerate(specs):
                one = {**request, "models": [request["models"][index]]}
                answered, value = self._asked(lambda w, one=one, i=index: w.initial_states(one, [weights[i]], None))
                if not answered:
                    break
                yield spec.mst_key, value[0][0]
            else:
                return
            specs, request, weights = specs[index:], {**request, "models": request["models"][index:]}, weights[index:]
        token = secrets.token_hex(16)
        directory = request_directory(token)
        try:
            if self.shares_files:
                self._built_by_workers(request, weights, token, [s.program_key for s in specs])
            # A state's file is there once whole: the helper builds what no worker did (no
            # worker, or one whose session was lost).
            missing = [i for i, s in enumerate(specs) if not (directory / f"{int(s.mst_key)}.state").exists()]
            if missing:
                self._built_by_helper(request, weights, token, missing)
            for spec in specs:
                path = directory / f"{int(spec.mst_key)}.state"
                blob = path.read_bytes()
                path.unlink()
                yield spec.mst_key, blob
                del blob
        finally:
            shutil.rmtree(directory, ignore_errors=True)

    def _built_by_workers(self, request: dict, weights: list[bytes | None], token: str,
                          program_keys: list[tuple]) -> None:
        """The request's states built into the token's directory by the call's workers, each
        building a share at once (a job's workers), or by one."""
        def calls_for(workers: int) -> list[Callable[[Worker], Any]]:
            costs = [_facts.get(m["model_arch"], {}).get("weight_bytes", 1) for m in request["models"]]
            return [lambda worker, share=share: worker.initial_states(
                        {**request, "models": [request["models"][i] for i in share]},
                        [weights[i] for i in share], token)
                    for share in _shares(costs, program_keys, workers)]
        if self.ask_each is not None and len(request["models"]) > 1:
            self._answered(lambda: self.ask_each(calls_for))
        else:
            self._asked(lambda worker: worker.initial_states(request, weights, token))

    def _built_by_helper(self, request: dict, weights: list[bytes | None], token: str,
                         indexes: list[int]) -> None:
        """The states of the request's models at `indexes` built by a helper process."""
        directory = request_directory(token)
        directory.mkdir(parents=True, exist_ok=True)
        for position, index in enumerate(indexes):
            if weights[index] is not None:
                (directory / f"{position}.weights").write_bytes(weights[index])
        self._helper({"kind": "states", "token": token, **request,
                      "models": [dict(request["models"][i], has_weights=weights[i] is not None)
                                 for i in indexes]})

    # ---- the helper process ------------------------------------------------------------

    def _helper(self, request: dict) -> dict:
        """The answer of a helper process (the server's Python, this session's sys.path)."""
        # Where this package is (an editable install's folder is on no sys.path entry: a
        # finder of a .pth file maps it), then the session's sys.path (the runtime's site).
        package = str(Path(madlib_mop.__file__).resolve().parents[1])
        environment = dict(os.environ, PYTHONPATH=os.pathsep.join([package, *(p for p in sys.path if p)]),
                           TF_CPP_MIN_LOG_LEVEL="2")
        process = subprocess.Popen([interpreter(), "-m", "madlib_mop.runtime.model_facts"],
                                   stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                   stderr=subprocess.PIPE, env=environment)
        try:
            out, err = _communicate(process, json.dumps(request).encode(), self.poll)
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()
        if process.returncode != 0:
            raise MadlibMopError(
                "the helper process that reads the models with Keras failed",
                sqlstate=errors.EXTERNAL_ROUTINE_EXCEPTION,
                detail=err.decode(errors="replace")[-1500:],
                hint="Check that the server's Python can import madlib_mop and TensorFlow "
                     "(SELECT madlib_mop_runtime_check()).")
        answer = json.loads(out)
        if "error" in answer:
            raise MadlibMopError(answer["error"]["message"], sqlstate=answer["error"]["sqlstate"],
                                 detail=answer["error"]["detail"], hint=answer["error"]["hint"])
        return answer


def _shares(costs: list[int], program_keys: list[tuple], workers: int) -> list[list[int]]:
    """The models' indexes in at most `workers` shares of about equal building time (by
    their weights' size, largest first to the least loaded).  The models of one program
    key stay together where there are keys enough for every worker: a worker compiles a
    key's first model, then builds the others' from it for less."""
    count = max(1, min(workers, len(costs)))
    by_key: dict[tuple, list[int]] = {}
    for index, key in enumerate(program_keys):
        by_key.setdefault(key, []).append(index)
    units = list(by_key.values()) if len(by_key) >= count else [[i] for i in range(len(costs))]
    shares: list[list[int]] = [[] for _ in range(count)]
    loads = [0] * count
    for unit in sorted(units, key=lambda u: -sum(costs[i] for i in u)):
        least = loads.index(min(loads))
        shares[least] += unit
        loads[least] += sum(costs[i] for i in unit)
    return [sorted(share) for share in shares]


@contextlib.contextmanager
def for_session(plpy: Any) -> Iterator[KerasWork]:
    """A call without a job's pool (evaluate, predict, steering, load_keras_model): an idle
    session of the role (TensorFlow imported), else a new one on a slot free now, given
    back to idleness afterwards: a script's next catalog call, and the role's next job, find
    it warm (a helper process would import TensorFlow again for each call).  With no slot
    free, or `madlib_mop.worker_idle_seconds = 0` (nothing kept), the helper process."""
    engine = LocalEngine(plpy, say_cap=False)
    label = "madlib_mop worker"
    workers = engine.idle_workers(1, label)
    if not workers and engine.idle_seconds and not server_slots.waiting_calls(plpy):
        workers = engine.new_workers(1, 0, label)
        # TensorFlow's threads are those of a job of the default segments (as a prewarmed
        # session's): such a job adopts the session afterwards.
        for worker in workers:
            worker.warm_up(settings.default_segments(plpy))
    poll = lambda: plpy.execute("SELECT 1")  # noqa: E731
    try:
        yield KerasWork((lambda call: call(workers[0])) if workers else None, True, poll)
    finally:
        engine.keep_inference(workers)


def _communicate(process: subprocess.Popen, data: bytes, poll: Callable[[], None]) -> tuple[bytes, bytes]:
    """The process's output; `poll` runs every half second (a cancel interrupts the wait)."""
    waited = 0.0
    while True:
        try:
            return process.communicate(data, timeout=0.5)
        except subprocess.TimeoutExpired:
            data = None
            waited += 0.5
            if waited > HELPER_SECONDS:
                raise MadlibMopError("the helper process did not answer within "
                                     f"{HELPER_SECONDS} s", sqlstate=errors.EXTERNAL_ROUTINE_EXCEPTION,
                                     hint="See the server log.") from None
            poll()


def interpreter() -> str:
    """The Python the server runs (PL/Python's), as a program."""
    if Path(sys.executable).name.startswith("python"):
        return sys.executable
    return str(Path(sys.base_exec_prefix) / "bin" / f"python{sys.version_info[0]}.{sys.version_info[1]}")


def _model(config: dict) -> dict:
    return {k: config[k] for k in ("mst_key", "model_arch", "compile_params", "fit_params")}


def _keep(kept: dict, key: Any, value: Any) -> None:
    if len(kept) >= KEPT_FACTS:
        kept.pop(next(iter(kept)))
    kept[key] = value
