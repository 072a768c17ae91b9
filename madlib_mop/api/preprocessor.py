"""training_preprocessor_dl and validation_preprocessor_dl (MADlib's API).

The source table is read once per memory-sized wave, in chunks of physical blocks (TID range
scans): each chunk comes back as one row whose features are the concatenated binary form of
the rows' real[] arrays, decoded by NumPy (no Python object per row).  Rows are placed by
a seeded permutation (training) or in scan order (validation), cut into buffers, and
written to a table partitioned by segment: one partition per segment.

Packed table (MADlib 1.18+ column names, plus the segment key):
    __dist_key__ int        segment of the buffer (the partition key)
    <x> bytea               float32 features, shape <x>_shape = {rows, *feature_shape}
    <y> bytea               int16 one-hot labels (classification) or float32 targets
    <x>_shape, <y>_shape    integer[]
    buffer_id int
<x> is the feature column's name (`independent_var` in tables of madlib_mop 0.5, which
packed several scalar columns into one vector); <y> is the label column's name.  For a model
of several inputs or outputs ('a, b' and 'y1, y2', MADlib 2's meaning) each column is packed
into its own pair (<a>, <a>_shape, ...), in the order named.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
import time
from typing import Any

import numpy as np
from psycopg.types.json import Jsonb

from madlib_mop import errors
from madlib_mop.db import catalog, segments
from madlib_mop.db.packed import lock_for_change, packed_columns, read_summary
from madlib_mop.engine.cluster import on_server
from madlib_mop.engine.pool import run_all
from madlib_mop.errors import MadlibMopError
from madlib_mop.preprocess.buffers import Encoding, Packed, budget, write_buffers
from madlib_mop.preprocess import keyed
from madlib_mop.preprocess.output import PackedOutput, segment_count, segment_homes, write_summary
from madlib_mop.preprocess.source import (FLOAT_TYPES, MANY_FLOAT_CLASSES, Features, SourceReader,
                                          check_num_classes, check_positive, class_count,
                                          class_values_of, feature_columns, label_columns,
                                          as_text, one_hot_positions)
from madlib_mop.runtime import packing


def training_preprocessor_dl(plpy: Any, source_table: str, output_table: str,
                             dependent_varname: str, independent_varname: str,
                             buffer_size: int | None = None, normalizing_const: float | None = 1.0,
                             num_classes: list[int] | None = None,
                             distribution_rules: str | None = None, seed: int | None = 0,
                             regression: bool | None = False, key_column: str | None = None) -> None:
    _preprocess(plpy, "training_preprocessor_dl", source_table, output_table, dependent_varname,
                independent_varname, buffer_size, normalizing_const, num_classes,
                distribution_rules, seed=0 if seed is None else seed, training=None,
                regression=bool(regression), key_column=key_column)


def validation_preprocessor_dl(plpy: Any, source_table: str, output_table: str,
                               dependent_varname: str, independent_varname: str,
                               training_preprocessor_table: str, buffer_size: int | None = None,
                               distribution_rules: str | None = None,
                               key_column: str | None = None) -> None:
    training = read_summary(plpy, training_preprocessor_table,
                            argument="training_preprocessor_table")
    _preprocess(plpy, "validation_preprocessor_dl", source_table, output_table, dependent_varname,
                independent_varname, buffer_size, training["normalizing_const"],
                training["num_classes"], distribution_rules, seed=None, training=training,
                regression=training["label_kind"] == "regression", key_column=key_column)


def _preprocess(plpy, module, source_table, output_table, dependent_varname, independent_varname,
                buffer_size, normalizing_const, num_classes, distribution_rules, seed, training,
                regression, key_column):
    started = time.perf_counter()
    table = catalog.resolve_table(plpy, source_table)
    out = catalog.new_table(plpy, output_table, argument="output_table")
    summary_table = out.sibling("_summary", plpy)
    out.must_not_exist(plpy)
    summary_table.must_not_exist(plpy)
    features = feature_columns(plpy, table, independent_varname)
    labels = label_columns(plpy, table, dependent_varname, regression)
    _check_columns(features, labels, training, num_classes)
    check_positive(buffer_size, "buffer_size")
    check_positive(normalizing_const, "normalizing_const")
    if normalizing_const is None:
        normalizing_const = 1.0
    homes = segment_homes(plpy, distribution_rules, training)
    key = _key(plpy, table, key_column)
    segment_total = _segment_total(plpy, distribution_rules, training, homes)

    lying = _source_on_segment_servers(plpy, table, homes, training is None)
    if lying is not None:
        if training is None:  # the segments of the servers with rows
            homes = [home for home in homes if home.name in lying]
            segment_total = len(homes)
        # Counts and class values are computed on the segment servers: no row comes here.
        partitionwise = plpy.execute("SELECT current_setting('enable_partitionwise_aggregate') AS v, "
                                     "set_config('enable_partitionwise_aggregate', 'on', true)")[0]["v"]
    rows = plpy.execute(f"SELECT count(*) AS n FROM {table.name}")[0]["n"]
    if rows == 0:
        raise MadlibMopError(f"source_table: Input table '{table.name}' is empty",
                             sqlstate=errors.DATA_EXCEPTION, hint="Load rows into it first.")

    classes = [_classes(plpy, table, label, num_classes, training, rows, k)
               for k, label in enumerate(labels)]
    if lying is not None:
        plpy.execute(plpy.prepare("SELECT set_config('enable_partitionwise_aggregate', $1, true)",
                                  ["text"]), [partitionwise])

    encoding = Encoding(labels, classes, float(normalizing_const), budget(plpy),
                        training["input_shapes"] if training is not None else None)
    summary = functools.partial(write_summary, plpy, summary_table, source_table, output_table,
                                labels, features)
    def summarize(packed, size):
        summary(size, normalizing_const, classes, distribution_rules, segment_total, rows, packed,
                seed)
        if key is not None:
            keyed.record(plpy, summary_table.quoted, keyed.KeyOrder(
                key.name, key.type, ordered.last, rows, size, training is None))

    ordered = None if key is None else _in_key_order(plpy, table, key, features, labels, rows)
    try:
        packed = _pack(plpy, table, out, features, labels, homes, lying, encoding, rows,
                       seed if training is None else None, buffer_size, segment_total,
                       dependent_varname, independent_varname, summarize, ordered)
    finally:
        if ordered is not None:
            ordered.drop(plpy)
    where = "" if homes is None else f" on {len({h.name for h in homes})} segment servers"
    how = "" if lying is None else ", each server packing its own rows"
    how += "" if key is None else f", in order of {key.name} (up to {ordered.last})"
    plpy.notice(f"{module}: packed {rows} rows of {table.name} into {packed.buffers} buffers on "
                f"{segment_total} segments{where}{how} in {out.quoted} "
                f"({time.perf_counter() - started:.1f}s)")


def _check_columns(features: list[Features], labels: list, training: dict | None,
                   num_classes: list | None) -> None:
    """As many columns as the training data's (validation), num_classes one per label, and
    no two of the packed table's column names alike."""
    if training is None:
        check_num_classes(num_classes, len(labels))
    elif (len(features), len(labels)) != tuple(len(c) for c in packed_columns(training)):
        inputs, outputs = (len(c) for c in packed_columns(training))
        raise MadlibMopError(
            f"{len(features)} feature and {len(labels)} label columns, the training data "
            f"{training['packed_table']} has {inputs} and {outputs}",
            sqlstate=errors.INVALID_PARAMETER_VALUE,
            hint="Name as many feature and label columns as the training data has, in its order.")
    names = [f.packed_column for f in features] + [label.name for label in labels]
    columns = {*names, *(f"{name}_shape" for name in names), "buffer_id", "__dist_key__"}
    if len(columns) != 2 * len(names) + 2:
        raise MadlibMopError("the feature and label columns' names collide in the packed table",
                             sqlstate=errors.INVALID_PARAMETER_VALUE,
                             hint="Rename the columns in a view (not buffer_id or __dist_key__, "
                                  "and not the same column twice).")


