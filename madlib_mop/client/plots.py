"""Figures of a job's results, drawn from the DataFrames of `frames`:

    learning_curves(mop.curves(job))       loss and metric per iteration, one line per model
    schedule(mop.visits(job))              a Gantt chart: which model trained on which segment when
    hyperparameters(mop.leaderboard(job))  each varying hyperparameter against the objective
    importance(mop.hyperparameter_importance(out))        which hyperparameters mattered
    pareto_front(mop.leaderboard(job), front, objectives) two objectives, the front marked
    optimization_history(mop.optimization_history(job))   the objective over time, best so far

Each returns a `matplotlib.figure.Figure` made without pyplot: no backend is chosen or
needed (a notebook shows it, `fig.savefig` renders it), and no figure is left open in
pyplot's registry.  Empty frames (a job that has not computed anything yet) give a figure
saying "no data yet"; missing values (NaN, inf) are left out.
"""

from __future__ import annotations

import math
import textwrap

import numpy as np
import pandas as pd
from matplotlib import colormaps
from matplotlib.cm import ScalarMappable
from matplotlib.colors import BoundaryNorm, ListedColormap
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import (FixedLocator, FuncFormatter, LogLocator, MaxNLocator, NullFormatter,
                               NullLocator)

from madlib_mop.search.objective import direction_of

WIDTH = 12.8  # inches: 1280 px at the report's 100 dpi
# Learning curves: with more models than this, the best ones are coloured and labelled,
# the others drawn in grey.
COLOURED_MODELS = 10
# Leaderboard columns that are results of training (or a pruner's labels: Hyperband's
# bracket `s` and round `i`), not hyperparameters.
RESULT_COLUMNS = frozenset({
    "mst_key", "compile_params", "fit_params", "model_type", "model_size", "loss_type", "metric",
    "training_metrics_final", "training_loss_final", "validation_metrics_final",
    "validation_loss_final", "training_seconds", "subepochs_done", "stopped_iteration",
    "stop_reason", "s", "i", "status", "parameter_count", "inference_ms_per_row",
})
# Hyperparameters that are names, though their values are numbers.
CATEGORICAL_HYPERPARAMETERS = frozenset({"model_id"})
LINE_STYLES = {"training": "--", "validation": "-"}
OBJECTIVES = ("validation_metrics_final", "training_metrics_final", "validation_loss_final",
              "training_loss_final")


def no_data(title: str, message: str = "no data yet", height: float = 4.0) -> Figure:
    fig = Figure(figsize=(WIDTH, height), layout="constrained")
    ax = fig.add_subplot()
    ax.set_axis_off()
    ax.set_title(title)
    ax.text(0.5, 0.5, textwrap.fill(message, 100), ha="center", va="center", fontsize=16 if len(message) < 80 else 12,
            color="0.4", transform=ax.transAxes)
    return fig


def finite_rows(frame: pd.DataFrame, column: str) -> pd.DataFrame:
    values = pd.to_numeric(frame[column], errors="coerce")
    return frame[np.isfinite(values.to_numpy(dtype=float, na_value=np.nan))]


def _model_colours(keys: list) -> dict:
    """A colour per key: tab10 / tab20 when they suffice, else colours spread over turbo."""
    if len(keys) <= 10:
        palette = colormaps["tab10"].colors
    elif len(keys) <= 20:
        palette = colormaps["tab20"].colors
    else:
        palette = colormaps["turbo"](np.linspace(0.05, 0.95, len(keys)))
    return {key: palette[k] for k, key in enumerate(keys)}


# ---- learning curves -------------------------------------------------------------------
def _ranking_metric(curves: pd.DataFrame) -> tuple[str, str, bool]:
    """(split, metric, higher is better) that orders the models: the first non-loss metric
    whose direction is known, else the loss; on the validation data when there is some."""
    split = "validation" if (curves["split"] == "validation").any() else "training"
    for metric in curves.loc[curves["split"] == split, "metric"].unique():
        if metric != "loss" and direction_of(metric) is not None:
            return split, metric, bool(direction_of(metric))
    return split, "loss", False


