"""This checkout's model hopping against an earlier version's, side by side in one run: the
same workload of bench_mop.py (W1 by default), trained by each in turn, alternating which
goes first, in databases of one server.  Prints the makespans (a new session's job, then the
same job again in that session) and their ratio, and whether both give the same weights.

The baseline is an earlier commit checked out beside this one, with its own runtime, whose
install script is added to the server as its version (the shared library of this checkout
serves both: it only adds functions):

    git worktree add ../baseline <commit>
    (cd ../baseline && /usr/bin/python3 -m venv .venv && .venv/bin/pip install -e . \
        && .venv/bin/python -m madlib_mop.tools.extension_build --version <its version> --out build)
    cp ../baseline/build/madlib_mop--<its version>.sql "$(pg_config --sharedir)/extension/"
    createdb baseline; psql -d baseline -c "CREATE SCHEMA madlib_mop" \
        -c "CREATE EXTENSION madlib_mop SCHEMA madlib_mop VERSION '<its version>' CASCADE"
    .venv/bin/python bench/bench_baseline.py --baseline-dsn "<dsn of database baseline>"
"""

from __future__ import annotations

import argparse
import statistics

import psycopg

from bench_mop import SCHEMA, WORKLOADS, load_workload, run_mop
from madlib_mop.tools.embedded import configured_dsn


def _prepare(dsn: str, name: str) -> str:
    """The workload's tables in the database; the extension's version there."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        version, schema = conn.execute(
            "SELECT extversion, extnamespace::regnamespace::text FROM pg_extension "
            "WHERE extname = 'madlib_mop'").fetchone()
        conn.execute(f"DROP SCHEMA IF EXISTS {SCHEMA} CASCADE")
        conn.execute(f"CREATE SCHEMA {SCHEMA}")
        conn.execute(f"SET search_path = {SCHEMA}, {schema}")
        load_workload(conn, name, WORKLOADS[name])
    return version


def _clear_outputs(dsn: str) -> None:
    """Drop what a run of run_mop wrote (packed tables, outputs, per-job tables)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        for (table,) in conn.execute(
                "SELECT quote_ident(relname) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
                "WHERE n.nspname = %s AND c.relkind IN ('r', 'p') AND relname ~ '_(packed|vpacked|fit|fit2)' "
                "AND NOT c.relispartition", (SCHEMA,)).fetchall():
            conn.execute(f"DROP TABLE IF EXISTS {SCHEMA}.{table} CASCADE")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--baseline-dsn", required=True)
    parser.add_argument("--dsn", default=None, help="this checkout's database (default: the embedded one)")
    parser.add_argument("--workload", default="W1", choices=sorted(WORKLOADS))
    parser.add_argument("--segments", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    sides = {"baseline": args.baseline_dsn, "this": args.dsn or configured_dsn()}
    versions = {side: _prepare(dsn, args.workload) for side, dsn in sides.items()}
    name = args.workload.lower()
    runs: dict[str, list[dict]] = {side: [] for side in sides}
    for repeat in range(args.repeats):
        order = list(sides) if repeat % 2 == 0 else list(reversed(sides))
        for side in order:
            _clear_outputs(sides[side])
            print(f"{args.workload}: run {repeat + 1}/{args.repeats}, {side} "
                  f"(madlib_mop {versions[side]}) ...", flush=True)
            runs[side].append(run_mop(sides[side], name, WORKLOADS[args.workload], args.segments,
                                      prewarm=False))
    print(f"\n## {args.workload}: madlib_keras_fit_multiple_model, {args.segments} segments, "
          f"{args.repeats} runs each (median)\n")
    print("| | baseline | this checkout | this / baseline |\n|---|---|---|---|")
    for label, pick in (("new session's job (s)", lambda r: r["makespan"]),
                        ("same job again, warm workers (s)", lambda r: r["warm"]["makespan"]),
                        ("again in a new session, on the role's idle workers (s)",
                         lambda r: r["role"]["makespan"]),
                        ("warm job: median gap between visits of a segment (ms)",
                         lambda r: r["warm"]["hop_gap_ms"])):
        base = statistics.median(pick(r) for r in runs["baseline"])
        this = statistics.median(pick(r) for r in runs["this"])
        print(f"| {label} | {base:.2f} | {this:.2f} | {this / base:.3f} |")
    for side in sides:
        print(f"\n{side}: new session " + ", ".join(f"{r['makespan']:.2f}" for r in runs[side])
              + "; warm " + ", ".join(f"{r['warm']['makespan']:.2f}" for r in runs[side]), end="")
    print()
    same = {r["weights_md5"] for r in runs["baseline"] + runs["this"]}
    print(f"\nversions: baseline {versions['baseline']}, this {versions['this']}; "
          f"weights of every run bitwise equal: {'yes' if len(same) == 1 else 'NO'}")


if __name__ == "__main__":
    main()
