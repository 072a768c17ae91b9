"""Model selection by model hopping against what users would do instead, side by side.

Workloads (fixed seeds):
  W1  250,000 rows x 64 generated features (200,000 to train on, 50,000 held out), 10 classes; 8 MLPs (2 architectures x 2 learning
      rates x 2 batch sizes), 5 epochs, S segments.
  W2  scikit-learn's digits (64 pixels, 10 classes), 8 MLPs, 10 epochs, 20% held out.
  W3  100,000 generated rows (80,000 to train on); 8 MLPs whose per-epoch cost differs by more than 4x (a small and a
      large network, batch 32 and 512): heterogeneous, to show the barrier-free scheduler.

Compared in one run, on the same data and configurations:
  (a) export: read the table into NumPy with psycopg, train the configurations one after
      another in one process with TensorFlow's default threading;
  (b) task parallel: S processes, each with its own full copy of the data, training its
      share of the configurations (cores / S threads each);
  (c) madlib_mop: madlib_keras_fit_multiple_model over S segments (packing timed apart);
  (d) for W1 and W3, the lower bound max(sum of single-thread times / S, longest one).

    .venv/bin/python bench/bench_mop.py [--segments 2] [--workloads W1,W2,W3]
Prints markdown tables; writes bench/results/mop.json and PNG plots.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import resource
import threading
import time
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import psycopg

from madlib_mop.tools.demo import ensure_extension
from madlib_mop.tools.embedded import configured_dsn

SCHEMA = "madlib_mop_bench"
RESULTS = Path(__file__).resolve().parent / "results"


# ---- workloads ------------------------------------------------------------------------------

def _configs(hidden_sizes, rates, batches):
    return [{"hidden": list(h), "lr": lr, "batch": b}
            for h in hidden_sizes for lr in rates for b in batches]


WORKLOADS = {
    "W1": {"rows": 250_000, "epochs": 5,
           "configs": _configs([(64,), (128, 64)], [0.001, 0.01], [64, 256])},
    "W2": {"rows": None, "epochs": 10,
           "configs": _configs([(32,), (64, 32)], [0.001, 0.01], [16, 64])},
    "W3": {"rows": 100_000, "epochs": 3,
           "configs": _configs([(16,), (256, 256)], [0.001, 0.01], [32, 512])},
}


def generated(rows: int, seed: int = 0):
    """Features N(0, 1); classes from a fixed random linear map with noise."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((rows, 64)).astype(np.float32)
    w = np.random.default_rng(1).standard_normal((64, 10)).astype(np.float32)
    y = np.argmax(x @ w + 0.5 * rng.standard_normal((rows, 10)), axis=1)
    return x, y


def digits():
    from sklearn.datasets import load_digits

    data = load_digits()
    return (data.data / 16.0).astype(np.float32), data.target


def architecture(hidden: list[int]) -> str:
    import keras

    layers = [keras.Input((64,))] + [keras.layers.Dense(h, activation="relu") for h in hidden]
    return keras.Sequential(layers + [keras.layers.Dense(10, activation="softmax")]).to_json()


# ---- (a), (b), (d): training in plain processes --------------------------------------------

def _set_threads(threads: int | None) -> None:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf

    if threads:
        tf.config.threading.set_intra_op_parallelism_threads(threads)
        tf.config.threading.set_inter_op_parallelism_threads(1)


def _read_table(dsn: str, table: str):
    """What an analyst does first: the table into NumPy, over the network protocol."""
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(f"SELECT x, y FROM {SCHEMA}.{table} ORDER BY id").fetchall()
    return (np.asarray([r[0] for r in rows], dtype=np.float32),
            np.asarray([r[1] for r in rows], dtype=np.int64))


def _train(config: dict, epochs: int, x, y, x_valid, y_valid) -> dict:
    import keras

    keras.utils.set_random_seed(0)
    model = keras.models.model_from_json(architecture(config["hidden"]))
    model.compile(optimizer=keras.optimizers.Adam(learning_rate=config["lr"]),
                  loss="categorical_crossentropy", metrics=["accuracy"])
    started = time.perf_counter()
    history = model.fit(x, np.eye(10, dtype=np.float32)[y], batch_size=config["batch"],
                        epochs=epochs, shuffle=True, verbose=0)
    seconds = time.perf_counter() - started
    accuracy = model.evaluate(x_valid, np.eye(10, dtype=np.float32)[y_valid], verbose=0,
                              return_dict=True)["accuracy"]
    return {"seconds": seconds, "accuracy": float(accuracy),
            "loss_per_epoch": [float(v) for v in history.history["loss"]]}


