"""Many analysts at once: 8 roles submit a mix at the same moment (fit_multiple, automl,
predict, and a pg_cron schedule), against the same jobs run one after another, in one run.

The mix, on scikit-learn's digits packed into 2 segments (each role writes its own outputs):
  roles 1-4  madlib_keras_fit_multiple_model: 4 MLPs, 3 iterations, validated
  roles 5-6  madlib_keras_automl: Hyperband (R=3, eta=3) over 8 configurations
  role 7     madlib_keras_predict of a trained model over the 1,797 rows
  role 8     the fit of roles 1-4, scheduled with pg_cron (it starts on the next minute: the
             other roles start then too)

Reports jobs finished and failed; queue waits (p50, p95, max: time a job's row says
'queued'); peak live worker sessions (slots held, every database's) against the cap; peak
memory of the server's processes, callers included (summed RSS, and summed RssAnon: each
process's own memory); throughput (the sequential runs' summed time over the concurrent
makespan); per-role slowdown (concurrent time / sequential time: max / min).  Targets: 0
failed, sessions never above the cap, throughput at least 0.9, fairness at most 2.

With --databases 2 the extension and the data are in two databases of the server too, and
roles 2, 4 and 6 call in the second one (pg_cron's role 8 stays in the default database):
the cap is the server's (the library is preloaded), so the peak counts both.

    .venv/bin/python bench/bench_load.py [--dsn DSN] [--cap N] [--databases 1|2] [--timeout 900]

Runs on the embedded server by default (its pg_cron runs in the default database).
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time
from datetime import datetime
from pathlib import Path

import psycopg
from psycopg import sql
from psycopg.conninfo import make_conninfo

from madlib_mop.tools.demo import ensure_extension
from madlib_mop.tools.embedded import EmbeddedCluster, configured_dsn

SCHEMA = "bench_load"
ROLES = [f"bench_load_r{i}" for i in range(1, 9)]
COMPILE = ("loss='categorical_crossentropy', optimizer='Adam(learning_rate={})', "
           "metrics=['accuracy']")
SLOTS = "SELECT count(*) FROM madlib_mop.worker_sessions"  # every database's: the library is preloaded
SECOND_DATABASE = "bench_load_second"
SECOND_ROLES = (2, 4, 6)  # the roles that call in the second database, with --databases 2


def _mlp(hidden: int) -> str:
    import keras

    return keras.Sequential([keras.Input((64,)), keras.layers.Dense(hidden, activation="relu"),
                             keras.layers.Dense(10, activation="softmax")]).to_json()


def prepare(dsn: str, roles_made: bool = False) -> None:
    """Data, architectures, a trained model to predict with, and 8 roles allowed to run jobs."""
    from sklearn.datasets import load_digits

    cluster = EmbeddedCluster()
    digits = load_digits()
    with psycopg.connect(dsn, autocommit=True) as conn:
        ensure_extension(conn)
        conn.execute(f"DROP SCHEMA IF EXISTS {SCHEMA} CASCADE")
        for role in () if roles_made else ROLES:
            if conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (role,)).fetchone():
                conn.execute("DELETE FROM madlib_mop.jobs WHERE owner = %s", (role,))
                conn.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(role)))
            else:
                conn.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(role)))
            cluster.allow_role(role)
        conn.execute(f"CREATE SCHEMA {SCHEMA}")
        conn.execute(f"SET search_path = {SCHEMA}, madlib_mop")
        conn.execute("CREATE TABLE digits (id int, x real[], y int)")
        with conn.cursor().copy("COPY digits FROM STDIN") as copy:
            for i, (x, y) in enumerate(zip(digits.data, digits.target)):
                copy.write_row((i, [float(v) for v in x], int(y)))
        conn.execute("SELECT training_preprocessor_dl('digits', 'packed', 'y', 'x', "
                     "normalizing_const => 16, distribution_rules => '2')")
        conn.execute("SELECT validation_preprocessor_dl('digits', 'vpacked', 'y', 'x', 'packed')")
        for hidden in (32, 64):
            conn.execute("SELECT load_keras_model('arch', %s::json)", (_mlp(hidden),))
        conn.execute("SELECT load_model_selection_table('arch', 'mst', ARRAY[1, 2], %s, "
                     "ARRAY['batch_size=32, epochs=1'])",
                     ([COMPILE.format(r) for r in (0.01, 0.001)],))
        conn.execute("SELECT madlib_keras_fit('packed', 'trained', 'arch', 1, %s, "
                     "'batch_size=32, epochs=1', 2)", (COMPILE.format(0.01),))
        # pg_cron's schema is in the database it runs in (the default one) only.
        schemas = "madlib_mop, cron" if conn.execute("SELECT to_regnamespace('cron')").fetchone()[0] else "madlib_mop"
        for role in ROLES:
            conn.execute(sql.SQL("GRANT USAGE ON SCHEMA {2} TO {0}; "
                                 "GRANT USAGE, CREATE ON SCHEMA {1} TO {0}; "
                                 "GRANT SELECT ON ALL TABLES IN SCHEMA {1} TO {0}").format(
                sql.Identifier(role), sql.Identifier(SCHEMA), sql.SQL(schemas)))


def statement(index: int, run: str) -> str:
    """Role `index`'s call (1-based), writing its outputs under the name of `run`."""
    out = f"{SCHEMA}.r{index}_{run}"
    if index <= 4 or index == 8:
        return (f"SELECT madlib_mop.madlib_keras_fit_multiple_model('{SCHEMA}.packed', '{out}', "
                f"'{SCHEMA}.mst', 3, FALSE, '{SCHEMA}.vpacked', 1)")
    if index <= 6:
        return (f"SELECT madlib_mop.madlib_keras_automl('{SCHEMA}.packed', '{out}', '{SCHEMA}.arch', "
                f"'{out}_mst', ARRAY[1, 2], $$ {{'loss': ['categorical_crossentropy'], "
                f"'optimizer_params_list': [{{'optimizer': ['Adam'], 'lr': [0.001, 0.01]}}], "
                f"'metrics': ['accuracy']}} $$, $$ {{'batch_size': [32, 64], 'epochs': [1]}} $$, "
                f"'hyperband', 'R=3, eta=3, skip_last=0', 0, NULL, FALSE, '{SCHEMA}.vpacked', 1)")
    return (f"SELECT madlib_mop.madlib_keras_predict('{SCHEMA}.trained', '{SCHEMA}.digits', 'id', "
            f"'x', '{out}')")


