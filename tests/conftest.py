"""Fixtures: one real PostgreSQL server for the session, a fresh database per test module.

The server, in this order:
1. MADLIB_MOP_DSN, when set: the user's server (it must have the extension files
   installed, e.g. by `make install` on its host, and allow CREATE DATABASE);
2. MADLIB_MOP_TEST_SERVER=container: a testcontainers container of the project's image
   (docker/Dockerfile, built by `make images` when absent), on the host's network;
3. an embedded cluster of the test process's own (`.pg-gw0`, `.pg-gw1`, ...: one per
   pytest-xdist process, on a free port, stopped at its end), so no test sees another
   process's sessions, slots or server settings, and the project's server (`.pg`, the
   demo's) is left as it was.  This is the default, whether or not a Docker engine answers.

The embedded server and the container are the tests' own: tests that change a server's
files (pg_ident.conf lines for analyst roles, the extension folder) change theirs, through
`server_host`.  A server named by MADLIB_MOP_DSN is the DBA's: those tests skip.
"""

from __future__ import annotations

import contextlib
import os
import random
import re
import secrets
import shutil
import socket
import subprocess
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Callable, Iterator

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import make_conninfo

from madlib_mop.tools import containers
from madlib_mop.tools.containers import ContainerServer
from madlib_mop.tools.embedded import DSN_VARIABLE, EmbeddedCluster

REPO_ROOT = Path(__file__).resolve().parents[1]
PSQL = "/usr/lib/postgresql/15/bin/psql"


def connect(dsn: str, notices: list | None = None) -> psycopg.Connection:
    """An autocommit connection with the extension's schema on the search_path, as the
    README's sessions have it; NOTICEs appended to `notices` if given."""
    conn = psycopg.connect(dsn, autocommit=True)
    conn.execute("SET search_path = public, madlib_mop")
    if notices is not None:
        conn.add_notice_handler(lambda diag: notices.append(diag.message_primary))
    return conn


def mlp_json(inputs: int, hidden: int, classes: int) -> str:
    """A Keras MLP's JSON: inputs -> hidden (relu) -> classes (softmax)."""
    import keras

    return keras.Sequential([keras.Input((inputs,)), keras.layers.Dense(hidden, activation="relu"),
                             keras.layers.Dense(classes, activation="softmax")]).to_json()


def two_in_two_out_json(width: int = 10, outputs: int = 2) -> str:
    """MADlib's multi-io architecture (its madlib_keras_iris set-up), as Keras 3 writes it:
    two inputs of 4, a Dense each, concatenated; two softmax outputs of 3 classes (or the
    first alone)."""
    import keras

    first, second = keras.Input((4,), name="input_1"), keras.Input((4,), name="input_2")
    a = keras.layers.Dense(width, activation="relu", name="dense")(first)
    b = keras.layers.Dense(width, activation="relu", name="dense_2")(second)
    joined = keras.layers.Concatenate(name="concatenate")([a, b])
    out_1 = keras.layers.Dense(3, activation="softmax", name="dense_4")(joined)
    out_2 = keras.layers.Dense(3, activation="softmax", name="dense_5")(b)
    return keras.Model([first, second], [out_1, out_2][:outputs]).to_json()


def iris_mult_table(conn: psycopg.Connection, source: str, table: str = "iris_mult") -> None:
    """MADlib's multi-io data set from an iris table: its attributes squared as a second
    input, its class twice as a second output."""
    conn.execute(sql.SQL("CREATE TABLE {} AS SELECT id, attributes, ARRAY(SELECT v * v FROM "
                         "unnest(attributes) v) AS attributes2, class_text, class_text AS class_text2 "
                         "FROM {}").format(sql.Identifier(table), sql.Identifier(source)))


def iris_table(conn: psycopg.Connection, table: str = "iris", *, features: str = "float8[]",
               label: str = "class_text", label_type: str = "text", madlib_names: bool = False,
               rows: range = range(150), first_id: int = 0) -> None:
    """scikit-learn's iris as MADlib's walkthrough has it: (id, attributes <features>,
    <label> <label_type>), in table `table` of the connection's first schema.  The classes
    are named as scikit-learn names them (setosa), or as MADlib's data set does (Iris-setosa);
    `rows`: which of the 150, each with id `first_id` + its place among them."""
    from sklearn.datasets import load_iris

    iris = load_iris()
    conn.execute(sql.SQL("CREATE TABLE {} (id int, attributes {}, {} {})").format(
        sql.Identifier(table), sql.SQL(features), sql.Identifier(label), sql.SQL(label_type)))
    with conn.cursor().copy(sql.SQL("COPY {} FROM STDIN").format(sql.Identifier(table))) as copy:
        for row in rows:
            name = str(iris.target_names[iris.target[row]])
            copy.write_row((first_id + row, [float(v) for v in iris.data[row]],
                            f"Iris-{name}" if madlib_names else name))


