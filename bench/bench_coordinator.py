"""How far one coordinator goes: its own cost per hop, measured, and the makespan and its load
for 8, 64 and 256 segments with 10x as many models, simulated.

1. Measured (the embedded server, or MADLIB_MOP_DSN): a job whose workers return at once
   (16 one-layer models on 8 segments of 4 rows each), run for 1 and for 4 iterations in a
   warm session.  The difference between the two runs, per hop, is the coordinator's
   marginal cost: CPU of its backend (the calling session), wall time, WAL bytes written,
   and the workers' own seconds per visit beside it.
2. Recorded: sub-epoch times of a real job (scikit-learn's digits on 4 segments, 8
   configurations of MLPs and CNNs, 2 iterations): each model's seconds per visit.
3. Simulated: the job's scheduler (`madlib_mop.job.schedule`: the seeded visit orders and
   the Dispatcher, the real code) driven by an event loop with those recorded times (model
   i takes the times of recorded model i mod 8; data grows with the segments, so a visit's
   time stays as recorded) and a single-threaded coordinator that spends the measured cost
   on every hop.  As the real loop does, every free segment is offered to the Dispatcher
   after each hop.  Beside it, Cerebro's randomized scheduler (VLDB 2020): a free segment
   gets an idle model, drawn at random, that has not visited it in its current epoch.
   The dispatch's own CPU per hop is measured in the simulation, for the Dispatcher of
   this version (an index of the models due on each segment) and for the scan of every
   model it replaces (`ScanningDispatcher`, as until 0.8.0): the two make the same
   decisions (checked at 8 and 64 segments); at 256 segments the scan runs only its
   first hops, its whole run being too slow here.

    .venv/bin/python bench/bench_coordinator.py [--sizes 8,64,256] [--epochs 1]
"""

from __future__ import annotations

import argparse
import heapq
import json
import os
import platform
import time
from datetime import date
from pathlib import Path

import numpy as np
import psycopg
from bench_hop import durable_write_seconds

from madlib_mop.job import schedule
from madlib_mop.tools.demo import ensure_extension
from madlib_mop.tools.embedded import configured_dsn

SCHEMA = "madlib_mop_bench_coordinator"
RESULTS = Path(__file__).resolve().parent / "results"
TINY_SEGMENTS, TINY_MODELS = 8, 16
SAMPLED_HOPS = 3000  # the Dispatcher's own hops at sizes where its whole run is too slow here


# ---- 1. the coordinator's marginal cost per hop, measured --------------------------------

def _backend_cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


def _run_tiny(conn: psycopg.Connection, pid: int, out: str, iterations: int) -> dict:
    wal = conn.execute("SELECT pg_current_wal_insert_lsn()").fetchone()[0]
    cpu, started = _backend_cpu_seconds(pid), time.perf_counter()
    conn.execute("SELECT madlib_keras_fit_multiple_model('tiny_packed', %s, 'tiny_mst', %s, FALSE)",
                 (out, iterations))
    wall, cpu = time.perf_counter() - started, _backend_cpu_seconds(pid) - cpu
    written = conn.execute("SELECT pg_current_wal_insert_lsn() - %s::pg_lsn", (wal,)).fetchone()[0]
    worker = conn.execute(
        f"SELECT count(*), sum((SELECT sum(value::float8) FROM jsonb_each_text(result->'seconds'))) "
        f"FROM {SCHEMA}.{out}_mop_visits").fetchone()
    coordinator = conn.execute("SELECT coordinator_pid FROM jobs WHERE model_output_table = %s "
                               "ORDER BY job_id DESC LIMIT 1", (f"{SCHEMA}.{out}",)).fetchone()[0]
    return {"hops": worker[0], "wall": wall, "cpu": cpu, "wal": float(written), "worker": worker[1] or 0.0,
            "coordinator_is_caller": coordinator == pid}


