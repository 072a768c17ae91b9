"""Transfer learning's explicit form: a layer's features of a stored model, materialized
into a packed table that later jobs train on (`materialize_features`,
`materialize_features_byom`).

A job stages frozen layers by itself (`runtime.staging`), for that job.  Across jobs (the
heads of next week on the base network of this week) the features are written once: the
output is a packed table like the source (the same segments, buffers and labels), whose
features are the model's layer output for each row, with a `_summary` that says whose
features they are.  Its feature_shape is the layer's output shape: the heads trained on it
take that input.
"""

from __future__ import annotations

import contextlib
import re
import time
from typing import Any

import numpy as np
from psycopg.types.json import Jsonb

from madlib_mop import errors
from madlib_mop.api import deployments, model_catalog
from madlib_mop.db import catalog, packed, segments
from madlib_mop.engine.cluster import on_server, slot_session
from madlib_mop.engine.pool import run_all
from madlib_mop.errors import MadlibMopError
from madlib_mop.job import outputs
from madlib_mop.json_values import json_value
from madlib_mop.preprocess.output import PackedOutput, write_features_summary
from madlib_mop.runtime import keras_json, staging, training
from madlib_mop.runtime.buffers import PackedColumns
from madlib_mop.segment import materialize, models
from madlib_mop.segment.models import ModelRef


def materialize_features(plpy: Any, model_table: str, source_table: str, output_table: str,
                         layer: str, mst_key: int | None = None) -> None:
    model_table, mst_key = deployments.resolve(plpy, model_table, mst_key)
    ref = models.trained_models(plpy, model_table, mst_key)[0]
    described = f"{ref.model_table}" + (f" mst_key {ref.mst_key}" if ref.mst_key is not None else "")
    _materialize(plpy, ref, described, source_table, output_table, layer, trained_on=ref.normalizing_const)


def materialize_features_byom(plpy: Any, model_arch_table: str, model_id: int, source_table: str,
                              output_table: str, layer: str) -> None:
    ref = models.architecture_model(plpy, model_arch_table, model_id)
    _materialize(plpy, ref, f"{ref.model_table} model_id {model_id}", source_table, output_table, layer)


def _layer_index(model, layer: str, described: str) -> int:
    """The index in model.layers of `layer`: a layer's name, or an index (negative from the
    end, as in Python)."""
    names = [each.name for each in model.layers]
    if layer is None:
        raise MadlibMopError("layer is NULL", sqlstate=errors.NULL_VALUE_NOT_ALLOWED,
                             detail=f"The layers of {described}: {', '.join(names)}.",
                             hint="Pass a layer's name, or its index in that list (0 is the first).")
    text = str(layer).strip()
    if re.fullmatch(r"-?[0-9]+", text) and -len(names) <= int(text) < len(names):
        return int(text)
    if text in names:
        return names.index(text)
    raise MadlibMopError(f"layer {layer!r} is not a layer of {described}",
                         sqlstate=errors.INVALID_PARAMETER_VALUE, detail=f"Its layers: {', '.join(names)}.",
                         hint="Pass a layer's name, or its index in that list (0 is the first, -1 the last).")


def _layer_model(ref: ModelRef, described: str, layer: str, summary: dict):
    """The model from its input to `layer` (a name, or an index into model.layers)."""
    import keras

    model = models.build(ref, compile_model=False)
    shape = keras_json.input_shape(model, "materialize_features")
    keras_json.require_input_shape(shape, summary["feature_shape"], packed.packed_columns(summary)[0][0],
                                   summary["packed_table"], who=f"{described}: ",
                                   hint="Pass the packed table of the data the model was made for.")
    chosen = model.layers[_layer_index(model, layer, described)]
    if chosen is model.layers[-1]:
        raise MadlibMopError(f"layer {chosen.name} is the model's output: its features are its predictions",
                             sqlstate=errors.INVALID_PARAMETER_VALUE,
                             hint="Pass a layer before the last; madlib_keras_predict gives the output.")
    return staging.LayerOutput(keras.Model(model.inputs, chosen.output)), chosen.name, model.layers.index(chosen)


def _source(plpy: Any, source_table: str) -> tuple[dict, catalog.Table]:
    """The packed table's summary and the table, packed by madlib_mop."""
    summary = packed.read_summary(plpy, source_table, argument="source_table")
    if packed.partition_modulus(summary) is not None:
        raise MadlibMopError(f"source_table {summary['packed_table']} was packed by MADlib",
                             sqlstate=errors.FEATURE_NOT_SUPPORTED,
                             hint="Pack the data with madlib_mop's training_preprocessor_dl.")
    return summary, catalog.resolve_table(plpy, summary["packed_oid"], argument="source_table")


