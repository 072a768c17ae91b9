"""Planning a job: everything checked before it starts (inputs, models against the data)."""

from __future__ import annotations

import shlex

from dataclasses import dataclass, field
from typing import Any

from madlib_mop import errors
from madlib_mop.db import catalog, custom_functions, packed, segments, settings
from madlib_mop.errors import MadlibMopError
from madlib_mop.job import fusing, keras_work, versions
from madlib_mop.job.record import JobArguments
from madlib_mop.job.tables import SUFFIXES_LONGEST_FIRST
from madlib_mop.grammar import model_config
from madlib_mop.runtime import keras_json, staging, training
from madlib_mop.runtime.custom_functions import CustomFunctions
from madlib_mop.search import setup


@dataclass(frozen=True)
class Plan:
    """Everything checked before a job starts; built once by `plan_job`."""

    source: dict  # summary of the packed training table
    validation: dict | None
    model_selection_table: str
    model_arch_table: str
    configs: list[dict]  # mst_key, model_id, model_arch, compile_params, fit_params, weights
    num_iterations: int
    frequency: int
    epochs: dict  # mst_key -> fit epochs (passes per iteration)
    out: catalog.NewTable
    arguments: JobArguments  # as the job records them
    also_due: frozenset = frozenset()  # iterations a pruner decides at (metrics computed)
    info_labels: dict = field(default_factory=dict)  # mst_key -> extra _info columns


def _check_model(plpy: Any, config: dict, source: dict, facts: dict,
                 validation: dict | None = None, custom: CustomFunctions | None = None) -> None:
    """Does the model fit the data (and the validation data's features): input shape,
    output width, loss?  `facts`: the configuration's (`job.keras_work`); `custom`: the
    job's custom functions."""
    spec = training.ModelSpec.of(config, custom)
    # Built-in names, or functions of the job's object table (a row edited by hand too).
    model_config.parse_compile_params(config["compile_params"],
                                      custom_names=tuple(custom.digests) if custom else ())
    fit = spec.fit
    for key in ("steps_per_epoch", "initial_epoch"):
        if key in fit:
            raise MadlibMopError(
                f"mst_key {config['mst_key']}: fit_params {key} is not supported by model hopping",
                sqlstate=errors.FEATURE_NOT_SUPPORTED,
                hint="Every sub-epoch is one pass over a segment; remove it from fit_params.")
    for data in (source, validation) if validation is not None else (source,):
        keras_json.require_input_shapes(
            facts["input_shapes"], data["input_shapes"], packed.packed_columns(data)[0],
            data["packed_table"], who=f"model {config['model_id']} (mst_key {config['mst_key']}): ",
            hint="Load an architecture whose input shape is the feature shape, or pack the "
                 "features in the model's shape.")
    params = spec.compile
    classification = source["label_kind"] == "classification"
    labels = source["dependent_varname"]
    if len(facts["output_widths"]) != len(labels):
        raise MadlibMopError(
            f"model {config['model_id']} (mst_key {config['mst_key']}) has "
            f"{len(facts['output_widths'])} outputs, {source['packed_table']} has {len(labels)} "
            f"label columns ({', '.join(labels)})", sqlstate=errors.DATATYPE_MISMATCH,
            hint="Pack one label column per output of the model, in the order of its outputs "
                 "(dependent_varname 'y1, y2').")
    if len(labels) > 1 and "class_weight" in fit:
        raise MadlibMopError(
            f"mst_key {config['mst_key']}: fit_params class_weight weighs the classes of one "
            f"output; {source['packed_table']} has {len(labels)} label columns",
            sqlstate=errors.FEATURE_NOT_SUPPORTED,
            hint="Remove class_weight, or train a model of one output.")
    if classification:
        for k, (outputs, label) in enumerate(zip(facts["output_widths"], labels)):
            width = packed.class_count(source, k)
            if params.loss in training.SPARSE_LOSSES or outputs != 1:
                if outputs != width:
                    raise MadlibMopError(
                        f"model {config['model_id']} (mst_key {config['mst_key']}) has {outputs} "
                        f"outputs, the labels of {source['packed_table']} have {width} classes"
                        + (f" ({label})" if len(labels) > 1 else ""),
                        sqlstate=errors.DATATYPE_MISMATCH,
                        hint=f"Give the last layer {width} units.")
            else:
                raise MadlibMopError(
                    f"mst_key {config['mst_key']}: loss {params.loss} with 1 output does not fit "
                    f"{width} one-hot classes", sqlstate=errors.DATATYPE_MISMATCH,
                    hint=f"Give the last layer {width} units.")
    else:
        if params.loss in training.SPARSE_LOSSES or params.loss in (
                "categorical_crossentropy", "categorical_focal_crossentropy", "categorical_hinge"):
            raise MadlibMopError(
                f"mst_key {config['mst_key']}: loss {params.loss} needs class labels, "
                f"{source['packed_table']} holds regression targets",
                sqlstate=errors.DATATYPE_MISMATCH,
                hint="Use a regression loss such as mean_squared_error.")


