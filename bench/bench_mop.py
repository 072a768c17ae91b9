"""Model selection by model hopping against what users would do instead, side by side.

Workloads (fixed seeds):
  IRIS  MADlib's walkthrough: scikit-learn's iris (120 rows to train on, 30 held out), 12 configurations (2 MLPs x 3
      learning rates x batch 4 and 8), 10 iterations of 1 epoch, validated after the last.
  W1  250,000 rows x 64 generated features (200,000 to train on, 50,000 held out), 10 classes; 8 MLPs (2 architectures x 2 learning
      rates x 2 batch sizes), 5 epochs, S segments.
  W2  scikit-learn's digits (64 pixels, 10 classes), 8 MLPs, 10 epochs, 20% held out.
  W3  100,000 generated rows (80,000 to train on); 8 MLPs whose per-epoch cost differs by more than 4x (a small and a
      large network, batch 32 and 512): heterogeneous, to show the barrier-free scheduler.
  W4  CIFAR-10-shaped images (32x32x3, 10 classes; `demo.cifar_shaped_images`, generated: nothing can be downloaded),
      50,000 rows (40,000 to train on); 8 small ResNets (residual blocks, BatchNormalization, Dropout; 0.27-2.7 M
      parameters: 2 widths x 2 dense heads x 2 learning rates), 2 epochs.  Its tables are read into NumPy with a
      binary loader (as Python lists, 40,000 images would take 4 GB per process).
  W5  W1's data; 64 configurations of one MLP (64 hidden units; 4 learning rates x batch 64 to 512 x 4 values
      of Adam's beta_1), 5 epochs: many small models, 4 fusion classes of 16.  Only (b''), (c), (c warm) and
      (c fused) run: (a) would take an hour.

Compared in one run, on the same data and configurations:
  (a) export: read the table into NumPy with psycopg, train the configurations one after
      another in one process with Keras' fit and TensorFlow's default threading; the
      makespan is the process's whole life (TensorFlow's import, the read, the training);
  (a') the same with madlib_mop's training loop (`training.Program`, one traced function per
      pass, fit's minibatches) instead of fit: what the loop gains, without hopping;
  (b) task parallel: S processes, each with its own full copy of the data, training its
      share of the configurations (cores / S threads each), whole lives;
  (b') the same with one thread per process, counting training alone (data in memory,
      TensorFlow imported): the slowest process's sum of fit times; (b'') the same with
      madlib_mop's loop instead of fit: what hopping costs against the same loop and threads;
      the configurations are split over the processes by estimated cost;
  (c) madlib_mop: madlib_keras_fit_multiple_model over S segments (packing timed apart), in
      a new session (its workers import TensorFlow), (c warm) the same job again in that
      session, whose workers have trained before, and (c role) the same job in another new
      session of the role, which adopts the sessions the first one left idle, and (c prewarm)
      the same job in a new session on sessions the server opened for the role
      (madlib_mop.prewarm_roles; TensorFlow imported, the programs of the role's latest
      job, (c role)'s, traced); these four with madlib_mop.fuse_models at its default
      (auto: fused where it pays), and (c fused) the same job with fuse_models = on, run
      twice in the session of (c warm), the second timed (the first traces the fused
      programs);
  (d) for W1, W3 and W4, the lower bound max(sum of single-thread times / S, longest one).

    .venv/bin/python bench/bench_mop.py [--segments 2] [--workloads IRIS,W1,W2,W3,W4,W5]
        [--arms all|sessions|fused]
Prints markdown tables; writes bench/results/mop.json and PNG plots.
"""

from __future__ import annotations

import argparse
import contextlib
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
from psycopg import sql

from madlib_mop.tools.demo import ensure_extension
from madlib_mop.tools.embedded import configured_dsn

SCHEMA = "madlib_mop_bench"
RESULTS = Path(__file__).resolve().parent / "results"


# ---- workloads ------------------------------------------------------------------------------

def _configs(hidden_sizes, rates, batches):
    return [{"hidden": list(h), "lr": lr, "batch": b}
            for h in hidden_sizes for lr in rates for b in batches]


# epochs: passes over the data (num_iterations x fit epochs); frequency: validation every so
# many iterations.
WORKLOADS = {
    "IRIS": {"data": "iris", "epochs": 10, "iterations": 10, "frequency": 10,
             "configs": _configs([(10, 10), (10, 10, 10)], [0.1, 0.01, 0.001], [4, 8])},
    "W1": {"data": 250_000, "epochs": 5, "iterations": 1, "frequency": 1,
           "configs": _configs([(64,), (128, 64)], [0.001, 0.01], [64, 256])},
    "W2": {"data": "digits", "epochs": 10, "iterations": 1, "frequency": 1,
           "configs": _configs([(32,), (64, 32)], [0.001, 0.01], [16, 64])},
    "W3": {"data": 100_000, "epochs": 3, "iterations": 1, "frequency": 1,
           "configs": _configs([(16,), (256, 256)], [0.001, 0.01], [32, 512])},
    # hidden: ("resnet", base filters, dense head units)
    # 64 configurations of one MLP (4 learning rates x 4 batch sizes x 4 values of Adam's
    # beta_1) on W1's data: many small models, 4 fusion classes of 16.  Only (b''), (c),
    # (c warm) and (c fused) run ("arms"): (a) would take an hour.
    "W5": {"data": 250_000, "epochs": 5, "iterations": 1, "frequency": 1, "arms": "fused",
           "configs": [dict(c, beta_1=beta) for c in _configs([(64,)], [0.001, 0.003, 0.01, 0.03],
                                                              [64, 128, 256, 512])
                       for beta in (0.9, 0.8, 0.95, 0.85)]},
    "W4": {"data": "cifar", "epochs": 2, "iterations": 2, "frequency": 1,
           "configs": _configs([("resnet", 8, 256), ("resnet", 8, 2560), ("resnet", 16, 128),
                                ("resnet", 16, 1280)], [0.001, 0.003], [64])},
}
BOUNDED = ("W1", "W3", "W4")  # the workloads whose lower bound (d) is measured
CIFAR_ROWS = 50_000


