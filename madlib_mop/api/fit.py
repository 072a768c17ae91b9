"""madlib_keras_fit_multiple_model, fit_multiple and resume: starting or continuing a job.

A job is created in one transaction of the coordinator's own connection (its catalog row,
the MADlib output tables, the per-job tables and every model's initial state), so a failed
start leaves nothing.  A call whose output table belongs to an unfinished job with the same
arguments continues that job instead of failing.
"""

from __future__ import annotations

import json
from typing import Any

from psycopg import sql

from madlib_mop import errors
from madlib_mop.db import catalog, worker_session
from madlib_mop.engine.base import Engine
from madlib_mop.engine.cluster import engine_for
from madlib_mop.engine.local import LocalEngine
from madlib_mop.job import outputs
from madlib_mop.job.coordinator import Coordinator, start_pool
from madlib_mop.job.plan import check_models, plan_job
from madlib_mop.job.store import TABLE_SUFFIXES, identifiers
from madlib_mop.errors import MadlibMopError
from madlib_mop.runtime import training
from madlib_mop.search import setup


def _names(out: catalog.NewTable) -> dict[str, list[str]]:
    """The job's tables as [schema, table] (how the jobs row records them)."""
    return {key: [out.schema, out.name + suffix] for key, suffix in TABLE_SUFFIXES.items()}


def _find_job(plpy: Any, out: catalog.NewTable, unfinished: bool):
    schema = catalog.extension_schema(plpy)
    rows = plpy.execute(plpy.prepare(
        # owner: row-level security does not bind a superuser, who must not continue a job
        # another role recorded (its stored table names would run with the superuser's rights).
        f"SELECT * FROM {schema}.jobs WHERE model_output_table = $1 AND owner = current_user "
        + ("AND state <> 'finished' " if unfinished else "AND state = 'finished' ")
        + "ORDER BY job_id DESC LIMIT 1", ["text"]), [out.quoted])
    return dict(rows[0]) if rows else None


def _tables_exist(plpy: Any, job: dict) -> bool:
    tables = json.loads(job["tables"])
    return all(plpy.execute(plpy.prepare(
        "SELECT to_regclass(format('%I.%I', $1, $2)) IS NOT NULL AS e", ["text", "text"]),
        tables[t])[0]["e"] for t in ("output", "info", "state", "visits"))


def _refuse_if_running(plpy: Any, job: dict, out: catalog.NewTable) -> None:
    """A running job (job_progress's state: its coordinator's session is alive) keeps its
    tables: they are not the caller's to drop or replace, even when its output table was
    dropped meanwhile."""
    if plpy.execute(plpy.prepare(
            f"SELECT state FROM {catalog.extension_schema(plpy)}.job_progress WHERE job_id = $1",
            ["bigint"]), [job["job_id"]])[0]["state"] == "running":
        raise MadlibMopError(
            f"job {job['job_id']} is still training into {out.quoted}",
            sqlstate=errors.OBJECT_IN_USE,
            hint=f"Wait for it (SELECT * FROM {catalog.extension_schema(plpy)}.job_progress), or "
                 f"cancel it: SELECT pg_cancel_backend({job['coordinator_pid']}).")


def _abandon(plpy: Any, job: dict, why: str) -> None:
    """An unfinished job whose tables are gone cannot continue: record why, through the
    coordinator's connection so that it stays recorded whatever this call does next."""
    schema = sql.Identifier(catalog.extension_schema_name(plpy))
    with worker_session.connect(worker_session.conninfo(plpy)) as db:
        db.execute(sql.SQL("UPDATE {}.jobs SET state = 'failed', last_error = %s, updated_at = now() "
                           "WHERE job_id = %s").format(schema), (f"abandoned: {why}", job["job_id"]))


def _initial_states(plan, seed: int, previous: dict[int, bytes]) -> dict[int, bytes]:
    """Step 0 of every model: the previous job's last state (warm start), else a fresh
    model initialised from the seed or the architecture's weights."""
    fresh = training.initial_states(
        [training.ModelSpec(c["mst_key"], c["model_arch"], c["compile_params"], c["fit_params"],
                            c["weights"]) for c in plan.configs if c["mst_key"] not in previous],
        seed)
    return {c["mst_key"]: previous.get(c["mst_key"], fresh.get(c["mst_key"])) for c in plan.configs}


