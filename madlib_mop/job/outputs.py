"""MADlib's output tables of a fit: `<out>` (mst_key, model_weights, model_arch),
`<out>_summary` (one row: the job's arguments and the data's description) and `<out>_info`
(one row per model: its configuration and metric series).

A model's weights are one value of `<out>`.model_weights, as MADlib stores them, up to
`WEIGHTS_VALUE_BYTES`; above that (PostgreSQL takes no value nor message over 1 GB)
model_weights is NULL and the same bytes are in `<out>_mop_weights` (mst_key, piece,
model_weights), in pieces of at most `runtime.state.PIECE_BYTES`, joined in piece order
(`segment.models.trained_models` reads either form).

Created with the job; `publish` brings a model's rows up to date as it finishes iterations,
so the tables are readable (and correct as far as they go) while the job runs.
"""

from __future__ import annotations

import psycopg
from psycopg import sql

import madlib_mop
from madlib_mop.json_values import finite_json
from madlib_mop.job import metrics
from madlib_mop.grammar import model_config
from madlib_mop.runtime.state import pieces
from madlib_mop.job.tables import WEIGHTS
from madlib_mop.runtime import state

WEIGHTS_VALUE_BYTES = 1000 * 1024 * 1024  # room under 1 GB for a call's other arguments
# Weights up to this size go as one message: writing them in pieces first, then joining
# them, writes them twice (4.7 MB: 30 ms as one message, 65 ms in pieces; 16 MB: 0.12 s
# against 0.18 s), and one message's square cost is still small at this size.
ONE_MESSAGE_BYTES = 16 * 1024 * 1024

# <out>_info: MADlib's 17 columns, then madlib_mop's (all metrics by name, timings).
INFO_COLUMNS = [
    ("mst_key", "integer PRIMARY KEY"), ("model_id", "integer"), ("compile_params", "text"),
    ("fit_params", "text"), ("model_type", "text"), ("model_size", "double precision"),
    ("metrics_elapsed_time", "double precision[]"), ("metrics_type", "text[]"),
    ("loss_type", "text"), ("training_metrics_final", "double precision"),
    ("training_loss_final", "double precision"), ("training_metrics", "double precision[]"),
    ("training_loss", "double precision[]"), ("validation_metrics_final", "double precision"),
    ("validation_loss_final", "double precision"), ("validation_metrics", "double precision[]"),
    ("validation_loss", "double precision[]"), ("metrics_iters", "integer[]"),
    ("training_metrics_all", "jsonb"), ("validation_metrics_all", "jsonb"),
    ("training_seconds", "double precision"), ("subepochs_done", "integer"),
    ("stopped_iteration", "integer"), ("stop_reason", "text"),
    # training, finished, stopped (by a pruner), diverged or failed (for a cause of its own)
    ("status", "text"),
] + [
    # What a model costs to use: its weights' count, and ms per row of its last validation
    # pass (evaluation alone, on one worker); NULL without a validation table.
    ("parameter_count", "bigint"), ("inference_ms_per_row", "double precision"),
]
# Columns added since 0.8.0: a job made before gets them when its coordinator starts.
NEWER_INFO_COLUMNS = INFO_COLUMNS[-2:]
# madlib_keras_automl with Hyperband adds MADlib's bracket and round.
HYPERBAND_INFO_COLUMNS = [("s", "integer"), ("i", "integer")]
# madlib_keras_fit: the info columns its summary repeats (all but mst_key and those of pruning).
SINGLE_SUMMARY_COLUMNS = tuple(name for name, _ in INFO_COLUMNS[1:]
                               if name not in ("metrics_iters", "stopped_iteration", "stop_reason", "status")
                               and (name, _) not in NEWER_INFO_COLUMNS)


def create(db: psycopg.Connection, t: dict[str, sql.Identifier], plan, job_id: int,
           info_name: str) -> None:
    """The three tables, without the models' rows (`add_model`); `info_name` is the `_info`
    table's name as the summary shows it."""
    db.execute(sql.SQL("CREATE TABLE {} (mst_key integer PRIMARY KEY, model_weights bytea, "
                       "model_arch json)").format(t["output"]))
    # Float weights do not compress: not trying saves a pass over them at every iteration.
    db.execute(sql.SQL("ALTER TABLE {} ALTER COLUMN model_weights SET STORAGE EXTERNAL")
               .format(t["output"]))
    automl = plan.arguments.automl
    columns = INFO_COLUMNS + (HYPERBAND_INFO_COLUMNS if automl and automl["method"] == "hyperband" else [])
    db.execute(sql.SQL("CREATE TABLE {} ({})").format(t["info"], sql.SQL(", ").join(
        sql.SQL("{} {}").format(sql.Identifier(name), sql.SQL(kind)) for name, kind in columns)))
    _create_summary(db, t["summary"], plan, info_name, job_id)


