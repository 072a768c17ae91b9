"""`materialize_features` where the rows are: a layer's features of a packed table's
segments, computed by the session of the server that holds them.

On one server the calling session computes every segment (`api.transfer`).  A packed table
whose segments lie on segment servers gets its features table on the same servers: each
server computes its own segments' features into its own partitions of the output
(`_mop_segment_materialize`, in a worker session there, as the calling role), and only
the counts come back.  Both run `compute_segment`.
"""

from __future__ import annotations

import json
import time
from typing import Any, Callable

from madlib_mop import errors
from madlib_mop.db import catalog
from madlib_mop.errors import MadlibMopError
from madlib_mop.json_values import json_value
from madlib_mop.preprocess.output import PackedOutput
from madlib_mop.runtime import staging
from madlib_mop.runtime.buffers import PackedColumns, scan_partition
from madlib_mop.segment import models
from madlib_mop.segment.models import ModelRef


def compute_segment(plpy: Any, feature_model: Any, source: str, columns: PackedColumns, segment: int,
                    first: int, insert: Callable[[list], None]) -> int:
    """The features of the segment's buffers from buffer `first` on, each inserted
    (`insert(values)`, in `PackedOutput.insert_sql`'s order): its rows.  One buffer in
    memory at a time (a budget of 0 bytes): the table may be larger than memory."""
    rows = 0
    for buffer in scan_partition(plpy, source, columns, segment, budget_bytes=0):
        if buffer.buffer_id < first:
            continue
        x, y = buffer.load()
        features = feature_model(x)
        insert([features.tobytes(), y.tobytes(), list(features.shape), list(y.shape), buffer.buffer_id, segment])
        rows += len(x)
    return rows


def feature_model(model_arch: str, weights: bytes, layer: int, threads: int | None = None) -> Any:
    """The model from its input to its layer number `layer` (in model.layers), with `weights`."""
    import keras

    model = models.build(ModelRef(None, None, model_arch, weights, None, None, 1.0, ""),
                         compile_model=False, threads=threads)
    return staging.LayerOutput(keras.Model(model.inputs, model.layers[int(layer)].output))


def materialize_segments(plpy: Any, task: Any, weights: bytes) -> str:
    """On a segment server: the features of this server's segments of the task, into their
    partitions of the output here (new tables: a table on segment servers is not packed in
    key order, so its features are never computed in part).  The coordinator sent the
    digest of the layers it means: a model that computes otherwise here is refused."""
    task = json_value(task)
    computed = feature_model(task["model_arch"], bytes(weights), task["layer"], task.get("threads"))
    if computed.digest() != task["digest"]:
        raise MadlibMopError("the layers built on this segment server differ from the coordinator's",
                             sqlstate=errors.DATA_EXCEPTION,
                             detail="The digest of their configurations and weights differs.",
                             hint="Install the same madlib_mop and Keras versions on every server.")
    x_columns, y_columns = task["columns"]
    columns = PackedColumns(x_columns, y_columns, task["classification"])
    output = PackedOutput(plpy, None, x_columns, y_columns, None)
    done = {}
    for segment, names in task["segments"].items():
        plan = plpy.prepare(*output.insert_sql(catalog.qualified_name(plpy, names["output"])))
        started = time.perf_counter()
        rows = compute_segment(plpy, computed, catalog.qualified_name(plpy, names["source"]), columns,
                               int(segment), 0, lambda values, plan=plan: plpy.execute(plan, values))
        done[segment] = {"rows": rows, "seconds": time.perf_counter() - started}
    return json.dumps({"segments": done, "feature_shape": list(computed.shape)})
