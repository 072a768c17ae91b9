"""Model catalogs with MADlib's API: architectures (load_keras_model, delete_keras_model) and
model selection tables (generate_model_configs, load_model_selection_table)."""

from __future__ import annotations

from typing import Any

from madlib_mop import errors
from madlib_mop.db import catalog, custom_functions
from madlib_mop.grammar import model_config
from madlib_mop.job import keras_work
from madlib_mop.runtime import keras_json
from madlib_mop.errors import MadlibMopError
from madlib_mop.search import grid

ARCH_COLUMNS = ("model_id", "model_arch", "model_weights", "name", "description",
                "__internal_madlib_id__")
MST_COLUMNS = ("mst_key", "model_id", "compile_params", "fit_params")


# ---- model architecture table ---------------------------------------------------------------

def _check_columns(plpy: Any, table: catalog.Table, expected: tuple, argument: str,
                   made_by: str) -> None:
    missing = [c for c in expected if c not in catalog.columns(plpy, table)]
    if missing:
        raise MadlibMopError(
            f"{argument} {table.name} is not a table made by {made_by}",
            sqlstate=errors.UNDEFINED_COLUMN, detail="Missing columns: " + ", ".join(missing) + ".",
            hint=f"Pass a table made by {made_by}, or a new name.")


def load_keras_model(plpy: Any, keras_model_arch_table: str, model_arch: str | None,
                     model_weights: bytes | None = None, name: str | None = None,
                     description: str | None = None, *, caller: str = "load_keras_model") -> int:
    """Adds the model; its model_id.  `caller`: the function the NOTICEs name."""
    if model_arch is None:
        raise MadlibMopError("model_arch is NULL", sqlstate=errors.NULL_VALUE_NOT_ALLOWED,
                             hint="Pass model.to_json() of a Keras model.")
    keras_json.parse_model_json(model_arch)  # (no code: refused before a worker reads it)
    with keras_work.for_session(plpy) as keras:  # Keras builds it in a worker session
        facts = keras.facts([{"mst_key": 0, "model_arch": model_arch, "compile_params": "",
                              "fit_params": ""}])[0]
    keras_json.check_weight_bytes(facts["parameters"], model_weights)

    target = catalog.new_table(plpy, keras_model_arch_table, argument="keras_model_arch_table")
    if target.exists(plpy):
        table = catalog.resolve_table(plpy, target.quoted, argument="keras_model_arch_table")
        _check_columns(plpy, table, ARCH_COLUMNS, "keras_model_arch_table", "load_keras_model")
        quoted = table.name
    else:
        plpy.execute(f"""
            CREATE TABLE {target.quoted} (
                model_id serial PRIMARY KEY,
                model_arch json NOT NULL,
                model_weights bytea,
                name text,
                description text,
                __internal_madlib_id__ text
            )""")
        plpy.notice(f"{caller}: created model architecture table {target.quoted}")
        quoted = target.quoted
    row = plpy.execute(plpy.prepare(
        f"INSERT INTO {quoted} (model_arch, model_weights, name, description, __internal_madlib_id__) "
        "VALUES ($1::json, $2, $3, $4, md5(random()::text || clock_timestamp()::text)) "
        "RETURNING model_id", ["text", "bytea", "text", "text"]),
        [model_arch, model_weights, name, description])[0]
    plpy.notice(
        f"{caller}: added model_id {row['model_id']} to {quoted} "
        f"({facts['parameters']} parameters, input shape {facts['input_shape']}"
        + (", with initial weights" if model_weights is not None else "") + ")")
    return row["model_id"]


def delete_keras_model(plpy: Any, keras_model_arch_table: str, model_id: int | None) -> None:
    table = catalog.resolve_table(plpy, keras_model_arch_table, argument="keras_model_arch_table")
    _check_columns(plpy, table, ARCH_COLUMNS, "keras_model_arch_table", "load_keras_model")
    deleted = plpy.execute(plpy.prepare(
        f"DELETE FROM {table.name} WHERE model_id = $1 RETURNING model_id", ["integer"]), [model_id])
    if not deleted:
        raise MadlibMopError(f"model_id {model_id} is not in {table.name}: Model id {model_id} not found",
                             sqlstate=errors.INVALID_PARAMETER_VALUE,
                             hint=f"SELECT model_id, name FROM {table.name}; lists the models.")
    plpy.notice(f"delete_keras_model: deleted model_id {model_id} from {table.name}")
    if plpy.execute(f"SELECT NOT EXISTS (SELECT 1 FROM {table.name}) AS empty")[0]["empty"]:
        plpy.execute(f"DROP TABLE {table.name}")
        plpy.notice(f"delete_keras_model: dropped {table.name}, which is now empty")


# ---- model selection table ------------------------------------------------------------------

