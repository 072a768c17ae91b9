"""Several servers against one: a workload of bench_mop.py (W1, or W4's ResNets) trained on
the cluster of `make cluster` (a coordinator and 2 segment servers on this machine) and on
the embedded server with 2 segments, side by side, on the same data and configurations;
one model of a state of about 1 GB hopping between the segment servers; and packing on the
cluster against copying the same rows into a foreign table.

Measured:
  - makespan of madlib_keras_fit_multiple_model (cluster / one server);
  - bytes over the network per epoch: TCP loopback traffic during the fit (the cluster's
    worker sessions are TCP; one server's are Unix sockets), or, with CLUSTER_NET, the
    traffic through the cluster's switch, against the state bytes the visits' records say
    they fetched or were carried (the rest: the coordinator's durable copy of each state
    once per iteration, validation, the calls) and the packed data;
  - per hop: state bytes through the coordinator and fetched from server to server, with
    the segment servers able to reach each other and (the same fit again) not, when the
    coordinator carries every state;
  - the sub-epoch breakdown (read, restore, train, save in the worker) and the gap between
    two visits of a segment (dispatch, network, the coordinator's commit);
  - `--big-state-mb N`: one model of a state of N MB (an Embedding of N/16 million rows of 4
    columns, on iris, plain SGD) on the cluster and on one server: each fetch between the
    segment servers against its network bound (bytes / the links' rate, plus their delay
    where tc netem sets one), and the makespans;
  - packing (W1): training_preprocessor_dl on the cluster (rows/s) against
    INSERT INTO <foreign table on a segment server> SELECT * FROM <source> of the same rows.

    .venv/bin/python bench/bench_cluster.py [--workload W1|W2|W4|W5] [--rows N] [--big-state-mb 1100]
                                            [--fuse-models auto|on|off]
    make bench-cluster CLUSTER_NET=lan   (segment servers in network namespaces behind shaped
                                          links: madlib_mop.tools.cluster_net)
Prints markdown tables; writes bench/results/cluster.json (cluster-lan.json, cluster-w4-lan.json, ...).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Iterator

import psycopg
from psycopg.conninfo import make_conninfo

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_mop  # noqa: E402  (the workloads and their loading)

from madlib_mop.tools import cluster_net, local_cluster as cluster_tool  # noqa: E402
from madlib_mop.tools.demo import ensure_extension  # noqa: E402
from madlib_mop.tools.embedded import configured_dsn  # noqa: E402

SCHEMA = bench_mop.SCHEMA
RESULTS = Path(__file__).resolve().parent / "results"


def network_bytes() -> int:
    """Bytes sent over the cluster's network so far: received on the loopback interface
    (/proc/net/dev); with CLUSTER_NET, also received by the switch's ports from the servers
    (each packet crosses one port into the switch)."""
    moved = _received(Path("/proc/net/dev").read_text(), lambda name: name == "lo")
    if cluster_net.profile() is not None:
        switch = subprocess.run(["ip", "netns", "exec", cluster_net.SWITCH, "cat", "/proc/net/dev"],
                                capture_output=True, text=True, check=True).stdout
        moved += _received(switch, lambda name: name.startswith("mopnet"))
    return moved


def _received(table: str, counted) -> int:
    total = 0
    for line in table.splitlines():
        name, _, fields = line.partition(":")
        if fields and counted(name.strip()):
            total += int(fields.split()[0])
    return total


# What a worker times in a sub-epoch (segment.worker): reading its buffers, loading the
# state from the job's store, restoring it into the model, training, saving it out of the
# model, keeping it (its hop file; on a segment server it goes back with the call).
SUBEPOCH_PARTS = ("read", "load", "restore", "train", "save", "keep", "total")


def prepare(dsn: str, workload: dict, segments: str | None, fuse_models: str | None) -> psycopg.Connection:
    conn = psycopg.connect(dsn, autocommit=True)
    ensure_extension(conn)
    conn.execute(f"DROP SCHEMA IF EXISTS {SCHEMA} CASCADE")
    conn.execute(f"CREATE SCHEMA {SCHEMA}")
    conn.execute(f"SET search_path = {SCHEMA}, madlib_mop")
    if fuse_models:
        conn.execute("SELECT set_config('madlib_mop.fuse_models', %s, false)", (fuse_models,))
    conn.info_rows = bench_mop.load_workload(conn, "w1", workload)[0]  # type: ignore[attr-defined]
    started = time.perf_counter()
    rules = f", distribution_rules => '{segments}'" if segments else ""
    conn.execute(f"SELECT training_preprocessor_dl('w1_train', 'w1_packed', 'y', 'x'{rules})")
    packing = time.perf_counter() - started
    conn.execute("SELECT validation_preprocessor_dl('w1_valid', 'w1_vpacked', 'y', 'x', 'w1_packed')")
    conn.info_packing = packing  # type: ignore[attr-defined]
    return conn


def fit(conn: psycopg.Connection, out: str = "w1_fit", iterations: int = 1) -> dict:
    before, started, called = network_bytes(), time.perf_counter(), time.time()
    conn.execute(f"SELECT madlib_keras_fit_multiple_model('w1_packed', '{out}', 'w1_mst', {iterations}, "
                 "FALSE, 'w1_vpacked')")
    makespan, moved = time.perf_counter() - started, network_bytes() - before
    visits = conn.execute(f"SELECT mst_key, step, segment, result FROM {out}_mop_visits "
                          "ORDER BY segment, (result->>'finished_at')::float8").fetchall()
    # (the states a visit leaves: with the optimizer's variables, larger than step 0's)
    state = statistics.mean(v[3].get("state_bytes", 0) for v in visits)
    # (the worker's clock is this machine's: every server of the cluster runs here)
    first_subepoch = min(v[3]["finished_at"] for v in visits) - called
    data = conn.execute("SELECT sum(octet_length(x) + octet_length(y)) FROM w1_packed").fetchone()[0]
    gaps, each_call = [], calls(visits)
    for before_visit, visit in zip(each_call, each_call[1:]):
        if before_visit[0] == visit[0]:
            gaps.append(visit[1] - before_visit[2])
    parts = {p: statistics.mean(v[3]["seconds"].get(p, 0.0) for v in visits)
             for p in SUBEPOCH_PARTS}
    segments = max(v[2] for v in visits) + 1
    epochs = len(visits) // (segments * len({v[0] for v in visits}))
    accuracy = dict(conn.execute(f"SELECT mst_key, validation_metrics_final FROM {out}_info").fetchall())
    traced = sum(int(v[3].get("traced", 0)) for v in visits)
    hops = [v[3] for v in visits if v[1] > 0]  # a model's first visit gets its step-0 state
    per_hop = {"coordinator": statistics.mean(h.get("coordinator_bytes", 0) for h in hops),
             "fetched": statistics.mean(h.get("fetched_bytes", 0) for h in hops),
             "record": statistics.mean(len(json.dumps(h)) for h in hops),
             "fetch_ms": 1000 * statistics.mean(h["seconds"].get("fetch", 0.0) for h in hops)}
    records = [v[3] for v in visits]
    fused = sum(1 for r in records if r.get("fused_with"))
    states_moved = sum(r.get("fetched_bytes", 0) + r.get("coordinator_bytes", 0) for r in records)
    return {"makespan": makespan, "network_bytes": moved, "state_bytes": float(state),
            "states_moved": states_moved, "fused_visits": fused,
            "first_subepoch_s": first_subepoch, "traced": traced,
            "packed_bytes": int(data), "hops": len(visits), "epochs": epochs,
            "subepoch": parts, "gap_ms": 1000 * statistics.median(gaps) if gaps else None,
            "accuracy": accuracy, "per_hop": per_hop,
            "weights": conn.execute("SELECT md5(string_agg(md5(model_weights), '' ORDER BY mst_key)) "
                                    f"FROM {out}").fetchone()[0]}


def calls(visits: list[tuple]) -> list[tuple[int, float, float]]:
    """(segment, start, end) of each call: a fused call's visits (the models of its
    `fused_with`, each record with its share of the call's seconds) as one."""
    found: list[tuple[int, float, float]] = []
    for before, (_, _, segment, result) in zip([None] + visits, visits):
        fused = result.get("fused_with") or []
        if (before is not None and fused and before[2] == segment and before[3].get("fused_with") == fused
                and abs(before[3]["finished_at"] - result["finished_at"]) < 0.05):
            continue  # (the same call: its first visit stands for it)
        total = result["seconds"]["total"] * max(1, len(fused))
        found.append((segment, result["finished_at"] - total, result["finished_at"]))
    return found


