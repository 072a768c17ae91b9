"""After the search, on real jobs: hyperparameter importance (a grid job and a TPE job, on
data where the learning rate drives the result), the Pareto front against a brute-force
check, deployments (predict by name, rollback, a second role with and without rights), and
the views intermediate_values and optimization_history on a job with pruning."""

from __future__ import annotations

import math
import uuid

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from tests.conftest import connect, mlp_json, packed_iris

PASSWORD = "reader-password-" + uuid.uuid4().hex[:8]
# Learning rates 1e-5 (the model barely moves in 3 iterations) and 0.05: the rate decides the
# loss; the batch size and the architecture (hidden 4 or 16) hardly do.
COMPILE_GRID = ("{'loss': ['categorical_crossentropy'], 'optimizer_params_list': "
                "[{'optimizer': ['Adam'], 'lr': [0.00001, 0.05]}], 'metrics': ['accuracy']}")
FIT_GRID = "{'batch_size': [8, 16]}"


@pytest.fixture(scope="module")
def db(extension_dsn):
    with connect(extension_dsn) as conn:
        packed_iris(conn)
        for hidden in (4, 16):
            conn.execute("SELECT load_keras_model('arch', %s)", (mlp_json(4, hidden, 3),))
        conn.execute("SELECT generate_model_configs('arch', 'mst', ARRAY[1, 2], %s, %s)",
                     (COMPILE_GRID, FIT_GRID))
        yield conn


@pytest.fixture(scope="module")
def grid_job(db):
    db.execute("SELECT madlib_keras_fit_multiple_model('iris_packed', 'grid_out', 'mst', 3, "
               "validation_table => 'iris_valid')")
    return "grid_out"


@pytest.fixture(scope="module")
def pruned_job(db):
    db.execute("SELECT madlib_keras_fit_multiple_model('iris_packed', 'pruned_out', 'mst', 4, "
               "validation_table => 'iris_valid', pruner => 'successive_halving, eta=2, min_iterations=1')")
    return "pruned_out"


def _info(db, out: str) -> list[dict]:
    cursor = db.cursor(row_factory=psycopg.rows.dict_row)
    return cursor.execute(sql.SQL("SELECT * FROM {} ORDER BY mst_key").format(
        sql.Identifier(out + "_info"))).fetchall()


def _importance(db, out: str, **named) -> list[tuple[str, float]]:
    args = sql.SQL("").join(sql.SQL(", {} => {}").format(sql.Identifier(k), sql.Literal(v))
                            for k, v in named.items())
    return db.execute(sql.SQL("SELECT * FROM hyperparameter_importance({}{})").format(
        sql.Literal(out), args)).fetchall()


def test_importance_of_a_grid_job_ranks_the_learning_rate_first(db, grid_job):
    for evaluator in ("ped_anova", "fanova"):
        ranked = _importance(db, grid_job, evaluator=evaluator)
        names = [name for name, _ in ranked]
        assert names[0] == "learning_rate", (evaluator, ranked)
        # Only what the grid varied: the rate, the batch size and the architecture.
        assert sorted(names) == ["batch_size", "learning_rate", "model_id"]
        assert math.isclose(sum(v for _, v in ranked), 1.0, rel_tol=1e-6)
        assert ranked[0][1] > 0.5, (evaluator, ranked, [(m["mst_key"], m["compile_params"], m["fit_params"], m["validation_loss_final"]) for m in _info(db, grid_job)])
    by_accuracy = _importance(db, grid_job, objective="validation_accuracy")
    assert by_accuracy[0][0] == "learning_rate"


def test_importance_of_a_tpe_job_ranks_the_learning_rate_first(db):
    db.execute("""SELECT madlib_keras_automl('iris_packed', 'tpe_out', 'arch', 'tpe_mst', ARRAY[1],
        $${'loss': ['categorical_crossentropy'], 'optimizer_params_list':
           [{'optimizer': ['Adam'], 'lr': [0.00001, 0.1, 'log'], 'beta_1': [0.8, 0.95, 'linear']}],
           'metrics': ['accuracy']}$$,
        $${'batch_size': [8]}$$, 'hyperopt', 'num_configs=8, num_iterations=3, algorithm=tpe',
        1, NULL, FALSE, 'iris_valid')""")
    info = _info(db, "tpe_out")
    assert len(info) == 8 and {m["status"] for m in info} == {"finished"}
    ranked = _importance(db, "tpe_out")
    assert ranked[0][0] == "learning_rate", (ranked, [
        (m["compile_params"].split("(")[1][:40], m["fit_params"], round(m["validation_loss_final"], 3)) for m in info])