def arch_table_with_ids(plpy: Any, model_arch_table: str, model_id_list: list | None):
    table = catalog.resolve_table(plpy, model_arch_table, argument="model_arch_table")
    _check_columns(plpy, table, ARCH_COLUMNS, "model_arch_table", "load_keras_model")
    if not model_id_list or any(m is None for m in model_id_list):
        raise MadlibMopError("model_id_list must list one or more model ids",
                             sqlstate=errors.INVALID_PARAMETER_VALUE,
                             hint=f"e.g. ARRAY[1, 2]; SELECT model_id FROM {table.name}; lists them.")
    ids = sorted(set(int(m) for m in model_id_list))
    found = {r["model_id"] for r in plpy.execute(plpy.prepare(
        f"SELECT model_id FROM {table.name} WHERE model_id = ANY($1)", ["integer[]"]), [ids])}
    missing = [m for m in ids if m not in found]
    if missing:
        raise MadlibMopError(
            f"model_id {', '.join(map(str, missing))} not found in {table.name}: One or more "
            f"model_id of {ids} not found in table {table.name}",
            sqlstate=errors.INVALID_PARAMETER_VALUE,
            hint=f"SELECT model_id, name FROM {table.name}; lists the models.")
    return table, ids


def object_table_names(plpy: Any, object_table: str | None) -> tuple[str | None, tuple[str, ...]]:
    """(qualified name, function names) of an object table of custom functions
    (load_custom_function); (None, ()) without one.  Whether its functions may run is
    decided when a job starts (`job.plan.custom_functions_of`)."""
    if object_table is None or not object_table.strip():
        return None, ()
    table, names = custom_functions.names(plpy, object_table)
    return table.name, tuple(names)


# The model selection table and its summary, declared once: {0} the table, {1} its summary,
# {2} the model_arch_table's name and {3} the object_table's (or NULL) as literals.  Made by
# generate_model_configs and load_model_selection_table, and by madlib_keras_automl in its
# job's creating transaction.
SELECTION_TABLES = (
    "CREATE TABLE {0} (mst_key serial PRIMARY KEY, model_id integer NOT NULL, "
    "compile_params varchar NOT NULL, fit_params varchar NOT NULL, "
    "UNIQUE (model_id, compile_params, fit_params))",
    "CREATE TABLE {1} (model_arch_table varchar, object_table varchar)",
    "INSERT INTO {1} VALUES ({2}, {3})",
)


def _create_mst_tables(plpy: Any, out: catalog.NewTable, summary: catalog.NewTable,
                       arch_table: catalog.Table, object_table: str | None,
                       summary_only: bool = False) -> None:
    objects = "NULL" if object_table is None else plpy.quote_literal(object_table)
    for statement in SELECTION_TABLES[1:] if summary_only else SELECTION_TABLES:
        plpy.execute(statement.format(out.quoted, summary.quoted, plpy.quote_literal(arch_table.name),
                                      objects))


def _insert_configs(plpy: Any, table: str, configs: list[model_config.Config]) -> int:
    """Insert the configurations not yet in the table, so mst_key stays contiguous."""
    present = {model_config.Config(r["model_id"], r["compile_params"], r["fit_params"])
               for r in plpy.execute(f"SELECT model_id, compile_params, fit_params FROM {table}")}
    plan = plpy.prepare(
        f"INSERT INTO {table} (model_id, compile_params, fit_params) VALUES ($1, $2, $3)",
        ["integer", "varchar", "varchar"])
    new = [c for c in dict.fromkeys(configs) if c not in present]
    for config in new:
        plpy.execute(plan, [config.model_id, config.compile_params, config.fit_params])
    return len(new)


def create_selection_table(plpy: Any, model_selection_table: str, model_arch_table: str,
                           object_table: str | None, configs: list[model_config.Config]) -> int:
    """A model selection table of `configs`, in this order (mst_key 1, 2, ...); how many."""
    out = catalog.new_table(plpy, model_selection_table, argument="model_selection_table")
    summary = out.sibling("_summary", plpy)
    out.must_not_exist(plpy)
    summary.must_not_exist(plpy)
    arch = catalog.resolve_table(plpy, model_arch_table, argument="model_arch_table")
    _create_mst_tables(plpy, out, summary, arch, object_table)
    return _insert_configs(plpy, out.quoted, configs)


