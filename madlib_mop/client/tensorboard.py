"""A job's learning curves as TensorBoard event files: `tensorboard --logdir DIR`.

One run per model, laid out as Keras' TensorBoard callback lays out a fit's:

    DIR/mst_key_<k>/train        epoch_loss, epoch_<metric> on the training data, and the
                                 model's hyperparameters (a text summary, step 0)
    DIR/mst_key_<k>/validation   epoch_loss, epoch_<metric> on the validation data

with one step per iteration where the job computed metrics.  So TensorBoard compares the
models of a job as it compares Keras fits: runs side by side, training and validation of
a run in one chart.  `madlib-mop tensorboard JOB --logdir DIR` calls `write_events`.

The files are written with the TensorBoard package's own writer and summary protocol
buffers (no TensorFlow: the client does not need it), as `tf.summary.scalar` and
`tf.summary.text` write them in TensorFlow 2; `read_scalars` reads them back with
TensorBoard's own reader.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pandas as pd

from madlib_mop.client import frames

SPLIT_FOLDERS = {"training": "train", "validation": "validation"}  # as Keras names them
HYPERPARAMETERS_TAG = "hyperparameters"


def write_events(client, job: int | str, logdir: str | Path) -> list[Path]:
    """Write the event files of `job` (a job id or a model output table) into `logdir`
    (created), one run per model; returns the runs' folders."""
    ref = client.job(job)
    curves = client.curves(ref.job_id)
    board = client.leaderboard(ref.job_id).sort_values("mst_key")
    runs = []
    for model in board.to_dict("records"):
        key = model["mst_key"]
        runs.append(write_run(Path(logdir) / f"mst_key_{key}", curves[curves["mst_key"] == key],
                              model_hyperparameters(model)))
    return runs


def model_hyperparameters(model: dict[str, Any]) -> dict[str, Any]:
    """A leaderboard row's configuration: mst_key, model_id, and the hyperparameters its
    compile and fit parameters give (optimizer, learning_rate, loss, batch_size, ...)."""
    return {"mst_key": model["mst_key"], "model_id": model["model_id"],
            **frames.hyperparameters(model.get("compile_params"), model.get("fit_params"))}


def write_run(run_dir: str | Path, curves: pd.DataFrame, hyperparameters: dict[str, Any]) -> Path:
    """One model's run: its curves (the rows of `frames.curves` of that model) as scalars
    `epoch_<metric>` per iteration in `train` and `validation`, and its hyperparameters as
    a Markdown table in `train`.  Event files the run held before are replaced; missing
    values (NaN) are left out."""
    from tensorboard.compat.proto.event_pb2 import Event
    from tensorboard.plugins.scalar.summary_v2 import scalar_pb
    from tensorboard.plugins.text.summary_v2 import text_pb
    from tensorboard.summary.writer.event_file_writer import EventFileWriter

    run_dir = Path(run_dir)
    for split, folder in SPLIT_FOLDERS.items():
        found = curves[curves["split"] == split].dropna(subset=["value"])
        if found.empty and split != "training":
            continue
        for old in (run_dir / folder).glob("events.out.tfevents.*"):
            old.unlink()
        writer = EventFileWriter(str(run_dir / folder))
        for row in found.sort_values(["metric", "iteration"]).itertuples(index=False):
            writer.add_event(Event(wall_time=time.time(), step=int(row.iteration),
                                   summary=scalar_pb(f"epoch_{row.metric}", float(row.value))))
        if split == "training":
            writer.add_event(Event(wall_time=time.time(), step=0, summary=text_pb(
                HYPERPARAMETERS_TAG, _markdown_table(hyperparameters))))
        writer.close()
    return run_dir


def _markdown_table(values: dict[str, Any]) -> str:
    """TensorBoard renders a text summary as Markdown."""
    rows = ["| hyperparameter | value |", "|---|---|"]
    rows += ["| " + " | ".join(str(cell).replace("|", "\\|") for cell in pair) + " |"
             for pair in values.items()]
    return "\n".join(rows)


def read_scalars(run_dir: str | Path) -> dict[str, list[tuple[int, float]]]:
    """The scalars of one folder of event files (a run's `train` or `validation`):
    {tag: [(step, value), ...]} in step order.  TensorFlow 2 writes scalars as tensors
    of the scalars plugin; text summaries are left out."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.util.tensor_util import make_ndarray

    events = EventAccumulator(str(run_dir), size_guidance={"tensors": 0})  # 0: keep every event
    events.Reload()
    scalars = {}
    for tag in events.Tags()["tensors"]:
        if events.SummaryMetadata(tag).plugin_data.plugin_name != "scalars":
            continue
        scalars[tag] = [(event.step, float(make_ndarray(event.tensor_proto)))
                        for event in sorted(events.Tensors(tag), key=lambda event: event.step)]
    return scalars