def selection_configs(plpy: Any, model_selection_table: str) -> tuple[str, str, list[dict], str | None]:
    """The model selection table's configurations, with their architectures, and the object
    table of custom functions its summary names."""
    mst = catalog.resolve_table(plpy, model_selection_table, argument="model_selection_table")
    missing = [c for c in ("mst_key", "model_id", "compile_params", "fit_params")
               if c not in catalog.columns(plpy, mst)]
    found = catalog.summary_of(plpy, mst)
    summary_row = found[1][0] if found and found[1] and "model_arch_table" in found[1][0] else None
    if missing or summary_row is None:
        raise MadlibMopError(
            f"model_selection_table {mst.name} was not made by generate_model_configs",
            sqlstate=errors.UNDEFINED_TABLE if summary_row is None else errors.UNDEFINED_COLUMN,
            hint="Create it with generate_model_configs() or load_model_selection_table().")
    arch_name = summary_row["model_arch_table"]
    arch = catalog.resolve_table(plpy, arch_name, argument="model_arch_table")
    configs = [dict(r) for r in plpy.execute(
        f"SELECT m.mst_key, m.model_id, m.compile_params, m.fit_params, "
        f"a.model_arch::text AS model_arch, a.model_weights AS weights "
        f"FROM {mst.name} m LEFT JOIN {arch.name} a ON a.model_id = m.model_id ORDER BY m.mst_key")]
    if not configs:
        raise MadlibMopError(f"model_selection_table {mst.name} is empty",
                             sqlstate=errors.DATA_EXCEPTION,
                             hint="Fill it with generate_model_configs().")
    for config in configs:
        if config["model_arch"] is None:
            raise MadlibMopError(f"model_id {config['model_id']} is not in {arch.name}: no model "
                                 f"arch found in table {arch.name} with id {config['model_id']}",
                                 sqlstate=errors.INVALID_PARAMETER_VALUE,
                                 hint="Load the architecture with load_keras_model().")
    return mst.name, arch.name, configs, summary_row.get("object_table")


