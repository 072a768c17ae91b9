"""What a hop costs: for model states of 1 MB to 1 GB, the time a model spends between two
sub-epochs that is not training, beside the bound on this machine.

One model (an MLP of two hidden layers sized for the state, Adam: weights and two moments)
trains with madlib_keras_fit on 400 generated rows packed into 2 segments, for a few
iterations, so that only one worker is busy at a time.  For each sub-epoch after the first
(the first imports TensorFlow and reads the segment), from the job's visits table:

    hop overhead = (this visit's end - the previous visit's end) - this visit's training

that is the coordinator's record of the previous visit, the dispatch, the state's way in
and out of the worker, restoring it and reading it out.  Beside it:

    bound  = 2 copies of the state in memory + 1 durable write of it (write and fsync in
             the server's data directory), both measured here
    target = 5 ms per MB of state + 10 ms

    .venv/bin/python bench/bench_hop.py [--sizes 1,10,100,1000] [--iterations 3]

The last column is the peak resident memory of the job's busiest worker session (VmHWM;
TensorFlow's runtime, about 0.9 GB, included): it runs on the server's machine.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import tempfile
import time
from datetime import date

import numpy as np
import psycopg

from bench_mop import end_idle_workers
from madlib_mop.tools.demo import ensure_extension
from madlib_mop.tools.embedded import configured_dsn

SCHEMA = "madlib_mop_bench_hop"
FEATURES, CLASSES, ROWS = 64, 10, 400
ADAM_COPIES = 3  # weights, first and second moments (float32 each)
# Above this, the run sets what a DBA would for models of GBs: 2 worker sessions at most
# (so each may take half of the memory for worker sessions) and worker_memory_mb of 4
# states (the bench runs as a superuser).
BIG_STATE_MB = 1000
# A visit's timings (its record's seconds): the state from the store (its hop file mapped),
# into the model, the training, out of the model into its hop file.
TIMINGS = ("load", "restore", "train", "save")


def hidden_units(megabytes: float) -> int:
    """Hidden width H of Input(64) -> Dense(H) -> Dense(H) -> Dense(10) whose Adam state is
    about `megabytes` (10^6 bytes)."""
    target = megabytes * 1e6 / (4 * ADAM_COPIES)  # parameters
    # H^2 + (64 + 1 + 1 + 10) H + 10 = target
    b = FEATURES + CLASSES + 2
    return max(8, int((-b + (b * b + 4 * (target - CLASSES)) ** 0.5) / 2))


def architecture(hidden: int) -> str:
    import keras

    return keras.Sequential([keras.Input((FEATURES,)), keras.layers.Dense(hidden, activation="relu"),
                             keras.layers.Dense(hidden, activation="relu"),
                             keras.layers.Dense(CLASSES, activation="softmax")]).to_json()


def copy_seconds(size: int) -> float:
    """One copy of `size` bytes in memory (best of 3)."""
    source = np.ones(size, dtype=np.uint8)
    best = float("inf")
    for _ in range(3):
        started = time.perf_counter()
        np.copyto(np.empty_like(source), source)
        best = min(best, time.perf_counter() - started)
    return best


def durable_write_seconds(size: int, directory: str) -> float:
    """Writing `size` bytes to a new file of `directory` and fsync (best of 2)."""
    payload = np.random.default_rng(0).integers(0, 255, size, dtype=np.uint8).tobytes()
    best = float("inf")
    for _ in range(2):
        with tempfile.NamedTemporaryFile(dir=directory) as handle:
            started = time.perf_counter()
            handle.write(payload)
            handle.flush()
            os.fsync(handle.fileno())
            best = min(best, time.perf_counter() - started)
    return best


def hops(conn: psycopg.Connection, out: str) -> list[dict]:
    rows = conn.execute(
        "SELECT (result->>'finished_at')::float8, " + ", ".join(
            f"coalesce((result->'seconds'->>'{key}')::float8, 0)" for key in TIMINGS)
        + f" FROM {SCHEMA}.{out}_mop_visits ORDER BY step").fetchall()
    return [{"overhead": row[0] - previous[0] - row[1 + TIMINGS.index("train")],
             **dict(zip(TIMINGS, row[1:]))} for previous, row in zip(rows, rows[1:])]


def run_size(conn: psycopg.Connection, megabytes: float, iterations: int) -> dict:
    hidden = hidden_units(megabytes)
    conn.execute(f"DELETE FROM {SCHEMA}.arch")
    conn.execute(f"SELECT load_keras_model('{SCHEMA}.arch', %s::json)", (architecture(hidden),))
    model_id = conn.execute(f"SELECT max(model_id) FROM {SCHEMA}.arch").fetchone()[0]
    out = f"hop_{str(megabytes).replace('.', '_')}"
    end_idle_workers(conn)  # new workers: their peak RSS is this job's
    if megabytes > BIG_STATE_MB:  # as a DBA would, for models of GBs: fewer, bigger sessions
        conn.execute("SET madlib_mop.max_worker_sessions = 2")
        conn.execute(f"SET madlib_mop.worker_memory_mb = {int(megabytes * 4)}")
    started = time.perf_counter()
    try:
        conn.execute(f"SELECT madlib_keras_fit('{SCHEMA}.packed', '{SCHEMA}.{out}', '{SCHEMA}.arch', %s, "
                     "$$loss='categorical_crossentropy', optimizer='Adam(learning_rate=0.0001)', "
                     "metrics=['accuracy']$$, 'batch_size=100, epochs=1', %s)", (model_id, iterations))
    except psycopg.Error as error:
        return {"hidden": hidden, "error": f"{error.diag.sqlstate} {str(error).splitlines()[0][:60]}"}
    finally:
        conn.execute("RESET madlib_mop.max_worker_sessions")
        conn.execute("RESET madlib_mop.worker_memory_mb")
    seconds = time.perf_counter() - started
    pids = [pid for (pid,) in conn.execute(
        f"SELECT DISTINCT (result->>'pid')::int FROM {SCHEMA}.{out}_mop_visits")]
    return {"hidden": hidden, "seconds": seconds, "hops": hops(conn, out),
            "peak_mb": max(peak_rss_mb(pid) for pid in pids)}


def peak_rss_mb(pid: int) -> float:
    """A live process's peak resident memory (VmHWM), MB; 0 if it is gone (the bench runs on
    the server's machine)."""
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="1,10,100,1000", help="state sizes in MB (10^6 bytes)")
    parser.add_argument("--iterations", type=int, default=3)
    args = parser.parse_args()
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    sizes = [float(s) for s in args.sizes.split(",")]
    rng = np.random.default_rng(7)
    centers = rng.normal(size=(CLASSES, FEATURES))
    labels = rng.integers(0, CLASSES, ROWS)
    features = (centers[labels] + rng.normal(scale=0.5, size=(ROWS, FEATURES))).astype(np.float32)
    with psycopg.connect(configured_dsn(), autocommit=True) as conn:
        schema = ensure_extension(conn)
        data_directory = conn.execute("SHOW data_directory").fetchone()[0]
        conn.execute(f"DROP SCHEMA IF EXISTS {SCHEMA} CASCADE")
        conn.execute(f"CREATE SCHEMA {SCHEMA}")
        conn.execute(f"SET search_path = {SCHEMA}, {schema}")
        conn.execute("CREATE TABLE source (id int, y int, x real[])")
        with conn.cursor().copy("COPY source (id, y, x) FROM STDIN") as copy:
            for i in range(ROWS):
                copy.write_row((i, int(labels[i]), features[i].tolist()))
        conn.execute("SELECT training_preprocessor_dl('source', 'packed', 'y', 'x', 100)")
        conn.execute(f"SELECT load_keras_model('{SCHEMA}.arch', %s::json)", (architecture(8),))
        results = {size: run_size(conn, size, args.iterations) for size in sizes}
        conn.execute(f"DROP SCHEMA {SCHEMA} CASCADE")
    print(f"\nHop overhead, {date.today()}, {platform.machine()} with {os.cpu_count()} cores; "
          f"1 model (Adam), {ROWS} rows in 2 segments, {args.iterations} iterations; "
          "ms per hop, mean (max) over the sub-epochs after the first\n")
    print("| state | hidden | hop overhead | load | restore | training | read out into the hop file "
          "| bound (2 copies + durable write) | target (5 ms/MB + 10) | overhead / target | job "
          "| worker's peak RSS |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for size, result in results.items():
        size_bytes = int(size * 1e6)
        bound = 2 * copy_seconds(size_bytes) + durable_write_seconds(size_bytes, data_directory)
        target = (5 * size + 10) / 1000
        label = f"{size:g} MB"
        if "error" in result:
            print(f"| {label} | {result['hidden']} | fails: {result['error']} | | | | "
                  f"| {bound * 1000:.0f} | {target * 1000:.0f} | | | |")
            continue
        measured = result["hops"]

        def ms(key: str, hops: list = measured) -> str:
            values = [h[key] * 1000 for h in hops]
            return f"{statistics.mean(values):.0f} ({max(values):.0f})"
        overhead = statistics.mean(h["overhead"] for h in measured)
        print(f"| {label} | {result['hidden']} | {ms('overhead')} | "
              + " | ".join(ms(key) for key in TIMINGS)
              + f" | {bound * 1000:.0f} | {target * 1000:.0f} | {overhead / target:.2f} "
              f"| {result['seconds']:.1f} s | {result['peak_mb']:,.0f} MB |")


if __name__ == "__main__":
    main()
