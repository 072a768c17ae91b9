"""What a call needs to know of its models from Keras, computed where TensorFlow already is.

The calling session never imports TensorFlow: it would hold some 250 MB of its own memory
for the rest of the session, outside `madlib_mop.max_worker_sessions`.  It asks a worker
session of its call instead (`_mop_model_facts`, `_mop_initial_states`), or, when the
server's pool has none free, a short-lived helper process (`python -m
madlib_mop.runtime.model_facts`) that ends and returns its memory (`job.keras_work`).

- **Facts** of each configuration: its input shape, its outputs, its weights' bytes and
  parameters, and (when asked: a warm start compares them) the kinds and shapes of its state.
- **Initial states** (step 0): the same bytes `training.each_initial_state` gives, whichever
  process builds them: each model's initialisers draw from the job's seed and its mst_key.
  Written to files of a directory named by the caller (states may exceed one SQL value's
  1 GB), or returned inline (a segment server's worker: its files are on its own machine).
  A process keeps the small states it built (up to KEPT_STATES_BYTES): a job of the same
  configurations and seed gets them without building a model.

Custom losses and metrics are stand-ins here (compiling calls none, a state holds no trace of
them): nothing of an object table is unpickled.
"""

from __future__ import annotations

import gc
import hashlib
import json
import os
import re
import sys
from collections import OrderedDict
from pathlib import Path
from typing import Any

import numpy as np

from madlib_mop import errors
from madlib_mop.errors import MadlibMopError
from madlib_mop.runtime import keras_json, training
from madlib_mop.runtime.custom_functions import CustomFunctions

# Under the server's data directory (every backend's working directory); pgsql_tmp* is left
# out of base backups.  One directory per request, named by a random token of the caller.
DIRECTORY = "pgsql_tmp_madlib_mop_new_states"
TOKEN = re.compile(r"[0-9a-f]{32}")


def request_directory(token: str, root: Path | None = None) -> Path:
    """The files of one request: only a token the caller drew (hex) names it, never a path."""
    if not TOKEN.fullmatch(token or ""):
        raise MadlibMopError("initial states: not a request token", sqlstate=errors.INVALID_PARAMETER_VALUE,
                             hint="Only madlib_mop's own calls use this function.")
    return (root or Path(os.getcwd())) / DIRECTORY / token


def _specs(request: dict, weights: list[bytes | None] | None = None) -> list[training.ModelSpec]:
    recorded = request.get("custom")
    custom = CustomFunctions(recorded["name"], dict(recorded["digests"])) if recorded else None
    weights = weights or [None] * len(request["models"])
    return [training.ModelSpec(m["mst_key"], m["model_arch"], m["compile_params"], m["fit_params"],
                               None if w is None else bytes(w), custom)
            for m, w in zip(request["models"], weights)]


def facts(request: dict) -> list[dict]:
    """Per model of `request["models"]` (mst_key, model_arch, compile_params, fit_params):
    input_shapes (one per input), input_shape (None when it has several inputs), inputs,
    output_widths (the last dimension of each output), outputs (the first's), weight_bytes,
    parameters; with `request["layouts"]` also layout (its state's [kind, shape] list).
    Each architecture is built once, with zeros."""
    built: dict[str, dict] = {}
    layouts: dict[tuple, list] = {}
    answers = []
    for spec in _specs(request):
        if spec.model_arch not in built:
            model = keras_json.model_from_config(keras_json.parse_model_json(spec.model_arch),
                                                 initialised=False)
            shapes = keras_json.input_shapes(model)
            widths = [_last(shape) for shape in keras_json.each_shape(model.output_shape)]
            built[spec.model_arch] = {
                "input_shapes": shapes, "input_shape": shapes[0] if len(shapes) == 1 else None,
                "inputs": len(shapes), "output_widths": widths, "outputs": widths[0],
                "weight_bytes": sum(int(np.prod(v.shape, dtype=np.int64)) * np.dtype(v.dtype).itemsize
                                    for v in model.weights),
                "parameters": int(model.count_params())}
            del model
        answer = {"mst_key": spec.mst_key, **built[spec.model_arch]}
        if request.get("layouts"):
            if spec.program_key not in layouts:
                layouts[spec.program_key] = [[kind, list(shape)] for kind, shape in training.state_layout(spec)]
            answer["layout"] = layouts[spec.program_key]
        answers.append(answer)
    held = sum(facts["weight_bytes"] for facts in built.values())
    built.clear()
    if held >= COLLECT_AFTER_BYTES:
        gc.collect()  # (Keras' models hold cycles; a model may be GBs)
    return answers


def _last(shape: Any) -> int | None:
    return None if shape[-1] is None else int(shape[-1])


