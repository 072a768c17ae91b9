"""One bad model stops alone: a configuration whose loss or weights become NaN or inf is
stopped as `diverged`, a configuration that fails the same way on every retry as `failed`,
and the job finishes the others, with the same weights as a job without them."""

from __future__ import annotations

import math

import psycopg
import pytest
from psycopg import sql
from psycopg.rows import dict_row

from tests.conftest import connect, iris_table, mlp_json

import keras  # noqa: E402  (a missing Keras fails these tests, it does not skip them)

HEALTHY = "loss='categorical_crossentropy', optimizer='Adam(learning_rate=0.01)', metrics=['accuracy']"
OTHER_HEALTHY = "loss='categorical_crossentropy', optimizer='Adam(learning_rate=0.05)', metrics=['accuracy']"
# SGD with an absurd learning rate: the loss is NaN within the first sub-epoch.
DIVERGING = "loss='categorical_crossentropy', optimizer='SGD(learning_rate=1e30)', metrics=['accuracy']"
FIT = "batch_size=8, epochs=1"


@pytest.fixture(scope="module")
def data(extension_dsn):
    with psycopg.connect(extension_dsn, autocommit=True) as conn:
        conn.execute("SET search_path = public, madlib_mop")
        iris_table(conn)
        conn.execute("SELECT training_preprocessor_dl('iris', 'iris_packed', 'class_text', "
                     "'attributes', distribution_rules => '2')")
        conn.execute("SELECT validation_preprocessor_dl('iris', 'iris_valid', 'class_text', "
                     "'attributes', 'iris_packed')")
        conn.execute("SELECT load_keras_model('arch', %s::json)", (mlp_json(4, 8, 3),))
        # A model that builds, and so passes every check before the job, but whose every
        # sub-epoch fails: an embedding of 2 rows looked up with iris' values up to 7.
        failing = keras.Sequential([keras.Input((4,)), keras.layers.Embedding(2, 2),
                                    keras.layers.Flatten(), keras.layers.Dense(3, activation="softmax")])
        conn.execute("SELECT load_keras_model('arch', %s::json)", (failing.to_json(),))
    return extension_dsn


def _selection(conn, table, compile_params, model_ids=None):
    conn.execute(sql.SQL("DROP TABLE IF EXISTS {}, {}").format(
        sql.Identifier(table), sql.Identifier(table + "_summary")))
    conn.execute(sql.SQL("CREATE TABLE {} (mst_key serial, model_id int, compile_params text, "
                         "fit_params text)").format(sql.Identifier(table)))
    for params, model_id in zip(compile_params, model_ids or [1] * len(compile_params)):
        conn.execute(sql.SQL("INSERT INTO {} (model_id, compile_params, fit_params) "
                             "VALUES (%s, %s, %s)").format(sql.Identifier(table)),
                     (model_id, params, FIT))
    conn.execute(sql.SQL("CREATE TABLE {} (model_arch_table text, object_table text)").format(
        sql.Identifier(table + "_summary")))
    conn.execute(sql.SQL("INSERT INTO {} VALUES ('arch', NULL)").format(
        sql.Identifier(table + "_summary")))


def _fit(conn, out, mst, iterations=3):
    conn.execute("SELECT madlib_keras_fit_multiple_model('iris_packed', %s, %s, %s, FALSE, "
                 "'iris_valid', 1)", (out, mst, iterations))


def _weights(conn, out):
    return dict(conn.execute(sql.SQL("SELECT mst_key, model_weights FROM {} ORDER BY 1").format(
        sql.Identifier(out))).fetchall())


@pytest.fixture(scope="module")
def diverged(data):
    """A job of three models whose second diverges, and the same job with the second
    replaced by a healthy configuration."""
    notices: list[str] = []
    with connect(data, notices) as conn:
        _selection(conn, "mst_bad", [HEALTHY, DIVERGING, OTHER_HEALTHY])
        _selection(conn, "mst_good", [HEALTHY, HEALTHY, OTHER_HEALTHY])
        _fit(conn, "with_bad", "mst_bad")
        _fit(conn, "without_bad", "mst_good")
    return data, notices


def test_a_diverging_model_stops_alone_and_the_others_are_unchanged(diverged):
    dsn, notices = diverged
    with connect(dsn) as conn:
        bad, good = _weights(conn, "with_bad"), _weights(conn, "without_bad")
        assert bad[1] == good[1] and bad[3] == good[3]
        info = {r["mst_key"]: r for r in conn.cursor(row_factory=dict_row).execute(
            "SELECT * FROM with_bad_info")}
        assert info[2]["status"] == "diverged"
        assert info[2]["stopped_iteration"] == 0
        assert "iteration 1" in info[2]["stop_reason"] and "nan" in info[2]["stop_reason"].lower()
        assert info[1]["status"] == info[3]["status"] == "finished"
        assert len(info[1]["training_loss"]) == 3
        job = conn.cursor(row_factory=dict_row).execute(
            "SELECT * FROM job_progress WHERE model_output_table = 'public.with_bad'").fetchone()
        assert job["state"] == "finished"
        assert job["models_failed"] == 1 and job["models_finished"] == 2
        assert "2" in job["model_failures"] and "diverged" in job["model_failures"]["2"]
        # Nothing stored is NaN text that breaks JSON: every visit and evaluation reads back.
        for table in ("with_bad_mop_visits", "with_bad_mop_evals"):
            for (result,) in conn.execute(sql.SQL("SELECT result FROM {}").format(sql.Identifier(table))):
                assert all(v is None or math.isfinite(v) for v in result.get("metrics", {}).values())
    assert any("mst_key 2 diverged" in n for n in notices)


