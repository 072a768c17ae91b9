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

import madlib_mop
from madlib_mop import catalog, errors, model_config, state, training, worker_session
from madlib_mop.coordinator import INFO_COLUMNS, JOB_TABLES, Coordinator, plan_job, start_workers
from madlib_mop.errors import MadlibMopError



def _names(plpy: Any, out: catalog.NewTable) -> dict[str, str]:
    names = {"output": out.quoted, "summary": out.sibling("_summary", plpy).quoted,
             "info": out.sibling("_info", plpy).quoted}
    names.update({t: out.sibling(f"_mop_{t}", plpy).quoted for t in JOB_TABLES})
    return names


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
    return all(plpy.execute(plpy.prepare("SELECT to_regclass($1) IS NOT NULL AS e", ["text"]),
                            [tables[t]])[0]["e"] for t in ("output", "info", "state", "visits"))


def _abandon(plpy: Any, job: dict, why: str) -> None:
    """An unfinished job whose tables are gone cannot continue: record why, through the
    coordinator's connection so that it stays recorded whatever this call does next."""
    schema = catalog.extension_schema(plpy)
    with worker_session.connect(worker_session.conninfo(plpy)) as db:
        db.execute(f"UPDATE {schema}.jobs SET state = 'failed', last_error = %s, updated_at = now() "
                   "WHERE job_id = %s", (f"abandoned: {why}", job["job_id"]))


def _initial_states(plan, seed: int, previous: dict[int, bytes]) -> dict[int, bytes]:
    """Step 0 of every model: the previous job's last state (warm start), else a fresh
    model initialised from the seed or the architecture's weights."""
    states = {}
    for config in plan.configs:
        if config["mst_key"] in previous:
            states[config["mst_key"]] = previous[config["mst_key"]]
            continue
        spec = training.ModelSpec(config["mst_key"], config["model_arch"], config["compile_params"],
                                  config["fit_params"], config["weights"])
        states[config["mst_key"]] = training.capture_state(training.build_model(spec, seed))
    return states


def _create_job(plpy: Any, plan, previous_job: dict | None) -> dict:
    schema = catalog.extension_schema(plpy)
    names = _names(plpy, plan.out)
    seed = plan.arguments["seed"]
    previous_states: dict[int, bytes] = {}
    with worker_session.connect(worker_session.conninfo(plpy), autocommit=False,
                                application_name="madlib_mop coordinator") as db:
        if previous_job is not None:  # warm start: continue from the last states
            old = json.loads(previous_job["tables"])
            if db.execute("SELECT to_regclass(%s)", (old["state"],)).fetchone()[0]:
                previous_states = dict(db.execute(
                    f"SELECT DISTINCT ON (mst_key) mst_key, state FROM {old['state']} "
                    "ORDER BY mst_key, step DESC").fetchall())
            for table in (old["models"], old["state"], old["visits"], old["evals"],
                          old["info"], old["summary"], old["output"]):
                db.execute(f"DROP TABLE IF EXISTS {table}")
        for table in names.values():
            if db.execute("SELECT to_regclass(%s)", (table,)).fetchone()[0]:
                raise MadlibMopError(
                    f"{table} already exists", sqlstate=errors.DUPLICATE_TABLE,
                    hint="Drop it, pass another model_output_table, or warm_start => TRUE to "
                         "continue a finished job.")
        states = _initial_states(plan, seed, previous_states)
        S = plan.source["num_segments"]
        subepochs = sum(plan.num_iterations * plan.epochs[c["mst_key"]] * S for c in plan.configs)
        job = db.execute(
            f"INSERT INTO {schema}.jobs (model_output_table, source_table, validation_table, "
            "model_selection_table, arguments, tables, num_models, num_segments, "
            "validation_partitions, seed, subepochs_total) "
            "VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s) RETURNING job_id",
            (plan.out.quoted, plan.source["packed_table"],
             plan.validation["packed_table"] if plan.validation else None,
             plan.model_selection_table, json.dumps(plan.arguments), json.dumps(names),
             len(plan.configs), S, plan.validation["num_segments"] if plan.validation else None,
             seed, subepochs)).fetchone()[0]
        t = {k: sql.SQL(v) for k, v in names.items()}
        db.execute(sql.SQL("CREATE TABLE {} (mst_key integer PRIMARY KEY, model_weights bytea, "
                           "model_arch json)").format(t["output"]))
        db.execute(sql.SQL("CREATE TABLE {} ({})").format(t["info"], sql.SQL(", ").join(
            sql.SQL(f"{name} {kind}") for name, kind in INFO_COLUMNS)))
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
            params = model_config.parse_compile_params(config["compile_params"])
            db.execute(sql.SQL("INSERT INTO {} VALUES (%s, %s, %s, %s, %s, %s)").format(t["models"]),
                       (key, config["model_id"], config["model_arch"], config["compile_params"],
                        config["fit_params"], config["weights"]))
            db.execute(sql.SQL("INSERT INTO {} VALUES (%s, %s, %s)").format(t["state"]),
                       (key, 0, states[key]))
            weights = state.madlib_weights(states[key])
            db.execute(sql.SQL("INSERT INTO {} VALUES (%s, %s, %s)").format(t["output"]),
                       (key, weights, config["model_arch"]))
            db.execute(sql.SQL(
                "INSERT INTO {} (mst_key, model_id, compile_params, fit_params, model_type, "
                "model_size, metrics_type, loss_type, subepochs_done) "
                "VALUES (%s, %s, %s, %s, 'madlib_keras', %s, %s, %s, 0)").format(t["info"]),
                (key, config["model_id"], config["compile_params"], config["fit_params"],
                 len(weights) / 1024.0, list(params.metrics) or None, params.loss))
        _create_summary(db, t["summary"], plan, names, job)
        row = db.execute(f"SELECT * FROM {schema}.jobs WHERE job_id = %s", (job,)).fetchone()
        columns = [c.name for c in db.execute(f"SELECT * FROM {schema}.jobs LIMIT 0").description]
    return _jsonable(dict(zip(columns, row)))