def _create_job(plpy: Any, plan, previous_job: dict | None, prepare=None,
                left_by: dict | None = None) -> int:
    """The jobs row, the output and per-job tables, and every model's initial state, in one
    transaction of a session of its own: a failed start leaves nothing.  `prepare(db)`
    creates more tables in that transaction (madlib_keras_automl's model selection table).
    `left_by`: an earlier job of this output whose output table was dropped; the tables it
    left are dropped in the same transaction."""
    schema = sql.Identifier(catalog.extension_schema_name(plpy))
    names = _names(plan.out)
    t = identifiers(names)
    seed = plan.arguments["seed"]
    previous_states: dict[int, bytes] = {}
    with worker_session.connect(worker_session.conninfo(plpy), autocommit=False,
                                application_name="madlib_mop coordinator") as db:
        if previous_job is not None:  # warm start: continue from the last states
            old = identifiers(json.loads(previous_job["tables"]))
            if db.execute("SELECT to_regclass(%s)", (old["state"].as_string(db),)).fetchone()[0]:
                previous_states = dict(db.execute(sql.SQL(
                    "SELECT DISTINCT ON (mst_key) mst_key, state FROM {} "
                    "ORDER BY mst_key, step DESC").format(old["state"])).fetchall())
            for key in ("models", "state", "visits", "evals", "info", "summary", "output"):
                db.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(old[key]))
        if left_by is not None:
            for table in identifiers(json.loads(left_by["tables"])).values():
                db.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(table))
        for key, table in t.items():
            if db.execute("SELECT to_regclass(%s)", (table.as_string(db),)).fetchone()[0]:
                raise MadlibMopError(
                    f"{'.'.join(names[key])} already exists", sqlstate=errors.DUPLICATE_TABLE,
                    hint="Drop it, pass another model_output_table, or warm_start => TRUE to "
                         "continue a finished job.")
        states = _initial_states(plan, seed, previous_states)
        S = plan.source["num_segments"]
        subepochs = sum(plan.num_iterations * plan.epochs[c["mst_key"]] * S for c in plan.configs)
        job_id = db.execute(sql.SQL(
            "INSERT INTO {}.jobs (model_output_table, source_table, validation_table, "
            "model_selection_table, arguments, tables, num_models, num_segments, "
            "validation_partitions, seed, subepochs_total) "
            "VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s) RETURNING job_id").format(schema),
            (plan.out.quoted, plan.source["packed_table"],
             plan.validation["packed_table"] if plan.validation else None,
             plan.model_selection_table, json.dumps(plan.arguments), json.dumps(names),
             len(plan.configs), S, plan.validation["num_segments"] if plan.validation else None,
             seed, subepochs)).fetchone()[0]
        db.execute(sql.SQL("CREATE TABLE {} (mst_key integer PRIMARY KEY, model_id integer, "
                           "model_arch json, compile_params text, fit_params text, "
                           "initial_weights bytea)").format(t["models"]))
        db.execute(sql.SQL("CREATE TABLE {} (mst_key integer, step integer, state bytea NOT NULL, "
                           "PRIMARY KEY (mst_key, step))").format(t["state"]))
        db.execute(sql.SQL("CREATE TABLE {} (mst_key integer, step integer, segment integer, "
                           "result jsonb NOT NULL, PRIMARY KEY (mst_key, step))").format(t["visits"]))
        db.execute(sql.SQL("CREATE TABLE {} (mst_key integer, step integer, partition integer, "
                           "result jsonb NOT NULL, PRIMARY KEY (mst_key, step, partition))").format(t["evals"]))
        db.execute(sql.SQL("ALTER TABLE {} ALTER COLUMN state SET STORAGE EXTERNAL").format(t["state"]))
        for config in plan.configs:
            key = config["mst_key"]
            db.execute(sql.SQL("INSERT INTO {} VALUES (%s, %s, %s, %s, %s, %s)").format(t["models"]),
                       (key, config["model_id"], config["model_arch"], config["compile_params"],
                        config["fit_params"], config["weights"]))
            db.execute(sql.SQL("INSERT INTO {} VALUES (%s, %s, %s)").format(t["state"]),
                       (key, 0, states[key]))
        outputs.create(db, t, plan, job_id, states, plan.out.sibling("_info", plpy).quoted)
        if prepare is not None:
            prepare(db)
    return job_id