def packed_iris(conn: psycopg.Connection) -> None:
    """`iris` (see `iris_table`) packed over 2 segments into `iris_packed`, and again as
    validation data into `iris_valid`."""
    iris_table(conn)
    conn.execute("SELECT training_preprocessor_dl('iris', 'iris_packed', 'class_text', 'attributes', "
                 "distribution_rules => '2')")
    conn.execute("SELECT validation_preprocessor_dl('iris', 'iris_valid', 'class_text', 'attributes', "
                 "'iris_packed')")


ADAM = "loss='categorical_crossentropy', optimizer='Adam(learning_rate=0.01)', metrics=['accuracy']"


def iris_grid(conn: psycopg.Connection) -> None:
    """In a database with the extension (on the connection's search_path): `iris` packed
    over 2 segments into `iris_packed`, an MLP `arch` (model_id 1) and a model selection
    table `mst` of it at two learning rates (ADAM's 0.01 and 0.05), one epoch, batch 8."""
    iris_table(conn)
    conn.execute("SELECT training_preprocessor_dl('iris', 'iris_packed', 'class_text', "
                 "'attributes', distribution_rules => '2')")
    conn.execute("SELECT load_keras_model('arch', %s::json)", (mlp_json(4, 8, 3),))
    conn.execute("SELECT load_model_selection_table('arch', 'mst', ARRAY[1], ARRAY[%s, %s], "
                 "ARRAY['batch_size=8, epochs=1'])", (ADAM, ADAM.replace("0.01", "0.05")))


def notebook_functions(source: str, names: tuple[str, ...]) -> dict[str, bytes]:
    """The functions `names` of `source` as a Keras user's notebook defines them (module
    __main__), serialised by value with dill, as MADlib's users store them for
    load_custom_function."""
    import dill

    namespace = {"__name__": "__main__"}
    exec(compile(source, "<notebook>", "exec"), namespace)
    return {name: dill.dumps(namespace[name], recurse=True) for name in names}


def psql_script(dsn: str, script: str) -> subprocess.CompletedProcess:
    """`script` run as an analyst's script file runs: psql -f, autocommit, one statement
    after another with no pause, stopping at the first error (ON_ERROR_STOP)."""
    with tempfile.NamedTemporaryFile("w", suffix=".sql") as file:
        file.write("SET search_path = public, madlib_mop;\n" + script)
        file.flush()
        return subprocess.run([PSQL, "-X", "-q", "-v", "ON_ERROR_STOP=1", "-d", dsn, "-f", file.name],
                              capture_output=True, text=True, timeout=600)


def psql_rows(dsn: str, script: str) -> list[str]:
    """The rows `script` prints (run as `psql_script` runs it), unaligned (`a|b`); it must
    succeed."""
    done = psql_script(dsn, "\\pset format unaligned\n\\pset tuples_only on\n" + script)
    assert done.returncode == 0, done.stderr
    return [line for line in done.stdout.splitlines() if line]


def psql_error(dsn: str, script: str) -> dict:
    """The error `script` ends with (run as `psql_script` runs it): sqlstate, message,
    detail and hint, as psql prints them with VERBOSITY verbose."""
    done = psql_script(dsn, "\\set VERBOSITY verbose\n" + script)
    assert done.returncode != 0, f"not refused: {script}"
    found = re.search(r"ERROR:  (\w{5}): (.*)", done.stderr)
    assert found, done.stderr
    detail, hint = (re.search(rf"{word}:  (.*)", done.stderr) for word in ("DETAIL", "HINT"))
    return {"sqlstate": found.group(1), "message": found.group(2),
            "detail": detail.group(1) if detail else None, "hint": hint.group(1) if hint else None}


@contextlib.contextmanager
def held_job(conn: psycopg.Connection, out: str, done: int, timeout: float = 120.0):
    """The job writing public.<out>, held still once it has `done` sub-epochs, until the block
    ends: its next hop's record waits for a lock that `conn` (autocommit, search_path with
    the extension's schema) holds on the job's visits table.  Jobs are fast; what a test does
    to one mid-way must not come after its end.  Progress is read under the lock, so the job
    cannot end between the look and the hold."""
    visits = sql.Identifier(f"{out}_mop_visits")
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with conn.transaction():
            if conn.execute("SELECT to_regclass(%s) IS NOT NULL", (f"public.{out}_mop_visits",)).fetchone()[0]:
                conn.execute(sql.SQL("LOCK TABLE public.{} IN SHARE MODE").format(visits))
                if conn.execute("SELECT subepochs_done >= %s FROM jobs WHERE model_output_table = %s "
                                "ORDER BY job_id DESC LIMIT 1", (done, f"public.{out}")).fetchone()[0]:
                    yield
                    return
        time.sleep(0.005)
    raise AssertionError(f"job of {out} did not reach {done} sub-epochs in {timeout:g}s")


