"""`madlib-mop dashboard`: a live, read-only web page of the connected role's jobs.

    from madlib_mop.client.dashboard import create_app, serve
    server = serve(create_app("postgresql://alice@dbhost/analytics"), "127.0.0.1", 8050)
    server.serve_forever()

The page (`dashboard_page/`, drawn by the Plotly.js that the plotly package ships, served
from here: nothing is fetched from the internet) polls the JSON routes below every two
seconds, so it follows a job while it runs:

    /api/session                       who and where: role, database, the extension's schema
    /api/jobs                          the role's jobs (the `job_progress` view), newest first
    /api/jobs/<id>/curves              each model's loss and metric per iteration
    /api/jobs/<id>/schedule            every sub-epoch: segment, model, start, seconds (a Gantt chart)
    /api/jobs/<id>/importance          hyperparameter_importance() of a finished job
    /api/jobs/<id>/pareto              the models' metric against their cost, and pareto_front()
    /api/cycles                        the role's model selection cycles (`cycle_results`)

Every read runs as the connection's role, in a READ ONLY transaction (and sessions this
module opens default to read-only), so the page can show only what that role may read (the
jobs' row-level security: each role sees its own) and can change nothing.
"""

from __future__ import annotations

import contextlib
import math
import threading
from datetime import datetime
from decimal import Decimal
from importlib import resources
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import pandas as pd
import sqlalchemy as sa
from flask import Flask, jsonify, send_file, send_from_directory
from werkzeug.serving import BaseWSGIServer, WSGIRequestHandler, make_server

from madlib_mop import errors
from madlib_mop.client import frames
from madlib_mop.client.errors import ServerError, server_error
from madlib_mop.client.session import Client, make_engine
from madlib_mop.job.record import JobState
from madlib_mop.search import importance

PAGE = Path(__file__).with_name("dashboard_page")
POLL_SECONDS = 2.0  # the page's polling interval, also shown on it
# A read waits this long for a lock (a table being replaced by a new version of the job's
# outputs) and runs this long at most, so that a poll never piles up behind another.
LOCK_TIMEOUT, STATEMENT_TIMEOUT = "5s", "30s"
LOOPBACK_NAMES = ("127.0.0.1", "localhost")
FINISHED = JobState.FINISHED


def plotly_js() -> Path:
    """The plotly package's own Plotly.js bundle."""
    return Path(str(resources.files("plotly") / "package_data" / "plotly.min.js"))


# ---- connections ----------------------------------------------------------------------------
def read_only_engine(target: "str | sa.Engine | None") -> sa.Engine:
    """An Engine for the dashboard: the given Engine as is (its sessions are the caller's, so
    they are left unchanged; every read still runs in a READ ONLY transaction), else one
    made from the DSN whose sessions default to read-only transactions."""
    if isinstance(target, sa.Engine):
        return target
    engine = make_engine(target)

    @sa.event.listens_for(engine, "connect")
    def read_only(dbapi_connection, _record) -> None:
        # A SET is transactional: commit it, or the pool's rollback on return undoes it.
        with dbapi_connection.cursor() as cursor:
            cursor.execute("SET default_transaction_read_only = on")
        dbapi_connection.commit()

    return engine