def _engine(plpy: Any, packed_table: str) -> Engine:
    """Where the job's workers run: on this server, or on the segment servers that hold
    the packed table's segments."""
    return engine_for(plpy, packed_table, lambda: LocalEngine(plpy))


def run_job(plpy: Any, job_id: int, can_commit: bool, engine: Engine | None = None,
            pool=None) -> None:
    if engine is None:
        engine = _engine(plpy, catalog.own_job(plpy, job_id)["source_table"])
    try:
        coordinator = Coordinator(plpy, job_id, can_commit, engine, pool)
    except BaseException:
        if pool is not None:
            pool.stop()
        raise
    try:
        coordinator.run()
    except BaseException as error:
        coordinator.close(error)
        raise
    coordinator.close()


def fit_multiple_model(plpy: Any, source_table: str, model_output_table: str,
                       model_selection_table: str, num_iterations: int, use_gpus: bool = False,
                       validation_table: str | None = None,
                       metrics_compute_frequency: int | None = None, warm_start: bool = False,
                       name: str | None = None, description: str | None = None,
                       use_caching: bool = True, seed: int = 0, pruner: str | None = None,
                       if_output_exists: str | None = "error", *,
                       can_commit: bool = False, single: bool = False) -> None:
    if can_commit:
        # A procedure cannot carry SET jit = off (it commits); this session loads TensorFlow,
        # whose LLVM cannot live next to the JIT's: turn JIT off for the session.
        plpy.execute("SELECT set_config('jit', 'off', false)")
    policy = _output_policy(if_output_exists, warm_start)
    plan = plan_job(plpy, source_table, model_output_table, model_selection_table, num_iterations,
                    use_gpus, validation_table, metrics_compute_frequency, warm_start, name,
                    description, use_caching, seed)
    if policy == "new_version":
        _next_version(plpy, plan)
    if single:
        plan.arguments["single"] = True
    if pruner is not None and pruner.strip():
        plan.arguments["pruner"] = pruner.strip()
        # Checked now (a bad pruner fails before anything is written); decides at these too:
        found = setup.search_of_job(plan.arguments, {c["mst_key"]: c["compile_params"] for c in plan.configs},
                                    plan.validation is not None)
        plan.also_due = frozenset(found.pruner.required_iterations())
    run_plan(plpy, plan, warm_start, can_commit, "madlib_keras_fit_multiple_model")


OUTPUT_POLICIES = ("error", "new_version")


def _output_policy(if_output_exists: str | None, warm_start: bool | None) -> str:
    """What a call does when its model_output_table holds a finished job: 'error' (MADlib's
    behaviour), or 'new_version': train into the next free `<out>_v<N>`.  Either way, an
    unfinished job of the same call is continued (a scheduled run picks up where an
    interrupted one stopped)."""
    policy = (if_output_exists or "error").strip().lower()
    if policy not in OUTPUT_POLICIES:
        raise MadlibMopError(f"if_output_exists must be 'error' or 'new_version', not {if_output_exists!r}",
                             sqlstate=errors.INVALID_PARAMETER_VALUE,
                             hint="Pass 'error' or 'new_version' (train into <out>_v2, _v3, ...).")
    if policy == "new_version" and warm_start:
        raise MadlibMopError("if_output_exists => 'new_version' and warm_start => TRUE exclude "
                             "each other", sqlstate=errors.INVALID_PARAMETER_VALUE,
                             hint="warm_start continues the existing output itself: pass one of them.")
    return policy


VERSION_ROOM = "_v99"  # the suffix a versioned name must leave room for


