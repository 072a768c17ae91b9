"""The job as a typed record: its arguments read back equal to what was recorded, keys of
another version are kept, an incomplete record is refused with a clear error, the states
are the table's, and only the repository queries `jobs`."""

from __future__ import annotations

import ast
import dataclasses
import json
import re
import types
from pathlib import Path

import pytest

from madlib_mop.errors import MadlibMopError
from madlib_mop.job import fusing
from madlib_mop.job.memory import WorkerLimits
from madlib_mop.job.record import JobArguments, JobRecord, JobState

ROOT = Path(__file__).resolve().parent.parent
CALL = {"source_table": "iris_packed", "model_output_table": "public.out", "model_selection_table": "mst",
        "num_iterations": 3, "validation_table": None, "metrics_compute_frequency": 3, "warm_start": False,
        "name": None, "description": None, "use_caching": True, "seed": 0}


@pytest.mark.parametrize("extra", [{}, {"pruner": "median(metric => 'loss')"}, {"single": True},
                                   {"stage_frozen_layers": False},
                                   {"automl": {"method": "hyperband", "params": {"R": 3}}, "initial_models": 0},
                                   {"if_output_exists": "new_version", "output_family": "public.out"}])
def test_arguments_are_recorded_as_given(extra):
    call = {**CALL, **extra}
    arguments = JobArguments.of(call)
    assert arguments.as_json() == call  # nothing added, nothing dropped: a repeat call compares equal
    assert JobArguments.of(json.dumps(arguments.as_json())) == arguments


def test_keys_of_another_version_are_kept():
    recorded = {**CALL, "a_later_option": [1, 2]}
    arguments = JobArguments.of(recorded)
    assert arguments.other == {"a_later_option": [1, 2]}
    assert arguments.as_json() == recorded
    assert arguments != JobArguments.of(CALL)


def test_a_record_without_a_jobs_arguments_is_refused():
    with pytest.raises(MadlibMopError) as caught:
        JobArguments.of({"source_table": "x"})
    assert caught.value.sqlstate == "22000"
    assert "model_output_table" in caught.value.message and caught.value.hint


def test_a_row_reads_as_a_record():
    row = {"job_id": 4, "owner": "alice", "state": "interrupted", "model_output_table": "public.out",
           "source_table": "public.p", "validation_table": None, "model_selection_table": "public.mst",
           "arguments": json.dumps(CALL), "tables": '{"output": ["public", "out"]}', "num_models": 2,
           "num_segments": 2, "validation_partitions": None, "seed": 0, "subepochs_total": 12,
           "subepochs_done": 5, "coordinator_pid": None, "last_error": None, "model_failures": None}
    job = JobRecord.of(row)
    assert job.state is JobState.INTERRUPTED and not job.finished
    assert job.table_names == {"output": ("public", "out")}
    assert job.arguments.num_iterations == 3


def test_the_states_are_the_tables():
    text = (ROOT / "sql" / "30_fit.sql").read_text()
    check = re.search(r"state\s+text NOT NULL DEFAULT 'created'\s+CHECK \(state IN \(([^)]*)\)\)", text)
    assert check is not None
    assert re.findall(r"'([a-z]+)'", check.group(1)) == [s.value for s in JobState]