def adam(config: dict) -> str:
    """The configuration's optimizer as compile_params write it."""
    beta = f", beta_1={config['beta_1']}" if "beta_1" in config else ""
    return f"Adam(learning_rate={config['lr']}{beta})"


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


def iris():
    """Shuffled once (the data set is sorted by class), so that the held-out 20% has every class."""
    from sklearn.datasets import load_iris

    data = load_iris()
    order = np.random.default_rng(0).permutation(len(data.target))
    return data.data[order].astype(np.float32), data.target[order]


def cifar():
    from madlib_mop.tools.demo import cifar_shaped_images

    x, y = cifar_shaped_images(CIFAR_ROWS, 0)
    return x.reshape(len(x), -1), y


def workload_data(workload: dict):
    kind = workload["data"]
    return {"iris": iris, "digits": digits, "cifar": cifar}.get(kind, lambda: generated(kind))()


def architecture(hidden: list, inputs: int, classes: int) -> str:
    import keras

    if hidden[0] == "resnet":
        return resnet(hidden[1], hidden[2], inputs, classes)
    layers = [keras.Input((inputs,))] + [keras.layers.Dense(h, activation="relu") for h in hidden]
    return keras.Sequential(layers + [keras.layers.Dense(classes, activation="softmax")]).to_json()


def resnet(filters: int, head: int, inputs: int, classes: int) -> str:
    """A small ResNet on a flat image row: a stride-2 stem, a residual block, a stride-2
    widening, a second residual block (BatchNormalization after every convolution), then
    Dropout and a dense head."""
    import keras
    from keras import layers

    def conv(x, width, strides=1):
        x = layers.Conv2D(width, 3, strides=strides, padding="same", use_bias=False)(x)
        return layers.BatchNormalization()(x)

    def block(x, width):
        y = conv(layers.Activation("relu")(conv(x, width)), width)
        return layers.Activation("relu")(layers.Add()([x, y]))

    image = keras.Input((inputs,))
    x = layers.Reshape((32, 32, 3))(image)
    x = block(layers.Activation("relu")(conv(x, filters, 2)), filters)
    x = block(layers.Activation("relu")(conv(x, 2 * filters, 2)), 2 * filters)
    x = layers.Dense(head, activation="relu")(layers.Dropout(0.3)(layers.Flatten()(x)))
    return keras.Model(image, layers.Dense(classes, activation="softmax")(x)).to_json()


def width(hidden: list) -> float:
    """Multiply-adds per row and layer pass, roughly: what a configuration's step costs."""
    if hidden[0] == "resnet":
        filters, head = hidden[1], hidden[2]
        return 10_368 * filters ** 2 + 128 * filters * head + 10 * head
    return 64 + sum(hidden) + 10


# ---- (a), (b), (d): training in plain processes --------------------------------------------

def _set_threads(threads: int | None) -> None:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf

    if threads:
        tf.config.threading.set_intra_op_parallelism_threads(threads)
        tf.config.threading.set_inter_op_parallelism_threads(1)


def _read_table(dsn: str, table: str, binary: bool = False):
    """What an analyst does first: the table into NumPy, over the network protocol (with
    `binary`, each real[] straight into a NumPy array)."""
    with psycopg.connect(dsn) as conn:
        if binary:
            conn.adapters.register_loader(psycopg.postgres.types["float4"].array_oid, Float4ArrayToNumpy)
        rows = conn.execute(f"SELECT x, y FROM {SCHEMA}.{table} ORDER BY id", binary=binary).fetchall()
    return (np.asarray([r[0] for r in rows], dtype=np.float32),
            np.asarray([r[1] for r in rows], dtype=np.int64))


class Float4ArrayToNumpy(psycopg.adapt.Loader):
    """A one-dimensional real[] without NULLs, from PostgreSQL's binary array format (a
    header, then each element as its length and its big-endian value), as float32."""

    format = psycopg.pq.Format.BINARY

    def load(self, data) -> np.ndarray:
        ndim = int.from_bytes(bytes(data[:4]), "big")
        header = 12 + 8 * ndim
        elements = np.frombuffer(data, dtype=[("length", ">i4"), ("value", ">f4")], offset=header)
        return elements["value"].astype(np.float32)


def _train(config: dict, epochs: int, x, y, x_valid, y_valid, loop: str) -> dict:
    """One configuration for `epochs` passes, rows shuffled every pass; `loop` "fit" is
    Keras' fit, "program" madlib_mop's traced loop over the same minibatches."""
    import keras

    from madlib_mop.runtime import training

    classes = int(max(y.max(), y_valid.max())) + 1
    onehot, onehot_valid = (np.eye(classes, dtype=np.float32)[v] for v in (y, y_valid))
    keras.utils.set_random_seed(0)
    arch = architecture(config["hidden"], x.shape[1], classes)
    started = time.perf_counter()
    if loop == "fit":
        model = keras.models.model_from_json(arch)
        model.compile(optimizer=keras.optimizers.Adam(learning_rate=config["lr"],
                                                      beta_1=config.get("beta_1", 0.9)),
                      loss="categorical_crossentropy", metrics=["accuracy"])
        history = model.fit(x, onehot, batch_size=config["batch"], epochs=epochs, shuffle=True,
                            verbose=0)
        losses = [float(v) for v in history.history["loss"]]
    else:
        spec = training.ModelSpec(0, arch, f"optimizer='{adam(config)}',"
                                  "loss='categorical_crossentropy',metrics=['accuracy']", "")
        program = training.Program(training.compiled_model(spec, 0))
        model, losses, rng = program.model, [], np.random.default_rng(0)
        for _ in range(epochs):
            order = rng.permutation(len(x))
            losses.append(program.train(x[order], onehot[order], config["batch"])["loss"])
    seconds = time.perf_counter() - started
    accuracy = model.evaluate(x_valid, onehot_valid, verbose=0, return_dict=True)["accuracy"]
    return {"seconds": seconds, "accuracy": float(accuracy), "loss_per_epoch": losses}


