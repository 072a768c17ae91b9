"""Packing on a segment server: its own rows of the source into its segments' tables, as
the coordinator's `training_preprocessor_dl` asks (`_mop_pack_segment`)."""

from __future__ import annotations

import dataclasses
import json
from decimal import Decimal
from typing import Any

import numpy as np

from madlib_mop import errors
from madlib_mop.db import catalog
from madlib_mop.errors import MadlibMopError
from madlib_mop.preprocess.buffers import Encoding, budget, write_buffers
from madlib_mop.preprocess.output import PackedOutput
from madlib_mop.preprocess.source import SourceReader, feature_columns, label_columns
from madlib_mop.runtime import packing


def pack_segment(plpy: Any, task: str) -> str:
    """On a segment server: pack this server's rows of the source into its segments' tables
    (`_pack_where_it_lies`)."""
    task = json.loads(task)
    names = [catalog.qualified_name(plpy, pair) for pair in task["source"]]
    if len(names) == 1:
        table = catalog.resolve_table(plpy, names[0])
    else:  # several partitions here: read as one
        plpy.execute("DROP VIEW IF EXISTS pg_temp.madlib_mop_segment_source")
        plpy.execute("CREATE TEMP VIEW madlib_mop_segment_source AS "
                     + " UNION ALL ".join(f"SELECT * FROM {catalog.resolve_table(plpy, n).name}"
                                          for n in names))
        table = catalog.resolve_table(plpy, "pg_temp.madlib_mop_segment_source")
    features = feature_columns(plpy, table, task["independent_varname"])
    given = task["encoding"]
    labels = label_columns(plpy, table, task["dependent_varname"],
                           given["labels"][0]["kind"] == "regression")
    for label, said in zip(labels, given["labels"]):
        if label.kind != said["kind"]:
            raise MadlibMopError(
                f"the label column {label.name} of {table.name} is of another kind ({label.kind}) "
                f"on this segment server than on the coordinator's ({said['kind']})",
                sqlstate=errors.DATATYPE_MISMATCH,
                hint="Give the segment servers' tables the column types of the foreign tables.")
        label.class_values = [Decimal(v) if label.base_type == "numeric" and v is not None else v
                              for v in said["class_values"]]
        label.null_unmatched = bool(said.get("null_unmatched"))
    encoding = Encoding(labels, given["classes"], given["normalizing_const"], budget(plpy),
                        given["expected_shapes"])
    rows = plpy.execute(f"SELECT count(*) AS n FROM {table.name}")[0]["n"]
    if rows == 0:
        raise MadlibMopError(f"{table.name} holds no rows on this segment server",
                             sqlstate=errors.DATA_EXCEPTION,
                             hint="Each segment server that gets segments needs rows to train on.")
    local = task["segments"]
    positions = (packing.shuffled_positions(rows, task["seed"]) if task["seed"] is not None
                 else np.arange(rows, dtype=np.int64))
    reader = SourceReader(plpy, table, features, labels)
    output = PackedOutput(plpy, None, [f.packed_column for f in features],
                          [label.name for label in labels], None)
    plans = {k: plpy.prepare(*output.insert_sql(name))
             for k, name in ((int(k), catalog.qualified_name(plpy, n)) for k, n in task["tables"].items())}

    def begin(feature_shapes):
        layout = [dataclasses.replace(b, segment=local[b.segment])
                  for b in packing.buffer_layout(rows, task["buffer_size"], len(local),
                                                 full=task.get("full", False))]
        return layout, lambda params: plpy.execute(plans[params[-1]], params), task["buffer_size"]

    packed = write_buffers(plpy, reader, table.name, rows, positions, encoding, begin)
    reader.close()
    return json.dumps({"rows": rows, "rows_per_segment": packed.rows_per_segment,
                       "buffers_per_segment": packed.buffers_per_segment,
                       "max_buffer_rows": packed.max_buffer_rows,
                       "feature_shapes": [list(shape) for shape in packed.feature_shapes]})