def plan_job(plpy: Any, source_table: str, model_output_table: str, model_selection_table: str,
             num_iterations: int, use_gpus: bool | None, validation_table: str | None,
             metrics_compute_frequency: int | None, warm_start: bool | None, name: str | None,
             description: str | None, use_caching: bool | None, seed: int | None, *,
             given: tuple[str, str, list[dict]] | None = None, extra: dict | None = None,
             policy: str = "error", info_labels: dict | None = None,
             object_table: str | None = None, named: tuple[str, ...] = ()) -> Plan:
    """`given`: (model selection table, model_arch_table, configurations) of a search that
    proposes them itself (madlib_keras_automl), instead of reading the model selection table,
    with its `object_table` of custom functions (and the functions its grid `named`: later
    proposals may use them); else the model selection table's summary names the object table.
    `extra`: more arguments the job records (a pruner, automl's search, single); `policy`:
    if_output_exists; `info_labels`: mst_key -> extra `_info` columns."""
    if use_gpus:
        raise MadlibMopError("use_gpus: this server has no GPU support configured",
                             sqlstate=errors.FEATURE_NOT_SUPPORTED,
                             hint="Pass use_gpus => FALSE.")
    if num_iterations is None or num_iterations < 1:
        raise MadlibMopError(f"num_iterations must be at least 1, not {num_iterations}: "
                             "Number of iterations cannot be < 1",
                             sqlstate=errors.INVALID_PARAMETER_VALUE,
                             hint="Pass the number of passes over the data, e.g. 10.")
    frequency = num_iterations if metrics_compute_frequency is None else metrics_compute_frequency
    if not 1 <= frequency <= num_iterations:
        raise MadlibMopError(
            f"metrics_compute_frequency must be between 1 and num_iterations ({num_iterations}): "
            f"metrics_compute_frequency must be in the range (1 - {num_iterations})",
            sqlstate=errors.INVALID_PARAMETER_VALUE,
            hint="Pass NULL (metrics after the last iteration) or a number in that range.")
    source = packed.read_summary(plpy, source_table, argument="source_table")
    validation = (packed.read_summary(plpy, validation_table, argument="validation_table")
                  if validation_table else None)
    inputs = {argument: catalog.resolve_table(plpy, summary["packed_oid"])
              for argument, summary in (("source_table", source), ("validation_table", validation))
              if summary}
    catalog.committed(plpy, inputs, packed=tuple(inputs))
    if validation is not None:
        _check_validation(plpy, source, validation, source_table)
    if given is None:
        mst_name, arch_name, configs, object_table = selection_configs(plpy, model_selection_table)
    else:
        mst_name, arch_name, configs = given
    out = catalog.new_table(plpy, model_output_table, argument="model_output_table")
    for suffix in SUFFIXES_LONGEST_FIRST:
        if suffix:
            out.sibling(suffix, plpy)  # checks the names fit
    arguments = {"source_table": source_table, "model_output_table": model_output_table,
                 "model_selection_table": model_selection_table, "num_iterations": num_iterations,
                 "validation_table": validation_table, "metrics_compute_frequency": frequency,
                 "warm_start": bool(warm_start), "name": name, "description": description,
                 "use_caching": use_caching is not False, "seed": int(seed or 0)}
    arguments.update(extra or {})
    rows = {argument: packed.rows_in_key_order(summary)
            for argument, summary in (("source_table", source), ("validation_table", validation))
            if summary and packed.rows_in_key_order(summary) is not None}
    if rows:
        arguments["packed_rows"] = rows
    recorded = custom_functions_of(plpy, object_table, [c["compile_params"] for c in configs],
                                   source, also=named)
    if recorded:
        arguments["custom_functions"] = recorded
    arguments.update(_recorded_settings(plpy))
    arguments["orders"] = fusing.path_grouping(configs, bool(recorded))
    if policy == "new_version":
        out = versions.versioned_output(plpy, out, arguments)
    recorded = JobArguments.of(arguments)
    # The search is checked now (a bad pruner fails before anything is written); its pruner
    # decides at these iterations too.  The coordinator builds it again from the recorded
    # arguments, as it does for a resumed job.
    search = setup.search_of_job(recorded.automl, recorded.pruner, num_iterations,
                                 {c["mst_key"]: c["compile_params"] for c in configs},
                                 validation is not None)
    epochs = {c["mst_key"]: model_config.fit_epochs(c["fit_params"]) for c in configs}
    _warn_of_callbacks(plpy, configs, out)
    if recorded.stage_frozen_layers:
        _note_staged(plpy, configs)
    note_ignored_compile_params(plpy, [c["compile_params"] for c in configs])
    return Plan(source, validation, mst_name, arch_name, configs, num_iterations, frequency,
                epochs, out, recorded, frozenset(search.pruner.required_iterations()),
                info_labels or {})


def _check_validation(plpy: Any, source: dict, validation: dict, source_table: str) -> None:
    """The validation data is packed like the training data (its feature shape is checked
    against each model's input: `_check_model`)."""
    for key in ("label_kind", "normalizing_const", "class_values", "num_classes"):
        if key == "class_values" and _one_hot_of_same_classes(plpy, source, validation):
            continue
        if validation[key] != source[key]:
            raise MadlibMopError(
                f"validation_table {validation['packed_table']} does not match "
                f"{source['packed_table']}: {key} differs",
                sqlstate=errors.DATATYPE_MISMATCH,
                hint="Pack the validation data with validation_preprocessor_dl(..., "
                     f"training_preprocessor_table => '{source_table}').")


