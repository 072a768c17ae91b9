"""Model selection in cycles over growing data, against every cycle run from nothing.

Transfer learning from one base network, as in `bench_transfer.py`: a CNN trained in the
database on CIFAR-10-shaped images (`demo.cifar_shaped_images`: nothing is downloaded),
its frozen first layers cut at 2 layers with 3 heads each, at 2 learning rates: 12
configurations for a new task.  The labelled set grows by `--growth` (20%) per cycle,
its validation set with it, for `--cycles` (5) cycles.  In the same run:

- from nothing: each cycle packs the whole grown table (training_preprocessor_dl and
  validation_preprocessor_dl), and trains all 12 configurations from their initial
  weights (the frozen layers' features computed in the job, as madlib_mop stages them);
- cycles: the tables are packed once in key order; each cycle appends the new rows
  (preprocessor_dl_append), then `CALL run_cycle` trains the last cycle's `--top-k` best
  models from their weights, with `--new` new configurations per cycle (the first
  cycle: all 12).

Per cycle: the rows, the packing's seconds, the training job's, the worker-seconds of the
job's visits computing the frozen layers' features and moving states in and out of the
models, the total, and the best validation accuracy; then the cycles' totals and their
ratio.

    .venv/bin/python bench/bench_cycles.py [--rows 8000] [--cycles 5] [--growth 0.2] [--iterations 2] [--top-k 3] [--new 1]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_transfer import PARTS, base_cnn, heads, load_images  # noqa: E402  (the same base and heads)

from madlib_mop.tools.demo import ensure_extension  # noqa: E402
from madlib_mop.tools.embedded import configured_dsn  # noqa: E402

SCHEMA = "madlib_mop_bench_cycles"
RESULTS = Path(__file__).resolve().parent / "results" / "cycles.json"
CUTS = ("pool_2", "dense_1")
HEADS = ("linear", "mlp_32", "mlp_64_dropout")
RATES = (0.001, 0.003)
NEW_RATES = (0.0005, 0.002, 0.005, 0.0002)  # the new configurations of cycles 2, 3, ...
SEED = 7


def _compile(rate: float) -> str:
    return f"loss='categorical_crossentropy', optimizer='Adam(learning_rate={rate})', metrics=['accuracy']"


def _parts(conn, out: str) -> dict[str, float]:
    """Worker-seconds the job's visits spent computing the frozen layers' features (features)
    and moving states in and out of the models (state), as bench_transfer counts them."""
    visits = [json.loads(r[0]) if isinstance(r[0], str) else r[0]
              for r in conn.execute(f"SELECT result FROM {out}_mop_visits")]
    return {name: sum(float(v["seconds"].get(k, 0.0)) for v in visits for k in PARTS[part])
            for name, part in (("features", "features"), ("state", "state in and out"))}


def _best(conn, out: str) -> float:
    return float(conn.execute(f"SELECT max(validation_metrics_final) FROM {out}_info").fetchone()[0])


def _from_nothing(conn, cycle: int, size: int, args, configurations: int, rows: dict) -> None:
    """The whole grown table packed, every configuration trained from its start."""
    for table in ("scratch", "scratch_valid"):
        conn.execute(f"DROP TABLE IF EXISTS {table}, {table}_summary")
    started = time.perf_counter()
    conn.execute("SELECT training_preprocessor_dl('task_so_far', 'scratch', 'label', 'rgb', "
                 "buffer_size => 250, distribution_rules => '2')")
    conn.execute("SELECT validation_preprocessor_dl('valid_so_far', 'scratch_valid', 'label', 'rgb', 'scratch')")
    pack = time.perf_counter() - started
    out = f"nothing_{cycle}"
    started = time.perf_counter()
    conn.execute("SELECT madlib_keras_fit_multiple_model('scratch', %s, 'grid_mst', %s, FALSE, "
                 "'scratch_valid', NULL, FALSE, NULL, NULL, TRUE, %s)", (out, args.iterations, SEED))
    train = time.perf_counter() - started
    rows["nothing"].append({"rows": size, "pack": pack, "train": train, **_parts(conn, out),
                            "best": _best(conn, out), "configurations": configurations})


def _in_cycles(conn, cycle: int, size: int, args, configurations: int, rows: dict) -> None:
    """The new rows appended (the first cycle: packed in key order), then run_cycle (whose
    own append finds none)."""
    started = time.perf_counter()
    if cycle == 1:
        conn.execute("SELECT training_preprocessor_dl('task_so_far', 'growing', 'label', 'rgb', "
                     "buffer_size => 250, distribution_rules => '2', key_column => 'id')")
        conn.execute("SELECT validation_preprocessor_dl('valid_so_far', 'growing_valid', 'label', 'rgb', "
                     "'growing', key_column => 'id')")
    else:
        conn.execute("SELECT preprocessor_dl_append('growing', 'task_so_far')")
        conn.execute("SELECT preprocessor_dl_append('growing_valid', 'valid_so_far')")
    pack = time.perf_counter() - started
    started = time.perf_counter()
    conn.execute("CALL run_cycle('bench_cycles', 'growing', 'task_so_far', %s, %s, 'growing_valid', "
                 "'valid_so_far', %s, NULL, %s)",
                 ("grid_mst" if cycle == 1 else (f"new_mst_{cycle}" if args.new else None),
                  args.iterations if cycle == 1 else args.cycle_iterations, args.top_k, SEED))
    train = time.perf_counter() - started
    out = f"bench_cycles_c{cycle}"
    rows["cycles"].append({"rows": size, "pack": pack, "train": train, **_parts(conn, out),
                           "best": _best(conn, out),
                           "configurations": conn.execute(f"SELECT count(*) FROM {out}_mst").fetchone()[0]})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    # 8,000 rows (16,589 by the fifth cycle): with fewer, each job's fixed start and end
    # are most of a later cycle, and the ratio says more about them than about cycles
    # (docs/benchmarks.md has runs from 2,000 rows on).
    parser.add_argument("--rows", type=int, default=8000, help="training rows of the first cycle")
    parser.add_argument("--cycles", type=int, default=5)
    parser.add_argument("--growth", type=float, default=0.2)
    parser.add_argument("--iterations", type=int, default=2)
    parser.add_argument("--cycle-iterations", type=int, default=None,
                        help="the cycles' iterations after the first (default: --iterations): models "
                             "carried over continue from their weights and may need fewer")
    parser.add_argument("--base-iterations", type=int, default=3)
    parser.add_argument("--top-k", type=int, default=3)
    parser.add_argument("--new", type=int, default=1, help="new configurations per cycle after the first")
    parser.add_argument("--batch-size", type=int, default=32)
    args = parser.parse_args()
    if args.cycle_iterations is None:
        args.cycle_iterations = args.iterations
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    sizes = [round(args.rows * (1 + args.growth) ** k) for k in range(args.cycles)]

    with psycopg.connect(configured_dsn(), autocommit=True) as conn:
        schema = ensure_extension(conn)
        conn.execute(f"DROP SCHEMA IF EXISTS {SCHEMA} CASCADE")
        conn.execute(f"DELETE FROM {schema}.cycles WHERE cycle_name LIKE 'bench_%'")
        conn.execute(f"CREATE SCHEMA {SCHEMA}")
        conn.execute(f"SET search_path = {SCHEMA}, {schema}")
        # The base network, trained in the database on the first task.
        load_images(conn, "base_train", args.rows, 1, 0)
        conn.execute("SELECT training_preprocessor_dl('base_train', 'base_packed', 'label', 'rgb', "
                     "buffer_size => 250, distribution_rules => '2')")
        conn.execute("SELECT load_keras_model('base_arch', %s::json, NULL, 'base_cnn')", (base_cnn().to_json(),))
        conn.execute("SELECT madlib_keras_fit('base_packed', 'base_model', 'base_arch', 1, %s, "
                     "$$batch_size=32, epochs=1$$, %s)", (_compile(0.001), args.base_iterations))
        # The new task's rows in the order they arrive; a cycle sees those below its size.
        load_images(conn, "task_all", sizes[-1], 2, 1)
        load_images(conn, "valid_all", sizes[-1] // 4, 3, 1)
        for table in ("task", "valid"):
            conn.execute(f"CREATE VIEW {table}_so_far AS SELECT * FROM {table}_all "
                         f"WHERE id < current_setting('bench.rows')::int{' / 4' if table == 'valid' else ''}")
        for cut in CUTS:
            for name in HEADS:
                conn.execute("SELECT load_transfer_model('transfer_arch', 'base_model', NULL, %s, %s, %s, "
                             "seed => %s)", (cut, json.dumps(heads(cut.startswith("pool_"))[name]),
                                             f"{cut}+{name}", SEED))
        ids = [r[0] for r in conn.execute("SELECT model_id FROM transfer_arch ORDER BY model_id")]
        conn.execute("SELECT load_model_selection_table('transfer_arch', 'grid_mst', %s, %s, %s)",
                     (ids, [_compile(r) for r in RATES], [f"batch_size={args.batch_size}"]))
        # New configurations of cycles 2, 3, ...: the mlp_32 heads at a learning rate not tried.
        mlp = [r[0] for r in conn.execute("SELECT model_id FROM transfer_arch WHERE name LIKE '%%+mlp_32' "
                                          "ORDER BY model_id")]
        for cycle in range(2, args.cycles + 1):
            conn.execute("SELECT load_model_selection_table('transfer_arch', %s, %s, %s, %s)",
                         (f"new_mst_{cycle}", mlp[:args.new] if args.new else mlp[:1],
                          [_compile(NEW_RATES[(cycle - 2) % len(NEW_RATES)])], [f"batch_size={args.batch_size}"]))
        # Warm worker sessions for both arms alike (TensorFlow imported).
        conn.execute(f"SET bench.rows = {sizes[0]}")
        conn.execute("SELECT training_preprocessor_dl('task_so_far', 'warm_packed', 'label', 'rgb', "
                     "buffer_size => 250, distribution_rules => '2')")
        conn.execute("SELECT validation_preprocessor_dl('valid_so_far', 'warm_valid', 'label', 'rgb', "
                     "'warm_packed')")
        # With validation: a worker session measures each frozen prefix's inference cost once.
        conn.execute("SELECT madlib_keras_fit_multiple_model('warm_packed', 'warm_up', 'grid_mst', 1, FALSE, "
                     "'warm_valid')")

        rows = {"nothing": [], "cycles": []}
        configurations = len(ids) * len(RATES)
        for cycle, size in enumerate(sizes, start=1):
            conn.execute(f"SET bench.rows = {size}")
            # Each arm goes first in every other cycle (a first job may pay more).
            arms = (_from_nothing, _in_cycles) if cycle % 2 else (_in_cycles, _from_nothing)
            for arm in arms:
                arm(conn, cycle, size, args, configurations, rows)
            print(f"cycle {cycle}: {size} rows; from nothing {sum(rows['nothing'][-1][k] for k in ('pack', 'train')):.1f} s, "
                  f"cycles {sum(rows['cycles'][-1][k] for k in ('pack', 'train')):.1f} s", flush=True)
        conn.execute(f"DELETE FROM {schema}.cycles WHERE cycle_name LIKE 'bench_%'")
        conn.execute(f"DROP SCHEMA {SCHEMA} CASCADE")

    print(f"\n{args.cycles} cycles, training rows {sizes[0]:,} growing by {args.growth:.0%} per cycle to "
          f"{sizes[-1]:,} (validation: a quarter as many), CIFAR-10-shaped images, 2 segments; "
          f"{len(CUTS)} cuts x {len(HEADS)} heads x {len(RATES)} learning rates = {len(ids) * len(RATES)} "
          f"configurations, {args.iterations} iterations per cycle (the cycles after the first: "
          f"{args.cycle_iterations}); cycles carry the top {args.top_k} over "
          f"with {args.new} new configuration(s) per cycle\n")
    print("| cycle | rows | arm | configurations | pack (s) | training (s) | features (worker-s) "
          "| states in and out (worker-s) | total (s) | best val. accuracy |")
    print("|---|---:|---|---:|---:|---:|---:|---:|---:|---:|")
    for k in range(args.cycles):
        for arm, label in (("nothing", "from nothing"), ("cycles", "cycles")):
            r = rows[arm][k]
            print(f"| {k + 1} | {r['rows']:,} | {label} | {r['configurations']} | {r['pack']:.1f} | {r['train']:.1f} "
                  f"| {r['features']:.1f} | {r['state']:.1f} | {r['pack'] + r['train']:.1f} | {r['best']:.3f} |")
    totals = {arm: sum(r["pack"] + r["train"] for r in rows[arm]) for arm in rows}
    worst = max(rows["nothing"][k]["best"] - rows["cycles"][k]["best"] for k in range(args.cycles))
    print(f"\n{args.cycles} cycles: from nothing {totals['nothing']:.1f} s, cycles {totals['cycles']:.1f} s: "
          f"{totals['nothing'] / totals['cycles']:.2f}x; the cycles' best validation accuracy at most "
          f"{100 * worst:.1f} points below from nothing's, per cycle")
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(json.dumps({"arguments": vars(args), "sizes": sizes, "rows": rows, "totals": totals},
                                  indent=2))


if __name__ == "__main__":
    main()