def test_pruned_jobs_compare_at_an_iteration_and_too_few_models_get_a_clear_error(extension_dsn, db, pruned_job):
    info = _info(db, pruned_job)
    finished = [m for m in info if m["status"] == "finished"]
    assert len(finished) < 4 and any(m["status"] == "stopped" for m in info)
    reached = {}
    for m in info:
        for iteration in m["metrics_iters"]:
            reached[iteration] = reached.get(iteration, 0) + 1
    shared = max(i for i, n in reached.items() if n >= 4)
    notices = []
    with connect(extension_dsn, notices) as conn:  # too few finished: the last shared iteration
        ranked = _importance(conn, pruned_job)
    assert any(f"comparing the {reached[shared]} models at iteration {shared}" in n for n in notices), notices
    assert ranked == _importance(db, pruned_job, iteration=shared)
    assert _importance(db, pruned_job, iteration=1)[0][0] == "learning_rate"  # all 8 models
    last = max(reached)
    assert reached[last] < 4
    with pytest.raises(psycopg.errors.DataException) as caught:
        _importance(db, pruned_job, iteration=last)
    assert "at least 4 are needed" in caught.value.diag.message_primary
    with pytest.raises(psycopg.errors.InvalidParameterValue) as caught:
        _importance(db, pruned_job, iteration=99)
    assert "1, 2" in caught.value.diag.message_hint
    with pytest.raises(psycopg.errors.InvalidParameterValue):
        _importance(db, pruned_job, evaluator="shap")
    for call in ("SELECT * FROM hyperparameter_importance('iris_packed')",
                 "SELECT * FROM pareto_front('iris_packed', ARRAY['a max', 'b min'])",
                 "SELECT deploy_model('iris_packed', 1, 'x')"):
        with pytest.raises(psycopg.errors.InvalidParameterValue) as caught:
            db.execute(call)
        assert "is not the output of a model selection job" in caught.value.diag.message_primary


def _dominates(a, b, up):
    return all((x >= y) if u else (x <= y) for x, y, u in zip(a, b, up)) and a != b


def test_the_pareto_front_equals_a_brute_force_check(db, grid_job):
    info = _info(db, grid_job)
    assert all(m["parameter_count"] > 0 and m["inference_ms_per_row"] > 0 for m in info)
    assert {m["parameter_count"] for m in info} == {4 * 4 + 4 + 4 * 3 + 3, 4 * 16 + 16 + 16 * 3 + 3}
    for objectives, columns, up in [
            (["validation_metrics_final max", "inference_ms_per_row min"],
             ["validation_metrics_final", "inference_ms_per_row"], [True, False]),
            (["validation_loss_final", "parameter_count", "training_seconds"],
             ["validation_loss_final", "parameter_count", "training_seconds"], [False, False, False])]:
        front = db.execute("SELECT mst_key, objective_values FROM pareto_front(%s, %s) ORDER BY 1",
                           (grid_job, objectives)).fetchall()
        points = {m["mst_key"]: [float(m[c]) for c in columns] for m in info}
        brute = sorted(k for k, p in points.items()
                       if not any(_dominates(q, p, up) for j, q in points.items() if j != k))
        assert [k for k, _ in front] == brute and brute
        assert all(values == points[k] for k, values in front)
    with pytest.raises(psycopg.errors.UndefinedColumn) as caught:
        db.execute("SELECT * FROM pareto_front(%s, ARRAY['accuracy max', 'parameter_count'])", (grid_job,))
    assert "inference_ms_per_row" in caught.value.diag.message_hint
    with pytest.raises(psycopg.errors.InvalidParameterValue):
        db.execute("SELECT * FROM pareto_front(%s, ARRAY['parameter_count'])", (grid_job,))


