"""use_caching: madlib_keras_fit_multiple_model with use_caching => TRUE (our default: each
worker decodes its segment's buffers once and keeps them) against FALSE (MADlib's default:
the buffers are read from the table for every sub-epoch), the same job side by side in one
run.  The models come out bitwise identical (the same minibatches either way); the table
shows the time and what the cache costs in memory.

    .venv/bin/python bench/bench_caching.py [--rows 20000] [--features 256] [--configs 4] [--iterations 3]
"""

from __future__ import annotations

import argparse
import os
import time

import psycopg

from madlib_mop.tools.demo import ensure_extension
from madlib_mop.tools.embedded import configured_dsn

SCHEMA = "madlib_mop_bench_caching"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=20_000)
    parser.add_argument("--features", type=int, default=256)
    parser.add_argument("--configs", type=int, default=4)
    parser.add_argument("--iterations", type=int, default=3)
    args = parser.parse_args()
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import keras

    model = keras.Sequential([keras.Input((args.features,)), keras.layers.Dense(32, activation="relu"),
                              keras.layers.Dense(10, activation="softmax")])
    rates = ", ".join(str(0.001 * (i + 1)) for i in range(args.configs))
    with psycopg.connect(configured_dsn(), autocommit=True) as conn:
        schema = ensure_extension(conn)
        conn.execute(f"DROP SCHEMA IF EXISTS {SCHEMA} CASCADE")
        conn.execute(f"CREATE SCHEMA {SCHEMA}")
        conn.execute(f"SET search_path = {SCHEMA}, {schema}")
        conn.execute("SELECT setseed(0.5)")
        conn.execute(
            "CREATE TABLE source AS SELECT i AS id, (i %% 10) AS y, "
            f"(SELECT array_agg(random()::real) FROM generate_series(1, {args.features}) WHERE i > 0) AS x "
            "FROM generate_series(1, %s) AS i", (args.rows,))
        conn.execute("SELECT training_preprocessor_dl('source', 'packed', 'y', 'x')")
        conn.execute("SELECT load_keras_model('arch', %s::json)", (model.to_json(),))
        conn.execute("SELECT generate_model_configs('arch', 'mst', ARRAY[1], %s, %s)", (
            "{'loss': ['categorical_crossentropy'], 'optimizer_params_list': "
            f"[{{'optimizer': ['Adam'], 'lr': [{rates}]}}], 'metrics': ['accuracy']}}",
            "{'batch_size': [64], 'epochs': [1]}"))
        megabytes = conn.execute("SELECT sum(octet_length(x)) / 1048576.0 FROM packed").fetchone()[0]
        segments = conn.execute("SELECT num_segments FROM packed_summary").fetchone()[0]
        seconds, weights = {}, {}
        for run, caching in enumerate((True, False, True, False)):  # alternated: neither runs only warm
            out = f"models_{'cached' if caching else 'read'}_{run}"
            started = time.perf_counter()
            conn.execute("SELECT madlib_keras_fit_multiple_model('packed', %s, 'mst', %s, "
                         "use_caching => %s)", (out, args.iterations, caching))
            seconds.setdefault(caching, []).append(time.perf_counter() - started)
            weights[caching] = [bytes(r[0]) for r in conn.execute(
                f"SELECT model_weights FROM {out} ORDER BY mst_key")]
        conn.execute(f"DROP SCHEMA {SCHEMA} CASCADE")
    cached, read = min(seconds[True]), min(seconds[False])
    print(f"\n{args.rows:,} rows x {args.features} features ({float(megabytes):.1f} MiB packed), "
          f"{segments} segments, {args.configs} models, {args.iterations} iterations "
          "(best of 2 each)\n")
    print("| use_caching | seconds | models/s·iteration | buffers held per worker |")
    print("|---|---|---|---|")
    print(f"| TRUE (default) | {cached:.1f} | {args.configs * args.iterations / cached:.2f} | "
          f"its segment's, {float(megabytes) / segments:.1f} MiB |")
    print(f"| FALSE (MADlib's default) | {read:.1f} | {args.configs * args.iterations / read:.2f} | none |")
    print(f"\nFALSE / TRUE time: {read / cached:.2f}x; same weights: "
          f"{weights[True] == weights[False]}")


if __name__ == "__main__":
    main()