def _next_version(plpy: Any, plan) -> None:
    """if_output_exists => 'new_version': the call's output becomes its family's unfinished
    job's (continued) when that job was started with the same arguments, else the name
    itself if free, else the first free `<name>_v<N>`.  The family is recorded in the
    job's arguments, so the next run finds it.  An unfinished job on the name itself that
    was started without the policy is continued as it was started."""
    for suffix in TABLE_SUFFIXES.values():
        plan.out.sibling(VERSION_ROOM + suffix, plpy)  # the versions' names will fit
    own = _find_job(plpy, plan.out, unfinished=True)
    if own is not None and "output_family" not in json.loads(own["arguments"]):
        return
    family = plan.out.quoted
    plan.arguments["if_output_exists"] = "new_version"
    plan.arguments["output_family"] = family
    for job in plpy.execute(plpy.prepare(
            f"SELECT job_id, arguments, tables FROM {catalog.extension_schema(plpy)}.jobs "
            "WHERE owner = current_user AND state <> 'finished' "
            "AND arguments->>'output_family' = $1 ORDER BY job_id DESC", ["text"]), [family]):
        if not _tables_exist(plpy, job):
            continue
        recorded = json.loads(job["arguments"])
        if _same_call(recorded, plan.arguments):
            plan.arguments["model_output_table"] = recorded["model_output_table"]
            plan.out = catalog.new_table(plpy, recorded["model_output_table"],
                                         argument="model_output_table")
            return
        plpy.notice(f"job {job['job_id']} ({recorded['model_output_table']}) is unfinished but "
                    "was started with other arguments: it is left as it is")
    version = 1
    candidate = plan.out
    while _taken(plpy, candidate):
        version += 1
        name = f"{plan.out.name}_v{version}"
        quoted = f"{plpy.quote_ident(plan.out.schema)}.{plpy.quote_ident(name)}"
        candidate = catalog.new_table(plpy, quoted, argument="model_output_table")
        for suffix in TABLE_SUFFIXES.values():
            if suffix:
                candidate.sibling(suffix, plpy)  # checks the names fit (past _v99)
    if version > 1:
        plpy.notice(f"model_output_table {family} exists: training into {candidate.quoted} "
                    "(if_output_exists => 'new_version')")
    plan.arguments["model_output_table"] = candidate.quoted
    plan.out = candidate


def _same_call(recorded: dict, arguments: dict) -> bool:
    """The same call but for the version it wrote (arguments as a job records them)."""
    def without_output(values: dict) -> dict:
        return {k: v for k, v in values.items() if k != "model_output_table"}
    return without_output(recorded) == without_output(json.loads(json.dumps(arguments)))


def _taken(plpy: Any, out: catalog.NewTable) -> bool:
    """Whether the output or any of its sibling tables exists, or a job records it."""
    return any(out.sibling(suffix, plpy).exists(plpy) if suffix else out.exists(plpy)
               for suffix in TABLE_SUFFIXES.values()) or bool(plpy.execute(plpy.prepare(
                   f"SELECT 1 FROM {catalog.extension_schema(plpy)}.jobs WHERE owner = current_user "
                   "AND model_output_table = $1", ["text"]), [out.quoted]))


def run_plan(plpy: Any, plan, warm_start: bool, can_commit: bool, caller: str,
             prepare=None) -> None:
    """Continue the unfinished job of the same call, or create the job and run it."""
    unfinished = _find_job(plpy, plan.out, unfinished=True)
    if unfinished is not None and not _tables_exist(plpy, unfinished):
        _refuse_if_running(plpy, unfinished, plan.out)
        _abandon(plpy, unfinished, "its tables were dropped")
        unfinished = None
    if unfinished is not None:
        if json.loads(unfinished["arguments"]) == json.loads(json.dumps(plan.arguments)):
            plpy.notice(f"{caller}: continuing job {unfinished['job_id']} "
                        f"({unfinished['subepochs_done']} of {unfinished['subepochs_total']} "
                        "sub-epochs done)")
            run_job(plpy, unfinished["job_id"], can_commit)
            return
        raise MadlibMopError(
            f"{plan.out.quoted} belongs to unfinished job {unfinished['job_id']}, started with "
            "other arguments", sqlstate=errors.DUPLICATE_TABLE,
            hint=f"Continue it with CALL {catalog.extension_schema(plpy)}.resume("
                 f"{unfinished['job_id']}), or drop its tables and pass another name.")
    previous = left_by = None
    if plan.out.exists(plpy):
        if not warm_start:
            raise MadlibMopError(f"model_output_table {plan.out.quoted} already exists",
                                 sqlstate=errors.DUPLICATE_TABLE,
                                 hint="Drop it, pass another name, warm_start => TRUE to "
                                      "continue training its models, or (fit_multiple) "
                                      "if_output_exists => 'new_version' to train into "
                                      "<name>_v2, _v3, ...")
        previous = _find_job(plpy, plan.out, unfinished=False)
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
        left_by = _left_by_dropped_output(plpy, plan.out)
    # The workers import TensorFlow (seconds) while this session checks the models against
    # the data (which may import it here too) and creates the job.
    engine = _engine(plpy, plan.source["packed_table"])
    pool = start_pool(engine, plan.source["num_segments"])
    try:
        check_models(plpy, plan)
        job_id = _create_job(plpy, plan, previous, prepare, left_by)
    except BaseException:
        pool.stop()
        raise
    plpy.notice(f"{caller}: job {job_id}: {len(plan.configs)} "
                f"models, {plan.source['num_segments']} segments, {plan.num_iterations} iterations")
    run_job(plpy, job_id, can_commit, engine, pool)