def test_the_views_show_each_iteration_and_where_the_pruner_stopped(db, pruned_job):
    cursor = db.cursor(row_factory=psycopg.rows.dict_row)
    job_id = db.execute("SELECT max(job_id) FROM jobs WHERE model_output_table = %s",
                        ("public." + pruned_job,)).fetchone()[0]
    rows = cursor.execute("SELECT * FROM intermediate_values WHERE job_id = %s "
                          "ORDER BY mst_key, iteration", (job_id,)).fetchall()
    info = {m["mst_key"]: m for m in _info(db, pruned_job)}
    for key, model in info.items():
        mine = [r for r in rows if r["mst_key"] == key]
        assert [r["iteration"] for r in mine] == model["metrics_iters"]
        assert [r["value"] for r in mine] == model["validation_loss"]  # the job's objective
        assert [r["validation_metric"] for r in mine] == model["validation_metrics"]
        assert [r["pruned"] for r in mine] == [
            model["status"] == "stopped" and r["iteration"] == model["stopped_iteration"] for r in mine]
    assert sum(r["pruned"] for r in rows) == sum(m["status"] == "stopped" for m in info.values()) > 0
    assert {r["objective"] for r in rows} == {"validation_loss"}

    history = cursor.execute("SELECT * FROM optimization_history WHERE job_id = %s ORDER BY report",
                             (job_id,)).fetchall()
    assert len(history) == len(rows)
    assert [h["elapsed_seconds"] for h in history] == sorted(h["elapsed_seconds"] for h in history)
    best = math.inf
    for h in history:
        best = min(best, h["value"])
        assert h["best_value"] == best
        assert h["best_value_by_iteration"] == min(r["value"] for r in rows if r["iteration"] <= h["iteration"])
    assert history[-1]["best_value"] == min(r["value"] for r in rows)


@pytest.fixture(scope="module")
def reader(extension_dsn, allow_worker_role, db):
    """A second analyst (LOGIN, password), allowed as a worker role, with no rights on the
    first one's tables until a test grants them."""
    role = f"reader_{uuid.uuid4().hex[:6]}"
    allow_worker_role(role)
    db.execute(sql.SQL("CREATE ROLE {} LOGIN PASSWORD {}").format(sql.Identifier(role), sql.Literal(PASSWORD)))
    db.execute(sql.SQL("GRANT USAGE ON SCHEMA madlib_mop TO {0}; GRANT CREATE ON SCHEMA public TO {0}; "
                       "GRANT SELECT ON iris TO {0}").format(sql.Identifier(role)))
    params = conninfo_to_dict(extension_dsn)
    params.pop("passfile", None)
    params.update(user=role, password=PASSWORD)
    with connect(make_conninfo(**params)) as conn:
        yield role, conn
    db.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(role)))
    db.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))


def _predictions(conn, model: str, out: str, mst_key: int | None = None) -> list[tuple]:
    conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(sql.Identifier(out)))
    conn.execute("SELECT madlib_keras_predict(%s, 'iris', 'id', 'attributes', %s, 'prob', FALSE, %s)",
                 (model, out, mst_key))
    return sorted(conn.execute(sql.SQL("SELECT * FROM {}").format(sql.Identifier(out))).fetchall())


