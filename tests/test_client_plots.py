"""madlib_mop.client's plots, report and TensorBoard files from hand-made DataFrames (the
columns `frames` gives), without a database: labelled axes, readable legends, empty and
NaN input, PNG sizes, and event files that read back as the curves they were written from."""

from __future__ import annotations

import io
from datetime import datetime, timedelta, timezone

import numpy as np
import pandas as pd
import pytest
from matplotlib.figure import Figure
from PIL import Image

from madlib_mop.client import plots
from madlib_mop.client.errors import ServerError
from madlib_mop.client.frames import JobRef
from madlib_mop.job.record import JobArguments, JobState


def make_curves(keys=(1, 2, 3), iterations=5) -> pd.DataFrame:
    rows = []
    for key in keys:
        for iteration in range(1, iterations + 1):
            for split, offset in (("training", 0.0), ("validation", 0.05)):
                loss = 2.0 / (iteration * key) + offset
                rows.append((key, iteration, split, "loss", loss, iteration * 1.5))
                rows.append((key, iteration, split, "accuracy", 1 - loss / 3, iteration * 1.5))
    return pd.DataFrame(rows, columns=["mst_key", "iteration", "split", "metric", "value",
                                       "elapsed_seconds"])


def make_visits(keys=(1, 2, 3), segments=2, rounds=3) -> pd.DataFrame:
    start = datetime(2026, 1, 1, tzinfo=timezone.utc)
    rows, clock = [], 0.0
    for step in range(rounds):
        for k, key in enumerate(keys):
            segment = (k + step) % segments
            begin = start + timedelta(seconds=clock + segment * 0.1)
            rows.append({"mst_key": key, "step": step, "segment": segment, "rows": 100,
                         "started": begin, "finished": begin + timedelta(seconds=0.8),
                         "seconds": 0.8, "train_seconds": 0.7, "training_loss": 0.5})
            clock += 0.5
    return pd.DataFrame(rows)


def make_leaderboard(n=6) -> pd.DataFrame:
    keys = list(range(1, n + 1))
    return pd.DataFrame({
        "mst_key": keys, "model_id": [1] * n,
        "compile_params": ["optimizer='Adam(learning_rate=0.001)',loss='mse'"] * n,
        "fit_params": ["batch_size=32,epochs=1"] * n,
        "optimizer": ["Adam"] * n, "learning_rate": [10 ** -(1 + k % 4) for k in keys],
        "loss": ["mse"] * n, "batch_size": [32, 128, 512] * (n // 3) + [32] * (n % 3),
        "epochs": [1] * n, "model_size": [4.7] * n, "loss_type": ["mse"] * n,
        "training_metrics_final": np.linspace(0.9, 0.6, n),
        "training_loss_final": np.linspace(0.1, 0.5, n),
        "validation_metrics_final": np.linspace(0.88, 0.55, n),
        "validation_loss_final": np.linspace(0.12, 0.6, n),
        "training_seconds": [3.0] * n, "subepochs_done": [6] * n,
        "stopped_iteration": [None] * (n - 2) + [1, 2],
        "stop_reason": [None] * (n - 2) + ["not among the best"] * 2,
        "metric": ["accuracy"] * n, "status": ["finished"] * (n - 2) + ["stopped"] * 2,
        "parameter_count": [1000 * (1 + k % 3) for k in keys],
        "inference_ms_per_row": [0.01 * (1 + k % 3) for k in keys]})


def png_size(fig: Figure) -> tuple[int, int]:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=100)
    with Image.open(io.BytesIO(buffer.getvalue())) as image:
        return image.size


def texts(fig: Figure) -> str:
    return " ".join(t.get_text() for t in fig.findobj(lambda a: hasattr(a, "get_text")))


def legend_labels(fig: Figure) -> list[str]:
    return [t.get_text() for legend in fig.legends for t in legend.get_texts()]


# ---- learning curves -------------------------------------------------------------------
def test_learning_curves_one_labelled_panel_per_metric():
    fig = plots.learning_curves(make_curves())
    assert isinstance(fig, Figure)
    assert [ax.get_xlabel() for ax in fig.axes] == ["iteration", "iteration"]
    assert [ax.get_ylabel() for ax in fig.axes] == ["loss", "accuracy"]
    assert all(ax.get_title() for ax in fig.axes)
    labels = legend_labels(fig)
    assert {"mst_key 1", "mst_key 2", "mst_key 3", "validation", "training"} <= set(labels)
    # validation solid, training dashed
    styles = {line.get_linestyle() for line in fig.axes[0].get_lines()}
    assert styles == {"-", "--"}
    assert 1000 <= png_size(fig)[0] <= 1400


