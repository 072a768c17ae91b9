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
from madlib_mop.preprocess.source import SourceReader, feature_columns, label_of
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
    label = label_of(plpy, table, task["dependent_varname"], given["label"] == "regression")
    if label.kind != given["label"]:
        raise MadlibMopError(
            f"the label column of {table.name} is of another kind ({label.kind}) on this segment "
            f"server than on the coordinator's ({given['label']})", sqlstate=errors.DATATYPE_MISMATCH,
            hint="Give the segment servers' tables the column types of the foreign tables.")
    label.class_values = [Decimal(v) if label.base_type == "numeric" and v is not None else v
                          for v in given["class_values"]]
    label.null_unmatched = bool(given.get("null_unmatched"))
    encoding = Encoding(label, given["classes"], given["normalizing_const"],
                        budget(plpy),
                        given["expected_shape"])
    rows = plpy.execute(f"SELECT count(*) AS n FROM {table.name}")[0]["n"]
    if rows == 0:
        raise MadlibMopError(f"{table.name} holds no rows on this segment server",
                             sqlstate=errors.DATA_EXCEPTION,
                             hint="Each segment server that gets segments needs rows to train on.")
    local = task["segments"]
    positions = (packing.shuffled_positions(rows, task["seed"]) if task["seed"] is not None
                 else np.arange(rows, dtype=np.int64))
    reader = SourceReader(plpy, table, features, label)
    q = plpy.quote_ident
    columns = (f"{q(features.packed_column)}, {q(label.name)}, {q(features.packed_column + '_shape')}, "
               f"{q(label.name + '_shape')}, buffer_id, __dist_key__")
    plans = {k: plpy.prepare(f"INSERT INTO {name} ({columns}) VALUES ($1, $2, $3, $4, $5, $6)",
                             ["bytea", "bytea", "integer[]", "integer[]", "integer", "integer"])
             for k, name in ((int(k), catalog.qualified_name(plpy, n)) for k, n in task["tables"].items())}

    def begin(feature_shape):
        layout = [dataclasses.replace(b, segment=local[b.segment])
                  for b in packing.buffer_layout(rows, task["buffer_size"], len(local),
                                                 full=task.get("full", False))]
        return layout, lambda params: plpy.execute(plans[params[5]], params), task["buffer_size"]

    packed = write_buffers(plpy, reader, table.name, rows, positions, encoding, begin)
    reader.close()
    return json.dumps({"rows": rows, "rows_per_segment": packed.rows_per_segment,
                       "buffers_per_segment": packed.buffers_per_segment,
                       "max_buffer_rows": packed.max_buffer_rows,
                       "feature_shape": list(packed.feature_shape)})
