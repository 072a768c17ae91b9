"""Model selection in cycles over a table that keeps growing (`CALL run_cycle(...)`).

A cycle packs the rows that arrived since the last one (`preprocessor_dl_append`, into
tables packed with key_column), then trains, as one job over the grown data, the best
`top_k` models of the cycle before, each warm-started from its final weights (added to the
architecture table as a model of its own), together with the cycle's new configurations.
Each cycle has its outputs (`<cycle_name>_c<k>`, its configurations `<cycle_name>_c<k>_mst`)
and a row in `cycles`, which this module alone reads and writes:

    packing   -> the new rows, the carried models and the configurations are committed
                 together, and the row says `training`
    training  -> the job runs (it commits as it goes) and the row says `finished`

A cycle that was stopped continues where it stopped when it is called again: a job that
was interrupted continues from its last finished sub-epoch, to the same bits.
"""

from __future__ import annotations

import json
from typing import Any

from madlib_mop import errors
from madlib_mop.api import analysis, fit, model_catalog
from madlib_mop.api.preprocessor import preprocessor_dl_append
from madlib_mop.db import catalog, packed
from madlib_mop.errors import MadlibMopError
from madlib_mop.grammar.model_config import Config
from madlib_mop.job import repository
from madlib_mop.job.plan import selection_configs
from madlib_mop.json_values import json_value

PACKING, TRAINING, FINISHED = "packing", "training", "finished"


def run_cycle(plpy: Any, cycle_name: str, packed_table: str, source_table: str,
              model_selection_table: str | None, num_iterations: int,
              validation_table: str | None = None, validation_source: str | None = None,
              top_k: int | None = 3, metrics_compute_frequency: int | None = None,
              seed: int | None = 0, *, can_commit: bool = False) -> None:
    if not can_commit:
        raise MadlibMopError(
            "a cycle commits between its steps: its new rows are read by worker sessions, "
            "which see committed rows only", sqlstate=errors.ACTIVE_SQL_TRANSACTION,
            hint="CALL run_cycle(...) (a procedure), outside a transaction block.")
    top_k = 3 if top_k is None else top_k
    if top_k < 0:
        raise MadlibMopError(f"top_k must be 0 or more, not {top_k}", sqlstate=errors.INVALID_PARAMETER_VALUE,
                             hint="Pass how many models of the last cycle go on training (0: none).")
    if validation_source is not None and validation_table is None:
        raise MadlibMopError("validation_source needs a validation_table to append its rows to",
                             sqlstate=errors.INVALID_PARAMETER_VALUE,
                             hint="Pass the validation table packed with key_column.")
    arguments = {"packed_table": packed_table, "source_table": source_table,
                 "model_selection_table": model_selection_table, "num_iterations": num_iterations,
                 "validation_table": validation_table, "validation_source": validation_source,
                 "top_k": top_k, "metrics_compute_frequency": metrics_compute_frequency,
                 "seed": int(seed or 0)}
    cycles = _table(plpy)
    name = _name(plpy, cycle_name)
    rows = [dict(r) for r in plpy.execute(plpy.prepare(
        f"SELECT * FROM {cycles} WHERE owner = current_user AND cycle_name = $1 ORDER BY cycle",
        ["text"]), [name])]
    cycle = _current(plpy, cycles, name, arguments, rows[-1] if rows else None)
    number = cycle["cycle"]
    out, mst = f"{cycle_name}_c{number}", f"{cycle_name}_c{number}_mst"
    previous = next((r for r in reversed(rows) if r["cycle"] < number and r["state"] == FINISHED), None)
    if cycle["state"] == PACKING:
        _pack_and_plan(plpy, cycles, name, number, arguments, out, mst, previous)
        plpy.commit()
    done = repository.find_job(plpy, catalog.new_table(plpy, out, argument="cycle_name").quoted,
                               unfinished=False)
    if done is None or not repository.tables_exist(plpy, done):  # (not a dropped output's job)
        fit.fit_multiple_model(plpy, packed_table, out, mst, num_iterations, False, validation_table,
                               metrics_compute_frequency, False, f"{name} cycle {number}", None,
                               True, int(seed or 0), can_commit=True)
    _finish(plpy, cycles, name, number, out)


