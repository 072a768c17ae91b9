"""The README's "Deploying on your server", applied as written to a second server set up the
way Debian sets one up (peer on the socket, scram-sha-256 on TCP, no trust anywhere): a
non-superuser analyst who logs in with her password trains, evaluates and predicts, and
every worker session is hers; an analyst the DBA has not allowed gets a clear error."""

from __future__ import annotations

import os
import re
import threading
import time
import uuid

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from madlib_mop.tools.embedded import REPO_ROOT, EmbeddedCluster
from tests.docs import page

import keras

DEPLOYING = page("deploy.md")


def _block(info: str) -> str:
    """The page's first fenced block of that info string."""
    return re.search(rf"```{re.escape(info)}\n(.*?)```", DEPLOYING, re.S).group(1)


@pytest.fixture(scope="module")
def debian_server():
    cluster = EmbeddedCluster(base=REPO_ROOT / ".pg" / f"deploy-{uuid.uuid4().hex[:8]}",
                              port=54400 + uuid.uuid4().int % 500, worker_auth=False)
    try:
        dsn = cluster.start("analytics")
        yield cluster, dsn
    finally:
        cluster.destroy()


def _rules(path) -> list[list[str]]:
    return [line.split() for line in path.read_text().splitlines()
            if line.strip() and not line.lstrip().startswith("#")]


def _login(dsn: str, role: str, password: str) -> psycopg.Connection:
    params = conninfo_to_dict(dsn)
    params.pop("passfile")
    params.update(user=role, password=password)
    return psycopg.connect(make_conninfo(**params), autocommit=True)


