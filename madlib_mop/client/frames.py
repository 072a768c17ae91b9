"""A job's results as pandas DataFrames, read from the tables the job writes.

    jobs        one row per job of the connected role (the `job_progress` view)
    leaderboard one row per model of a job: its configuration, hyperparameters, final
                metrics, training time, and when a pruner stopped it
    curves      one row per (model, iteration, split, metric): the learning curves
    visits      one row per sub-epoch: which model trained on which segment, when

Every function takes a SQLAlchemy connection and the extension's schema; the job is a
`JobRef` (a row of the `jobs` table).  Nothing here parses code: compile and fit
parameters are read by the extension's literal-only parser.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

import pandas as pd
import sqlalchemy as sa

from madlib_mop.grammar import model_config
from madlib_mop.job.record import JobArguments, JobState
from madlib_mop.json_values import json_value
from madlib_mop.search.objective import direction_of


@dataclass(frozen=True)
class JobRef:
    """What the client needs of a job: its row of `jobs` (tables as [schema, table])."""

    job_id: int
    state: JobState
    model_output_table: str
    tables: dict[str, list[str]]
    arguments: JobArguments
    validation_table: str | None

    def table(self, key: str) -> str:
        """The job's table `key` ('output', 'info', 'summary', 'visits', ...), quoted."""
        schema, name = self.tables[key]
        return f"{quote(schema)}.{quote(name)}"


def quote(identifier: str) -> str:
    """An identifier quoted for SQL text (the client's only way to put a name in SQL)."""
    return '"' + identifier.replace('"', '""') + '"'


def job_ref(conn: sa.Connection, schema: str, job: int | str) -> JobRef:
    """The role's job `job`: a job id, or a model_output_table name (its latest job)."""
    if isinstance(job, int) or (isinstance(job, str) and job.strip().isdigit()):
        where, value = "job_id = :v", int(job)
    else:
        # model_output_table is recorded as the call resolved it (schema-qualified, quoted):
        # compare with the name resolved the same way, and with the bare name too.
        where, value = ("(model_output_table = :v OR model_output_table = "
                        "(SELECT format('%I.%I', n.nspname, c.relname) FROM pg_class c "
                        " JOIN pg_namespace n ON n.oid = c.relnamespace "
                        " WHERE c.oid = to_regclass(:v)))"), str(job)
    row = conn.execute(sa.text(
        f"SELECT job_id, state, model_output_table, tables, arguments, validation_table, "
        f"coordinator_pid FROM {quote(schema)}.jobs WHERE {where} "
        "ORDER BY job_id DESC LIMIT 1"), {"v": value}).mappings().first()
    if row is None:
        raise LookupError(f"no job {job!r} of yours: see `madlib-mop jobs` or "
                          f"SELECT * FROM {schema}.job_progress")
    return JobRef(row["job_id"], JobState(row["state"]), row["model_output_table"],
                  json_value(row["tables"]), JobArguments.of(row["arguments"]), row["validation_table"])


def jobs(conn: sa.Connection, schema: str) -> pd.DataFrame:
    """The `job_progress` view: every job of the connected role, newest first."""
    return pd.read_sql_query(sa.text(f"SELECT * FROM {quote(schema)}.job_progress "
                                     "ORDER BY job_id DESC"), conn)


def cycles(conn: sa.Connection, schema: str) -> pd.DataFrame:
    """The `cycle_results` view: the connected role's model selection cycles, by name and
    cycle (empty where the extension predates cycles)."""
    if not conn.execute(sa.text("SELECT to_regclass(:view) IS NOT NULL"),
                        {"view": f"{quote(schema)}.cycle_results"}).scalar():
        return pd.DataFrame()
    return pd.read_sql_query(sa.text(f"SELECT * FROM {quote(schema)}.cycle_results "
                                     "ORDER BY cycle_name, cycle"), conn)


def hyperparameters(compile_params: str | None, fit_params: str | None) -> dict[str, Any]:
    """The hyperparameters of one configuration as flat columns (the grammar's reading)."""
    return model_config.hyperparameters(compile_params, fit_params)


def objective(job: JobRef, info: pd.DataFrame) -> tuple[str, bool]:
    """The column a leaderboard ranks by and whether higher is better: the job's first
    metric on the validation data if it has some (else on the training data), else the loss."""
    prefix = "validation" if job.validation_table and info["validation_loss_final"].notna().any() \
        else "training"
    metric_types = info["metrics_type"].dropna()
    metric = metric_types.iloc[0][0] if len(metric_types) and metric_types.iloc[0] else None
    if metric and info[f"{prefix}_metrics_final"].notna().any():
        return f"{prefix}_metrics_final", direction_of(metric) is not False
    return f"{prefix}_loss_final", False