def test_deploy_predict_by_name_and_roll_back(db, grid_job, reader):
    info = _info(db, grid_job)
    first = info[0]["mst_key"]
    assert db.execute("SELECT deploy_model(%s, %s, 'iris_prod')", (grid_job, first)).fetchone()[0] == 1
    assert _predictions(db, "iris_prod", "by_name") == _predictions(db, grid_job, "by_key", first)

    # best_score: the job's objective (validation loss), the best model.
    best = min(info, key=lambda m: (m["validation_loss_final"], m["mst_key"]))["mst_key"]
    assert best != first
    notices = []
    db.add_notice_handler(lambda diag: notices.append(diag.message_primary))
    assert db.execute("SELECT deploy_model(%s, 'iris_prod', 'best_score')", (grid_job,)).fetchone()[0] == 2
    assert any(f"mst_key {best} (best_score: validation_loss (lower is better)" in n for n in notices), notices
    assert _predictions(db, "iris_prod", "by_name") == _predictions(db, grid_job, "by_key", best)
    registry = db.cursor(row_factory=psycopg.rows.dict_row).execute(
        "SELECT * FROM mop_deployments WHERE name = 'iris_prod' ORDER BY version").fetchall()
    assert [(r["version"], r["mst_key"], r["strategy"]) for r in registry] == [
        (1, first, "mst_key"), (2, best, "best_score")]
    assert registry[1]["model_table"] == f"public.{grid_job}" and registry[1]["job_id"] is not None
    assert registry[1]["metrics"]["validation_loss_final"] == min(m["validation_loss_final"] for m in info)

    # A threshold nothing passes is refused; most_recent picks among those that pass.
    with pytest.raises(psycopg.errors.DataException):
        db.execute("SELECT deploy_model(%s, 'iris_prod', 'most_recent', 0.0)", (grid_job,))
    passing = [m for m in info if m["validation_loss_final"] <= 0.9]
    recent = max(passing, key=lambda m: (m["metrics_elapsed_time"][-1], -m["mst_key"]))["mst_key"]
    assert db.execute("SELECT deploy_model(%s, 'iris_recent', 'most_recent', 0.9)", (grid_job,)).fetchone()[0] == 1
    assert db.execute("SELECT mst_key FROM mop_deployments WHERE name = 'iris_recent'").fetchone()[0] == recent

    # The second role: no rights on the registry, then on the registry only, then on the model.
    role, other = reader
    with pytest.raises(psycopg.errors.InsufficientPrivilege) as caught:
        _predictions(other, "public.iris_prod", "theirs")
    assert "GRANT SELECT" in caught.value.diag.message_hint
    db.execute(sql.SQL("GRANT SELECT ON mop_deployments TO {}").format(sql.Identifier(role)))
    with pytest.raises(psycopg.errors.InsufficientPrivilege) as caught:
        _predictions(other, "iris_prod", "theirs")
    assert grid_job in caught.value.diag.message_primary
    # One error gives every GRANT the model needs.
    assert all(f"public.{grid_job}{s}" in caught.value.diag.message_hint for s in (",", "_summary", "_info"))
    db.execute(sql.SQL("GRANT SELECT ON {}, {}, {} TO {}").format(
        *(sql.Identifier(grid_job + s) for s in ("", "_summary", "_info")), sql.Identifier(role)))
    assert _predictions(other, "iris_prod", "theirs") == _predictions(db, grid_job, "by_key", best)
    with pytest.raises(psycopg.errors.InsufficientPrivilege):  # a reader may not roll back
        other.execute("SELECT rollback_model('public.iris_prod')")

    # Evaluate takes the name as well.
    db.execute("SELECT madlib_keras_evaluate('iris_prod', 'iris_valid', 'by_name_eval')")
    db.execute("SELECT madlib_keras_evaluate(%s, 'iris_valid', 'by_key_eval', FALSE, %s)", (grid_job, best))
    assert db.execute("SELECT loss FROM by_name_eval").fetchone() == db.execute("SELECT loss FROM by_key_eval").fetchone()

    # Rollback: version 1 is active again, version 2 is kept and marked.
    assert db.execute("SELECT rollback_model('iris_prod')").fetchone()[0] == 1
    assert _predictions(db, "iris_prod", "by_name") == _predictions(db, grid_job, "by_key", first)
    rows = db.execute("SELECT version, rolled_back_by IS NOT NULL FROM mop_deployments "
                      "WHERE name = 'iris_prod' ORDER BY 1").fetchall()
    assert rows == [(1, False), (2, True)]
    with pytest.raises(psycopg.errors.InvalidParameterValue) as caught:
        db.execute("SELECT rollback_model('iris_prod')")
    assert "no earlier version" in caught.value.diag.message_primary
    with pytest.raises(psycopg.errors.UndefinedObject):
        db.execute("SELECT rollback_model('nothing_here')")
    with pytest.raises(psycopg.errors.DuplicateTable):
        db.execute("SELECT deploy_model(%s, %s, 'iris')", (grid_job, first))
