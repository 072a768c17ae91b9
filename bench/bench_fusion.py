"""Horizontal fusion's training loop against the unfused loop, on one worker's share of the
work: K models of one architecture and batch size (different learning rates and optimizer
arguments) trained over one segment's rows, one after another by the unfused loop
(`training.train_subepoch`, what a worker runs today), and together by one fused program
(`fused_program.train_fused_subepoch`).  No database: this isolates the loop; jobs that fuse
are measured by `bench_fused_jobs.py`.

Data: W1's (64 generated features, 10 classes), one segment's rows (W1 has 200,000 rows
to train on over 2 segments).  One thread, as each of 2 workers has on this machine.
Each cell: seconds for one sub-epoch of all K models (the best of --repeats, after one
untimed sub-epoch that traces), the fused run's split into decode, gather and train, and
the ratio fused / unfused, and the largest difference of a model's accuracy in the last
timed sub-epoch; the fused run in the compiled loop (`fused_program.compiled_loop_pays`:
a group of at most 8, else the traced loop again), and each model alone in the compiled
loop (a fused program of one), which says how much of the compiled loop's gain is
compiling rather than fusing; then the seconds to evaluate the K models over the same rows, one after
another (`Program.evaluate` of each buffer, without `training.evaluate`'s timing runs) and
fused (`fused_program.evaluate_fused`, each buffer decoded once).  The models differ in
learning rate (4 values) and, from K = 8 on, in Adam's beta_1.

    .venv/bin/python bench/bench_fusion.py [--rows 100000] [--sizes 2,4,8,16] [--repeats 2]
"""

from __future__ import annotations

import argparse
import json
import time
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

RESULTS = Path(__file__).resolve().parent / "results" / "fusion.json"
ARCHITECTURES = {"64": (64,), "128-64": (128, 64)}
BATCHES = (64, 256)
RATES = (0.001, 0.003, 0.01, 0.03)
BETAS = (0.9, 0.8, 0.95, 0.85)


def architecture(hidden) -> str:
    import keras

    layers = [keras.Input((64,))] + [keras.layers.Dense(h, activation="relu") for h in hidden]
    return keras.Sequential(layers + [keras.layers.Dense(10, activation="softmax")]).to_json()


def buffers(rows: int, per_buffer: int = 10_000):
    from madlib_mop.runtime.buffers import Buffer

    rng = np.random.default_rng(0)
    x = rng.standard_normal((rows, 64)).astype(np.float32)
    w = np.random.default_rng(1).standard_normal((64, 10)).astype(np.float32)
    y = np.eye(10, dtype=np.int16)[np.argmax(x @ w + 0.5 * rng.standard_normal((rows, 10)), axis=1)]
    return [Buffer(len(x[i:i + per_buffer]), lambda i=i: (x[i:i + per_buffer], y[i:i + per_buffer]))
            for i in range(0, rows, per_buffer)]


def specs(hidden, batch: int, size: int):
    from madlib_mop.runtime import training

    arch = architecture(hidden)
    return [training.ModelSpec(
        key, arch, f"optimizer='Adam(lr={RATES[key % 4]}, beta_1={BETAS[key // 4 % 4]})',"
                   "loss='categorical_crossentropy',metrics=['accuracy']", f"batch_size={batch}")
        for key in range(size)]


def unfused(group, data, repeats: int) -> tuple[float, list[float]]:
    from madlib_mop.runtime import training

    program = training.Program.for_spec(group[0])
    states = training.initial_states(group, 0)
    best, accuracy = float("inf"), []
    for step in range(repeats + 1):
        started = time.perf_counter()
        accuracy = []
        for spec in group:
            program.restore(states[spec.mst_key])
            outcome = training.train_subepoch(program, spec, data, 0, step, True)
            states[spec.mst_key] = program.capture()
            accuracy.append(outcome.means()["accuracy"])
        if step:
            best = min(best, time.perf_counter() - started)
    return best, accuracy


def fused(group, data, repeats: int, compiled: bool = False) -> tuple[float, dict, list[float]]:
    from madlib_mop.runtime import fused_program, training

    program = fused_program.FusedProgram(group[0], len(group), compiled)
    states = training.initial_states(group, 0)
    program.restore([states[spec.mst_key] for spec in group])
    best, parts, accuracy = float("inf"), {}, []
    for step in range(repeats + 1):
        started = time.perf_counter()
        outcomes, seconds = fused_program.train_fused_subepoch(program, group, data, 0, [step] * len(group), True)
        program.capture()
        elapsed = time.perf_counter() - started
        if step and elapsed < best:
            best, parts = elapsed, seconds
        accuracy = [o.means()["accuracy"] for o in outcomes]
    return best, parts, accuracy


