"""Reading a source table for packing: its feature and label columns (MADlib's meaning of
each label type), their class values, and the rows in chunks of physical blocks (TID range
scans), each chunk's features packed into one float32 buffer by the server (float4_pack)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

import numpy as np

from madlib_mop import errors
from madlib_mop.db import catalog, packed, scan
from madlib_mop.errors import MadlibMopError
from madlib_mop.plpy_bridge import SpiError
from madlib_mop.runtime import packing


FLOAT_TYPES = {"real", "double precision", "numeric"}


MANY_FLOAT_CLASSES = 100  # more float classes than this and than half the rows: a target


PACKABLE_ARRAYS = {"real[]", "double precision[]", "smallint[]", "integer[]", "bigint[]"}



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
    # Validation rows whose NULL label is no class of the training data: packed with an
    # all-zero one-hot label, as MADlib packs them (`class_values_of`).
    null_unmatched: bool = False

    @property
    def as_codes(self) -> bool:
        """Read as values to encode (scalar classes), not as arrays of numbers."""
        return self.classification and not self.one_hot

    @property
    def kind(self) -> str:
        return "one_hot" if self.one_hot else "classes" if self.classification else "regression"


def feature_columns(plpy: Any, table: catalog.Table, independent_varname: str) -> list[Features]:
    """The feature columns: 'a, b' names the inputs of a model of several (MADlib's
    meaning), each a numeric array column, fed to the model's inputs in this order."""
    names = catalog.column_names(plpy, independent_varname, argument="independent_varname")
    if len(set(names)) != len(names):
        raise MadlibMopError(f"independent_varname '{independent_varname}' names a column twice",
                             sqlstate=errors.INVALID_PARAMETER_VALUE,
                             hint="Name each input's column once.")
    if len(names) > 1:
        scalars = [name for name in names
                   if catalog.column(plpy, table, name, argument="independent_varname").is_numeric]
        if len(scalars) == len(names):
            listed = ", ".join(plpy.quote_ident(name) for name in names)
            raise MadlibMopError(
                f"independent_varname '{independent_varname}' names {len(names)} numeric columns: "
                "in MADlib, the inputs of a model of several inputs, each a numeric array",
                sqlstate=errors.DATATYPE_MISMATCH,
                hint=f"For one input made of these columns, pack a view with ARRAY[{listed}]::real[] "
                     "AS attributes and pass 'attributes'.")
    return [_feature_column(plpy, table, name) for name in names]


def _feature_column(plpy: Any, table: catalog.Table, name: str) -> Features:
    column = catalog.column(plpy, table, name, argument="independent_varname")
    if column.is_numeric_array:
        quoted = plpy.quote_ident(name)
        # float4_pack reads real, double precision and integer arrays as they are.
        cast = "" if column.base_type in PACKABLE_ARRAYS else "::double precision[]"
        return Features([name], f"{quoted}{cast}", name)
    raise MadlibMopError(
        f'independent_varname "{column.name}" has type {column.type}, which is not a numeric array',
        sqlstate=errors.DATATYPE_MISMATCH,
        detail="Features are one numeric array column, of any shape (as in MADlib).",
        hint="Pass an array column such as real[] or double precision[]; for numeric columns, "
             f"a view with ARRAY[{column.name}, ...]::real[] AS attributes.",
    )


def label_columns(plpy: Any, table: catalog.Table, dependent_varname: str, regression: bool) -> list[Label]:
    """The label columns: 'y1, y2' names the outputs of a model of several (MADlib's
    meaning), in the order of the model's outputs."""
    names = catalog.column_names(plpy, dependent_varname, argument="dependent_varname")
    if len(set(names)) != len(names):
        raise MadlibMopError(f"dependent_varname '{dependent_varname}' names a column twice",
                             sqlstate=errors.INVALID_PARAMETER_VALUE,
                             hint="Name each output's column once.")
    return [label_of(plpy, table, name, regression) for name in names]


def label_of(plpy: Any, table: catalog.Table, name: str, regression: bool) -> Label:
    """MADlib's meaning: a scalar label (text, integer, boolean, also a float) holds classes
    and a numeric array label is already one-hot; numbers are regression targets only when
    asked for (`regression => TRUE`)."""
    column = catalog.column(plpy, table, name, argument="dependent_varname")
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


# MADlib's words for the same mistakes, at the end of ours: scripts look for them.
_MADLIB_PHRASES = {"buffer_size": ": The buffer size has to be a positive integer or NULL",
                   "normalizing_const": ": The normalizing constant has to be a positive "
                                        "integer or NULL"}


def check_positive(value: Any, argument: str, allow_null: bool = True) -> None:
    if value is None and allow_null:
        return
    if value is None or not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
        raise MadlibMopError(f"{argument} must be a positive number, not {value}"
                             + _MADLIB_PHRASES.get(argument, ""),
                             sqlstate=errors.INVALID_PARAMETER_VALUE,
                             hint=f"Pass a positive {argument}" + (" or NULL." if allow_null else "."))


