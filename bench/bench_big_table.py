"""Tables larger than a worker's memory, and packing at scale.

1. Packing: N rows x 64 float4 features (default 10,000,000: 1 M rows generated in the
   server, then copied 10 times with new ids), packed by training_preprocessor_dl over 2
   segments.  Reported: rows/s beside `CREATE TABLE AS` of the same rows, and the packing
   session's peak resident memory (its VmHWM, read from /proc; the server runs on this
   machine), before and after packing.
2. Training on that packed table with madlib_mop.worker_memory_mb set to an eighth of its
   size: one MLP (64-32-10, Adam, batch 256), 1 iteration over all rows.  Reported: each
   worker's own resident memory at its peak against what it may hold: its runtime (TensorFlow and the
   traced program, reading its buffers per sub-epoch: the same job on a table of 20,000
   rows with worker_memory_mb = 0, which keeps none decoded) + worker_memory_mb.
   The workers are new sessions (the role's idle ones are ended first).

    .venv/bin/python bench/bench_big_table.py [--rows 10000000] [--segments 2]
"""

from __future__ import annotations

import argparse
import json
import threading
import time
from datetime import datetime, timezone
from pathlib import Path

import psycopg

from bench_mop import SCHEMA, end_idle_workers, fresh_schema
from madlib_mop.tools.embedded import configured_dsn

RESULTS = Path(__file__).resolve().parent / "results"
GENERATED = 1_000_000  # rows generated; the rest are copies with new ids
MLP = json.dumps({"class_name": "Sequential", "config": {"name": "mlp", "layers": [
    {"class_name": "Dense", "config": {"units": 32, "activation": "relu", "batch_input_shape": [None, 64]}},
    {"class_name": "Dense", "config": {"units": 10, "activation": "softmax"}}]}})
COMPILE = "loss='categorical_crossentropy', optimizer='Adam(learning_rate=0.001)', metrics=['accuracy']"


def resident_mb(pid: int) -> dict[str, float]:
    """A server process's resident memory now, MB: its own (RssAnon) and the server's shared
    buffers it has touched (RssShmem, which VmRSS counts too)."""
    fields = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines())
    return {name: int(fields[name].split()[0]) / 1024 for name in ("RssAnon", "RssShmem")}


class PeakSampler(threading.Thread):
    """The peak of each field of `resident_mb` over the processes `pids()` names, sampled
    every 20 ms until stopped."""

    def __init__(self, pids):
        super().__init__(daemon=True)
        self.pids, self.peaks, self.stopping = pids, {}, threading.Event()

    def run(self) -> None:
        while not self.stopping.wait(0.02):
            for pid in self.pids():
                try:
                    now = resident_mb(pid)
                except (OSError, KeyError):
                    continue
                peak = self.peaks.setdefault(pid, {k: 0.0 for k in now})
                for key, value in now.items():
                    peak[key] = max(peak[key], value)

    def stop(self) -> dict[int, dict[str, float]]:
        self.stopping.set()
        self.join()
        return self.peaks


def session(dsn: str, schema: str) -> psycopg.Connection:
    conn = psycopg.connect(dsn, autocommit=True)
    conn.execute(f"SET search_path = {SCHEMA}, {schema}")
    return conn


