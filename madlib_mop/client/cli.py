"""`madlib-mop`: jobs, live progress, reports, TensorBoard event files and a web dashboard.

    madlib-mop jobs                          the jobs of the connected role
    madlib-mop watch JOB                     a live progress bar until the job ends
    madlib-mop report JOB --out DIR          plots (PNG) and a Markdown / HTML summary
    madlib-mop tensorboard JOB --logdir DIR  event files: tensorboard --logdir DIR
    madlib-mop dashboard [--host H] [--port P]  a live web page of your jobs, read-only
    madlib-mop exporter [--host H] [--port P]   Prometheus metrics on /metrics (client.metrics)
    madlib-mop steer JOB stop MST_KEY        steer a running job (also: clone MST_KEY
                                             [--compile-params T] [--fit-params T], add
                                             MODEL_ID --compile-params T --fit-params T,
                                             iterations MST_KEY N)

JOB is a job id or a model output table.  The connection is `--dsn` (a libpq string or
URI, or a SQLAlchemy URL), else MADLIB_MOP_DSN, else libpq's PG* variables.
Exit status: 0 success (watch: the job finished; dashboard: stopped by Ctrl-C), 1 the job
failed or was interrupted (watch), 2 bad usage or an error.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading

from madlib_mop import errors
from madlib_mop.job.record import JobState

EXIT_OK, EXIT_JOB_NOT_FINISHED, EXIT_ERROR = 0, 1, 2


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="madlib-mop", description="Follow and report madlib_mop model selection jobs.")
    parser.add_argument("--dsn", default=os.environ.get("MADLIB_MOP_DSN"),
                        help="connection string (default: MADLIB_MOP_DSN, else PG* variables)")
    parser.add_argument("--schema", help="the extension's schema (default: where it is installed)")
    commands = parser.add_subparsers(dest="command", required=True)
    jobs = commands.add_parser("jobs", help="table of your jobs (the job_progress view)")
    jobs.add_argument("--limit", type=int, default=20, help="newest N jobs (default 20; 0: all)")
    watch = commands.add_parser("watch", help="live progress bar of a job until it ends")
    watch.add_argument("job", help="job id or model output table")
    watch.add_argument("--interval", type=float, default=1.0, help="seconds between reads")
    report = commands.add_parser("report", help="plots and a summary of a job")
    report.add_argument("job", help="job id or model output table")
    report.add_argument("--out", required=True, help="folder to write into (created)")
    report.add_argument("--format", choices=("md", "html", "both"), default="md")
    board = commands.add_parser("tensorboard", help="TensorBoard event files of a job's metrics")
    board.add_argument("job", help="job id or model output table")
    board.add_argument("--logdir", required=True, help="folder for the event files (created)")
    dashboard = commands.add_parser(
        "dashboard", help="a live, read-only web page of your jobs (Ctrl-C stops it)")
    dashboard.add_argument("--host", default="127.0.0.1",
                       help="address to listen on (default 127.0.0.1: this machine only; the page "
                            "has no login of its own, so anyone who reaches it sees your jobs)")
    dashboard.add_argument("--port", type=int, default=8050,
                           help="port (default 8050; 0: any free one)")
    exporter = commands.add_parser(
        "exporter", help="Prometheus metrics of the worker pool, the queue and the jobs on /metrics")
    exporter.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    exporter.add_argument("--port", type=int, default=9187, help="port (default 9187; 0: any free one)")
    steer = commands.add_parser("steer", help="stop, clone or add a model of a running job, or "
                                              "change a model's iterations")
    steer.add_argument("job", help="job id or model output table")
    actions = steer.add_subparsers(dest="action", required=True)
    for name, help_text in (("stop", "train the model no further than its current iteration"),
                            ("clone", "a new model from the model's state at its next iteration boundary"),
                            ("add", "a new configuration"),
                            ("iterations", "the model's iterations in all")):
        action = actions.add_parser(name, help=help_text)
        action.add_argument("model_id" if name == "add" else "mst_key", type=int)
        if name == "iterations":
            action.add_argument("num_iterations", type=int)
        if name in ("clone", "add"):
            action.add_argument("--compile-params", required=name == "add")
            action.add_argument("--fit-params", required=name == "add")
    return parser


def _steer(client, args) -> int:
    """One request; the job applies it where the model is between iterations."""
    job_id = client.job(args.job).job_id
    if args.action == "stop":
        action = client.stop_model(job_id=job_id, mst_key=args.mst_key)
    elif args.action == "clone":
        action = client.clone_model(job_id=job_id, mst_key=args.mst_key, compile_params=args.compile_params,
                                    fit_params=args.fit_params)
    elif args.action == "add":
        action = client.add_model_config(job_id=job_id, model_id=args.model_id,
                                         compile_params=args.compile_params, fit_params=args.fit_params)
    else:
        action = client.set_model_iterations(job_id=job_id, mst_key=args.mst_key,
                                             num_iterations=args.num_iterations)
    print(f"job {job_id}: steering action {action} recorded (SELECT * FROM steering WHERE action_id = {action})")
    return EXIT_OK


def _exporter(client, host: str, port: int) -> int:
    """Serve `client.metrics` on /metrics until Ctrl-C, each scrape read then."""
    from wsgiref.simple_server import WSGIRequestHandler, make_server

    from prometheus_client import CollectorRegistry, make_wsgi_app

    from madlib_mop.client.metrics import PoolCollector

    class Quiet(WSGIRequestHandler):
        def log_message(self, *args) -> None:  # a scrape every few seconds: no log line each
            pass

    registry = CollectorRegistry()
    registry.register(PoolCollector(client.engine, client.schema))
    server = make_server(host, port, make_wsgi_app(registry), handler_class=Quiet)
    shown = f"[{host}]" if ":" in host else host
    print(f"madlib-mop exporter: http://{shown}:{server.server_port}/metrics (Ctrl-C stops it)", flush=True)
    return _serve_until_stopped(server)


def _serve_until_stopped(server) -> int:
    """Serve until Ctrl-C or SIGTERM (`docker stop`, systemd), also where the shell that
    started the command in the background ignores SIGINT.  The signal stops the loop from
    another thread: raised inside a request instead, the server's handler would catch it
    as the request's error and serve on."""
    stop = lambda *_: threading.Thread(target=server.shutdown, daemon=True).start()  # noqa: E731
    for number in (signal.SIGINT, signal.SIGTERM):
        signal.signal(number, stop)
    try:
        server.serve_forever()
    finally:
        server.server_close()
    return EXIT_OK