def _materialize(plpy: Any, ref: ModelRef, described: str, source_table: str, output_table: str,
                 layer: str, trained_on: float | None = None) -> None:
    """`trained_on`: the normalizing_const of the data the model was trained on, when known."""
    summary, source = _source(plpy, source_table)
    placed = segments.placement(plpy, source)  # None: its segments are this server's
    if trained_on is not None and float(summary["normalizing_const"] or 1.0) != float(trained_on):
        raise MadlibMopError(
            f"{summary['packed_table']} was packed with normalizing_const {summary['normalizing_const']}, "
            f"{described} was trained on data packed with {trained_on}",
            sqlstate=errors.DATATYPE_MISMATCH,
            hint="Pack the data with the normalizing_const of the model's training data.")
    out = catalog.new_table(plpy, output_table, argument="output_table")
    summary_out = out.sibling("_summary", plpy)
    feature_model, layer_name, layer_index = _layer_model(ref, described, layer, summary)
    features_of, digest = f"{described}, layers up to {layer_name}", feature_model.digest()
    first = _computed_before(plpy, out, summary_out, summary, features_of, digest)
    if first is None:
        out.must_not_exist(plpy)
        summary_out.must_not_exist(plpy)
    x_columns, y_columns = packed.packed_columns(summary)
    if len(x_columns) > 1 or len(y_columns) > 1:
        raise MadlibMopError(f"source_table {summary['packed_table']} was packed for a model of "
                             "several inputs or outputs: materialize_features takes one of each",
                             sqlstate=errors.FEATURE_NOT_SUPPORTED,
                             hint="Pack one feature column and one label column.")
    columns = PackedColumns(x_columns, y_columns, summary["label_kind"] == "classification")
    # On segment servers, the output's segments are where the source's are.
    homes = None if placed is None else [placed[k].server for k in range(int(summary["num_segments"]))]
    output = PackedOutput(plpy, out, list(x_columns), list(y_columns), homes)
    try:
        if first is None:
            insert, first = output.create(int(summary["num_segments"])), 0
        else:  # the buffers from `first` on are computed (again)
            # (a table on segment servers is not packed in key order: `first` is None there)
            insert = plpy.prepare(*output.insert_sql(out.quoted))
            plpy.execute(plpy.prepare(f"DELETE FROM {out.quoted} WHERE buffer_id >= $1", ["integer"]), [first])
            plpy.execute(f"DROP TABLE {summary_out.quoted}")
        if placed is None:
            rows = sum(_computed_here(plpy, feature_model, summary, columns, segment, first, insert, layer_name)
                       for segment in range(int(summary["num_segments"])))
        else:
            rows = _computed_there(plpy, ref, layer_index, layer_name, digest, summary, placed, out)
        feature_shape = list(feature_model.shape)
        write_features_summary(plpy, source, summary_out, summary["packed_table"], out.quoted, feature_shape,
                               features_of, digest)
    except BaseException:
        output.drop_remote()
        raise
    computed = "" if first == 0 else f", {rows} of them computed now (the others were already)"
    plpy.notice(f"materialize_features: {out.quoted} holds {summary['num_rows']} rows of features of shape "
                f"{feature_shape} ({described}, up to layer {layer_name}){computed}")


def _computed_here(plpy: Any, feature_model: Any, summary: dict, columns: PackedColumns, segment: int,
                   first: int, insert: Any, layer_name: str) -> int:
    """The features of one segment of this server, computed in this session: its rows."""
    started = time.perf_counter()
    rows = materialize.compute_segment(plpy, feature_model, summary["packed_table"], columns, segment, first,
                                       lambda values: plpy.execute(insert, values))
    plpy.notice(f"materialize_features: segment {segment + 1} of {summary['num_segments']}: "
                f"{rows} rows through {layer_name} in {time.perf_counter() - started:.1f} s")
    return rows