def _key(plpy: Any, table: catalog.Table, key_column: str | None):
    """The key column of a table packed in key order (None: packed otherwise).  On segment
    servers too: the rows are ranked here (one order for the whole table), and each buffer
    goes to its segment's server."""
    if key_column is None:
        return None
    return keyed.key_column(plpy, table, key_column)


def _in_key_order(plpy: Any, table: catalog.Table, key, features: list[Features], labels: list,
                  rows: int) -> keyed.NewRows:
    """The source's rows copied in key order: what is packed (they were counted before)."""
    ordered = keyed.copy_in_key_order(plpy, table, key, _source_names(features, labels), None)
    if ordered.rows != rows:
        ordered.drop(plpy)
        raise MadlibMopError(f"{table.name} changed while it was being packed",
                             sqlstate=errors.DATA_EXCEPTION,
                             detail=f"Counted {rows} rows, then copied {ordered.rows} in key order.",
                             hint="Pack a table that is not being written to.")
    return ordered


def preprocessor_dl_append(plpy: Any, packed_table: str, source_table: str) -> int:
    """Pack the rows of `source_table` (the grown table, or a table or view of new rows) whose
    key is above the last key packed into `packed_table`, a table packed with key_column:
    with its normalizing constant and class values, to the buffers packing the grown table
    whole would give (`preprocess.keyed`).  Returns how many rows were appended."""
    started = time.perf_counter()
    summary = read_summary(plpy, packed_table, argument="packed_table")
    packed = catalog.resolve_table(plpy, summary["packed_oid"], argument="packed_table")
    if summary.get("features_of"):
        raise MadlibMopError(f"{packed.name} holds features of {summary['features_of']}: rows are "
                             "appended to the table they were computed from",
                             sqlstate=errors.OBJECT_NOT_IN_PREREQUISITE_STATE,
                             hint="Append to that table, then materialize_features into this one again: "
                                  "it computes the new rows' features.")
    if not summary.get(keyed.SUMMARY_COLUMN):
        raise MadlibMopError(
            f"{packed.name} was not packed in key order: rows cannot be appended to it",
            sqlstate=errors.OBJECT_NOT_IN_PREREQUISITE_STATE,
            detail="A table packed without key_column has its rows shuffled as a whole.",
            hint="Pack it again with training_preprocessor_dl(..., key_column => 'id') (or "
                 "validation_preprocessor_dl's key_column), then append.")
    order = keyed.KeyOrder.of(summary[keyed.SUMMARY_COLUMN])
    table = catalog.resolve_table(plpy, source_table)
    lock_for_change(plpy, packed, "appended to")
    q = plpy.quote_ident
    features = feature_columns(plpy, table, ", ".join(q(n) for n in summary["independent_varname"]))
    labels = label_columns(plpy, table, ", ".join(q(n) for n in summary["dependent_varname"]),
                           summary["label_kind"] == "regression")
    key = keyed.key_column(plpy, table, order.column)
    if key.type != order.type:
        raise MadlibMopError(f"key_column {key.name} of {table.name} has type {key.type}, "
                             f"{packed.name} was packed in order of a {order.type}",
                             sqlstate=errors.DATATYPE_MISMATCH,
                             hint=f"Append from a table (or a view) whose {key.name} is a {order.type}.")
    new = keyed.copy_in_key_order(plpy, table, key, _source_names(features, labels), order.last)
    try:
        if new.rows == 0:
            plpy.notice(f"preprocessor_dl_append: {table.name} has no row whose {key.name} is above "
                        f"{order.last}, the last packed into {packed.name}: nothing to append")
            return 0
        for k, label in enumerate(labels):
            _no_new_class(plpy, new.table, table, packed, label, summary, k, order.training)
        classes = [_classes(plpy, new.table, label, summary["num_classes"], summary, new.rows, k)
                   for k, label in enumerate(labels)]
        encoding = Encoding(labels, classes, float(summary["normalizing_const"]), budget(plpy),
                            summary["input_shapes"])
        count = int(summary["num_segments"])
        seed = summary["shuffle_seed"] if order.training else None
        columns = tuple(list(names) for names in packed_columns(summary))
        carried = keyed.carried_rows(plpy, packed, columns, summary["label_kind"] != "regression",
                                     order, count, seed)
        rewritten = keyed.delete_block(plpy, packed, order, count)
        insert = plpy.prepare(*PackedOutput(plpy, None, *columns, None).insert_sql(packed.name))
        reader = SourceReader(plpy, new.table, features, labels)
        reader.source = table  # errors name the source, not its copy
        written = keyed.write_blocks(reader, table.name, encoding, order.rows, carried,
                                     order.buffer_size, count, seed,
                                     lambda params: plpy.execute(insert, params))
        reader.close()
    finally:
        new.drop(plpy)
    rows = order.rows + new.rows
    _update_summary(plpy, packed, columns[0][0], count, rows,
                    dataclasses.replace(order, last=new.last, rows=rows))
    plpy.notice(f"preprocessor_dl_append: packed {new.rows} rows of {table.name} ({key.name} "
                f"{new.first} to {new.last}) into {packed.name}: {rewritten} buffers written again, "
                f"{written.buffers - rewritten} new ({time.perf_counter() - started:.1f}s)")
    return new.rows