class SourceReader:
    """Reads (features, labels) of every row in a fixed scan order, chunk by chunk.

    A chunk is a range of physical blocks (a TID range scan); the aggregate float4_pack
    (src/float4_pack.c) turns its rows' arrays into one float32 buffer inside the server.
    Sources without blocks of their own (views, partitioned or foreign tables) are first
    copied into a temporary table.
    """

    def __init__(self, plpy: Any, table: catalog.Table, features: list[Features], labels: list[Label]):
        self.plpy = plpy
        self.source = table
        self.labels = labels
        self.inputs = len(features)
        schema = catalog.extension_schema(plpy)
        xs = [f.expression for f in features]
        ys = [label.expression for label in labels]
        if table.kind not in ("r", "m"):
            scratch = plpy.quote_ident(f"madlib_mop_source_{table.oid}")
            if plpy.execute(f"SELECT to_regclass('pg_temp.{scratch}') IS NOT NULL AS e")[0]["e"]:
                plpy.execute(f"DROP TABLE pg_temp.{scratch}")
            plpy.execute(f"CREATE TEMP TABLE {scratch} AS SELECT "
                         + ", ".join([f"{x} AS x{i}" for i, x in enumerate(xs)]
                                     + [f"{y} AS y{i}" for i, y in enumerate(ys)])
                         + f" FROM {table.name}")
            self.scan_table = catalog.resolve_table(plpy, f"pg_temp.{scratch}")
            self.scratch = self.scan_table.name
            xs, ys = [f"x{i}" for i in range(len(xs))], [f"y{i}" for i in range(len(ys))]
        else:
            self.scan_table = table
            self.scratch = None
        columns = [f"{schema}.float4_pack({x}) AS x{i}" for i, x in enumerate(xs)]
        columns += [f"array_agg({y}) AS y{i}" if label.as_codes else f"{schema}.float4_pack({y}) AS y{i}"
                    for i, (y, label) in enumerate(zip(ys, labels))]
        self.chunk_plan = plpy.prepare(
            f"SELECT count(*) AS n, {', '.join(columns)} "
            f"FROM {self.scan_table.name} WHERE ctid >= $1::tid AND ctid < $2::tid",
            ["text", "text"])

    def close(self) -> None:
        if self.scratch is not None:
            self.plpy.execute(f"DROP TABLE {self.scratch}")
            self.scratch = None

    def chunks(self):
        """Yield ([features float32 (n, *shape) per input], [labels per output: list, or
        float32 (n, k)]) per chunk."""
        for bounds in scan.block_chunks(0, scan.table_blocks(self.plpy, self.scan_table.oid)):
            try:
                row = self.plpy.execute(self.chunk_plan, list(bounds))[0]
            except self.plpy.SPIError as error:
                raise source_error(error, self.source) from None
            if row["n"] == 0:
                continue
            features = [packing.unpack_float4(row[f"x{i}"], row["n"])
                        for i in range(self.inputs)]
            labels = [row[f"y{i}"] if label.as_codes
                      else packing.unpack_float4(row[f"y{i}"], row["n"]).reshape(row["n"], -1)
                      for i, label in enumerate(self.labels)]
            for label, values in zip(self.labels, labels):
                if label.one_hot and not np.isin(values, (0.0, 1.0)).all():
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


def source_error(error: Any, table: catalog.Table) -> Exception:
    """float4_pack's errors (NULL, shape, NaN, type) restated with the table's name."""
    said = SpiError.of(error)
    restated = (errors.NULL_VALUE_NOT_ALLOWED, errors.DATA_EXCEPTION, errors.NUMERIC_VALUE_OUT_OF_RANGE,
                errors.DATATYPE_MISMATCH)
    if said.sqlstate not in restated or "madlib_mop:" not in said.message:
        return error
    return MadlibMopError(f"{table.name}: {said.message.split('madlib_mop: ', 1)[1]}",
                          sqlstate=said.sqlstate, detail=said.detail, hint=said.hint)