def _models_best_first(curves: pd.DataFrame) -> tuple[list, str]:
    """Every mst_key, best final value first, and the words saying by what."""
    split, metric, higher = _ranking_metric(curves)
    ranked = curves[(curves["split"] == split) & (curves["metric"] == metric)]
    final = ranked.sort_values("iteration").groupby("mst_key")["value"].last()
    final = final.sort_values(ascending=not higher, kind="stable")
    unranked = sorted(set(curves["mst_key"]) - set(final.index))
    return list(final.index) + unranked, f"final {split} {metric}"


def learning_curves(curves: pd.DataFrame, metric: str | None = None) -> Figure:
    """One panel per metric (the loss and the job's metrics, or only `metric`): its value
    per iteration, validation solid and training dashed, a colour per model.  With more than
    COLOURED_MODELS models the best ones (by the final validation metric) are coloured and
    labelled and the others grey."""
    title = "Learning curves"
    if not curves.empty:
        curves = finite_rows(curves, "value")
    if metric is not None and not curves.empty:
        curves = curves[curves["metric"] == metric]
    if curves.empty:
        return no_data(title, "no data yet" if metric is None else f"no {metric} values yet")

    metrics = list(dict.fromkeys(curves["metric"]))
    metrics.sort(key=lambda name: name != "loss")  # the loss first, then the job's metrics
    models, ranked_by = _models_best_first(curves)
    coloured = models[:COLOURED_MODELS]
    colours = _model_colours(coloured)

    fig = Figure(figsize=(WIDTH, 4.8), layout="constrained")
    axes = fig.subplots(1, len(metrics), squeeze=False)[0]
    for ax, name in zip(axes, metrics):
        panel = curves[curves["metric"] == name].sort_values("iteration")
        # Grey models first, so that the coloured ones are drawn over them.
        lines = sorted(panel.groupby(["mst_key", "split"]), key=lambda item: item[0][0] in colours)
        for (key, split), series in lines:
            highlighted = key in colours
            ax.plot(series["iteration"], series["value"], linestyle=LINE_STYLES[split],
                    color=colours[key] if highlighted else "0.6",
                    linewidth=1.6 if highlighted else 0.8, alpha=1.0 if highlighted else 0.5,
                    marker="o" if len(series) == 1 else None, markersize=3,
                    zorder=2 if highlighted else 1)
        values = panel["value"]
        if values.min() > 0 and values.max() / values.min() > 10:
            ax.set_yscale("log")  # a loss falling by orders of magnitude
            ax.yaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
            ax.yaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))
            ax.yaxis.set_minor_formatter(NullFormatter())
        ax.set_title(f"{name} per iteration" + (" (log scale)" if ax.get_yscale() == "log" else ""))
        ax.set_xlabel("iteration")
        ax.set_ylabel(name)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(True, alpha=0.3)

    model_handles = [Line2D([], [], color=colours[key], linewidth=2, label=f"mst_key {key}")
                     for key in coloured]
    legend_title = "models, best first"
    if len(models) > len(coloured):
        model_handles.append(Line2D([], [], color="0.6", linewidth=1,
                                    label=f"{len(models) - len(coloured)} other models"))
        legend_title = f"best {len(coloured)} of {len(models)} models"
        title += f" (coloured: the best {len(coloured)} of {len(models)} models by {ranked_by})"
    fig.legend(handles=model_handles, title=legend_title, loc="outside right upper", fontsize=9,
               title_fontsize=9)
    fig.legend(handles=[Line2D([], [], color="0.2", linestyle=style, label=split)
                        for split, style in sorted(LINE_STYLES.items(), reverse=True)],
               loc="outside right lower", fontsize=9)
    fig.suptitle(title)
    return fig