def _process(job: dict) -> dict:
    """One process: import TensorFlow, read the data, train configurations; report times
    and peak memory."""
    started = time.perf_counter()
    _set_threads(job["threads"])
    import keras  # noqa: F401  (part of the process's start, as for any Keras script)

    imported = time.perf_counter()
    x, y = _read_table(job["dsn"], job["train"], job.get("binary", False))
    x_valid, y_valid = _read_table(job["dsn"], job["valid"], job.get("binary", False))
    read = time.perf_counter() - imported
    results = {i: _train(job["configs"][i], job["epochs"], x, y, x_valid, y_valid,
                         job.get("loop", "fit")) for i in job["indexes"]}
    return {"import_seconds": imported - started, "read_seconds": read, "results": results,
            "data_bytes": x.nbytes + y.nbytes,
            "train_seconds": sum(r["seconds"] for r in results.values()),
            "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def balanced_shares(configs: list[dict], rows: int, processes: int) -> list[list[int]]:
    """The configurations split over processes by estimated cost (steps x the network's
    width), longest first to the least loaded: a fair task-parallel baseline."""
    def cost(config: dict) -> float:
        return rows / config["batch"] * width(config["hidden"])

    loads, shares = [0.0] * processes, [[] for _ in range(processes)]
    for index in sorted(range(len(configs)), key=lambda i: -cost(configs[i])):
        target = loads.index(min(loads))
        shares[target].append(index)
        loads[target] += cost(configs[index])
    return [sorted(share) for share in shares]


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
                    rss = int(next(line for line in status.splitlines() if line.startswith("VmRSS")).split()[1])
                    peaks[pid] = max(peaks.get(pid, 0), rss / 1024)
                except (OSError, StopIteration):
                    pass
            time.sleep(0.2)


def run_mop(dsn: str, name: str, workload: dict, segments: int, prewarm: bool = True,
            fuse: bool = False, role: bool = True) -> dict:
    """The job in a new session, then the same job again in that session (output _fit2):
    the second finds the session's workers warm; then in new sessions of the role, on its
    idle sessions and (`prewarm`) on sessions the server kept ready."""
    with _session(dsn) as conn:
        conn.execute(f"SELECT training_preprocessor_dl('{name}_train', '{name}_packed', 'y', 'x', "
                     f"distribution_rules => '{segments}')")
        conn.execute(f"SELECT validation_preprocessor_dl('{name}_valid', '{name}_vpacked', 'y', 'x', "
                     f"'{name}_packed')")
    with _session(dsn) as conn:
        end_idle_workers(conn)  # (c) starts cold: no idle session of this role to adopt
        result = _run_fit(conn, dsn, name, "fit", workload, segments)
        warm = _run_fit(conn, dsn, name, "fit2", workload, segments)
        fused = None
        if fuse:
            conn.execute("SET madlib_mop.fuse_models = on")
            first = _run_fit(conn, dsn, name, "fit5", workload, segments)  # traces the fused programs
            fused = _run_fit(conn, dsn, name, "fit6", workload, segments)
            fused["first_makespan"] = first["makespan"]  # (tracing its fused programs included)
            conn.execute("RESET madlib_mop.fuse_models")
    runs = {"warm": warm} | ({"fused": fused} if fused else {})
    if role:
        with _session(dsn) as conn:  # the role's idle sessions, adopted by another session
            runs["role"] = _run_fit(conn, dsn, name, "fit3", workload, segments)
    with prewarmed(dsn, segments, prewarm) as ready:  # sessions the server opened for the role
        if ready:
            with _session(dsn) as conn:
                runs["prewarm"] = _run_fit(conn, dsn, name, "fit4", workload, segments)
    for key, run in runs.items():
        result[key] = {k: run[k] for k in ("makespan", "first_visit_after", "breakdown", "hop_gap_ms",
                                           "traced_visits", "accuracy", "fused_visits", "visit_count")
                       if k in run} | {k: run[k] for k in ("first_makespan",) if k in run}
        result[key]["same_weights"] = run["weights_md5"] == result["weights_md5"]
    return result


@contextlib.contextmanager
def prewarmed(dsn: str, segments: int, wanted: bool = True, timeout: float = 180.0):
    """The role named in madlib_mop.prewarm_roles for this database (sessions warmed for
    `segments` segments), its other idle sessions ended: yields True once the server has
    opened one per segment (False where the library is not preloaded, or not `wanted`);
    the settings are reset after."""
    if not wanted:
        yield False
        return
    with _session(dsn) as conn:
        if conn.execute("SELECT to_regproc('_mop_pool_shared') IS NULL").fetchone()[0]:
            print("(c prewarm) skipped: this version of the extension keeps no sessions ready", flush=True)
            yield False
            return
        if not conn.execute("SELECT _mop_pool_shared()").fetchone()[0]:
            print("(c prewarm) skipped: the server does not preload the library", flush=True)
            yield False
            return
        role, database = conn.execute("SELECT current_user, current_database()").fetchone()
        entry = f"{role}@{database}"
        for name, value in (("prewarm_roles", entry), ("prewarm_sessions", segments),
                            ("segments", segments)):
            conn.execute(sql.SQL("ALTER SYSTEM SET {} = {}").format(
                sql.Identifier(f"madlib_mop.{name}"), sql.Literal(str(value))))
        conn.execute("SELECT pg_reload_conf()")
        try:
            end_idle_workers(conn)
            deadline = time.monotonic() + timeout
            while conn.execute("SELECT count(*) FROM worker_sessions WHERE role = current_user "
                               "AND state = 'idle'").fetchone()[0] < segments:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"no prewarmed sessions for {entry} after {timeout:.0f} s")
                time.sleep(0.5)
            yield True
        finally:
            for name in ("prewarm_roles", "prewarm_sessions", "segments"):
                conn.execute(sql.SQL("ALTER SYSTEM RESET {}").format(sql.Identifier(f"madlib_mop.{name}")))
            conn.execute("SELECT pg_reload_conf()")


