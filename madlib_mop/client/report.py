"""A job's report in a folder: its three plots as PNG files and a summary that shows them.

    write_report(mop, 13, "/tmp/job13", formats=("md", "html"))

writes learning_curves.png, schedule.png, hyperparameters.png, importance.png,
pareto_front.png, optimization_history.png, report.md and (if asked)
report.html: the job (state, tables, models, epochs done of the plan), its leaderboard's
best rows and the plots.  `madlib-mop report JOB --out DIR` calls it.  The HTML page holds
its images (as data URIs) and its style, so it can be sent or opened on its own.
"""

from __future__ import annotations

import base64
import html
from pathlib import Path
from typing import Any

import pandas as pd

from madlib_mop.client import frames, plots
from madlib_mop.client.errors import ServerError

DPI = 100  # the figures are 12.8 inches wide: 1280 px
LEADERBOARD_ROWS = 20
FORMATS = ("md", "html")
TEXT_COLUMNS = ("optimizer", "stop_reason")  # of the leaderboard table: the others are numbers
PLOT_TITLES = {"learning_curves": "Learning curves", "schedule": "Schedule",
               "hyperparameters": "Hyperparameters", "importance": "Hyperparameter importance",
               "pareto_front": "Pareto front", "optimization_history": "Optimization history"}


