"""A person steering a running job: stop a model, clone one from its current state, add a
configuration, change a model's iterations -- from SQL, the client and the CLI; only the
job's owner may; and a job whose coordinator is killed after them resumes with the same
models, targets and weights (each model's weights equal a replay of its recorded visits)."""

from __future__ import annotations

import subprocess
import sys
import threading
import time

import psycopg
import pytest
from psycopg import sql

from madlib_mop.client import Client
from madlib_mop.runtime import state
from madlib_mop.tools.replay import replay
from tests.conftest import REPO_ROOT, connect, held_job, mlp_json, packed_iris

COMPILE = "optimizer='Adam(lr=0.01)',loss='categorical_crossentropy',metrics=['accuracy']"


@pytest.fixture(scope="module")
def db(extension_dsn):
    with connect(extension_dsn) as conn:
        packed_iris(conn)
        conn.execute("SELECT load_keras_model('arch', %s)", (mlp_json(4, 8, 3),))
        conn.execute("SELECT generate_model_configs('arch', 'mst', ARRAY[1], %s, %s)", (
            "{'loss': ['categorical_crossentropy'], 'optimizer_params_list': [{'optimizer': ['Adam'], "
            "'lr': [0.01]}], 'metrics': ['accuracy']}", "{'batch_size': [8, 16, 32]}"))
        yield conn


def _start(dsn: str, out: str, notices: list) -> tuple[threading.Thread, list]:
    failures: list = []

    def fit() -> None:
        try:
            with connect(dsn, notices) as conn:
                conn.execute("SELECT madlib_keras_fit_multiple_model('iris_packed', %s, 'mst', 3, "
                             "validation_table => 'iris_valid')", (out,))
        except psycopg.Error as error:
            failures.append(error)

    thread = threading.Thread(target=fit)
    thread.start()
    return thread, failures


def _requests(db, job_id: int) -> dict[int, dict]:
    cursor = db.cursor(row_factory=psycopg.rows.dict_row)
    return {r["action_id"]: r for r in cursor.execute(
        "SELECT * FROM steering WHERE job_id = %s ORDER BY action_id", (job_id,))}


def _info(db, out: str) -> dict[int, dict]:
    cursor = db.cursor(row_factory=psycopg.rows.dict_row)
    return {r["mst_key"]: r for r in cursor.execute(sql.SQL("SELECT * FROM {} ORDER BY mst_key").format(
        sql.Identifier(out + "_info")))}


def _weights(db, out: str, key: int) -> bytes:
    return bytes(db.execute(sql.SQL("SELECT model_weights FROM {} WHERE mst_key = %s").format(
        sql.Identifier(out)), (key,)).fetchone()[0])


def _replayed(dsn: str, out: str, key: int) -> bytes:
    """The model's weights from its recorded first state and visits (its own connection:
    replay reads rows as dicts)."""
    with psycopg.connect(dsn) as conn:
        conn.execute("SET search_path = public, madlib_mop")
        return replay(conn, out, key).tobytes()


def _initial_weights(db, out: str, key: int) -> bytes:
    pieces = db.execute(sql.SQL("SELECT state FROM {} WHERE mst_key = %s AND step = 0 ORDER BY piece").format(
        sql.Identifier(out + "_mop_state")), (key,)).fetchall()
    return bytes(state.madlib_weights(b"".join(bytes(p[0]) for p in pieces)))


def _steer(db, extension_dsn, job_id: int) -> dict[str, int]:
    """Every action, while the job is held: from SQL, the client and the CLI."""
    ids = {"stop": db.execute("SELECT stop_model(%s, 1)", (job_id,)).fetchone()[0],
           # A clone of mst_key 2 and a stop of it take effect at the same boundary: the
           # clone's first state is then the source's last.
           "clone": db.execute("SELECT clone_model(%s, 2)", (job_id,)).fetchone()[0],
           "stop source": db.execute("SELECT stop_model(%s, 2)", (job_id,)).fetchone()[0]}
    with Client(extension_dsn, progress=False) as mop:
        ids["add"] = mop.add_model_config(job_id=job_id, model_id=1, compile_params=COMPILE,
                                          fit_params="batch_size=12")
    done = subprocess.run([sys.executable, "-m", "madlib_mop.client.cli", "--dsn", extension_dsn, "steer",
                           str(job_id), "iterations", "3", "5"],
                          capture_output=True, text=True, timeout=120, cwd=REPO_ROOT)
    assert done.returncode == 0, done.stderr
    ids["iterations"] = int(done.stdout.split("steering action ")[1].split()[0])
    return ids