def _current(plpy: Any, cycles: str, name: str, arguments: dict, last: dict | None) -> dict:
    """The cycle this call works on: the last one if unfinished (with these arguments, or
    any while nothing of it but its row is committed), else a new one, recorded."""
    if last is not None and last["state"] != FINISHED:
        if json_value(last["arguments"]) != arguments:
            if last["state"] != PACKING:  # its data and configurations are committed
                raise MadlibMopError(
                    f"cycle {last['cycle']} of {name} is unfinished, and was started with other arguments",
                    sqlstate=errors.OBJECT_NOT_IN_PREREQUISITE_STATE,
                    detail=f"Its arguments: {json.dumps(json_value(last['arguments']))}.",
                    hint="Call run_cycle with those arguments to finish it first, or abandon it: DELETE "
                         f"FROM {cycles} WHERE cycle_name = {plpy.quote_literal(name)} "
                         f"AND cycle = {last['cycle']}.")
            # Nothing of it is committed but its row: it starts with these arguments.
            plpy.execute(plpy.prepare(
                f"UPDATE {cycles} SET arguments = $1 WHERE owner = current_user AND cycle_name = $2 "
                "AND cycle = $3", ["jsonb", "text", "integer"]), [json.dumps(arguments), name, last["cycle"]])
            plpy.commit()
        plpy.notice(f"run_cycle: continuing cycle {last['cycle']} of {name} ({last['state']})")
        return last
    number = 1 if last is None else last["cycle"] + 1
    if arguments["model_selection_table"] is None and (last is None or arguments["top_k"] == 0):
        raise MadlibMopError(f"cycle {number} of {name} would train no model",
                             sqlstate=errors.INVALID_PARAMETER_VALUE,
                             hint="Pass a model_selection_table of new configurations"
                                  + (" (the first cycle has none to carry over)." if last is None
                                     else ", or a top_k above 0."))
    plpy.execute(plpy.prepare(f"INSERT INTO {cycles} (cycle_name, cycle, arguments) VALUES ($1, $2, $3)",
                              ["text", "integer", "jsonb"]), [name, number, json.dumps(arguments)])
    plpy.commit()
    return dict(plpy.execute(plpy.prepare(
        f"SELECT * FROM {cycles} WHERE owner = current_user AND cycle_name = $1 AND cycle = $2",
        ["text", "integer"]), [name, number])[0])


def _finish(plpy: Any, cycles: str, name: str, number: int, out: str) -> None:
    """The cycle's job has finished: its best model recorded, the cycle finished."""
    results = analysis.results_of(plpy, out, None)
    ranked = analysis.ranked_models(results)
    job = analysis.job_of(plpy, catalog.resolve_table(plpy, out, argument="model_output_table"))
    plpy.execute(plpy.prepare(
        f"UPDATE {cycles} SET state = $1, job_id = $2, objective = $3, best_mst_key = $4, "
        "best_value = $5, finished_at = now() WHERE owner = current_user AND cycle_name = $6 AND cycle = $7",
        ["text", "bigint", "text", "integer", "double precision", "text", "integer"]),
        [FINISHED, job.job_id if job else None, results.objective.label,
         ranked[0][0]["mst_key"] if ranked else None, ranked[0][1] if ranked else None, name, number])
    plpy.commit()
    best = (f"best mst_key {ranked[0][0]['mst_key']}, {results.objective.describe()} {ranked[0][1]:.6g}"
            if ranked else "no model finished an iteration")
    plpy.notice(f"run_cycle: cycle {number} of {name} finished in {out}: {best} (SELECT * FROM "
                f"{catalog.extension_schema(plpy)}.cycle_results)")