class DashboardData:
    """What the page shows, read over the role's own connections."""

    def __init__(self, target: "str | sa.Engine | None", schema: str | None = None):
        self.engine = read_only_engine(target)
        # Found the way the client finds it: where the extension is installed.
        self.schema = Client(self.engine, schema=schema, progress=False).schema

    @contextlib.contextmanager
    def connection(self) -> Iterator[sa.Connection]:
        """A connection in a READ ONLY transaction (rolled back at the end: it wrote nothing)."""
        with self.engine.connect() as conn:
            conn.execute(sa.text(
                "SELECT set_config('transaction_read_only', 'on', true), "
                "set_config('lock_timeout', :lock, true), "
                "set_config('statement_timeout', :statement, true)"),
                {"lock": LOCK_TIMEOUT, "statement": STATEMENT_TIMEOUT})
            try:
                yield conn
            finally:
                conn.rollback()

    def session(self) -> dict:
        with self.connection() as conn:
            row = conn.execute(sa.text(
                "SELECT current_user AS role, current_database() AS database, "
                "split_part(current_setting('server_version'), ' ', 1) AS server_version, "
                "(SELECT extversion FROM pg_extension WHERE extname = 'madlib_mop') AS version"
            )).mappings().one()
        return {**row, "schema": self.schema, "poll_seconds": POLL_SECONDS}

    def jobs(self) -> list[dict]:
        with self.connection() as conn:
            return records(frames.jobs(conn, self.schema))

    def cycles(self) -> list[dict]:
        with self.connection() as conn:
            return records(frames.cycles(conn, self.schema))

    def job(self, conn: sa.Connection, job_id: int) -> frames.JobRef:
        """The role's job `job_id` (LookupError: none of the role's)."""
        return frames.job_ref(conn, self.schema, int(job_id))

    def curves(self, job_id: int) -> dict:
        with self.connection() as conn:
            ref = self.job(conn, job_id)
            long, source = learning_curves(conn, self.schema, ref)
            info = read_info(conn, ref)
        return curves_payload(long, source, info)

    def schedule(self, job_id: int) -> dict:
        with self.connection() as conn:
            ref = self.job(conn, job_id)
            visits = frames.visits(conn, ref)
        return schedule_payload(visits)

    def importance(self, job_id: int) -> dict:
        with self.connection() as conn:
            ref = self.job(conn, job_id)
            return hyperparameter_importance(conn, self.schema, ref)

    def pareto(self, job_id: int) -> dict:
        with self.connection() as conn:
            ref = self.job(conn, job_id)
            return pareto_payload(conn, self.schema, ref)


# ---- values as JSON ---------------------------------------------------------------------------
def plain(value: Any) -> Any:
    """`value` as JSON can hold it: timestamps as ISO text, NaN and NaT as null."""
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, np.ndarray)):
        return [plain(v) for v in value]
    if value is None or isinstance(value, str):
        return value
    if pd.api.types.is_scalar(value) and pd.isna(value):
        return None
    if isinstance(value, (datetime, pd.Timestamp)):
        return value.isoformat()
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if isinstance(value, (int, np.integer)):
        return int(value)
    if isinstance(value, (float, np.floating, Decimal)):
        number = float(value)
        return number if math.isfinite(number) else None
    return value


def records(frame: pd.DataFrame) -> list[dict]:
    return [plain(row) for row in frame.to_dict(orient="records")]


# ---- learning curves --------------------------------------------------------------------------
def relation_exists(conn: sa.Connection, schema: str, name: str) -> bool:
    return conn.execute(sa.text(
        "SELECT to_regclass(format('%I.%I', CAST(:schema AS text), CAST(:name AS text))) IS NOT NULL"),
        {"schema": schema, "name": name}).scalar()


def function_exists(conn: sa.Connection, schema: str, name: str) -> bool:
    """Whether the extension's schema has a function `name` (any signature: it is called
    with named arguments, so later optional parameters do not matter)."""
    return conn.execute(sa.text(
        "SELECT EXISTS (SELECT 1 FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace "
        "WHERE n.nspname = :schema AND p.proname = :name)"),
        {"schema": schema, "name": name}).scalar()


def learning_curves(conn: sa.Connection, schema: str, ref: frames.JobRef) -> tuple[pd.DataFrame, str]:
    """frames.curves' long format (mst_key, iteration, split, metric, value), read from the
    extension's `intermediate_values` view when it has one, else from the job's `_info`."""
    if not relation_exists(conn, schema, "intermediate_values"):
        return frames.curves(conn, ref), "_info"
    view = pd.read_sql_query(sa.text(
        f"SELECT * FROM {frames.quote(schema)}.intermediate_values WHERE job_id = :id "
        "ORDER BY mst_key, iteration"), conn, params={"id": ref.job_id})
    rows = []
    for row in view.to_dict(orient="records"):
        metric = row.get("metric") or "metric"
        for split in ("training", "validation"):
            for name, column in (("loss", f"{split}_loss"), (metric, f"{split}_metric")):
                value = plain(row.get(column))
                if value is not None:
                    rows.append((row["mst_key"], row["iteration"], split, name, value,
                                 plain(row.get("elapsed_seconds"))))
    return pd.DataFrame(rows, columns=["mst_key", "iteration", "split", "metric", "value",
                                       "elapsed_seconds"]), "intermediate_values"