def _no_new_class(plpy: Any, new_rows: catalog.Table, table: catalog.Table, packed: catalog.Table,
                  label, summary: dict, output: int, training: bool) -> None:
    """New rows may only hold the packed table's classes (a NULL that is no class, in
    validation data: MADlib's all-zero row, as validation_preprocessor_dl packs it)."""
    if not label.as_codes or summary["label_kind"] != "classification":
        return
    known = {as_text(v) for v in summary["output_class_values"][output]}
    found = class_values_of(plpy, new_rows, label, None)
    new = [v for v in found if as_text(v) not in known and (training or v is not None)]
    if new:
        raise MadlibMopError(
            f"new rows of {table.name} have classes that {packed.name} was packed without: "
            + ", ".join(repr(v) for v in new[:5]) + (" ..." if len(new) > 5 else ""),
            sqlstate=errors.INVALID_PARAMETER_VALUE,
            detail=f"Packed classes: {', '.join(repr(v) for v in summary['output_class_values'][output][:20])}.",
            hint="A model has one output per class: pack the grown table again with "
                 "training_preprocessor_dl (its models then start again), or leave those rows "
                 "out with a view.")


def _update_summary(plpy: Any, packed: catalog.Table, feature_column: str, count: int, rows: int,
                    order: keyed.KeyOrder) -> None:
    """The summary's counts, from the packed table's buffers, and the key order."""
    shape = plpy.quote_ident(feature_column + "_shape")
    found = plpy.execute(f"SELECT __dist_key__ AS s, count(*) AS buffers, sum({shape}[1]) AS rows, "
                         f"max({shape}[1]) AS largest FROM {packed.name} GROUP BY 1")
    by_segment = {row["s"]: row for row in found}
    summary_table = catalog.sibling_table(plpy, packed, "_summary")
    plpy.execute(plpy.prepare(
        f"UPDATE {summary_table.name} SET num_rows = $1, rows_per_segment = $2, "
        "buffers_per_segment = $3, buffer_size = $4",
        ["bigint", "bigint[]", "integer[]", "integer"]),
        [rows, [int(by_segment[k]["rows"]) if k in by_segment else 0 for k in range(count)],
         [int(by_segment[k]["buffers"]) if k in by_segment else 0 for k in range(count)],
         max(int(row["largest"]) for row in found)])
    keyed.record(plpy, summary_table.name, order)