def test_each_action_is_applied_where_the_model_is_between_iterations(db, extension_dsn):
    notices: list = []
    thread, failures = _start(extension_dsn, "steered", notices)
    with held_job(db, "steered", 1):
        job_id = db.execute("SELECT job_id FROM jobs WHERE model_output_table = 'public.steered'").fetchone()[0]
        ids = _steer(db, extension_dsn, job_id)
    thread.join(timeout=300)
    assert not failures, failures
    requests, info = _requests(db, job_id), _info(db, "steered")
    assert all(r["applied_at"] is not None for r in requests.values()), requests
    assert {r["owner"] for r in requests.values()} == {db.info.user}

    stop = requests[ids["stop"]]
    assert info[1]["status"] == "stopped" and info[1]["stopped_iteration"] == stop["applied_iteration"] <= 1
    assert info[1]["subepochs_done"] == 2 * stop["applied_iteration"]
    assert "stopped by" in info[1]["stop_reason"]
    # Models 1 and 2 are dispatched first (equal work left: the lower keys), so both had begun
    # their first iteration when stopped: each is validated at the iteration it stopped after.
    for key_stopped in (1, 2):
        assert info[key_stopped]["stopped_iteration"] >= 1
        assert info[key_stopped]["metrics_iters"][-1] == info[key_stopped]["stopped_iteration"]
        assert len(info[key_stopped]["validation_loss"]) == len(info[key_stopped]["metrics_iters"])

    clone, source_stop = requests[ids["clone"]], requests[ids["stop source"]]
    key = clone["new_mst_key"]
    assert clone["applied_iteration"] == source_stop["applied_iteration"] == info[2]["stopped_iteration"]
    assert _initial_weights(db, "steered", key) == _weights(db, "steered", 2)  # from its state then
    assert info[key]["compile_params"] == info[2]["compile_params"] and info[key]["status"] == "finished"
    assert info[key]["subepochs_done"] == 3 * 2

    added = requests[ids["add"]]["new_mst_key"]
    assert info[added]["fit_params"] == "batch_size=12" and info[added]["status"] == "finished"
    assert info[3]["subepochs_done"] == 5 * 2 and info[3]["metrics_iters"][-1] == 5
    assert len(info[3]["validation_loss"]) == len(info[3]["metrics_iters"]) and info[3]["status"] == "finished"
    assert sorted(info) == sorted([1, 2, 3, key, added]) and len({key, added}) == 2
    assert any(f"mst_key {key} enters (steering action {ids['clone']}" in n for n in notices), notices
    # The models made by steering replay as any other: their first state and visits are recorded.
    for mst_key in (key, added):
        assert _replayed(extension_dsn, "steered", mst_key) == _weights(db, "steered", mst_key)


