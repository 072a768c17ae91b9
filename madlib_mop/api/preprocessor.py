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
packed several scalar columns into one vector); <y> is the label column's name.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import time
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

import numpy as np
import psycopg
from psycopg.types.json import Jsonb

from madlib_mop import errors
from madlib_mop.db import catalog, scan, segments, settings
from madlib_mop.db.packed import read_summary
from madlib_mop.engine.cluster import on_server
from madlib_mop.engine.pool import run_all
from madlib_mop.runtime import packing
from madlib_mop.errors import MadlibMopError

INTEGER_TYPES = {"smallint", "integer", "bigint"}
FLOAT_TYPES = {"real", "double precision", "numeric"}
MANY_FLOAT_CLASSES = 100  # more float classes than this and than half the rows: a target
PACKABLE_ARRAYS = {"real[]", "double precision[]", "smallint[]", "integer[]", "bigint[]"}
DEFAULT_MEMORY_MB = 1024
SEGMENTS_SETTING = "madlib_mop.segments"
MEMORY_SETTING = "madlib_mop.preprocessor_memory_mb"


@dataclass
class Features:
    names: list[str]
    expression: str  # SQL giving one real[] per row
    packed_column: str


@dataclass
class Label:
    name: str
    base_type: str
    classification: bool
    expression: str  # SQL: the native value (classes) or a real[] (one-hot rows, targets)
    class_values: list = field(default_factory=list)
    one_hot: bool = False  # a numeric array label: already one-hot (MADlib's meaning)

    @property
    def as_codes(self) -> bool:
        """Read as values to encode (scalar classes), not as arrays of numbers."""
        return self.classification and not self.one_hot

    @property
    def kind(self) -> str:
        return "one_hot" if self.one_hot else "classes" if self.classification else "regression"


def segment_count(plpy: Any, distribution_rules: str | None) -> int:
    """S from distribution_rules: NULL/'all_segments' -> the setting madlib_mop.segments,
    else the server's CPU count; or a positive number of segments."""
    rules = (distribution_rules or "all_segments").strip().lower()
    # A job opens a session per segment: a quarter of the server's connections at most, so
    # that one role's job cannot take every connection slot of the server.
    limit = settings.worker_session_limit(plpy)
    if rules == "all_segments":
        wanted = settings.whole_number(plpy, SEGMENTS_SETTING)
        if wanted is None:
            return min(os.cpu_count() or 1, limit)
    elif rules.isdigit() and int(rules) >= 1:
        wanted = int(rules)
    else:
        wanted = None
    if wanted is not None:
        if wanted > limit:
            raise MadlibMopError(
                f"{wanted} segments are more than this server serves ({limit})",
                sqlstate=errors.INVALID_PARAMETER_VALUE,
                detail="A job opens one worker session per segment; a server takes at most a "
                       "quarter of max_connections.",
                hint=f"Use at most {limit} segments (or raise max_connections).")
        return wanted
    if rules == "gpu_segments":
        raise MadlibMopError("distribution_rules 'gpu_segments' is not supported",
                             sqlstate=errors.FEATURE_NOT_SUPPORTED,
                             hint="Use 'all_segments' or a number of segments, e.g. '4'.")
    raise MadlibMopError(f"distribution_rules '{distribution_rules}' is not understood",
                         sqlstate=errors.INVALID_PARAMETER_VALUE,
                         hint="Use NULL or 'all_segments' (one segment per CPU, or the setting "
                              f"{SEGMENTS_SETTING}), or a number of segments such as '4'.")


# ---- argument checks ----------------------------------------------------------------------

def feature_columns(plpy: Any, table: catalog.Table, independent_varname: str) -> Features:
    names = catalog.column_names(plpy, independent_varname, argument="independent_varname")
    if len(names) > 1:
        # MADlib reads 'a, b' as the inputs of a multi-input model, each an array column; one
        # input made of the columns' values would train another model than MADlib's.
        raise MadlibMopError(
            f"independent_varname '{independent_varname}' names {len(names)} columns: in MADlib, "
            "the inputs of a multi-input model, which madlib_mop does not train",
            sqlstate=errors.FEATURE_NOT_SUPPORTED,
            hint="Give the features as one numeric array column, e.g. a view with "
                 f"ARRAY[{', '.join(names)}]::real[] AS attributes, and pass 'attributes'.")
    column = catalog.column(plpy, table, names[0], argument="independent_varname")
    if column.is_numeric_array:
        quoted = plpy.quote_ident(names[0])
        # float4_pack reads real, double precision and integer arrays as they are.
        cast = "" if column.base_type in PACKABLE_ARRAYS else "::double precision[]"
        return Features(names, f"{quoted}{cast}", names[0])
    raise MadlibMopError(
        f'independent_varname "{column.name}" has type {column.type}, which is not a numeric array',
        sqlstate=errors.DATATYPE_MISMATCH,
        detail="Features are one numeric array column, of any shape (as in MADlib).",
        hint="Pass an array column such as real[] or double precision[]; for numeric columns, "
             f"a view with ARRAY[{column.name}, ...]::real[] AS attributes.",
    )