def _pack(plpy: Any, table, out, features, labels, homes, lying, encoding: Encoding, rows: int,
          seed: int | None, buffer_size: int | None, segment_total: int, dependent_varname: str,
          independent_varname: str, summarize, ordered: keyed.NewRows | None) -> Packed:
    """Write the buffers (here, or on the segment servers where the rows lie) and then the
    summary (`summarize(packed, buffer_size)`); on failure, the tables made on segment
    servers go.  `seed` None: rows in scan order (validation).  `ordered`: the rows copied
    in key order, packed by their rank (`preprocess.keyed`)."""
    output = None  # the segments' tables on segment servers, dropped if this fails
    full = buffer_size is not None  # a size the user gave: buffers filled as MADlib fills them
    try:
        if ordered is not None:
            buffer_size = buffer_size or packing.keyed_buffer_size(_row_bytes(plpy, table, features))
            output = _output(plpy, out, features, labels, homes)
            insert = output.create(segment_total)
            reader = SourceReader(plpy, ordered.table, features, labels)
            reader.source = table  # errors name the source, not its copy
            packed = keyed.write_blocks(reader, table.name, encoding, 0, None, buffer_size,
                                        segment_total, seed, lambda params: plpy.execute(insert, params))
            reader.close()
        elif lying is None:
            reader = SourceReader(plpy, table, features, labels)
            positions = (packing.shuffled_positions(rows, seed) if seed is not None
                         else np.arange(rows, dtype=np.int64))

            def begin(feature_shapes):
                nonlocal buffer_size, output
                if buffer_size is None:
                    buffer_size = packing.default_buffer_size(
                        rows, sum(4 * math.prod(shape) for shape in feature_shapes), segment_total)
                output = _output(plpy, out, features, labels, homes)
                insert = output.create(segment_total)
                return (packing.buffer_layout(rows, buffer_size, segment_total, full=full),
                        lambda params: plpy.execute(insert, params), buffer_size)

            packed = write_buffers(plpy, reader, table.name, rows, positions, encoding, begin)
            reader.close()
        else:  # each segment server packs its own rows into its own segments
            output = _output(plpy, out, features, labels, homes)
            output.create(segment_total)
            buffer_size = buffer_size or _default_buffer_size(plpy, table, features, rows, segment_total)
            packed = _pack_where_it_lies(plpy, lying, homes, output, encoding, buffer_size, full,
                                         dependent_varname, independent_varname, seed, rows, table)
        summarize(packed, buffer_size)
    except BaseException:
        if output is not None:
            output.drop_remote()
        raise
    return packed


