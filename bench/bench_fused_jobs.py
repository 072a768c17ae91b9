"""Fused groups in jobs: the same model selection with madlib_mop.fuse_models off, auto and
on, side by side in one session of one run.

Workload W5s: W1's data (64 generated features, 10 classes, 200,000 training rows on 2
segments) and 16 configurations of one MLP (64 hidden units) at batch 64, 4 learning
rates x 4 values of Adam's beta_1, 5 epochs: one fusion class, whose models the rotation
sends 8 to a path per epoch.  And W1 itself (8 configurations, 4 classes of 2 models).
Each job runs twice in a row in one session: the first pays the tracing of the session's
new programs (unfused and fused), the second finds them ready.  Printed: seconds of each
run, the fused visits, and the ratio to `off`; weights of fused jobs agree with `off`'s
within float rounding, compounded over thousands of steps: printed, the largest distance of
a model's weights from `off`'s, relative to their norm.  Then the `off` job's models are
evaluated over the training rows by madlib_keras_evaluate_multiple_model, off, on and auto,
twice in a row in a session of each setting (the first run traces the session's programs).
With --validation the jobs also evaluate the held-out fifth of the rows after each
iteration (a fused call's models as one call): printed, the worker-seconds of those passes.

    .venv/bin/python bench/bench_fused_jobs.py [--workloads W5s,W1] [--validation]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_mop import SCHEMA, WORKLOADS, _session, end_idle_workers, fresh_schema, load_workload  # noqa: E402

from madlib_mop.tools.embedded import configured_dsn  # noqa: E402

BETAS = (0.9, 0.8, 0.95, 0.85)
W5S = {"data": 250_000, "epochs": 5, "iterations": 1, "frequency": 1,
       "configs": [{"hidden": [64], "lr": lr, "batch": 64} for lr in (0.001, 0.003, 0.01, 0.03)
                   for _ in BETAS]}


def _w5s_betas(conn, name: str) -> None:
    """W5s's configurations differ in beta_1 too (bench_mop's loader writes Adam(lr) only)."""
    keys = [k for (k,) in conn.execute(f"SELECT mst_key FROM {name}_mst ORDER BY mst_key")]
    for index, key in enumerate(keys):
        conn.execute(f"UPDATE {name}_mst SET compile_params = replace(compile_params, ')', %s) "
                     "WHERE mst_key = %s", (f", beta_1={BETAS[index % len(BETAS)]})", key))


def _twice(conn, statement) -> list[float]:
    """Seconds of `statement(attempt)` run for attempts 1 and 2, one after the other."""
    seconds = []
    for attempt in (1, 2):
        started = time.perf_counter()
        conn.execute(statement(attempt))
        seconds.append(time.perf_counter() - started)
    return seconds


def run(dsn: str, name: str, workload: dict, validation: bool) -> list[dict]:
    rows = []
    with _session(dsn) as conn:
        conn.execute(f"SELECT training_preprocessor_dl('{name}_train', '{name}_packed', 'y', 'x', "
                     "distribution_rules => '2')")
        if validation:
            conn.execute(f"SELECT validation_preprocessor_dl('{name}_valid', '{name}_vpacked', 'y', 'x', "
                         f"'{name}_packed')")
        valid = f"'{name}_vpacked', 1" if validation else "NULL, NULL"
        end_idle_workers(conn)
        reference = None
        for setting in ("off", "auto", "on"):
            conn.execute(f"SET madlib_mop.fuse_models = {setting}")
            out = f"{name}_{setting}_2"
            seconds = _twice(conn, lambda attempt, setting=setting: (
                f"SELECT madlib_keras_fit_multiple_model('{name}_packed', '{name}_{setting}_{attempt}', "
                f"'{name}_mst', {workload['iterations']}, FALSE, {valid})"))
            fused, visits = conn.execute(
                f"SELECT count(*) FILTER (WHERE result->'seconds' ? 'fused'), count(*) FROM {out}_mop_visits"
            ).fetchone()
            # (a fused pass's models each record their share of its seconds)
            validating = conn.execute(f"SELECT sum((result->'seconds'->>'total')::float8), "
                                      f"count(*) FILTER (WHERE result ? 'fused_with') FROM {out}_mop_evals"
                                      ).fetchone() if validation else (None, None)
            weights = {k: np.frombuffer(w, np.float32) for k, w in conn.execute(
                f"SELECT mst_key, model_weights FROM {out} ORDER BY 1")}
            accuracy = conn.execute(f"SELECT avg(training_metrics_final) FROM {out}_info").fetchone()[0]
            if reference is None:
                reference = weights
            difference = max(float(np.linalg.norm(w - reference[k]) / np.linalg.norm(reference[k]))
                             for k, w in weights.items())
            rows.append({"setting": setting, "first": seconds[0], "second": seconds[1],
                         "fused": fused, "visits": visits, "accuracy": float(accuracy),
                         "difference": difference, "validating": validating})
            print(f"{name} {setting}: {seconds[0]:.1f} s, then {seconds[1]:.1f} s; {fused} of {visits} "
                  "visits fused", flush=True)
        conn.execute("RESET madlib_mop.fuse_models")
    return rows


def evaluations(dsn: str, name: str) -> list[dict]:
    """madlib_keras_evaluate_multiple_model of the `off` job's models over the training rows,
    fused or not, twice in a row each in sessions of their own: the first run traces the
    session's programs, the second finds them ready."""
    rows = []
    for setting in ("off", "on", "auto"):
        with _session(dsn) as conn:
            end_idle_workers(conn)
            conn.execute(f"SET madlib_mop.fuse_models = {setting}")
            seconds = _twice(conn, lambda attempt, setting=setting: (
                f"SELECT madlib_keras_evaluate_multiple_model('{name}_off_2', '{name}_packed', "
                f"'{name}_evaluated_{setting}_{attempt}')"))
            losses = dict(conn.execute(f"SELECT mst_key, loss FROM {name}_evaluated_{setting}_2"))
            rows.append({"setting": setting, "first": seconds[0], "second": seconds[1], "losses": losses})
            print(f"{name} evaluate {setting}: {seconds[0]:.1f} s, then {seconds[1]:.1f} s", flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workloads", default="W5s,W1")
    parser.add_argument("--validation", action="store_true",
                        help="the jobs evaluate a validation table after each iteration")
    args = parser.parse_args()
    dsn = configured_dsn()
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as conn:
        fresh_schema(conn)
        results, evaluated = {}, {}
        for name in args.workloads.split(","):
            workload = W5S if name == "W5s" else WORKLOADS[name]
            print(f"\n## {name}: loading ...", flush=True)
            load_workload(conn, name.lower(), workload)
            if name == "W5s":
                _w5s_betas(conn, name.lower())
            results[name] = run(dsn, name.lower(), workload, args.validation)
            evaluated[name] = evaluations(dsn, name.lower())
        conn.execute(f"DROP SCHEMA {SCHEMA} CASCADE")
    print("\n| workload | fuse_models | first run s | second run s | second / off's | fused visits "
          "| mean training accuracy | weights: largest distance from off's, relative |")
    print("|---|---|---|---|---|---|---|---|")
    for name, rows in results.items():
        off = rows[0]["second"]
        for r in rows:
            print(f"| {name} | {r['setting']} | {r['first']:.1f} | {r['second']:.1f} | {r['second'] / off:.2f} "
                  f"| {r['fused']} of {r['visits']} | {r['accuracy']:.4f} | {r['difference']:.1e} |")
    if args.validation:
        print("\n| workload | fuse_models | validation passes: worker-seconds (second run) | / off's "
              "| results of fused passes |")
        print("|---|---|---|---|---|")
        for name, rows in results.items():
            off = rows[0]["validating"][0]
            for r in rows:
                spent, fused = r["validating"]
                print(f"| {name} | {r['setting']} | {spent:.2f} | {spent / off:.2f} | {fused} |")
    print("\n| workload | evaluate, fuse_models | first run s | second run s | second / off's "
          "| losses: largest difference from off's, relative |")
    print("|---|---|---|---|---|---|")
    for name, rows in evaluated.items():
        off = rows[0]
        for r in rows:
            difference = max(abs(loss - off["losses"][k]) / abs(off["losses"][k]) for k, loss in r["losses"].items())
            print(f"| {name} | {r['setting']} | {r['first']:.2f} | {r['second']:.2f} "
                  f"| {r['second'] / off['second']:.2f} | {difference:.1e} |")


if __name__ == "__main__":
    main()
