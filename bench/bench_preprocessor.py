"""Packing speed: training_preprocessor_dl against CREATE TABLE AS on the same server.

Target: packing N rows x 64 float features takes at most 3x the time of
`CREATE TABLE t2 AS SELECT * FROM source`, measured side by side in this run.

    .venv/bin/python bench/bench_preprocessor.py [--rows 1000000] [--features 64] [--repeat 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from datetime import datetime, timezone
from pathlib import Path

import psycopg

from madlib_mop.tools.demo import ensure_extension
from madlib_mop.tools.embedded import configured_dsn

SCHEMA = "madlib_mop_bench"
RESULTS = Path(__file__).resolve().parent / "results"


def timed(conn: psycopg.Connection, statement: str) -> float:
    conn.execute("CHECKPOINT")
    started = time.perf_counter()
    conn.execute(statement)
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--features", type=int, default=64)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--segments", type=int, default=2)
    args = parser.parse_args()

    with psycopg.connect(configured_dsn(), autocommit=True) as conn:
        schema = ensure_extension(conn)
        conn.execute(f"DROP SCHEMA IF EXISTS {SCHEMA} CASCADE")
        conn.execute(f"CREATE SCHEMA {SCHEMA}")
        conn.execute(f"SET search_path = {SCHEMA}, {schema}")
        conn.execute("SET max_parallel_workers_per_gather = 0")  # one backend, like the packer
        print(f"generating {args.rows:,} rows x {args.features} float features ...", flush=True)
        conn.execute("SELECT setseed(0.25)")
        conn.execute(
            "CREATE TABLE source AS SELECT i AS id, "
            f"(SELECT array_agg(random()) FROM generate_series(1, {args.features}) WHERE i > 0) AS x, "
            "(i %% 10) AS y FROM generate_series(1, %s) AS i", (args.rows,))
        conn.execute("VACUUM ANALYZE source")
        size = conn.execute("SELECT pg_size_pretty(pg_total_relation_size('source'))").fetchone()[0]

        ctas, pack = [], []
        for _ in range(args.repeat):
            conn.execute("DROP TABLE IF EXISTS t2")
            ctas.append(timed(conn, "CREATE TABLE t2 AS SELECT * FROM source"))
            conn.execute("DROP TABLE IF EXISTS packed, packed_summary")
            pack.append(timed(conn, "SELECT training_preprocessor_dl('source', 'packed', 'y', 'x', "
                                    f"distribution_rules => '{args.segments}')"))
        buffers = conn.execute("SELECT count(*) FROM packed").fetchone()[0]
        conn.execute(f"DROP SCHEMA {SCHEMA} CASCADE")

    ctas_s, pack_s = statistics.median(ctas), statistics.median(pack)
    ratio = pack_s / ctas_s
    print(f"\nsource: {args.rows:,} rows x {args.features} float8 features ({size}); "
          f"packed into {buffers} buffers on {args.segments} segments; median of {args.repeat} runs\n")
    print("| operation | seconds | rows/s | ratio to CREATE TABLE AS |")
    print("|---|---:|---:|---:|")
    print(f"| CREATE TABLE t2 AS SELECT * FROM source | {ctas_s:.2f} | {args.rows / ctas_s:,.0f} | 1.00 |")
    print(f"| training_preprocessor_dl | {pack_s:.2f} | {args.rows / pack_s:,.0f} | {ratio:.2f} |")
    print(f"\ntarget: ratio <= 3.00: {'met' if ratio <= 3 else 'MISSED'}")
    RESULTS.mkdir(exist_ok=True)
    result = {"benchmark": "preprocessor", "when": datetime.now(timezone.utc).isoformat(),
              "rows": args.rows, "features": args.features, "segments": args.segments,
              "ctas_seconds": ctas, "pack_seconds": pack, "ratio": ratio}
    (RESULTS / "preprocessor.json").write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
