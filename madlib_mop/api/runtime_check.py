"""`version()` and `runtime_check(...)`: is the in-database runtime working?

`runtime_check` reads a table through SPI inside the server, trains a small Keras network on
it with TensorFlow and reports what it did.  It is the installation check an administrator
runs after `CREATE EXTENSION`; model selection proper is `madlib_keras_fit_multiple_model`.
"""

from __future__ import annotations

import json
import platform
import time
from typing import Any

import madlib_mop
from madlib_mop import errors
from madlib_mop.db import catalog
from madlib_mop.errors import MadlibMopError
from madlib_mop.runtime.tf_runtime import import_tensorflow, make_deterministic

NUMERIC_ARRAY_TYPES = {
    "smallint[]", "integer[]", "bigint[]", "real[]", "double precision[]", "numeric[]",
}


def version(plpy: Any) -> str:
    server = plpy.execute("SELECT current_setting('server_version') AS v")[0]["v"]
    tf = import_tensorflow()
    import keras
    import numpy

    return (
        f"madlib_mop {madlib_mop.__version__}, PostgreSQL {server}, "
        f"Python {platform.python_version()}, TensorFlow {tf.__version__}, "
        f"Keras {keras.__version__}, NumPy {numpy.__version__}"
    )


def runtime_check(plpy: Any, source_table: str, dependent_varname: str,
                  independent_varname: str, epochs: int = 10, seed: int = 0) -> str:
    """Train a small classifier on `source_table`; return a JSON report."""
    if epochs is None or epochs < 1:
        raise MadlibMopError(
            f"epochs must be at least 1, not {epochs}",
            sqlstate=errors.INVALID_PARAMETER_VALUE,
            hint="Pass a positive number of passes over the table.",
        )
    table = catalog.resolve_table(plpy, source_table)
    catalog.column_type(plpy, table, dependent_varname, argument="dependent_varname")
    feature_type = catalog.column_type(plpy, table, independent_varname, argument="independent_varname")
    if feature_type not in NUMERIC_ARRAY_TYPES:
        raise MadlibMopError(
            f'independent_varname "{independent_varname}" has type {feature_type}, '
            "not a numeric array",
            sqlstate=errors.DATATYPE_MISMATCH,
            hint="Pass a column of type real[], double precision[], integer[] or numeric[].",
        )

    started = time.perf_counter()
    rows = plpy.execute(
        "SELECT {x}::float8[] AS x, {y}::text AS y FROM {t}".format(
            x=plpy.quote_ident(independent_varname),
            y=plpy.quote_ident(dependent_varname),
            t=table.name,
        )
    )
    features, labels = _to_arrays(rows, table.name)
    read_seconds = time.perf_counter() - started

    import numpy as np

    class_values, label_codes = np.unique(labels, return_inverse=True)
    tf = import_tensorflow()
    import keras

    make_deterministic(seed)
    model = keras.Sequential([
        keras.Input(shape=(features.shape[1],)),
        keras.layers.Dense(16, activation="relu"),
        keras.layers.Dense(len(class_values), activation="softmax"),
    ])
    model.compile(optimizer=keras.optimizers.Adam(learning_rate=0.01),
                  loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    fit_started = time.perf_counter()
    history = model.fit(features, label_codes, epochs=epochs, batch_size=16,
                        shuffle=True, verbose=0)
    report = {
        "source_table": table.name,
        "rows": int(features.shape[0]),
        "features": int(features.shape[1]),
        "class_values": [str(v) for v in class_values],
        "epochs": epochs,
        "loss": [round(float(v), 6) for v in history.history["loss"]],
        "accuracy": [round(float(v), 6) for v in history.history["accuracy"]],
        "read_seconds": round(read_seconds, 3),
        "train_seconds": round(time.perf_counter() - fit_started, 3),
        "python": platform.python_version(),
        "tensorflow": tf.__version__,
        "keras": keras.__version__,
    }
    return json.dumps(report)


def _to_arrays(rows: Any, table_name: str):
    import numpy as np

    if len(rows) == 0:
        raise MadlibMopError(
            f"{table_name} has no rows",
            sqlstate=errors.DATA_EXCEPTION,
            hint="Load data into the table first.",
        )
    features, labels = [], []
    for row in rows:
        if row["x"] is None or row["y"] is None or any(v is None for v in row["x"]):
            raise MadlibMopError(
                f"{table_name} has a row with a NULL feature or label",
                sqlstate=errors.NULL_VALUE_NOT_ALLOWED,
                hint="Remove or fill such rows, e.g. with a WHERE clause in a view.",
            )
        features.append(row["x"])
        labels.append(row["y"])
    try:
        matrix = np.asarray(features, dtype=np.float32)
    except ValueError:
        matrix = None
    if matrix is None or matrix.ndim != 2:
        raise MadlibMopError(
            f"the feature arrays of {table_name} differ in length",
            sqlstate=errors.DATA_EXCEPTION,
            hint="Every row needs a feature array of the same length.",
        )
    return matrix, np.asarray(labels)
