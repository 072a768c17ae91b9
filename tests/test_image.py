"""The image behaves as the official PostgreSQL image does: it listens on every address of
the container and takes the superuser's password (scram-sha-256) on TCP from any address,
so that `docker run -p 5432:5432 -e POSTGRES_PASSWORD=...` reaches it; worker sessions keep
peer authentication on the Unix socket.

Run on a testcontainers container of the image (`make test-containers`), with host
networking: the client that is not on the loopback is a psql in a network namespace this
module makes (a veth pair of its own), so no traffic leaves this machine.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import uuid

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import make_conninfo

from madlib_mop.tools import containers
from madlib_mop.tools.containers import ContainerServer
from madlib_mop.tools.debian_package import project_version
from tests import docs
from tests.conftest import REPO_ROOT, _free_port, iris_table, mlp_json, process_network, veth_namespace

NAMESPACE, HOST_LINK, NS_LINK, HOST_IP, NS_IP = process_network("image")
PSQL = "/usr/lib/postgresql/15/bin/psql"
DATABASE = "t_image_walkthrough"


@pytest.fixture(scope="module")
def container(server_host) -> ContainerServer:
    if not isinstance(server_host, ContainerServer):
        pytest.skip("the image's own settings: run with MADLIB_MOP_TEST_SERVER=container")
    return server_host


@pytest.fixture(scope="module")
def elsewhere():
    """run(conninfo, sql, password) -> psql's result, from NS_IP: a client of another address."""
    with veth_namespace(NAMESPACE, HOST_LINK, NS_LINK, HOST_IP, NS_IP):
        def run(conninfo: str, statements: str, password: str | None) -> subprocess.CompletedProcess:
            environment = {"PATH": os.environ["PATH"], "PGCONNECT_TIMEOUT": "10"}
            if password is not None:
                environment["PGPASSWORD"] = password
            # A script on stdin: each statement its own transaction, as psql runs a file.
            return subprocess.run(["ip", "netns", "exec", NAMESPACE, PSQL, "-X", "-w", "-A", "-t", "-v",
                                   "ON_ERROR_STOP=1", "-d", conninfo, "-f", "-"], input=statements,
                                  capture_output=True, text=True, env=environment, timeout=600)

        yield run


def _from_elsewhere(container: ContainerServer, dbname: str = "postgres") -> str:
    """The container's server as a client at NS_IP reaches it (no password file)."""
    return make_conninfo(host=HOST_IP, port=container.port, user="postgres", dbname=dbname,
                         passfile="/nonexistent/pgpass")


def test_it_listens_on_every_address_and_takes_passwords_from_any(container, server_dsn):
    with psycopg.connect(server_dsn) as conn:
        assert conn.execute("SHOW listen_addresses").fetchone()[0] == "*"
        rules = conn.execute("SELECT type, database, user_name, address, auth_method, options "
                             "FROM pg_hba_file_rules WHERE error IS NULL ORDER BY line_number").fetchall()
    assert rules[-1] == ("host", ["all"], ["all"], "all", "scram-sha-256", None)
    # Worker sessions: peer on the socket, with the madlib_mop map, before any TCP line.
    assert ("local", ["all"], ["all"], None, "peer", ["map=madlib_mop"]) in rules
    assert not [rule for rule in rules if rule[4] in ("trust", "password", "md5")]


def test_a_client_of_another_address_logs_in_with_the_password_only(container, elsewhere):
    logged_in = elsewhere(_from_elsewhere(container), "SELECT host(inet_client_addr())", container.password)
    assert logged_in.returncode == 0, logged_in.stderr
    assert logged_in.stdout.strip() == NS_IP  # not the loopback: the rule for any address let it in
    without = elsewhere(_from_elsewhere(container), "SELECT 1", None)
    assert without.returncode != 0 and "no password supplied" in without.stderr
    wrong = elsewhere(_from_elsewhere(container), "SELECT 1", container.password + "x")
    assert wrong.returncode != 0 and 'password authentication failed for user "postgres"' in wrong.stderr


def test_madlibs_iris_walkthrough_from_another_address(container, server_dsn, elsewhere):
    with psycopg.connect(server_dsn, autocommit=True) as admin:
        admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(DATABASE)))
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(DATABASE)))
    local = make_conninfo(server_dsn, dbname=DATABASE)
    try:
        with psycopg.connect(local) as conn:
            conn.execute("CREATE EXTENSION madlib_mop CASCADE")
            iris_table(conn, madlib_names=True)
        walkthrough = f"""
            SET search_path = public, madlib_mop;
            SELECT training_preprocessor_dl('iris', 'iris_packed', 'class_text', 'attributes');
            SELECT load_keras_model('model_arch_library', '{mlp_json(4, 8, 3)}'::json);
            SELECT madlib_keras_fit('iris_packed', 'iris_model', 'model_arch_library', 1,
                $$loss='categorical_crossentropy', optimizer='Adam(learning_rate=0.01)',
                  metrics=['accuracy']$$, $$batch_size=16, epochs=1$$, 3);
            SELECT madlib_keras_predict('iris_model', 'iris', 'id', 'attributes', 'iris_predict', 'response');
            SELECT count(*) FROM iris_predict;"""
        done = elsewhere(_from_elsewhere(container, DATABASE), walkthrough, container.password)
        assert done.returncode == 0, done.stderr
        assert done.stdout.split()[-1] == "150"
        with psycopg.connect(local) as conn:
            assert conn.execute("SELECT num_iterations FROM iris_model_summary").fetchone()[0] == 3
            labels = {row[0] for row in conn.execute("SELECT class_value FROM iris_predict")}
        assert labels <= {"Iris-setosa", "Iris-versicolor", "Iris-virginica"}
    finally:
        with psycopg.connect(server_dsn, autocommit=True) as admin:
            admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(DATABASE)))


def test_the_readmes_docker_run_block(container):
    """The README's block, as a user runs it, but on the host's network (this machine's tests
    reach containers there): the published port becomes a port of the host's loopback."""
    block = docs.block(docs.page("docker.md"), "As the official PostgreSQL image does", "sh")
    run, login = [line.strip() for line in block.strip().splitlines()]
    assert run.startswith("docker run -d --name mop -p 5432:5432 -e POSTGRES_PASSWORD=secret ")
    assert run.endswith(f"madlib_mop:{project_version(REPO_ROOT / 'pyproject.toml')}")
    name, port = f"mop-readme-{uuid.uuid4().hex[:8]}", _free_port()
    run = run.replace("--name mop", f"--name {name}").replace(
        "-p 5432:5432", f"--network host -e MADLIB_MOP_PGPORT={port}")
    subprocess.run(shlex.split(run), check=True, capture_output=True)
    try:
        containers.wait_healthy(name)
        login = login.replace("localhost:5432", f"127.0.0.1:{port}").replace("psql ", f"{PSQL} -X -A -t ", 1)
        answer = subprocess.run(shlex.split(login) + ["-c", "SELECT extversion FROM pg_extension "
                                                            "WHERE extname = 'madlib_mop'"],
                                capture_output=True, text=True, timeout=60)
        assert answer.returncode == 0, answer.stderr
        assert answer.stdout.strip() == project_version(REPO_ROOT / "pyproject.toml")
    finally:
        subprocess.run(["docker", "rm", "-f", "-v", name], capture_output=True)
