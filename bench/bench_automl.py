"""AutoML against grid search: how soon does each reach the grid's best validation accuracy?

Workload AUTOML (fixed seeds): W1's generated data (64 features, 10 classes, a noisy linear
map) at 60,000 rows (48,000 to train on over S segments, 12,000 held out); 3 MLPs (16;
128-64; 256-256), Adam, batch sizes 32, 128, 512; up to R = 27 iterations of one epoch;
validation every iteration.  The grid takes the learning rates 0.0003, 0.003 and 0.03 (27
configurations); the AutoML methods sample it log-uniformly from the same range.

Compared in one run, each in a new session (its workers import TensorFlow):
  (1) grid: madlib_keras_fit_multiple_model, all 27 configurations for 27 iterations;
  (2) MADlib-style Hyperband (R=27, eta=3): MADlib's diagonal rounds, one fit per round (the
      rounds of all brackets that can run together), promoted models warm-started from the
      previous fit and trained r_i more iterations, the best of a bracket by validation
      loss, as MADlib's madlib_keras_automl does;
  (3) madlib_keras_automl 'hyperband', 'R=27, eta=3': the same 46 configurations in one
      hopping job (a model trains to r_i iterations in all);
  (4) madlib_keras_automl 'hyperopt', 'num_configs=12, num_iterations=27, algorithm=tpe'.
The target is the grid's best final validation accuracy less 0.5 points; a method's time to
it is when its best validation accuracy so far first reaches it, counted from the call.

    .venv/bin/python bench/bench_automl.py [--segments 2] [--rows 60000]
Prints markdown tables; writes bench/results/automl.json and automl.png.
"""

from __future__ import annotations

import argparse
import json
import time
from datetime import datetime, timezone
from pathlib import Path

import psycopg

from bench_mop import SCHEMA, _configs, _session, load_workload
from madlib_mop.search import hyperband
from madlib_mop.tools.demo import ensure_extension
from madlib_mop.tools.embedded import configured_dsn

RESULTS = Path(__file__).resolve().parent / "results"
R, ETA = 27, 3
TPE_CONFIGS = 12
HIDDEN = [(16,), (128, 64), (256, 256)]
RATES = [0.0003, 0.003, 0.03]
BATCHES = [32, 128, 512]
# The AutoML methods' space: the grid's, with the learning rate log-uniform over its range.
COMPILE_GRID = ("{'loss': ['categorical_crossentropy'], 'metrics': ['accuracy'], "
                f"'optimizer_params_list': [{{'optimizer': ['Adam'], 'learning_rate': "
                f"[{RATES[0]}, {RATES[-1]}, 'log']}}]}}")
FIT_GRID = f"{{'batch_size': {BATCHES}, 'epochs': [1]}}"
NAME = "automl"


def _points(conn, out: str, offset: float) -> list[tuple[float, float, int]]:
    """(seconds since the method's call, validation accuracy, mst_key) of every computed
    iteration of every model of a finished job."""
    started = conn.execute("SELECT extract(epoch FROM started_at) FROM jobs WHERE model_output_table = %s "
                           "ORDER BY job_id DESC LIMIT 1", (f"{SCHEMA}.{out}",)).fetchone()[0]
    points = []
    for key, elapsed, accuracy in conn.execute(
            f"SELECT mst_key, metrics_elapsed_time, validation_metrics FROM {out}_info"):
        for t, a in zip(elapsed or [], accuracy or []):
            points.append((float(started) - offset + t, a, key))
    return points


def _work(conn, out: str) -> int:
    """Iterations trained (sub-epochs / segments)."""
    done, segments = conn.execute("SELECT subepochs_done, num_segments FROM jobs WHERE model_output_table = %s "
                                  "ORDER BY job_id DESC LIMIT 1", (f"{SCHEMA}.{out}",)).fetchone()
    return done // segments


def run_grid(dsn: str) -> dict:
    with _session(dsn) as conn:
        called = time.time()
        conn.execute(f"SELECT madlib_keras_fit_multiple_model('{NAME}_packed', 'grid_out', '{NAME}_mst', "
                     f"{R}, FALSE, '{NAME}_vpacked', 1)")
        makespan = time.time() - called
        return {"makespan": makespan, "points": _points(conn, "grid_out", called),
                "configs": 27, "iterations": _work(conn, "grid_out")}


