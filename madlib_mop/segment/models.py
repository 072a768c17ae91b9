"""The trained models a call reads (a fit's output table and its `_info`, or an
architecture table's model for BYOM) and building them in Keras: shared by the calls that
evaluate and predict and by the worker sessions that run their parts."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from madlib_mop import errors
from madlib_mop.db import catalog
from madlib_mop.errors import MadlibMopError
from madlib_mop.job import plan
from madlib_mop.job.tables import TABLE_SUFFIXES
from madlib_mop.runtime import keras_json, model_state, training
from madlib_mop.runtime.custom_functions import CustomFunctions, unpickle



@dataclass
class ModelRef:
    """A trained model: where its architecture, weights and parameters are."""

    model_table: str | None  # quoted, for messages
    mst_key: int | None  # None: madlib_keras_fit's one model, or BYOM
    model_arch: str
    weights: bytes | None
    compile_params: str | None
    class_values: list | None
    normalizing_const: float
    dependent_varname: str
    model_oid: int | None = None
    object_table: str | None = None  # custom functions (the fit's summary names the table)
    custom: CustomFunctions | None = None  # in a worker: those functions, loaded
    # A model of several outputs: (label, class values) of each (the first's are above)
    outputs: list | None = None

    @property
    def output_classes(self) -> list[tuple[str, list | None]]:
        """(label, class values or None for regression) of each output of the model."""
        return self.outputs or [(self.dependent_varname, self.class_values)]

    def spec(self) -> training.ModelSpec:
        return training.ModelSpec(self.mst_key or 0, self.model_arch,
                                  self.compile_params or "loss='mse'", "", None, self.custom)


def summary_of(plpy: Any, table: catalog.Table) -> dict:
    found = catalog.summary_of(plpy, table)
    rows = found[1] if found else []
    if len(rows) != 1 or "normalizing_const" not in rows[0] or "model_info" not in rows[0]:
        raise MadlibMopError(f"model_table {table.name} was not made by madlib_keras_fit or "
                             "madlib_keras_fit_multiple_model",
                             sqlstate=errors.UNDEFINED_TABLE,
                             hint="Pass the model_output_table of a fit.")
    return dict(rows[0])


def trained_models(plpy: Any, model_table: str | int, mst_key: int | None, *, all_models: bool = False
                   ) -> list[ModelRef]:
    table = catalog.resolve_table(plpy, model_table, argument="model_table")
    summary = summary_of(plpy, table)
    single = "compile_params" in summary  # madlib_keras_fit's summary holds its one model
    if single and mst_key is not None:
        raise MadlibMopError(f"{table.name} holds one model: do not pass mst_key",
                             sqlstate=errors.INVALID_PARAMETER_VALUE, hint="Pass mst_key => NULL.")
    if not single and mst_key is None and not all_models:
        raise MadlibMopError(f"{table.name} holds several models: pass mst_key",
                             sqlstate=errors.INVALID_PARAMETER_VALUE,
                             hint=f"SELECT mst_key FROM {summary['model_info']}; lists them "
                                  "(madlib_keras_evaluate_multiple_model evaluates all).")
    label = summary["dependent_varname"][0]
    # <model>_info beside the model table, resolved by the catalog: the summary's model_info
    # text is data (possibly another role's), never SQL.
    info = catalog.sibling_table(plpy, table, "_info")
    rows = plpy.execute(plpy.prepare(
        f"SELECT o.mst_key, o.model_arch::text AS model_arch, o.model_weights, i.compile_params, "
        # (an _info of an earlier version has no status)
        f"to_jsonb(i)->>'status' AS status, i.stop_reason "
        f"FROM {table.name} o JOIN {info.name} i USING (mst_key) "
        "WHERE $1::int IS NULL OR o.mst_key = $1 ORDER BY o.mst_key", ["integer"]),
        [None if single else mst_key])
    diverged = [r for r in rows if r["status"] == "diverged"]
    if diverged and (mst_key is not None or single):
        raise MadlibMopError(
            f"mst_key {diverged[0]['mst_key']} diverged while training: {table.name} holds its "
            "weights from before, which are not a usable model",
            sqlstate=errors.DATA_EXCEPTION, detail=diverged[0]["stop_reason"],
            hint=f"Pick another mst_key: SELECT mst_key, status FROM {info.name};")
    rows = [r for r in rows if r["status"] != "diverged"]  # all of a table's models: the others
    if not rows:
        raise MadlibMopError(f"mst_key {mst_key} is not in {table.name}",
                             sqlstate=errors.INVALID_PARAMETER_VALUE,
                             hint=f"SELECT mst_key FROM {table.name}; lists the models.")
    values = class_values(summary, label)
    labels = summary["dependent_varname"]
    outputs = ([(name, class_values(summary, name, k)) for k, name in enumerate(labels)]
               if len(labels) > 1 else None)
    return [ModelRef(table.name, None if single else r["mst_key"], r["model_arch"],
                     r["model_weights"] if r["model_weights"] is not None
                     else weights_in_pieces(plpy, table, r["mst_key"]), r["compile_params"], values,
                     float(summary["normalizing_const"] or 1.0), label, table.oid,
                     summary.get("object_table"), outputs=outputs) for r in rows]


_loaded: dict[tuple, dict] = {}  # (object table oid, name, digest) -> callable, per session


def custom_functions(plpy: Any, recorded: dict | None) -> CustomFunctions | None:
    """The custom functions a job recorded (`job.plan.custom_functions_of`), loaded in this
    worker session: the object table and each row pass the trust rule again, now and as this
    session's role, and hold the bytes the job recorded; only then are they unpickled."""
    if not recorded:
        return None
    table, rows = plan.recorded_functions(plpy, recorded, with_objects=True)
    digests = dict(recorded["digests"])
    objects = {}
    for name, expected in digests.items():
        key = (table.oid, name, expected)
        if key not in _loaded:
            _loaded[key] = unpickle(name, rows[name]["object"], table.name)
        objects[name] = _loaded[key]
    return CustomFunctions(table.name, digests, objects)