def _label(plpy: Any, table: catalog.Table, dependent_varname: str, regression: bool) -> Label:
    """MADlib's meaning: a scalar label (text, integer, boolean, also a float) holds classes
    and a numeric array label is already one-hot; numbers are regression targets only when
    asked for (`regression => TRUE`)."""
    names = catalog.column_names(plpy, dependent_varname, argument="dependent_varname")
    if len(names) != 1:
        raise MadlibMopError(
            "dependent_varname names several columns: in MADlib, the outputs of a multi-output "
            "model, which madlib_mop does not train",
            sqlstate=errors.FEATURE_NOT_SUPPORTED,
            hint="Pass one label column.")
    column = catalog.column(plpy, table, names[0], argument="dependent_varname")
    quoted = plpy.quote_ident(column.name)
    array_cast = "" if column.base_type in PACKABLE_ARRAYS else "::double precision[]"
    if regression:
        if column.is_numeric:
            return Label(column.name, column.base_type, False, f"ARRAY[{quoted}::double precision]")
        if column.is_numeric_array:
            return Label(column.name, column.base_type, False, f"{quoted}{array_cast}")
        raise MadlibMopError(
            f'dependent_varname "{column.name}" has type {column.type}: regression needs numbers',
            sqlstate=errors.DATATYPE_MISMATCH,
            hint="Pass a numeric label column (or an array of them) for regression, or "
                 "regression => FALSE for classes.")
    if column.category in ("S", "B") or column.is_numeric:
        return Label(column.name, column.base_type, True, quoted)
    if column.is_numeric_array:
        return Label(column.name, column.base_type, True, f"{quoted}{array_cast}", one_hot=True)
    raise MadlibMopError(
        f'dependent_varname "{column.name}" has type {column.type}',
        sqlstate=errors.DATATYPE_MISMATCH,
        detail="Labels are classes (text, integer, boolean or other numbers), one-hot rows "
               "(numeric arrays), or, with regression => TRUE, numeric targets.",
        hint="Cast the label in a view, e.g. label::text.",
    )


def _check_positive(value: Any, argument: str, allow_null: bool = True) -> None:
    if value is None and allow_null:
        return
    if value is None or not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
        raise MadlibMopError(f"{argument} must be a positive number, not {value}",
                             sqlstate=errors.INVALID_PARAMETER_VALUE,
                             hint=f"Pass a positive {argument}" + (" or NULL." if allow_null else "."))


# ---- reading --------------------------------------------------------------------------------

class SourceReader:
    """Reads (features, labels) of every row in a fixed scan order, chunk by chunk.

    A chunk is a range of physical blocks (a TID range scan); the aggregate float4_pack
    (src/float4_pack.c) turns its rows' arrays into one float32 buffer inside the server.
    Sources without blocks of their own (views, partitioned or foreign tables) are first
    copied into a temporary table.
    """

    def __init__(self, plpy: Any, table: catalog.Table, features: Features, label: Label):
        self.plpy = plpy
        self.source = table
        self.label = label
        schema = catalog.extension_schema(plpy)
        x, y = features.expression, label.expression
        if table.kind not in ("r", "m"):
            scratch = plpy.quote_ident(f"madlib_mop_source_{table.oid}")
            if plpy.execute(f"SELECT to_regclass('pg_temp.{scratch}') IS NOT NULL AS e")[0]["e"]:
                plpy.execute(f"DROP TABLE pg_temp.{scratch}")
            plpy.execute(f"CREATE TEMP TABLE {scratch} AS SELECT {x} AS x, {y} AS y "
                         f"FROM {table.name}")
            self.scan_table = catalog.resolve_table(plpy, f"pg_temp.{scratch}")
            self.scratch = self.scan_table.name
            x, y = "x", "y"
        else:
            self.scan_table = table
            self.scratch = None
        label_sql = f"array_agg({y}) AS y" if label.as_codes else f"{schema}.float4_pack({y}) AS y"
        self.chunk_plan = plpy.prepare(
            f"SELECT count(*) AS n, {schema}.float4_pack({x}) AS x, {label_sql} "
            f"FROM {self.scan_table.name} WHERE ctid >= $1::tid AND ctid < $2::tid",
            ["text", "text"])

    def close(self) -> None:
        if self.scratch is not None:
            self.plpy.execute(f"DROP TABLE {self.scratch}")
            self.scratch = None

    def chunks(self):
        """Yield (features float32 (n, *shape), labels: list, or float32 (n, k)) per chunk."""
        for bounds in scan.block_chunks(0, scan.table_blocks(self.plpy, self.scan_table.oid)):
            try:
                row = self.plpy.execute(self.chunk_plan, list(bounds))[0]
            except self.plpy.SPIError as error:
                raise _source_error(error, self.source) from None
            if row["n"] == 0:
                continue
            features = packing.unpack_float4(row["x"], row["n"])
            labels = (row["y"] if self.label.as_codes
                      else packing.unpack_float4(row["y"], row["n"]).reshape(row["n"], -1))
            if self.label.one_hot and not np.isin(labels, (0.0, 1.0)).all():
                raise MadlibMopError(
                    f"the label arrays of {self.source.name} hold values other than 0 and 1",
                    sqlstate=errors.INVALID_PARAMETER_VALUE,
                    detail="A numeric array label is taken as one-hot encoded classes (MADlib's "
                           "meaning).",
                    hint="Pass regression => TRUE to training_preprocessor_dl for numeric targets.")
            yield features, labels

    def ragged(self, first: tuple, other: tuple) -> MadlibMopError:
        return MadlibMopError(
            f"the feature arrays of {self.source.name} differ in shape",
            sqlstate=errors.DATA_EXCEPTION, detail=f"Found shapes {list(first)} and {list(other)}.",
            hint="Every row needs a feature array of the same shape.")