def run_automl(dsn: str, out: str, method: str, params: str) -> dict:
    with _session(dsn) as conn:
        called = time.time()
        conn.execute(f"SELECT madlib_keras_automl('{NAME}_packed', '{out}', '{NAME}_arch', '{out}_mst', "
                     f"ARRAY[1, 2, 3], %s, %s, %s, %s, 0, NULL, FALSE, '{NAME}_vpacked', 1)",
                     (COMPILE_GRID, FIT_GRID, method, params))
        makespan = time.time() - called
        configs = conn.execute(f"SELECT count(*) FROM {out}_info").fetchone()[0]
        stopped = conn.execute(f"SELECT count(*) FROM {out}_info WHERE stopped_iteration IS NOT NULL").fetchone()[0]
        return {"makespan": makespan, "points": _points(conn, out, called), "configs": configs,
                "stopped": stopped, "iterations": _work(conn, out)}


def run_madlib_style(dsn: str, configs: list[tuple]) -> dict:
    """MADlib's Hyperband: diagonal i runs, in one fit, round i - (s_max - s) of every bracket
    s that has started, for R eta^(i - s_max) iterations; promoted models continue from their
    weights (warm start), the best of a bracket chosen by validation loss."""
    brackets = hyperband.bracket_rungs(R, ETA, 0)
    top = max(brackets)
    keys: dict[int, list[int]] = {}
    key = 0
    for s in sorted(brackets, reverse=True):
        keys[s] = list(range(key + 1, key + 1 + brackets[s][0].n_i))
        key += brackets[s][0].n_i
    losses: dict[int, float] = {}
    points, iterations = [], 0
    with _session(dsn) as conn:
        called = time.time()
        survivors: dict[int, list[int]] = {}
        for i in range(top + 1):
            chosen = []
            for s in range(top, top - i - 1, -1):
                round_ = i - (top - s)
                if round_ == 0:
                    survivors[s] = keys[s]
                else:
                    survivors[s] = sorted(survivors[s], key=lambda k: (losses[k], k))[:brackets[s][round_].n_i]
                chosen += survivors[s]
            table = f"madlib_style_mst_{i}"
            conn.execute(f"DROP TABLE IF EXISTS {table}, {table}_summary")
            conn.execute(f"CREATE TABLE {table} (mst_key integer PRIMARY KEY, model_id integer, "
                         "compile_params varchar, fit_params varchar)")
            conn.execute(f"CREATE TABLE {table}_summary (model_arch_table varchar, object_table varchar)")
            conn.execute(f"INSERT INTO {table}_summary VALUES ('{SCHEMA}.{NAME}_arch', NULL)")
            for k in sorted(chosen):
                conn.execute(f"INSERT INTO {table} VALUES (%s, %s, %s, %s)", configs[k - 1])
            rounds = round(R * ETA ** (i - top))
            conn.execute(f"SELECT madlib_keras_fit_multiple_model('{NAME}_packed', 'madlib_style_out', "
                         f"'{table}', {rounds}, FALSE, '{NAME}_vpacked', 1, {i > 0})")
            points += _points(conn, "madlib_style_out", called)
            iterations += _work(conn, "madlib_style_out")
            losses.update(dict(conn.execute("SELECT mst_key, validation_loss_final FROM madlib_style_out_info")))
        makespan = time.time() - called
    return {"makespan": makespan, "points": points, "configs": key, "iterations": iterations}


def best_curve(points: list) -> list[tuple[float, float]]:
    curve, best = [], float("-inf")
    for t, accuracy, _ in sorted(points):
        if accuracy is not None and accuracy > best:
            best = accuracy
            curve.append((t, best))
    return curve