def _jsonable(job: dict) -> dict:
    """A job row as PL/Python would give it (json columns as text)."""
    for key in ("arguments", "tables"):
        if not isinstance(job[key], str):
            job[key] = json.dumps(job[key])
    return job


def _create_summary(db, table, plan, names: dict, job_id: int) -> None:
    source = plan.source
    label = source["dependent_varname"][0]
    class_type = "text[]"
    if source["label_kind"] == "classification":
        class_type = db.execute(
            "SELECT format_type(atttypid, NULL) FROM pg_attribute WHERE attrelid = "
            "(%s || '_summary')::regclass AND attname = %s",
            (source["packed_table"], f"{label}_class_values")).fetchone()[0]
    class_column = sql.Identifier(f"{label}_class_values")
    db.execute(sql.SQL("""
        CREATE TABLE {} (
            source_table text, validation_table text, model text, model_info text,
            dependent_varname text[], independent_varname text[], model_arch_table text,
            model_selection_table text, object_table text, num_iterations integer,
            metrics_compute_frequency integer, warm_start boolean, name text, description text,
            start_training_time timestamp, end_training_time timestamp, madlib_version text,
            num_classes integer[], {} {}, dependent_vartype text[], normalizing_const real,
            metrics_iters integer[], job_id bigint, num_segments integer, seed integer)""").format(
        table, class_column, sql.SQL(class_type)))
    iters = [i for i in range(1, plan.num_iterations + 1)
             if i % plan.frequency == 0 or i == plan.num_iterations]
    class_values = source.get(f"{label}_class_values")
    db.execute(sql.SQL("INSERT INTO {} VALUES (%s, %s, %s, %s, %s, %s, %s, %s, NULL, %s, %s, %s, "
                       "%s, %s, now(), NULL, %s, %s, %s::" + class_type + ", %s, %s, %s, %s, %s, %s)"
                       ).format(table), (
        plan.arguments["source_table"], plan.arguments["validation_table"],
        plan.arguments["model_output_table"], names["info"], source["dependent_varname"],
        source["independent_varname"], plan.model_arch_table, plan.model_selection_table,
        plan.num_iterations, plan.frequency, plan.arguments["warm_start"], plan.arguments["name"],
        plan.arguments["description"], f"madlib_mop {madlib_mop.__version__}",
        source["num_classes"], class_values, source["dependent_vartype"],
        source["normalizing_const"], iters, job_id, source["num_segments"], plan.arguments["seed"]))
    if plan.arguments.get("single"):
        # madlib_keras_fit keeps its one model's results in the summary (MADlib's layout).
        for name, kind in INFO_COLUMNS[1:]:
            if name == "metrics_iters":  # the summary has it already
                continue
            db.execute(sql.SQL("ALTER TABLE {} ADD COLUMN {} {}").format(
                table, sql.Identifier(name), sql.SQL(kind)))


