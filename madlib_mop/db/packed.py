"""Packed tables (made by training_preprocessor_dl / validation_preprocessor_dl) as the
rest of the package reads them: their summary and their column names."""

from __future__ import annotations

import os
import time
from typing import Any

from madlib_mop import errors
from madlib_mop.db import catalog, settings
from madlib_mop.errors import MadlibMopError
from madlib_mop.json_values import json_value

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
    summary["output_class_values"] = [summary["class_values"]] + [
        _class_values(plpy, table, summary, k) for k in range(1, len(summary["dependent_varname"]))]
    names = summary["independent_varname"]
    # madlib_mop 0.5 packed several scalar columns into one vector column
    summary["features_in_one_column"] = len(names) > 1 and MULTI_COLUMN_FEATURES not in names and \
        MULTI_COLUMN_FEATURES in catalog.columns(plpy, table)
    summary["input_shapes"] = _input_shapes(plpy, table, summary)
    return summary


def class_count(summary: dict, output: int) -> int:
    """How many classes output `output`'s one-hot labels have (num_classes' padding too)."""
    classes = summary.get("num_classes") or []
    if len(classes) > output and classes[output]:
        return int(classes[output])
    return len(summary["output_class_values"][output])


def _class_values(plpy: Any, table: catalog.Table, summary: dict, output: int) -> list | None:
    """The classes of a later output of a table packed for a model of several: its summary's
    `<label>_class_values` without num_classes' padding, or, for one-hot label arrays, their
    positions; None for regression targets."""
    if summary["label_kind"] != "classification":
        return None
    label = summary["dependent_varname"][output]
    values = list(summary.get(f"{label}_class_values") or [])
    classes = (summary.get("num_classes") or [])
    if not values:
        width = classes[output] if len(classes) > output and classes[output] else _label_width(plpy, table, label)
        return list(range(width))
    while values and values[-1] is None:
        values.pop()
    return values


def _input_shapes(plpy: Any, table: catalog.Table, summary: dict) -> list[list[int]]:
    """Each input's feature shape: the summary's for one input; for several, each feature
    column's shape in the first buffer (the summary's integer[] holds one shape)."""
    names = summary["independent_varname"]
    if len(names) == 1 or summary["features_in_one_column"]:
        return [list(summary["feature_shape"])]
    q = plpy.quote_ident
    row = plpy.execute("SELECT " + ", ".join(f"{q(n + '_shape')}[2:] AS s{i}" for i, n in enumerate(names))
                       + f" FROM {table.name} LIMIT 1")
    if not row:
        raise MadlibMopError(f"{table.name} is empty", sqlstate=errors.DATA_EXCEPTION,
                             hint="Pack a table with rows.")
    return [list(row[0][f"s{i}"]) for i in range(len(names))]


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
    minibatch buffers like ours (float32 features, int16 one-hot labels, with their shapes;
    MADlib 2 packs each of several inputs and outputs in its own column, as we do), but it
    has no segment column, so buffer b is read by segment b % S, for S one segment
    per CPU of this server (at most one per buffer and a quarter of max_connections); a job
    records its S, and its workers take the modulus from the job."""
    def names(value) -> list:  # MADlib 1.x wrote text, 2.x arrays
        return [value] if isinstance(value, str) else list(value or [])
    x_names, y_names = names(summary["independent_varname"]), names(summary["dependent_varname"])
    have = catalog.columns(plpy, table)
    wanted = x_names + y_names + [f"{n}_shape" for n in x_names + y_names] + ["buffer_id"]
    if any(name not in have for name in wanted):
        raise MadlibMopError(f"{table.name} has not the columns of a packed table",
                             sqlstate=errors.DATA_EXCEPTION,
                             detail="Expected: " + ", ".join(wanted) + ".",
                             hint="Pack it again with training_preprocessor_dl().")
    q = plpy.quote_ident
    label_widths = ", ".join(f"{q(y + '_shape')}[2] AS y{k}" for k, y in enumerate(y_names))
    shapes = plpy.execute(
        f"SELECT {q(x_names[0] + '_shape')}[2:] AS x, {label_widths}, "
        f"(SELECT count(*) FROM {table.name}) AS buffers FROM {table.name} LIMIT 1")
    if not shapes:
        raise MadlibMopError(f"{table.name} is empty", sqlstate=errors.DATA_EXCEPTION,
                             hint="Pack a table with rows.")
    # The server's CPUs, not a setting a session may change.
    segments = max(1, min(os.cpu_count() or 1, settings.worker_session_limit(plpy),
                          int(shapes[0]["buffers"])))
    widths = [int(shapes[0][f"y{k}"]) for k in range(len(y_names))]
    classes = list(summary.get("num_classes") or widths)
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
        "class_values": list(range(widths[0])),
        "normalizing_const": float(summary.get("normalizing_const") or 1.0)})
    return summary


def packed_columns(summary: dict) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(feature columns, label columns) of a packed table, from its summary: one per input
    of the model, one per output.  (madlib_mop 0.5 packed several scalar columns into one
    vector column, `independent_var`.)"""
    names = summary["independent_varname"]
    features = (MULTI_COLUMN_FEATURES,) if summary.get("features_in_one_column") else tuple(names)
    return features, tuple(summary["dependent_varname"])