def test_learning_curves_of_one_metric():
    fig = plots.learning_curves(make_curves(), metric="accuracy")
    assert [ax.get_ylabel() for ax in fig.axes] == ["accuracy"]


def test_learning_curves_legend_stays_short_with_many_models():
    fig = plots.learning_curves(make_curves(keys=range(1, 51)))
    labels = legend_labels(fig)
    assert len(labels) <= plots.COLOURED_MODELS + 3
    assert "40 other models" in labels
    # the best by final validation accuracy: here the highest mst_key
    assert labels[0] == "mst_key 50"


def test_learning_curves_leave_out_nan():
    curves = make_curves()
    curves.loc[curves.index[::4], "value"] = np.nan
    curves.loc[curves.index[1], "value"] = np.inf
    fig = plots.learning_curves(curves)
    png_size(fig)
    for ax in fig.axes:
        for line in ax.get_lines():
            assert np.isfinite(np.asarray(line.get_ydata(), dtype=float)).all()


# ---- schedule ----------------------------------------------------------------------------
def test_schedule_is_a_gantt_chart_by_segment():
    visits = make_visits()
    fig = plots.schedule(visits)
    ax = fig.axes[0]
    assert ax.get_xlabel() == "seconds since the first sub-epoch"
    assert ax.get_ylabel() == "segment"
    assert [t.get_text() for t in ax.get_yticklabels()] == ["segment 0", "segment 1"]
    assert len(ax.patches) == len(visits)
    assert min(bar.get_x() for bar in ax.patches) == 0.0
    assert legend_labels(fig) == ["1", "2", "3"]
    assert 1000 <= png_size(fig)[0] <= 1400


def test_schedule_with_many_models_has_a_colour_bar():
    fig = plots.schedule(make_visits(keys=range(1, 41), segments=4))
    assert any(ax.get_ylabel() == "mst_key" for ax in fig.axes[1:])
    assert not fig.legends


def test_schedule_leaves_out_visits_without_times():
    visits = make_visits()
    visits.loc[0, "finished"] = pd.NaT
    assert len(plots.schedule(visits).axes[0].patches) == len(visits) - 1
    # as frames.visits gives them when some sub-epoch has no times: objects with None
    visits["started"] = [None] + list(visits["started"].iloc[1:])
    visits["started"] = visits["started"].astype(object)
    assert len(plots.schedule(visits).axes[0].patches) == len(visits) - 1


# ---- hyperparameters -------------------------------------------------------------------
def test_hyperparameters_one_panel_per_varying_one():
    fig = plots.hyperparameters(make_leaderboard())
    panels = [ax for ax in fig.axes if ax.get_visible() and ax.axison]
    assert [ax.get_xlabel() for ax in panels] == ["learning_rate", "batch_size"]
    assert {ax.get_ylabel() for ax in panels} == {"validation accuracy (final)"}
    assert panels[0].get_xscale() == "log"  # 0.0001 .. 0.1
    labels = legend_labels(fig)
    assert "stopped early by the pruner" in labels and "best: mst_key 1" in labels


def test_hyperparameters_without_pruning_say_nothing_of_it():
    board = make_leaderboard()
    board["stopped_iteration"] = None
    labels = legend_labels(plots.hyperparameters(board))
    assert labels == ["trained to the end", "best: mst_key 1"]


def test_hyperparameters_categorical_and_objective_fallback():
    board = make_leaderboard()
    board["optimizer"] = ["Adam", "SGD"] * 3
    board["validation_metrics_final"] = np.nan
    board.loc[2, "training_metrics_final"] = np.nan
    fig = plots.hyperparameters(board)
    panels = [ax for ax in fig.axes if ax.axison]
    assert panels[0].get_xlabel() == "optimizer"
    assert [t.get_text() for t in panels[0].get_xticklabels()] == ["Adam", "SGD"]
    assert panels[0].get_ylabel() == "training accuracy (final)"
    assert "stopped early by the pruner" in legend_labels(fig)
    png_size(fig)


def test_hyperparameters_none_varies():
    board = make_leaderboard()
    board["learning_rate"] = 0.01
    board["batch_size"] = 32
    fig = plots.hyperparameters(board)
    assert "no hyperparameter varies across the 6 configurations" in texts(fig)


# ---- after the search -------------------------------------------------------------------------
def test_importance_bars_most_important_on_top():
    ranked = pd.DataFrame({"hyperparameter": ["learning_rate", "batch_size", "model_id"],
                           "importance": [0.7, 0.2, 0.1]})
    fig = plots.importance(ranked)
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_yticklabels()] == ["model_id", "batch_size", "learning_rate"]
    assert [round(b.get_width(), 2) for b in ax.patches] == [0.1, 0.2, 0.7]
    assert "0.70" in texts(fig) and "no data yet" in texts(plots.importance(ranked.iloc[:0]))