def add_model(db: psycopg.Connection, t: dict[str, sql.Identifier], config: dict, blob: bytes,
              labels: dict | None = None) -> None:
    """A model's rows in `<out>` (its initial weights) and `<out>_info`."""
    key = config["mst_key"]
    params = model_config.parse_compile_params(config["compile_params"], custom_names=None)
    weights = state.madlib_weights(blob)
    db.execute(sql.SQL("INSERT INTO {} VALUES (%s, NULL, %s)").format(t["output"]),
               (key, config["model_arch"]))
    store_weights(db, t, key, weights)
    labels = labels or {}
    db.execute(sql.SQL(
        "INSERT INTO {} (mst_key, model_id, compile_params, fit_params, model_type, "
        "model_size, metrics_type, loss_type, subepochs_done, status, parameter_count{}) "
        "VALUES (%s, %s, %s, %s, 'madlib_keras', %s, %s, %s, 0, 'training', %s{})").format(
            t["info"], sql.SQL("").join(sql.SQL(", {}").format(sql.Identifier(n)) for n in labels),
            sql.SQL(", %s" * len(labels))),
        (key, config["model_id"], config["compile_params"], config["fit_params"],
         len(weights) / 1024.0, list(params.metrics) or None, params.loss,
         len(weights) // state.WEIGHT_BYTES, *labels.values()))


def store_weights(db: psycopg.Connection, t: dict[str, sql.Identifier], mst_key: int,
                  weights: bytes | memoryview) -> None:
    """A model's weights into its `<out>` row (which exists), in the caller's transaction:
    one value up to WEIGHTS_VALUE_BYTES, else NULL there and the pieces in `<out>_mop_weights`
    (made here when first needed).  A value up to ONE_MESSAGE_BYTES is sent as one message;
    a bigger one in pieces, joined by the server (one big message costs the square of its
    size: `runtime.state.PIECE_BYTES`)."""
    output, table = t["output"], t["weights"]
    if db.execute("SELECT to_regclass(%s) IS NOT NULL", (table.as_string(db),)).fetchone()[0]:
        db.execute(sql.SQL("DELETE FROM {} WHERE mst_key = %s").format(table), (mst_key,))
    elif len(weights) > ONE_MESSAGE_BYTES:
        WEIGHTS.create(db, table)
    if len(weights) <= ONE_MESSAGE_BYTES:
        db.execute(sql.SQL("UPDATE {} SET model_weights = %s WHERE mst_key = %s").format(output),
                   (weights, mst_key))
        return
    for number, piece in pieces(weights):
        db.execute(WEIGHTS.insert(table), (mst_key, number, piece))
    if len(weights) > WEIGHTS_VALUE_BYTES:
        db.execute(sql.SQL("UPDATE {} SET model_weights = NULL WHERE mst_key = %s").format(output), (mst_key,))
        return
    db.execute(sql.SQL("UPDATE {} SET model_weights = (SELECT string_agg(model_weights, ''::bytea "
                       "ORDER BY piece) FROM {} WHERE mst_key = %s) WHERE mst_key = %s").format(output, table),
               (mst_key, mst_key))
    db.execute(sql.SQL("DELETE FROM {} WHERE mst_key = %s").format(table), (mst_key,))


def read_weights(db: psycopg.Connection, t: dict[str, sql.Identifier], mst_key: int) -> bytes | None:
    """A model's weights from `<out>`, in either form."""
    row = db.execute(sql.SQL("SELECT model_weights FROM {} WHERE mst_key = %s").format(t["output"]),
                     (mst_key,)).fetchone()
    if row is None or row[0] is not None:
        return None if row is None else bytes(row[0])
    if not db.execute("SELECT to_regclass(%s) IS NOT NULL", (t["weights"].as_string(db),)).fetchone()[0]:
        return None
    return b"".join(bytes(piece) for (piece,) in db.execute(sql.SQL(
        "SELECT model_weights FROM {} WHERE mst_key = %s ORDER BY piece").format(t["weights"]),
        (mst_key,)))


def _class_values(source: dict, label: str) -> list | None:
    """The packed table's class values as its summary has them, padded to num_classes; a
    table MADlib packed with one-hot labels has none: its classes are positions 0 .. n-1."""
    written = source.get(f"{label}_class_values")
    if written is not None or source["label_kind"] != "classification":
        return written
    values = list(source["class_values"])
    return values + [None] * (source["num_classes"][0] - len(values))


def _class_type(db, source: dict, label: str) -> str:
    """The type of the packed summary's class values of `label` (text[] for regression)."""
    if source["label_kind"] != "classification":
        return "text[]"
    # (MADlib 1.x named the column class_values)
    found = db.execute(
        "SELECT format_type(atttypid, NULL) FROM pg_attribute WHERE attrelid = "
        "(%s || '_summary')::regclass AND attname IN (%s, 'class_values') "
        "ORDER BY attname = 'class_values' LIMIT 1",
        (source["packed_table"], f"{label}_class_values")).fetchone()
    return found[0] if found else "integer[]"  # none: one-hot positions


def _add_class_values(db, table: sql.Identifier, source: dict, label: str) -> None:
    """A later output's `<label>_class_values`, as the packed summary has them."""
    class_type = sql.SQL(_class_type(db, source, label))
    column = sql.Identifier(f"{label}_class_values")
    db.execute(sql.SQL("ALTER TABLE {} ADD COLUMN {} {}").format(table, column, class_type))
    db.execute(sql.SQL("UPDATE {} SET {} = %s::{}").format(table, column, class_type),
               (source.get(f"{label}_class_values"),))


def _create_summary(db, table: sql.Identifier, plan, info_name: str, job_id: int) -> None:
    source = plan.source
    label = source["dependent_varname"][0]
    class_type = _class_type(db, source, label)
    class_column = sql.Identifier(f"{label}_class_values")
    db.execute(sql.SQL("""
        CREATE TABLE {} (
            source_table text, validation_table text, model text, model_info text,
            dependent_varname text[], independent_varname text[], model_arch_table text,
            model_selection_table text, object_table text, num_iterations integer,
            metrics_compute_frequency integer, warm_start boolean, name text, description text,
            start_training_time timestamp, end_training_time timestamp, madlib_version text,
            num_classes integer[], {} {}, dependent_vartype text[], normalizing_const real,
            metrics_iters integer[], job_id bigint, num_segments integer, seed integer)""").format(
        table, class_column, sql.SQL(class_type)))
    arguments = plan.arguments
    custom = arguments.custom_functions
    object_table = custom["name"] if custom else None
    db.execute(sql.SQL("INSERT INTO {} VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, "
                       "%s, %s, now(), NULL, %s, %s, %s::{}, %s, %s, %s, %s, %s, %s)").format(
        table, sql.SQL(class_type)), (
        arguments.source_table, arguments.validation_table,
        arguments.model_output_table, info_name, source["dependent_varname"],
        source["independent_varname"], plan.model_arch_table, plan.model_selection_table,
        object_table, plan.num_iterations, plan.frequency, arguments.warm_start, arguments.name,
        arguments.description, f"madlib_mop {madlib_mop.__version__}",
        source["num_classes"], _class_values(source, label), source["dependent_vartype"],
        source["normalizing_const"],
        metrics.due_iterations(plan.num_iterations, plan.frequency, plan.num_iterations,
                               plan.also_due),
        job_id, source["num_segments"], arguments.seed))
    for label in source["dependent_varname"][1:]:  # a model of several outputs: their classes too
        _add_class_values(db, table, source, label)
    if arguments.automl:
        # MADlib's automl summary: the method, its parameters and the seed.
        automl = arguments.automl
        for name in ("automl_method", "automl_params", "random_state"):
            db.execute(sql.SQL("ALTER TABLE {} ADD COLUMN {} text").format(table, sql.Identifier(name)))
        db.execute(sql.SQL("ALTER TABLE {} ADD COLUMN use_gpus boolean DEFAULT false").format(table))
        db.execute(sql.SQL("UPDATE {} SET automl_method = %s, automl_params = %s, random_state = %s")
                   .format(table), (automl["method"], automl["params_text"],
                                    None if automl["random_state"] is None else str(automl["random_state"])))
    if arguments.pruner:
        db.execute(sql.SQL("ALTER TABLE {} ADD COLUMN pruner text").format(table))
        db.execute(sql.SQL("UPDATE {} SET pruner = %s").format(table), (arguments.pruner,))
    if arguments.single:
        # madlib_keras_fit keeps its one model's results in the summary (MADlib's layout).
        for name, kind in INFO_COLUMNS[1:]:
            if name != "metrics_iters":  # the summary has it already
                db.execute(sql.SQL("ALTER TABLE {} ADD COLUMN {} {}").format(
                    table, sql.Identifier(name), sql.SQL(kind)))


def publish(store, model, curves: metrics.Curves, partitions: int, single: bool) -> None:
    """A model's `_info` row (and madlib_keras_fit's summary) from its curves so far."""
    t = store.tables
    names = list(model_config.parse_compile_params(model.compile_params, custom_names=None).metrics)
    first = names[0] if names else None
    training, validation = curves.training, curves.validation
    # Time the model's sub-epochs took, without each worker's one-off start-up.
    training_seconds = sum(v["seconds"]["total"] - v["seconds"].get("setup", 0.0)
                           for v in model.visits.values())
    store.execute(sql.SQL("""
        UPDATE {} SET metrics_elapsed_time = %s,
            training_metrics_final = %s, training_loss_final = %s,
            training_metrics = %s, training_loss = %s,
            validation_metrics_final = %s, validation_loss_final = %s,
            validation_metrics = %s, validation_loss = %s,
            metrics_iters = %s, training_metrics_all = %s, validation_metrics_all = %s,
            training_seconds = %s, subepochs_done = %s, inference_ms_per_row = %s,
            status = CASE WHEN status IN ('stopped', 'diverged', 'failed') THEN status
                          WHEN %s THEN 'finished' ELSE 'training' END
        WHERE mst_key = %s""").format(t["info"]), (
        curves.elapsed,
        curves.final("training", first), curves.final("training", "loss"),
        # No metrics compiled: NULL, as MADlib writes it, not an array of NULLs.
        metrics.series(training, first) if first else None, metrics.series(training, "loss"),
        curves.final("validation", first) if partitions else None,
        curves.final("validation", "loss") if partitions else None,
        metrics.series(validation, first) if partitions and first else None,
        metrics.series(validation, "loss") if partitions else None,
        curves.iterations,
        finite_json({n: metrics.series(training, n) for n in ["loss"] + names}),
        finite_json({n: metrics.series(validation, n) for n in ["loss"] + names}) if partitions else None,
        training_seconds, len(model.visits), metrics.last(curves.inference_ms),
        len(model.visits) >= model.iterations * model.per_iteration,
        model.mst_key))
    if single:
        columns = sql.SQL(", ").join(sql.Identifier(n) for n in SINGLE_SUMMARY_COLUMNS)
        store.execute(sql.SQL("UPDATE {summary} s SET ({c}) = (SELECT {c} FROM {info} i "
                        "WHERE i.mst_key = %s)").format(summary=t["summary"], info=t["info"],
                                                        c=columns), (model.mst_key,))


def finish(store) -> None:
    store.execute(sql.SQL("UPDATE {} SET end_training_time = now()").format(store.tables["summary"]))


def keep_best(store, models, objective, segments: int, frequency: int, iterations: int,
              partitions: int, also: frozenset) -> int:
    """madlib_keras_automl: the model selection table keeps the best configuration only
    (by each model's last computed value of the objective; ties to the lower mst_key), as
    MADlib's does.  Returns its mst_key."""
    from madlib_mop.search.base import Report

    reports = []
    for model in models.values():
        curves = metrics.curves(model.visits, model.evals, segments, model.epochs, frequency,
                                iterations, partitions, 0.0, also)
        if curves.iterations:
            reports.append(Report(model.mst_key, curves.iterations[-1], curves.training[-1],
                                  curves.validation[-1] if partitions else None))
    best = min(reports, key=objective.rank_key).mst_key
    table = sql.Identifier(*store.job.arguments.automl["model_selection_table"])
    store.execute(sql.SQL("DELETE FROM {} WHERE mst_key <> %s").format(table), (best,))
    return best