def coordinator_killed_mid_job(watcher: psycopg.Connection, out: str, done: int,
                               fit: Callable[[], None], timeout: float = 120.0) -> int:
    """Run `fit` (the fit writing public.<out>) in a thread, terminate its coordinator's
    session once the job has `done` sub-epochs, and return the job's id once nobody holds
    the job any more (resumable)."""
    failures: list[BaseException] = []

    def run() -> None:
        try:
            fit()
        except psycopg.OperationalError as error:
            failures.append(error)

    job = threading.Thread(target=run)
    job.start()
    with held_job(watcher, out, done, timeout):
        job_id, pid = watcher.execute("SELECT job_id, coordinator_pid FROM jobs WHERE "
                                      "model_output_table = %s", (f"public.{out}",)).fetchone()
        watcher.execute("SELECT pg_terminate_backend(%s)", (pid,))
    job.join()
    assert failures, "the coordinator's session should have been terminated"
    deadline = time.monotonic() + 60
    while not watcher.execute("SELECT pg_try_advisory_lock(lock_key) FROM jobs WHERE job_id = %s",
                              (job_id,)).fetchone()[0]:
        assert time.monotonic() < deadline, f"job {job_id} is still held"
        time.sleep(0.05)
    watcher.execute("SELECT pg_advisory_unlock(lock_key) FROM jobs WHERE job_id = %s", (job_id,))
    return job_id


TEST_SERVER_VARIABLE = "MADLIB_MOP_TEST_SERVER"
# The tests' own embedded servers do not flush to disk: what they hold need not outlive a
# crash of the machine, and the tests that kill servers kill processes, whose writes the
# OS keeps either way.  (The tests write GBs of states; the project's server, `.pg`, keeps
# PostgreSQL's defaults.)
TEST_SERVER_SETTINGS = {"fsync": "off", "synchronous_commit": "off", "full_page_writes": "off"}
TEST_SERVERS = ("embedded", "container")


def ip(*argv: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *argv], check=check, capture_output=True, text=True)


@contextlib.contextmanager
def veth_namespace(namespace: str, host_link: str, ns_link: str, host_ip: str, ns_ip: str):
    """A network namespace of the test's own, joined to this one by a veth pair (host_ip on
    this side, ns_ip in the namespace, a /24), removed when the block ends; skips without
    root or iproute2.  Its traffic never leaves this machine."""
    if os.geteuid() != 0 or shutil.which("ip") is None:
        pytest.skip("network namespaces need root and iproute2")
    ip("netns", "del", namespace, check=False)
    ip("link", "del", host_link, check=False)
    ip("netns", "add", namespace)
    try:
        ip("link", "add", host_link, "type", "veth", "peer", "name", ns_link)
        ip("link", "set", ns_link, "netns", namespace)
        ip("addr", "add", f"{host_ip}/24", "dev", host_link)
        ip("link", "set", host_link, "up")
        for argv in (("addr", "add", f"{ns_ip}/24", "dev", ns_link), ("link", "set", ns_link, "up"),
                     ("link", "set", "lo", "up")):
            ip("netns", "exec", namespace, "ip", *argv)
        yield
    finally:
        ip("link", "del", host_link, check=False)
        ip("netns", "del", namespace, check=False)


# The modules that take minutes, longest first: `make test`'s two processes take modules in
# collection order (--no-loadscope-reorder: pytest-xdist would otherwise start the modules of
# most tests first), so these start at once rather than leave one process alone at the end.
SLOW_MODULES = ("test_big_states.py", "test_scheduled.py", "test_worker_pool.py", "test_cluster.py",
                "test_client.py", "test_automl.py", "test_prewarm.py", "test_notebook.py")


def pytest_collection_modifyitems(items: list) -> None:
    rank = {name: k for k, name in enumerate(SLOW_MODULES)}
    items.sort(key=lambda item: rank.get(item.path.name, len(SLOW_MODULES)))  # (a stable sort)


def _server_kind() -> str:
    """dsn (MADLIB_MOP_DSN), container or embedded (MADLIB_MOP_TEST_SERVER, default embedded)."""
    if os.environ.get(DSN_VARIABLE):
        return "dsn"
    kind = os.environ.get(TEST_SERVER_VARIABLE) or "embedded"
    if kind not in TEST_SERVERS:
        raise pytest.UsageError(f"{TEST_SERVER_VARIABLE}={kind!r}: expected one of {', '.join(TEST_SERVERS)}")
    return kind