def measure_hop_cost(conn: psycopg.Connection) -> dict:
    """The coordinator's marginal cost per hop: 4 iterations minus 1, per extra hop."""
    import keras

    conn.execute(f"SET madlib_mop.segments = {TINY_SEGMENTS}")
    conn.execute("CREATE TABLE tiny (id int, x real[], y int)")
    conn.execute("INSERT INTO tiny SELECT i, ARRAY[i % 3, i % 5, i % 7, 1]::real[], i % 2 "
                 f"FROM generate_series(1, {4 * TINY_SEGMENTS}) i")
    conn.execute("SELECT training_preprocessor_dl('tiny', 'tiny_packed', 'y', 'x', 4)")
    arch = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2, activation="softmax")]).to_json()
    conn.execute("SELECT load_keras_model('tiny_arch', %s::json)", (arch,))
    conn.execute("SELECT generate_model_configs('tiny_arch', 'tiny_mst', ARRAY[1], "
                 "$${'loss': ['categorical_crossentropy'], 'optimizer_params_list': [{'optimizer': ['SGD'], "
                 "'lr': [0.1, 0.01, 0.001, 0.0001]}]}$$, $${'batch_size': [1, 2, 3, 4], 'epochs': [1]}$$)")
    pid = conn.execute("SELECT pg_backend_pid()").fetchone()[0]
    _run_tiny(conn, pid, "tiny_warm", 1)  # TensorFlow in this session, workers started
    one, four = _run_tiny(conn, pid, "tiny_1", 1), _run_tiny(conn, pid, "tiny_4", 4)
    extra = four["hops"] - one["hops"]
    per_hop = {key: (four[key] - one[key]) / extra for key in ("wall", "cpu", "wal", "worker")}
    conn.execute("RESET madlib_mop.segments")
    return {**per_hop, "runs": {"1": one, "4": four}}


# ---- 2. sub-epoch times of a real job, recorded ------------------------------------------