def class_values(summary: dict, label: str, output: int = 0) -> list | None:
    """A fit summary's classes: its class values without num_classes' padding (trailing
    NULLs); None for regression.  One-hot labels have none (MADlib writes NULL, or NULLs):
    their classes are the positions '0' .. 'n-1', as MADlib predicts them; [] when the
    summary has no num_classes either (the caller takes the model's outputs)."""
    values = summary.get(f"{label}_class_values")
    counts = summary.get("num_classes") or []
    classes = counts[output] if len(counts) > output else None
    if values is None and not classes:
        return None
    values = list(values or [])
    while values and values[-1] is None:
        values.pop()
    return values or [str(i) for i in range(classes or 0)]


def architecture_model(plpy: Any, model_arch_table: str, model_id: int) -> ModelRef:
    """A model loaded with its weights by load_keras_model (MADlib's BYOM): no compile
    params, no class values, no normalizing (the callers that need them set them)."""
    table = catalog.resolve_table(plpy, model_arch_table, argument="model_arch_table")
    rows = plpy.execute(plpy.prepare(
        f"SELECT model_arch::text AS model_arch, model_weights FROM {table.name} WHERE model_id = $1",
        ["integer"]), [model_id])
    if not rows:
        raise MadlibMopError(f"model_id {model_id} is not in {table.name}",
                             sqlstate=errors.INVALID_PARAMETER_VALUE,
                             hint=f"SELECT model_id, name FROM {table.name}; lists the models.")
    if rows[0]["model_weights"] is None:
        raise MadlibMopError(f"model_id {model_id} of {table.name} has no weights",
                             sqlstate=errors.NULL_VALUE_NOT_ALLOWED,
                             hint="Load the model with its weights: load_keras_model(table, arch, weights).")
    return ModelRef(table.name, None, rows[0]["model_arch"], rows[0]["model_weights"], None, None, 1.0,
                    "dependent_var")


def weights_in_pieces(plpy: Any, table: catalog.Table, mst_key: int) -> bytearray:
    """A model's weights too big for one value of `<out>`.model_weights: its pieces in
    `<out>_mop_weights`, read one at a time into one buffer (`job.outputs`)."""
    # (its name as the sibling of `table`, NULL when it does not exist)
    pieces = plpy.execute(plpy.prepare(
        "SELECT pg_catalog.to_regclass(pg_catalog.format('%I.%I', n.nspname, c.relname || $2))::text AS name "
        "FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace "
        "WHERE c.oid = $1", ["oid", "text"]), [table.oid, TABLE_SUFFIXES["weights"]])[0]["name"]
    sizes = [] if pieces is None else plpy.execute(plpy.prepare(
        f"SELECT piece, octet_length(model_weights) AS n FROM {pieces} "
        "WHERE mst_key = $1 ORDER BY piece", ["integer"]), [mst_key])
    if not sizes:
        raise MadlibMopError(f"model {mst_key} of {table.name} has no weights",
                             sqlstate=errors.NULL_VALUE_NOT_ALLOWED,
                             detail=f"{table.name}.model_weights is NULL and no "
                                    f"{TABLE_SUFFIXES['weights']} table holds them.",
                             hint="Train the model again (its job writes them).")
    piece = plpy.prepare(f"SELECT model_weights FROM {pieces} "
                         "WHERE mst_key = $1 AND piece = $2", ["integer", "integer"])
    weights, start = bytearray(sum(row["n"] for row in sizes)), 0
    for row in sizes:
        weights[start:start + row["n"]] = plpy.execute(piece, [mst_key, row["piece"]])[0]["model_weights"]
        start += row["n"]
    return weights


def build(ref: ModelRef, compile_model: bool, threads: int | None = None):
    from madlib_mop.runtime.tf_runtime import import_tensorflow

    import_tensorflow(threads)
    if compile_model:
        model = training.compiled_model(ref.spec(), None)  # (the weights are set below)
    else:
        model = keras_json.model_from_config(keras_json.parse_model_json(ref.model_arch), initialised=False)
    if ref.weights is not None:  # (None: only the model's shapes are wanted)
        keras_json.check_weights(model, ref.weights)
        model_state.set_flat_weights(model, ref.weights)
    return model