# Step-0 states this process built, newest last, up to KEPT_STATES_BYTES: a job of the same
# configurations and seed (a notebook cell run again, the next pg_cron firing, a session
# kept ready that built its role's latest job's) gets them without building its models.
KEPT_STATES_BYTES = 64 * 2**20
# A full collection frees the cycles of the Keras models built for facts or states, but in a
# worker session that has traced programs it walks all their objects: 2.2 s measured in a
# segment server's idle session that then built 64 small MLPs' states.  Below this many
# bytes of weights, the models' memory is left to the collector's own rounds.
COLLECT_AFTER_BYTES = 64 * 2**20
_kept: OrderedDict[str, bytes] = OrderedDict()
_kept_bytes = 0  # their sum


def _state_key(model: dict, seed: int, weights: bytes | None, custom: Any) -> str:
    """What a step-0 state is a function of: the configuration, its mst_key (its
    initialisers' seed), the job's seed, the initial weights, the custom functions."""
    digest = hashlib.sha256(json.dumps([{k: model[k] for k in ("mst_key", "model_arch", "compile_params",
                                                                "fit_params")}, seed, custom],
                                       sort_keys=True).encode())
    digest.update(b"-" if weights is None else hashlib.sha256(weights).digest())
    return digest.hexdigest()


def each_state(request: dict, weights: list[bytes | None] | None):
    """(mst_key, step-0 state) of each model of the request, in its order: kept ones as they
    were kept, the others built (`training.each_initial_state`: a model's state does not
    depend on which other models are built with it)."""
    global _kept_bytes
    seed, weights = int(request["seed"]), weights or [None] * len(request["models"])
    keys = [_state_key(m, seed, None if w is None else bytes(w), request.get("custom"))
            for m, w in zip(request["models"], weights)]
    specs = _specs(request, weights)
    # The kept states this request uses, taken now: the states it builds may push them out
    # of the budget before their turn.
    reused = {key: _kept[key] for key in keys if key in _kept}
    built = training.each_initial_state([s for s, k in zip(specs, keys) if k not in reused], seed)
    for spec, key in zip(specs, keys):
        if key in reused:
            if key in _kept:
                _kept.move_to_end(key)
            yield spec.mst_key, reused[key]
            continue
        mst_key, blob = next(built)
        if len(blob) <= KEPT_STATES_BYTES // 8:
            _kept[key] = bytes(blob)
            _kept_bytes += len(blob)
            while _kept_bytes > KEPT_STATES_BYTES:
                _kept_bytes -= len(_kept.popitem(last=False)[1])
        yield mst_key, blob


def initial_states(request: dict, weights: list[bytes | None] | None, token: str | None
                   ) -> tuple[list[bytes | None], list[int]]:
    """Each model's step-0 state (`training.each_initial_state`, from `request["seed"]`):
    written to `<token's directory>/<mst_key>.state` (states None), or, without a token,
    returned.  Also each state's size."""
    directory = None if token is None else request_directory(token)
    if directory is not None:
        directory.mkdir(parents=True, exist_ok=True)
    states, sizes = [], []
    for mst_key, blob in each_state(request, weights):
        sizes.append(len(blob))
        if directory is None:
            states.append(bytes(blob))
        else:
            if not directory.is_dir():  # the caller gave up (a cancel) and removed it: leave nothing
                raise MadlibMopError("initial states: the request was withdrawn",
                                     sqlstate=errors.OBJECT_NOT_IN_PREREQUISITE_STATE)
            partial = directory / f"{int(mst_key)}.state.partial"
            with open(partial, "wb") as handle:
                handle.write(blob)
            os.replace(partial, directory / f"{int(mst_key)}.state")
            states.append(None)
        del blob
    if sum(sizes) >= COLLECT_AFTER_BYTES:  # (the models built hold cycles)
        gc.collect()
    return states, sizes


def helper_main() -> None:
    """The helper process: a request as JSON on stdin ({"kind": "facts" | "states", ...};
    initial weights in `<directory>/<i>.weights`), the answer as JSON on stdout."""
    from madlib_mop.runtime.tf_runtime import import_tensorflow

    request = json.loads(sys.stdin.read())
    import_tensorflow()
    try:
        if request["kind"] == "facts":
            answer = {"facts": facts(request)}
        else:
            directory = request_directory(request["token"])
            weights = [(directory / f"{i}.weights").read_bytes() if m.get("has_weights") else None
                       for i, m in enumerate(request["models"])]
            answer = {"sizes": initial_states(request, weights, request["token"])[1]}
    except MadlibMopError as error:
        answer = {"error": {"message": error.message, "sqlstate": error.sqlstate,
                            "detail": error.detail, "hint": error.hint}}
    sys.stdout.write(json.dumps(answer))


if __name__ == "__main__":
    helper_main()
