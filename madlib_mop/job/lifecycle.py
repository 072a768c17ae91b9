"""A job's lifecycle: creating it, finding the unfinished job of a call, output versions,
abandoning a job whose tables are gone, and running or resuming it.

A job is created in one transaction of the coordinator's own connection (its catalog row,
the MADlib output tables, the per-job tables and every model's initial state), so a failed
start leaves nothing.  A call whose output table belongs to an unfinished job with the same
arguments continues that job instead of failing.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any, Iterator


from madlib_mop import errors
from madlib_mop.db import catalog, worker_session
from madlib_mop.engine.base import Engine, failure_sqlstate
from madlib_mop.engine.cluster import engine_for
from madlib_mop.engine.local import LocalEngine
from madlib_mop.errors import MadlibMopError
from madlib_mop.job import fusing, memory, outputs, repository, store
from madlib_mop.job import tables as job_tables
from madlib_mop.job.coordinator import Coordinator, start_pool
from madlib_mop.job.record import JobRecord, JobState
from madlib_mop.job.keras_work import KerasWork
from madlib_mop.job.plan import Plan, check_models, check_recorded_functions, custom_of, recorded_custom
from madlib_mop.job.state_store import HopFiles
from madlib_mop.job.tables import identifiers
from madlib_mop.runtime import state, training


def refuse_if_running(plpy: Any, job: JobRecord, out: catalog.NewTable) -> None:
    """A running job keeps its tables: they are not the caller's to drop or replace, even
    when its output table was dropped meanwhile."""
    if repository.is_running(plpy, job.job_id):
        raise MadlibMopError(
            f"job {job.job_id} is still training into {out.quoted}",
            sqlstate=errors.OBJECT_IN_USE,
            hint=f"Wait for it (SELECT * FROM {catalog.extension_schema(plpy)}.job_progress), or "
                 f"cancel it: SELECT pg_cancel_backend({job.coordinator_pid}).")


def initial_states(plpy: Any, plan: Plan, previous: dict[int, bytes], keras: KerasWork,
                   previous_compile: dict[int, str] | None = None) -> Iterator[tuple[int, bytes]]:
    """(mst_key, step 0) of every model in turn, in the plan's order (a state may be GBs:
    the caller holds one at a time): the previous job's last state (warm start), else a fresh
    model initialised from the seed or the architecture's weights.  A previous state whose
    variables differ from the model's (another optimizer, layers frozen: transfer learning)
    gives its weights alone, as MADlib's warm start does, when their shapes match; the
    optimizer then starts afresh.  So does one whose compile_params changed (another
    learning rate or optimizer: `previous_compile`, the previous job's).  Weights of other
    shapes are refused here, before the job exists.  Built by a worker (`keras`)."""
    custom = custom_of(plan.arguments)
    specs = [training.ModelSpec.of(c, custom) for c in plan.configs]
    seed = plan.arguments.seed
    # per program key: it depends on architecture and optimizer
    expected: dict[tuple, list] = {}
    warm = [c for c in plan.configs if c["mst_key"] in previous]
    if warm:
        layouts = keras.facts(warm, recorded_custom(plan.arguments), layouts=True)
        for spec in specs:
            if spec.mst_key in layouts:
                expected[spec.program_key] = [(kind, tuple(shape)) for kind, shape in layouts[spec.mst_key]["layout"]]
    kept, reweighted = {}, {}
    for spec in specs:
        old = previous.get(spec.mst_key)
        if old is None:
            continue
        found = state.header_layout(state.split(old)[0])
        compiled_as = (previous_compile or {}).get(spec.mst_key, spec.compile_params)
        same_compile = compiled_as == spec.compile_params
        if found == expected[spec.program_key] and same_compile:
            kept[spec.mst_key] = old
            continue
        stored, wanted = _weight_shapes(found), _weight_shapes(expected[spec.program_key])
        if stored != wanted:
            raise MadlibMopError(
                f"warm_start: the weights of model {spec.mst_key} in {plan.out.quoted} do not "
                "fit its architecture", sqlstate=errors.INVALID_PARAMETER_VALUE,
                detail=f"The stored model has weights of shapes {stored}; the architecture's "
                       f"are {wanted}.",
                hint="Warm start a model whose layers have the same shapes, or pass "
                     "warm_start => FALSE.")
        reweighted[spec.mst_key] = dataclasses.replace(
            spec, initial_weights=bytes(state.madlib_weights(old)))
    if reweighted:
        plpy.notice("warm_start: model(s) " + ", ".join(map(str, reweighted))
                    + " continue from their stored weights with a new optimizer state: their "
                      "architecture or compile_params differ from the stored model's")
    fresh = keras.initial_states(
        [reweighted.get(s.mst_key, s) for s in specs if s.mst_key not in kept], seed)
    for spec in specs:
        yield (spec.mst_key, kept[spec.mst_key]) if spec.mst_key in kept else next(fresh)


def _weight_shapes(layout: list) -> list[list[int]]:
    return [list(shape) for kind, shape in layout if kind == "weights"]


def create_job(plpy: Any, plan: Plan, previous_job: JobRecord | None, keras: KerasWork, prepare=None,
               left_by: JobRecord | None = None, weight_bytes: dict[str, int] | None = None,
               servers: list[memory.WorkerLimits] | None = None) -> tuple[int, memory.WorkerMemory]:
    """The jobs row, the output and per-job tables, and every model's initial state, in one
    transaction of a session of its own: a failed start leaves nothing.  Refused when its
    worker sessions would not fit their share of the server's memory (`job.memory`).  `prepare(db)`
    creates more tables in that transaction (madlib_keras_automl's model selection table).
    `left_by`: an earlier job of this output whose output table was dropped; the tables it
    left are dropped in the same transaction.  `weight_bytes` (architecture -> its weights'
    bytes, `plan.check_models`): the job is refused for memory before any state is made
    when even the estimate from them does not fit.  `servers`: the limits of the servers its
    workers run on (segment servers'), else this server's count."""
    names = job_tables.names(plan.out.schema, plan.out.name)
    t = identifiers(names)
    previous_states: dict[int, bytes] = {}
    previous_compile: dict[int, str] = {}
    with worker_session.connect(worker_session.conninfo(plpy), autocommit=False,
                                application_name="madlib_mop coordinator") as db:
        if previous_job is not None:  # warm start: continue from the last states
            old = identifiers(previous_job.table_names)
            previous_states = store.last_states(db, old["state"])
            previous_compile = store.compile_params_of(db, old["models"])
            job_tables.drop(db, old.values())
        if left_by is not None:
            job_tables.drop(db, identifiers(left_by.table_names).values())
            HopFiles.of(lambda q: db.execute(q).fetchone()[0], left_by.job_id).remove_job()
        for key, table in t.items():
            if db.execute("SELECT to_regclass(%s)", (table.as_string(db),)).fetchone()[0]:
                raise MadlibMopError(
                    f"{'.'.join(names[key])} already exists", sqlstate=errors.DUPLICATE_TABLE,
                    hint="Drop it, pass another model_output_table, or warm_start => TRUE to "
                         "continue a finished job.")
        S = plan.source["num_segments"]
        job_id = repository.insert_job(db, catalog.extension_schema_name(plpy), {
            "model_output_table": plan.out.quoted, "source_table": plan.source["packed_table"],
            "validation_table": plan.validation["packed_table"] if plan.validation else None,
            "model_selection_table": plan.model_selection_table,
            "arguments": json.dumps(plan.arguments.as_json()), "tables": json.dumps(names),
            "num_models": len(plan.configs), "num_segments": S,
            "validation_partitions": plan.validation["num_segments"] if plan.validation else None,
            "seed": plan.arguments.seed,
            "subepochs_total": sum(plan.num_iterations * plan.epochs[c["mst_key"]] * S
                                   for c in plan.configs)})
        job_tables.create(db, t)
        outputs.create(db, t, plan, job_id, plan.out.sibling("_info", plpy).quoted)
        configs, sizes = {c["mst_key"]: c for c in plan.configs}, {}
        packed_tables = [p["packed_table"] for p in (plan.source, plan.validation) if p]
        caching = plan.arguments.use_caching is not False
        if weight_bytes:
            memory.checked(plpy, plan.configs, {
                c["mst_key"]: memory.estimated_state_bytes(c, weight_bytes[c["model_arch"]])
                for c in plan.configs if c["model_arch"] in weight_bytes}, packed_tables, caching, servers or [])
        for mst_key, blob in initial_states(plpy, plan, previous_states, keras, previous_compile):
            sizes[mst_key] = len(blob)
            # Refused as soon as the states so far are too big: nothing is then left (the
            # transaction is not committed).
            need = memory.checked(plpy, plan.configs, sizes, packed_tables, caching, servers or [])
            job_tables.add_model(db, t, configs[mst_key], blob)
            outputs.add_model(db, t, configs[mst_key], blob, plan.info_labels.get(mst_key, {}))
            del blob
        if prepare is not None:
            prepare(db)
    return job_id, need


def engine_of(plpy: Any, packed_table: str) -> Engine:
    """Where the job's workers run: on this server, or on the segment servers that hold
    the packed table's segments."""
    return engine_for(plpy, packed_table, lambda: LocalEngine(plpy))


# How many times a job goes back to its durable states within one call when states it
# kept on a segment server are lost (that server restarted), before it stops resumably.
STATES_LOST_RESTARTS = 3


def run_job(plpy: Any, job_id: int, can_commit: bool, engine: Engine | None = None,
            pool=None) -> None:
    job = repository.own_job(plpy, job_id)
    check_recorded_functions(plpy, job.arguments)
    if engine is None:
        engine = engine_of(plpy, job.source_table)
    try:
        coordinator = Coordinator(plpy, job_id, can_commit, engine, pool)
    except BaseException:
        if pool is not None:
            pool.stop()
        raise
    for attempt in range(1, STATES_LOST_RESTARTS + 2):
        try:
            coordinator.run()
        except BaseException as error:
            coordinator.close(error)
            if failure_sqlstate(error) != errors.UNDEFINED_FILE or attempt > STATES_LOST_RESTARTS:
                raise
            # States kept on a segment server that restarted are gone: the models go back to
            # their durable states (`store.JobStore.load_models`) and train to the same bits.
            plpy.notice(f"madlib_mop: job {job_id}: {str(error).strip().splitlines()[0]}; "
                        "going on from the models' last durable states")
            coordinator = Coordinator(plpy, job_id, can_commit, engine)
            continue
        coordinator.close()
        return


def run_plan(plpy: Any, plan: Plan, warm_start: bool, can_commit: bool, caller: str,
             prepare=None) -> None:
    """Continue the unfinished job of the same call, or create the job and run it."""
    unfinished = repository.find_job(plpy, plan.out.quoted, unfinished=True)
    if unfinished is not None and not repository.tables_exist(plpy, unfinished):
        refuse_if_running(plpy, unfinished, plan.out)
        repository.abandon(plpy, unfinished.job_id, "its tables were dropped")
        unfinished = None
    if unfinished is not None:
        if unfinished.arguments.same_call(plan.arguments):
            plpy.notice(f"{caller}: continuing job {unfinished.job_id} "
                        f"({unfinished.subepochs_done} of {unfinished.subepochs_total} "
                        "sub-epochs done)")
            run_job(plpy, unfinished.job_id, can_commit)
            return
        raise MadlibMopError(
            f"{plan.out.quoted} belongs to unfinished job {unfinished.job_id}, started with "
            "other arguments", sqlstate=errors.DUPLICATE_TABLE,
            hint=f"Continue it with CALL {catalog.extension_schema(plpy)}.resume("
                 f"{unfinished.job_id}), or drop its tables and pass another name.")
    previous = left_by = None
    if plan.out.exists(plpy):
        if not warm_start:
            raise MadlibMopError(f"model_output_table {plan.out.quoted} already exists",
                                 sqlstate=errors.DUPLICATE_TABLE,
                                 hint="Drop it, pass another name, warm_start => TRUE to "
                                      "continue training its models, or (fit_multiple) "
                                      "if_output_exists => 'new_version' to train into "
                                      "<name>_v2, _v3, ...")
        previous = repository.find_job(plpy, plan.out.quoted, unfinished=False)
        if previous is None:
            raise MadlibMopError(f"{plan.out.quoted} was not made by madlib_mop",
                                 sqlstate=errors.INVALID_PARAMETER_VALUE,
                                 hint="warm_start continues a table made by "
                                      "madlib_keras_fit_multiple_model.")
    elif warm_start:
        raise MadlibMopError(f"warm_start: {plan.out.quoted} does not exist",
                             sqlstate=errors.UNDEFINED_TABLE,
                             hint="Train it first, or pass warm_start => FALSE.")
    else:
        left_by = left_by_dropped_output(plpy, plan.out)
    # The workers import TensorFlow (seconds) while this session reads the plan; then the
    # first of them answers what the job needs of Keras (`job.keras_work`): this session
    # never imports it.
    engine = engine_of(plpy, plan.source["packed_table"])
    pool = start_pool(engine, plan.source["num_segments"])
    try:
        keras = KerasWork.for_job(lambda: pool, engine, plpy)
        weight_bytes = check_models(plpy, plan, keras)
        limits = memory.limits_of(engine.worker_limits())
        plan = fusing.decided(plpy, plan, engine, keras, weight_bytes, limits)  # (recorded: resumed so)
        job_id, need = create_job(plpy, plan, previous, keras, prepare, left_by, weight_bytes, limits)
    except BaseException:
        pool.stop()
        raise
    plpy.notice(f"{caller}: job {job_id}: {len(plan.configs)} "
                f"models, {plan.source['num_segments']} segments, {plan.num_iterations} iterations; "
                f"{need.describe()}")
    run_job(plpy, job_id, can_commit, engine, pool)


def left_by_dropped_output(plpy: Any, out: catalog.NewTable) -> JobRecord | None:
    """The latest earlier job of this output (which does not exist), when some of its other
    tables remain: a MADlib script drops `<out>` and `<out>_summary` (the tables
    MADlib makes) and trains into the same name again, so the `_info` and per-job tables
    the earlier job left are the caller's to replace.  (An unfinished job whose tables were
    dropped is abandoned first, in run_plan.)"""
    job = repository.latest_job(plpy, out.quoted, (JobState.FINISHED, JobState.FAILED))
    if job is None:
        return None
    left = repository.existing_tables(plpy, job)
    if not left:
        return None
    plpy.notice(f"{out.quoted} was dropped: replacing what job {job.job_id} left of it "
                f"({', '.join(left)})")
    return job


def resume(plpy: Any, job_id: int, *, can_commit: bool = False) -> None:
    job = repository.own_job(plpy, job_id)
    if job.finished:
        plpy.notice(f"madlib_mop: job {job_id} is already finished")
        return
    run_job(plpy, job_id, can_commit)