def _source_error(error: Any, table: catalog.Table) -> Exception:
    """float4_pack's errors (NULL, shape, NaN, type) restated with the table's name."""
    sqlstate = getattr(error, "sqlstate", None)
    message = str(error.args[0]) if error.args else str(error)
    if sqlstate not in ("22004", "22000", "22003", "42804") or "madlib_mop:" not in message:
        return error
    spidata = getattr(error, "spidata", None) or ()
    detail = spidata[1] if len(spidata) > 1 else None
    hint = spidata[2] if len(spidata) > 2 else None
    return MadlibMopError(f"{table.name}: {message.split('madlib_mop: ', 1)[1]}",
                          sqlstate=sqlstate, detail=detail, hint=hint)


# ---- the two functions --------------------------------------------------------------------

def training_preprocessor_dl(plpy: Any, source_table: str, output_table: str,
                             dependent_varname: str, independent_varname: str,
                             buffer_size: int | None = None, normalizing_const: float | None = 1.0,
                             num_classes: list[int] | None = None,
                             distribution_rules: str | None = None, seed: int | None = 0,
                             regression: bool | None = False) -> None:
    _preprocess(plpy, "training_preprocessor_dl", source_table, output_table, dependent_varname,
                independent_varname, buffer_size, normalizing_const, num_classes,
                distribution_rules, seed=0 if seed is None else seed, training=None,
                regression=bool(regression))


def validation_preprocessor_dl(plpy: Any, source_table: str, output_table: str,
                               dependent_varname: str, independent_varname: str,
                               training_preprocessor_table: str, buffer_size: int | None = None,
                               distribution_rules: str | None = None) -> None:
    training = read_summary(plpy, training_preprocessor_table,
                            argument="training_preprocessor_table")
    _preprocess(plpy, "validation_preprocessor_dl", source_table, output_table, dependent_varname,
                independent_varname, buffer_size, training["normalizing_const"],
                training["num_classes"], distribution_rules, seed=None, training=training,
                regression=training["label_kind"] == "regression")


def _preprocess(plpy, module, source_table, output_table, dependent_varname, independent_varname,
                buffer_size, normalizing_const, num_classes, distribution_rules, seed, training,
                regression):
    started = time.perf_counter()
    table = catalog.resolve_table(plpy, source_table)
    out = catalog.new_table(plpy, output_table, argument="output_table")
    summary_table = out.sibling("_summary", plpy)
    out.must_not_exist(plpy)
    summary_table.must_not_exist(plpy)
    features = feature_columns(plpy, table, independent_varname)
    label = _label(plpy, table, dependent_varname, regression)
    _check_positive(buffer_size, "buffer_size")
    _check_positive(normalizing_const, "normalizing_const")
    if normalizing_const is None:
        normalizing_const = 1.0
    homes = segment_homes(plpy, distribution_rules, training)
    if homes is not None:
        segment_total = len(homes)
    elif training is None:
        segment_total = segment_count(plpy, distribution_rules)
    else:
        segment_total = (segment_count(plpy, distribution_rules) if distribution_rules is not None
                         else int(training["num_segments"]))
    columns = {features.packed_column, label.name, f"{features.packed_column}_shape",
               f"{label.name}_shape", "buffer_id", "__dist_key__"}
    if len(columns) != 6:
        raise MadlibMopError("the feature and label columns' names collide in the packed table",
                             sqlstate=errors.INVALID_PARAMETER_VALUE,
                             hint="Rename the columns in a view (not buffer_id or __dist_key__, "
                                  "and not the same column twice).")

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
        raise MadlibMopError(f"source_table {table.name} is empty",
                             sqlstate=errors.DATA_EXCEPTION, hint="Load rows into it first.")

    if label.one_hot:
        label.class_values = _one_hot_positions(plpy, table, label, training)
        classes = _class_count(label.class_values, num_classes, training, padding=False)
    elif label.classification:
        label.class_values = _class_values(plpy, table, label, training)
        classes = _class_count(label.class_values, num_classes, training)
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
    else:
        if training is not None and training["label_kind"] != "regression":
            raise MadlibMopError(
                f"dependent_varname {label.name} holds numeric targets but "
                f"{training['packed_table']} was packed for classification",
                sqlstate=errors.DATATYPE_MISMATCH,
                hint="Use a label column of the same kind as the training data's.")
        classes = None
    if lying is not None:
        plpy.execute(plpy.prepare("SELECT set_config('enable_partitionwise_aggregate', $1, true)",
                                  ["text"]), [partitionwise])

    encoding = Encoding(label, classes, float(normalizing_const),
                        _budget(plpy),
                        list(training["feature_shape"]) if training is not None else None)
    output = None  # the segments' tables on segment servers, dropped if this fails
    try:
        if lying is None:
            reader = SourceReader(plpy, table, features, label)
            positions = (packing.shuffled_positions(rows, seed) if training is None
                         else np.arange(rows, dtype=np.int64))

            def begin(feature_shape):
                nonlocal buffer_size, output
                if buffer_size is None:
                    buffer_size = packing.default_buffer_size(rows, 4 * math.prod(feature_shape),
                                                              segment_total)
                output = PackedOutput(plpy, out, features, label, homes)
                insert = output.create(segment_total)
                return (packing.buffer_layout(rows, buffer_size, segment_total),
                        lambda params: plpy.execute(insert, params), buffer_size)

            packed = write_buffers(plpy, reader, table.name, rows, positions, encoding, begin)
            reader.close()
        else:  # each segment server packs its own rows into its own segments
            output = PackedOutput(plpy, out, features, label, homes)
            output.create(segment_total)
            buffer_size = buffer_size or _default_buffer_size(plpy, table, features, rows, segment_total)
            packed = _pack_where_it_lies(plpy, lying, homes, output, encoding, buffer_size,
                                         dependent_varname, independent_varname,
                                         seed if training is None else None, rows, table)
        _write_summary(plpy, summary_table, source_table, output_table, label, features, buffer_size,
                       normalizing_const, classes, distribution_rules, segment_total, rows, packed,
                       seed)
    except BaseException:
        if output is not None:
            output.drop_remote()
        raise
    where = "" if homes is None else f" on {len({h.name for h in homes})} segment servers"
    how = "" if lying is None else ", each server packing its own rows"
    plpy.notice(f"{module}: packed {rows} rows of {table.name} into {packed.buffers} buffers on "
                f"{segment_total} segments{where}{how} in {out.quoted} "
                f"({time.perf_counter() - started:.1f}s)")


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


