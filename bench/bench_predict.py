"""Prediction speed: madlib_keras_predict_byom in the database against model.predict on an
in-memory NumPy array in one process, the same model and rows, measured in this run.

Target: the database (reading the rows, predicting on the workers, writing one row per
prediction) reaches at least 0.5x the speed of model.predict alone.

Then several models of one fit (`--models`, MLPs of that architecture at as many Adam
learning rates, trained one iteration on 20,000 of the rows) predict over `--multiple-rows`
of the rows: one madlib_keras_predict per model, against one
madlib_keras_predict_multiple_model with madlib_mop.fuse_models off and on (each the
median of `--repeat` calls after a first one, which traces the session's programs).

    .venv/bin/python bench/bench_predict.py [--rows 1000000] [--features 64] [--repeat 3]
        [--models 16] [--multiple-rows 200000]
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
    parser.add_argument("--models", type=int, default=16)
    parser.add_argument("--multiple-rows", type=int, default=200_000)
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
        several = multiple_models(conn, args)
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
    print(f"\n{args.models} models of one fit (MLP {args.features}-32-10, Adam at {args.models} learning "
          f"rates) over {args.multiple_rows:,} rows, pred_type 'response'; median of {args.repeat} calls "
          "after a first\n")
    print("| prediction | seconds (first call) | ratio to one call per model |")
    print("|---|---:|---:|")
    alone = several["one call per model"]
    for name, (first, seconds) in several.items():
        print(f"| {name} | {seconds:.2f} ({first:.2f}) | {seconds / alone[1]:.2f} |")
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "predict.json").write_text(json.dumps({
        "benchmark": "predict", "when": datetime.now(timezone.utc).isoformat(), "rows": args.rows,
        "features": args.features, "in_memory_seconds": in_memory, "in_database_seconds": in_db,
        "in_database_first_call_seconds": cold,
        "ratio": ratio, "several_models": several}, indent=2))


def multiple_models(conn, args) -> dict[str, tuple[float, float]]:
    """(first call, median of the next) seconds of predicting with `args.models` models of
    one fit: a madlib_keras_predict per model, then madlib_keras_predict_multiple_model
    with madlib_mop.fuse_models off and on; the predictions checked alike."""
    conn.execute("CREATE TABLE train AS SELECT x, id % 10 AS y FROM source WHERE id <= 20000")
    conn.execute("CREATE TABLE several AS SELECT * FROM source WHERE id <= %s", (args.multiple_rows,))
    conn.execute("VACUUM ANALYZE several")
    conn.execute("SELECT training_preprocessor_dl('train', 'train_packed', 'y', 'x', distribution_rules => '2')")
    rates = [0.0005 * 1.5 ** k for k in range(args.models)]
    conn.execute("SELECT load_model_selection_table('arch', 'configs', ARRAY[1], %s, ARRAY['batch_size=64, epochs=1'])",
                 ([f"loss='categorical_crossentropy', optimizer='Adam(learning_rate={r:.6f})', "
                   "metrics=['accuracy']" for r in rates],))
    conn.execute("SELECT madlib_keras_fit_multiple_model('train_packed', 'fitted', 'configs', 1)")
    keys = [k for (k,) in conn.execute("SELECT mst_key FROM fitted ORDER BY 1")]

    def timed(statements) -> float:
        conn.execute("CHECKPOINT")
        started = time.perf_counter()
        for statement in statements:
            conn.execute(statement)
        return time.perf_counter() - started

    def one_per_model() -> list[str]:
        conn.execute("DROP TABLE IF EXISTS " + ", ".join(f"alone_{k}" for k in keys))
        return [f"SELECT madlib_keras_predict('fitted', 'several', 'id', 'x', 'alone_{k}', 'response', "
                f"mst_key => {k})" for k in keys]

    def multiple(setting: str) -> list[str]:
        conn.execute(f"SET madlib_mop.fuse_models = {setting}")
        conn.execute(f"DROP TABLE IF EXISTS multiple_{setting}")
        return [f"SELECT madlib_keras_predict_multiple_model('fitted', 'several', 'id', 'x', "
                f"'multiple_{setting}', 'response')"]

    results = {}
    for name, statements in (("one call per model", one_per_model),
                             ("madlib_keras_predict_multiple_model, fuse_models = off", lambda: multiple("off")),
                             ("madlib_keras_predict_multiple_model, fuse_models = on", lambda: multiple("on"))):
        first = timed(statements())
        results[name] = (first, statistics.median(timed(statements()) for _ in range(args.repeat)))
        print(f"{name}: {results[name][1]:.2f} s (first call {first:.2f} s)", flush=True)
    conn.execute("RESET madlib_mop.fuse_models")
    differing = conn.execute(
        "SELECT count(*) FROM multiple_on m JOIN multiple_off o USING (mst_key, id) "
        "WHERE m.class_value IS DISTINCT FROM o.class_value").fetchone()[0]
    unlike_alone = sum(conn.execute(
        f"SELECT count(*) FROM alone_{k} a JOIN multiple_off o ON o.mst_key = {k} AND o.id = a.id "
        "WHERE a.class_value IS DISTINCT FROM o.class_value OR a.prob IS DISTINCT FROM o.prob").fetchone()[0]
        for k in keys)
    print(f"classes that differ, fused against unfused: {differing} of {len(keys) * args.multiple_rows:,}; "
          f"multiple (off) against one call per model: {unlike_alone} rows differ")
    return results


if __name__ == "__main__":
    main()