def generate(conn: psycopg.Connection, rows: int) -> None:
    conn.execute("SELECT setseed(0.25)")
    conn.execute("CREATE TABLE source AS SELECT i AS id, "
                 "(SELECT array_agg(random()::real) FROM generate_series(1, 64) WHERE i > 0) AS x, "
                 "(i %% 10) AS y FROM generate_series(1, %s) AS i", (min(rows, GENERATED),))
    for copy in range(1, -(-rows // GENERATED)):
        conn.execute("INSERT INTO source SELECT id + %s, x, y FROM source WHERE id <= %s",
                     (copy * GENERATED, min(GENERATED, rows - copy * GENERATED)))
    conn.execute("VACUUM ANALYZE source")


def pack(dsn: str, schema: str, rows: int, segments: int) -> dict:
    with session(dsn, schema) as conn:
        conn.execute("SET max_parallel_workers_per_gather = 0")
        conn.execute("CHECKPOINT")
        started = time.perf_counter()
        conn.execute("CREATE TABLE copied AS SELECT * FROM source")
        ctas = time.perf_counter() - started
        conn.execute("DROP TABLE copied")
    with session(dsn, schema) as conn:  # a new session: its peak is the packing's
        pid = conn.execute("SELECT pg_backend_pid()").fetchone()[0]
        conn.execute(f"SELECT {schema}.version()")  # the runtime loaded: memory before packing
        before = resident_mb(pid)["RssAnon"]
        conn.execute("CHECKPOINT")
        sampler = PeakSampler(lambda: [pid])
        sampler.start()
        started = time.perf_counter()
        conn.execute("SELECT training_preprocessor_dl('source', 'packed', 'y', 'x', 1024, "
                     f"distribution_rules => '{segments}')")
        seconds = time.perf_counter() - started
        after = sampler.stop()[pid]
        size = conn.execute("SELECT sum(pg_total_relation_size(relid)) FROM pg_partition_tree('packed')").fetchone()[0]
    return {"rows": rows, "seconds": seconds, "rows_per_second": rows / seconds, "packed_bytes": int(size),
            "ctas_seconds": ctas, "own_mb_before": before, "own_peak_mb": after["RssAnon"],
            "shared_peak_mb": after["RssShmem"],
            }


def train(dsn: str, schema: str, packed: str, out: str, memory_mb: int) -> dict:
    """The job on new worker sessions, their memory sampled while it runs."""
    with session(dsn, schema) as conn, psycopg.connect(dsn, autocommit=True) as watcher:
        end_idle_workers(conn)
        conn.execute(f"SET madlib_mop.worker_memory_mb = {memory_mb}")
        sampler = PeakSampler(lambda: [pid for pid, in watcher.execute(
            "SELECT pid FROM pg_stat_activity WHERE application_name LIKE 'madlib_mop worker job %'")])
        sampler.start()
        started = time.perf_counter()
        conn.execute("SELECT madlib_keras_fit_multiple_model(%s, %s, 'mst', 1)", (packed, out))
        seconds = time.perf_counter() - started
        peaks = sampler.stop()
        visits = conn.execute(f"SELECT result FROM {out}_mop_visits").fetchall()
        pids = sorted({v["pid"] for v, in visits})
        state = conn.execute(f"SELECT max(octet_length(state)) FROM {out}_mop_state").fetchone()[0]
        return {"seconds": seconds, "rows": sum(v["rows"] for v, in visits),
                "in_memory": all(v["in_memory"] for v, in visits),
                "own_peaks_mb": [peaks[pid]["RssAnon"] for pid in pids if pid in peaks],
                "shared_peaks_mb": [peaks[pid]["RssShmem"] for pid in pids if pid in peaks],
                "state_bytes": state}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=10_000_000)
    parser.add_argument("--segments", type=int, default=2)
    args = parser.parse_args()
    dsn = configured_dsn()
    with psycopg.connect(dsn, autocommit=True) as conn:
        schema = fresh_schema(conn)
        print(f"generating {args.rows:,} rows x 64 float4 features ...", flush=True)
        generate(conn, args.rows)
        source_bytes = conn.execute("SELECT pg_total_relation_size('source')").fetchone()[0]
        conn.execute("CREATE TABLE small AS SELECT * FROM source WHERE id <= 20000")
        conn.execute("SELECT training_preprocessor_dl('small', 'small_packed', 'y', 'x', 1024, "
                     f"distribution_rules => '{args.segments}')")
        conn.execute("SELECT load_keras_model('arch', %s::json)", (MLP,))
        conn.execute("SELECT load_model_selection_table('arch', 'mst', ARRAY[1], ARRAY[%s], "
                     "ARRAY['batch_size=256, epochs=1'])", (COMPILE,))
    print("packing ...", flush=True)
    packing = pack(dsn, schema, args.rows, args.segments)
    memory_mb = max(1, int(packing["packed_bytes"]) // 8 // 2**20)
    print(f"training on {args.rows:,} rows, worker_memory_mb = {memory_mb} ...", flush=True)
    runtime = train(dsn, schema, "small_packed", "small_out", 0)
    big = train(dsn, schema, "packed", "big_out", memory_mb)
    with psycopg.connect(dsn, autocommit=True) as conn:
        end_idle_workers(conn)
        conn.execute(f"DROP SCHEMA {SCHEMA} CASCADE")

    allowed = max(runtime["own_peaks_mb"]) + memory_mb
    print(f"\n### Packing {args.rows:,} rows x 64 features ({source_bytes / 2**30:.2f} GB) over "
          f"{args.segments} segments\n")
    print("| operation | seconds | rows/s | the session's own memory, peak | shared buffers touched |")
    print("|---|---:|---:|---:|---:|")
    print(f"| CREATE TABLE AS SELECT * FROM source | {packing['ctas_seconds']:.1f} | "
          f"{args.rows / packing['ctas_seconds']:,.0f} | | |")
    print(f"| training_preprocessor_dl | {packing['seconds']:.1f} | {packing['rows_per_second']:,.0f} | "
          f"{packing['own_peak_mb']:.0f} MB ({packing['own_mb_before']:.0f} MB before packing) | "
          f"{packing['shared_peak_mb']:.0f} MB |")
    print("\nThe packing holds at most madlib_mop.preprocessor_memory_mb of rows at once (default "
          "1024): it writes the buffers in waves of that size.")
    print(f"\n### Training on a packed table 8x worker_memory_mb ({packing['packed_bytes'] / 2**20:,.0f} MB; "
          f"worker_memory_mb = {memory_mb})\n")
    print("| job | rows trained | seconds | buffers kept decoded | each worker's own memory, peak | "
          "shared buffers touched | model state |")
    print("|---|---:|---:|---|---|---|---:|")
    for label, run in (("20,000 rows, worker_memory_mb = 0 (the runtime's own)", runtime),
                       (f"{args.rows:,} rows, worker_memory_mb = {memory_mb}", big)):
        print(f"| {label} | {run['rows']:,} | {run['seconds']:.1f} | {'all' if run['in_memory'] else 'not all'} | "
              f"{', '.join(f'{p:.0f} MB' for p in run['own_peaks_mb'])} | "
              f"{', '.join(f'{p:.0f} MB' for p in run['shared_peaks_mb'])} | {run['state_bytes'] / 1024:.0f} kB |")
    within = max(big["own_peaks_mb"]) <= allowed
    print(f"\nallowed per worker: its runtime's own memory ({max(runtime['own_peaks_mb']):.0f} MB) + "
          f"worker_memory_mb ({memory_mb} MB) = {allowed:.0f} MB: {'within' if within else 'EXCEEDED'} "
          "(shared buffers are the server's, counted once for all its processes)")
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "big_table.json").write_text(json.dumps({
        "when": datetime.now(timezone.utc).isoformat(), "rows": args.rows, "segments": args.segments,
        "source_bytes": source_bytes, "packing": packing, "worker_memory_mb": memory_mb,
        "runtime": runtime, "big": big, "allowed_mb": allowed}, indent=2))


if __name__ == "__main__":
    main()
