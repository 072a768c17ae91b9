"""Prediction speed: madlib_keras_predict_byom in the database against model.predict on an
in-memory NumPy array in one process, the same model and rows, measured in this run.

Target: the database (reading the rows, predicting on the workers, writing one row per
prediction) reaches at least 0.5x the speed of model.predict alone.

    .venv/bin/python bench/bench_predict.py [--rows 1000000] [--features 64] [--repeat 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import psycopg

from madlib_mop.tools.demo import ensure_extension
from madlib_mop.tools.embedded import configured_dsn

SCHEMA = "madlib_mop_bench"
RESULTS = Path(__file__).resolve().parent / "results"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--features", type=int, default=64)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import keras

    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((args.features,)), keras.layers.Dense(32, activation="relu"),
                              keras.layers.Dense(10, activation="softmax")])
    weights = np.concatenate([w.ravel() for w in model.get_weights()]).astype(np.float32)

    with psycopg.connect(configured_dsn(), autocommit=True) as conn:
        schema = ensure_extension(conn)
        conn.execute(f"DROP SCHEMA IF EXISTS {SCHEMA} CASCADE")
        conn.execute(f"CREATE SCHEMA {SCHEMA}")
        conn.execute(f"SET search_path = {SCHEMA}, {schema}")
        conn.execute("SET jit = off")  # this session loads TensorFlow (load_keras_model)
        print(f"generating {args.rows:,} rows x {args.features} float features ...", flush=True)
        conn.execute("SET max_parallel_workers_per_gather = 0")
        conn.execute("SELECT setseed(0.5)")
        conn.execute(
            "CREATE TABLE source AS SELECT i AS id, "
            f"(SELECT array_agg(random()::real) FROM generate_series(1, {args.features}) WHERE i > 0) AS x "
            "FROM generate_series(1, %s) AS i", (args.rows,))
        conn.execute("VACUUM ANALYZE source")
        conn.execute("SELECT load_keras_model('arch', %s::json, %s)", (model.to_json(), weights.tobytes()))
        # What an analyst would otherwise do after exporting: the rows as one NumPy array.
        x = np.empty((args.rows, args.features), dtype=np.float32)
        ids = np.empty(args.rows, dtype=np.int64)
        with conn.cursor().copy("COPY source (id, x) TO STDOUT") as copy:
            copy.set_types(["integer", "real[]"])
            for i, (identifier, values) in enumerate(copy.rows()):
                ids[i], x[i] = identifier, values

        def in_database() -> float:
            conn.execute("DROP TABLE IF EXISTS predictions")
            conn.execute("CHECKPOINT")
            started = time.perf_counter()
            conn.execute("SELECT madlib_keras_predict_byom('arch', 1, 'source', 'id', 'x', 'predictions', "
                         "'response')")
            return time.perf_counter() - started

        # The first call starts the worker sessions (TensorFlow's import, the model's build);
        # later calls of the same session reuse them.
        cold = in_database()
        model.predict(x[:4096], verbose=0)  # the same warm-up for Keras in this process
        in_db, in_memory = [], []
        for _ in range(args.repeat):
            time.sleep(1)  # let the server's background writers settle
            started = time.perf_counter()
            model.predict(x, batch_size=4096, verbose=0)
            in_memory.append(time.perf_counter() - started)
            in_db.append(in_database())
        written = conn.execute("SELECT count(*) FROM predictions").fetchone()[0]
        conn.execute(f"DROP SCHEMA {SCHEMA} CASCADE")

    memory_s, db_s = statistics.median(in_memory), statistics.median(in_db)
    ratio = memory_s / db_s
    print(f"\n{args.rows:,} rows x {args.features} features, MLP {args.features}-32-10, "
          f"pred_type 'response' ({written:,} rows written); median of {args.repeat} runs; "
          f"{os.cpu_count()} cores\n")
    print("| prediction | seconds | rows/s | speed relative to model.predict |")
    print("|---|---:|---:|---:|")
    print(f"| model.predict on an in-memory NumPy array (one process) | {memory_s:.2f} | "
          f"{args.rows / memory_s:,.0f} | 1.00 |")
    print(f"| madlib_keras_predict_byom (read, predict on workers, write) | {db_s:.2f} | "
          f"{args.rows / db_s:,.0f} | {ratio:.2f} |")
    print(f"| the same, first call of the session (starts the workers) | {cold:.2f} | "
          f"{args.rows / cold:,.0f} | {memory_s / cold:.2f} |")
    print(f"\ntarget: at least 0.50: {'met' if ratio >= 0.5 else 'MISSED'}")
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "predict.json").write_text(json.dumps({
        "benchmark": "predict", "when": datetime.now(timezone.utc).isoformat(), "rows": args.rows,
        "features": args.features, "in_memory_seconds": in_memory, "in_database_seconds": in_db,
        "in_database_first_call_seconds": cold,
        "ratio": ratio}, indent=2))


if __name__ == "__main__":
    main()