def test_only_the_owner_steers_and_bad_requests_are_refused(db):
    job_id = db.execute("SELECT max(job_id) FROM jobs WHERE model_output_table = 'public.steered'").fetchone()[0]
    with pytest.raises(psycopg.errors.InvalidParameterValue) as caught:  # finished
        db.execute("SELECT stop_model(%s, 1)", (job_id,))
    assert "finished" in caught.value.diag.message_primary
    db.execute("UPDATE jobs SET state = 'interrupted' WHERE job_id = %s", (job_id,))
    try:
        for call, error in [("SELECT set_model_iterations(%s, 1, 0)", psycopg.errors.InvalidParameterValue),
                            ("SELECT set_model_iterations(%s, 1, 31)", psycopg.errors.InvalidParameterValue),
                            ("SELECT stop_model(%s, 99)", psycopg.errors.InvalidParameterValue),
                            ("SELECT add_model_config(%s, 7, 'loss=''mse''', 'batch_size=8')",
                             psycopg.errors.InvalidParameterValue),
                            ("SELECT clone_model(%s, 1, 'optimizer=''Nope()''')", psycopg.errors.InvalidParameterValue)]:
            with pytest.raises(error):
                db.execute(call, (job_id,))
        # A job that a pruner or an automl search steers is not steered by hand too.
        db.execute("UPDATE jobs SET arguments = arguments || '{\"pruner\": \"median\"}' WHERE job_id = %s",
                   (job_id,))
        with pytest.raises(psycopg.errors.FeatureNotSupported):
            db.execute("SELECT stop_model(%s, 1)", (job_id,))
        db.execute("UPDATE jobs SET arguments = arguments - 'pruner' WHERE job_id = %s", (job_id,))
        role = "steering_outsider"
        db.execute(sql.SQL("CREATE ROLE {} ; GRANT USAGE ON SCHEMA madlib_mop TO {}").format(
            sql.Identifier(role), sql.Identifier(role)))
        try:
            db.execute(sql.SQL("SET ROLE {}").format(sql.Identifier(role)))
            with pytest.raises(psycopg.errors.InvalidParameterValue) as caught:
                db.execute("SELECT stop_model(%s, 1)", (job_id,))
            assert "another role's" in caught.value.diag.message_primary
            with pytest.raises(psycopg.errors.InsufficientPrivilege):  # not through the function either
                db.execute("INSERT INTO steering (job_id, action, mst_key) VALUES (%s, 'stop', 1)", (job_id,))
            assert db.execute("SELECT count(*) FROM steering").fetchone()[0] == 0  # sees none of the owner's
        finally:
            db.execute("RESET ROLE")
            db.execute(sql.SQL("DROP OWNED BY {}; DROP ROLE {}").format(sql.Identifier(role), sql.Identifier(role)))
    finally:
        db.execute("UPDATE jobs SET state = 'finished' WHERE job_id = %s", (job_id,))


def test_steering_survives_a_killed_coordinator(db, extension_dsn):
    notices: list = []
    thread, failures = _start(extension_dsn, "resumed", notices)
    with held_job(db, "resumed", 1):
        job_id = db.execute("SELECT job_id FROM jobs WHERE model_output_table = 'public.resumed'").fetchone()[0]
        ids = {"stop": db.execute("SELECT stop_model(%s, 1)", (job_id,)).fetchone()[0],
               "clone": db.execute("SELECT clone_model(%s, 2, fit_params => 'batch_size=4')", (job_id,)).fetchone()[0],
               "iterations": db.execute("SELECT set_model_iterations(%s, 3, 8)", (job_id,)).fetchone()[0]}
    deadline = time.monotonic() + 60
    while not all(r["applied_at"] is not None for r in _requests(db, job_id).values()):
        assert time.monotonic() < deadline and thread.is_alive(), _requests(db, job_id)
        time.sleep(0.02)
    done = db.execute("SELECT subepochs_done FROM jobs WHERE job_id = %s", (job_id,)).fetchone()[0]
    with held_job(db, "resumed", done + 2):  # after the requests were applied: killed
        applied = _requests(db, job_id)
        pid = db.execute("SELECT coordinator_pid FROM jobs WHERE job_id = %s", (job_id,)).fetchone()[0]
        db.execute("SELECT pg_terminate_backend(%s)", (pid,))
    thread.join(timeout=120)
    assert failures, "the coordinator's session should have been terminated"
    db.execute("SELECT pg_advisory_lock(lock_key), pg_advisory_unlock(lock_key) FROM jobs WHERE job_id = %s",
               (job_id,))
    db.execute("CALL resume(%s)", (job_id,))
    assert _requests(db, job_id) == applied  # applied once, not again
    info = _info(db, "resumed")
    key = applied[ids["clone"]]["new_mst_key"]
    assert sorted(info) == [1, 2, 3, key]
    assert info[1]["subepochs_done"] == 2 * applied[ids["stop"]]["applied_iteration"]
    assert info[3]["subepochs_done"] == 2 * 8 and info[key]["fit_params"] == "batch_size=4"
    for mst_key in info:  # every model, before and after the kill, as its recorded visits give it
        assert _replayed(extension_dsn, "resumed", mst_key) == _weights(db, "resumed", mst_key), mst_key