def test_readme_deployment_on_a_debian_configured_server(debian_server):
    cluster, dsn = debian_server
    hba, ident = cluster.data / "pg_hba.conf", cluster.data / "pg_ident.conf"
    # Debian's pg_hba.conf as pg_createcluster leaves it.
    assert _rules(hba)[:4] == [["local", "all", "postgres", "peer"], ["local", "all", "all", "peer"],
                               ["host", "all", "all", "127.0.0.1/32", "scram-sha-256"],
                               ["host", "all", "all", "::1/128", "scram-sha-256"]]
    assert not any("trust" in rule for rule in _rules(hba))

    # Steps 2 and 3, as the README writes them.
    text = hba.read_text()
    text = re.sub(r"(?m)^local\s+all\s+all\s+peer\s*$", _block("pg_hba.conf").strip(), text, count=1)
    hba.write_text(text)
    lines = _block("pg_ident.conf")
    if cluster.server_os_user != "postgres":  # a developer's own cluster runs as them
        lines = re.sub(r"(?m)^(madlib_mop\s+)postgres(\s)", rf"\g<1>{cluster.server_os_user}\g<2>", lines)
    ident.write_text(ident.read_text() + lines)
    with psycopg.connect(dsn, autocommit=True) as admin:
        admin.execute("SELECT pg_reload_conf()")
        # Step 4, and step 5 for alice; bob is granted the same but has no pg_ident.conf line.
        admin.execute("CREATE SCHEMA madlib_mop")
        admin.execute("CREATE EXTENSION madlib_mop SCHEMA madlib_mop CASCADE")
        for statement in _block("sql").split(";\n"):
            if statement.strip():
                admin.execute(statement)
        admin.execute("CREATE ROLE bob LOGIN PASSWORD 'bob-password'; "
                      "GRANT USAGE ON SCHEMA madlib_mop TO bob; GRANT CREATE ON SCHEMA public TO bob")
        assert admin.execute("SELECT rolsuper FROM pg_roles WHERE rolname = 'alice'").fetchone()[0] is False
    password = re.search(r"PASSWORD '([^']+)'", _block("sql")).group(1)

    seen: set = set()
    stop = threading.Event()

    def watch():
        with psycopg.connect(dsn, autocommit=True) as admin:
            while not stop.is_set():
                seen.update(admin.execute(
                    "SELECT usename, application_name FROM pg_stat_activity "
                    "WHERE datname = 'analytics' AND application_name LIKE 'madlib_mop%'").fetchall())
                time.sleep(0.05)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        with _login(dsn, "alice", password) as conn:
            conn.execute("CREATE TABLE points AS SELECT i AS id, "
                         "ARRAY[i % 7, i % 5, i % 3, i % 11]::real[] AS x, (i % 3)::text AS y "
                         "FROM generate_series(1, 120) i")
            conn.execute("SET search_path = public, madlib_mop")
            conn.execute("SELECT training_preprocessor_dl('points', 'points_packed', 'y', 'x', 16, "
                         "distribution_rules => '2')")
            conn.execute("SELECT validation_preprocessor_dl('points', 'points_valid', 'y', 'x', "
                         "'points_packed')")
            mlp = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, activation="relu"),
                                    keras.layers.Dense(3, activation="softmax")]).to_json()
            conn.execute("SELECT load_keras_model('arch', %s::json)", (mlp,))
            conn.execute("SELECT generate_model_configs('arch', 'mst', ARRAY[1], "
                         "$${'loss': ['categorical_crossentropy'], 'optimizer_params_list': "
                         "[{'optimizer': ['Adam'], 'lr': [0.01, 0.05]}], 'metrics': ['accuracy']}$$, "
                         "$${'batch_size': [16], 'epochs': [1]}$$)")
            conn.execute("SELECT madlib_keras_fit_multiple_model('points_packed', 'models', 'mst', 2, "
                         "FALSE, 'points_valid')")
            conn.execute("SELECT madlib_keras_evaluate('models', 'points_valid', 'evaluated', mst_key => 1)")
            conn.execute("SELECT madlib_keras_predict('models', 'points', 'id', 'x', 'predicted', "
                         "'response', mst_key => 1)")
            assert conn.execute("SELECT count(*) FROM models_info WHERE validation_metrics_final "
                                "IS NOT NULL").fetchone()[0] == 2
            assert conn.execute("SELECT count(*) FROM evaluated").fetchone()[0] == 1
            assert conn.execute("SELECT count(*) FROM predicted").fetchone()[0] == 120
            owners = conn.execute("SELECT DISTINCT tableowner FROM pg_tables WHERE tablename "
                                  "IN ('models', 'models_info', 'evaluated', 'predicted')").fetchall()
            assert owners == [("alice",)]
    finally:
        stop.set()
        watcher.join()
    assert any(app.startswith("madlib_mop worker job") for _, app in seen), seen
    assert any(app.startswith("madlib_mop inference worker") for _, app in seen), seen
    assert {user for user, _ in seen} == {"alice"}, seen

    # bob: the DBA has not added his map line: a clear error, nothing written.
    with psycopg.connect(dsn, autocommit=True) as admin:
        admin.execute("GRANT SELECT ON public.mst, public.mst_summary, public.arch TO bob")
    with _login(dsn, "bob", "bob-password") as conn:
        conn.execute("CREATE TABLE bob_points AS SELECT i AS id, ARRAY[i % 7, i % 5, i % 3, i % 11]"
                     "::real[] AS x, (i % 3)::text AS y FROM generate_series(1, 60) i")
        conn.execute("SELECT madlib_mop.training_preprocessor_dl('bob_points', 'bob_packed', 'y', "
                     "'x', 16, distribution_rules => '2')")
        with pytest.raises(psycopg.errors.InvalidAuthorizationSpecification) as caught:
            conn.execute("SELECT madlib_mop.madlib_keras_fit_multiple_model('bob_packed', "
                         "'bob_models', 'public.mst', 1)")
        assert "pg_ident.conf" in caught.value.diag.message_hint
        assert "role bob" in caught.value.diag.message_primary
        assert conn.execute("SELECT to_regclass('bob_models') IS NULL AND to_regclass("
                            "'bob_models_info') IS NULL").fetchone()[0]
        assert conn.execute("SELECT count(*) FROM madlib_mop.jobs").fetchone()[0] == 0


def test_the_server_runs_no_trust(debian_server):
    cluster, _ = debian_server
    assert os.path.exists(cluster.passfile)
    assert not any("trust" in rule for rule in _rules(cluster.data / "pg_hba.conf"))