def read_info(conn: sa.Connection, ref: frames.JobRef) -> pd.DataFrame:
    """The job's `_info` (one row per model), as its role reads it."""
    return pd.read_sql_query(sa.text(f"SELECT * FROM {ref.table('info')} ORDER BY mst_key"), conn)


def model_labels(info: pd.DataFrame) -> dict[int, dict]:
    """Per model: its status and the hyperparameters that vary between the job's models
    (what tells its curve from the others'), as 'batch_size=16 learning_rate=0.01'."""
    if info.empty:
        return {}
    params = {int(row["mst_key"]): {"model_id": row["model_id"],
                                    **frames.hyperparameters(row["compile_params"], row["fit_params"])}
              for row in info.to_dict(orient="records")}
    varying = importance.varying(list(params.values()))
    status = dict(zip(info["mst_key"].astype(int), info.get("status", pd.Series(dtype=object))))
    return {key: {"status": plain(status.get(key)),
                  "label": " ".join(f"{n}={plain(values.get(n))}" for n in varying if n in values)}
            for key, values in params.items()}


def curves_payload(long: pd.DataFrame, source: str, info: pd.DataFrame) -> dict:
    """Per model and (split, metric): iterations and values; the loss first."""
    labels = model_labels(info)
    metrics = list(dict.fromkeys(long["metric"])) if not long.empty else []
    metrics.sort(key=lambda name: name != "loss")
    models = []
    for key, model in (long.groupby("mst_key") if not long.empty else []):
        series = [{"split": split, "metric": metric,
                   "iterations": plain(group["iteration"].tolist()),
                   "values": plain(group["value"].tolist())}
                  for (split, metric), group in model.sort_values("iteration").groupby(["split", "metric"])]
        models.append({"mst_key": int(key), **labels.get(int(key), {}), "series": series})
    return {"source": source, "metrics": metrics, "models": models,
            "all_models": sorted(labels)}


# ---- the schedule -----------------------------------------------------------------------------
def schedule_payload(visits: pd.DataFrame) -> dict:
    """The sub-epochs as a Gantt chart's bars: per model, each bar's segment, start (seconds
    since the job's first sub-epoch started) and length; visits without times are counted
    but not drawn."""
    count = len(visits)
    timed = visits.dropna(subset=["started", "finished"]) if count else visits
    if timed.empty:
        return {"count": count, "drawn": 0, "segments": sorted(plain(visits["segment"].unique().tolist()))
                if count else [], "start": None, "models": []}
    started = pd.to_datetime(timed["started"], utc=True)
    first = started.min()
    timed = timed.assign(start=(started - first).dt.total_seconds(),
                         length=pd.to_numeric(timed["seconds"], errors="coerce"))
    models = []
    for key, bars in timed.groupby("mst_key"):
        models.append({"mst_key": int(key), "segment": plain(bars["segment"].tolist()),
                       "step": plain(bars["step"].tolist()), "start": plain(bars["start"].tolist()),
                       "seconds": plain(bars["length"].tolist())})
    return {"count": count, "drawn": len(timed), "start": plain(first),
            "segments": sorted(plain(visits["segment"].unique().tolist())), "models": models}


# ---- after the search: importance and the Pareto front -----------------------------------------
def not_available(reason: str) -> dict:
    return {"available": False, "reason": reason}


def server_failure(error: sa.exc.DBAPIError) -> dict:
    """A server's error as the page shows it: SQLSTATE, message, detail, hint."""
    found = server_error(error)
    if not isinstance(found, ServerError):
        raise error
    return {"available": True, "error": {"sqlstate": found.sqlstate, "message": found.message,
                                         "detail": found.detail, "hint": found.hint}}