def fresh_schema(conn) -> str:
    """The benchmarks' schema, made anew, first on the search path, the extension's after it
    (its schema returned)."""
    schema = ensure_extension(conn)
    conn.execute(f"DROP SCHEMA IF EXISTS {SCHEMA} CASCADE")
    conn.execute(f"CREATE SCHEMA {SCHEMA}")
    conn.execute(f"SET search_path = {SCHEMA}, {schema}")
    return schema


def end_idle_workers(conn) -> None:
    """End this role's idle worker sessions (kept for its next call) and wait until gone."""
    idle = "FROM pg_stat_activity WHERE usename = current_user AND application_name = 'madlib_mop idle worker'"
    conn.execute(f"SELECT pg_terminate_backend(pid) {idle}")
    while conn.execute(f"SELECT count(*) {idle}").fetchone()[0]:
        time.sleep(0.1)


def _session(dsn: str):
    conn = psycopg.connect(dsn, autocommit=True)
    schema = conn.execute("SELECT extnamespace::regnamespace::text FROM pg_extension "
                          "WHERE extname = 'madlib_mop'").fetchone()[0]
    conn.execute(f"SET search_path = {SCHEMA}, {schema}")
    conn.execute("SET jit = off")
    return conn


def _run_fit(conn, dsn: str, name: str, out: str, workload: dict, segments: int) -> dict:
    started = time.perf_counter()
    called_at = time.time()
    peaks: dict = {}
    stop = threading.Event()
    sampler = threading.Thread(target=_sample_worker_memory, args=(dsn, stop, peaks), daemon=True)
    sampler.start()
    conn.execute(f"SELECT madlib_keras_fit_multiple_model('{name}_packed', '{name}_{out}', "
                 f"'{name}_mst', {workload['iterations']}, FALSE, '{name}_vpacked', "
                 f"{workload['frequency']})")
    makespan = time.perf_counter() - started
    stop.set()
    sampler.join()
    name = f"{name}_{out}"
    info = conn.execute(f"SELECT mst_key, validation_metrics_final FROM {name}_info "
                        "ORDER BY mst_key").fetchall()
    visits = conn.execute(f"SELECT mst_key, step, segment, result FROM {name}_mop_visits "
                          "ORDER BY mst_key, step").fetchall()
    state_bytes = dict(conn.execute(f"SELECT mst_key, octet_length(state) FROM {name}_mop_state "
                                    "WHERE step = 0").fetchall())
    started_at = conn.execute(f"SELECT extract(epoch FROM started_at) FROM jobs WHERE "
                              f"model_output_table = '{SCHEMA}.{name}' ORDER BY job_id DESC "
                              "LIMIT 1").fetchone()[0]
    weights_md5 = conn.execute(f"SELECT string_agg(md5(model_weights), ',' ORDER BY mst_key) "
                               f"FROM {name}").fetchone()[0]
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
            "loss_per_epoch": curves, "weights_md5": weights_md5,
            "first_visit_after": min(r["finished_at"] - r["seconds"]["total"] for *_, r in visits)
            - called_at,
            **hop_costs(visits),
            "peak_rss_mb": max(peaks.values()) if peaks else None, "breakdown": parts,
            # visits that traced a function (0 where the workers had the programs ready)
            "traced_visits": sum(1 for *_, r in visits if r.get("traced")),
            # visits a fused call made (each of its models records one)
            "fused_visits": sum(1 for *_, r in visits if r["seconds"].get("fused")), "visit_count": len(visits),
            "visits": [{"mst_key": k, "segment": s,
                        "start": r["finished_at"] - r["seconds"]["total"] - float(started_at),
                        "end": r["finished_at"] - float(started_at)} for k, _, s, r in visits]}


def hop_costs(visits: list) -> dict:
    """The median gap on a segment between the end of one visit and the start of the next:
    the result's trip back, its recording, dispatching, the call's trip out (a hop's fixed
    cost against rows is measured apart: HOPS)."""
    gaps = []
    by_segment: dict = {}
    for *_, segment, result in visits:
        by_segment.setdefault(segment, []).append(
            (result["finished_at"] - result["seconds"]["total"], result["finished_at"]))
    for spans in by_segment.values():
        spans.sort()
        gaps += [b[0] - a[1] for a, b in zip(spans, spans[1:])]
    return {"hop_gap_ms": 1000 * float(np.median(gaps)) if gaps else float("nan")}


