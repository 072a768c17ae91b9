"""madlib_keras_automl and hyperband_schedule (MADlib's AutoML), as one hopping job each.

Hyperband: every configuration of every bracket is drawn at the start (MADlib's random
search over the grids) and trained in one job; a `HyperbandPruner` stops a model at its
round's end unless it is among the best of its bracket there, and a stopped model's
segments go at once to the models still due, with no barrier between rounds or brackets.

Hyperopt: an `OptunaSearcher` (TPE, or random) proposes the first configurations at the
start and each further one as earlier ones finish; new models join the running job.

The model selection table is an output, as in MADlib: it lists the configurations as they
are tried, and keeps only the best one when the job finishes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from psycopg import sql

from madlib_mop import errors
from madlib_mop.api.model_catalog import SELECTION_TABLES, arch_table_with_ids, object_table_names
from madlib_mop.db import catalog
from madlib_mop.errors import MadlibMopError
from madlib_mop.job import lifecycle, repository, temporary
from madlib_mop.job.plan import plan_job
from madlib_mop.grammar import model_config
from madlib_mop.search import grid, hyperband, setup
from madlib_mop.search.tpe import ALGORITHMS, OptunaSearcher, SearchSpace

METHODS = {
    "hyperband": ("R=6, eta=3, skip_last=0", ("R", "eta", "skip_last")),
    "hyperopt": ("num_configs=20, num_iterations=5, algorithm=tpe",
                 ("num_configs", "num_iterations", "algorithm", "parallelism", "startup_configs")),
}
COMMON_PARAMS = ("metric", "direction")


def hyperband_schedule(plpy: Any, schedule_table: str, R: int, eta: int | None = 3,
                       skip_last: int | None = 0) -> None:
    rungs = hyperband.schedule(R, 3 if eta is None else eta, 0 if skip_last is None else skip_last,
                               "hyperband_schedule")
    out = catalog.new_table(plpy, schedule_table, argument="schedule_table")
    out.must_not_exist(plpy)
    plpy.execute(f"CREATE TABLE {out.quoted} (s integer, i integer, n_i integer, r_i integer, "
                 "UNIQUE (s, i))")
    insert = plpy.prepare(f"INSERT INTO {out.quoted} VALUES ($1, $2, $3, $4)",
                          ["integer", "integer", "integer", "integer"])
    for rung in rungs:
        plpy.execute(insert, [rung.s, rung.i, rung.n_i, rung.r_i])


def _params(method: str, text: str | None) -> dict:
    default, keys = METHODS[method]
    given = model_config.parse_keyword_text(text if text and text.strip() else default,
                                            "automl_params", names_are_strings=True)
    unknown = [k for k in given if k not in keys + COMMON_PARAMS]
    if unknown:
        raise MadlibMopError(
            f"automl_params: {', '.join(unknown)} is not a parameter of {method}",
            sqlstate=errors.INVALID_PARAMETER_VALUE,
            hint=f"{method} takes {', '.join(keys + COMMON_PARAMS)}, e.g. '{default}'.")
    params = {**model_config.parse_keyword_text(default, "automl_params", names_are_strings=True),
              **given}
    if method == "hyperband":
        hyperband.check(params["R"], params["eta"], params["skip_last"])
        return params
    if params["algorithm"] not in ALGORITHMS:
        raise MadlibMopError(f"automl_params: algorithm must be tpe or rand, not {params['algorithm']!r}",
                             sqlstate=errors.INVALID_PARAMETER_VALUE,
                             hint="algorithm=tpe (Tree-structured Parzen Estimator) or algorithm=rand.")
    for key in ("num_configs", "num_iterations", "parallelism", "startup_configs"):
        value = params.get(key, 1)
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise MadlibMopError(
                f"automl_params: {key} must be a whole number of at least 1, not {value!r}",
                sqlstate=errors.INVALID_PARAMETER_VALUE,
                hint=f"e.g. '{default}'; parallelism: configurations trained at once (default: the "
                     "segments); startup_configs: random ones before TPE models the results.")
    return params


def _metric_choices(compile_grid: dict) -> list[list[str]]:
    """Every metrics list a configuration of the grid can have."""
    choices = compile_grid.get("metrics", [[]])
    return [list(c) if isinstance(c, (list, tuple)) else [c] for c in choices]


def _named_functions(compile_grid: dict, custom_names: tuple[str, ...]) -> tuple[str, ...]:
    """The custom functions the grid's losses and metrics name (each checked: built in, or a
    function of the object table); later proposals of the search may use any of them."""
    losses = compile_grid.get("loss", [])
    named = set()
    for loss in losses if isinstance(losses, (list, tuple)) else [losses]:
        for metrics in _metric_choices(compile_grid):
            named.update(model_config.compile_params_from(
                {"loss": loss, "metrics": metrics}, "compile_params_grid", custom_names).named())
    return tuple(sorted(named & set(custom_names)))


def madlib_keras_automl(plpy: Any, source_table: str, model_output_table: str, model_arch_table: str,
                        model_selection_table: str, model_id_list: list, compile_params_grid: str,
                        fit_params_grid: str, automl_method: str | None = "hyperband",
                        automl_params: str | None = None, random_state: int | None = None,
                        object_table: str | None = None, use_gpus: bool = False,
                        validation_table: str | None = None,
                        metrics_compute_frequency: int | None = None, name: str | None = None,
                        description: str | None = None, use_caching: bool = True, *,
                        can_commit: bool = False) -> None:
    method = (automl_method or "hyperband").strip().lower()
    if method not in METHODS:
        raise MadlibMopError(f"automl_method must be 'hyperband' or 'hyperopt', not {automl_method!r}",
                             sqlstate=errors.INVALID_PARAMETER_VALUE,
                             hint="Pass automl_method => 'hyperband' or 'hyperopt'.")
    params = _params(method, automl_params)
    object_table, custom_names = object_table_names(plpy, object_table)
    for argument, table in (("model_output_table", model_output_table),
                            ("model_selection_table", model_selection_table)):
        if temporary.is_temporary(plpy, table, argument):
            raise MadlibMopError(f"madlib_keras_automl does not write its {argument} into pg_temp",
                                 sqlstate=errors.FEATURE_NOT_SUPPORTED,
                                 hint="Name an ordinary table; fit, evaluate and predict may "
                                      "write into pg_temp.")
    arch, ids = arch_table_with_ids(plpy, model_arch_table, model_id_list)
    compile_grid = model_config.parse_grid(compile_params_grid, "compile_params_grid")
    fit_grid = model_config.parse_fit_grid(fit_params_grid)
    seed = 0 if random_state is None else int(random_state)
    objective = setup.objective_from(params.get("metric"), params.get("direction"),
                                     validation_table is not None, _metric_choices(compile_grid),
                                     "automl_params")
    if method == "hyperband":
        proposal = _hyperband(params, ids, compile_grid, fit_grid, seed)
    else:
        proposal = _hyperopt(plpy, params, ids, compile_grid, fit_grid, seed, objective, source_table)
    mst = catalog.new_table(plpy, model_selection_table, argument="model_selection_table")
    mst_summary = mst.sibling("_summary", plpy)
    entries = _entries(plpy, arch, proposal.configs)
    automl = {
        "method": method, "params": params,
        "params_text": automl_params if automl_params and automl_params.strip() else METHODS[method][0],
        "random_state": random_state, "model_id_list": ids,
        # As given: a jsonb object would not keep the order of the keys (nor the texts made).
        "compile_params_grid": compile_params_grid, "fit_params_grid": fit_params_grid,
        "metric_choices": _metric_choices(compile_grid),
        "model_arch_table": _parts(plpy, arch),
        "model_selection_table": [mst.schema, mst.name],
    }
    plan = plan_job(plpy, source_table, model_output_table, mst.quoted, proposal.iterations,
                    use_gpus, validation_table, metrics_compute_frequency, False, name,
                    description, use_caching, seed, given=(mst.quoted, arch.name, entries),
                    extra={"automl": automl, "initial_models": len(entries)},
                    info_labels=proposal.info_labels, object_table=object_table,
                    named=_named_functions(compile_grid, custom_names))
    if repository.find_job(plpy, plan.out.quoted, unfinished=True) is None:
        for table in (mst, mst_summary):
            table.must_not_exist(plpy)

    def create_model_selection_table(db) -> None:
        table = sql.Identifier(mst.schema, mst.name)
        for statement in SELECTION_TABLES:
            db.execute(sql.SQL(statement).format(table, sql.Identifier(mst_summary.schema, mst_summary.name),
                                                 sql.Literal(arch.name), sql.Literal(object_table)))
        for entry in entries:
            db.execute(sql.SQL("INSERT INTO {} VALUES (%s, %s, %s, %s)").format(table),
                       (entry["mst_key"], entry["model_id"], entry["compile_params"], entry["fit_params"]))

    plpy.notice(f"madlib_keras_automl: {method} {automl['params_text']}: {proposal.describe(params)}"
                f"; deciding by {objective.describe()}")
    lifecycle.run_plan(plpy, plan, False, can_commit, "madlib_keras_automl",
                       create_model_selection_table)


@dataclass(frozen=True)
class Proposal:
    """The configurations a job starts with, and how many iterations each trains at most."""

    configs: list
    iterations: int
    info_labels: dict  # mst_key -> extra _info columns (Hyperband's s and i)
    brackets: int = 0

    def describe(self, params: dict) -> str:
        if self.brackets:
            return (f"{len(self.configs)} configurations in {self.brackets} brackets, at most "
                    f"{self.iterations} iterations each")
        return (f"{params['num_configs']} configurations of {self.iterations} iterations, "
                f"{params['parallelism']} at a time")


def _hyperband(params: dict, ids: list, compile_grid: dict, fit_grid: dict, seed: int) -> Proposal:
    """Every configuration of every bracket, drawn up front (MADlib's random search)."""
    rungs = hyperband.bracket_rungs(params["R"], params["eta"], params["skip_last"])
    count = sum(r[0].n_i for r in rungs.values())
    configs = grid.all_configs(grid.RandomSearcher(ids, compile_grid, fit_grid, count, seed))
    brackets = setup.hyperband_brackets(params["R"], params["eta"], params["skip_last"])
    # The most iterations a model trains: R, or less when skip_last drops the last rounds
    # (MADlib's num_iterations and metrics_compute_frequency then say so too).
    most = max(rung.r_i for bracket in rungs.values() for rung in bracket)
    return Proposal(configs, most, {key: {"s": s, "i": 0} for key, s in brackets.items()},
                    len(rungs))


def _hyperopt(plpy: Any, params: dict, ids: list, compile_grid: dict, fit_grid: dict, seed: int,
              objective, source_table: str) -> Proposal:
    """The first configurations TPE proposes (as many as train at once: they need no
    results); it proposes the others as these finish.  Sets the defaults of `params`."""
    iterations = params["num_iterations"]
    params.setdefault("parallelism", _segments(plpy, source_table))
    params.setdefault("startup_configs", max(params["parallelism"], min(10, params["num_configs"] // 4)))
    space = SearchSpace(ids, compile_grid, fit_grid)
    if space.size() is not None and params["num_configs"] > space.size():
        raise MadlibMopError(
            f"automl_params: num_configs ({params['num_configs']}) is more than the "
            f"{space.size()} configurations the grids hold", sqlstate=errors.INVALID_PARAMETER_VALUE,
            hint=f"Pass num_configs={space.size()} or fewer, or give a distribution "
                 "([low, high, 'log']) instead of a list.")
    searcher = OptunaSearcher(space, objective, params["num_configs"], iterations,
                              params["algorithm"], seed, params["parallelism"],
                              params["startup_configs"])
    configs = []
    while (config := searcher.ask()) is not None:
        configs.append(config)
    return Proposal(configs, iterations, {})


def _parts(plpy: Any, table: catalog.Table) -> list[str]:
    """[schema, table] of a resolved table (how a job records the tables it reads later)."""
    row = plpy.execute(plpy.prepare(
        "SELECT n.nspname, c.relname FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n "
        "ON n.oid = c.relnamespace WHERE c.oid = $1", ["oid"]), [table.oid])[0]
    return [row["nspname"], row["relname"]]


def _segments(plpy: Any, source_table: str) -> int:
    from madlib_mop.db import packed

    return packed.read_summary(plpy, source_table, argument="source_table")["num_segments"]


def _entries(plpy: Any, arch: catalog.Table, configs: list) -> list[dict]:
    """The configurations as a plan's entries: mst_key 1.. in order, with architectures."""
    rows = {r["model_id"]: r for r in plpy.execute(
        f"SELECT model_id, model_arch::text AS model_arch, model_weights FROM {arch.name}")}
    return [{"mst_key": key, "model_id": c.model_id, "compile_params": c.compile_params,
             "fit_params": c.fit_params, "model_arch": rows[c.model_id]["model_arch"],
             "weights": rows[c.model_id]["model_weights"]}
            for key, c in enumerate(configs, start=1)]