def _sql_strings(tree: ast.AST):
    """Every string literal; an f-string with {} where it formats a value."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            yield node.value
        elif isinstance(node, ast.JoinedStr):
            yield "".join(part.value if isinstance(part, ast.Constant) else "{}" for part in node.values)


@pytest.mark.parametrize("path", sorted(p for p in (ROOT / "madlib_mop").rglob("*.py")
                                        if "client" not in p.parts),
                         ids=lambda p: str(p.relative_to(ROOT)))
def test_only_the_repository_queries_jobs(path):
    """The server side's SQL on `jobs` is in job/repository.py alone (the client, outside
    the server, reads it over its own connection)."""
    if path.name == "repository.py":
        return
    queries = [s for s in _sql_strings(ast.parse(path.read_text()))
               if re.search(r"(FROM|UPDATE|INTO)\s+\S*\.jobs\b", s)]
    assert not queries, queries


def test_a_job_recorded_before_jobs_recorded_their_orders_is_the_same_call_and_keeps_its_rotations():
    """A job an earlier version started (no `orders` in its arguments) and the same call
    today (which records its paths by class) are the same call: called again, the job goes
    on, with the rotations it had."""
    old = {"source_table": "t_packed", "model_output_table": "public.m", "model_selection_table": "mst",
           "num_iterations": 2, "validation_table": None, "metrics_compute_frequency": 1,
           "warm_start": False, "name": None, "description": None, "use_caching": True, "seed": 7}
    recorded = JobArguments.of(old)
    now = JobArguments.of(dict(old, orders={"by_class": [[1, 3], [2, 4]]}))
    assert recorded.orders == "rotation" and "orders" not in recorded.as_json()
    assert recorded != now and recorded.same_call(now) and now.same_call(recorded)
    assert not recorded.same_call(now.replace(seed=8))
    job = types.SimpleNamespace(arguments=recorded)
    assert fusing.path_classes(job) is None
    job.arguments = now
    assert fusing.path_classes(job) == {1: 0, 3: 0, 2: 1, 4: 1}
    assert not fusing.clones_follow(job)  # (recorded before clones went their sources' paths)
    job.arguments = now.replace(orders=dict(now.orders, clones="source_path"))
    assert fusing.clones_follow(job)
    assert JobArguments.of(json.loads(json.dumps(now.as_json()))) == now


def test_the_paths_recorded_group_the_models_of_each_fusion_class_of_two_or_more():
    mlp = json.dumps({"class_name": "Sequential", "config": {"name": "s", "layers": [
        {"class_name": "InputLayer", "config": {"batch_shape": [None, 4], "name": "i"}},
        {"class_name": "Dense", "config": {"units": 3, "activation": "softmax", "name": "d"}}]}})
    def config(key, lr, batch):
        return {"mst_key": key, "model_arch": mlp, "fit_params": f"batch_size={batch}",
                "compile_params": f"optimizer='Adam(lr={lr})',loss='categorical_crossentropy',metrics=['accuracy']"}
    configs = [config(1, 0.1, 8), config(2, 0.1, 16), config(3, 0.01, 8), config(4, 0.001, 32), config(5, 0.3, 8)]
    assert fusing.path_grouping(configs, custom_functions=False) == {"by_class": [[1, 3, 5]],
                                                                     "clones": "source_path"}
    assert fusing.path_grouping(configs, custom_functions=True) == {"by_class": [], "clones": "source_path"}


def test_a_job_fuses_by_the_classes_it_recorded_and_its_clones_join_them():
    """The classes recorded when the job was made are read back, not worked out again (no
    server or worker is asked: none is given); a clone of a fused model joins its class
    where its configuration is of it."""
    mlp = json.dumps({"class_name": "Sequential", "config": {"name": "s", "layers": [
        {"class_name": "InputLayer", "config": {"batch_shape": [None, 4], "name": "i"}},
        {"class_name": "Dense", "config": {"units": 3, "activation": "softmax", "name": "d"}}]}})
    rows = [{"mst_key": key, "model_arch": mlp, "fit_params": f"batch_size={batch}",
             "compile_params": f"optimizer='Adam(lr={lr})',loss='categorical_crossentropy'"}
            for key, lr, batch in ((1, 0.1, 8), (2, 0.2, 8), (3, 0.1, 16), (4, 0.05, 8), (5, 0.1, 32))]
    old = {"source_table": "t_packed", "model_output_table": "public.m", "model_selection_table": "mst",
           "num_iterations": 2, "validation_table": None, "metrics_compute_frequency": 1,
           "warm_start": False, "name": None, "description": None, "use_caching": True, "seed": 7,
           "fuse_models": "auto", "orders": {"by_class": [[1, 2]], "clones": "source_path", "fused": [[1, 2], [3]]}}
    job = types.SimpleNamespace(job_id=7, arguments=JobArguments.of(old))
    clones = {4: (1, 2), 5: (3, 2)}  # 4 keeps model 1's class; 5 (batch 32) is not of model 3's
    fusing_engine = types.SimpleNamespace(stores_states=False, without_fusion=lambda: [])
    found = fusing.job_classes(None, job, fusing_engine, {1, 2, 3}, lambda: rows, None, clones)
    assert found == {1: 0, 2: 0, 3: 1, 4: 0}
    # Where a segment server can no longer fuse, the job is refused, not trained to other bits.
    older = types.SimpleNamespace(stores_states=False, without_fusion=lambda: ["segment server seg1"])
    with pytest.raises(MadlibMopError) as refused:
        fusing.job_classes(None, job, older, {1, 2, 3}, lambda: rows, None, clones)
    assert refused.value.sqlstate == "0A000" and "seg1" in refused.value.hint
    # A job made before jobs recorded their classes, on segment servers: none fused then.
    unrecorded = types.SimpleNamespace(job_id=8, arguments=JobArguments.of(dict(old, orders={"by_class": [[1, 2]]})))
    assert fusing.job_classes(None, unrecorded, older, {1, 2, 3}, lambda: rows, None, clones) == {}


def test_what_a_fused_call_holds_of_its_segment_and_states():
    source = {"rows_per_segment": [100, 120], "feature_shape": [4], "num_classes": [3]}
    assert fusing.decoded_segment_bytes(source) == 120 * (3 * 4 * 4 + 10 * 3 + 2 * 4 * 16)
    assert fusing.decoded_segment_bytes({"num_rows": 220}) is None  # (packed by MADlib: not said)
    mlp = json.dumps({"class_name": "Sequential", "config": {"name": "s", "layers": [
        {"class_name": "InputLayer", "config": {"batch_shape": [None, 4], "name": "i"}},
        {"class_name": "Dense", "config": {"units": 3, "activation": "softmax", "name": "d"}}]}})
    configs = [{"mst_key": key, "model_arch": mlp, "fit_params": "batch_size=8",
                "compile_params": "optimizer='SGD(lr=0.1)',loss='categorical_crossentropy'"} for key in (1, 2, 3)]
    assert fusing.fused_need({}, configs, source, {mlp: 1000}) is None
    total, held = fusing.fused_need({1: 0, 2: 0, 3: 0}, configs, source, {mlp: 1000})
    # SGD keeps no slot: a state is its weights; 3 copies of one program's, and of a group's
    # 16 stacked (a person's clones may fill it).
    assert held * fusing.memory.MB == 120 * (3 * 4 * 4 + 10 * 3 + 2 * 4 * 16)
    assert total * fusing.memory.MB == 3 * 1000 + 3 * 16 * 1000 + 120 * (3 * 4 * 4 + 10 * 3 + 2 * 4 * 16)


def test_fusion_is_decided_against_the_servers_where_the_fused_calls_run():
    """A job's fused calls must fit madlib_mop.worker_memory_mb of the servers its workers
    run on: the smallest bound of the segment servers' (0: none), named in the NOTICE; and
    an engine whose workers cannot fuse makes none fuse, saying where."""
    mlp = json.dumps({"class_name": "Sequential", "config": {"name": "s", "layers": [
        {"class_name": "InputLayer", "config": {"batch_shape": [None, 64], "name": "i"}},
        {"class_name": "Dense", "config": {"units": 3, "activation": "softmax", "name": "d"}}]}})
    configs = [{"mst_key": key, "model_arch": mlp, "fit_params": "batch_size=8",
                "compile_params": f"optimizer='SGD(lr={lr})',loss='categorical_crossentropy'"}
               for key, lr in ((1, 0.1), (2, 0.2))]
    arguments = JobArguments.of({"source_table": "t_packed", "model_output_table": "public.m",
                                 "model_selection_table": "mst", "num_iterations": 1, "validation_table": None,
                                 "metrics_compute_frequency": 1, "warm_start": False, "name": None,
                                 "description": None, "use_caching": True, "seed": 7,
                                 "fuse_models": "on", "orders": {"by_class": [[1, 2]]}})

    @dataclasses.dataclass(frozen=True)
    class Plan:
        arguments: JobArguments
        source: dict
        configs: list

    # 2 segments of 1,000,000 rows x 64 features: about 500 MB each, decoded.
    plan = Plan(arguments, {"packed_table": "t_packed", "num_segments": 2, "rows_per_segment": [10 ** 6] * 2,
                            "feature_shape": [64], "num_classes": [3]}, configs)
    notices: list[str] = []
    plpy = types.SimpleNamespace(notice=lambda text, **_: notices.append(text))
    engine = types.SimpleNamespace(without_fusion=lambda: [])
    limits = [WorkerLimits(2, 8000.0, 0.0, "segment server seg0"), WorkerLimits(2, 8000.0, 4000.0, "segment server seg1")]
    assert fusing.decided(plpy, plan, engine, None, {mlp: 780}, limits).arguments.orders["fused"] == [[1, 2]]
    assert not notices
    limits[1] = WorkerLimits(2, 8000.0, 300.0, "segment server seg1")
    assert fusing.decided(plpy, plan, engine, None, {mlp: 780}, limits).arguments.orders["fused"] == []
    assert len(notices) == 1 and "300 MB of madlib_mop.worker_memory_mb on segment server seg1" in notices[0]
    older = types.SimpleNamespace(without_fusion=lambda: ["segment server seg0"])
    assert fusing.decided(plpy, plan, older, None, {mlp: 780}, limits[:1]).arguments.orders["fused"] == []
    assert "segment server seg0 cannot train fused groups" in notices[-1]