def _default_buffer_size(plpy: Any, table: catalog.Table, features: Features, rows: int,
                         segment_total: int) -> int:
    """The default buffer size from one row's feature shape (one row read here)."""
    dims = plpy.execute(f"SELECT pg_catalog.array_dims({features.expression}) AS d "
                        f"FROM {table.name} LIMIT 1")[0]["d"] or "[1:1]"
    shape = [int(hi) - int(lo) + 1 for lo, hi in
             (part.split(":") for part in dims.strip("[]").split("]["))]
    return packing.default_buffer_size(rows, 4 * math.prod(shape), segment_total)


def _pack_where_it_lies(plpy: Any, lying: dict, homes: list, output: "PackedOutput",
                        encoding: "Encoding", buffer_size: int, dependent_varname: str,
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
            "buffer_size": buffer_size, "seed": seed, "segments": local,
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
    packed = Packed({}, {}, 0, tuple(results[0]["feature_shape"]))
    for result in results:
        if encoding.expected_shape is None and list(packed.feature_shape) != result["feature_shape"]:
            raise MadlibMopError("the feature arrays of the source differ in shape between "
                                 "segment servers", sqlstate=errors.DATA_EXCEPTION,
                                 detail=f"Found {list(packed.feature_shape)} and {result['feature_shape']}.",
                                 hint="Every row needs a feature array of the same shape.")
        packed.rows_per_segment.update({int(k): v for k, v in result["rows_per_segment"].items()})
        packed.buffers_per_segment.update({int(k): v for k, v in result["buffers_per_segment"].items()})
        packed.max_buffer_rows = max(packed.max_buffer_rows, result["max_buffer_rows"])
    return packed


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
    label = _label(plpy, table, task["dependent_varname"], given["label"] == "regression")
    if label.kind != given["label"]:
        raise MadlibMopError(
            f"the label column of {table.name} is of another kind ({label.kind}) on this segment "
            f"server than on the coordinator's ({given['label']})", sqlstate=errors.DATATYPE_MISMATCH,
            hint="Give the segment servers' tables the column types of the foreign tables.")
    label.class_values = [Decimal(v) if label.base_type == "numeric" and v is not None else v
                          for v in given["class_values"]]
    encoding = Encoding(label, given["classes"], given["normalizing_const"],
                        _budget(plpy),
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
                  for b in packing.buffer_layout(rows, task["buffer_size"], len(local))]
        return layout, lambda params: plpy.execute(plans[params[5]], params), task["buffer_size"]

    packed = write_buffers(plpy, reader, table.name, rows, positions, encoding, begin)
    reader.close()
    return json.dumps({"rows": rows, "rows_per_segment": packed.rows_per_segment,
                       "buffers_per_segment": packed.buffers_per_segment,
                       "max_buffer_rows": packed.max_buffer_rows,
                       "feature_shape": list(packed.feature_shape)})


def _budget(plpy: Any) -> int:
    """Bytes of rows a packing holds at once (madlib_mop.preprocessor_memory_mb)."""
    return (settings.whole_number(plpy, MEMORY_SETTING) or DEFAULT_MEMORY_MB) * 1024 * 1024


@dataclass
class Encoding:
    """How rows become buffers, the same wherever they are packed."""
    label: Label
    classes: int | None
    normalizing_const: float
    budget: int  # bytes of rows held at once
    expected_shape: list | None  # validation: the training data's feature shape

    def as_json(self) -> dict:
        return {"classes": self.classes, "normalizing_const": self.normalizing_const,
                "label": self.label.kind,
                # numeric's values go as text: JSON has no decimal, and a float is another value
                "class_values": [str(v) if isinstance(v, Decimal) else v
                                 for v in self.label.class_values],
                "expected_shape": self.expected_shape}


@dataclass
class Packed:
    """What a packing wrote: per segment rows and buffers, the largest buffer, the shape."""
    rows_per_segment: dict[int, int]
    buffers_per_segment: dict[int, int]
    max_buffer_rows: int
    feature_shape: tuple

    @property
    def buffers(self) -> int:
        return sum(self.buffers_per_segment.values())

    @staticmethod
    def of(layout: list, feature_shape: tuple) -> "Packed":
        packed = Packed({}, {}, max(b.rows for b in layout), tuple(feature_shape))
        for buffer in layout:
            packed.rows_per_segment[buffer.segment] = packed.rows_per_segment.get(buffer.segment, 0) + buffer.rows
            packed.buffers_per_segment[buffer.segment] = packed.buffers_per_segment.get(buffer.segment, 0) + 1
        return packed


def write_buffers(plpy: Any, reader: SourceReader, table_name: str, rows: int,
                  positions: np.ndarray, encoding: Encoding, begin) -> Packed:
    """Read every row once per memory-sized wave, place it at its shuffled position and
    write the wave's buffers.  `begin(feature_shape)` (at the first chunk) creates the output
    and gives (buffer layout, a function writing one buffer's row, buffer size)."""
    label, layout, feature_shape, write = encoding.label, None, None, None
    class_index = {value: i for i, value in enumerate(label.class_values)}
    wave_start = 0
    while wave_start < rows:
        wave_rows, wave_x, wave_y, seen = None, None, None, 0
        for chunk_x, chunk_y in reader.chunks():
            n = chunk_x.shape[0]
            if feature_shape is None:
                feature_shape = tuple(chunk_x.shape[1:])
                if encoding.expected_shape is not None and list(feature_shape) != encoding.expected_shape:
                    raise MadlibMopError(
                        f"the features of {table_name} have shape {list(feature_shape)}, "
                        f"the training data's {encoding.expected_shape}",
                        sqlstate=errors.DATATYPE_MISMATCH,
                        hint="Validation rows need the same feature shape as the training rows.")
                layout, write, buffer_size = begin(feature_shape)
                wave_rows = max(int(buffer_size), encoding.budget // max(1, 4 * math.prod(feature_shape)))
            elif tuple(chunk_x.shape[1:]) != feature_shape:
                raise reader.ragged(feature_shape, chunk_x.shape[1:])
            if wave_x is None:
                # The wave ends on a buffer boundary so that buffers are written whole.
                wave_stop = _wave_stop(layout, wave_start, wave_rows)
                wave_x = np.empty((wave_stop - wave_start, *feature_shape), dtype=np.float32)
                wave_y = (np.empty(wave_stop - wave_start, dtype=np.int64) if label.as_codes
                          else np.empty((wave_stop - wave_start, chunk_y.shape[1]), dtype=np.float32))
            where = positions[seen: seen + n]
            mask = (where >= wave_start) & (where < wave_stop)
            wave_x[where[mask] - wave_start] = chunk_x[mask]
            if label.as_codes:
                codes = _encode(chunk_y, class_index, table_name, label)
                wave_y[where[mask] - wave_start] = codes[mask]
            else:
                wave_y[where[mask] - wave_start] = chunk_y[mask]
            seen += n
        if seen != rows:
            raise MadlibMopError(f"{table_name} changed while it was being packed",
                                 sqlstate=errors.DATA_EXCEPTION,
                                 detail=f"Counted {rows} rows, then read {seen}.",
                                 hint="Pack a table that is not being written to.")
        for buffer in layout:
            if wave_start <= buffer.start < wave_stop:
                x = wave_x[buffer.start - wave_start: buffer.stop - wave_start]
                y = wave_y[buffer.start - wave_start: buffer.stop - wave_start]
                if encoding.normalizing_const != 1.0:
                    x = x / np.float32(encoding.normalizing_const)
                if label.as_codes:
                    y = packing.one_hot(y, encoding.classes).astype("<i2")
                elif label.one_hot:
                    y = y.astype("<i2")
                write([x.astype("<f4").tobytes(), y.tobytes(), [buffer.rows, *feature_shape],
                       list(y.shape), buffer.buffer_id, buffer.segment])
        wave_start = wave_stop
    return Packed.of(layout, feature_shape)


def _wave_stop(layout: list, wave_start: int, wave_rows: int) -> int:
    """The end of the wave that starts at `wave_start`: whole buffers, at most `wave_rows`
    rows unless one buffer alone is larger."""
    stop = wave_start
    for buffer in layout:
        if buffer.start < wave_start:
            continue
        if stop > wave_start and buffer.stop - wave_start > wave_rows:
            break
        stop = buffer.stop
    return stop


def _class_values(plpy, table, label, training) -> list:
    # Byte order for text classes, so the order does not depend on the database's collation.
    # GROUP BY (not DISTINCT): over segment servers, each groups its own rows.
    order = "v COLLATE \"C\"" if label.base_type in ("text", "character varying", "character") else "v"
    # NULL is a class (MADlib's meaning), the first: trailing NULLs of a summary's class values
    # are num_classes' padding.
    found = [row["v"] for row in plpy.execute(
        f"SELECT v FROM (SELECT {label.expression} AS v FROM {table.name} GROUP BY 1) d "
        f"ORDER BY {order} NULLS FIRST")]
    if any(isinstance(v, (float, Decimal)) and v != v for v in found):  # NaN is not equal to itself
        raise MadlibMopError(f"{table.name} has NaN labels", sqlstate=errors.DATA_EXCEPTION,
                             hint="Remove those rows, or give them a label (NULL is a class).")
    if training is None:
        return found
    if training["label_kind"] != "classification":
        raise MadlibMopError(
            f"dependent_varname {label.name} holds classes but {training['packed_table']} "
            "was packed for regression",
            sqlstate=errors.DATATYPE_MISMATCH,
            hint="Use a label column of the same kind as the training data's.")
    known = training["class_values"]
    as_text = {_as_text(v) for v in known}
    unknown = [v for v in found if v not in known and _as_text(v) not in as_text]
    if unknown:
        raise MadlibMopError(
            f"{table.name} has labels that the training data does not have: "
            + ", ".join(repr(v) for v in unknown[:5]) + (" ..." if len(unknown) > 5 else ""),
            sqlstate=errors.INVALID_PARAMETER_VALUE,
            detail="Training classes: " + ", ".join(repr(v) for v in known[:20]) + ".",
            hint="Remove those rows, or pack training data that has every class.")
    # Validation labels are encoded in the training's class order, typed like the source's.
    by_text = {_as_text(v): v for v in found}
    return [by_text.get(_as_text(v), v) for v in known]


def _as_text(value: Any) -> str | None:
    """A class value compared across types (the summary's against the source's); NULL stays
    apart from the text 'None'."""
    return None if value is None else str(value)


def _one_hot_positions(plpy, table, label, training) -> list:
    """The classes of one-hot label arrays: their positions 0 .. n-1."""
    widths = [row["n"] for row in plpy.execute(
        f"SELECT cardinality({label.expression}) AS n FROM {table.name} GROUP BY 1 LIMIT 2")]
    if len(widths) != 1 or not widths[0]:
        raise MadlibMopError(f"the label arrays of {table.name} differ in length or are empty",
                             sqlstate=errors.DATA_EXCEPTION,
                             detail=f"Found lengths {widths}.",
                             hint="Every one-hot label needs one entry per class.")
    if training is not None and (training["label_kind"] != "classification"
                                 or not str(training["dependent_vartype"][0]).endswith("[]")
                                 or len(training["class_values"]) != widths[0]):
        raise MadlibMopError(
            f"dependent_varname {label.name} holds one-hot rows of {widths[0]} classes, unlike "
            f"the labels of {training['packed_table']}",
            sqlstate=errors.DATATYPE_MISMATCH,
            hint="Use a label column of the same kind as the training data's.")
    return list(range(widths[0]))


def _class_count(class_values: list, num_classes: list | None, training: dict | None,
                 padding: bool = True) -> int:
    if training is not None:
        return int(training["num_classes"][0])
    if num_classes is None:
        return len(class_values)
    if not padding and list(num_classes) != [len(class_values)]:
        raise MadlibMopError(
            f"num_classes {list(num_classes)} differs from the {len(class_values)} entries of "
            "the one-hot label arrays", sqlstate=errors.INVALID_PARAMETER_VALUE,
            hint="Pass NULL: one-hot labels give their number of classes.")
    if len(num_classes) != 1 or num_classes[0] is None:
        raise MadlibMopError("num_classes must be an array of one number, e.g. ARRAY[10]",
                             sqlstate=errors.INVALID_PARAMETER_VALUE,
                             hint="Models with several outputs are not supported.")
    if num_classes[0] < len(class_values):
        raise MadlibMopError(
            f"num_classes {num_classes[0]} is less than the {len(class_values)} classes found",
            sqlstate=errors.INVALID_PARAMETER_VALUE,
            hint=f"Pass NULL or ARRAY[n] with n >= {len(class_values)}.")
    return int(num_classes[0])


def _encode(values: list, class_index: dict, table_name: str, label) -> np.ndarray:
    try:
        return np.fromiter((class_index[v] for v in values), dtype=np.int64, count=len(values))
    except KeyError as error:  # a row was added after the class values were read
        raise MadlibMopError(f"{table_name} changed while it was being packed: label "
                             f"{error.args[0]!r} appeared",
                             sqlstate=errors.DATA_EXCEPTION,
                             hint="Pack a table that is not being written to.") from None


def segment_homes(plpy: Any, distribution_rules: str | None, training: dict | None
                  ) -> list[segments.SegmentServer] | None:
    """The segment server of each segment of a new packed table, or None (this server).
    Training data: 'all_segments' spreads it over every registered segment server.
    Validation data: partition p goes where the training data's segment p % S is, so that
    the worker of that segment evaluates it where it lies."""
    if training is None:
        if (distribution_rules or "all_segments").strip().lower() != "all_segments":
            return None
        servers = segments.registered(plpy)
        if not servers:
            return None
        return [segments.server_of(servers, k) for k in range(sum(s.segments for s in servers))]
    placed = segments.placement(plpy, catalog.resolve_table(plpy, training["packed_oid"]))
    if placed is None:
        return None
    count = (segment_count(plpy, distribution_rules) if distribution_rules is not None
             else int(training["num_segments"]))
    return [placed[k % len(placed)].server for k in range(count)]


class PackedOutput:
    """The packed table: partitioned by segment; a partition is a table of this server, or a
    foreign table whose rows are stored on the segment's segment server (`homes`)."""

    def __init__(self, plpy: Any, out: catalog.NewTable, features: Features, label: Label,
                 homes: list[segments.SegmentServer] | None):
        self.plpy, self.out, self.homes = plpy, out, homes
        q = plpy.quote_ident
        self.x, self.y = q(features.packed_column), q(label.name)
        self.xs, self.ys = q(features.packed_column + "_shape"), q(label.name + "_shape")
        self.remote: list[tuple[Any, str]] = []  # (server, table) made on segment servers
        self.partition_names: dict[int, list[str]] = {}  # segment -> [schema, table] there
        self.sessions: dict[str, Any] = {}

    def _columns(self) -> str:
        return (f"__dist_key__ integer NOT NULL, {self.x} bytea NOT NULL, {self.y} bytea NOT NULL, "
                f"{self.xs} integer[] NOT NULL, {self.ys} integer[] NOT NULL, "
                "buffer_id integer NOT NULL")

    def create(self, count: int):
        """Create the table and its partitions; the INSERT plan its buffers go through."""
        plpy, out = self.plpy, self.out
        # Foreign partitions take no index: the key is kept on each segment server.
        key = ", PRIMARY KEY (__dist_key__, buffer_id)" if self.homes is None else ""
        plpy.execute(f"CREATE TABLE {out.quoted} ({self._columns()}{key}) "
                     "PARTITION BY LIST (__dist_key__)")
        try:
            for segment in range(count):
                self._create_partition(segment)
        finally:
            for session in self.sessions.values():
                session.close()
            self.sessions.clear()
        return plpy.prepare(
            f"INSERT INTO {out.quoted} ({self.x}, {self.y}, {self.xs}, {self.ys}, buffer_id, "
            "__dist_key__) VALUES ($1, $2, $3, $4, $5, $6)",
            ["bytea", "bytea", "integer[]", "integer[]", "integer", "integer"])

    def _create_partition(self, segment: int) -> None:
        plpy, out = self.plpy, self.out
        part = out.sibling(f"_seg{segment}", plpy)
        part.must_not_exist(plpy)
        if self.homes is None:
            plpy.execute(f"CREATE TABLE {part.quoted} PARTITION OF {out.quoted} "
                         f"FOR VALUES IN ({segment})")
            # Float bytes do not compress: store them out of line without trying.
            plpy.execute(f"ALTER TABLE {part.quoted} ALTER COLUMN {self.x} SET STORAGE EXTERNAL")
            return
        server = self.homes[segment]
        self._create_remote(server, part, segment)
        self.partition_names[segment] = [part.schema, part.name]
        plpy.execute(
            f"CREATE FOREIGN TABLE {part.quoted} PARTITION OF {out.quoted} "
            f"FOR VALUES IN ({segment}) SERVER {plpy.quote_ident(server.name)} "
            f"OPTIONS (schema_name {plpy.quote_literal(part.schema)}, "
            f"table_name {plpy.quote_literal(part.name)})")

    def _marker(self, segment: int) -> str:
        """What the segment's table there says it is: which coordinator's which packed table."""
        row = self.plpy.execute(
            f"SELECT id::text AS id, current_database() AS db "
            f"FROM {catalog.extension_schema(self.plpy)}.coordinator_id")[0]
        return (f"madlib_mop: segment {segment} of {self.out.quoted} of database {row['db']} "
                f"of coordinator {row['id']}")

    def _used_here(self, server: segments.SegmentServer, part: catalog.NewTable) -> bool:
        """A foreign table of this database points at that table of the server."""
        return bool(self.plpy.execute(self.plpy.prepare(
            "SELECT 1 FROM pg_catalog.pg_foreign_table ft "
            "JOIN pg_catalog.pg_foreign_server s ON s.oid = ft.ftserver "
            "WHERE s.srvname = $1 AND ft.ftoptions @> ARRAY['schema_name=' || $2, "
            "'table_name=' || $3]", ["name", "text", "text"]),
            [server.name, part.schema, part.name]))

    def _create_remote(self, server: segments.SegmentServer, part: catalog.NewTable,
                       segment: int) -> None:
        """The segment's table on its server, made in a session of the calling role there.
        A table of the same name left by an earlier packing into this name of this
        coordinator (its packed table since dropped, or its transaction rolled back) is
        replaced; any other is left alone."""
        plpy = self.plpy
        if server.name not in self.sessions:
            self.sessions[server.name] = segments.session(plpy, server)
        session = self.sessions[server.name]
        marker = self._marker(segment)
        q_schema = plpy.quote_ident(part.schema)
        try:
            found = session.execute(
                "SELECT c.oid, obj_description(c.oid, 'pg_class') AS note, "
                "(SELECT true FROM pg_namespace WHERE nspname = %s) AS schema_exists "
                "FROM (SELECT to_regclass(%s) AS oid) c", (part.schema, part.quoted)).fetchone()
            if not found[2]:  # the packed table's schema, made there by the same role
                session.execute(f"CREATE SCHEMA IF NOT EXISTS {q_schema}")
            if found[0] is not None:
                if found[1] != marker or self._used_here(server, part):
                    raise MadlibMopError(
                        f"table {part.quoted} already exists on {server.label}",
                        sqlstate=errors.DUPLICATE_TABLE,
                        hint="Drop it there, or pass another output_table.")
                plpy.notice(f"madlib_mop: replacing {part.quoted} on {server.label}, left by an "
                            "earlier packing into this name")
                session.execute(f"DROP TABLE {part.quoted}")
            session.execute(f"CREATE TABLE {part.quoted} ({self._columns()}, "
                            f"CHECK (__dist_key__ = {segment}), PRIMARY KEY (__dist_key__, buffer_id))")
            session.execute(f"ALTER TABLE {part.quoted} ALTER COLUMN {self.x} SET STORAGE EXTERNAL")
            session.execute(f"COMMENT ON TABLE {part.quoted} IS {plpy.quote_literal(marker)}")
        except psycopg.Error as error:
            diag = error.diag
            role = plpy.execute("SELECT current_user AS r")[0]["r"]
            raise MadlibMopError(
                f"{server.label}: could not create {part.quoted}: "
                f"{diag.message_primary or error}", sqlstate=diag.sqlstate or errors.DATA_EXCEPTION,
                hint=f"The role needs to create tables in schema {part.schema} there: GRANT "
                     f"CREATE ON SCHEMA {q_schema} TO {plpy.quote_ident(role)};") from None
        self.remote.append((server, part.quoted))

    def drop_remote(self) -> None:
        """After a failure: the tables made on segment servers go (this server's tables go
        with the transaction).  One this transaction wrote to through postgres_fdw stays
        locked until it ends: it is left (the next packing into this name replaces it)."""
        by_server: dict[str, tuple[segments.SegmentServer, list[str]]] = {}
        for server, table in self.remote:
            by_server.setdefault(server.name, (server, []))[1].append(table)
        for server, tables in by_server.values():
            try:
                with segments.session(self.plpy, server) as session:
                    session.execute("SET lock_timeout = '2s'")
                    for table in tables:
                        try:
                            session.execute(f"DROP TABLE IF EXISTS {table}")
                        except psycopg.Error as error:
                            self.plpy.warning(f"madlib_mop: left {table} on {server.label} "
                                              f"({error.diag.message_primary}); packing into "
                                              "this name again replaces it")
            except Exception as error:  # the failure being raised matters more
                self.plpy.warning(f"madlib_mop: left {', '.join(tables)} on {server.label} "
                                  f"({str(error).strip()}); packing into this name again "
                                  "replaces them")
        self.remote.clear()


def _write_summary(plpy, summary_table, source_table, output_table, label, features, buffer_size,
                   normalizing_const, classes, distribution_rules, segments, rows, packed: Packed,
                   seed):
    q = plpy.quote_ident
    class_column = q(f"{label.name}_class_values")
    class_type = ("integer[]" if label.one_hot else f"{label.base_type}[]" if label.classification
                  else "text[]")
    rows_per_segment = [packed.rows_per_segment.get(k, 0) for k in range(segments)]
    buffers_per_segment = [packed.buffers_per_segment.get(k, 0) for k in range(segments)]
    class_values = (list(label.class_values) + [None] * (classes - len(label.class_values))
                    if label.classification else None)
    plpy.execute(f"""
        CREATE TABLE {summary_table.quoted} (
            source_table text, output_table text,
            dependent_varname text[], independent_varname text[], dependent_vartype text[],
            {class_column} {class_type},
            buffer_size integer, normalizing_const real, num_classes integer[],
            distribution_rules text, __internal_gpu_config__ text,
            num_segments integer, num_rows bigint, rows_per_segment bigint[],
            buffers_per_segment integer[], feature_shape integer[], label_kind text,
            shuffle_seed integer)""")
    plan = plpy.prepare(
        f"INSERT INTO {summary_table.quoted} VALUES "
        "($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, 'all_segments', $11, $12, $13, $14, $15, $16, $17)",
        ["text", "text", "text[]", "text[]", "text[]", class_type, "integer", "real", "integer[]",
         "text", "integer", "bigint", "bigint[]", "integer[]", "integer[]", "text", "integer"])
    plpy.execute(plan, [
        source_table, output_table, [label.name], features.names, [label.base_type], class_values,
        int(packed.max_buffer_rows), float(normalizing_const),
        [classes] if classes is not None else None,
        (distribution_rules or "all_segments"), segments, rows, rows_per_segment,
        buffers_per_segment, list(packed.feature_shape),
        "classification" if label.classification else "regression", seed])
