"""Deployed models: a name that predictions use, whichever model it stands for today.

    deploy_model(model_output_table, mst_key, name)             this model
    deploy_model(model_output_table, name, strategy, ...)       the job's best_score or
                                                                most_recent model past a threshold
    rollback_model(name)                                        back one version
    madlib_keras_predict('<name>', ...)                         predicts with the deployed model

A deployment's versions are rows of the registry table `mop_deployments` in the schema of
its name (the caller's current schema for an unqualified name), made by the first deploy
there and owned by the role that made it: who deployed which model of which job, when, with
which metrics, and who rolled it back.  Rows are never deleted: the history stays.

A deployment names a model; it grants nothing.  A role predicts with a deployment only if
it may read the registry and the model table, as with the table itself.
"""

from __future__ import annotations

import json
from typing import Any

from madlib_mop import errors, plpy_bridge
from madlib_mop.db import catalog
from madlib_mop.errors import MadlibMopError
from madlib_mop.api import analysis

REGISTRY = "mop_deployments"
STRATEGIES = ("best_score", "most_recent")
_REGISTRY_DDL = """
    CREATE TABLE IF NOT EXISTS {} (
        name           text NOT NULL,
        version        integer NOT NULL,
        model_table    text NOT NULL,     -- schema-qualified, quoted: a name, resolved when used
        mst_key        integer,           -- NULL: the table's one model (madlib_keras_fit)
        job_id         bigint,
        strategy       text NOT NULL,     -- mst_key, best_score or most_recent
        objective      text,
        metrics        jsonb,             -- the model's _info row when it was deployed
        deployed_by    name NOT NULL DEFAULT current_user,
        deployed_at    timestamptz NOT NULL DEFAULT now(),
        rolled_back_by name,
        rolled_back_at timestamptz,
        PRIMARY KEY (name, version))"""
# The model's _info row as the registry keeps it (its configuration and final metrics).
_METRICS = ("compile_params", "fit_params", "training_loss_final", "training_metrics_final",
            "validation_loss_final", "validation_metrics_final", "inference_ms_per_row",
            "parameter_count", "status", "metrics_type")


def _registry(plpy: Any, schema: str) -> str:
    return f"{plpy.quote_ident(schema)}.{plpy.quote_ident(REGISTRY)}"


def _deployment_name(plpy: Any, name: str | None) -> catalog.NewTable:
    """'churn' or 'analytics.churn': the schema whose registry holds it, and the name."""
    if name is None or not name.strip():
        raise MadlibMopError("name must name the deployment: it is NULL or empty",
                             sqlstate=errors.INVALID_PARAMETER_VALUE,
                             hint="e.g. 'churn', or 'analytics.churn' for a deployment in schema analytics.")
    return catalog.new_table(plpy, name, argument="deployment name")


def _active(plpy: Any, registry: str, name: str) -> dict | None:
    rows = plpy.execute(plpy.prepare(
        f"SELECT * FROM {registry} WHERE name = $1 AND rolled_back_at IS NULL "
        "ORDER BY version DESC LIMIT 1", ["text"]), [name])
    return dict(rows[0]) if rows else None


def _model_row(plpy: Any, model_output_table: str, mst_key: int | None) -> tuple[catalog.Table, dict]:
    table = catalog.resolve_table(plpy, model_output_table, argument="model_output_table")
    info = analysis.info_of(plpy, table)
    rows = plpy.execute(plpy.prepare(f"SELECT to_jsonb(i) AS row FROM {info.name} i WHERE mst_key = $1",
                                     ["integer"]), [mst_key])
    if not rows:
        raise MadlibMopError(f"mst_key {mst_key} is not in {info.name}", sqlstate=errors.INVALID_PARAMETER_VALUE,
                             hint=f"SELECT mst_key, status FROM {info.name}; lists the models.")
    row = json.loads(rows[0]["row"])
    if row.get("status") in ("diverged", "failed"):
        raise MadlibMopError(f"mst_key {mst_key} {row['status']} while training: it is not a usable model",
                             sqlstate=errors.INVALID_PARAMETER_VALUE, detail=row.get("stop_reason"),
                             hint=f"Pick another: SELECT mst_key, status FROM {info.name};")
    return table, row