def _output(plpy: Any, out, features: list[Features], labels: list, homes) -> PackedOutput:
    return PackedOutput(plpy, out, [f.packed_column for f in features], [label.name for label in labels],
                        homes)


def _segment_total(plpy: Any, distribution_rules: str | None, training: dict | None,
                   homes: list | None) -> int:
    """How many segments the packed table gets: one per home on segment servers, else
    distribution_rules', or (validation) the training table's."""
    if homes is not None:
        return len(homes)
    if training is None or distribution_rules is not None:
        return segment_count(plpy, distribution_rules)
    return int(training["num_segments"])


def _classes(plpy: Any, table, label, num_classes: list | None, training: dict | None,
             rows: int, output: int) -> int | None:
    """The classes of label `output` (set on `label`) and how many the one-hot rows get;
    None for regression targets."""
    if label.one_hot:
        label.class_values = one_hot_positions(plpy, table, label, training, output)
        return class_count(label.class_values, num_classes, training, padding=False,
                           output=output)
    if label.classification:
        label.class_values = class_values_of(plpy, table, label, training, output)
        classes = class_count(label.class_values, num_classes, training, output=output)
        if training is None and label.base_type in FLOAT_TYPES and \
                len(label.class_values) > max(MANY_FLOAT_CLASSES, rows // 2):
            # Classes, as in MADlib; but one per value of a continuous target would be a
            # one-hot matrix of rows x values.
            raise MadlibMopError(
                f"dependent_varname {label.name} has {len(label.class_values)} distinct values "
                f"in {rows} rows: as classes (MADlib's meaning of a {label.base_type} label) "
                "that is a one-hot column per value",
                sqlstate=errors.INVALID_PARAMETER_VALUE,
                hint="Pass regression => TRUE for numeric targets; or, for that many classes, "
                     "give the label as text or integer in a view.")
        return classes
    if training is not None and training["label_kind"] != "regression":
        raise MadlibMopError(
            f"dependent_varname {label.name} holds numeric targets but "
            f"{training['packed_table']} was packed for classification",
            sqlstate=errors.DATATYPE_MISMATCH,
            hint="Use a label column of the same kind as the training data's.")
    return None


def _source_on_segment_servers(plpy: Any, table: catalog.Table, homes: list | None,
                               training: bool) -> dict | None:
    """The source's parts per segment server (`segments.source_parts`), when its rows all
    lie on servers that get the output's segments: each server then packs its own rows.
    Training data gets the segments of the servers holding rows; validation data must lie on
    every server of the training segments.  None: the rows are read here (and the buffers
    sent to the segment servers)."""
    if homes is None:
        return None
    parts = segments.source_parts(plpy, table)
    if parts is None:
        return None
    parts = {name: part for name, part in parts.items() if part.rows(plpy) > 0}
    with_segments = {home.name for home in homes}
    if not parts or not set(parts) <= with_segments or (not training and set(parts) != with_segments):
        plpy.notice(f"madlib_mop: the rows of {table.name} do not lie on the segment servers "
                    "of the packed table's segments: they are read through this server")
        return None
    return parts


def _default_buffer_size(plpy: Any, table: catalog.Table, features: list[Features], rows: int,
                         segment_total: int) -> int:
    """The default buffer size from one row's feature shapes (one row read here)."""
    return packing.default_buffer_size(rows, _row_bytes(plpy, table, features), segment_total)


def _source_names(features: list[Features], labels: list) -> list[str]:
    """The source's columns that the features and labels are read from."""
    return [name for f in features for name in f.names] + [label.name for label in labels]


def _row_bytes(plpy: Any, table: catalog.Table, features: list[Features]) -> int:
    """Bytes of one row's features, from one row's feature shapes (one row read here)."""
    row = plpy.execute("SELECT " + ", ".join(f"pg_catalog.array_dims({f.expression}) AS d{i}"
                                             for i, f in enumerate(features))
                       + f" FROM {table.name} LIMIT 1")[0]
    row_bytes = 0
    for i in range(len(features)):
        dims = row[f"d{i}"] or "[1:1]"
        row_bytes += 4 * math.prod(int(hi) - int(lo) + 1 for lo, hi in
                                   (part.split(":") for part in dims.strip("[]").split("][")))
    return row_bytes


def _pack_where_it_lies(plpy: Any, lying: dict, homes: list, output: "PackedOutput",
                        encoding: "Encoding", buffer_size: int, full: bool, dependent_varname: str,
                        independent_varname: str, seed: int | None, rows: int,
                        table: catalog.Table) -> "Packed":
    """Each segment server packs its rows into its segments (`_mop_pack_segment`), all at
    once; only the tasks and their counts cross the network."""
    schema = catalog.extension_schema(plpy)
    tasks = []
    for name, part in lying.items():
        local = [k for k, home in enumerate(homes) if home.name == name]
        tasks.append((part.server, {
            "source": part.tables, "dependent_varname": dependent_varname,
            "independent_varname": independent_varname, "encoding": encoding.as_json(),
            "buffer_size": buffer_size, "full": full, "seed": seed, "segments": local,
            "tables": {str(k): output.partition_names[k] for k in local}}))

    def pack_there(session, server, task) -> dict:
        try:
            return session.execute(f"SELECT {schema}._mop_pack_segment(%s)", (Jsonb(task),),
                                   binary=True).fetchone()[0]
        except Exception as error:
            raise on_server(server, error) from None

    with contextlib.ExitStack() as stack:
        sessions = [stack.enter_context(segments.session(plpy, server)) for server, _ in tasks]
        results = run_all(sessions, [lambda session, server=server, task=task:
                                     pack_there(session, server, task) for server, task in tasks],
                          lambda: plpy.execute("SELECT 1"))
    if sum(result["rows"] for result in results) != rows:
        raise MadlibMopError(f"{table.name} changed while it was being packed",
                             sqlstate=errors.DATA_EXCEPTION,
                             detail=f"Counted {rows} rows, then the segment servers read "
                                    f"{sum(result['rows'] for result in results)}.",
                             hint="Pack a table that is not being written to.")
    packed = Packed({}, {}, 0, [tuple(shape) for shape in results[0]["feature_shapes"]])
    for result in results:
        found = [list(shape) for shape in packed.feature_shapes]
        if encoding.expected_shapes is None and found != result["feature_shapes"]:
            raise MadlibMopError("the feature arrays of the source differ in shape between "
                                 "segment servers", sqlstate=errors.DATA_EXCEPTION,
                                 detail=f"Found {found} and {result['feature_shapes']}.",
                                 hint="Every row needs a feature array of the same shape.")
        packed.rows_per_segment.update({int(k): v for k, v in result["rows_per_segment"].items()})
        packed.buffers_per_segment.update({int(k): v for k, v in result["buffers_per_segment"].items()})
        packed.max_buffer_rows = max(packed.max_buffer_rows, result["max_buffer_rows"])
    return packed