def load_workload(conn, name: str, workload: dict) -> tuple[int, int]:
    x, y = workload_data(workload)
    classes = int(y.max()) + 1
    cut = int(len(x) * 0.8)
    for table, (xs, ys) in ((f"{name}_train", (x[:cut], y[:cut])), (f"{name}_valid", (x[cut:], y[cut:]))):
        conn.execute(f"CREATE TABLE {table} (id integer, x real[], y integer)")
        with conn.cursor().copy(f"COPY {table} (id, x, y) FROM STDIN") as copy:
            for i, (row, label) in enumerate(zip(xs, ys)):
                copy.write_row((i, row.tolist(), int(label)))
        conn.execute(f"VACUUM ANALYZE {table}")
    model_ids: dict[tuple, int] = {}  # one architecture per network, as a user loads them
    for config in workload["configs"]:
        hidden = tuple(config["hidden"])
        if hidden not in model_ids:
            model_ids[hidden] = len(model_ids) + 1  # load_keras_model numbers them from 1
            conn.execute("SELECT load_keras_model(%s, %s::json)",
                         (f"{name}_arch", architecture(config["hidden"], x.shape[1], classes)))
    conn.execute(f"CREATE TABLE {name}_mst (mst_key serial PRIMARY KEY, model_id integer, "
                 "compile_params varchar, fit_params varchar)")
    conn.execute(f"CREATE TABLE {name}_mst_summary (model_arch_table varchar, object_table varchar)")
    conn.execute(f"INSERT INTO {name}_mst_summary VALUES ('{SCHEMA}.{name}_arch', NULL)")
    for config in workload["configs"]:
        conn.execute(f"INSERT INTO {name}_mst (model_id, compile_params, fit_params) VALUES (%s, %s, %s)", (
            model_ids[tuple(config["hidden"])], f"optimizer='{adam(config)}',loss='categorical_crossentropy',"
               "metrics=['accuracy']",
               f"batch_size={config['batch']},epochs={workload['epochs'] // workload['iterations']}"))
    return cut, len(x) - cut


def run_hops(dsn: str, segments: int) -> dict:
    """A hop's fixed cost: one MLP (64-32-10, batch 32) trained for 10 iterations on segments
    of 64 to 1024 rows, in one session (warm workers, after a first job that traces); the
    intercept of a sub-epoch's time against its rows is what a hop costs besides training
    on rows.  Three views: in the worker (restore, train, save), the call as the coordinator
    sees it (plus the round trip), and the time per hop from the first sub-epoch's start to
    the last one's end (plus the coordinator's recording and dispatching; one model: one
    segment works at a time)."""
    sizes = (64, 128, 256, 512, 1024)
    points = []
    with _session(dsn) as conn:
        conn.execute("SELECT load_keras_model('hops_arch', %s::json)", (architecture([32], 64, 10),))
        conn.execute("CREATE TABLE hops_mst (mst_key serial PRIMARY KEY, model_id integer, "
                     "compile_params varchar, fit_params varchar)")
        conn.execute("CREATE TABLE hops_mst_summary (model_arch_table varchar, object_table varchar)")
        conn.execute(f"INSERT INTO hops_mst_summary VALUES ('{SCHEMA}.hops_arch', NULL)")
        conn.execute("INSERT INTO hops_mst (model_id, compile_params, fit_params) VALUES (1, "
                     "$$optimizer='Adam(learning_rate=0.01)',loss='categorical_crossentropy',"
                     "metrics=['accuracy']$$, 'batch_size=32,epochs=1')")
        x, y = generated(max(sizes) * segments, seed=7)
        conn.execute("CREATE TABLE hops_data (id integer, x real[], y integer)")
        with conn.cursor().copy("COPY hops_data FROM STDIN") as copy:
            for i, (row, label) in enumerate(zip(x, y)):
                copy.write_row((i, row.tolist(), int(label)))
        for n in (sizes[0],) + sizes:  # the first job traces; it is not measured
            table = f"hops_{n}"
            conn.execute(f"DROP TABLE IF EXISTS {table}, {table}_packed, {table}_packed_summary")
            for suffix in ("", "_summary", "_info", "_mop_models", "_mop_state", "_mop_visits",
                           "_mop_evals"):
                conn.execute(f"DROP TABLE IF EXISTS {table}_fit{suffix}")
            conn.execute(f"CREATE TABLE {table} AS SELECT * FROM hops_data WHERE id < {n * segments}")
            conn.execute(f"SELECT training_preprocessor_dl('{table}', '{table}_packed', 'y', 'x', "
                         f"distribution_rules => '{segments}')")
            started = time.perf_counter()
            conn.execute(f"SELECT madlib_keras_fit_multiple_model('{table}_packed', '{table}_fit', "
                         "'hops_mst', 10)")
            makespan = time.perf_counter() - started
            visits = [r for (r,) in conn.execute(f"SELECT result FROM {table}_fit_mop_visits "
                                                 "ORDER BY step").fetchall()]
            first = min(v["finished_at"] - v["seconds"]["total"] for v in visits)
            points.append({"rows": n, "makespan": makespan, "hops": len(visits),
                           "span": max(v["finished_at"] for v in visits) - first,
                           "worker_ms": 1000 * float(np.median([v["seconds"]["total"] for v in visits])),
                           "call_ms": 1000 * float(np.median([v["seconds"]["call"] for v in visits]))})
    points = points[1:]
    rows = np.array([p["rows"] for p in points], dtype=float)

    def intercept(values) -> float:
        return float(np.polyfit(rows, np.array(values, dtype=float), 1)[1])

    return {"points": points,
            "worker_intercept_ms": intercept([p["worker_ms"] for p in points]),
            "call_intercept_ms": intercept([p["call_ms"] for p in points]),
            "makespan_per_hop_intercept_ms": intercept([1000 * p["span"] / p["hops"]
                                                        for p in points])}