def test_the_job_warns_of_its_diverged_models(data):
    warnings: list[tuple[str, str]] = []
    with psycopg.connect(data, autocommit=True) as conn:
        conn.execute("SET search_path = public, madlib_mop")
        conn.add_notice_handler(lambda d: warnings.append((d.severity_nonlocalized, d.message_primary)))
        _selection(conn, "mst_bad_only_one", [HEALTHY, DIVERGING])
        _fit(conn, "warned", "mst_bad_only_one", iterations=1)
    assert any(severity == "WARNING" and "mst_key 2" in text and "diverged" in text
               for severity, text in warnings)


def test_evaluate_and_predict_refuse_a_diverged_model(diverged):
    dsn, _ = diverged
    with connect(dsn) as conn:
        for statement in (
                "SELECT madlib_keras_evaluate('with_bad', 'iris_valid', 'eval_bad', FALSE, 2)",
                "SELECT madlib_keras_predict('with_bad', 'iris', 'id', 'attributes', 'pred_bad', "
                "'response', FALSE, 2)"):
            with pytest.raises(psycopg.Error) as caught:
                conn.execute(statement)
            assert caught.value.diag.sqlstate == "22000"
            assert "mst_key 2 diverged" in caught.value.diag.message_primary
            assert "another mst_key" in caught.value.diag.message_hint
        # The healthy ones still serve.
        conn.execute("SELECT madlib_keras_evaluate('with_bad', 'iris_valid', 'eval_good', FALSE, 1)")
        assert conn.execute("SELECT loss FROM eval_good").fetchone()[0] >= 0


def test_a_resumed_job_keeps_its_diverged_model_stopped(diverged):
    dsn, _ = diverged
    with connect(dsn) as conn:
        job_id = conn.execute("SELECT job_id FROM jobs WHERE model_output_table = 'public.with_bad'"
                              ).fetchone()[0]
        before = _weights(conn, "with_bad")
        # As if its coordinator had died: the job resumes with nothing left but what it did.
        conn.execute("UPDATE jobs SET state = 'interrupted' WHERE job_id = %s", (job_id,))
        conn.execute("CALL resume(%s)", (job_id,))
        assert _weights(conn, "with_bad") == before
        assert conn.execute("SELECT status FROM with_bad_info WHERE mst_key = 2").fetchone()[0] == "diverged"


def test_every_model_diverged_fails_the_job(data):
    with connect(data) as conn:
        _selection(conn, "mst_all_bad", [DIVERGING])
        with pytest.raises(psycopg.Error) as caught:
            _fit(conn, "all_bad", "mst_all_bad", iterations=1)
        assert caught.value.diag.sqlstate == "22000"
        assert "every model" in caught.value.diag.message_primary
        assert conn.execute("SELECT state FROM jobs WHERE model_output_table = 'public.all_bad'"
                            ).fetchone()[0] == "failed"


def test_a_model_failing_on_every_retry_fails_alone(data):
    warnings: list[tuple[str, str]] = []
    with psycopg.connect(data, autocommit=True) as conn:
        conn.execute("SET search_path = public, madlib_mop")
        conn.add_notice_handler(lambda d: warnings.append((d.severity_nonlocalized, d.message_primary)))
        _selection(conn, "mst_failing", [HEALTHY, HEALTHY], model_ids=[1, 2])
        _fit(conn, "with_failing", "mst_failing", iterations=2)
        info = {r["mst_key"]: r for r in conn.cursor(row_factory=dict_row).execute(
            "SELECT * FROM with_failing_info")}
        assert info[1]["status"] == "finished" and len(info[1]["training_loss"]) == 2
        assert info[2]["status"] == "failed" and info[2]["stopped_iteration"] == 0
        assert "after 3 attempts" in info[2]["stop_reason"]
        job = conn.cursor(row_factory=dict_row).execute(
            "SELECT * FROM job_progress WHERE model_output_table = 'public.with_failing'").fetchone()
        assert job["state"] == "finished" and job["models_failed"] == 1
        assert "failed" in job["model_failures"]["2"]
        # Three attempts of its first sub-epoch, each noticed, then it stopped alone.
        assert sum("mst_key 2" in text and "running it again" in text for _, text in warnings) == 2
        assert any(s == "WARNING" and "mst_key 2 failed" in text for s, text in warnings)
        # Resumed, a failed model trains again (its cause may have been fixed): here it
        # fails again, the same way, and the job still finishes.
        job_id = job["job_id"]
        conn.execute("UPDATE jobs SET state = 'interrupted' WHERE job_id = %s", (job_id,))
        before = _weights(conn, "with_failing")[1]
        conn.execute("CALL resume(%s)", (job_id,))
        assert _weights(conn, "with_failing")[1] == before
        assert conn.execute("SELECT status FROM with_failing_info WHERE mst_key = 2").fetchone()[0] == "failed"