def _process(job: dict) -> dict:
    """One process: read the data, train configurations; report times and peak memory."""
    _set_threads(job["threads"])
    started = time.perf_counter()
    x, y = _read_table(job["dsn"], job["train"])
    x_valid, y_valid = _read_table(job["dsn"], job["valid"])
    read = time.perf_counter() - started
    results = {i: _train(job["configs"][i], job["epochs"], x, y, x_valid, y_valid)
               for i in job["indexes"]}
    return {"read_seconds": read, "results": results, "data_bytes": x.nbytes + y.nbytes,
            "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def run_processes(jobs: list[dict]) -> tuple[float, list[dict]]:
    context = multiprocessing.get_context("spawn")
    started = time.perf_counter()
    with context.Pool(len(jobs)) as pool:
        outcomes = pool.map(_process, jobs)
    return time.perf_counter() - started, outcomes


# ---- (c): madlib_mop ------------------------------------------------------------------------

def _sample_worker_memory(dsn: str, stop: threading.Event, peaks: dict) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        while not stop.is_set():
            for (pid,) in conn.execute("SELECT pid FROM pg_stat_activity WHERE application_name "
                                       "LIKE 'madlib_mop worker job %'").fetchall():
                try:
                    status = Path(f"/proc/{pid}/status").read_text()
                    rss = int(next(l for l in status.splitlines() if l.startswith("VmRSS")).split()[1])
                    peaks[pid] = max(peaks.get(pid, 0), rss / 1024)
                except (OSError, StopIteration):
                    pass
            time.sleep(0.2)


def run_mop(conn, dsn: str, name: str, workload: dict, segments: int) -> dict:
    conn.execute(f"SELECT training_preprocessor_dl('{name}_train', '{name}_packed', 'y', 'x', "
                 f"distribution_rules => '{segments}')")
    conn.execute(f"SELECT validation_preprocessor_dl('{name}_valid', '{name}_vpacked', 'y', 'x', "
                 f"'{name}_packed')")
    started = time.perf_counter()
    peaks: dict = {}
    stop = threading.Event()
    sampler = threading.Thread(target=_sample_worker_memory, args=(dsn, stop, peaks), daemon=True)
    sampler.start()
    conn.execute(f"SELECT madlib_keras_fit_multiple_model('{name}_packed', '{name}_fit', '{name}_mst', "
                 f"1, FALSE, '{name}_vpacked')")
    makespan = time.perf_counter() - started
    stop.set()
    sampler.join()
    info = conn.execute(f"SELECT mst_key, validation_metrics_final FROM {name}_fit_info "
                        "ORDER BY mst_key").fetchall()
    visits = conn.execute(f"SELECT mst_key, step, segment, result FROM {name}_fit_mop_visits "
                          "ORDER BY mst_key, step").fetchall()
    state_bytes = dict(conn.execute(f"SELECT mst_key, octet_length(state) FROM {name}_fit_mop_state "
                                    "WHERE step = 0").fetchall())
    started_at = conn.execute(f"SELECT extract(epoch FROM started_at) FROM jobs WHERE "
                              f"model_output_table = '{SCHEMA}.{name}_fit' ORDER BY job_id DESC "
                              "LIMIT 1").fetchone()[0]
    # Each hop reads the state (restore) and writes the next one.
    moved = sum(2 * state_bytes[k] for k, _, _, _ in visits)
    curves: dict = {}
    for key, step, _, result in visits:  # training loss per epoch: row-weighted over segments
        rows, total = curves.setdefault(key, {}).get(step // segments, (0, 0.0))
        curves[key][step // segments] = (rows + result["rows"],
                                         total + result["metrics"]["loss"] * result["rows"])
    curves = {k: [t / n for _, (n, t) in sorted(v.items())] for k, v in curves.items()}
    parts = {p: sum(v[3]["seconds"].get(p, 0.0) for v in visits)
             for p in ("setup", "read", "restore", "train", "other", "save", "total")}
    return {"makespan": makespan, "accuracy": {k: a for k, a in info}, "state_bytes_moved": moved,
            "loss_per_epoch": curves,
            "peak_rss_mb": max(peaks.values()) if peaks else None, "breakdown": parts,
            "visits": [{"mst_key": k, "segment": s,
                        "start": r["finished_at"] - r["seconds"]["total"] - float(started_at),
                        "end": r["finished_at"] - float(started_at)} for k, _, s, r in visits]}


def load_workload(conn, name: str, workload: dict) -> tuple[int, int]:
    if workload["rows"] is None:
        x, y = digits()
    else:
        x, y = generated(workload["rows"])
    cut = int(len(x) * 0.8)
    for table, (xs, ys) in ((f"{name}_train", (x[:cut], y[:cut])), (f"{name}_valid", (x[cut:], y[cut:]))):
        conn.execute(f"CREATE TABLE {table} (id integer, x real[], y integer)")
        with conn.cursor().copy(f"COPY {table} (id, x, y) FROM STDIN") as copy:
            for i, (row, label) in enumerate(zip(xs, ys)):
                copy.write_row((i, row.tolist(), int(label)))
        conn.execute(f"VACUUM ANALYZE {table}")
    for i, config in enumerate(workload["configs"], start=1):
        conn.execute("SELECT load_keras_model(%s, %s::json)", (f"{name}_arch", architecture(config["hidden"])))
    conn.execute(f"CREATE TABLE {name}_mst (mst_key serial PRIMARY KEY, model_id integer, "
                 "compile_params varchar, fit_params varchar)")
    conn.execute(f"CREATE TABLE {name}_mst_summary (model_arch_table varchar, object_table varchar)")
    conn.execute(f"INSERT INTO {name}_mst_summary VALUES ('{SCHEMA}.{name}_arch', NULL)")
    for i, config in enumerate(workload["configs"], start=1):
        conn.execute(f"INSERT INTO {name}_mst (model_id, compile_params, fit_params) VALUES (%s, %s, %s)", (
            i, f"optimizer='Adam(learning_rate={config['lr']})',loss='categorical_crossentropy',"
               "metrics=['accuracy']", f"batch_size={config['batch']},epochs={workload['epochs']}"))
    return cut, len(x) - cut


# ---- the run --------------------------------------------------------------------------------

def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--segments", type=int, default=2)
    parser.add_argument("--workloads", default="W1,W2,W3")
    args = parser.parse_args()
    S, cores = args.segments, os.cpu_count() or 1
    dsn = configured_dsn()
    report = {"when": datetime.now(timezone.utc).isoformat(), "segments": S, "cores": cores,
              "workloads": {}}
    with psycopg.connect(dsn, autocommit=True) as conn:
        schema = ensure_extension(conn)
        conn.execute(f"DROP SCHEMA IF EXISTS {SCHEMA} CASCADE")
        conn.execute(f"CREATE SCHEMA {SCHEMA}")
        conn.execute(f"SET search_path = {SCHEMA}, {schema}")
        conn.execute("SET jit = off")
        for name in args.workloads.split(","):
            workload = WORKLOADS[name]
            print(f"\n## {name}: loading ...", flush=True)
            train_rows, valid_rows = load_workload(conn, name, workload)
            configs = workload["configs"]
            base = {"dsn": dsn, "train": f"{name}_train", "valid": f"{name}_valid",
                    "configs": configs, "epochs": workload["epochs"]}
            print(f"{name}: (a) export, one process ...", flush=True)
            a_time, (a,) = run_processes([dict(base, indexes=list(range(len(configs))), threads=None)])
            print(f"{name}: (b) {S} processes, a copy of the data each ...", flush=True)
            b_time, b = run_processes([dict(base, indexes=list(range(i, len(configs), S)),
                                            threads=max(1, cores // S)) for i in range(S)])
            print(f"{name}: (c) madlib_mop ...", flush=True)
            c = run_mop(conn, dsn, name.lower(), workload, S)
            result = {"train_rows": train_rows, "valid_rows": valid_rows, "a": {"makespan": a_time, **a},
                      "b": {"makespan": b_time, "processes": b}, "c": c}
            if name != "W2":
                print(f"{name}: (d) single-thread time of each configuration ...", flush=True)
                singles = []
                for i in range(len(configs)):
                    _, (d,) = run_processes([dict(base, indexes=[i], threads=1)])
                    singles.append(d["results"][i]["seconds"])
                result["d"] = {"single_thread_seconds": singles,
                               "bound": max(sum(singles) / S, max(singles))}
            report["workloads"][name] = result
            print_workload(name, workload, result, S)
        conn.execute(f"DROP SCHEMA {SCHEMA} CASCADE")
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "mop.json").write_text(json.dumps(report, indent=2, default=str))
    plot(report)


def print_workload(name: str, workload: dict, r: dict, S: int) -> None:
    a, b, c = r["a"]["makespan"], r["b"]["makespan"], r["c"]["makespan"]
    d = r.get("d", {}).get("bound")
    data_bytes = r["b"]["processes"][0]["data_bytes"]
    print(f"\n### {name}: {r['train_rows']:,} training rows, {len(workload['configs'])} configurations, "
          f"{workload['epochs']} epochs, S = {S}\n")
    print("| method | makespan s | MOP speed-up vs it | peak memory per process MB | data bytes copied | model bytes moved |")
    print("|---|---:|---:|---:|---:|---:|")
    print(f"| (a) export, sequential | {a:.1f} | {a / c:.2f}x | {r['a']['peak_rss_mb']:.0f} | {data_bytes:,} | 0 |")
    print(f"| (b) task parallel, {S} processes | {b:.1f} | {b / c:.2f}x | "
          f"{max(p['peak_rss_mb'] for p in r['b']['processes']):.0f} | {S * data_bytes:,} | 0 |")
    print(f"| (c) madlib_mop, {S} segments | {c:.1f} | 1.00x | {r['c']['peak_rss_mb'] or 0:.0f} | 0 | "
          f"{r['c']['state_bytes_moved']:,} |")
    if d is not None:
        print(f"| (d) lower bound | {d:.1f} | {d / c:.2f}x | | | |")
    print("\nvalidation accuracy per configuration:\n")
    print("| config | hidden | lr | batch | (a) | (b) | (c) madlib_mop |")
    print("|---:|---|---:|---:|---:|---:|---:|")
    b_results = {int(k): v for p in r["b"]["processes"] for k, v in p["results"].items()}
    for i, config in enumerate(workload["configs"]):
        print(f"| {i + 1} | {config['hidden']} | {config['lr']} | {config['batch']} | "
              f"{r['a']['results'][i]['accuracy']:.4f} | {b_results[i]['accuracy']:.4f} | "
              f"{r['c']['accuracy'][i + 1]:.4f} |")
    parts = r["c"]["breakdown"]
    total = parts["total"]
    print("\nsub-epoch time, summed over all sub-epochs (madlib_mop):\n")
    print("| part | seconds | share |")
    print("|---|---:|---:|")
    for part in ("setup", "read", "restore", "train", "other", "save"):
        print(f"| {part} | {parts[part]:.2f} | {100 * parts[part] / total:.1f}% |")
    print(f"| bookkeeping (makespan x S - sub-epoch time) | {c * S - total:.2f} | "
          f"{100 * (c * S - total) / (c * S):.1f}% of makespan x S |")


def plot(report: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    for name, r in report["workloads"].items():
        figure, axis = plt.subplots(figsize=(10, 3 + 0.2 * len(r["c"]["accuracy"])))
        for visit in r["c"]["visits"]:
            axis.barh(visit["segment"], visit["end"] - visit["start"], left=visit["start"],
                      color=plt.cm.tab10(visit["mst_key"] % 10), edgecolor="black", linewidth=0.3)
            axis.text((visit["start"] + visit["end"]) / 2, visit["segment"], str(visit["mst_key"]),
                      ha="center", va="center", fontsize=6)
        axis.set_xlabel("seconds since the job started (training sub-epochs; validation passes not drawn)")
        axis.set_ylabel("segment")
        axis.set_yticks(sorted({v["segment"] for v in r["c"]["visits"]}))
        axis.set_title(f"{name}: which model trained on which segment, when (madlib_mop)")
        figure.tight_layout()
        figure.savefig(RESULTS / f"{name.lower()}_timeline.png", dpi=100)
        plt.close(figure)
        figure, axis = plt.subplots(figsize=(8, 5))
        for i, _ in enumerate(r["c"]["accuracy"]):
            color = plt.cm.tab10(i % 10)
            axis.plot(r["a"]["results"][i]["loss_per_epoch"], "-", color=color, alpha=0.6)
            axis.plot(r["c"]["loss_per_epoch"][i + 1], "--", color=color)
        axis.set_xlabel("epoch")
        axis.set_ylabel("training loss")
        axis.set_yscale("log")
        axis.set_title(f"{name}: learning curves, (a) export solid, (c) madlib_mop dashed")
        figure.tight_layout()
        figure.savefig(RESULTS / f"{name.lower()}_learning_curves.png", dpi=100)
        plt.close(figure)


if __name__ == "__main__":
    main()
