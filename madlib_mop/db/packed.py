"""Packed tables (made by training_preprocessor_dl / validation_preprocessor_dl) as the
rest of the package reads them: their summary and their column names."""

from __future__ import annotations

import os
from typing import Any

from madlib_mop import errors
from madlib_mop.db import catalog, settings
from madlib_mop.errors import MadlibMopError

# The packed feature column when the features were several scalar columns.
MULTI_COLUMN_FEATURES = "independent_var"


def read_summary(plpy: Any, packed_table: str | int, *, argument: str) -> dict:
    """The `<packed>_summary` row of a table made by training_preprocessor_dl (madlib_mop's or
    MADlib's own)."""
    table = catalog.resolve_table(plpy, packed_table, argument=argument)
    found = catalog.summary_of(plpy, table)
    hint = f"Create {table.name} with training_preprocessor_dl()."
    if found is None:
        raise MadlibMopError(f"{argument} {table.name} has no summary table",
                             sqlstate=errors.UNDEFINED_TABLE, hint=hint)
    summary_name, rows = found
    needed = {"normalizing_const", "num_classes", "dependent_varname", "label_kind",
              "feature_shape", "num_segments"}
    if len(rows) == 1 and not needed <= set(rows[0].keys()) and MADLIB_SUMMARY <= set(rows[0].keys()):
        summary = _packed_by_madlib(plpy, table, dict(rows[0]))
    elif len(rows) != 1 or not needed <= set(rows[0].keys()):
        raise MadlibMopError(f"{summary_name} is not a summary made by training_preprocessor_dl",
                             sqlstate=errors.DATA_EXCEPTION, hint=hint)
    else:
        summary = dict(rows[0])
    summary["packed_table"] = table.name
    summary["packed_oid"] = table.oid
    class_column = f"{summary['dependent_varname'][0]}_class_values"
    values = list(summary.get(class_column) or [])
    while values and values[-1] is None:  # padding up to num_classes
        values.pop()
    if summary["label_kind"] == "classification" and not summary.get("num_classes"):
        # One-hot label arrays (NULL class values and num_classes, as MADlib writes them):
        # the classes are the arrays' positions.
        width = _label_width(plpy, table, summary["dependent_varname"][0])
        summary["num_classes"], summary["class_values"] = [width], list(range(width))
    summary["class_values"] = values or summary.get("class_values") or []
    if summary["label_kind"] == "classification" and not summary["class_values"]:
        # NULL class values with a num_classes (MADlib's one-hot summaries): positions
        summary["class_values"] = list(range(summary["num_classes"][0]))
    return summary


def _label_width(plpy: Any, table: catalog.Table, label: str) -> int:
    """The one-hot width of a packed table's labels, from its first buffer's shape."""
    rows = plpy.execute(f"SELECT {plpy.quote_ident(label + '_shape')}[2] AS w FROM {table.name} LIMIT 1")
    if not rows or rows[0]["w"] is None:
        raise MadlibMopError(f"{table.name} is empty", sqlstate=errors.DATA_EXCEPTION,
                             hint="Pack a table with rows.")
    return int(rows[0]["w"])


# What a summary of MADlib's needs at least, as MADlib's readers take it: the label and
# feature columns.  Older versions wrote no num_classes (it is the one-hot width) and one
# class_values column; a normalizing_const left out is 1.
MADLIB_SUMMARY = {"dependent_varname", "independent_varname"}


def _packed_by_madlib(plpy: Any, table: catalog.Table, summary: dict) -> dict:
    """The summary of a table packed by MADlib itself, completed from the table: its rows are
    minibatch buffers like ours (float32 features, int16 one-hot labels, with their shapes),
    but it has no segment column, so buffer b is read by segment b % S, for S one segment
    per CPU of this server (at most one per buffer and a quarter of max_connections); a job
    records its S, and its workers take the modulus from the job."""
    def names(value) -> list:  # MADlib 1.x wrote text, 2.x arrays
        return [value] if isinstance(value, str) else list(value or [])
    x_names, y_names = names(summary["independent_varname"]), names(summary["dependent_varname"])
    if len(x_names) != 1 or len(y_names) != 1:
        raise MadlibMopError(f"{table.name} was packed by MADlib for a model with several inputs "
                             "or outputs, which madlib_mop does not train",
                             sqlstate=errors.FEATURE_NOT_SUPPORTED,
                             hint="Pack one feature array column and one label column.")
    have = catalog.columns(plpy, table)
    wanted = [x_names[0], y_names[0], f"{x_names[0]}_shape", f"{y_names[0]}_shape", "buffer_id"]
    if any(name not in have for name in wanted):
        raise MadlibMopError(f"{table.name} has not the columns of a packed table",
                             sqlstate=errors.DATA_EXCEPTION,
                             detail="Expected: " + ", ".join(wanted) + ".",
                             hint="Pack it again with training_preprocessor_dl().")
    q = plpy.quote_ident
    shapes = plpy.execute(
        f"SELECT {q(x_names[0] + '_shape')}[2:] AS x, {q(y_names[0] + '_shape')}[2] AS y, "
        f"(SELECT count(*) FROM {table.name}) AS buffers FROM {table.name} LIMIT 1")
    if not shapes:
        raise MadlibMopError(f"{table.name} is empty", sqlstate=errors.DATA_EXCEPTION,
                             hint="Pack a table with rows.")
    # The server's CPUs, not a setting a session may change.
    segments = max(1, min(os.cpu_count() or 1, settings.worker_session_limit(plpy),
                          int(shapes[0]["buffers"])))
    width = int(shapes[0]["y"])
    classes = list(summary.get("num_classes") or [width])
    if summary.get("class_values") is not None:  # MADlib 1.x: one class_values column
        summary.setdefault(f"{y_names[0]}_class_values", summary["class_values"])
    vartype = summary.get("dependent_vartype")
    summary.update({
        "dependent_varname": y_names, "independent_varname": x_names,
        "dependent_vartype": [vartype] if isinstance(vartype, str) else vartype,
        "num_classes": classes, "label_kind": "classification",
        "feature_shape": list(shapes[0]["x"]), "num_segments": segments,
        "partition_modulus": segments,
        # one-hot labels packed as they were: classes are their positions
        "class_values": list(range(width)),
        "normalizing_const": float(summary.get("normalizing_const") or 1.0)})
    return summary


def packed_columns(summary: dict) -> tuple[str, str]:
    """(feature column, label column) of a packed table, from its summary."""
    names = summary["independent_varname"]
    return (names[0] if len(names) == 1 else MULTI_COLUMN_FEATURES), summary["dependent_varname"][0]


def partition_modulus(summary: dict) -> int | None:
    """None: the table's __dist_key__ column names each buffer's segment; S: a table packed
    by MADlib, whose buffer b is on segment b % S."""
    return summary.get("partition_modulus")
