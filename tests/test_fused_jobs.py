"""Fused groups in jobs (madlib_mop.fuse_models, `job.fusing`, `job.schedule`): models of
one fusion class that the job sends along the same path hop as one unit and train in
one call.  Against the same job unfused: each model's weights within float rounding, the
same visits, and replay gives its weights; run again or resumed after a killed
coordinator: the same bits; a model a pruner stops leaves its group, which goes on; a
person's clone joins its source's group, before and after a killed coordinator."""

from __future__ import annotations

import json
import threading
import time

import numpy as np
import psycopg
import pytest
from psycopg import sql
from psycopg.rows import tuple_row

from tests.conftest import connect, coordinator_killed_mid_job, held_job, iris_table

MODELS = 8  # on 2 segments: 4 models per path and epoch
COMPILE = ("loss='categorical_crossentropy', optimizer='Adam(learning_rate={lr})', "
           "metrics=['accuracy']")


def _architecture() -> str:
    import keras

    return keras.Sequential([keras.Input((4,)), keras.layers.Dense(16, activation="relu"),
                             keras.layers.Dropout(0.1), keras.layers.Dense(3, activation="softmax")
                             ]).to_json()


@pytest.fixture(scope="module")
def iris(extension_dsn):
    with connect(extension_dsn) as conn:
        iris_table(conn)
        conn.execute("SELECT training_preprocessor_dl('iris', 'iris_fused_packed', 'class_text', "
                     "'attributes', buffer_size => 25, distribution_rules => '2')")
        conn.execute("SELECT validation_preprocessor_dl('iris', 'iris_fused_valid', 'class_text', "
                     "'attributes', 'iris_fused_packed')")
        conn.execute("SELECT load_keras_model('iris_fused_arch', %s::json)", (_architecture(),))
        rates = [0.001 * (k + 1) for k in range(MODELS)]
        conn.execute("SELECT load_model_selection_table('iris_fused_arch', 'iris_fused_mst', ARRAY[1], "
                     "%s, ARRAY['batch_size=8, epochs=1'])", ([COMPILE.format(lr=r) for r in rates],))
    return extension_dsn


def _fit(dsn: str, out: str, fuse: str, pruner: str | None = None, validation: bool = False,
         notices: list | None = None) -> None:
    with connect(dsn, notices) as conn:
        conn.execute(f"SET madlib_mop.fuse_models = {fuse}")
        conn.execute("SELECT madlib_keras_fit_multiple_model('iris_fused_packed', %s, 'iris_fused_mst', "
                     "4, FALSE, %s, %s, pruner => %s)",
                     (out, "iris_fused_valid" if pruner or validation else None, 1 if validation else None,
                      pruner))


def _weights(conn, out: str) -> dict[int, bytes]:
    return dict(conn.execute(sql.SQL("SELECT mst_key, model_weights FROM {} ORDER BY 1").format(
        sql.Identifier(out))).fetchall())


def _visits(conn, out: str) -> list[tuple]:
    """(mst_key, step, segment, models of its call) of every visit."""
    return [(key, step, segment, int(json.loads(r)["seconds"].get("fused", 1)) if isinstance(r, str)
             else int(r["seconds"].get("fused", 1)))
            for key, step, segment, r in conn.execute(sql.SQL(
                "SELECT mst_key, step, segment, result FROM {} ORDER BY 1, 2").format(
                sql.Identifier(f"{out}_mop_visits")))]