def _as(dsn: str, role: str) -> psycopg.Connection:
    conn = psycopg.connect(dsn, autocommit=True)
    conn.execute(sql.SQL("SET ROLE {}").format(sql.Identifier(role)))
    return conn


def second_database(dsn: str) -> str:
    """The second database, made afresh with the extension and the same data; its DSN."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(SECOND_DATABASE)))
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(SECOND_DATABASE)))
        for role in ROLES:
            conn.execute(sql.SQL("GRANT CREATE ON DATABASE {} TO {}").format(
                sql.Identifier(SECOND_DATABASE), sql.Identifier(role)))
    second = make_conninfo(dsn, dbname=SECOND_DATABASE)
    prepare(second, roles_made=True)
    return second


def run_call(dsn: str, index: int, run: str, results: dict) -> None:
    dsn = CALLS_DSN.get(index, dsn)
    started = time.perf_counter()
    try:
        with _as(dsn, ROLES[index - 1]) as conn:
            conn.execute(statement(index, run))
        results[index] = (time.perf_counter() - started, None)
    except psycopg.Error as error:
        results[index] = (time.perf_counter() - started, str(error).splitlines()[0])


def wait_for_cron_job(dsn: str, out: str, due: float, timeout: float) -> tuple[float, str | None]:
    """pg_cron's run of role 8: from the minute it was due (epoch seconds) to its job's end."""
    deadline = time.monotonic() + timeout
    with psycopg.connect(dsn, autocommit=True) as conn:
        while time.monotonic() < deadline:
            row = conn.execute("SELECT state, extract(epoch FROM finished_at), last_error "
                               "FROM madlib_mop.jobs WHERE model_output_table = %s", (out,)).fetchone()
            if row and row[0] in ("finished", "failed"):
                return (float(row[1]) - due if row[1] else time.time() - due,
                        row[2] if row[0] == "failed" else None)
            time.sleep(0.5)
    return timeout, "the scheduled run did not end in time"


# Where a role's calls go, when not to the run's DSN (--databases 2).
CALLS_DSN: dict[int, str] = {}


class Sampler(threading.Thread):
    """Every 0.2 s: slots held (every database's), the server's summed RSS and RssAnon, and
    which jobs are queued (in each database of the run)."""

    def __init__(self, dsns: list[str]):
        super().__init__(daemon=True)
        self.dsns, self.stop = dsns, threading.Event()
        self.peak_slots, self.peak_rss_mb, self.peak_anon_mb = 0, 0.0, 0.0
        self.queued_seconds: dict[tuple[int, int], float] = {}

    def run(self) -> None:
        connections = [psycopg.connect(dsn, autocommit=True) for dsn in self.dsns]
        try:
            while not self.stop.is_set():
                conn = connections[0]
                self.peak_slots = max(self.peak_slots, conn.execute(SLOTS).fetchone()[0])
                pids = [r[0] for r in conn.execute("SELECT pid FROM pg_stat_activity")]
                self.peak_rss_mb = max(self.peak_rss_mb, sum(_memory_mb(p, "VmRSS") for p in pids))
                self.peak_anon_mb = max(self.peak_anon_mb, sum(_memory_mb(p, "RssAnon") for p in pids))
                for place, each in enumerate(connections):
                    for (job_id,) in each.execute("SELECT job_id FROM madlib_mop.jobs WHERE state = 'queued'"):
                        key = (place, job_id)
                        self.queued_seconds[key] = self.queued_seconds.get(key, 0.0) + 0.2
                time.sleep(0.2)
        finally:
            for conn in connections:
                conn.close()


def _memory_mb(pid: int, field: str) -> float:
    """A process's VmRSS or RssAnon (MB), from /proc."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
        return int(next(line for line in status.splitlines() if line.startswith(field)).split()[1]) / 1024
    except (OSError, StopIteration):
        return 0.0


def sequential(dsn: str, timeout: float) -> dict[int, tuple[float, str | None]]:
    results: dict[int, tuple[float, str | None]] = {}
    for index in range(1, 9):
        run_call(dsn, index, "seq", results)
    return results


def concurrent(dsn: str, timeout: float) -> tuple[float, dict, Sampler]:
    results: dict[int, tuple[float, str | None]] = {}
    with _as(dsn, ROLES[7]) as conn:
        now = datetime.now()
        minute = (now.minute + (2 if now.second > 50 else 1)) % 60
        conn.execute("SELECT cron.schedule('bench_load', %s, %s)",
                     (f"{minute} * * * *", statement(8, "cron")))
    while datetime.now().minute != minute:
        time.sleep(0.05)
    due = datetime.now().replace(second=0, microsecond=0).timestamp()
    sampler = Sampler([dsn, *sorted(set(CALLS_DSN.values()))])
    sampler.start()
    started = time.perf_counter()
    threads = [threading.Thread(target=run_call, args=(dsn, i, "load", results)) for i in range(1, 8)]
    for thread in threads:
        thread.start()
    results[8] = wait_for_cron_job(dsn, f"{SCHEMA}.r8_cron", due, timeout)
    for thread in threads:
        thread.join(timeout)
    makespan = time.perf_counter() - started
    sampler.stop.set()
    sampler.join()
    with _as(dsn, ROLES[7]) as conn:
        conn.execute("SELECT cron.unschedule('bench_load')")
    return makespan, results, sampler


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dsn", default=None)
    parser.add_argument("--cap", type=int, default=None, help="madlib_mop.max_worker_sessions (default: the machine's)")
    parser.add_argument("--databases", type=int, choices=(1, 2), default=1,
                        help="2: roles 2, 4 and 6 call in a second database of the server")
    parser.add_argument("--timeout", type=float, default=900.0)
    args = parser.parse_args()
    dsn = args.dsn or configured_dsn()
    prepare(dsn)
    if args.databases == 2:
        second = second_database(dsn)
        CALLS_DSN.update({index: second for index in SECOND_ROLES})
    databases = [dsn, *sorted(set(CALLS_DSN.values()))]
    for each in databases:
        with psycopg.connect(each, autocommit=True) as conn:
            database = conn.execute("SELECT current_database()").fetchone()[0]
            if args.cap is not None:
                conn.execute(sql.SQL("ALTER DATABASE {} SET madlib_mop.max_worker_sessions = {}").format(
                    sql.Identifier(database), sql.Literal(args.cap)))
    with psycopg.connect(dsn, autocommit=True) as conn:
        cap = conn.execute("SELECT madlib_mop._mop_max_worker_sessions()").fetchone()[0]
        shared = conn.execute("SELECT madlib_mop._mop_pool_shared()").fetchone()[0]
    if not cap:
        from madlib_mop.engine.server_slots import machine_cap
        cap = machine_cap()
    alone = sequential(dsn, args.timeout)
    makespan, together, sampler = concurrent(dsn, args.timeout)
    if args.cap is not None:
        for each in databases:
            with psycopg.connect(each, autocommit=True) as conn:
                conn.execute(sql.SQL("ALTER DATABASE {} RESET madlib_mop.max_worker_sessions").format(
                    sql.Identifier(conn.execute("SELECT current_database()").fetchone()[0])))
    where = (f"in {len(databases)} databases ({'one cap for the server' if shared else 'a cap per database'})"
             if len(databases) > 1 else "in one database")
    print_report(cap, alone, makespan, together, sampler, where)


def print_report(cap: int, alone: dict, makespan: float, together: dict, sampler: Sampler, where: str) -> None:
    kinds = {i: "fit_multiple" if i <= 4 else "automl" if i <= 6 else "predict" if i == 7 else "pg_cron fit"
             for i in range(1, 9)}
    print(f"\n## Load: 8 roles at once {where}, cap {cap} worker sessions\n")
    print("| role | call | alone (s) | together (s) | slowdown | outcome |")
    print("|---|---|---:|---:|---:|---|")
    slowdowns = []
    for i in range(1, 9):
        a, t = alone[i], together[i]
        slowdowns.append(t[0] / a[0])
        print(f"| r{i} | {kinds[i]} | {a[0]:.1f} | {t[0]:.1f} | {t[0] / a[0]:.2f} | "
              f"{'failed: ' + t[1] if t[1] else 'finished'} |")
    waits = sorted(sampler.queued_seconds.values()) or [0.0]
    failed = sum(1 for r in list(alone.values()) + list(together.values()) if r[1])
    sequential_total = sum(r[0] for r in alone.values())
    print("\n| measure | value | target |")
    print("|---|---:|---|")
    print(f"| jobs finished / failed | {16 - failed} / {failed} | 0 failed |")
    print(f"| queue wait p50 / p95 / max (s) | {statistics.median(waits):.1f} / "
          f"{waits[min(len(waits) - 1, int(0.95 * len(waits)))]:.1f} / {waits[-1]:.1f} | |")
    print(f"| peak worker sessions | {sampler.peak_slots} | at most {cap} |")
    print(f"| peak memory of the server's processes, RSS / RssAnon (GB) | {sampler.peak_rss_mb / 1024:.1f} / "
          f"{sampler.peak_anon_mb / 1024:.1f} | |")
    print(f"| sequential sum / concurrent makespan | {sequential_total:.1f} s / {makespan:.1f} s = "
          f"{sequential_total / makespan:.2f} | at least 0.9 |")
    print(f"| per-role slowdown max / min | {max(slowdowns) / min(slowdowns):.2f} | at most 2 |")


if __name__ == "__main__":
    main()