def record_subepoch_times(conn: psycopg.Connection) -> list[list[float]]:
    """Seconds per visit of each model of a digits job (8 configurations, 4 segments)."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    conn.execute("SET madlib_mop.segments = 4")
    conn.execute("CREATE TABLE digits (id int, x real[], y int)")
    with conn.cursor().copy("COPY digits (id, x, y) FROM STDIN") as copy:
        for i, (x, y) in enumerate(zip(digits.data / 16.0, digits.target)):
            copy.write_row((i, [float(v) for v in x], int(y)))
    conn.execute("SELECT training_preprocessor_dl('digits', 'digits_packed', 'y', 'x')")
    import keras

    mlp = keras.Sequential([keras.Input((64,)), keras.layers.Dense(64, activation="relu"),
                            keras.layers.Dense(10, activation="softmax")]).to_json()
    cnn = keras.Sequential([keras.Input((64,)), keras.layers.Reshape((8, 8, 1)),
                            keras.layers.Conv2D(16, 3, activation="relu"), keras.layers.Flatten(),
                            keras.layers.Dense(10, activation="softmax")]).to_json()
    for arch in (mlp, cnn):
        conn.execute("SELECT load_keras_model('digits_arch', %s::json)", (arch,))
    conn.execute("SELECT generate_model_configs('digits_arch', 'digits_mst', ARRAY[1, 2], "
                 "$${'loss': ['categorical_crossentropy'], 'optimizer_params_list': [{'optimizer': ['Adam'], "
                 "'lr': [0.01, 0.001]}]}$$, $${'batch_size': [16, 64], 'epochs': [1]}$$)")
    conn.execute("SELECT madlib_keras_fit_multiple_model('digits_packed', 'digits_models', 'digits_mst', 2)")
    rows = conn.execute(
        f"SELECT mst_key, array_agg((SELECT sum(value::float8) FROM jsonb_each_text(result->'seconds')) "
        f"ORDER BY step) FROM {SCHEMA}.digits_models_mop_visits GROUP BY 1 ORDER BY 1").fetchall()
    conn.execute("RESET madlib_mop.segments")
    return [list(times) for _, times in rows]


# ---- 3. the scheduler, simulated ---------------------------------------------------------

class ScanningDispatcher(schedule.Dispatcher):
    """The Dispatcher as it was until 0.8.0: for a free segment, a scan of every model for
    those due on it (the same rule and the same decisions as the index of due models)."""

    def _due(self, segment: int) -> list[int]:
        return [m for m in self.progress if self.dispatchable(m)
                and self.planned(m, self.progress[m].done)[2] == segment]


class CerebroRandom:
    """Cerebro's randomized scheduler: a free segment gets a random idle model that has not
    visited it in the model's current epoch.  Each segment keeps a list of such models,
    cleaned as it is drawn from (a model that has gone busy or visited it is dropped)."""

    def __init__(self, models: list[int], segments: int, epochs: int, seed: int):
        self.rng = np.random.default_rng(seed)
        self.S, self.epochs = segments, epochs
        self.left = {m: epochs * segments for m in models}
        self.unvisited = {m: set(range(segments)) for m in models}
        self.busy: set[int] = set()
        self.listed = {s: list(models) for s in range(segments)}
        self.members = {s: set(models) for s in range(segments)}

    def next_visit(self, segment: int) -> tuple[int, int] | None:
        listed, members = self.listed[segment], self.members[segment]
        while listed:
            index = int(self.rng.integers(len(listed)))
            model = listed[index]
            listed[index] = listed[-1]
            listed.pop()
            members.discard(model)
            if model not in self.busy and segment in self.unvisited[model]:
                self.busy.add(model)
                self.unvisited[model].discard(segment)
                return model, self.epochs * self.S - self.left[model]
        return None

    def finish(self, model: int, segment: int, seconds: float) -> None:
        self.busy.discard(model)
        self.left[model] -= 1
        if not self.left[model]:
            return
        if not self.unvisited[model]:
            self.unvisited[model] = set(range(self.S))
        for s in self.unvisited[model]:
            if model not in self.members[s]:
                self.members[s].add(model)
                self.listed[s].append(model)


class Timed:
    """A scheduler (the job's Dispatcher, or its indexed twin), its CPU per call measured."""

    def __init__(self, dispatcher):
        self.dispatcher, self.cpu = dispatcher, 0.0

    def next_visit(self, segment: int) -> tuple[int, int] | None:
        started = time.process_time()
        given = self.dispatcher.next_visit(segment)
        self.cpu += time.process_time() - started
        return given

    def finish(self, model: int, segment: int, seconds: float) -> None:
        started = time.process_time()
        self.dispatcher.finish(model, segment, seconds)
        self.cpu += time.process_time() - started


def simulate(policy, segments: int, duration, hop_cost: float, max_hops: int | None = None) -> dict:
    """Event loop: every free segment is offered to `policy`; a visit ends after its
    duration; the coordinator, one thread, spends `hop_cost` on each ended visit before
    the segment is offered again.  The decisions, the makespan and the coordinator's load."""
    free, running, decisions = set(range(segments)), [], []
    now = coordinator_free = 0.0
    hops = work = 0.0

    def offer(at: float) -> None:
        for segment in sorted(free):
            given = policy.next_visit(segment)
            if given is not None and isinstance(given[0], tuple):  # the job's: (its models, step)
                (model,), step = given  # (unfused here)
                given = model, step
            if given is not None:
                seconds = duration(given[0], given[1])
                decisions.append((given[0], segment))
                heapq.heappush(running, (at + seconds, segment, given[0], seconds))
                free.discard(segment)

    offer(0.0)
    while running and (max_hops is None or hops < max_hops):
        ended, segment, model, seconds = heapq.heappop(running)
        coordinator_free = max(ended, coordinator_free) + hop_cost
        now = coordinator_free
        policy.finish(model, segment, seconds)
        free.add(segment)
        hops, work = hops + 1, work + seconds
        offer(now)
    return {"makespan": now, "hops": int(hops), "work": work, "coordinator_load": hops * hop_cost / now,
            "lower_bound": max(work / segments, hops * hop_cost), "decisions": decisions}


def durations_from(recorded: list[list[float]], seed: int):
    """Model m's k-th visit takes the time of a recorded visit of model m mod 8, drawn from a
    stream of its own: the same whichever scheduler runs it, and in whatever order."""
    draws: dict[int, np.ndarray] = {}

    def duration(model: int, step: int) -> float:
        times = recorded[(model - 1) % len(recorded)]
        if model not in draws or step >= len(draws[model]):
            draws[model] = np.random.default_rng([seed, model]).integers(len(times), size=2 * (step + 64))
        return float(times[draws[model][step]])
    return duration


def run_size(segments: int, epochs: int, recorded: list[list[float]], hop_cost: float) -> dict:
    models = list(range(1, 10 * segments + 1))
    orders = schedule.visit_orders(models, segments, epochs, seed=1)

    def fresh(kind=schedule.Dispatcher):
        return kind({m: [list(o) for o in orders[m]] for m in models}, segments)

    def timed_run(kind, max_hops=None):
        timed = Timed(fresh(kind))
        run = simulate(timed, segments, durations_from(recorded, 3), hop_cost, max_hops=max_hops)
        return run, timed.cpu / run["hops"]

    whole = segments <= 64  # the scan's whole run at 256 segments takes too long here
    scan_run, scan_cpu = timed_run(ScanningDispatcher, None if whole else SAMPLED_HOPS)
    index_run, index_cpu = timed_run(schedule.Dispatcher)
    if whole:
        assert scan_run["decisions"] == index_run["decisions"], "the index decides otherwise than the scan"
    return {"segments": segments, "models": len(models), "scan_cpu": scan_cpu, "scan_hops": scan_run["hops"],
            "index_cpu": index_cpu,
            "scan": _summary(simulate(fresh(), segments, durations_from(recorded, 3), hop_cost + scan_cpu)),
            "index": _summary(simulate(fresh(), segments, durations_from(recorded, 3), hop_cost + index_cpu)),
            "no_coordinator": _summary(simulate(fresh(), segments, durations_from(recorded, 3), 0.0)),
            "cerebro": _summary(simulate(CerebroRandom(models, segments, epochs, seed=5), segments,
                                         durations_from(recorded, 3), hop_cost))}


def _summary(run: dict) -> dict:
    return {key: run[key] for key in ("makespan", "hops", "work", "coordinator_load", "lower_bound")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="8,64,256")
    parser.add_argument("--epochs", type=int, default=1)
    args = parser.parse_args()
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    with psycopg.connect(configured_dsn(), autocommit=True) as conn:
        schema = ensure_extension(conn)
        conn.execute(f"DROP SCHEMA IF EXISTS {SCHEMA} CASCADE")
        conn.execute(f"CREATE SCHEMA {SCHEMA}")
        conn.execute(f"SET search_path = {SCHEMA}, {schema}")
        cost = measure_hop_cost(conn)
        recorded = record_subepoch_times(conn)
        data_directory = conn.execute("SHOW data_directory").fetchone()[0]
        conn.execute(f"DROP SCHEMA {SCHEMA} CASCADE")
    hop_cost = cost["cpu"]  # one thread: its CPU per hop is what it can give
    disk = 100e6 / durable_write_seconds(int(100e6), data_directory)  # bytes/s, written and fsynced
    sizes = [run_size(int(s), args.epochs, recorded, hop_cost) for s in args.sizes.split(",")]
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "bench_coordinator.json").write_text(json.dumps(
        {"date": str(date.today()), "cost": cost, "recorded": recorded, "sizes": sizes, "disk": disk}, indent=1))
    mean_visit = float(np.mean([t for times in recorded for t in times]))
    print(f"\nThe coordinator, {date.today()}, {platform.machine()} with {os.cpu_count()} cores\n")
    print(f"Measured: a job whose workers return at once ({TINY_MODELS} models, {TINY_SEGMENTS} segments), "
          "4 iterations minus 1, per extra hop:\n")
    print("| job's wall time | coordinator CPU | WAL written | workers' own seconds |")
    print("|---|---|---|---|")
    print(f"| {cost['wall'] * 1e3:.1f} ms | {cost['cpu'] * 1e3:.1f} ms | {cost['wal'] / 1024:.1f} kB "
          f"| {cost['worker'] * 1e3:.1f} ms |")
    print(f"\nSimulated: {args.epochs} epochs, 10 models per segment, recorded visits of 8 digits models "
          f"(mean {mean_visit * 1e3:.0f} ms), the coordinator spending {hop_cost * 1e3:.1f} ms per hop "
          "plus the dispatch's own CPU, by a scan of every model (until 0.8.0) and by the index of "
          "due models (this version):\n")
    print("| segments | models | hops | scan: CPU per hop | makespan | coordinator load "
          "| index: CPU per hop | makespan | coordinator load | no coordinator cost | lower bound "
          "| Cerebro random | its load |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for size in sizes:
        scan, index, free, cerebro = size["scan"], size["index"], size["no_coordinator"], size["cerebro"]
        sampled = "" if size["scan_hops"] == index["hops"] else f" (first {size['scan_hops']})"
        print(f"| {size['segments']} | {size['models']} | {index['hops']} | {size['scan_cpu'] * 1e3:.2f} ms{sampled}"
              f" | {scan['makespan']:.1f} s | {scan['coordinator_load']:.0%} | {size['index_cpu'] * 1e3:.3f} ms "
              f"| {index['makespan']:.1f} s | {index['coordinator_load']:.0%} "
              f"| {free['makespan']:.1f} s | {free['lower_bound']:.1f} s "
              f"| {cerebro['makespan']:.1f} s | {cerebro['coordinator_load']:.0%} |")
    limit = 1 / (hop_cost + sizes[-1]["index_cpu"])
    print(f"\nOne coordinator handles at most {1 / hop_cost:.0f} hops/s at its measured cost "
          f"({limit:.0f} hops/s with the dispatch's CPU at {sizes[-1]['segments']} segments). "
          f"Its disk writes {disk / 1e6:.0f} MB/s durably (100 MB, fsync): one durable copy of each "
          "model's state per iteration, that is state bytes / segments per hop.")


if __name__ == "__main__":
    main()