def class_values_of(plpy, table, label, training, output: int = 0) -> list:
    # Byte order for text classes, so the order does not depend on the database's collation.
    # GROUP BY (not DISTINCT): over segment servers, each groups its own rows.
    order = "v COLLATE \"C\"" if label.base_type in ("text", "character varying", "character") else "v"
    # NULL is a class (MADlib's meaning), the first: trailing NULLs of a summary's class values
    # are num_classes' padding.
    counted = plpy.execute(
        f"SELECT v, n FROM (SELECT {label.expression} AS v, count(*) AS n FROM {table.name} "
        f"GROUP BY 1) d ORDER BY {order} NULLS FIRST")
    found = [row["v"] for row in counted]
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
    known = training["output_class_values"][output]
    known_text = {as_text(v) for v in known}
    unknown = [v for v in found if v not in known and as_text(v) not in known_text]
    if unknown[:1] == [None]:
        # MADlib one-hot encodes a validation label by `label IS NOT DISTINCT FROM class` for
        # each training class: a NULL that is no class gets a row of zeros.  So does this.
        unknown.pop(0)
        label.null_unmatched = True
        plpy.notice(
            f"{table.name}: {counted[0]['n']} rows have a NULL label, which is no class of "
            f"{training['packed_table']}: they are packed with an all-zero one-hot label, as "
            "MADlib packs them (they add nothing to a cross-entropy loss; accuracy compares "
            "their prediction with the first class). Leave them out with a view "
            f"WHERE {plpy.quote_ident(label.name)} IS NOT NULL to measure without them.")
    if unknown:
        raise MadlibMopError(
            f"{table.name} has labels that the training data does not have: "
            + ", ".join(repr(v) for v in unknown[:5]) + (" ..." if len(unknown) > 5 else ""),
            sqlstate=errors.INVALID_PARAMETER_VALUE,
            detail="Training classes: " + ", ".join(repr(v) for v in known[:20]) + ".",
            hint="Remove those rows, or pack training data that has every class.")
    # Validation labels are encoded in the training's class order, typed like the source's.
    by_text = {as_text(v): v for v in found}
    return [by_text.get(as_text(v), v) for v in known]


def as_text(value: Any) -> str | None:
    """A class value compared across types (the summary's against the source's); NULL stays
    apart from the text 'None'."""
    return None if value is None else str(value)


def one_hot_positions(plpy, table, label, training, output: int = 0) -> list:
    """The classes of one-hot label arrays: their positions 0 .. n-1."""
    widths = [row["n"] for row in plpy.execute(
        f"SELECT cardinality({label.expression}) AS n FROM {table.name} GROUP BY 1 LIMIT 2")]
    if len(widths) != 1 or not widths[0]:
        raise MadlibMopError(f"the label arrays of {table.name} differ in length or are empty",
                             sqlstate=errors.DATA_EXCEPTION,
                             detail=f"Found lengths {widths}.",
                             hint="Every one-hot label needs one entry per class.")
    if training is not None and (training["label_kind"] != "classification"
                                 or not str(training["dependent_vartype"][output]).endswith("[]")
                                 or len(training["output_class_values"][output]) != widths[0]):
        raise MadlibMopError(
            f"dependent_varname {label.name} holds one-hot rows of {widths[0]} classes, unlike "
            f"the labels of {training['packed_table']}",
            sqlstate=errors.DATATYPE_MISMATCH,
            hint="Use a label column of the same kind as the training data's.")
    return list(range(widths[0]))


def class_count(class_values: list, num_classes: list | None, training: dict | None,
                padding: bool = True, output: int = 0) -> int:
    """How many classes output `output` has: num_classes' (one entry per output, as in
    MADlib; checked by `check_num_classes`), the training data's, or its class values'."""
    if training is not None:
        return packed.class_count(training, output)
    if num_classes is None or num_classes[output] is None:
        return len(class_values)
    given = num_classes[output]
    if not padding and given != len(class_values):
        raise MadlibMopError(
            f"num_classes {list(num_classes)} differs from the {len(class_values)} entries of "
            "the one-hot label arrays", sqlstate=errors.INVALID_PARAMETER_VALUE,
            hint="Pass NULL: one-hot labels give their number of classes.")
    if given < len(class_values):
        raise MadlibMopError(
            f"num_classes {given} is less than the {len(class_values)} classes found: "
            "Invalid num_classes value specified",
            sqlstate=errors.INVALID_PARAMETER_VALUE,
            hint=f"Pass NULL or ARRAY[n] with n >= {len(class_values)}.")
    return int(given)


def check_num_classes(num_classes: list | None, outputs: int) -> None:
    """num_classes: one entry per output (MADlib's INTEGER[]), or NULL."""
    if num_classes is not None and len(num_classes) != outputs:
        example = ", ".join(["10"] * outputs)
        raise MadlibMopError(f"num_classes {list(num_classes)} has {len(num_classes)} entries, "
                             f"dependent_varname names {outputs} label columns",
                             sqlstate=errors.INVALID_PARAMETER_VALUE,
                             hint=f"Pass one number per label column, e.g. ARRAY[{example}], or NULL.")


def encode(values: list, class_index: dict, table_name: str, label) -> np.ndarray:
    """Each value's position among the class values; -1 for a NULL that is no class
    (`Label.null_unmatched`): no position, an all-zero one-hot row."""
    if label.null_unmatched:
        class_index = {**class_index, None: -1}
    try:
        return np.fromiter((class_index[v] for v in values), dtype=np.int64, count=len(values))
    except KeyError as error:  # a row was added after the class values were read
        raise MadlibMopError(f"{table_name} changed while it was being packed: label "
                             f"{error.args[0]!r} appeared",
                             sqlstate=errors.DATA_EXCEPTION,
                             hint="Pack a table that is not being written to.") from None