@contextlib.contextmanager
def savepoint(conn: sa.Connection) -> Iterator[None]:
    """A call that may fail, without aborting the request's transaction."""
    nested = conn.begin_nested()
    try:
        yield
    except Exception:
        nested.rollback()
        raise
    else:
        nested.commit()


def hyperparameter_importance(conn: sa.Connection, schema: str, ref: frames.JobRef) -> dict:
    """hyperparameter_importance(model_output_table) of a finished job, most important
    first; or why there is none (the server's message when it refuses)."""
    if ref.state != FINISHED:
        return not_available("shown when the job has finished")
    if not function_exists(conn, schema, "hyperparameter_importance"):
        return not_available(f"this version of the extension has no "
                             f"{schema}.hyperparameter_importance()")
    try:
        with savepoint(conn):
            rows = conn.execute(sa.text(
                f"SELECT hyperparameter, importance FROM {frames.quote(schema)}."
                "hyperparameter_importance(model_output_table => :table)"),
                {"table": ref.model_output_table}).all()
    except sa.exc.DBAPIError as error:
        # undefined_function: the extension has no such function, or not with these parameters
        if getattr(server_error(error), "sqlstate", None) == errors.UNDEFINED_FUNCTION:
            return not_available(f"{schema}.hyperparameter_importance() cannot be called here")
        return server_failure(error)
    ordered = sorted(rows, key=lambda r: -(r[1] if r[1] is not None else -math.inf))
    return {"available": True, "rows": [{"hyperparameter": h, "importance": plain(v)}
                                        for h, v in ordered]}


def pareto_axes(info: pd.DataFrame, ref: frames.JobRef) -> tuple[str | None, str | None, bool]:
    """(x, y, y higher is better): x the cost (inference_ms_per_row, else parameter_count),
    y the objective the leaderboard ranks by (the validation metric, else the training one)."""
    x = next((c for c in ("inference_ms_per_row", "parameter_count")
              if c in info and info[c].notna().any()), None)
    if info.empty or "metrics_type" not in info:
        return x, None, False
    y, higher = frames.objective(ref, info)
    return x, (y if info[y].notna().any() else None), higher


def pareto_payload(conn: sa.Connection, schema: str, ref: frames.JobRef) -> dict:
    """Every model of `_info` as a point (cost, objective), and the front pareto_front()
    returns for these two objectives."""
    if ref.state != FINISHED:
        return not_available("shown when the job has finished")
    if not function_exists(conn, schema, "pareto_front"):
        return not_available(f"this version of the extension has no {schema}.pareto_front()")
    info = read_info(conn, ref)
    x, y, higher = pareto_axes(info, ref)
    if x is None or y is None:
        missing = "inference_ms_per_row or parameter_count" if x is None else "a final metric"
        return not_available(f"the job's _info has no {missing} values")
    objectives = [f"{y} {'max' if higher else 'min'}", f"{x} min"]
    try:
        with savepoint(conn):
            front = conn.execute(sa.text(
                f"SELECT mst_key FROM {frames.quote(schema)}.pareto_front("
                "model_output_table => :table, objectives => :objectives) ORDER BY mst_key"),
                {"table": ref.model_output_table, "objectives": objectives}).scalars().all()
    except sa.exc.DBAPIError as error:
        if getattr(server_error(error), "sqlstate", None) == errors.UNDEFINED_FUNCTION:
            return not_available(f"{schema}.pareto_front() cannot be called here")
        return server_failure(error)
    points = [{"mst_key": int(row["mst_key"]), "x": plain(row[x]), "y": plain(row[y])}
              for row in info.to_dict(orient="records")]
    return {"available": True, "x": x, "y": y, "higher_is_better": higher,
            "metric": plain(next(iter(info["metrics_type"].dropna()), [None])[0]),
            "objectives": objectives, "front": [int(k) for k in front], "models": points}