def run_job(plpy: Any, job: dict, can_commit: bool, workers=None) -> None:
    try:
        coordinator = Coordinator(plpy, job, can_commit, workers)
    except BaseException:
        for worker in (workers or ([], None))[0]:
            worker.stop()
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
                       use_caching: bool = True, seed: int = 0, *, can_commit: bool = False,
                       single: bool = False) -> None:
    if can_commit:
        # A procedure cannot carry SET jit = off (it commits); this session loads TensorFlow,
        # whose LLVM cannot live next to the JIT's: turn JIT off for the session.
        plpy.execute("SELECT set_config('jit', 'off', false)")
    plan = plan_job(plpy, source_table, model_output_table, model_selection_table, num_iterations,
                    use_gpus, validation_table, metrics_compute_frequency, warm_start, name,
                    description, use_caching, seed)
    if single:
        plan.arguments["single"] = True
    unfinished = _find_job(plpy, plan.out, unfinished=True)
    if unfinished is not None and not _tables_exist(plpy, unfinished):
        _abandon(plpy, unfinished, "its tables were dropped")
        unfinished = None
    if unfinished is not None:
        if json.loads(unfinished["arguments"]) == plan.arguments:
            plpy.notice(f"madlib_keras_fit_multiple_model: continuing job {unfinished['job_id']} "
                        f"({unfinished['subepochs_done']} of {unfinished['subepochs_total']} "
                        "sub-epochs done)")
            run_job(plpy, unfinished, can_commit)
            return
        raise MadlibMopError(
            f"{plan.out.quoted} belongs to unfinished job {unfinished['job_id']}, started with "
            "other arguments", sqlstate=errors.DUPLICATE_TABLE,
            hint=f"Continue it with CALL {catalog.extension_schema(plpy)}.resume("
                 f"{unfinished['job_id']}), or drop its tables and pass another name.")
    previous = None
    if plan.out.exists(plpy):
        if not warm_start:
            raise MadlibMopError(f"model_output_table {plan.out.quoted} already exists",
                                 sqlstate=errors.DUPLICATE_TABLE,
                                 hint="Drop it, pass another name, or warm_start => TRUE to "
                                      "continue training its models.")
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
    workers = start_workers(plpy, plan.source["num_segments"])
    try:
        job = _create_job(plpy, plan, previous)
    except BaseException:
        for worker in workers[0]:
            worker.stop()
        raise
    plpy.notice(f"madlib_keras_fit_multiple_model: job {job['job_id']}: {len(plan.configs)} "
                f"models, {plan.source['num_segments']} segments, {num_iterations} iterations")
    run_job(plpy, job, can_commit, workers)


def resume(plpy: Any, job_id: int, *, can_commit: bool = False) -> None:
    schema = catalog.extension_schema(plpy)
    rows = plpy.execute(plpy.prepare(f"SELECT * FROM {schema}.jobs WHERE job_id = $1 "
                                     "AND owner = current_user", ["bigint"]), [job_id])
    if not rows:
        raise MadlibMopError(f"job {job_id} does not exist (or is another role's)",
                             sqlstate=errors.INVALID_PARAMETER_VALUE,
                             hint=f"SELECT * FROM {schema}.job_progress; lists your jobs. A job "
                                  "runs as its owner: SET ROLE to it to resume another's.")
    job = dict(rows[0])
    if job["state"] == "finished":
        plpy.notice(f"madlib_mop: job {job_id} is already finished")
        return
    run_job(plpy, job, can_commit)


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
    from madlib_mop.model_catalog import load_model_selection_table

    if compile_params is None or not compile_params.strip():
        raise MadlibMopError("compile_params is empty", sqlstate=errors.INVALID_PARAMETER_VALUE,
                             hint="e.g. $$loss='categorical_crossentropy', optimizer='Adam(lr=0.01)', "
                                  "metrics=['accuracy']$$")
    for table in (SINGLE_FIT_CONFIGS, SINGLE_FIT_CONFIGS + "_summary"):
        plpy.execute(f"DROP TABLE IF EXISTS {table}")
    load_model_selection_table(plpy, model_arch_table, SINGLE_FIT_CONFIGS, [model_id],
                               [compile_params], [fit_params or ""], object_table)
    fit_multiple_model(plpy, source_table, model, SINGLE_FIT_CONFIGS, num_iterations, use_gpus,
                       validation_table, metrics_compute_frequency, warm_start, name,
                       description, True, seed, single=True)