# ---- schedule --------------------------------------------------------------------------
def schedule(visits: pd.DataFrame) -> Figure:
    """A Gantt chart of the sub-epochs: a row per segment, a bar from each sub-epoch's start
    to its end (seconds since the job's first sub-epoch started), coloured by mst_key."""
    title = "Schedule: which model trained on which segment when"
    if not visits.empty:
        # Timestamps with gaps (a sub-epoch without its times) may come as objects.
        visits = visits.assign(started=pd.to_datetime(visits["started"], utc=True),
                               finished=pd.to_datetime(visits["finished"], utc=True))
        visits = visits.dropna(subset=["mst_key", "segment", "started", "finished"])
    if visits.empty:
        return no_data(title)

    start = visits["started"].min()
    left = (visits["started"] - start).dt.total_seconds().to_numpy()
    width = (visits["finished"] - visits["started"]).dt.total_seconds().to_numpy()
    segments = sorted(visits["segment"].unique())
    row = {segment: k for k, segment in enumerate(segments)}
    keys = sorted(visits["mst_key"].unique())
    colours = _model_colours(keys)

    fig = Figure(figsize=(WIDTH, max(4.0, 1.6 + 0.5 * len(segments))), layout="constrained")
    ax = fig.add_subplot()
    ax.barh([row[s] for s in visits["segment"]], width, left=left, height=0.8,
            color=[colours[k] for k in visits["mst_key"]], linewidth=0)
    ax.set_yticks(range(len(segments)), [f"segment {s}" for s in segments])
    ax.set_ylim(len(segments) - 0.5, -0.5)  # segment 0 on top
    ax.set_xlim(0, max(float((left + width).max()), 1e-3) * 1.01)
    ax.set_xlabel("seconds since the first sub-epoch")
    ax.set_ylabel("segment")
    ax.grid(True, axis="x", alpha=0.3)
    fig.suptitle(title)
    ax.set_title(f"{len(visits)} sub-epochs of {len(keys)} models on {len(segments)} segments; "
                 "gaps: the segment was idle", fontsize=10)
    if len(keys) <= 20:
        handles = [Line2D([], [], color=colours[k], linewidth=8, label=str(k)) for k in keys]
        fig.legend(handles=handles, title="mst_key", loc="outside right upper", fontsize=9,
                   title_fontsize=9, ncols=1 if len(keys) <= 10 else 2)
    else:
        # A colour bar with one band per model, labelled with a readable subset of keys.
        bands = ListedColormap([colours[k] for k in keys])
        norm = BoundaryNorm(np.arange(len(keys) + 1) - 0.5, len(keys))
        bar = fig.colorbar(ScalarMappable(norm=norm, cmap=bands), ax=ax, pad=0.01, aspect=15)
        shown = range(0, len(keys), math.ceil(len(keys) / 12))
        bar.set_ticks(list(shown), labels=[str(keys[k]) for k in shown])
        bar.ax.yaxis.set_minor_locator(NullLocator())
        bar.set_label("mst_key")
    return fig


# ---- hyperparameters -------------------------------------------------------------------
def hyperparameter_columns(leaderboard: pd.DataFrame) -> list[str]:
    """The leaderboard's hyperparameter columns (model_id, optimizer, its arguments, loss,
    batch_size, epochs, ...) whose value differs between configurations."""
    varying = []
    for column in leaderboard.columns:
        if column in RESULT_COLUMNS:
            continue
        values = leaderboard[column].dropna()
        if values.map(repr).nunique() > 1:
            varying.append(column)
    return varying


def default_objective(leaderboard: pd.DataFrame) -> str | None:
    """The first of the validation metric, training metric, validation loss, training loss
    that has values."""
    for column in OBJECTIVES:
        if column in leaderboard and finite_rows(leaderboard, column).shape[0]:
            return column
    return None


def objective_label(leaderboard: pd.DataFrame, objective: str) -> str:
    """'validation accuracy (final)' for validation_metrics_final, and so on."""
    split, _, kind = objective.partition("_")
    if kind == "metrics_final":
        names = leaderboard["metric"].dropna() if "metric" in leaderboard else pd.Series()
        return f"{split} {names.iloc[0] if len(names) else 'metric'} (final)"
    if kind == "loss_final":
        return f"{split} loss (final)"
    return objective


def higher_is_better(leaderboard: pd.DataFrame, objective: str) -> bool:
    """A final metric (unless its name says it is an error), not a loss."""
    return objective.endswith("metrics_final") and \
        direction_of(objective_label(leaderboard, objective)) is not False