def alone_compiled(group, data, repeats: int) -> float:
    """Each model alone in the compiled loop (a fused program of one), one after another:
    what compiling gives without fusing."""
    from madlib_mop.runtime import fused_program, training

    program = fused_program.FusedProgram(group[0], 1, True)
    states = training.initial_states(group, 0)
    best = float("inf")
    for step in range(repeats + 1):
        started = time.perf_counter()
        for spec in group:
            program.restore([states[spec.mst_key]])
            fused_program.train_fused_subepoch(program, [spec], data, 0, [step], True)
            program.capture()
        if step:
            best = min(best, time.perf_counter() - started)
    return best


def evaluations(group, data, repeats: int) -> tuple[float, float]:
    """Seconds to evaluate the group's models (step-0 states) unfused and fused."""
    from madlib_mop.runtime import fused_program, training

    states = training.initial_states(group, 0)
    program = training.Program.for_spec(group[0])
    together = fused_program.FusedProgram(group[0], len(group))
    together.restore([states[spec.mst_key] for spec in group])
    alone_best = fused_best = float("inf")
    for step in range(repeats + 1):
        started = time.perf_counter()
        for spec in group:
            program.restore(states[spec.mst_key])
            for buffer in data:
                x, y = buffer.load()
                program.evaluate(x, training.labels_for(spec.compile.loss, y, True))
        alone = time.perf_counter() - started
        started = time.perf_counter()
        fused_program.evaluate_fused(together, group, data, True)
        fused = time.perf_counter() - started
        if step:
            alone_best, fused_best = min(alone_best, alone), min(fused_best, fused)
    return alone_best, fused_best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--sizes", default="2,4,8,16")
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    from madlib_mop.runtime.tf_runtime import import_tensorflow

    import_tensorflow(threads=1)
    data = buffers(args.rows)
    rows = []
    print("| architecture | batch | K | unfused s | fused s | decode | gather | train | fused / unfused "
          "| accuracy max diff | compiled fused s | / unfused | each alone compiled s | compiled fused / "
          "each alone compiled | evaluate unfused s | evaluate fused s | fused / unfused |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for name, hidden in ARCHITECTURES.items():
        for batch in BATCHES:
            for size in (int(s) for s in args.sizes.split(",")):
                group = specs(hidden, batch, size)
                alone, alone_accuracy = unfused(group, data, args.repeats)
                together, parts, fused_accuracy = fused(group, data, args.repeats)
                difference = max(abs(a - b) for a, b in zip(alone_accuracy, fused_accuracy))
                # (a group of more than COMPILED_GROUP, or a step too large, runs the traced loop)
                compiled, _, _ = fused(group, data, args.repeats, compiled=True)
                each_compiled = alone_compiled(group, data, args.repeats)
                evaluate_alone, evaluate_fused = evaluations(group, data, args.repeats)
                row = {"architecture": name, "batch": batch, "models": size, "unfused": alone,
                       "fused": together, **parts, "ratio": together / alone,
                       "accuracy_max_diff": difference, "compiled_fused": compiled,
                       "alone_compiled": each_compiled, "evaluate_unfused": evaluate_alone,
                       "evaluate_fused": evaluate_fused}
                rows.append(row)
                print(f"| {name} | {batch} | {size} | {alone:.2f} | {together:.2f} | {parts['decode']:.2f} "
                      f"| {parts['gather']:.2f} | {parts['train']:.2f} | {together / alone:.2f} "
                      f"| {difference:.4f} | {compiled:.2f} | {compiled / alone:.2f} | {each_compiled:.2f} "
                      f"| {compiled / each_compiled:.2f} | {evaluate_alone:.2f} | {evaluate_fused:.2f} "
                      f"| {evaluate_fused / evaluate_alone:.2f} |", flush=True)
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(json.dumps({"date": datetime.now(timezone.utc).isoformat(), "rows": args.rows,
                                   "results": rows}, indent=1))


if __name__ == "__main__":
    main()