def _computed_there(plpy: Any, ref: ModelRef, layer_index: int, layer_name: str, digest: str, summary: dict,
                    placed: dict, out: catalog.NewTable) -> int:
    """The features of segments on segment servers, each server's computed there into its
    partitions of the output (`segment.materialize`), all at once, in a worker session of
    each (counted by its cap): the rows."""
    if len(ref.weights) > outputs.WEIGHTS_VALUE_BYTES:
        raise MadlibMopError(f"the weights of {ref.model_table} ({len(ref.weights) / 2**20:.0f} MB) are too "
                             "big to be sent to segment servers", sqlstate=errors.FEATURE_NOT_SUPPORTED,
                             hint="Materialize the features of a table packed on this server.")
    there = segments.placement(plpy, catalog.resolve_table(plpy, out.quoted))
    x_columns, y_columns = packed.packed_columns(summary)
    tasks: dict[str, tuple[segments.SegmentServer, dict]] = {}
    for segment, part in sorted(placed.items()):
        server, task = tasks.setdefault(part.server.name, (part.server, {
            "model_arch": ref.model_arch, "layer": layer_index, "digest": digest,
            "columns": [list(x_columns), list(y_columns)], "segments": {},
            "classification": summary["label_kind"] == "classification"}))
        task["segments"][str(segment)] = {"source": part.name, "output": there[segment].name}
    schema = catalog.extension_schema(plpy)
    plpy.notice(f"materialize_features: computing on {', '.join(s.label for s, _ in tasks.values())}, "
                "each its own segments")

    def compute(session, server, task) -> dict:
        try:
            # (its TensorFlow threads: the server's own, by its cores)
            return session.execute(f"SELECT {schema}._mop_segment_materialize(%s, %s)",
                                   (Jsonb(task), ref.weights), binary=True).fetchone()[0]
        except Exception as error:
            raise on_server(server, error) from None

    with contextlib.ExitStack() as stack:
        sessions = [stack.enter_context(slot_session(plpy, server)) for server, _ in tasks.values()]
        results = run_all(sessions, [lambda session, server=server, task=task: compute(session, server, task)
                                     for server, task in tasks.values()], lambda: plpy.execute("SELECT 1"))
    done = {int(k): v for result in results for k, v in result["segments"].items()}
    for segment in sorted(done):
        plpy.notice(f"materialize_features: segment {segment + 1} of {summary['num_segments']} "
                    f"({placed[segment].server.label}): {done[segment]['rows']} rows through {layer_name} "
                    f"in {done[segment]['seconds']:.1f} s")
    return sum(one["rows"] for one in done.values())


def _computed_before(plpy: Any, out: catalog.NewTable, summary_out: catalog.NewTable, source: dict,
                     features_of: str, digest: str) -> int | None:
    """None when `out` does not exist; else the first buffer whose features are to be
    computed (again), when `out` holds this layer's features of the same source, packed in
    key order: the block that was not full when they were computed, on (rows appended since
    come after it), or every buffer (0) when the layers' weights changed since."""
    if not out.exists(plpy):
        return None
    refused = MadlibMopError(
        f"output_table {out.quoted} already exists", sqlstate=errors.DUPLICATE_TABLE,
        hint="Drop it, or pass another name.  Features of the same layer of the same model, of a "
             "source packed with key_column, are computed again into it for the rows appended since.")
    found = catalog.summary_of(plpy, catalog.resolve_table(plpy, out.quoted, argument="output_table"))
    before = dict(found[1][0]) if found and len(found[1]) == 1 else {}
    order, then = (packed.rows_in_key_order(summary) for summary in (source, before))
    if order is None or then is None or before.get("features_of") != features_of \
            or before.get("source_table") != source["packed_table"]:
        raise refused
    packed.lock_for_change(plpy, catalog.resolve_table(plpy, out.quoted, argument="output_table"),
                           "materialized into")
    same_key = {k: v for k, v in packed.key_order(before).items() if k not in ("last", "rows")} == \
        {k: v for k, v in packed.key_order(source).items() if k not in ("last", "rows")}
    if before.get("features_source_oid") != source["packed_oid"] or not same_key \
            or before.get("shuffle_seed") != source.get("shuffle_seed") \
            or before.get("num_segments") != source["num_segments"]:
        plpy.notice(f"materialize_features: {source['packed_table']} was packed again since {out.quoted} "
                    "was computed: every row's features are computed again")
        return 0
    if before.get("features_digest") != digest or then > order:
        plpy.notice(f"materialize_features: the weights of {features_of} changed since {out.quoted} "
                    "was computed: every row's features are computed again"
                    if before.get("features_digest") != digest else
                    f"materialize_features: {source['packed_table']} holds fewer rows than when "
                    f"{out.quoted} was computed: every row's features are computed again")
        return 0
    per_block = int(source["num_segments"]) * packed.key_order(source)["buffer_size"]
    return then // per_block * int(source["num_segments"])


HEAD_HINT = ('Pass a JSON array of Keras layer configs, e.g. [{"class_name": "Flatten", "config": {}}, '
             '{"class_name": "Dense", "config": {"units": 10, "activation": "softmax"}}].')