def leaderboard(conn: sa.Connection, job: JobRef) -> pd.DataFrame:
    """One row per model: mst_key, model_id, the configuration and its hyperparameters as
    columns, final metrics, training seconds and pruning, best first (by `objective`)."""
    info = pd.read_sql_query(sa.text(f"SELECT * FROM {job.table('info')} ORDER BY mst_key"), conn)
    if info.empty:
        return info
    params = pd.DataFrame([hyperparameters(c, f) for c, f in zip(info["compile_params"], info["fit_params"])],
                          index=info.index)
    columns = ["mst_key", "model_id", "compile_params", "fit_params"]
    board = pd.concat([info[columns], params, info.drop(columns=columns + [
        "metrics_elapsed_time", "training_metrics", "training_loss", "validation_metrics",
        "validation_loss", "metrics_iters", "training_metrics_all", "validation_metrics_all",
        "model_type"])], axis=1)
    board["metric"] = info["metrics_type"].map(lambda m: m[0] if m else None)
    board = board.drop(columns=["metrics_type"])
    by, higher = objective(job, info)
    return board.sort_values([by, "mst_key"], ascending=[not higher, True],
                             na_position="last").reset_index(drop=True)


def curves(conn: sa.Connection, job: JobRef) -> pd.DataFrame:
    """Long format: mst_key, iteration, split ('training' | 'validation'), metric, value,
    elapsed_seconds (since the job started) -- every metric of every model at every
    iteration where metrics were computed."""
    info = conn.execute(sa.text(
        f"SELECT mst_key, metrics_iters, metrics_elapsed_time, training_metrics_all, "
        f"validation_metrics_all FROM {job.table('info')} ORDER BY mst_key")).mappings().all()
    rows = []
    for model in info:
        iterations = model["metrics_iters"] or []
        elapsed = model["metrics_elapsed_time"] or []
        for split in ("training", "validation"):
            for metric, values in (json_value(model[f"{split}_metrics_all"]) or {}).items():
                for k, value in enumerate(values):
                    if k < len(iterations):
                        rows.append((model["mst_key"], iterations[k], split, metric, value,
                                     elapsed[k] if k < len(elapsed) else None))
    return pd.DataFrame(rows, columns=["mst_key", "iteration", "split", "metric", "value",
                                       "elapsed_seconds"])


def optimization_history(conn: sa.Connection, schema: str, job: JobRef) -> pd.DataFrame:
    """The view `optimization_history` of the job: each (model, iteration) value of its
    objective in the order reached, with the best so far."""
    return pd.read_sql_query(sa.text(f"SELECT * FROM {quote(schema)}.optimization_history "
                                     "WHERE job_id = :job ORDER BY report"), conn,
                             params={"job": job.job_id})


def visits(conn: sa.Connection, job: JobRef) -> pd.DataFrame:
    """One row per sub-epoch: mst_key, step (its sub-epoch number in the model's order),
    segment, rows, started and finished (timestamps on the worker's clock), seconds (the
    worker's time for it), train_seconds, loss and the other training metrics of it."""
    found = conn.execute(sa.text(
        f"SELECT mst_key, step, segment, result FROM {job.table('visits')} "
        "ORDER BY mst_key, step")).all()
    rows = []
    for mst_key, step, segment, result in found:
        result = json_value(result)
        seconds = result.get("seconds", {})
        total = seconds.get("total", seconds.get("call"))
        finished = result.get("finished_at")
        row = {"mst_key": mst_key, "step": step, "segment": segment, "rows": result.get("rows"),
               "started": _timestamp(finished - total) if finished and total is not None else None,
               "finished": _timestamp(finished) if finished else None,
               "seconds": total, "train_seconds": seconds.get("train")}
        row.update({f"training_{k}": v for k, v in (result.get("metrics") or {}).items()})
        rows.append(row)
    frame = pd.DataFrame(rows)
    if frame.empty:
        frame = pd.DataFrame(columns=["mst_key", "step", "segment", "rows", "started", "finished",
                                      "seconds", "train_seconds"])
    return frame


def _timestamp(epoch: float) -> datetime:
    return datetime.fromtimestamp(epoch, tz=timezone.utc)
