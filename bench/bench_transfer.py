"""Transfer learning, staged against unstaged: which layer of a trained CNN gives the best
features for a new task, and which head on top of them.

A base CNN is trained in the database on CIFAR-10-shaped images (32x32x3, 10 classes,
`demo.cifar_shaped_images`: nothing is downloaded).  Its first layers, frozen with its
weights, are then cut at 3 layers and given 4 heads each, at 2 learning rates: 24 models
of one model selection job, trained on a new task (other images, other classes' patterns).

- staged: the job as madlib_mop runs it (madlib_mop.stage_frozen_layers = on, the
  default): the frozen layers' output is computed once per row, segment and cut, and the
  heads train on it;
- unstaged: the same job with madlib_mop.stage_frozen_layers = off: every model computes
  its frozen layers on every row at every epoch;
- plain Keras: the 24 models one after another in this process, `fit` on arrays in memory
  (the frozen layers computed in every step, as in unstaged).

The table shows the time, the ratios, the validation accuracy (best and mean of the 24),
whether staged and unstaged give the same weights, the staged features' size and the
workers' peak memory.

    .venv/bin/python bench/bench_transfer.py [--rows 4000] [--iterations 4] [--base-iterations 4]
        [--batch-size 32] [--runs 1]
"""

from __future__ import annotations

import argparse
import json
import os
import threading
import time
from pathlib import Path

import numpy as np
import psycopg

from madlib_mop.runtime import keras_json, model_state
from madlib_mop.tools.demo import cifar_shaped_images, ensure_extension
from madlib_mop.tools.embedded import configured_dsn

SCHEMA = "madlib_mop_bench_transfer"
RESULTS = Path(__file__).resolve().parent / "results" / "transfer.json"
CUTS = ("pool_1", "pool_2", "dense_1")  # the base's layers the heads are put on
RATES = (0.001, 0.003)
SEED = 7
# A visit's time (`<out>_mop_visits.result->'seconds'`), summed over the job's visits.
PARTS = {"training": ("train",), "features": ("stage",),
         "state in and out": ("load", "restore", "save", "keep"), "other": ("setup", "read", "build", "other")}


def base_cnn():
    """A VGG-like CNN (most of its cost in its convolutions, as in the networks people
    reuse); the heads go on pool_1, pool_2 and dense_1."""
    import keras

    L = keras.layers
    return keras.Sequential([
        keras.Input((32, 32, 3)),
        L.Conv2D(32, 3, padding="same", activation="relu", name="conv_1"),
        L.Conv2D(32, 3, padding="same", activation="relu", name="conv_2"), L.MaxPooling2D(name="pool_1"),
        L.Conv2D(64, 3, padding="same", activation="relu", name="conv_3"),
        L.Conv2D(64, 3, padding="same", activation="relu", name="conv_4"), L.MaxPooling2D(name="pool_2"),
        L.Conv2D(128, 3, padding="same", activation="relu", name="conv_5"), L.Flatten(name="flatten"),
        L.Dense(128, activation="relu", name="dense_1"), L.Dense(10, activation="softmax", name="classes")],
        name="base_cnn")


def _dense(units: int, activation: str) -> dict:
    return {"class_name": "Dense", "config": {"units": units, "activation": activation}}


def heads(spatial: bool) -> dict[str, list[dict]]:
    """4 heads, as the Keras layer configs load_transfer_model takes; on a convolution's
    output they start by averaging over its positions (small heads on big features, as usual
    in transfer learning)."""
    pool = [{"class_name": "GlobalAveragePooling2D", "config": {}}] if spatial else []
    return {
        "linear": pool + [_dense(10, "softmax")],
        "mlp_32": pool + [_dense(32, "relu"), _dense(10, "softmax")],
        "mlp_64_dropout": pool + [_dense(64, "relu"), {"class_name": "Dropout", "config": {"rate": 0.2}},
                                  _dense(10, "softmax")],
        "mlp_16_16": pool + [_dense(16, "relu"), _dense(16, "relu"), _dense(10, "softmax")],
    }