def test_a_fused_job_trains_each_model_as_unfused_within_rounding(iris):
    _fit(iris, "iris_unfused", "off")
    _fit(iris, "iris_fused", "on")
    with connect(iris) as conn:
        unfused, fused = _weights(conn, "iris_unfused"), _weights(conn, "iris_fused")
        alone, together = _visits(conn, "iris_unfused"), _visits(conn, "iris_fused")
        # The same visits (models, steps, segments); fused in calls of 4 models.
        assert [v[:3] for v in alone] == [v[:3] for v in together]
        assert {v[3] for v in alone} == {1} and {v[3] for v in together} == {MODELS // 2}
        assert conn.execute("SELECT arguments->>'fuse_models' FROM jobs WHERE model_output_table = "
                            "'public.iris_fused'").fetchone()[0] == "on"
        # The classes that fuse, decided when the job was made and recorded with it.
        assert conn.execute("SELECT arguments->'orders'->'fused' FROM jobs WHERE model_output_table = "
                            "'public.iris_fused'").fetchone()[0] == [list(range(1, MODELS + 1))]
        assert conn.execute("SELECT arguments->'orders'->'fused' FROM jobs WHERE model_output_table = "
                            "'public.iris_unfused'").fetchone()[0] == []
        for key in unfused:
            a, b = (np.frombuffer(w, np.float32) for w in (unfused[key], fused[key]))
            assert a.shape == b.shape and not np.array_equal(a, np.zeros_like(a))
            np.testing.assert_allclose(b, a, rtol=1e-4, atol=1e-5)
        # Replay (plain Keras, one visit after another) gives a fused model's weights within
        # the same rounding.
        from madlib_mop.tools.replay import replay

        replayed = replay(conn, "iris_fused", 3)
        conn.row_factory = tuple_row  # (replay reads rows as dicts)
        np.testing.assert_allclose(replayed, np.frombuffer(fused[3], np.float32), rtol=1e-4, atol=1e-5)
        accuracy = dict(conn.execute("SELECT mst_key, training_metrics_final FROM iris_unfused_info"))
        for key, value in conn.execute("SELECT mst_key, training_metrics_final FROM iris_fused_info"):
            assert abs(value - accuracy[key]) <= 1 / 150 + 1e-9  # one row at most


def _evals(conn, out: str) -> dict[tuple, tuple]:
    """(mst_key, step, partition) -> (validation metrics, the models evaluated with it)."""
    return {(key, step, partition): (r["metrics"], r.get("fused_with"))
            for key, step, partition, r in conn.execute(sql.SQL(
                "SELECT mst_key, step, partition, result FROM {}").format(
                sql.Identifier(f"{out}_mop_evals")))}


def test_a_fused_job_run_again_or_resumed_gives_the_same_bits(iris):
    """With its validation: the fused passes' results too are the same bits."""
    _fit(iris, "iris_fused_reference", "on", validation=True)
    _fit(iris, "iris_fused_again", "on", validation=True)
    with connect(iris) as conn:
        reference = _weights(conn, "iris_fused_reference")
        evals = _evals(conn, "iris_fused_reference")
        assert _weights(conn, "iris_fused_again") == reference
        assert _evals(conn, "iris_fused_again") == evals
        job_id = coordinator_killed_mid_job(conn, "iris_fused_resumed", 10,
                                            lambda: _fit(iris, "iris_fused_resumed", "on", validation=True))
        conn.execute("CALL resume(%s)", (job_id,))
        assert _weights(conn, "iris_fused_resumed") == reference
        assert _evals(conn, "iris_fused_resumed") == evals


def test_a_job_recorded_with_compiled_loops_resumes_in_traced_loops(iris):
    """A job started by 0.22.0 recorded that its small fused groups compile (`orders`
    "fused_loop": "compiled"); no job compiles since 0.23.0 (inside the server the
    compiled loop corrupted the heap: `runtime.fused_program`).  Such a job, resumed,
    trains traced loops: the bits of the same job traced throughout.  Its models have no
    Dropout, so 0.22.0 compiled their groups."""
    import keras

    with connect(iris) as conn:
        conn.execute("SELECT load_keras_model('iris_plain_arch', %s::json)", (keras.Sequential([
            keras.Input((4,)), keras.layers.Dense(16, activation="relu"),
            keras.layers.Dense(3, activation="softmax")]).to_json(),))
        conn.execute("SELECT load_model_selection_table('iris_plain_arch', 'iris_plain_mst', ARRAY[1], %s, "
                     "ARRAY['batch_size=8, epochs=1'])", ([COMPILE.format(lr=0.001 * (k + 1)) for k in range(4)],))

    def fit(out: str) -> None:
        with connect(iris) as conn:
            conn.execute("SET madlib_mop.fuse_models = on")
            conn.execute("SELECT madlib_keras_fit_multiple_model('iris_fused_packed', %s, 'iris_plain_mst', 2)",
                         (out,))
    fit("iris_plain_traced")
    with connect(iris) as conn:
        (orders,) = conn.execute("SELECT arguments->'orders' FROM jobs WHERE model_output_table = "
                                 "'public.iris_plain_traced'").fetchone()
        assert "fused_loop" not in orders and orders["fused"] == [[1, 2, 3, 4]]
        job_id = coordinator_killed_mid_job(conn, "iris_plain_resumed", 4, lambda: fit("iris_plain_resumed"))
        conn.execute("UPDATE jobs SET arguments = jsonb_set(arguments, '{orders,fused_loop}', '\"compiled\"') "
                     "WHERE job_id = %s", (job_id,))
        conn.execute("CALL resume(%s)", (job_id,))
        assert _weights(conn, "iris_plain_resumed") == _weights(conn, "iris_plain_traced")
        assert max(n for *_, n in _visits(conn, "iris_plain_resumed")) > 1  # (its groups fused)


def test_a_fused_group_evaluates_its_validation_as_one_program(iris):
    """Each model's validation loss and metrics as unfused within float rounding (the
    weights differ by as much), every pass of the group's four models one call, and each
    model's inference cost timed (its architecture's, shared by the group)."""
    _fit(iris, "iris_validated_alone", "off", validation=True)
    _fit(iris, "iris_validated_fused", "on", validation=True)
    with connect(iris) as conn:
        alone, together = _evals(conn, "iris_validated_alone"), _evals(conn, "iris_validated_fused")
        assert alone.keys() == together.keys() and len(alone) == MODELS * 4 * 2
        for where, (metrics, partners) in together.items():
            assert alone[where][1] is None and len(partners) == MODELS // 2 and where[0] in partners
            assert metrics["loss"] == pytest.approx(alone[where][0]["loss"], rel=1e-4, abs=1e-5)
            assert abs(metrics["accuracy"] - alone[where][0]["accuracy"]) <= 1 / 75 + 1e-9  # a row
        for step in {step for _, step, _ in together}:  # each iteration: two groups (their paths')
            groups = {tuple(partners) for (_, s, _), (_, partners) in together.items() if s == step}
            assert sorted(k for group in groups for k in group) == list(range(1, MODELS + 1))
        info = conn.execute("SELECT mst_key, validation_loss_final, inference_ms_per_row "
                            "FROM iris_validated_fused_info ORDER BY 1").fetchall()
        expected = dict(conn.execute("SELECT mst_key, validation_loss_final FROM iris_validated_alone_info"))
        assert len(info) == MODELS
        for key, loss, ms_per_row in info:
            assert loss == pytest.approx(expected[key], rel=1e-4, abs=1e-5)
            assert ms_per_row is not None and ms_per_row > 0


def test_a_stopped_model_leaves_its_group_which_goes_on(iris):
    _fit(iris, "iris_fused_pruned", "on", pruner="successive_halving, eta=2, min_iterations=1")
    with connect(iris) as conn:
        stopped = {k for k, s in conn.execute("SELECT mst_key, stopped_iteration FROM iris_fused_pruned_info")
                   if s is not None}
        assert len(stopped) >= MODELS // 2
        visits = _visits(conn, "iris_fused_pruned")
        last = {key: max(step for k, step, *_ in visits if k == key) for key in range(1, MODELS + 1)}
        assert all(last[k] < 4 * 2 - 1 for k in stopped)
        # After a stop, calls of the stopped models' groups have fewer models.
        assert any(n < MODELS // 2 for *_, n in visits)
        assert all(last[k] == 4 * 2 - 1 for k in set(last) - stopped)


def _fused_with(conn, out: str) -> dict[tuple[int, int], tuple[int, list]]:
    """(mst_key, step) -> (segment, the models of its call) of every visit."""
    return {(key, step): (segment, (r if isinstance(r, dict) else json.loads(r)).get("fused_with") or [key])
            for key, step, segment, r in conn.execute(sql.SQL(
                "SELECT mst_key, step, segment, result FROM {}").format(sql.Identifier(f"{out}_mop_visits")))}


def test_a_clone_joins_its_sources_group_and_a_resumed_job_keeps_it_there(iris):
    """A clone of model 3 at a higher learning rate (the same fusion class) goes model 3's
    path from where it was made and trains in the calls of its group, each at its own
    step; killed after the clone and resumed, the job keeps it in that group; replay gives
    the clone's weights within float rounding."""
    out, failures, notices = "iris_fused_cloned", [], []

    def fit() -> None:
        try:
            _fit(iris, out, "on", notices=notices)
        except psycopg.OperationalError as error:  # (its coordinator is terminated)
            failures.append(error)

    thread = threading.Thread(target=fit)
    thread.start()
    with connect(iris) as conn:
        # (after its first calls: the clone comes at model 3's next boundary, which timing
        # decides: iteration 1 or 2 mostly, 0 where model 3's group had not started yet)
        with held_job(conn, out, MODELS // 2):
            job_id = conn.execute("SELECT job_id FROM jobs WHERE model_output_table = %s",
                                  (f"public.{out}",)).fetchone()[0]
            action = conn.execute("SELECT clone_model(%s, 3, %s)",
                                  (job_id, COMPILE.format(lr=0.02))).fetchone()[0]
            time.sleep(0.6)  # (the job looks for requests every 0.5 s: it sees this one when let go)
        deadline = time.monotonic() + 60
        while (applied := conn.execute("SELECT applied_iteration, new_mst_key FROM steering "
                                       "WHERE action_id = %s AND applied_at IS NOT NULL", (action,)).fetchone()) is None:
            assert time.monotonic() < deadline and thread.is_alive(), failures
            time.sleep(0.02)
        iteration, clone = applied
        done = conn.execute("SELECT subepochs_done FROM jobs WHERE job_id = %s", (job_id,)).fetchone()[0]
        with held_job(conn, out, done + MODELS // 2 + 1):
            pid = conn.execute("SELECT coordinator_pid FROM jobs WHERE job_id = %s", (job_id,)).fetchone()[0]
            conn.execute("SELECT pg_terminate_backend(%s)", (pid,))
        thread.join(timeout=120)
        assert failures, "the coordinator's session should have been terminated"
        conn.execute("SELECT pg_advisory_lock(lock_key), pg_advisory_unlock(lock_key) FROM jobs "
                     "WHERE job_id = %s", (job_id,))
        conn.execute("CALL resume(%s)", (job_id,))
        assert 0 <= iteration < 4 and clone == MODELS + 1
        assert any(f"mst_key {clone} enters" in n and "it trains fused with its source's group (" in n
                   for n in notices), notices
        visits, at = _fused_with(conn, out), 2 * iteration  # (2 sub-epochs an iteration)
        steps = sorted(step for key, step in visits if key == clone)
        assert steps == list(range(2 * 4))  # the job's 4 iterations, from the clone's step 0
        for step in steps:  # in the call of model 3's step at + step, on its segment; alone after it
            segment, partners = visits[(clone, step)]
            if at + step < 2 * 4:
                assert (segment, partners) == visits[(3, at + step)] and clone in partners and len(partners) > 1
            else:
                assert partners == [clone]
        assert all(clone not in partners for (key, step), (_, partners) in visits.items() if key == 3 and step < at)
        from madlib_mop.tools.replay import replay

        weights = np.frombuffer(_weights(conn, out)[clone], np.float32)
        replayed = replay(conn, out, clone)
        conn.row_factory = tuple_row
        np.testing.assert_allclose(replayed, weights, rtol=1e-4, atol=1e-5)


def test_models_whose_fused_call_would_not_fit_the_worker_budget_train_unfused(iris):
    """A fused call holds its segment's rows decoded whole (the unfused loop streams them):
    where that and the models' states are over madlib_mop.worker_memory_mb, the job is made
    unfused, with a NOTICE, and records so (a resumed job does not fuse either)."""
    notices: list[str] = []
    with connect(iris, notices) as conn:
        conn.execute("CREATE TABLE wide AS SELECT i AS id, ARRAY(SELECT ((i * 7 + j * 13) % 101) / 101.0 "
                     "FROM generate_series(1, 64) j)::real[] AS x, (i % 3)::text AS y "
                     "FROM generate_series(1, 6000) i")
        conn.execute("SELECT training_preprocessor_dl('wide', 'wide_packed', 'y', 'x', buffer_size => 1000, "
                     "distribution_rules => '2')")
        conn.execute("SELECT load_keras_model('wide_arch', %s::json)", (_wide(),))
        conn.execute("SELECT load_model_selection_table('wide_arch', 'wide_mst', ARRAY[1], %s, "
                     "ARRAY['batch_size=100'])", ([COMPILE.format(lr=r) for r in (0.01, 0.02, 0.03, 0.04)],))
        conn.execute("SET madlib_mop.fuse_models = on")
        for budget, out in ((1, "wide_unfused"), (64, "wide_fused")):  # (a segment: 3,000 rows, 1.6 MB)
            conn.execute(f"SET madlib_mop.worker_memory_mb = {budget}")
            notices.clear()
            conn.execute("SELECT madlib_keras_fit_multiple_model('wide_packed', %s, 'wide_mst', 1)", (out,))
            fused = conn.execute("SELECT arguments->'orders'->'fused' FROM jobs WHERE model_output_table = %s",
                                 (f"public.{out}",)).fetchone()[0]
            calls = {n for *_, n in _visits(conn, out)}
            said = [n for n in notices if "the models train unfused" in n]
            if budget == 1:
                assert fused == [] and calls == {1} and len(said) == 1, notices
                assert "of the 1 MB of madlib_mop.worker_memory_mb" in said[0]
            else:
                assert fused == [[1, 2, 3, 4]] and calls == {2} and not said  # (2 a path)


def _wide() -> str:
    import keras

    return keras.Sequential([keras.Input((64,)), keras.layers.Dense(8, activation="relu"),
                             keras.layers.Dense(3, activation="softmax")]).to_json()


def test_the_setting_is_checked(iris):
    with connect(iris) as conn:
        conn.execute("SET madlib_mop.fuse_models = sometimes")
        with pytest.raises(Exception) as raised:
            conn.execute("SELECT madlib_keras_fit_multiple_model('iris_fused_packed', 'iris_fused_bad', "
                         "'iris_fused_mst', 1)")
        assert raised.value.diag.sqlstate == "22023"
        assert "auto, on, off" in str(raised.value)
        assert conn.execute("SELECT to_regclass('iris_fused_bad') IS NULL").fetchone()[0]


def test_models_evaluated_fused_give_each_models_own_loss_and_metrics(iris):
    """madlib_keras_evaluate_multiple_model with madlib_mop.fuse_models on: a job's models of
    one class evaluate as one program (a NOTICE says so), each model's loss and metrics
    those of its unfused evaluation within float rounding; auto fuses as on does."""
    _fit(iris, "iris_evaluated", "off")
    notices: list[str] = []
    with connect(iris, notices) as conn:
        evaluated = {}
        for setting in ("off", "on", "auto"):
            conn.execute(f"SET madlib_mop.fuse_models = {setting}")
            notices.clear()
            conn.execute("SELECT madlib_keras_evaluate_multiple_model('iris_evaluated', 'iris_fused_valid', "
                         "%s)", (f"iris_evaluated_{setting}",))
            evaluated[setting] = {key: (loss, metric, metrics) for key, loss, metric, metrics in conn.execute(
                sql.SQL("SELECT mst_key, loss, metric, metrics FROM {}").format(
                    sql.Identifier(f"iris_evaluated_{setting}")))}
            fused = [n for n in notices if "evaluated fused" in n]
            assert fused == ([f"madlib_keras_evaluate_multiple_model: {MODELS} of {MODELS} models evaluated "
                              f"fused, in 1 group (madlib_mop.fuse_models = {setting})"] if setting != "off" else [])
        alone, fused = evaluated["off"], evaluated["on"]
        assert sorted(fused) == sorted(alone) == list(range(1, MODELS + 1))
        for key, (loss, metric, metrics) in alone.items():
            assert fused[key][:2] == pytest.approx((loss, metric), rel=1e-5)
            assert fused[key][2] == pytest.approx(metrics, rel=1e-5)
        assert len({round(loss, 6) for loss, _, _ in fused.values()}) == MODELS  # each model's own
        for key, (loss, metric, metrics) in fused.items():  # (whichever worker took a segment)
            assert evaluated["auto"][key][:2] == pytest.approx((loss, metric), rel=1e-6)
            assert evaluated["auto"][key][2] == pytest.approx(metrics, rel=1e-6)


def _predictions(conn, table: str) -> dict[tuple, tuple]:
    """(mst_key, id, class_value) -> (prob, rank) of a multi-model prediction, each row once."""
    rows = conn.execute(sql.SQL("SELECT mst_key, id, class_value, prob, rank FROM {}").format(
        sql.Identifier(table))).fetchall()
    found = {row[:3]: row[3:] for row in rows}
    assert len(found) == len(rows)
    return found


def _predict_all(conn, model_table: str, out: str, setting: str, notices: list[str]) -> list[str]:
    """madlib_keras_predict_multiple_model (pred_type prob) under `setting`: its NOTICEs of
    fused models."""
    conn.execute(f"SET madlib_mop.fuse_models = {setting}")
    notices.clear()
    conn.execute("SELECT madlib_keras_predict_multiple_model(%s, 'iris', 'id', 'attributes', %s, 'prob')",
                 (model_table, out))
    return [n for n in notices if "predicted fused" in n]


def _same_predictions(alone: dict[tuple, tuple], fused: dict[tuple, tuple]) -> None:
    """Each row's probability within float rounding, and its rank where no two classes of
    the row are so close that rounding could swap them."""
    assert sorted(fused) == sorted(alone)
    probabilities: dict[tuple, list[float]] = {}
    for (key, id_, _), (prob, _) in alone.items():
        probabilities.setdefault((key, id_), []).append(prob)
    for row, (prob, rank) in alone.items():
        assert fused[row][0] == pytest.approx(prob, rel=1e-5, abs=1e-7)
        ordered = sorted(probabilities[row[:2]])
        if min(b - a for a, b in zip(ordered, ordered[1:])) > 1e-4:
            assert fused[row][1] == rank


def test_models_predicted_fused_give_each_models_own_predictions(iris):
    """madlib_keras_predict_multiple_model: every model's predictions keyed by mst_key, as
    madlib_keras_predict gives them model by model; with madlib_mop.fuse_models on, the
    models predict as one program (a NOTICE says so), each model's probabilities its own
    within float rounding; mst_keys chooses models; a key of no model, or a bad setting,
    is refused with no output table left."""
    _fit(iris, "iris_predicted", "off")
    notices: list[str] = []
    with connect(iris, notices) as conn:
        assert _predict_all(conn, "iris_predicted", "iris_predicted_off", "off", notices) == []
        assert _predict_all(conn, "iris_predicted", "iris_predicted_on", "on", notices) == [
            f"madlib_keras_predict_multiple_model: {MODELS} of {MODELS} models predicted fused, in 1 "
            "group (madlib_mop.fuse_models = on)"]
        alone, fused = (_predictions(conn, f"iris_predicted_{s}") for s in ("off", "on"))
        assert len(alone) == MODELS * 150 * 3
        assert {key for key, _, _ in alone} == set(range(1, MODELS + 1))
        _same_predictions(alone, fused)
        # Each model's own: those of madlib_keras_predict with its mst_key.
        for key in (1, MODELS):
            conn.execute("SELECT madlib_keras_predict('iris_predicted', 'iris', 'id', 'attributes', %s, "
                         "'prob', mst_key => %s)", (f"iris_predicted_{key}", key))
            one = {(key, i, c): (p, r) for i, c, p, r in conn.execute(sql.SQL(
                "SELECT id, class_value, prob, rank FROM {}").format(sql.Identifier(f"iris_predicted_{key}")))}
            _same_predictions(one, {row: value for row, value in alone.items() if row[0] == key})
        assert len({round(p, 5) for (k, i, c), (p, _) in fused.items() if (i, c) == (0, "setosa")}) > 1
        conn.execute("SELECT madlib_keras_predict_multiple_model('iris_predicted', 'iris', 'id', 'attributes', "
                     "'iris_predicted_two', 'response', mst_keys => ARRAY[2, 5])")
        responses = conn.execute("SELECT mst_key, count(*), count(DISTINCT id) FROM iris_predicted_two "
                                 "GROUP BY 1 ORDER BY 1").fetchall()
        assert responses == [(2, 150, 150), (5, 150, 150)]
        with pytest.raises(psycopg.Error) as raised:
            conn.execute("SELECT madlib_keras_predict_multiple_model('iris_predicted', 'iris', 'id', "
                         "'attributes', 'iris_predicted_bad', mst_keys => ARRAY[2, 99])")
        assert raised.value.sqlstate == "22023" and "99" in str(raised.value)
        # The setting is read after the output's checks: nothing is left of the call.
        conn.execute("SET madlib_mop.fuse_models = sometimes")
        with pytest.raises(psycopg.Error) as raised:
            conn.execute("SELECT madlib_keras_predict_multiple_model('iris_predicted', 'iris', 'id', "
                         "'attributes', 'iris_predicted_bad')")
        assert raised.value.sqlstate == "22023" and "auto, on, off" in str(raised.value)
        assert conn.execute("SELECT to_regclass('iris_predicted_bad') IS NULL").fetchone()[0]


def test_two_groups_of_one_class_predict_each_their_own_models(iris):
    """32 models of one class fuse in two groups of 16 (one program each, not one program's
    weights loaded twice): each model's predictions its own."""
    with connect(iris) as conn:
        conn.execute("SELECT load_model_selection_table('iris_fused_arch', 'iris_fused_mst32', ARRAY[1], "
                     "%s, ARRAY['batch_size=8, epochs=1'])",
                     ([COMPILE.format(lr=0.0005 * (k + 1)) for k in range(32)],))
        conn.execute("SET madlib_mop.fuse_models = off")
        conn.execute("SELECT madlib_keras_fit_multiple_model('iris_fused_packed', 'iris_predicted32', "
                     "'iris_fused_mst32', 1)")
        notices: list[str] = []
    with connect(iris, notices) as conn:
        assert _predict_all(conn, "iris_predicted32", "iris_predicted32_off", "off", notices) == []
        assert _predict_all(conn, "iris_predicted32", "iris_predicted32_on", "on", notices) == [
            "madlib_keras_predict_multiple_model: 32 of 32 models predicted fused, in 2 groups "
            "(madlib_mop.fuse_models = on)"]
        _same_predictions(_predictions(conn, "iris_predicted32_off"), _predictions(conn, "iris_predicted32_on"))