def hyperparameters(leaderboard: pd.DataFrame, objective: str | None = None) -> Figure:
    """A scatter panel per hyperparameter that varies, against `objective` (default: the
    final validation metric, else the training metric, else the losses).  Models a pruner
    stopped are crosses; the best model is a star."""
    title = "Hyperparameters against the objective"
    objective = objective or default_objective(leaderboard)
    if leaderboard.empty or objective is None or objective not in leaderboard:
        return no_data(title)
    board = finite_rows(leaderboard, objective)
    if board.empty:
        return no_data(title)
    columns = hyperparameter_columns(board)
    if not columns:
        return no_data(title, f"no hyperparameter varies across the {len(board)} configurations")

    label = objective_label(board, objective)
    higher = higher_is_better(board, objective)
    y = board[objective].astype(float)
    best = y.idxmax() if higher else y.idxmin()
    stopped = board["stopped_iteration"].notna() if "stopped_iteration" in board \
        else pd.Series(False, index=board.index)

    per_row = min(len(columns), 3)
    rows = math.ceil(len(columns) / per_row)
    fig = Figure(figsize=(WIDTH, 1.0 + 3.6 * rows), layout="constrained")
    axes = fig.subplots(rows, per_row, squeeze=False, sharey=True).ravel()
    for ax, column in zip(axes, columns):
        x = _scatter_positions(ax, board[column], column)
        ax.scatter(x[~stopped], y[~stopped], marker="o", s=36, color="C0", alpha=0.8,
                   label="trained to the end")
        if stopped.any():
            ax.scatter(x[stopped], y[stopped], marker="x", s=40, color="C3", alpha=0.9,
                       label="stopped early by the pruner")
        ax.scatter(x[[best]], y[[best]], marker="*", s=220, color="gold", edgecolor="0.2",
                   linewidth=0.8, zorder=3, label=f"best: mst_key {board.at[best, 'mst_key']}")
        ax.set_xlabel(column)
        ax.set_ylabel(label)
        ax.yaxis.set_tick_params(labelleft=True)
        ax.grid(True, alpha=0.3)
        ax.set_title(column + (" (log scale)" if ax.get_xscale() == "log" else ""))
    for ax in axes[len(columns):]:
        ax.set_axis_off()
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside lower center", ncols=len(handles), fontsize=9)
    fig.suptitle(f"{title}: {label} of {len(board)} models"
                 + (f", {int(stopped.sum())} stopped early" if stopped.any() else ""))
    return fig


def _scatter_positions(ax, values: pd.Series, column: str) -> pd.Series:
    """x of each model on `ax`: numbers as they are (a log scale when they are positive and
    span more than a factor 10), names (and model ids) as evenly spaced categories.  Where
    there are few distinct values, the models sharing one are spread a little around it
    so that they hide each other less."""
    spread = _spread(values.map(str))
    numeric = pd.api.types.is_numeric_dtype(values) and not pd.api.types.is_bool_dtype(values)
    if numeric and column not in CATEGORICAL_HYPERPARAMETERS:
        x = values.astype(float)
        present = x.dropna()
        log = bool(len(present) and present.min() > 0 and present.max() / present.min() > 10)
        if log:
            ax.set_xscale("log")
        distinct = sorted(present.unique())
        if len(distinct) > 6:
            return x
        scaled = np.log10(distinct) if log else np.asarray(distinct)
        # A tick at each value, but for those too close to the previous one to be read.
        ticks = [0]
        for k in range(1, len(distinct)):
            if scaled[k] - scaled[ticks[-1]] > 0.1 * (scaled[-1] - scaled[0]):
                ticks.append(k)
        ax.xaxis.set_major_locator(FixedLocator([distinct[k] for k in ticks]))
        ax.xaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:.3g}"))
        ax.xaxis.set_minor_locator(NullLocator())
        # Numbers are spread less than names: +-6 % of the gap between neighbouring values.
        offset = 0.12 * spread * float(np.diff(scaled).min())  # varying: at least two values
        return x * 10 ** offset if log else x + offset
    present = list(values.dropna().unique())
    try:
        present.sort()
    except TypeError:  # names and numbers mixed
        present.sort(key=str)
    categories = [str(value) for value in present] + (["none"] if values.isna().any() else [])
    names = values.map(lambda v: "none" if pd.isna(v) else str(v))
    position = {name: k for k, name in enumerate(categories)}
    ax.set_xticks(range(len(categories)), categories)
    ax.set_xlim(-0.6, len(categories) - 0.4)
    return names.map(position) + 0.4 * spread