def print_hops(h: dict) -> None:
    print("\n### Fixed cost per hop (one model, 10 iterations, warm session)\n")
    print("| rows per segment | sub-epochs | sub-epoch in the worker, median ms | the call, median ms | "
          "first start to last end / sub-epochs ms |")
    print("|---:|---:|---:|---:|---:|")
    for p in h["points"]:
        print(f"| {p['rows']:,} | {p['hops']} | {p['worker_ms']:.1f} | {p['call_ms']:.1f} | "
              f"{1000 * p['span'] / p['hops']:.1f} |")
    print(f"| intercept (0 rows) | | {h['worker_intercept_ms']:.1f} | {h['call_intercept_ms']:.1f} | "
          f"{h['makespan_per_hop_intercept_ms']:.1f} |")


# ---- the run --------------------------------------------------------------------------------

def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--segments", type=int, default=2)
    parser.add_argument("--workloads", default="HOPS,IRIS,W1,W2,W3,W4,W5")
    parser.add_argument("--arms", choices=("all", "sessions", "fused"), default="all",
                        help="sessions: (b''), (c), (c warm), (c role) and (c prewarm) alone (W4 in 20 "
                             "minutes instead of 41); fused: (b''), (c), (c warm) and (c fused) alone, "
                             "as W5 always runs")
    args = parser.parse_args()
    S, cores = args.segments, os.cpu_count() or 1
    dsn = configured_dsn()
    report = {"when": datetime.now(timezone.utc).isoformat(), "segments": S, "cores": cores,
              "workloads": {}}
    with psycopg.connect(dsn, autocommit=True) as conn:
        fresh_schema(conn)
        for name in args.workloads.split(","):
            if name == "HOPS":
                print("\n## HOPS: a hop's fixed cost ...", flush=True)
                report["hops"] = run_hops(dsn, S)
                print_hops(report["hops"])
                continue
            workload = WORKLOADS[name]
            print(f"\n## {name}: loading ...", flush=True)
            train_rows, valid_rows = load_workload(conn, name, workload)
            configs = workload["configs"]
            base = {"dsn": dsn, "train": f"{name}_train", "valid": f"{name}_valid",
                    "configs": configs, "epochs": workload["epochs"],
                    "binary": workload["data"] == "cifar"}
            everything = list(range(len(configs)))
            shares = balanced_shares(configs, train_rows, S)
            if workload.get("arms") == "fused" or args.arms == "fused":
                report["workloads"][name] = run_fused_arms(dsn, name, workload, base, shares, S)
                continue
            if args.arms == "sessions":
                report["workloads"][name] = run_session_arms(dsn, name, workload, base, shares, S)
                continue
            print(f"{name}: (a) export, one process, Keras' fit ...", flush=True)
            a_time, (a,) = run_processes([dict(base, indexes=everything, threads=None)])
            print(f"{name}: (a') export, one process, madlib_mop's loop ...", flush=True)
            a2_time, (a2,) = run_processes([dict(base, indexes=everything, threads=None,
                                                 loop="program")])
            print(f"{name}: (b) {S} processes, a copy of the data each ...", flush=True)
            b_time, b = run_processes([dict(base, indexes=share, threads=max(1, cores // S))
                                       for share in shares])
            print(f"{name}: (b') {S} processes, one thread each ...", flush=True)
            _, b2 = run_processes([dict(base, indexes=share, threads=1) for share in shares])
            print(f"{name}: (b'') {S} processes, one thread each, madlib_mop's loop ...", flush=True)
            _, b3 = run_processes([dict(base, indexes=share, threads=1, loop="program")
                                   for share in shares])
            print(f"{name}: (c) madlib_mop, then the same job in the same session ...", flush=True)
            c = run_mop(dsn, name.lower(), workload, S, fuse=True)
            result = {"train_rows": train_rows, "valid_rows": valid_rows,
                      "a": {"makespan": a_time, **a}, "a2": {"makespan": a2_time, **a2},
                      "b": {"makespan": b_time, "processes": b},
                      "b2": {"makespan": max(p["train_seconds"] for p in b2), "processes": b2},
                      "b3": {"makespan": max(p["train_seconds"] for p in b3), "processes": b3},
                      "c": c}
            if name in BOUNDED:
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
    print_summary(report)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "mop.json").write_text(json.dumps(report, indent=2, default=str))
    plot(report)


def run_fused_arms(dsn: str, name: str, workload: dict, base: dict, shares: list, S: int) -> dict:
    """(b''), then (c), (c warm) and (c fused) (fuse_models = on, its second run timed)."""
    print(f"{name}: (b'') {S} processes, one thread each, madlib_mop's loop ...", flush=True)
    _, b3 = run_processes([dict(base, indexes=share, threads=1, loop="program") for share in shares])
    print(f"{name}: (c) madlib_mop, then the same job in the same session, then fused ...", flush=True)
    c = run_mop(dsn, name.lower(), workload, S, prewarm=False, fuse=True, role=False)
    b3_makespan = max(p["train_seconds"] for p in b3)
    accuracy = {int(k): v["accuracy"] for p in b3 for k, v in p["results"].items()}
    fused_accuracy = c["fused"].pop("accuracy")
    print(f"\n### {name}: {len(workload['configs'])} configurations, {workload['epochs']} epochs, S = {S}\n")
    print("| method | makespan s | / (b'') |")
    print("|---|---:|---:|")
    for label, seconds in (("(b'') task parallel, madlib_mop's loop", b3_makespan), ("(c)", c["makespan"]),
                           ("(c warm)", c["warm"]["makespan"]), ("(c fused)", c["fused"]["makespan"]),
                           ("(c fused), its first run, which traces its fused programs", c["fused"]["first_makespan"])):
        print(f"| {label} | {seconds:.1f} | {seconds / b3_makespan:.2f} |")
    gaps = [abs(fused_accuracy[k] - c["accuracy"][k]) for k in c["accuracy"]]
    print(f"\nvalidation accuracy: mean (b'') {np.mean(list(accuracy.values())):.4f}, (c) "
          f"{np.mean(list(c['accuracy'].values())):.4f}, (c fused) {np.mean(list(fused_accuracy.values())):.4f}; "
          f"largest difference of a configuration's, fused against (c): {100 * max(gaps):.2f} points; "
          f"fused visits {c['fused']['fused_visits']} of {c['fused']['visit_count']}")
    return {"b3": {"makespan": b3_makespan, "processes": b3}, "c": c}


def run_session_arms(dsn: str, name: str, workload: dict, base: dict, shares: list, S: int) -> dict:
    """(b''), then (c), (c warm), (c role) and (c prewarm): what a session's start costs."""
    print(f"{name}: (b'') {S} processes, one thread each, madlib_mop's loop ...", flush=True)
    _, b3 = run_processes([dict(base, indexes=share, threads=1, loop="program") for share in shares])
    print(f"{name}: (c) madlib_mop in a new session, warm, role, prewarm ...", flush=True)
    c = run_mop(dsn, name.lower(), workload, S)
    b3_makespan = max(p["train_seconds"] for p in b3)
    print(f"\n### {name}: {len(workload['configs'])} configurations, {workload['epochs']} epochs, S = {S}\n")
    print("| method | makespan s | / (b'') | first sub-epoch after the call s | visits that traced | weights |")
    print("|---|---:|---:|---:|---:|---|")
    print(f"| (b'') task parallel, madlib_mop's loop | {b3_makespan:.1f} | 1.00 | | | |")
    for label, run in (("(c)", c), *((f"(c {k})", c[k]) for k in ("warm", "role", "prewarm") if k in c)):
        same = "" if run is c else ("bitwise equal to (c)'s" if run["same_weights"] else "DIFFERENT")
        print(f"| {label} | {run['makespan']:.1f} | {run['makespan'] / b3_makespan:.2f} | "
              f"{run['first_visit_after']:.2f} | {run['traced_visits']} | {same} |")
    return {"b3": {"makespan": b3_makespan, "processes": b3}, "c": c}


def print_workload(name: str, workload: dict, r: dict, S: int) -> None:
    c, warm = r["c"]["makespan"], r["c"]["warm"]["makespan"]
    d = r.get("d", {}).get("bound")
    data_bytes = r["b"]["processes"][0]["data_bytes"]
    print(f"\n### {name}: {r['train_rows']:,} training rows, {len(workload['configs'])} configurations, "
          f"{workload['epochs']} epochs, S = {S}\n")
    print("| method | makespan s | madlib_mop (c) speed-up vs it | (c warm) speed-up vs it | "
          "peak memory per process MB | data bytes copied | model bytes moved |")
    print("|---|---:|---:|---:|---:|---:|---:|")

    def row(label, seconds, memory, copied, moved="0"):
        print(f"| {label} | {seconds:.1f} | {seconds / c:.2f}x | {seconds / warm:.2f}x | "
              f"{memory:.0f} | {copied} | {moved} |")

    row("(a) export, sequential, fit", r["a"]["makespan"], r["a"]["peak_rss_mb"], f"{data_bytes:,}")
    row("(a') export, sequential, madlib_mop's loop", r["a2"]["makespan"], r["a2"]["peak_rss_mb"],
        f"{data_bytes:,}")
    row(f"(b) task parallel, {S} processes", r["b"]["makespan"],
        max(p["peak_rss_mb"] for p in r["b"]["processes"]), f"{S * data_bytes:,}")
    row("(b') task parallel, 1 thread each, training only", r["b2"]["makespan"],
        max(p["peak_rss_mb"] for p in r["b2"]["processes"]), f"{S * data_bytes:,}")
    row("(b'') the same with madlib_mop's loop", r["b3"]["makespan"],
        max(p["peak_rss_mb"] for p in r["b3"]["processes"]), f"{S * data_bytes:,}")
    row(f"(c) madlib_mop, {S} segments, new session", c, r["c"]["peak_rss_mb"] or 0, "0",
        f"{r['c']['state_bytes_moved']:,}")
    row("(c warm) the same job again in that session", warm, r["c"]["peak_rss_mb"] or 0, "0",
        f"{r['c']['state_bytes_moved']:,}")
    if "role" in r["c"]:
        row("(c role) again, in another new session of the role", r["c"]["role"]["makespan"],
            r["c"]["peak_rss_mb"] or 0, "0", f"{r['c']['state_bytes_moved']:,}")
    if "prewarm" in r["c"]:
        row("(c prewarm) again, in a new session, on sessions the server kept ready",
            r["c"]["prewarm"]["makespan"], r["c"]["peak_rss_mb"] or 0, "0",
            f"{r['c']['state_bytes_moved']:,}")
    if "fused" in r["c"]:
        row("(c fused) the same job with fuse_models = on, in that session", r["c"]["fused"]["makespan"],
            r["c"]["peak_rss_mb"] or 0, "0", f"{r['c']['state_bytes_moved']:,}")
    if d is not None:
        row("(d) lower bound", d, 0, "")
    print(f"\nimport TensorFlow in (a): {r['a']['import_seconds']:.1f} s; its training alone "
          f"{r['a']['train_seconds']:.1f} s, (a') {r['a2']['train_seconds']:.1f} s. "
          f"(c): first sub-epoch {r['c']['first_visit_after']:.2f} s after the call "
          f"(warm: {r['c']['warm']['first_visit_after']:.2f} s, role: "
          f"{r['c'].get('role', {}).get('first_visit_after', float('nan')):.2f} s, prewarm: "
          f"{r['c'].get('prewarm', {}).get('first_visit_after', float('nan')):.2f} s); median gap between two visits of "
          f"a segment {r['c']['hop_gap_ms']:.1f} ms (warm {r['c']['warm']['hop_gap_ms']:.1f} ms); "
          f"warm job's weights {'bitwise equal' if r['c']['warm']['same_weights'] else 'DIFFERENT'}"
          f"{'' if 'role' not in r['c'] else ', role job' + chr(39) + 's ' + ('bitwise equal' if r['c']['role']['same_weights'] else 'DIFFERENT')}"
          f"{'' if 'prewarm' not in r['c'] else ', prewarm job' + chr(39) + 's ' + ('bitwise equal' if r['c']['prewarm']['same_weights'] else 'DIFFERENT')}. "
          "Visits that traced a program: " + ", ".join(
              f"{label} {run['traced_visits']}" for label, run in
              (("new session", r["c"]), *((k, r["c"][k]) for k in ("warm", "role", "prewarm") if k in r["c"]))) + ".")
    print("\nvalidation accuracy per configuration:\n")
    print("| config | hidden | lr | batch | (a) | (a') | (b) | (c) madlib_mop |")
    print("|---:|---|---:|---:|---:|---:|---:|---:|")
    b_results = {int(k): v for p in r["b"]["processes"] for k, v in p["results"].items()}
    for i, config in enumerate(workload["configs"]):
        print(f"| {i + 1} | {config['hidden']} | {config['lr']} | {config['batch']} | "
              f"{r['a']['results'][i]['accuracy']:.4f} | {r['a2']['results'][i]['accuracy']:.4f} | "
              f"{b_results[i]['accuracy']:.4f} | {r['c']['accuracy'][i + 1]:.4f} |")
    parts = r["c"]["breakdown"]
    total = parts["total"]
    print("\nsub-epoch time, summed over all sub-epochs (madlib_mop, new session):\n")
    print("| part | seconds | share |")
    print("|---|---:|---:|")
    for part in ("setup", "read", "restore", "train", "other", "save"):
        print(f"| {part} | {parts[part]:.2f} | {100 * parts[part] / total:.1f}% |")
    print(f"| bookkeeping (makespan x S - sub-epoch time) | {c * S - total:.2f} | "
          f"{100 * (c * S - total) / (c * S):.1f}% of makespan x S |")


def print_summary(report: dict) -> None:
    """The targets' ratios, one line per workload."""
    print("\n### Summary (makespans in s, ratios from this run)\n")
    print("| workload | (a) | (a') | (b') | (b'') | (d) | (c) | (c warm) | (c role) | (c prewarm) | "
          "(c prewarm) / (b'') | (c fused) | (c fused) / (b'') | (c) / (a) | "
          "(c warm) / (a) | (c) / (a') | (c warm) / (a') | (c) / (b') | (c warm) / (b') | (c) / (b'') | "
          "(c warm) / (b'') | (c) / (d) | (c warm) / (d) |")
    print("|---|" + "---:|" * 22)
    for name, r in report["workloads"].items():
        if "a" not in r:  # (b'') and (c) arms only: fused ones, or sessions' ones
            b3, c = r["b3"]["makespan"], r["c"]
            seconds = {k: c[k]["makespan"] for k in ("role", "prewarm", "fused") if k in c}
            cells = [f"{seconds[k]:.1f}" if k in seconds else "" for k in ("role", "prewarm")]
            cells.append(f"{seconds['prewarm'] / b3:.2f}" if "prewarm" in seconds else "")
            cells += [f"{seconds['fused']:.1f}", f"{seconds['fused'] / b3:.2f}"] if "fused" in seconds else ["", ""]
            print(f"| {name} | | | | {b3:.1f} | | {c['makespan']:.1f} | {c['warm']['makespan']:.1f} | "
                  + " | ".join(cells) + " |" + " |" * 6 + f" {c['makespan'] / b3:.2f} | "
                  f"{c['warm']['makespan'] / b3:.2f} | | |")
            continue
        a, a2, b2, b3 = (r[k]["makespan"] for k in ("a", "a2", "b2", "b3"))
        c, warm = r["c"]["makespan"], r["c"]["warm"]["makespan"]
        role = r["c"].get("role", {}).get("makespan")
        prewarm = r["c"].get("prewarm", {}).get("makespan")
        fused = r["c"].get("fused", {}).get("makespan")
        d = r.get("d", {}).get("bound")
        bound = ("", "", "") if d is None else (f"{d:.1f}", f"{c / d:.2f}", f"{warm / d:.2f}")
        print(f"| {name} | {a:.1f} | {a2:.1f} | {b2:.1f} | {b3:.1f} | {bound[0]} | {c:.1f} | "
              f"{warm:.1f} | {'' if role is None else f'{role:.1f}'} | "
              f"{'' if prewarm is None else f'{prewarm:.1f}'} | {'' if prewarm is None else f'{prewarm / b3:.2f}'} | "
              f"{'' if fused is None else f'{fused:.1f}'} | {'' if fused is None else f'{fused / b3:.2f}'} | "
              f"{c / a:.2f} | {warm / a:.2f} | "
              f"{c / a2:.2f} | {warm / a2:.2f} | {c / b2:.2f} | {warm / b2:.2f} | {c / b3:.2f} | "
              f"{warm / b3:.2f} | {bound[1]} | {bound[2]} |")
    if "hops" in report:
        h = report["hops"]
        print(f"\nfixed cost per hop (intercept at 0 rows): {h['worker_intercept_ms']:.1f} ms in the "
              f"worker, {h['call_intercept_ms']:.1f} ms as the coordinator's call, "
              f"{h['makespan_per_hop_intercept_ms']:.1f} ms of makespan")


def plot(report: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    for name, r in report["workloads"].items():
        if "a" not in r:
            continue
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