def _record(plpy: Any, name: str | None, table: catalog.Table, row: dict, strategy: str,
            objective: str | None, why: str) -> int:
    target = _deployment_name(plpy, name)
    if target.exists(plpy):
        raise MadlibMopError(f"name {target.quoted} is a table: a deployment of that name would hide it",
                             sqlstate=errors.DUPLICATE_TABLE,
                             hint="Name the deployment differently from the tables of its schema.")
    registry = _registry(plpy, target.schema)
    table_of_registry = catalog.NewTable(target.schema, REGISTRY, registry, "registry")
    if not table_of_registry.exists(plpy):
        table_of_registry.must_not_exist(plpy)  # says so if the caller may not create it there
        plpy.execute(_REGISTRY_DDL.format(registry))
    # One deploy of a name at a time: versions are numbered in order.
    plpy.execute(f"LOCK TABLE {registry} IN SHARE ROW EXCLUSIVE MODE")
    version = plpy.execute(plpy.prepare(f"SELECT coalesce(max(version), 0) + 1 AS v FROM {registry} "
                                        "WHERE name = $1", ["text"]), [target.name])[0]["v"]
    job = analysis.job_of(plpy, table)
    plpy.execute(plpy.prepare(
        f"INSERT INTO {registry} (name, version, model_table, mst_key, job_id, strategy, objective, "
        "metrics) VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
        ["text", "integer", "text", "integer", "bigint", "text", "text", "jsonb"]),
        [target.name, version, table.name, row.get("mst_key"), job.job_id if job else None,
         strategy, objective, json.dumps({k: row.get(k) for k in _METRICS})])
    plpy.notice(f"deployed {target.quoted} version {version}: {table.name} mst_key {row.get('mst_key')} "
                f"({why})")
    return version


def deploy_model(plpy: Any, model_output_table: str, mst_key: int | None, name: str | None) -> int:
    """Deploy one model of a job's output under `name`; returns the new version."""
    if mst_key is None:
        raise MadlibMopError("mst_key must name a model", sqlstate=errors.NULL_VALUE_NOT_ALLOWED,
                             hint="Pass the mst_key of a model of the table, or use a strategy: "
                                  "deploy_model(table, name, 'best_score').")
    table, row = _model_row(plpy, model_output_table, mst_key)
    return _record(plpy, name, table, row, "mst_key", None, "chosen by mst_key")


def deploy_model_by_strategy(plpy: Any, model_output_table: str, name: str | None,
                             strategy: str | None = "best_score", threshold: float | None = None,
                             objective: str | None = None) -> int:
    """Deploy the model a strategy picks among the job's models whose value of the
    objective (the job's, unless named) is at least as good as `threshold`:
    best_score the best one; most_recent the one whose last iteration ended last."""
    if strategy not in STRATEGIES:
        raise MadlibMopError("strategy must be 'best_score' or 'most_recent'"
                             + (f", not {strategy!r}" if strategy else ""),
                             sqlstate=errors.INVALID_PARAMETER_VALUE,
                             hint="Or deploy one model: deploy_model(model_output_table, mst_key, name).")
    results = analysis.results_of(plpy, model_output_table, objective)
    goal = results.objective
    candidates = analysis.ranked_models(results, threshold)
    if not candidates:
        raise MadlibMopError(
            f"no model of {model_output_table} has {goal.describe()}"
            + (f" at least as good as {threshold}" if threshold is not None else ""),
            sqlstate=errors.DATA_EXCEPTION,
            hint="Lower the threshold, or wait until models have finished an iteration.")
    if strategy == "best_score":
        chosen = candidates[0]
    else:
        chosen = max(candidates, key=lambda c: (c[2], -c[0]["mst_key"]))
    table, row = _model_row(plpy, model_output_table, chosen[0]["mst_key"])
    passing = f", of {len(candidates)} at least as good as {threshold}" if threshold is not None else ""
    return _record(plpy, name, table, row, strategy, goal.label,
                   f"{strategy}: {goal.describe()} {chosen[1]:.6g}{passing}")


def rollback_model(plpy: Any, name: str | None) -> int:
    """The deployment's active version is rolled back (kept, marked who and when): the
    version before it is active again.  Returns that version."""
    try:
        target = _deployment_name(plpy, name)
    except MadlibMopError as error:
        if error.sqlstate != errors.INVALID_SCHEMA_NAME:
            raise
        raise _no_deployment(name) from None
    registry = _registry(plpy, target.schema)
    if not catalog.NewTable(target.schema, REGISTRY, registry, "registry").exists(plpy):
        raise _no_deployment(target.quoted)
    plpy.execute(f"LOCK TABLE {registry} IN SHARE ROW EXCLUSIVE MODE")
    rows = plpy.execute(plpy.prepare(
        f"SELECT version FROM {registry} WHERE name = $1 AND rolled_back_at IS NULL "
        "ORDER BY version DESC LIMIT 2", ["text"]), [target.name])
    if not rows:
        raise _no_deployment(target.quoted)
    if len(rows) < 2:
        raise MadlibMopError(f"deployment {target.quoted} has no earlier version to go back to",
                             sqlstate=errors.INVALID_PARAMETER_VALUE,
                             detail=f"Version {rows[0]['version']} is its only active one.",
                             hint="Deploy another model instead.")
    plpy.execute(plpy.prepare(f"UPDATE {registry} SET rolled_back_by = current_user, rolled_back_at = now() "
                              "WHERE name = $1 AND version = $2", ["text", "integer"]),
                 [target.name, rows[0]["version"]])
    plpy.notice(f"rolled back {target.quoted} version {rows[0]['version']}: version {rows[1]['version']} "
                "is active")
    return rows[1]["version"]