def test_pareto_front_marks_and_labels_the_front():
    board = make_leaderboard()
    front = pd.DataFrame({"mst_key": [1, 2]})
    fig = plots.pareto_front(board, front, ["inference_ms_per_row min", "validation_metrics_final max"])
    ax = fig.axes[0]
    line = next(drawn for drawn in ax.get_lines() if drawn.get_label() == "Pareto front")
    assert sorted(line.get_xdata()) == sorted(board.loc[board["mst_key"].isin([1, 2]), "inference_ms_per_row"])
    assert "mst_key 1" in texts(fig) and "mst_key 3" not in texts(fig)
    assert "2 of 6 models" in texts(fig) and ax.get_xlabel() == "inference_ms_per_row (lower is better)"
    board["inference_ms_per_row"] = np.nan
    assert "no model has values" in texts(plots.pareto_front(board, front, ["inference_ms_per_row min",
                                                                            "validation_metrics_final max"]))


def test_optimization_history_shows_every_value_and_the_best_so_far():
    values = [1.2, 0.9, 1.0, 0.5, 0.7]
    history = pd.DataFrame({"report": range(1, 6), "elapsed_seconds": [0.5, 1.0, 1.5, 2.0, 2.5],
                            "mst_key": [1, 2, 1, 2, 1], "iteration": [1, 1, 2, 2, 3],
                            "objective": ["validation_loss"] * 5, "value": values,
                            "best_value": np.minimum.accumulate(values)})
    fig = plots.optimization_history(history)
    ax = fig.axes[0]
    best = next(drawn for drawn in ax.get_lines() if drawn.get_label() == "best so far")
    assert list(best.get_ydata()) == [1.2, 0.9, 0.9, 0.5, 0.5]
    assert ax.get_ylabel() == "validation_loss" and "5 values of 2 models" in texts(fig)
    assert "no data yet" in texts(plots.optimization_history(history.iloc[:0]))


# ---- empty input ---------------------------------------------------------------------------
@pytest.mark.parametrize("plot, frame", [
    (plots.learning_curves, make_curves().iloc[:0]),
    (plots.learning_curves, pd.DataFrame()),
    (plots.schedule, make_visits().iloc[:0]),
    (plots.schedule, pd.DataFrame()),
    (plots.hyperparameters, make_leaderboard().iloc[:0]),
    (plots.hyperparameters, pd.DataFrame()),
])
def test_empty_input_says_no_data_yet(plot, frame):
    fig = plot(frame)
    assert isinstance(fig, Figure)
    assert "no data yet" in texts(fig)
    assert 1000 <= png_size(fig)[0] <= 1400


def test_all_nan_is_no_data_yet():
    curves = make_curves()
    curves["value"] = np.nan
    assert "no data yet" in texts(plots.learning_curves(curves))
    board = make_leaderboard()
    for column in plots.OBJECTIVES:
        board[column] = np.nan
    assert "no data yet" in texts(plots.hyperparameters(board))


# ---- report --------------------------------------------------------------------------------
class FakeClient:
    """What write_report reads of a Client, from the frames above."""

    def job(self, job):
        arguments = JobArguments("src", "public.out", "mst", 3, "public.valid", 3, False, None, None, True, 0)
        return JobRef(7, JobState.FINISHED, "public.out", {}, arguments, "public.valid")

    def jobs(self):
        return pd.DataFrame([{"job_id": 7, "models": 6, "models_stopped": 2, "epochs_done": 4.5,
                              "epochs_total": 4.5, "percent_done": 100.0, "segments": 2,
                              "started_at": pd.Timestamp("2026-01-01 10:00", tz="UTC"),
                              "finished_at": pd.Timestamp("2026-01-01 10:01", tz="UTC"),
                              "last_error": None}])

    def leaderboard(self, job):
        return make_leaderboard()

    def curves(self, job):
        return make_curves(keys=range(1, 7))

    def visits(self, job):
        return make_visits(keys=range(1, 7))

    def hyperparameter_importance(self, model_output_table):
        return pd.DataFrame({"hyperparameter": ["learning_rate", "batch_size"], "importance": [0.8, 0.2]})

    def optimization_history(self, job):
        values = [0.9, 0.7, 0.8]
        return pd.DataFrame({"report": [1, 2, 3], "elapsed_seconds": [1.0, 2.0, 3.0], "mst_key": [1, 2, 1],
                             "iteration": [1, 1, 2], "objective": ["validation_loss"] * 3, "value": values,
                             "best_value": [0.9, 0.7, 0.7]})

    def pareto_front(self, model_output_table, objectives):
        assert objectives == ["validation_metrics_final max", "inference_ms_per_row min"]
        return pd.DataFrame({"mst_key": [1, 2], "objective_values": [[0.88, 0.02], [0.81, 0.01]]})