def generate_model_configs(plpy: Any, model_arch_table: str, model_selection_table: str,
                           model_id_list: list, compile_params_grid: str, fit_params_grid: str,
                           search_type: str | None = "grid", num_configs: int | None = None,
                           random_state: int | None = None, object_table: str | None = None) -> None:
    object_table, custom_names = object_table_names(plpy, object_table)
    arch, ids = arch_table_with_ids(plpy, model_arch_table, model_id_list)
    compile_grid = model_config.parse_grid(compile_params_grid, "compile_params_grid")
    fit_grid = model_config.parse_fit_grid(fit_params_grid)
    kind = (search_type or "").strip().lower()
    if kind and "grid".startswith(kind):
        if num_configs is not None or random_state is not None:
            raise MadlibMopError("num_configs and random_state are for random search",
                                 sqlstate=errors.INVALID_PARAMETER_VALUE,
                                 hint="Pass NULL for both with grid search, or search_type => 'random'.")
        configs = grid.all_configs(grid.GridSearcher(ids, compile_grid, fit_grid))
    elif kind and "random".startswith(kind):
        if num_configs is None or num_configs < 1:
            raise MadlibMopError("random search needs num_configs >= 1",
                                 sqlstate=errors.INVALID_PARAMETER_VALUE,
                                 hint="Pass num_configs => 10, and random_state for repeatability.")
        configs = grid.all_configs(grid.RandomSearcher(ids, compile_grid, fit_grid, num_configs,
                                                           random_state))
    else:
        raise MadlibMopError(f"search_type '{search_type}' is neither 'grid' nor 'random'",
                             sqlstate=errors.INVALID_PARAMETER_VALUE,
                             hint="Pass search_type => 'grid' or 'random'.")
    for config in configs:  # built-in losses and metrics, or the object table's
        model_config.parse_compile_params(config.compile_params, custom_names)

    out = catalog.new_table(plpy, model_selection_table, argument="model_selection_table")
    summary = out.sibling("_summary", plpy)
    if out.exists(plpy):
        # MADlib appends to an existing model selection table; mst_key continues.
        table = catalog.resolve_table(plpy, out.quoted, argument="model_selection_table")
        _check_columns(plpy, table, MST_COLUMNS, "model_selection_table", "generate_model_configs")
        recorded = plpy.execute(f"SELECT model_arch_table, object_table FROM {summary.quoted}") \
            if summary.exists(plpy) else []
        if recorded and recorded[0]["object_table"] != object_table:
            raise MadlibMopError(
                f"{table.name} was made with object_table {recorded[0]['object_table']}, not "
                f"{object_table}", sqlstate=errors.INVALID_PARAMETER_VALUE,
                hint="Pass the same object_table, or a new model_selection_table.")
        if recorded and recorded[0]["model_arch_table"] != arch.name:
            raise MadlibMopError(
                f"{table.name} holds models of {recorded[0]['model_arch_table']}, not {arch.name}",
                sqlstate=errors.INVALID_PARAMETER_VALUE,
                hint=f"Use model_arch_table => '{recorded[0]['model_arch_table']}', or a new "
                     "model_selection_table.")
        if not summary.exists(plpy):  # dropped: made again, as MADlib does
            _create_mst_tables(plpy, out, summary, arch, object_table, summary_only=True)
        quoted = table.name
    else:
        summary.must_not_exist(plpy)
        _create_mst_tables(plpy, out, summary, arch, object_table)
        quoted = out.quoted
    added = _insert_configs(plpy, quoted, configs)
    plpy.notice(f"generate_model_configs: added {added} configurations to {quoted}"
                + (f" ({len(configs) - added} already there)" if added < len(configs) else ""))


def load_model_selection_table(plpy: Any, model_arch_table: str, model_selection_table: str,
                               model_id_list: list, compile_params_list: list | None,
                               fit_params_list: list | None, object_table: str | None = None) -> None:
    object_table, custom_names = object_table_names(plpy, object_table)
    arch, ids = arch_table_with_ids(plpy, model_arch_table, model_id_list)
    for argument, values in (("compile_params_list", compile_params_list),
                             ("fit_params_list", fit_params_list)):
        if not values or any(v is None for v in values):
            raise MadlibMopError(f"{argument} must be a non-empty array without NULLs",
                                 sqlstate=errors.INVALID_PARAMETER_VALUE,
                                 hint="e.g. ARRAY['batch_size=32,epochs=1'].")
    # Validate every string; keep the user's text as given, one per distinct meaning
    # whatever the order of its keys (MADlib keeps the last of equivalent strings).
    compiles = {str(model_config.parse_compile_params(t, custom_names)): t for t in compile_params_list}
    fits = {model_config.fit_params_meaning(t): t for t in fit_params_list}
    out = catalog.new_table(plpy, model_selection_table, argument="model_selection_table")
    summary = out.sibling("_summary", plpy)
    out.must_not_exist(plpy)
    summary.must_not_exist(plpy)
    _create_mst_tables(plpy, out, summary, arch, object_table)
    configs = [model_config.Config(m, c, f) for m in ids for c in compiles.values()
               for f in fits.values()]
    added = _insert_configs(plpy, out.quoted, configs)
    plpy.notice(f"load_model_selection_table: added {added} configurations to {out.quoted}")