# ---- the web app ------------------------------------------------------------------------------
def create_app(target: "str | sa.Engine | None", schema: str | None = None, *,
               trusted_hosts: list[str] | None = None) -> Flask:
    """The dashboard's Flask app over `target` (an Engine, a SQLAlchemy URL, a libpq string
    or URI, or None: libpq's PG* variables).  `trusted_hosts`: the Host names the app answers
    (a page of another site that a DNS name re-points at 127.0.0.1 must not read the jobs)."""
    data = DashboardData(target, schema)
    app = Flask(__name__, static_folder=str(PAGE), static_url_path="/static")
    app.config["TRUSTED_HOSTS"] = trusted_hosts
    app.extensions["madlib_mop_dashboard"] = data

    @app.get("/")
    def index():
        return send_from_directory(PAGE, "index.html", max_age=0)

    @app.get("/plotly.min.js")
    def plotly():
        return send_file(plotly_js(), mimetype="text/javascript", max_age=24 * 3600)

    @app.get("/api/session")
    def session():
        return jsonify(plain(data.session()))

    @app.get("/api/jobs")
    def jobs():
        return jsonify({"jobs": data.jobs()})

    @app.get("/api/cycles")
    def cycles():
        return jsonify({"cycles": data.cycles()})

    readers = {"curves": data.curves, "schedule": data.schedule,
               "importance": data.importance, "pareto": data.pareto}

    @app.get("/api/jobs/<int:job_id>/<any(curves, schedule, importance, pareto):panel>")
    def panel(job_id: int, panel: str):
        return jsonify(readers[panel](job_id))

    @app.get("/metrics")
    def metrics():
        """The pool, the queue and the role's jobs for Prometheus (`client.metrics`)."""
        from prometheus_client import CONTENT_TYPE_LATEST

        from madlib_mop.client.metrics import metrics_text

        return metrics_text(data.engine, data.schema), 200, {"Content-Type": CONTENT_TYPE_LATEST}

    register_handlers(app)
    return app


def register_handlers(app: Flask) -> None:
    @app.errorhandler(LookupError)
    def not_found(error):
        return jsonify({"error": str(error)}), 404

    @app.errorhandler(sa.exc.DBAPIError)
    def database_error(error):
        # The server's own words (a job's table dropped since, a connection refused, ...).
        found = server_error(error)
        text = str(found) if isinstance(found, ServerError) else str(getattr(error, "orig", error))
        return jsonify({"error": text.strip()}), 503

    @app.after_request
    def headers(response):
        response.headers.setdefault("X-Content-Type-Options", "nosniff")
        response.headers.setdefault("Content-Security-Policy",
                                    "default-src 'self'; style-src 'self' 'unsafe-inline'; "
                                    "img-src 'self' data: blob:; frame-ancestors 'none'")
        if response.mimetype == "application/json":
            response.headers["Cache-Control"] = "no-store"  # live data
        return response


def trusted_hosts_for(host: str) -> list[str] | None:
    """The Host names to answer on `host`: the loopback names for a loopback address, the
    address itself for another one, any for a wildcard (0.0.0.0, ::)."""
    if host in ("0.0.0.0", "::", ""):
        return None
    if host in LOOPBACK_NAMES or host.startswith("127."):
        return sorted({host, *LOOPBACK_NAMES})
    return [host]


class QuietRequestHandler(WSGIRequestHandler):
    """Logs failed requests only: the page polls several routes every two seconds."""

    def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
        if str(code).isdigit() and int(code) >= 400:
            super().log_request(code, size)


def serve(app: Flask, host: str = "127.0.0.1", port: int = 8050) -> BaseWSGIServer:
    """A threaded WSGI server for `app` on host:port (port 0: any free port, then
    `server.server_port`); call `serve_forever()` (or in a thread) and `shutdown()`."""
    return make_server(host, port, app, threaded=True, request_handler=QuietRequestHandler)


@contextlib.contextmanager
def running(app: Flask, host: str = "127.0.0.1", port: int = 0) -> Iterator[str]:
    """The app served in a background thread for the block; yields its URL."""
    server = serve(app, host, port)
    thread = threading.Thread(target=server.serve_forever, name="madlib-mop dashboard",
                              daemon=True)
    thread.start()
    try:
        yield f"http://{host}:{server.server_port}/"
    finally:
        server.shutdown()
        thread.join()
        server.server_close()