def _left_by_dropped_output(plpy: Any, out: catalog.NewTable) -> dict | None:
    """The latest earlier job of this output (which does not exist), when some of its other
    tables remain: a MADlib script drops `<out>` and `<out>_summary` (the tables
    MADlib makes) and trains into the same name again, so the `_info` and per-job tables
    the earlier job left are the caller's to replace.  (An unfinished job whose tables were
    dropped is abandoned first, in run_plan.)"""
    rows = plpy.execute(plpy.prepare(
        f"SELECT * FROM {catalog.extension_schema(plpy)}.jobs WHERE model_output_table = $1 "
        "AND owner = current_user AND state IN ('finished', 'failed') "
        "ORDER BY job_id DESC LIMIT 1", ["text"]), [out.quoted])
    if not rows:
        return None
    job = dict(rows[0])
    left = plpy.execute(plpy.prepare(
        "SELECT array_agg(format('%I.%I', v->>0, v->>1)) AS names FROM jsonb_each($1::jsonb) "
        "AS t(k, v) WHERE to_regclass(format('%I.%I', v->>0, v->>1)) IS NOT NULL", ["text"]),
        [job["tables"]])[0]["names"]
    if not left:
        return None
    plpy.notice(f"{out.quoted} was dropped: replacing what job {job['job_id']} left of it "
                f"({', '.join(left)})")
    return job


def resume(plpy: Any, job_id: int, *, can_commit: bool = False) -> None:
    job = catalog.own_job(plpy, job_id)
    if job["state"] == "finished":
        plpy.notice(f"madlib_mop: job {job_id} is already finished")
        return
    run_job(plpy, job_id, can_commit)


SINGLE_FIT_CONFIGS = "pg_temp.madlib_mop_fit_configs"


def fit_single_model(plpy: Any, source_table: str, model: str, model_arch_table: str,
                     model_id: int, compile_params: str, fit_params: str | None,
                     num_iterations: int, use_gpus: bool = False,
                     validation_table: str | None = None,
                     metrics_compute_frequency: int | None = None, warm_start: bool = False,
                     name: str | None = None, description: str | None = None,
                     object_table: str | None = None, seed: int = 0) -> None:
    """madlib_keras_fit: one configuration, trained by the same engine (it hops over the
    segments like any model; with one model, one segment trains at a time).  Outputs:
    <model> (mst_key 1, model_weights, model_arch), <model>_summary with MADlib's
    single-model columns (the per-iteration arrays), and <model>_info."""
    from madlib_mop.api.model_catalog import load_model_selection_table

    if compile_params is None or not compile_params.strip():
        raise MadlibMopError("compile_params is empty", sqlstate=errors.INVALID_PARAMETER_VALUE,
                             hint="e.g. $$loss='categorical_crossentropy', optimizer='Adam(lr=0.01)', "
                                  "metrics=['accuracy']$$")
    for table in (SINGLE_FIT_CONFIGS, SINGLE_FIT_CONFIGS + "_summary"):
        # (to_regclass first: DROP ... IF EXISTS notices a session's missing pg_temp schema)
        if plpy.execute(f"SELECT to_regclass('{table}') IS NOT NULL AS e")[0]["e"]:
            plpy.execute(f"DROP TABLE {table}")
    load_model_selection_table(plpy, model_arch_table, SINGLE_FIT_CONFIGS, [model_id],
                               [compile_params], [fit_params or ""], object_table)
    fit_multiple_model(plpy, source_table, model, SINGLE_FIT_CONFIGS, num_iterations, use_gpus,
                       validation_table, metrics_compute_frequency, warm_start, name,
                       description, True, seed, single=True)
