"""Packed tables (made by training_preprocessor_dl / validation_preprocessor_dl) as the
rest of the package reads them: their summary and their column names."""

from __future__ import annotations

from typing import Any

from madlib_mop import errors
from madlib_mop.db import catalog
from madlib_mop.errors import MadlibMopError

# The packed feature column when the features were several scalar columns.
MULTI_COLUMN_FEATURES = "independent_var"


def read_summary(plpy: Any, packed_table: str | int, *, argument: str) -> dict:
    """The `<packed>_summary` row of a table made by training_preprocessor_dl."""
    table = catalog.resolve_table(plpy, packed_table, argument=argument)
    found = catalog.summary_of(plpy, table)
    hint = f"Create {table.name} with training_preprocessor_dl()."
    if found is None:
        raise MadlibMopError(f"{argument} {table.name} has no summary table",
                             sqlstate=errors.UNDEFINED_TABLE, hint=hint)
    summary_name, rows = found
    needed = {"normalizing_const", "num_classes", "dependent_varname", "label_kind",
              "feature_shape", "num_segments"}
    if len(rows) != 1 or not needed <= set(rows[0].keys()):
        raise MadlibMopError(f"{summary_name} is not a summary made by training_preprocessor_dl",
                             sqlstate=errors.DATA_EXCEPTION, hint=hint)
    summary = dict(rows[0])
    summary["packed_table"] = table.name
    summary["packed_oid"] = table.oid
    class_column = f"{summary['dependent_varname'][0]}_class_values"
    values = list(summary.get(class_column) or [])
    while values and values[-1] is None:  # padding up to num_classes
        values.pop()
    summary["class_values"] = values
    return summary


def packed_columns(summary: dict) -> tuple[str, str]:
    """(feature column, label column) of a packed table, from its summary."""
    names = summary["independent_varname"]
    return (names[0] if len(names) == 1 else MULTI_COLUMN_FEATURES), summary["dependent_varname"][0]
