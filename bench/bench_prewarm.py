"""A role's job on sessions the server kept ready against the same job on other sessions.

W4's ResNets on fewer images (`--rows`, default 10,000 generated CIFAR-shaped images; 1
epoch, 2 segments), in one run: the job in a new session (its workers import TensorFlow
and trace), again in that session (warm), in another new session on the sessions that
left idle (role); then, `--rounds` times: on sessions the server opened for the role
(`madlib_mop.prewarm_roles`, as `bench_mop.py`'s (c prewarm) sets it), the next job on
those same sessions (after), and a job on the role's idle sessions once the settings are
reset (role).  Printed per job: makespan, when its first sub-epoch started after the call,
the visits' summed train / restore / save seconds, and its weights' digest (the same for
every job).  What it shows: what a prewarmed session's first job pays that the next job on
it does not.  Needs the library preloaded (`make demo` sets it up).

    .venv/bin/python bench/bench_prewarm.py [--rows 10000] [--rounds 2]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_mop  # noqa: E402

from madlib_mop.tools.embedded import configured_dsn  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    bench_mop.CIFAR_ROWS = args.rows
    dsn, name = configured_dsn(), "w4p"
    workload = dict(bench_mop.WORKLOADS["W4"], epochs=1, iterations=1)
    with bench_mop._session(dsn) as conn:
        bench_mop.fresh_schema(conn)
        bench_mop.load_workload(conn, name, workload)
        conn.execute(f"SELECT training_preprocessor_dl('{name}_train', '{name}_packed', 'y', 'x', "
                     "distribution_rules => '2')")
        conn.execute(f"SELECT validation_preprocessor_dl('{name}_valid', '{name}_vpacked', 'y', 'x', "
                     f"'{name}_packed')")
    rows: list[tuple[str, dict]] = []

    def fit(conn, label: str) -> None:
        run = bench_mop._run_fit(conn, dsn, name, f"f{len(rows)}", workload, 2)
        rows.append((label, run))
        print(f"{label}: {run['makespan']:.2f} s", flush=True)

    with bench_mop._session(dsn) as conn:
        bench_mop.end_idle_workers(conn)
        fit(conn, "new session")
        fit(conn, "warm")
    with bench_mop._session(dsn) as conn:
        fit(conn, "role")
    for number in range(1, args.rounds + 1):
        with bench_mop.prewarmed(dsn, 2) as ready:
            if not ready:
                return
            for label in (f"prewarm {number}", f"after {number}"):
                with bench_mop._session(dsn) as conn:
                    fit(conn, label)
        with bench_mop._session(dsn) as conn:
            fit(conn, f"role {number}")
    print(f"\n### W4's ResNets, {args.rows:,} images, 1 epoch, 2 segments\n")
    print("| job | makespan s | first sub-epoch after the call s | train s | restore s | save s | "
          "visits that traced | weights |")
    print("|---|---:|---:|---:|---:|---:|---:|---|")
    for label, run in rows:
        parts = run["breakdown"]
        print(f"| {label} | {run['makespan']:.2f} | {run['first_visit_after']:.2f} | {parts['train']:.2f} | "
              f"{parts['restore']:.2f} | {parts['save']:.2f} | {run['traced_visits']} | "
              f"{run['weights_md5'][:8]} |")
    for number in range(1, args.rounds + 1):
        seconds = {label: run["makespan"] for label, run in rows}
        print(f"\nround {number}: prewarm / after {seconds[f'prewarm {number}'] / seconds[f'after {number}']:.2f}, "
              f"prewarm / role {seconds[f'prewarm {number}'] / seconds[f'role {number}']:.2f}")
    with bench_mop._session(dsn) as conn:
        conn.execute(f"DROP SCHEMA {bench_mop.SCHEMA} CASCADE")


if __name__ == "__main__":
    main()