def partition_modulus(summary: dict) -> int | None:
    """None: the table's __dist_key__ column names each buffer's segment; S: a table packed
    by MADlib, whose buffer b is on segment b % S."""
    return summary.get("partition_modulus")


# Advisory locks on packed tables (two-key form: this number and the table's oid): a job's
# coordinator holds a shared one on its training and validation tables while it runs, and
# preprocessor_dl_append takes an exclusive one, so that rows are never appended under a
# running job.
DATA_LOCK = 0x6D6F7064


def data_lock_keys(oid: int) -> tuple[int, int]:
    """The advisory lock's two int4 keys for the packed table `oid`."""
    return DATA_LOCK, oid - 2 ** 32 if oid >= 2 ** 31 else oid


def lock_for_change(plpy: Any, table: catalog.Table, what: str) -> None:
    """The exclusive data lock on the packed table `table` for this transaction, or 55006
    when a job trains on it (or another call changes it)."""
    if not plpy.execute(plpy.prepare("SELECT pg_try_advisory_xact_lock($1, $2) AS locked",
                                     ["integer", "integer"]), list(data_lock_keys(table.oid)))[0]["locked"]:
        raise MadlibMopError(f"a job is training on {table.name}, or rows are being {what} it",
                             sqlstate=errors.OBJECT_IN_USE,
                             detail="Rows changed under a running job would change its data between "
                                    "epochs.",
                             hint="Try again when the job has ended (madlib_mop.job_progress).")


def hold_data(db: Any, tables: list[str | None], wait_seconds: float = 60.0) -> None:
    """A job coordinator's shared data locks on its packed tables (SQL names; None: none),
    held for as long as the connection `db` lives.  An append holds the exclusive one for
    its transaction: the job waits for it to end.  One held longer is not an append's (any
    role can take advisory locks): after `wait_seconds` the job goes on without the lock."""
    for name in tables:
        if name is None:
            continue
        oid = db.execute("SELECT to_regclass(%s)::oid", (name,)).fetchone()[0]
        if oid is None:
            continue
        deadline = time.monotonic() + wait_seconds
        while not db.execute("SELECT pg_try_advisory_lock_shared(%s, %s)",
                             data_lock_keys(oid)).fetchone()[0] and time.monotonic() < deadline:
            time.sleep(0.2)


# The summary's column of a table packed in key order (`preprocess.keyed`).
KEY_ORDER_COLUMN = "packed_by_key"


def key_order(summary: dict) -> dict | None:
    """How a table packed in key order was packed, as its summary says (`preprocess.keyed.
    KeyOrder`'s fields); None for a table packed otherwise."""
    recorded = summary.get(KEY_ORDER_COLUMN)
    return None if recorded is None else json_value(recorded)


def rows_in_key_order(summary: dict) -> int | None:
    """The rows a table packed in key order holds, as its summary says; None for a table
    packed otherwise."""
    order = key_order(summary)
    return None if order is None else int(order["rows"])


def check_not_grown(db: Any, job_id: int, tables: dict[str, str | None], recorded: dict) -> None:
    """Refuse to go on with a job whose tables packed in key order (argument -> SQL name)
    hold other rows than when it started (`recorded`: argument -> rows): rows were appended
    since, and its remaining sub-epochs would train on other data."""
    for argument, rows in recorded.items():
        name = tables.get(argument)
        summary = name and db.execute(
            "SELECT format('%%I.%%I', n.nspname, c.relname || '_summary') FROM pg_catalog.pg_class c "
            "JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace WHERE c.oid = to_regclass(%s)",
            (name,)).fetchone()
        now = summary and db.execute(  # NULL: packed again, not in key order
            f"SELECT (to_jsonb(s) -> '{KEY_ORDER_COLUMN}' ->> 'rows')::bigint FROM {summary[0]} s").fetchone()
        if now is not None and now[0] != rows:
            raise MadlibMopError(
                f"job {job_id} started on the {rows} rows of {name}, which now holds "
                + (f"{now[0]}" if now[0] is not None else "other rows"),
                sqlstate=errors.OBJECT_NOT_IN_PREREQUISITE_STATE,
                detail="Rows were appended to it (preprocessor_dl_append) since: the job's "
                       "remaining sub-epochs would train on other data than its first ones.",
                hint="Start a new job on the grown table (warm_start => TRUE continues the "
                     "models of a finished one).")