def write_report(client, job: int | str, out_dir: str | Path, *,
                 formats: tuple[str, ...] = ("md",)) -> dict[str, Path]:
    """Write the report of `job` (a job id or a model output table) into `out_dir`
    (created); returns the path of each file written, by kind: 'learning_curves',
    'schedule', 'hyperparameters', 'importance', 'pareto_front', 'optimization_history', 'md'
    and 'html'."""
    unknown = set(formats) - set(FORMATS)
    if unknown:
        raise ValueError(f"formats: {sorted(unknown)} unknown; choose among {FORMATS}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    ref = client.job(job)
    board = client.leaderboard(ref.job_id)
    figures = {"learning_curves": plots.learning_curves(client.curves(ref.job_id)),
               "schedule": plots.schedule(client.visits(ref.job_id)),
               "hyperparameters": plots.hyperparameters(board),
               "importance": _importance(client, ref),
               "pareto_front": _pareto_front(client, ref, board),
               "optimization_history": plots.optimization_history(client.optimization_history(ref.job_id))}
    written: dict[str, Path] = {}
    for name, figure in figures.items():
        written[name] = out / f"{name}.png"
        figure.savefig(written[name], dpi=DPI)

    jobs = client.jobs()
    row = jobs[jobs["job_id"] == ref.job_id]
    progress = row.iloc[0].to_dict() if len(row) else {}
    facts = _facts(ref, progress)
    header, rows, numeric = _leaderboard_table(board)
    caption = (f"Best first: {min(len(board), LEADERBOARD_ROWS)} of {len(board)} models."
               if len(board) else "No model yet.")
    images = {name: written[name] for name in figures}
    title = f"madlib_mop job {ref.job_id}: {ref.model_output_table}"
    if "md" in formats:
        written["md"] = out / "report.md"
        written["md"].write_text(_markdown(title, facts, caption, header, rows, numeric, images))
    if "html" in formats:
        written["html"] = out / "report.html"
        written["html"].write_text(_html(title, facts, caption, header, rows, numeric, images))
    return written


def _importance(client, ref: frames.JobRef):
    """The importance figure, or the server's reason why there is none yet."""
    title = PLOT_TITLES["importance"]
    try:
        return plots.importance(client.hyperparameter_importance(ref.model_output_table), title)
    except ServerError as error:
        return plots.no_data(title, error.message)


def pareto_objectives(board: pd.DataFrame) -> list[str] | None:
    """The report's trade-off: the objective of the plots against ms per row (NULL without
    validation data: no front then)."""
    objective = plots.default_objective(board)
    if objective is None or "inference_ms_per_row" not in board or \
            not plots.finite_rows(board, "inference_ms_per_row").shape[0]:
        return None
    higher = plots.higher_is_better(board, objective)
    return [f"{objective} {'max' if higher else 'min'}", "inference_ms_per_row min"]


def _pareto_front(client, ref: frames.JobRef, board: pd.DataFrame):
    title = PLOT_TITLES["pareto_front"]
    objectives = pareto_objectives(board)
    if objectives is None:
        return plots.no_data(title, "no inference cost measured (it needs a validation_table)")
    try:
        front = client.pareto_front(ref.model_output_table, objectives)
    except ServerError as error:
        return plots.no_data(title, error.message)
    return plots.pareto_front(board, front, objectives[::-1], title)


# ---- content -------------------------------------------------------------------------
def _facts(ref: frames.JobRef, progress: dict[str, Any]) -> list[tuple[str, str]]:
    """(name, value) of the job: its state, tables, search, models and epochs, times."""
    # job_progress's state: a job whose coordinator's session ended shows as interrupted
    facts = [("job", str(ref.job_id)), ("state", progress.get("state") or ref.state),
             ("output table", ref.model_output_table),
             ("source table", ref.arguments.source_table),
             ("validation table", ref.validation_table or "none")]
    automl = ref.arguments.automl
    if automl:
        facts.append(("search", f"{automl.get('method')} ({automl.get('params_text') or ''})"))
    if progress:
        stopped = progress.get("models_stopped") or 0
        facts.append(("models", f"{progress['models']}"
                      + (f" ({stopped} stopped early by the pruner)" if stopped else "")))
        facts.append(("epochs done / total",
                      f"{_number(progress['epochs_done'])} / {_number(progress['epochs_total'])} "
                      f"({_number(progress['percent_done'])} %)"))
        facts.append(("segments", str(progress["segments"])))
        started, finished = progress.get("started_at"), progress.get("finished_at")
        if _present(started):
            facts.append(("started", f"{started:%Y-%m-%d %H:%M:%S %Z}"))
        if _present(finished):
            took = f" ({(finished - started).total_seconds():.0f} s)" if _present(started) else ""
            facts.append(("finished", f"{finished:%Y-%m-%d %H:%M:%S %Z}{took}"))
        elif _present(progress.get("eta")):
            facts.append(("expected to finish", f"{progress['eta']:%Y-%m-%d %H:%M:%S %Z}"))
        if _present(progress.get("last_error")):
            facts.append(("last error", str(progress["last_error"])))
    return facts


def _leaderboard_table(board: pd.DataFrame) -> tuple[list[str], list[list[str]], list[bool]]:
    """Header, rows (text) and which columns are numbers, of the leaderboard's best rows."""
    names = board["metric"].dropna() if "metric" in board else pd.Series(dtype=object)
    metric = names.iloc[0] if len(names) else "metric"
    columns = {"mst_key": "mst_key", "model_id": "model_id", "optimizer": "optimizer",
               "learning_rate": "learning_rate", "batch_size": "batch_size",
               "validation_metrics_final": f"validation {metric}",
               "validation_loss_final": "validation loss",
               "training_metrics_final": f"training {metric}",
               "training_loss_final": "training loss",
               "training_seconds": "training seconds"}
    if "stopped_iteration" in board and board["stopped_iteration"].notna().any():
        columns.update(stopped_iteration="stopped at iteration", stop_reason="stop reason")
    shown = [c for c in columns if c in board and board[c].notna().any()]
    top = board.head(LEADERBOARD_ROWS)
    rows = [[_cell(column, value) for column, value in zip(shown, values)]
            for values in top[shown].itertuples(index=False)]
    numeric = [c not in TEXT_COLUMNS for c in shown]
    return [columns[c] for c in shown], rows, numeric


def _cell(column: str, value: Any) -> str:
    if not _present(value):
        return ""
    if column in ("mst_key", "model_id", "batch_size", "stopped_iteration"):
        return str(int(value))
    if column == "learning_rate":
        return f"{value:.3g}"
    if column == "training_seconds":
        return f"{value:.1f}"
    if isinstance(value, float):
        return f"{value:.4f}"
    return str(value)


def _present(value: Any) -> bool:
    return not (value is None or (pd.api.types.is_scalar(value) and pd.isna(value)))


def _number(value: Any) -> str:
    return f"{value:g}" if _present(value) else "?"


# ---- Markdown and HTML ---------------------------------------------------------------
def _markdown(title: str, facts: list[tuple[str, str]], caption: str, header: list[str],
              rows: list[list[str]], numeric: list[bool], images: dict[str, Path]) -> str:
    def line(cells):
        return "| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |"

    parts = [f"# {title}", ""]
    parts += [f"- **{name}**: {value}" for name, value in facts]
    parts += ["", "## Leaderboard", "", caption, ""]
    if rows:
        parts += [line(header), "|" + "|".join("---:" if n else "---" for n in numeric) + "|"]
        parts += [line(row) for row in rows]
    for name, path in images.items():
        parts += ["", f"## {PLOT_TITLES[name]}", "", f"![{PLOT_TITLES[name]}]({path.name})"]
    return "\n".join(parts) + "\n"


STYLE = ("body{font-family:sans-serif;max-width:1320px;margin:2em auto;color:#222}"
         "table{border-collapse:collapse;margin:1em 0}"
         "td,th{border:1px solid #ccc;padding:3px 8px;font-size:0.9em}"
         "th{background:#f0f0f0}td.n{text-align:right}img{max-width:100%}")


def _html(title: str, facts: list[tuple[str, str]], caption: str, header: list[str],
          rows: list[list[str]], numeric: list[bool], images: dict[str, Path]) -> str:
    e = html.escape
    parts = ["<!DOCTYPE html>", "<html><head><meta charset=\"utf-8\">",
             f"<title>{e(title)}</title><style>{STYLE}</style></head><body>", f"<h1>{e(title)}</h1>",
             "<table>"]
    parts += [f"<tr><th>{e(name)}</th><td>{e(value)}</td></tr>" for name, value in facts]
    parts += ["</table>", "<h2>Leaderboard</h2>", f"<p>{e(caption)}</p>"]
    if rows:
        parts.append("<table><tr>" + "".join(f"<th>{e(h)}</th>" for h in header) + "</tr>")
        parts += ["<tr>" + "".join(f"<td class=\"n\">{e(c)}</td>" if n else f"<td>{e(c)}</td>"
                                   for c, n in zip(row, numeric)) + "</tr>" for row in rows]
        parts.append("</table>")
    for name, path in images.items():
        data = base64.b64encode(path.read_bytes()).decode("ascii")
        parts += [f"<h2>{e(PLOT_TITLES[name])}</h2>",
                  f"<img src=\"data:image/png;base64,{data}\" alt=\"{e(PLOT_TITLES[name])}\">"]
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"