def load_images(conn, table: str, rows: int, seed: int, classes_seed: int) -> None:
    x, y = cifar_shaped_images(rows, seed)
    # A new task: the same kind of images, labelled by another permutation of the classes.
    y = np.random.default_rng(classes_seed).permutation(10)[y]
    conn.execute(f"CREATE TABLE {table} (id int, rgb real[], label int)")
    with conn.cursor().copy(f"COPY {table} FROM STDIN") as copy:
        for i, (image, label) in enumerate(zip(x, y)):
            copy.write_row((i, image.tolist(), int(label)))


class MemoryWatch:
    """The peak resident memory of the server's backends, sampled every 0.2 s."""

    def __init__(self, postmaster: int):
        self.postmaster, self.peak, self.stop = postmaster, {}, threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self.stop.is_set():
            for entry in Path("/proc").iterdir():
                if not entry.name.isdigit():
                    continue
                try:
                    status = (entry / "status").read_text()
                except OSError:
                    continue
                fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
                if int(fields.get("PPid", "0")) == self.postmaster and "VmRSS" in fields:
                    rss = int(fields["VmRSS"].split()[0]) / 1024
                    self.peak[int(entry.name)] = max(self.peak.get(int(entry.name), 0), rss)
            self.stop.wait(0.2)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=4000)
    parser.add_argument("--iterations", type=int, default=4)
    parser.add_argument("--base-iterations", type=int, default=4)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--runs", type=int, default=1, help="staged and unstaged jobs, this many times each")
    args = parser.parse_args()
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import keras

    with psycopg.connect(configured_dsn(), autocommit=True) as conn:
        schema = ensure_extension(conn)
        conn.execute(f"DROP SCHEMA IF EXISTS {SCHEMA} CASCADE")
        conn.execute(f"CREATE SCHEMA {SCHEMA}")
        conn.execute(f"SET search_path = {SCHEMA}, {schema}")
        postmaster = conn.execute("SELECT pid FROM pg_stat_activity WHERE pid = pg_backend_pid()").fetchone()[0]
        postmaster = int(Path(f"/proc/{postmaster}/status").read_text().split("PPid:")[1].split()[0])
        # The base network, trained in the database on the first task.
        load_images(conn, "base_train", args.rows, 1, 0)
        conn.execute("SELECT training_preprocessor_dl('base_train', 'base_packed', 'label', 'rgb', "
                     "buffer_size => 250, distribution_rules => '2')")
        conn.execute("SELECT load_keras_model('base_arch', %s::json, NULL, 'base_cnn')", (base_cnn().to_json(),))
        started = time.perf_counter()
        conn.execute("SELECT madlib_keras_fit('base_packed', 'base_model', 'base_arch', 1, "
                     "$$loss='categorical_crossentropy', optimizer='Adam(learning_rate=0.001)', "
                     "metrics=['accuracy']$$, $$batch_size=32, epochs=1$$, %s)", (args.base_iterations,))
        base_seconds = time.perf_counter() - started
        base_accuracy = float(conn.execute("SELECT training_metrics_final FROM base_model_summary").fetchone()[0])
        base_parameters = base_cnn().count_params()

        # The new task, and 3 cuts x 4 heads x 2 learning rates.
        load_images(conn, "task_train", args.rows, 2, 1)
        load_images(conn, "task_valid", args.rows // 4, 3, 1)
        conn.execute("SELECT training_preprocessor_dl('task_train', 'task_packed', 'label', 'rgb', "
                     "buffer_size => 250, distribution_rules => '2')")
        conn.execute("SELECT validation_preprocessor_dl('task_valid', 'task_valid_packed', 'label', "
                     "'rgb', 'task_packed')")
        for cut in CUTS:
            for name, head in heads(cut.startswith("pool_")).items():
                conn.execute("SELECT load_transfer_model('transfer_arch', 'base_model', NULL, %s, %s, %s, "
                             "seed => %s)", (cut, json.dumps(head), f"{cut}+{name}", SEED))
        models = conn.execute("SELECT model_arch::text, model_weights FROM transfer_arch ORDER BY model_id").fetchall()
        ids = [r[0] for r in conn.execute("SELECT model_id FROM transfer_arch ORDER BY model_id")]
        conn.execute("SELECT generate_model_configs('transfer_arch', 'transfer_mst', %s, %s, %s)", (
            ids, "{'loss': ['categorical_crossentropy'], 'optimizer_params_list': [{'optimizer': ['Adam'], "
                 f"'lr': {list(RATES)}}}], 'metrics': ['accuracy']}}",
            f"{{'batch_size': [{args.batch_size}], 'epochs': [1]}}"))
        # Warm worker sessions for both jobs alike (TensorFlow imported, data decoded).
        # With validation: a worker session measures each frozen prefix's inference cost once.
        conn.execute("SELECT madlib_keras_fit_multiple_model('task_packed', 'warm_up', 'transfer_mst', 1, "
                     "FALSE, 'task_valid_packed', NULL, FALSE, NULL, NULL, TRUE, 1)")
        runs = []
        for repeat in range(args.runs):
            runs.append({})
            for label, staged in (("unstaged", False), ("staged", True)):
                # Each staged run computes its features: none kept by an earlier job (the
                # warm-up's, an earlier repeat's).
                conn.execute(f"DELETE FROM {schema}.staged_features")
                conn.execute(f"SET madlib_mop.stage_frozen_layers = {'on' if staged else 'off'}")
                runs[-1][label] = _run(conn, postmaster, f"models_{label}_{repeat}", args.iterations)
        conn.execute("RESET madlib_mop.stage_frozen_layers")
        x_train, y_train = _arrays(conn, "task_train")
        x_valid, y_valid = _arrays(conn, "task_valid")
        conn.execute(f"DROP SCHEMA {SCHEMA} CASCADE")

    # Plain Keras: the 24 models one after another, the frozen layers in every step.
    started = time.perf_counter()
    keras_accuracy = []
    for arch, weights in models:
        for rate in RATES:
            fresh = keras_json.model_from_config(keras_json.parse_model_json(arch))
            model_state.set_flat_weights(fresh, weights)
            fresh.compile(optimizer=keras.optimizers.Adam(rate), loss="categorical_crossentropy",
                          metrics=["accuracy"])
            fresh.fit(x_train, keras.utils.to_categorical(y_train, 10), batch_size=args.batch_size,
                      epochs=args.iterations, verbose=0)
            keras_accuracy.append(fresh.evaluate(x_valid, keras.utils.to_categorical(y_valid, 10),
                                                 verbose=0)[1])
    keras_seconds = time.perf_counter() - started

    same = all(run["staged"]["weights"] == run["unstaged"]["weights"] for run in runs)
    print(f"\nbase CNN ({base_parameters:,} parameters) trained in the database in {base_seconds:.1f} s "
          f"(training accuracy {base_accuracy:.3f}); "
          f"new task: {args.rows:,} training and {args.rows // 4:,} validation images (32x32x3), "
          f"2 segments, {len(CUTS)} cuts x {len(heads(False))} heads x {len(RATES)} learning rates = "
          f"{len(models) * len(RATES)} models, {args.iterations} iterations, batch size {args.batch_size}\n")
    print("| run | seconds | vs staged | best val. accuracy | mean val. accuracy | peak worker memory |")
    print("|---|---|---|---|---|---|")
    for number, run in enumerate(runs, 1):
        at = f" (run {number})" if len(runs) > 1 else ""
        for label, key in (("staged (madlib_mop default)", "staged"),
                           ("unstaged (stage_frozen_layers = off)", "unstaged")):
            print(f"| {label}{at} | {run[key]['seconds']:.1f} | {run[key]['seconds'] / run['staged']['seconds']:.2f}x"
                  f" | {max(run[key]['accuracy']):.3f} | {np.mean(run[key]['accuracy']):.3f} | "
                  f"{run[key]['peak_worker_mb']:,.0f} MB |")
    print(f"| plain Keras, one model after another | {keras_seconds:.1f} | "
          f"{keras_seconds / runs[0]['staged']['seconds']:.2f}x | {max(keras_accuracy):.3f} | "
          f"{np.mean(keras_accuracy):.3f} | - |")
    print("\n| run | sub-epochs | " + " | ".join(f"{part} (s)" for part in PARTS) + " | state per hop (MB) |")
    print("|---|---|" + "---|" * (len(PARTS) + 1))
    for label in ("staged", "unstaged"):
        run = runs[0][label]
        print(f"| {label} | {run['visits']} | " + " | ".join(f"{run['parts'][part]:.1f}" for part in PARTS)
              + f" | {run['state_mb_per_hop']:.2f} |")
    print(f"\nstaged features: {runs[0]['staged']['prefixes']} prefixes, "
          f"{runs[0]['staged']['feature_mb']:.1f} MiB over the workers "
          f"(the packed images: {args.rows * 32 * 32 * 3 * 4 / 2 ** 20:.1f} MiB); "
          f"staged and unstaged weights bitwise equal: {same}")
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(json.dumps({
        "rows": args.rows, "iterations": args.iterations, "batch_size": args.batch_size,
        "keras_seconds": keras_seconds, "keras_accuracy": keras_accuracy, "same_weights": same,
        "base_accuracy": base_accuracy,
        "runs": [{label: {k: v for k, v in run[label].items() if k != "weights"} for label in run}
                 for run in runs]}, indent=2))


def _run(conn, postmaster: int, out: str, iterations: int) -> dict:
    """One job of the 24 models into `out`: its time, accuracy, parts, weights and memory."""
    with MemoryWatch(postmaster) as watch:
        started = time.perf_counter()
        conn.execute("SELECT madlib_keras_fit_multiple_model('task_packed', %s, 'transfer_mst', %s, "
                     "FALSE, 'task_valid_packed', NULL, FALSE, NULL, NULL, TRUE, %s)",
                     (out, iterations, SEED))
        seconds = time.perf_counter() - started
    visits = [json.loads(r[0]) if isinstance(r[0], str) else r[0] for r in conn.execute(
        f"SELECT result FROM {out}_mop_visits")]
    pids = {v["pid"] for v in visits}
    features = {}
    for v in visits:
        if v.get("staged"):
            features[(v["pid"], v["segment"], v["staged"]["prefix"])] = v["staged"]["bytes"]
    accuracy = [float(r[0]) for r in conn.execute(f"SELECT validation_metrics_final FROM {out}_info")]
    parts = {part: sum(sum(v["seconds"].get(k, 0.0) for k in keys) for v in visits)
             for part, keys in PARTS.items()}
    return {"seconds": seconds, "accuracy": accuracy, "parts": parts, "visits": len(visits),
            "weights": {k: bytes(w) for k, w in conn.execute(f"SELECT mst_key, model_weights FROM {out}")},
            "peak_worker_mb": max(watch.peak.get(p, 0) for p in pids),
            "feature_mb": sum(features.values()) / 2 ** 20,
            "state_mb_per_hop": float(np.mean([v.get("state_bytes", 0) for v in visits])) / 2 ** 20,
            "prefixes": len({k[2] for k in features})}


def _arrays(conn, table: str):
    rows = conn.execute(f"SELECT rgb, label FROM {table} ORDER BY id").fetchall()
    return (np.array([r[0] for r in rows], dtype=np.float32).reshape(-1, 32, 32, 3),
            np.array([r[1] for r in rows]))


if __name__ == "__main__":
    main()