def copy_into_foreign_table(conn: psycopg.Connection, segment_dsn: str, batch_size: int) -> float:
    """INSERT INTO a foreign table on seg0 SELECT * FROM the source: seconds."""
    with psycopg.connect(segment_dsn, autocommit=True) as there:
        there.execute(f"CREATE SCHEMA IF NOT EXISTS {SCHEMA}")
        there.execute(f"DROP TABLE IF EXISTS {SCHEMA}.w1_copy")
        there.execute(f"CREATE TABLE {SCHEMA}.w1_copy (id integer, x real[], y integer)")
    conn.execute("DROP FOREIGN TABLE IF EXISTS w1_copy")
    conn.execute("CREATE FOREIGN TABLE w1_copy (id integer, x real[], y integer) SERVER seg0 "
                 f"OPTIONS (schema_name '{SCHEMA}', table_name 'w1_copy', batch_size '{batch_size}')")
    started = time.perf_counter()
    conn.execute("INSERT INTO w1_copy SELECT id, x, y FROM w1_train")
    return time.perf_counter() - started


def link_rate_bits(rate: str) -> float:
    """tc's rate (`10gbit`, `100mbit`) in bits per second."""
    for unit, factor in (("gbit", 1e9), ("mbit", 1e6), ("kbit", 1e3), ("bit", 1.0)):
        if rate.endswith(unit):
            return float(rate[: -len(unit)]) * factor
    raise ValueError(f"not a tc rate: {rate!r}")