def _uses_containers() -> bool:
    return _server_kind() == "container"


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def free_port_block(count: int) -> int:
    """The first of `count` consecutive ports free on the loopback now (servers numbered
    from a first port: `tools.local_cluster`), so that two test runs on one machine (two
    clones) do not meet."""
    rng = random.Random(os.getpid())
    for _ in range(200):
        first = rng.randrange(20000, 60000 - count)
        with contextlib.ExitStack() as probes:
            try:
                for port in range(first, first + count):
                    probes.enter_context(socket.socket()).bind(("127.0.0.1", port))
            except OSError:
                continue
        return first
    raise RuntimeError(f"no {count} consecutive free ports")


def process_network(tag: str) -> tuple[str, str, str, str, str]:
    """(namespace, host link, namespace's link, host address, namespace's address) for a
    `veth_namespace` of this test process's own: named and numbered by its pid (a /24 of
    10.100-249.x), so that two test runs on one machine do not take each other's."""
    pid = os.getpid()
    subnet = f"10.{100 + (pid >> 8) % 150}.{pid % 256}"
    return (f"mop_{tag}_{pid}", f"mop{tag[:3]}{pid}a"[:15], f"mop{tag[:3]}{pid}b"[:15],
            f"{subnet}.1", f"{subnet}.2")


@pytest.fixture(scope="session")
def test_server() -> Iterator[tuple[str, EmbeddedCluster | ContainerServer | None]]:
    """The session's server: a superuser DSN (database `postgres`), and the server itself
    when it is the tests' own (embedded, or a container), for what is done to its files."""
    kind = _server_kind()
    if kind == "dsn":
        yield os.environ[DSN_VARIABLE], None
    elif kind == "container":
        # Ryuk (testcontainers' reaper) is an image from a registry: off; the container is
        # removed by the context manager, volumes included.
        os.environ.setdefault("TESTCONTAINERS_RYUK_DISABLED", "true")
        from testcontainers.core.container import DockerContainer
        from testcontainers.core.wait_strategies import HealthcheckWaitStrategy

        port, password = _free_port(), secrets.token_urlsafe(16)
        container = (DockerContainer(containers.build_images())
                     .with_kwargs(network_mode="host", shm_size="1g")
                     .with_envs(POSTGRES_PASSWORD=password, MADLIB_MOP_PGPORT=str(port))
                     .waiting_for(HealthcheckWaitStrategy().with_startup_timeout(300)))
        with container:
            server = ContainerServer(container.get_wrapped_container().name, port, password)
            yield server.dsn("postgres"), server
    else:
        worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
        cluster = EmbeddedCluster(REPO_ROOT / f".pg-{worker}", _free_port())
        cluster.initialize()
        for name, value in TEST_SERVER_SETTINGS.items():
            cluster.ensure_setting(name, value)
        cluster.start()
        try:
            yield cluster.dsn("postgres"), cluster
        finally:
            cluster.stop()


@pytest.fixture(scope="session")
def server_dsn(test_server) -> str:
    """A superuser connection string to the session's server (database `postgres`)."""
    return test_server[0]


@pytest.fixture(scope="session")
def server_host(test_server) -> EmbeddedCluster | ContainerServer:
    """The session's server, where the tests may change its files; skips on a DBA's server."""
    if test_server[1] is None:
        pytest.skip("changes the server's files: needs the embedded server or a container")
    return test_server[1]


@pytest.fixture(scope="session")
def allow_worker_role(server_host):
    """Let the server open worker sessions as a role: the DBA's pg_ident.conf line of the
    README, written into the session's server."""
    return server_host.allow_role


def _database_name(module_name: str) -> str:
    short = re.sub(r"[^a-z0-9_]", "_", module_name.rsplit(".", 1)[-1].lower())[:40]
    return f"t_{short}_{uuid.uuid4().hex[:8]}"


@pytest.fixture(scope="module")
def database_dsn(server_dsn: str, request: pytest.FixtureRequest) -> Iterator[str]:
    """A fresh, empty database for the test module, dropped afterwards."""
    name = _database_name(request.module.__name__)
    with psycopg.connect(server_dsn, autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    try:
        yield make_conninfo(server_dsn, dbname=name)
    finally:
        with psycopg.connect(server_dsn, autocommit=True) as admin:
            admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


@pytest.fixture(scope="module")
def extension_dsn(database_dsn: str) -> str:
    """The module's database with the extension installed in schema madlib_mop."""
    with psycopg.connect(database_dsn, autocommit=True) as conn:
        conn.execute("CREATE SCHEMA madlib_mop")
        conn.execute("CREATE EXTENSION madlib_mop SCHEMA madlib_mop CASCADE")
    return database_dsn


@pytest.fixture(scope="module")
def conn(extension_dsn: str) -> Iterator[psycopg.Connection]:
    """An autocommit superuser connection to the module's database, shared by the module's
    tests: its server backend imports TensorFlow once."""
    with psycopg.connect(extension_dsn, autocommit=True) as connection:
        yield connection