def time_to(curve: list, target: float) -> float | None:
    return next((t for t, a in curve if a >= target), None)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--segments", type=int, default=2)
    parser.add_argument("--rows", type=int, default=60_000)
    parser.add_argument("--replot", action="store_true", help="redraw the plot of the last run")
    args = parser.parse_args()
    if args.replot:
        report = json.loads((RESULTS / "automl.json").read_text())
        return plot(report["results"], sorted(report["results"]), report["target"])
    dsn = configured_dsn()
    with psycopg.connect(dsn, autocommit=True) as conn:
        ensure_extension(conn)
        conn.execute(f"DROP SCHEMA IF EXISTS {SCHEMA} CASCADE")
        conn.execute(f"CREATE SCHEMA {SCHEMA}")
    workload = {"data": args.rows, "epochs": R, "iterations": R, "frequency": 1,
                "configs": _configs(HIDDEN, RATES, BATCHES)}
    with _session(dsn) as conn:
        load_workload(conn, NAME, workload)
        conn.execute(f"SELECT training_preprocessor_dl('{NAME}_train', '{NAME}_packed', 'y', 'x', "
                     f"distribution_rules => '{args.segments}')")
        conn.execute(f"SELECT validation_preprocessor_dl('{NAME}_valid', '{NAME}_vpacked', 'y', 'x', "
                     f"'{NAME}_packed')")
    results = {"(1) grid": run_grid(dsn)}
    results["(3) hyperband, one job"] = run_automl(dsn, "hb_out", "hyperband", f"R={R}, eta={ETA}")
    with _session(dsn) as conn:
        configs = conn.execute("SELECT mst_key, model_id, compile_params, fit_params FROM hb_out_mop_models "
                               "ORDER BY mst_key").fetchall()
    results["(2) hyperband, MADlib-style"] = run_madlib_style(dsn, configs)
    results["(4) hyperopt tpe"] = run_automl(dsn, "tpe_out", "hyperopt",
                                             f"num_configs={TPE_CONFIGS}, num_iterations={R}, algorithm=tpe")
    order = ["(1) grid", "(2) hyperband, MADlib-style", "(3) hyperband, one job", "(4) hyperopt tpe"]
    grid_best = max(a for _, a, _ in results["(1) grid"]["points"])
    target = grid_best - 0.005
    print(f"\n### AUTOML: {args.rows:,} rows, {args.segments} segments; target: the grid's best "
          f"validation accuracy {grid_best:.4f} less 0.5 points = {target:.4f}\n")
    print("| method | configurations | iterations trained | makespan (s) | best accuracy | "
          "time to target (s) | vs (1) |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    grid_time = time_to(best_curve(results["(1) grid"]["points"]), target)
    for name in order:
        r = results[name]
        curve = best_curve(r["points"])
        r["curve"], r["time_to_target"] = curve, time_to(curve, target)
        reached = r["time_to_target"]
        print(f"| {name} | {r['configs']} | {r['iterations']} | {r['makespan']:.1f} | {curve[-1][1]:.4f} | "
              + (f"{reached:.1f} | {reached / grid_time:.2f} |" if reached is not None else "not reached | |"))
    RESULTS.mkdir(exist_ok=True)
    report = {"when": datetime.now(timezone.utc).isoformat(), "rows": args.rows, "segments": args.segments,
              "target": target, "grid_best": grid_best,
              "results": {k: {kk: vv for kk, vv in v.items() if kk != "points"} for k, v in results.items()}}
    (RESULTS / "automl.json").write_text(json.dumps(report, indent=1))
    plot(results, order, target)


def plot(results: dict, order: list[str], target: float) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5))
    for name in order:
        curve = results[name]["curve"]
        times = [t for t, _ in curve] + [results[name]["makespan"]]
        accuracies = [a for _, a in curve] + [curve[-1][1]]
        ax.step(times, accuracies, where="post", label=name)
    ax.axhline(target, color="grey", linestyle="--", linewidth=1, label="target: grid's best - 0.5 points")
    ax.set_xlabel("seconds since the call")
    ax.set_ylabel("best validation accuracy so far")
    ax.set_title("AutoML against grid search (AUTOML workload)")
    # Where the methods differ: around the target (the first, low points are cut off).
    best = max(a for name in order for _, a in results[name]["curve"])
    ax.set_ylim(target - 0.08, min(1.0, best + 0.01))
    ax.legend(loc="lower right")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(RESULTS / "automl.png", dpi=120)
    print(f"\nplot: {RESULTS / 'automl.png'}")


if __name__ == "__main__":
    main()