def _one_hot_of_same_classes(plpy: Any, source: dict, validation: dict) -> bool:
    """Validation labels given as one-hot arrays, training labels as classes (or the other
    way round), of as many classes: position i is the training data's i-th class, as
    MADlib reads them."""
    one_hot = [str((s.get("dependent_vartype") or [""])[0]).endswith("[]") for s in (source, validation)]
    if one_hot[0] == one_hot[1] or source["num_classes"] != validation["num_classes"]:
        return False
    plpy.notice(f"validation_table {validation['packed_table']}: "
                + (f"the positions of its one-hot labels are the classes of {source['packed_table']}"
                   if one_hot[1] else
                   f"its classes are the positions of {source['packed_table']}'s one-hot labels")
                + ", in order")
    return True


def note_ignored_compile_params(plpy: Any, texts: list[str]) -> None:
    """A NOTICE, once per call, for Keras 2 compile arguments given with their default,
    which Keras 3 no longer has (MADlib's scripts write sample_weight_mode=None)."""
    ignored = sorted({key for text in texts
                      for key in model_config.parse_compile_params(text, custom_names=None).ignored})
    if ignored:
        plpy.notice(f"compile_params: {', '.join(k + '=None' for k in ignored)} is Keras 2's "
                    "default and Keras 3 has no such argument: ignored")


def _recorded_settings(plpy: Any) -> dict:
    """The settings a job records where they are not as before they existed."""
    recorded = {} if stage_frozen_layers(plpy) else {"stage_frozen_layers": False}
    fuse = fusing.fuse_models(plpy)
    return recorded if fuse == "off" else dict(recorded, fuse_models=fuse)


STAGING_SETTING = "madlib_mop.stage_frozen_layers"


def stage_frozen_layers(plpy: Any) -> bool:
    """madlib_mop.stage_frozen_layers: on (the default) or off."""
    value = settings.setting(plpy, STAGING_SETTING)
    if value is None or value.strip().lower() in ("on", "true", "yes", "1"):
        return True
    if value.strip().lower() in ("off", "false", "no", "0"):
        return False
    raise MadlibMopError(f"setting {STAGING_SETTING} = '{value}' is neither on nor off",
                         sqlstate=errors.INVALID_PARAMETER_VALUE,
                         hint=f"SET {STAGING_SETTING} = off (or RESET {STAGING_SETTING}).")


def _note_staged(plpy: Any, configs: list[dict]) -> None:
    """Say which models train on the features of their frozen first layers."""
    cuts = staging.staged_models(configs)
    if not cuts:
        return
    by_cut: dict[int, list[int]] = {}
    for mst_key, cut in sorted(cuts.items()):
        by_cut.setdefault(cut, []).append(mst_key)
    plpy.notice(f"{len(cuts)} of the {len(configs)} models train on the features of their frozen "
                "first layers, computed once per segment; models whose frozen layers have the same "
                "weights share them (" + "; ".join(f"{cut} frozen layers: mst_key {', '.join(map(str, keys))}"
                                                   for cut, keys in sorted(by_cut.items()))
                + f"); SET {STAGING_SETTING} = off trains them whole")


def _warn_of_callbacks(plpy: Any, configs: list[dict], out: catalog.NewTable) -> None:
    """MADlib's docs pass fit_params callbacks=[TensorBoard(...)]; nothing runs them here (the
    training loop is not Keras' fit).  Said once per call, with the command that writes
    the same curves from the job's records."""
    found = {c["mst_key"]: model_config.fit_callbacks(c["fit_params"]) for c in configs}
    keys = [key for key, callbacks in found.items() if callbacks]
    if not keys:
        return
    log_dir = next((dict(c.arguments).get("log_dir") for c in found[keys[0]]), None)
    plpy.warning(
        f"fit_params of mst_key {', '.join(map(str, keys))}: TensorBoard callbacks are not run "
        f"inside the database; after the job, `madlib-mop tensorboard {shlex.quote(out.quoted)} "
        f"--logdir {shlex.quote(log_dir) if isinstance(log_dir, str) else 'DIR'}` writes "
        "TensorBoard event files from its _info table")