def _dashboard(dsn: str | None, schema: str | None, host: str, port: int) -> int:
    from madlib_mop.client.dashboard import create_app, serve, trusted_hosts_for

    app = create_app(dsn, schema=schema, trusted_hosts=trusted_hosts_for(host))
    server = serve(app, host, port)
    shown = f"[{host}]" if ":" in host else host
    print(f"madlib-mop dashboard: http://{shown}:{server.server_port}/ (Ctrl-C stops it)", flush=True)
    return _serve_until_stopped(server)


def _jobs(client, limit: int) -> int:
    import pandas as pd

    frame = client.jobs()
    if limit:
        frame = frame.head(limit)
    if frame.empty:
        print("no jobs")
        return EXIT_OK
    columns = ["job_id", "state", "model_output_table", "models", "models_stopped",
               "epochs_done", "epochs_total", "percent_done", "started_at", "finished_at", "eta"]
    shown = frame[columns].copy()
    for column in ("started_at", "finished_at", "eta"):
        shown[column] = shown[column].map(lambda t: "" if pd.isna(t) else t.strftime("%Y-%m-%d %H:%M:%S"))
    with pd.option_context("display.width", 200, "display.max_columns", None,
                           "display.max_colwidth", 40):
        print(shown.to_string(index=False))
    failed = frame[frame["last_error"].notna() & (frame["state"] != JobState.FINISHED)]
    for _, row in failed.iterrows():
        print(f"job {row['job_id']} ({row['state']}): {row['last_error']}")
    return EXIT_OK


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        from madlib_mop.client.session import Client
    except ImportError as error:
        print(f"madlib-mop: {error}; install the client: pip install 'madlib_mop[client]'",
              file=sys.stderr)
        return EXIT_ERROR
    try:
        if args.command == "dashboard":
            # Its own read-only connections, not the client's.
            return _dashboard(args.dsn, args.schema, args.host, args.port)
        client = Client(args.dsn, schema=args.schema)
        with client:
            if args.command == "jobs":
                return _jobs(client, args.limit)
            if args.command == "watch":
                state = client.watch(args.job, interval=args.interval)
                ref = client.job(args.job)
                print(f"job {ref.job_id}: {state} ({ref.model_output_table})")
                return EXIT_OK if state == JobState.FINISHED else EXIT_JOB_NOT_FINISHED
            if args.command == "report":
                from madlib_mop.client.report import write_report

                formats = ("md", "html") if args.format == "both" else (args.format,)
                for kind, path in write_report(client, args.job, args.out, formats=formats).items():
                    print(f"{kind}: {path}")
                return EXIT_OK
            if args.command == "steer":
                return _steer(client, args)
            if args.command == "exporter":
                return _exporter(client, args.host, args.port)
            if args.command == "tensorboard":
                # TensorFlow only writes files here: keep its errors about a missing GPU quiet.
                os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
                from madlib_mop.client.tensorboard import write_events

                runs = write_events(client, args.job, args.logdir)
                print(f"{len(runs)} runs in {args.logdir}: tensorboard --logdir {args.logdir}")
                return EXIT_OK
    except KeyboardInterrupt:
        return 130
    except Exception as error:  # noqa: BLE001 (every error: a person's sentence, exit code 2)
        print(f"madlib-mop: {explained(error, args)}", file=sys.stderr)
        return EXIT_ERROR
    return EXIT_ERROR