def _pack_and_plan(plpy: Any, cycles: str, name: str, number: int, arguments: dict, out: str,
                   mst: str, previous: dict | None) -> None:
    """The cycle's first step, in one transaction: the new rows packed, the models carried
    over added as models of their own, the cycle's configurations written, its row updated."""
    appended = preprocessor_dl_append(plpy, arguments["packed_table"], arguments["source_table"])
    if arguments["validation_source"] is not None:
        preprocessor_dl_append(plpy, arguments["validation_table"], arguments["validation_source"])
    training = packed.read_summary(plpy, arguments["packed_table"], argument="packed_table")
    validation = (packed.read_summary(plpy, arguments["validation_table"], argument="validation_table")
                  if arguments["validation_table"] else None)
    new, arch, objects = [], None, None
    if arguments["model_selection_table"] is not None:
        _, arch, configs, objects = selection_configs(plpy, arguments["model_selection_table"])
        new = [Config(c["model_id"], c["compile_params"], c["fit_params"]) for c in configs]
    carried, kept = [], []
    if previous is not None and arguments["top_k"] > 0:
        _, before_arch, _, before_objects = selection_configs(plpy, previous["model_selection_table"])
        arch = arch or before_arch
        objects = objects or before_objects  # the carried models' custom functions
        for model, _, _ in analysis.ranked_models(analysis.results_of(plpy, previous["model_output_table"],
                                                                        None))[:arguments["top_k"]]:
            weights = plpy.execute(plpy.prepare(
                f"SELECT model_arch::text AS arch, model_weights FROM "
                f"{catalog.resolve_table(plpy, previous['model_output_table'], argument='model_output_table').name} "
                "WHERE mst_key = $1", ["integer"]), [model["mst_key"]])[0]
            model_id = model_catalog.load_keras_model(
                plpy, arch, weights["arch"], weights["model_weights"],
                f"{name} cycle {previous['cycle']} mst_key {model['mst_key']}",
                f"carried over into cycle {number} of {name}, warm-started from its final weights",
                caller="run_cycle")
            carried.append(Config(model_id, model["compile_params"], model["fit_params"]))
            kept.append({"mst_key": len(carried), "from_mst_key": model["mst_key"], "model_id": model_id})
    configurations = model_catalog.create_selection_table(plpy, mst, arch, objects, carried + new)
    plpy.execute(plpy.prepare(
        f"UPDATE {cycles} SET state = $1, num_rows = $2, appended = $3, validation_rows = $4, "
        "model_selection_table = $5, model_output_table = $6, carried = $7, configurations = $8 "
        "WHERE owner = current_user AND cycle_name = $9 AND cycle = $10",
        ["text", "bigint", "bigint", "bigint", "text", "text", "jsonb", "integer", "text", "integer"]),
        [TRAINING, training["num_rows"], appended, validation["num_rows"] if validation else None, mst, out,
         json.dumps(kept), configurations, name, number])
    plpy.notice(f"run_cycle: cycle {number} of {name}: {appended} new rows ({training['num_rows']} in "
                f"all), {len(carried)} models carried over from cycle {previous['cycle'] if previous else '-'}"
                f", {configurations - len(carried)} new configurations")


def _table(plpy: Any) -> str:
    return f"{catalog.extension_schema(plpy)}.cycles"


def _name(plpy: Any, cycle_name: str | None) -> str:
    """The cycles' name as its outputs are named (checked: <name>_c<k>_mst must be a
    table name the caller may create)."""
    if cycle_name is None or not cycle_name.strip():
        raise MadlibMopError("cycle_name is NULL or empty", sqlstate=errors.INVALID_PARAMETER_VALUE,
                             hint="Name the cycles, e.g. 'nightly': their outputs are nightly_c1, nightly_c2, ...")
    catalog.new_table(plpy, f"{cycle_name}_c99999_mst_summary", argument="cycle_name")
    return cycle_name