def check_models(plpy: Any, plan: Plan, keras: keras_work.KerasWork) -> dict[str, int]:
    """Every configuration against the data, from its facts (asked of a worker session of
    the job, `job.keras_work`); the bytes of each architecture's weights.  Apart from
    `plan_job`, which needs no Keras: a fit starts its workers in between."""
    custom = custom_of(plan.arguments)
    facts = keras.facts(plan.configs, recorded_custom(plan.arguments))
    for config in plan.configs:
        _check_model(plpy, config, plan.source, facts[config["mst_key"]], plan.validation, custom)
    return {config["model_arch"]: facts[config["mst_key"]]["weight_bytes"] for config in plan.configs}


def check_config(plpy: Any, config: dict, source_table: str, arguments: JobArguments,
                 keras: keras_work.KerasWork) -> dict:
    """One configuration against the packed training data (a searcher's new proposal, or a
    steering action's), with the custom functions the job recorded (`arguments`): its facts."""
    facts = keras.facts([config], recorded_custom(arguments))[config["mst_key"]]
    _check_model(plpy, config, packed.read_summary(plpy, source_table, argument="source_table"),
                 facts, custom=custom_of(arguments))
    return facts


def custom_functions_of(plpy: Any, object_table: str | None, texts: list[str],
                        source: dict, also: tuple[str, ...] = ()) -> dict | None:
    """What a job records of its custom functions: the object table and the SHA-256 of each
    function its compile parameters name (`texts`; `also`: more names, a search grid's that
    later proposals may use), once the table and those rows pass the
    trust rule (`db.custom_functions`; nothing is unpickled here).  A worker checks them
    again, and the digests, before it unpickles (`segment.models.custom_functions`)."""
    if object_table is None or not str(object_table).strip():
        return None
    table, held = custom_functions.names(plpy, object_table)
    named = {n for t in texts for n in model_config.parse_compile_params(t, custom_names=None).named()}
    named.update(also)
    used = sorted(named & set(held))
    if used and segments.placement(plpy, catalog.resolve_table(plpy, source["packed_oid"])) is not None:
        raise MadlibMopError(
            f"custom functions ({', '.join(used)}) are not supported with segment servers",
            sqlstate=errors.FEATURE_NOT_SUPPORTED,
            hint="Train with built-in losses and metrics there, or on a packed table of this server.")
    rows = custom_functions.trusted_rows(plpy, table, used, with_objects=False)
    return {"table": catalog.name_parts(plpy, table.oid), "name": table.name,
            "digests": {name: rows[name]["digest"] for name in used}}


def recorded_functions(plpy: Any, recorded: dict, *, with_objects: bool) -> tuple[catalog.Table, dict]:
    """The rows of the custom functions a job recorded, once the table and each row pass
    the trust rule again (now, as the current role) and hold the bytes the job recorded: a
    job runs the functions it started with, or nothing."""
    table = catalog.resolve_table(plpy, catalog.qualified_name(plpy, recorded["table"]),
                                  argument="object_table")
    rows = custom_functions.trusted_rows(plpy, table, recorded["digests"], with_objects=with_objects)
    changed = sorted(n for n, d in recorded["digests"].items() if rows[n]["digest"] != d)
    if changed:
        raise MadlibMopError(
            f"custom function {', '.join(map(repr, changed))} of {table.name} changed since the "
            "job started", sqlstate=errors.OBJECT_NOT_IN_PREREQUISITE_STATE,
            hint="A job runs the functions it started with (the same model for the same "
                 "configuration): put the function back to resume it, or load the new one under "
                 "another name and start a new job.")
    return table, rows


def check_recorded_functions(plpy: Any, arguments: JobArguments) -> None:
    """Before a job runs or resumes: its custom functions are still there, trusted and
    unchanged (workers check again before they unpickle)."""
    if arguments.custom_functions:
        recorded_functions(plpy, arguments.custom_functions, with_objects=False)


def recorded_custom(arguments: JobArguments) -> dict | None:
    """What a worker is told of the job's custom functions (names and digests: stand-ins
    compile, nothing is unpickled)."""
    recorded = arguments.custom_functions
    return {"name": recorded["name"], "digests": dict(recorded["digests"])} if recorded else None


def custom_of(arguments: JobArguments) -> CustomFunctions | None:
    """The job's custom functions as recorded (names and digests: enough to parse and
    check its configurations; workers load the callables)."""
    recorded = arguments.custom_functions
    return CustomFunctions(recorded["name"], dict(recorded["digests"])) if recorded else None