def network_bound(state_bytes: int) -> float | None:
    """Seconds a state's bytes take from one segment server to the other over CLUSTER_NET's
    links: their rate (each link of the path is shaped alike), plus the delay of the two
    links each way for the request and the first piece where netem sets one.  None: the
    loopback, no bound."""
    net = cluster_net.profile()
    if net is None:
        return None
    delayed = "netem" in cluster_net.shaping("seg0", 0)
    delay = 4 * float(net[1].delay.removesuffix("ms")) / 1000 if delayed else 0.0
    return state_bytes * 8 / link_rate_bits(net[1].rate) + delay


def big_architecture(state_mb: int) -> str:
    """One model whose state is about `state_mb` MB and whose steps are cheap: an Embedding
    of state_mb/16 million rows of 4 columns on iris (its features cast to the row numbers
    0-7), written from a model of 8 rows (building it would hold the MBs here)."""
    import keras

    config = json.loads(keras.Sequential([keras.Input((4,)), keras.layers.Embedding(8, 4, name="rows"),
                                          keras.layers.Flatten(),
                                          keras.layers.Dense(3, activation="softmax")]).to_json())
    [embedding] = [layer for layer in config["config"]["layers"] if layer["config"]["name"] == "rows"]
    embedding["config"]["input_dim"] = state_mb * (1 << 20) // 16
    return json.dumps(config)