def _chain(error: BaseException) -> list[BaseException]:
    found: list[BaseException] = []
    while error is not None and error not in found:
        found.append(error)
        error = error.__cause__ or error.__context__
    return found


def explained(error: BaseException, args: argparse.Namespace) -> str:
    """What went wrong and what to do, for the common mistakes; else the server's message
    and HINT (never SQLAlchemy's statement and link)."""
    import psycopg

    from madlib_mop.client.errors import ServerError, server_error

    if isinstance(error, LookupError):
        return str(error)
    chain = _chain(error)  # pandas and SQLAlchemy wrap the driver's error
    said = next((found for found in map(server_error, chain) if isinstance(found, ServerError)), None)
    job, schema = getattr(args, "job", None), args.schema or "madlib_mop"
    if said is None:
        if not any(isinstance(cause, psycopg.OperationalError) for cause in chain):
            return str(error)  # not the server's: as it is (a file that cannot be written, ...)
        # An operational error without SQLSTATE: the connection itself failed.
        first = str(getattr(error, "orig", None) or error).strip().splitlines()[0]
        return (f"cannot connect to the server: {first}\n"
                "Pass --dsn, or set MADLIB_MOP_DSN or libpq's PG* variables (PGHOST, PGPORT, "
                "PGDATABASE, PGUSER), and check that the server runs.")
    if said.sqlstate == errors.UNDEFINED_TABLE and job is not None:
        return (f"the tables of job {job} are gone ({said.message}): its results were in them.\n"
                "`madlib-mop jobs` lists your jobs; those whose tables remain can be read.")
    if said.sqlstate in (errors.UNDEFINED_TABLE, errors.INVALID_SCHEMA_NAME):
        return (f"{said.message}: the extension is not installed in this database, or in another "
                f"schema than {schema}.\nCREATE EXTENSION madlib_mop; or pass --schema.")
    if said.sqlstate == errors.INSUFFICIENT_PRIVILEGE:
        return (f"{said.message}.\nAsk the table's owner or a DBA for the right (GRANT USAGE ON "
                f"SCHEMA {schema}, GRANT SELECT ON the job's tables).")
    return str(said)


if __name__ == "__main__":
    sys.exit(main())