REPORT_PLOTS = {"learning_curves", "schedule", "hyperparameters", "importance", "pareto_front",
                "optimization_history"}


def test_write_report(tmp_path):
    from madlib_mop.client.report import write_report

    written = write_report(FakeClient(), 7, tmp_path / "out", formats=("md", "html"))
    assert set(written) == REPORT_PLOTS | {"md", "html"}
    for name in REPORT_PLOTS:
        with Image.open(written[name]) as image:
            assert 1000 <= image.size[0] <= 1400 and 300 <= image.size[1] <= 1400
    summary = written["md"].read_text()
    assert "job 7" in summary and "public.out" in summary and "public.valid" in summary
    assert "4.5 / 4.5" in summary and "2 stopped early" in summary
    assert "| mst_key | model_id | optimizer | learning_rate | batch_size | validation accuracy" in summary
    for key in range(1, 7):
        assert f"| {key} |" in summary
    assert "stop reason" in summary and "![Learning curves](learning_curves.png)" in summary
    page = written["html"].read_text()
    assert page.count("<img src=\"data:image/png;base64,") == 6 and "<td>Adam</td>" in page
    assert "![Pareto front](pareto_front.png)" in summary


class RunningJobClient(FakeClient):
    """A job that has just started: no times, no curves, no visits yet."""

    def jobs(self):
        frame = super().jobs()
        frame["finished_at"] = None
        frame["eta"] = pd.Timestamp("2026-01-01 10:05", tz="UTC")
        return frame

    def leaderboard(self, job):
        board = make_leaderboard()
        for column in plots.OBJECTIVES:
            board[column] = np.nan
        return board

    def curves(self, job):
        return make_curves().iloc[:0]

    def visits(self, job):
        return pd.DataFrame(columns=["mst_key", "step", "segment", "rows", "started", "finished",
                                     "seconds", "train_seconds"])

    def optimization_history(self, job):
        return pd.DataFrame()

    def hyperparameter_importance(self, model_output_table):
        raise ServerError("22000", "0 model(s) with a value of the objective: at least 4 are needed")


def test_write_report_of_a_job_without_results_yet(tmp_path):
    from madlib_mop.client.report import write_report

    written = write_report(RunningJobClient(), 7, tmp_path, formats=("md",))
    assert set(written) == REPORT_PLOTS | {"md"}
    summary = written["md"].read_text()
    assert "expected to finish**: 2026-01-01 10:05:00 UTC" in summary
    assert "| 6 |" in summary  # the models are listed, without metrics
    with pytest.raises(ValueError):
        write_report(RunningJobClient(), 7, tmp_path, formats=("pdf",))


# ---- TensorBoard ------------------------------------------------------------------------
def test_write_run_reads_back_as_the_curves(tmp_path):
    from madlib_mop.client.tensorboard import read_scalars, write_run

    curves = make_curves(keys=(4,))
    curves.loc[curves.index[0], "value"] = np.nan
    run = write_run(tmp_path / "mst_key_4", curves, {"mst_key": 4, "learning_rate": 0.01})
    write_run(run, curves, {"mst_key": 4, "learning_rate": 0.01})  # rewriting replaces
    for split, folder in (("training", "train"), ("validation", "validation")):
        scalars = read_scalars(run / folder)
        mine = curves[(curves["split"] == split)].dropna(subset=["value"])
        assert set(scalars) == {"epoch_loss", "epoch_accuracy"}
        for metric, group in mine.groupby("metric"):
            expected = [(int(i), float(np.float32(v))) for i, v in zip(group["iteration"], group["value"])]
            assert scalars[f"epoch_{metric}"] == expected


def test_write_run_hyperparameters_text(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.util.tensor_util import make_ndarray

    from madlib_mop.client.tensorboard import model_hyperparameters, write_run

    row = make_leaderboard().iloc[0].to_dict()
    hyperparameters = model_hyperparameters(row)
    assert hyperparameters == {"mst_key": 1, "model_id": 1, "optimizer": "Adam", "learning_rate": 0.001,
                               "loss": "mse", "batch_size": 32, "epochs": 1}
    run = write_run(tmp_path / "run", make_curves(keys=(1,)).iloc[:0], hyperparameters)
    events = EventAccumulator(str(run / "train"))
    events.Reload()
    assert events.Tags()["tensors"] == ["hyperparameters"]
    (event,) = events.Tensors("hyperparameters")
    text = make_ndarray(event.tensor_proto).item().decode()
    assert event.step == 0 and "| learning_rate | 0.001 |" in text
    assert not (run / "validation").exists()