def _no_deployment(name: str) -> MadlibMopError:
    return MadlibMopError(f"there is no deployment {name}", sqlstate=errors.UNDEFINED_OBJECT,
                          hint=f"deploy_model(model_output_table, mst_key, name) makes one; "
                               f"SELECT * FROM {REGISTRY} lists a schema's deployments.")


def resolve(plpy: Any, model_table: str | None, mst_key: int | None) -> tuple[str | None, int | None]:
    """What predict's model_table names: a table as such, else a deployment's active model
    as (its table, its mst_key).  An unqualified name is looked for in the registries of the
    caller's search_path, first schema first."""
    if model_table is None or not model_table.strip() or catalog.resolve_name(plpy, model_table) is not None:
        return model_table, mst_key
    try:
        parts = plpy.execute(plpy.prepare("SELECT parse_ident($1) AS p", ["text"]), [model_table])[0]["p"]
    except plpy.SPIError:
        return model_table, mst_key
    if len(parts) == 2:
        schemas = [parts[0]]
    elif len(parts) == 1:
        with plpy_bridge.caller_search_path(plpy):
            schemas = plpy.execute("SELECT pg_catalog.current_schemas(false) AS s")[0]["s"]
    else:
        return model_table, mst_key
    for schema in schemas:
        registry = _registry(plpy, schema)
        found = plpy.execute(plpy.prepare(
            "SELECT c.oid, has_table_privilege(c.oid, 'SELECT') AS readable FROM pg_class c "
            "JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = $1 AND c.relname = $2",
            ["name", "name"]), [schema, REGISTRY])
        if not found:
            continue
        if not found[0]["readable"]:
            raise MadlibMopError(f"permission denied: the deployments of schema {plpy.quote_ident(schema)} "
                                 "are not readable by this role", sqlstate=errors.INSUFFICIENT_PRIVILEGE,
                                 hint=f"Its owner can run: GRANT SELECT ON {registry} TO <role>; and, to "
                                      "predict with a deployed model, GRANT SELECT on the model's "
                                      "<out>, <out>_summary and <out>_info.")
        active = _active(plpy, registry, parts[-1])
        if active is None:
            continue
        if mst_key is not None and mst_key != active["mst_key"]:
            raise MadlibMopError(
                f"deployment {model_table} is mst_key {active['mst_key']} of {active['model_table']}, "
                f"not {mst_key}", sqlstate=errors.INVALID_PARAMETER_VALUE,
                hint="Pass mst_key => NULL with a deployment's name.")
        _readable(plpy, active["model_table"], model_table)
        plpy.notice(f"{model_table}: version {active['version']}, {active['model_table']} "
                    f"mst_key {active['mst_key']}")
        return active["model_table"], active["mst_key"]
    return model_table, mst_key


def _readable(plpy: Any, model_table: str, deployment: str) -> None:
    """A deployed model's tables must all be readable: one error names every missing grant."""
    oid = catalog.resolve_name(plpy, model_table)
    if oid is None:
        raise MadlibMopError(f"deployment {deployment} names {model_table}, which no longer exists",
                             sqlstate=errors.UNDEFINED_TABLE,
                             hint="Deploy another model under that name, or roll it back.")
    schema, name = catalog.name_parts(plpy, oid)
    rows = plpy.execute(plpy.prepare(
        "SELECT format('%I.%I', $1, $2 || t.suffix) AS name, current_user AS role, "
        "NOT coalesce(has_table_privilege(to_regclass(format('%I.%I', $1, $2 || t.suffix)), 'SELECT'), true) "
        "AS denied FROM unnest(ARRAY['', '_summary', '_info']) t(suffix)", ["text", "text"]), [schema, name])
    denied = [r["name"] for r in rows if r["denied"]]
    if denied:
        raise MadlibMopError(
            f"permission denied: deployment {deployment} is a model of {model_table}, which role "
            f"{rows[0]['role']} may not read", sqlstate=errors.INSUFFICIENT_PRIVILEGE,
            hint=f"Its owner can run: GRANT SELECT ON {', '.join(denied)} TO {plpy.quote_ident(rows[0]['role'])};")