def big_state(dsn: str, segments: str | None, state_mb: int) -> dict:
    """The model of `big_architecture` trained for 2 iterations (4 visits, a hop between the
    segment servers after each but the last): the makespan and each fetch."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"DROP SCHEMA IF EXISTS {SCHEMA} CASCADE")
        conn.execute(f"CREATE SCHEMA {SCHEMA}")
        conn.execute(f"SET search_path = {SCHEMA}, madlib_mop")
        bench_mop.load_workload(conn, "big", dict(bench_mop.WORKLOADS["IRIS"], configs=[]))
        rules = f", distribution_rules => '{segments}'" if segments else ""
        conn.execute(f"SELECT training_preprocessor_dl('big_train', 'big_packed', 'y', 'x'{rules})")
        conn.execute("SELECT load_keras_model('big_arch', %s::json)", (big_architecture(state_mb),))
        before, started = network_bytes(), time.perf_counter()
        conn.execute("SELECT madlib_keras_fit('big_packed', 'big_fit', 'big_arch', 1, "
                     "$$loss='categorical_crossentropy', optimizer='SGD(learning_rate=0.1)', "
                     "metrics=['accuracy']$$, 'batch_size=50, epochs=1', 2)")
        makespan, moved = time.perf_counter() - started, network_bytes() - before
        visits = [v for (v,) in conn.execute("SELECT result FROM big_fit_mop_visits ORDER BY step")]
        # (weights over 1 GB: NULL in model_weights, in pieces beside it)
        weights = conn.execute("SELECT md5(model_weights) FROM big_fit").fetchone()[0] or conn.execute(
            "SELECT md5(string_agg(md5(model_weights), '' ORDER BY piece)) FROM big_fit_mop_weights").fetchone()[0]
        conn.execute(f"DROP SCHEMA {SCHEMA} CASCADE")
    fetches = [{"bytes": v["fetched_bytes"], "seconds": v["seconds"].get("fetch", 0.0),
                "bound": network_bound(v["fetched_bytes"])} for v in visits if v.get("fetched_bytes")]
    return {"makespan": makespan, "network_bytes": moved, "weights": weights, "fetches": fetches,
            "state_bytes": max(v.get("state_bytes", 0) for v in visits),
            "coordinator_bytes": [v.get("coordinator_bytes", 0) for v in visits]}


@contextlib.contextmanager
def without_peers(servers: dict) -> Iterator[None]:
    """Each segment server without foreign servers for the others: the coordinator carries
    every state (reads it from the server that keeps it, sends it with the call)."""
    segment_servers = {n: cluster_tool._dsn_with_password(s) for n, s in servers.items() if n != "coordinator"}
    for name, dsn in segment_servers.items():
        with psycopg.connect(dsn, autocommit=True) as there:
            for other in segment_servers:
                if other != name:
                    there.execute(f"DROP SERVER IF EXISTS {other} CASCADE")
    try:
        yield
    finally:
        for name, dsn in segment_servers.items():
            cluster_tool._peers(dsn, [(o, d) for o, d in segment_servers.items() if o != name])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workload", choices=("W1", "W2", "W4", "W5"), default="W1")
    parser.add_argument("--rows", type=int, help="W1: rows generated (default: bench_mop's); "
                        f"W4: images (default {bench_mop.CIFAR_ROWS})")
    parser.add_argument("--big-state-mb", type=int, default=0,
                        help="also one model of a state of this many MB (0: not)")
    parser.add_argument("--fuse-models", choices=("auto", "on", "off"),
                        help="madlib_mop.fuse_models in the fits' sessions (default: the servers')")
    args = parser.parse_args()
    workload = dict(bench_mop.WORKLOADS[args.workload])
    if isinstance(workload["data"], int):
        workload["data"] = args.rows or workload["data"]  # generated rows
    elif args.rows:
        bench_mop.CIFAR_ROWS = args.rows
    cluster_dsn = cluster_tool.start()
    net = cluster_net.profile()
    network = ("the loopback" if net is None else
               f"CLUSTER_NET={net[0]}, each segment server's link: {cluster_net.shaping('seg0', 0)}")
    servers = cluster_tool.servers()
    _clean_start(servers)
    results = {}
    for name, dsn, segments in (("one server", configured_dsn(), "2"), ("cluster", cluster_dsn, None)):
        with prepare(dsn, workload, segments, args.fuse_models) as conn:
            packing, rows = conn.info_packing, conn.info_rows  # type: ignore[attr-defined]
            copies = ({size: copy_into_foreign_table(conn, make_conninfo(cluster_tool._dsn_with_password(
                servers["seg0"])), size) for size in (1, 1000)} if name == "cluster" and args.workload == "W1"
                else None)
            results[name] = dict(fit(conn, iterations=workload["iterations"]), packing_s=packing, copy_s=copies)
            # The same fit again: its worker sessions are the first fit's, kept idle (on the
            # cluster, on the segment servers, taken up through a relaying session).
            results[name]["again"] = fit(conn, "w1_fit_again", workload["iterations"])
            if name == "cluster":  # the segment servers unable to reach each other
                with without_peers(servers):
                    results[name]["carried"] = fit(conn, "w1_fit_carried", workload["iterations"])
            conn.execute(f"DROP SCHEMA {SCHEMA} CASCADE")
    if args.big_state_mb:
        _clean_start(servers)  # (the workload's idle sessions hold memory the big state needs)
        results["big state"] = {name: big_state(dsn, segments, args.big_state_mb) for name, dsn, segments in
                                (("one server", configured_dsn(), "2"), ("cluster", cluster_dsn, None))}
        _clean_start(servers)
    RESULTS.mkdir(exist_ok=True)
    named = "cluster" + ("" if args.workload == "W1" else f"-{args.workload.lower()}") + (
        f"-fuse-{args.fuse_models}" if args.fuse_models else "")
    (RESULTS / (f"{named}.json" if net is None else f"{named}-{net[0]}.json")).write_text(json.dumps(
        {"measured_at": datetime.now(timezone.utc).isoformat(), "workload": args.workload, "rows": rows,
         "network": network, "fuse_models": args.fuse_models, **results}, indent=2, default=str))
    fusing = f"; madlib_mop.fuse_models = {args.fuse_models}" if args.fuse_models else ""
    print_workload(args.workload, rows, len(workload["configs"]), network + fusing, results)
    if "big state" in results:
        print_big_state(results["big state"], network)


def _clean_start(servers: dict) -> None:
    """No worker session kept idle by an earlier run, on any server; the bench's schema gone
    from the segment servers."""
    for name in ("seg0", "seg1"):
        with psycopg.connect(cluster_tool._dsn_with_password(servers[name]), autocommit=True) as there:
            there.execute(f"DROP SCHEMA IF EXISTS {SCHEMA} CASCADE")
    for dsn in [configured_dsn()] + [cluster_tool._dsn_with_password(s) for s in servers.values()]:
        with psycopg.connect(dsn, autocommit=True) as there:
            there.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                          "WHERE application_name LIKE 'madlib_mop%' AND pid <> pg_backend_pid()")


def print_workload(workload: str, rows: int, models: int, network: str, results: dict) -> None:
    one, many = results["one server"], results["cluster"]
    print(f"\n### {workload} on 2 segment servers against one server with 2 segments ({rows} training rows, "
          f"{models} models, {many['epochs']} epochs; {network})\n")
    print("| | one server | cluster | ratio |\n|---|---:|---:|---:|")
    print(f"| makespan (s) | {one['makespan']:.1f} | {many['makespan']:.1f} | "
          f"{many['makespan'] / one['makespan']:.3f} |")
    for part in SUBEPOCH_PARTS:
        print(f"| sub-epoch {part} (ms, mean) | {1000 * one['subepoch'][part]:.1f} | "
              f"{1000 * many['subepoch'][part]:.1f} | |")
    print(f"| gap between a segment's visits (ms, median) | {one['gap_ms']:.1f} | {many['gap_ms']:.1f} | |")
    print(f"| visits fused (of {many['hops']}) | {one['fused_visits']} | {many['fused_visits']} | |")
    print(f"| same weights | | {'yes' if one['weights'] == many['weights'] else 'NO'} | |")
    print("\n### The same fit again: its sessions kept idle from the first\n")
    print("| | one server | cluster | ratio |\n|---|---:|---:|---:|")
    for label, run in (("first fit", lambda r: r), ("again", lambda r: r["again"])):
        print(f"| {label}: makespan (s) | {run(one)['makespan']:.1f} | {run(many)['makespan']:.1f} | "
              f"{run(many)['makespan'] / run(one)['makespan']:.3f} |")
        print(f"| {label}: first sub-epoch finished, after the call (s) | {run(one)['first_subepoch_s']:.2f} | "
              f"{run(many)['first_subepoch_s']:.2f} | |")
        print(f"| {label}: functions traced by its visits | {run(one)['traced']} | {run(many)['traced']} | |")
    same = one["weights"] == one["again"]["weights"] == many["again"]["weights"]
    print(f"| again: same weights as the first fits | | {'yes' if same else 'NO'} | |")
    carried, direct = many["carried"], many["again"]
    print("\n### States between segment servers: carried by the coordinator, or server to server\n")
    print("| per hop (a model's first visit left out) | carried by the coordinator | server to server |"
          "\n|---|---:|---:|")
    print(f"| state bytes through the coordinator (mean) | {carried['per_hop']['coordinator']:,.0f} | "
          f"{direct['per_hop']['coordinator']:,.0f} |")
    print(f"| state bytes fetched from server to server (mean) | {carried['per_hop']['fetched']:,.0f} | "
          f"{direct['per_hop']['fetched']:,.0f} |")
    print(f"| the visit's record (bytes, mean) | {carried['per_hop']['record']:,.0f} | "
          f"{direct['per_hop']['record']:,.0f} |")
    print(f"| fetching the state in the worker (ms, mean) | {carried['per_hop']['fetch_ms']:.1f} | "
          f"{direct['per_hop']['fetch_ms']:.1f} |")
    print(f"| makespan (s), sessions kept idle | {carried['makespan']:.1f} | {direct['makespan']:.1f} |")
    print(f"| same weights | {'yes' if carried['weights'] == one['weights'] else 'NO'} | "
          f"{'yes' if direct['weights'] == one['weights'] else 'NO'} |")
    print("\n| network per epoch | bytes |\n|---|---:|")
    print(f"| TCP over the network during the fit, per epoch | {many['network_bytes'] / many['epochs']:,.0f} |")
    print(f"| states the visits fetched or were carried, per epoch | {many['states_moved'] / many['epochs']:,.0f} |")
    print(f"| packed data (never moved after packing) | {many['packed_bytes']:,} |")
    print(f"| one server: loopback TCP during the fit, per epoch | {one['network_bytes'] / one['epochs']:,.0f} |")
    if many["copy_s"]:
        print(f"\n### Packing {rows} rows onto the cluster\n")
        print("| | seconds | rows/s |\n|---|---:|---:|")
        print(f"| training_preprocessor_dl on one server | {one['packing_s']:.1f} | {rows / one['packing_s']:,.0f} |")
        print(f"| training_preprocessor_dl on the cluster | {many['packing_s']:.1f} | "
              f"{rows / many['packing_s']:,.0f} |")
        for size, seconds in many["copy_s"].items():
            print(f"| INSERT INTO <foreign table> SELECT (same rows, batch_size {size}) | {seconds:.1f} | "
                  f"{rows / seconds:,.0f} |")
        fastest = min(many["copy_s"].values())
        print(f"| cluster packing / fastest foreign-table copy (target <= 1.5) | "
              f"{many['packing_s'] / fastest:.2f} | |")


def print_big_state(runs: dict, network: str) -> None:
    one, many = runs["one server"], runs["cluster"]
    print(f"\n### One model of a {many['state_bytes'] / 1e9:.2f} GB state, 2 iterations ({network})\n")
    print("| | one server | cluster | ratio |\n|---|---:|---:|---:|")
    print(f"| makespan (s) | {one['makespan']:.1f} | {many['makespan']:.1f} | "
          f"{many['makespan'] / one['makespan']:.2f} |")
    print(f"| same weights | | {'yes' if one['weights'] == many['weights'] else 'NO'} | |")
    print(f"| state bytes through the coordinator, by visit | | "
          f"{', '.join(f'{b:,}' for b in many['coordinator_bytes'])} | |")
    print("\n| fetch between the segment servers | bytes | seconds | network bound (s) | seconds / bound |"
          "\n|---|---:|---:|---:|---:|")
    for number, fetch in enumerate(many["fetches"], 1):
        bound, seconds = fetch["bound"], fetch["seconds"]
        print(f"| {number} | {fetch['bytes']:,} | {seconds:.2f} | "
              f"{'-' if bound is None else f'{bound:.2f}'} | "
              f"{'-' if bound is None else f'{seconds / bound:.1f}'} |")


if __name__ == "__main__":
    main()