def _spread(keys: pd.Series) -> np.ndarray:
    """An offset in [-0.5, 0.5] per row: the rows of equal keys evenly spaced and centred on
    0 (so that their value stays in the middle), in an order shuffled the same way every
    time (so that the spread does not look like a trend)."""
    shuffled = pd.Series(np.random.default_rng(0).permutation(len(keys)), index=keys.index)
    rank = shuffled.groupby(keys).rank(method="first") - 1
    count = keys.map(keys.value_counts())
    return np.where(count > 1, rank / (count - 1).clip(lower=1) - 0.5, 0.0)


# ---- after the search ---------------------------------------------------------------------
def importance(ranked: pd.DataFrame, title: str = "Hyperparameter importance") -> Figure:
    """Horizontal bars of `hyperparameter_importance`'s rows, the most important on top."""
    if ranked is None or ranked.empty:
        return no_data(title)
    ranked = ranked.sort_values("importance", kind="stable")
    fig = Figure(figsize=(WIDTH, max(3.0, 1.2 + 0.5 * len(ranked))), layout="constrained")
    ax = fig.add_subplot()
    bars = ax.barh(ranked["hyperparameter"], ranked["importance"], color="C0")
    ax.bar_label(bars, labels=[f"{v:.2f}" for v in ranked["importance"]], padding=3)
    ax.set_xlim(0, 1.08)
    ax.set_xlabel("importance (sums to 1)")
    ax.grid(True, axis="x", alpha=0.3)
    ax.set_title(title)
    return fig


def pareto_front(models: pd.DataFrame, front: pd.DataFrame, objectives: list[str],
                 title: str = "Pareto front") -> Figure:
    """Every model on the first two objectives ('<column> [max|min]') of `pareto_front`,
    the front's models joined by a line and labelled by mst_key."""
    columns = [text.split()[0] for text in objectives[:2]]
    if models is None or models.empty or any(c not in models for c in columns):
        return no_data(title)
    shown = models
    for column in columns:
        shown = finite_rows(shown, column)
    if shown.empty:
        return no_data(title, f"no model has values of {' and '.join(columns)} yet")
    on_front = shown["mst_key"].isin(set(front["mst_key"]) if front is not None and len(front) else set())
    fig = Figure(figsize=(WIDTH, 6.0), layout="constrained")
    ax = fig.add_subplot()
    x, y = (shown[c].astype(float) for c in columns)
    ax.scatter(x[~on_front], y[~on_front], s=36, color="0.6", label="dominated")
    ordered = shown[on_front].sort_values(columns[0])
    ax.plot(ordered[columns[0]].astype(float), ordered[columns[1]].astype(float), "-o", color="C3",
            markersize=8, label="Pareto front")
    for _, row in ordered.iterrows():
        ax.annotate(f"mst_key {row['mst_key']}", (float(row[columns[0]]), float(row[columns[1]])),
                    textcoords="offset points", xytext=(6, 6), fontsize=9)
    for axis, text in zip((ax.xaxis, ax.yaxis), objectives):
        column, _, direction = text.partition(" ")
        better = {"max": "higher", "min": "lower"}.get(direction.strip().lower())
        axis.set_label_text(column + (f" ({better} is better)" if better else ""))
    ax.grid(True, alpha=0.3)
    ax.legend()
    ax.set_title(f"{title}: {int(on_front.sum())} of {len(shown)} models")
    return fig


def optimization_history(history: pd.DataFrame, title: str = "Optimization history") -> Figure:
    """Each (model, iteration) value of the job's objective against the seconds since the
    job started, and the best so far as a step line (the view `optimization_history`)."""
    if history is None or history.empty:
        return no_data(title)
    shown = finite_rows(history, "value")
    if shown.empty:
        return no_data(title)
    shown = shown[shown["elapsed_seconds"].notna()]
    objective = str(shown["objective"].iloc[0])
    fig = Figure(figsize=(WIDTH, 5.0), layout="constrained")
    ax = fig.add_subplot()
    ax.scatter(shown["elapsed_seconds"], shown["value"], s=22, color="C0", alpha=0.6,
               label=f"a model's {objective} at an iteration")
    ax.step(shown["elapsed_seconds"], shown["best_value"], where="post", color="C3", linewidth=2,
            label="best so far")
    ax.set_xlabel("seconds since the job started")
    ax.set_ylabel(objective)
    ax.grid(True, alpha=0.3)
    ax.legend()
    ax.set_title(f"{title}: {len(shown)} values of {shown['mst_key'].nunique()} models")
    return fig