def _base_model(plpy: Any, base_table: str, base_id: int | None) -> tuple[ModelRef, str]:
    """A stored model: a fit's output (base_id its mst_key) or a deployment's name, or an
    architecture table of load_keras_model's (base_id its model_id)."""
    resolved, mst_key = deployments.resolve(plpy, base_table, base_id)
    if resolved == base_table:  # (not a deployment's name)
        table = catalog.resolve_table(plpy, base_table, argument="base_table")
        found = catalog.summary_of(plpy, table)
        if found is None:
            if not {"model_id", "model_arch", "model_weights"} <= set(catalog.columns(plpy, table)):
                raise MadlibMopError(
                    f"base_table {table.name} is neither a fit's output nor an architecture table",
                    sqlstate=errors.INVALID_PARAMETER_VALUE,
                    hint="Pass a model_output_table of madlib_keras_fit(_multiple_model), a "
                         "deployment's name, or a table of load_keras_model's.")
            if base_id is None:
                raise MadlibMopError(f"base_id is NULL: which model of {table.name}?",
                                     sqlstate=errors.NULL_VALUE_NOT_ALLOWED,
                                     hint=f"Pass its model_id: SELECT model_id, name FROM {table.name};")
            return models.architecture_model(plpy, table.name, base_id), f"{table.name} model_id {base_id}"
        if mst_key is None and "compile_params" not in found[1][0]:
            raise MadlibMopError(f"base_id is NULL: which model of {table.name}?",
                                 sqlstate=errors.NULL_VALUE_NOT_ALLOWED,
                                 hint=f"Pass its mst_key as base_id: SELECT mst_key FROM {table.name};")
    ref = models.trained_models(plpy, resolved, mst_key)[0]
    return ref, f"{ref.model_table}" + (f" mst_key {ref.mst_key}" if ref.mst_key is not None else "")


def _head_layers(head: Any, input_shape: list[int], taken: list[str], base_names: list[str]) -> list:
    """The head's layers, built on inputs of `input_shape`, from a JSON array of Keras layer
    configs (as Keras 2 wrote them, or Keras 3), through the architectures' safe loading."""
    import copy

    layers = json_value(head)
    if not isinstance(layers, list) or not layers or not all(
            isinstance(x, dict) and isinstance(x.get("config", {}), dict) for x in layers):
        raise MadlibMopError("head is not a JSON array of one or more Keras layers",
                             sqlstate=errors.INVALID_PARAMETER_VALUE, hint=HEAD_HINT)
    layers = copy.deepcopy(layers)
    for number, layer in enumerate(layers):
        config = layer.setdefault("config", {})
        if "name" not in config:  # a name no layer of the base has (a base may be a transfer model)
            config["name"] = f"head_{number + 1}_{str(layer.get('class_name', '')).lower()}"
            while config["name"] in base_names:
                config["name"] += "_new"
        if config["name"] in taken:
            raise MadlibMopError(f"head layer {config['name']} has the name of a base layer",
                                 sqlstate=errors.INVALID_PARAMETER_VALUE,
                                 hint="Name the head's layers otherwise, or leave their names out.")
    layers[0]["config"]["batch_input_shape"] = [None] + list(input_shape)
    try:
        model = keras_json.model_from_config(keras_json.parse_model_json(
            {"class_name": "Sequential", "config": {"name": "head", "layers": layers}}))
    except MadlibMopError as error:  # said of the head, not of a model_arch
        raise MadlibMopError(f"head: {error.message.replace('model_arch ', '')}", sqlstate=error.sqlstate,
                             detail=error.detail, hint=HEAD_HINT if "to_json" in (error.hint or "")
                             else error.hint) from None
    return list(model.layers)


def load_transfer_model(plpy: Any, model_arch_table: str, base_table: str, base_id: int | None,
                        layer: str, head: Any, name: str | None = None, description: str | None = None,
                        seed: int | None = 0) -> int:
    """A new model of `model_arch_table`: the base's layers up to `layer`, frozen with their
    trained weights, then the head's new layers (initialised from `seed`).  A job stages
    the frozen layers (`runtime.staging`): models on one base and layer share their
    features."""
    import keras

    ref, described = _base_model(plpy, base_table, base_id)
    base = models.build(ref, compile_model=False)
    if not isinstance(base, keras.Sequential):
        raise MadlibMopError(f"{described} is a functional model", sqlstate=errors.FEATURE_NOT_SUPPORTED,
                             hint="Load the base as a keras.Sequential model.")
    names = [each.name for each in base.layers]
    cut = _layer_index(base, layer, described) % len(names)
    training.seed_initialisers(training.derived_seed(int(seed or 0), 0x7EAD))
    head_layers = _head_layers(head, [int(d) for d in base.layers[cut].output.shape[1:]], names[:cut + 1],
                               names)
    frozen = [(type(each).from_config(each.get_config() | {"trainable": False}), each)
              for each in base.layers[:cut + 1]]
    model = keras.Sequential([keras.Input(base.input_shape[1:])] + [copy for copy, _ in frozen]
                             + head_layers, name=f"{base.name}_to_{names[cut]}")
    for copy, each in frozen:
        copy.set_weights(each.get_weights())
    weights = b"".join(np.asarray(v.numpy(), "<f4").tobytes() for v in model.weights)
    model_id = model_catalog.load_keras_model(
        plpy, model_arch_table, model.to_json(), weights, name,
        description or f"{described}, frozen up to {names[cut]}, and a new head",
        caller="load_transfer_model")
    return model_id
