"""Several servers: a coordinator and two segment servers on this machine (the servers of
`make cluster`, madlib_mop.tools.local_cluster; with MADLIB_MOP_TEST_SERVER=container, the
containers of docker/docker-compose.yml, `make compose-up`), a fresh database on each for
this module.

The MADlib walkthrough on the cluster gives the weights of the same job on one server with
the same number of segments; segment servers stopped hard, or not coming back, and the
coordinator's own server restarted, change no weight; registration and user mappings are
checked."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import threading
import time
import uuid
from pathlib import Path

import keras
import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from madlib_mop.tools import local_cluster as cluster_tool, containers
from madlib_mop.tools.containers import ContainerServer
from madlib_mop.tools.embedded import EmbeddedCluster

from tests.conftest import (_free_port, _server_kind, _uses_containers, connect as _connect, free_port_block,
                            held_job, ip, iris_mult_table, iris_table, process_network, two_in_two_out_json,
                            veth_namespace)

pytestmark = pytest.mark.skipif(_server_kind() == "dsn",
                                reason="starts PostgreSQL servers of its own on this machine")

COMPILE = ("{'loss': ['categorical_crossentropy'], 'optimizer_params_list': [{'optimizer': "
           "['Adam'], 'lr': [0.01, 0.1]}], 'metrics': ['accuracy']}")
FIT = "{'batch_size': [8], 'epochs': [1]}"  # 2 models


def _server_dsn(server, dbname):
    """A DSN with the superuser's password: the form user mappings need."""
    if isinstance(server, ContainerServer):
        return server.dsn(dbname)
    host = getattr(server, "address", "127.0.0.1")
    return make_conninfo(cluster_tool._dsn_with_password(server), host=host, dbname=dbname)


@pytest.fixture(scope="module")
def servers():
    """The servers of `make cluster`, or the compose cluster's containers; those this module
    starts, it stops afterwards."""
    if _uses_containers():
        found = containers.compose_servers()
        started = not found["coordinator"].is_running()
        try:
            containers.compose_up()
            yield found
        finally:
            if started:
                containers.compose_down()
        return
    found = cluster_tool.servers()
    if not any(server.is_running() for server in found.values()):
        # (`make cluster`'s servers, when it runs, else on ports free now: another clone's
        # test run may hold the cluster's usual ports)
        found = cluster_tool.servers(free_port_block(len(found)))
    started = [server for server in found.values() if not server.is_running()]
    for server in found.values():
        server.start()
    yield found
    for server in started:
        server.stop()


@pytest.fixture(scope="module")
def cluster(servers):
    """The coordinator's DSN for a fresh database of the same name on every server, the
    segment servers registered in it."""
    name = f"t_cluster_{uuid.uuid4().hex[:8]}"
    for server in servers.values():
        with psycopg.connect(_server_dsn(server, "postgres"), autocommit=True) as admin:
            admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    coordinator = _server_dsn(servers["coordinator"], name)
    cluster_tool.setup(coordinator, [(n, _server_dsn(s, name)) for n, s in servers.items()
                                     if n != "coordinator"])
    yield coordinator
    for server in servers.values():
        if not server.is_running():
            server.start()
        with psycopg.connect(_server_dsn(server, "postgres"), autocommit=True) as admin:
            admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


def _pack(conn, local: bool, source: str, prefix: str, labels: str, features: str) -> None:
    """`source` packed into <prefix>_packed (on the cluster: a segment per segment server;
    on one server: 2 segments) and into its validation table <prefix>_valid."""
    if local:
        conn.execute("SET madlib_mop.segments = 2")
    conn.execute("SELECT training_preprocessor_dl(%s, %s, %s, %s)",
                 (source, f"{prefix}_packed", labels, features))
    conn.execute("SELECT validation_preprocessor_dl(%s, %s, %s, %s, %s)",
                 (source, f"{prefix}_valid", labels, features, f"{prefix}_packed"))


def _walkthrough_data(dsn, local: bool):
    """MADlib's walkthrough set-up: iris, packed (all_segments), an architecture, configs."""
    with _connect(dsn) as conn:
        iris_table(conn, "iris_train")
        _pack(conn, local, "iris_train", "iris", "class_text", "attributes")
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(10, activation="relu"),
                                  keras.layers.Dense(3, activation="softmax")]).to_json()
        conn.execute("SELECT load_keras_model('arch', %s::json)", (model,))
        conn.execute("SELECT generate_model_configs('arch', 'mst', ARRAY[1], %s, %s)", (COMPILE, FIT))


def _fit(dsn, out, notices=None, settings=(), mst="mst"):
    with _connect(dsn, notices) as conn:
        for setting in settings:
            conn.execute(setting)
        conn.execute("SELECT madlib_keras_fit_multiple_model('iris_packed', %s, %s, 2, FALSE, "
                     "'iris_valid')", (out, mst))


def _weights(dsn, table):
    with _connect(dsn) as conn:
        return conn.execute(sql.SQL("SELECT mst_key, md5(model_weights) FROM {} ORDER BY 1")
                            .format(sql.Identifier(table))).fetchall()


def _partitions(conn, table: str) -> list[tuple]:
    """(partition, its kind, its foreign server) of a packed table."""
    return conn.execute("SELECT c.relname, c.relkind, s.srvname FROM pg_inherits i "
                        "JOIN pg_class c ON c.oid = i.inhrelid "
                        "JOIN pg_foreign_table f ON f.ftrelid = c.oid "
                        "JOIN pg_foreign_server s ON s.oid = f.ftserver "
                        "WHERE i.inhparent = %s::regclass ORDER BY 1", (table,)).fetchall()


def _job(dsn, out):
    with _connect(dsn) as conn:
        return conn.execute("SELECT job_id, state, subepochs_done, subepochs_total FROM jobs "
                            "WHERE model_output_table = %s ORDER BY job_id DESC LIMIT 1",
                            (f"public.{out}",)).fetchone()


@pytest.fixture(scope="module")
def walkthrough(cluster, extension_dsn):
    """The walkthrough on the cluster and on one server with 2 segments: its weights."""
    _walkthrough_data(cluster, local=False)
    _fit(cluster, "iris_model")
    _walkthrough_data(extension_dsn, local=True)
    _fit(extension_dsn, "iris_model", settings=["SET madlib_mop.segments = 2"])
    return _weights(cluster, "iris_model")


def test_walkthrough_on_the_cluster_gives_the_weights_of_one_server(cluster, extension_dsn,
                                                                   walkthrough, servers):
    assert len(walkthrough) == 2
    assert walkthrough == _weights(extension_dsn, "iris_model")
    with _connect(cluster) as conn:
        # The packed table's segments are foreign tables; their rows are on the segment servers.
        assert _partitions(conn, "iris_packed") == [("iris_packed_seg0", "f", "seg0"), ("iris_packed_seg1", "f", "seg1")]
        summary = conn.execute("SELECT num_segments, rows_per_segment FROM iris_packed_summary").fetchone()
        assert summary[0] == 2
        # Evaluate (on the segment servers) and predict (the test table is the coordinator's).
        conn.execute("SELECT madlib_keras_evaluate('iris_model', 'iris_valid', 'iris_eval', FALSE, 1)")
        conn.execute("SELECT madlib_keras_predict('iris_model', 'iris_train', 'id', 'attributes', "
                     "'iris_pred', 'response', FALSE, 1)")
        assert conn.execute("SELECT count(*) FROM iris_pred").fetchone()[0] == 150
        evaluated = conn.execute("SELECT loss, metric FROM iris_eval").fetchone()
        # The job validated on the same table with the same weights.
        validated = conn.execute("SELECT validation_loss_final, validation_metrics_final "
                                 "FROM iris_model_info WHERE mst_key = 1").fetchone()
        assert abs(evaluated[0] - validated[0]) < 1e-6 and abs(evaluated[1] - validated[1]) < 1e-6
    name = conninfo_to_dict(cluster)["dbname"]
    for segment, server in enumerate(("seg0", "seg1")):
        with psycopg.connect(_server_dsn(servers[server], name)) as there:
            rows = there.execute(
                sql.SQL("SELECT sum(attributes_shape[1]) FROM {}").format(
                    sql.Identifier(f"iris_packed_seg{segment}"))).fetchone()[0]
            assert rows == summary[1][segment]


def test_registration(cluster, servers, walkthrough):
    with _connect(cluster) as conn:
        checked = conn.execute("SELECT server_name, segments, first_segment, reachable, "
                               "extension_version, message FROM check_segment_servers()").fetchall()
        assert [row[:4] for row in checked] == [("seg0", 1, 0, True), ("seg1", 1, 1, True)]
        assert {row[5] for row in checked} == {"ok"}
        for call, sqlstate, words in [
            ("SELECT add_segment_server('seg0')", "42710", "a segment server already"),
            ("SELECT add_segment_server('nowhere')", "42704", "does not exist"),
            ("SELECT add_segment_server('seg9', '127.0.0.1', 1, 'x', 0)", "22023", "at least 1"),
            ("SELECT add_segment_server('seg0', '127.0.0.1')", "42710", "exists already"),
            ("SELECT drop_segment_server('seg0')", "2BP01", "iris_packed"),
            ("SELECT drop_segment_server('nowhere')", "42704", "not a segment server"),
        ]:
            with pytest.raises(psycopg.Error) as raised:
                conn.execute(call)
            assert raised.value.sqlstate == sqlstate, call
            assert words in raised.value.diag.message_primary
            assert raised.value.diag.message_hint
        conn.execute("DO $$ BEGIN CREATE ROLE analyst_reg LOGIN; "
                     "EXCEPTION WHEN duplicate_object THEN NULL; END $$")
        conn.execute("SET ROLE analyst_reg")
        with pytest.raises(psycopg.Error) as raised:
            conn.execute("SELECT add_segment_server('seg0x', '127.0.0.1', 1)")
        assert raised.value.sqlstate == "42501"
        conn.execute("RESET ROLE")
        # A foreign server its owner could point anywhere is no segment server.
        conn.execute("DROP SERVER IF EXISTS elsewhere")
        conn.execute("CREATE SERVER elsewhere FOREIGN DATA WRAPPER postgres_fdw "
                     "OPTIONS (host '127.0.0.1', dbname 'x')")
        conn.execute("ALTER SERVER elsewhere OWNER TO analyst_reg")
        with pytest.raises(psycopg.Error) as raised:
            conn.execute("SELECT add_segment_server('elsewhere')")
        assert raised.value.sqlstate == "42501" and "not a superuser" in raised.value.diag.message_primary
        assert raised.value.diag.message_hint
        conn.execute("DROP SERVER elsewhere")


IDLE_PIDS = ("SELECT pid FROM pg_stat_activity WHERE application_name = 'madlib_mop idle worker' "
             "AND datname = current_database()")


def _idle_pids(servers, name: str, server: str) -> set[int]:
    """The idle worker sessions of `server`'s database `name`."""
    with psycopg.connect(_server_dsn(servers[server], name), autocommit=True) as there:
        return {row[0] for row in there.execute(IDLE_PIDS)}


# The worker sessions holding slots in this database: idle ones, and those a job just
# handed back that have not named themselves idle yet.
SLOT_HOLDERS = "SELECT pid FROM madlib_mop.worker_sessions WHERE database = current_database()"
# Idle worker sessions of any database of the server: they hold slots of its one cap.
IDLE_ANYWHERE = "SELECT pid FROM pg_stat_activity WHERE application_name = 'madlib_mop idle worker'"


def _end_idle_sessions(dsn: str) -> None:
    """What a DBA does to end a database's worker sessions between jobs, and the server's idle
    ones (of any database: they count in its one cap): they are gone on return, their
    slots free."""
    with psycopg.connect(dsn, autocommit=True) as admin:
        deadline = time.monotonic() + 30
        while admin.execute(f"{SLOT_HOLDERS} UNION {IDLE_ANYWHERE}").fetchall():
            admin.execute(f"SELECT pg_terminate_backend(pid) FROM ({SLOT_HOLDERS} UNION {IDLE_ANYWHERE}) held")
            assert time.monotonic() < deadline
            time.sleep(0.1)


def _idle_after_a_job(servers, name: str) -> dict[str, set[int]]:
    """Each segment server's idle sessions, once the last job's session there is idle (a
    session handed back without a relay names itself idle a moment after the job ends)."""
    deadline = time.monotonic() + 30
    while not all((idle := {server: _idle_pids(servers, name, server) for server in ("seg0", "seg1")}).values()):
        assert time.monotonic() < deadline, idle
        time.sleep(0.1)
    return idle


@contextlib.contextmanager
def _only_slot_held(servers, name: str, server: str):
    """`server` with a cap of 1 whose slot a plain session holds (its idle worker sessions
    ended first, as a DBA would end them)."""
    dsn = _server_dsn(servers[server], name)
    with psycopg.connect(dsn, autocommit=True) as admin:
        admin.execute(sql.SQL("ALTER DATABASE {} SET madlib_mop.max_worker_sessions = 1").format(sql.Identifier(name)))
    _end_idle_sessions(dsn)
    holder = psycopg.connect(dsn, autocommit=True)
    try:
        assert holder.execute("SELECT madlib_mop._mop_take_slot(1)").fetchone()[0] is not None
        yield holder
    finally:
        holder.close()
        with psycopg.connect(dsn, autocommit=True) as admin:
            admin.execute(sql.SQL("ALTER DATABASE {} RESET madlib_mop.max_worker_sessions").format(
                sql.Identifier(name)))


def test_the_next_job_takes_up_the_segment_servers_idle_sessions(cluster, servers, walkthrough):
    """A job's sessions on the segment servers stay there, idle, for the role's next call;
    the next job takes them up through a relaying session on each server (engine.relay):
    its sub-epochs ran in those sessions, none traced a program, the weights are the
    walkthrough's, and the sessions are idle again afterwards."""
    name = conninfo_to_dict(cluster)["dbname"]
    _fit(cluster, "warm_first")
    idle = _idle_after_a_job(servers, name)
    _fit(cluster, "warm_second")
    assert _weights(cluster, "warm_second") == walkthrough
    with _connect(cluster) as conn:
        visits = conn.execute("SELECT (result->>'pid')::int, (result->>'traced')::int "
                              "FROM warm_second_mop_visits").fetchall()
    assert visits and {traced for _, traced in visits} == {0}, visits
    assert {pid for pid, _ in visits} <= idle["seg0"] | idle["seg1"], (visits, idle)
    assert all(idle[server] & _idle_pids(servers, name, server) for server in idle)


def test_a_segment_servers_prewarmed_session_runs_the_next_job(cluster, servers, walkthrough):
    """A segment server's DBA keeps a session ready for a role there (its own
    madlib_mop.prewarm_roles, and madlib_mop.segments = the segments it holds, so that the
    session runs the threads of their workers): the role's next job takes it up."""
    name = conninfo_to_dict(cluster)["dbname"]
    seg0 = _server_dsn(servers["seg0"], name)
    role = conninfo_to_dict(seg0)["user"]
    _end_idle_sessions(seg0)
    with psycopg.connect(seg0, autocommit=True) as admin:
        admin.execute(sql.SQL("ALTER DATABASE {} SET madlib_mop.segments = 1").format(sql.Identifier(name)))
        admin.execute("ALTER SYSTEM SET madlib_mop.prewarm_roles = %s" % sql.Literal(f"{role}@{name}").as_string(admin))
        admin.execute("ALTER SYSTEM SET madlib_mop.prewarm_sessions = 1")
        admin.execute("SELECT pg_reload_conf()")
    try:
        deadline = time.monotonic() + 120
        while not (prewarmed := _idle_pids(servers, name, "seg0")):
            assert time.monotonic() < deadline
            time.sleep(0.5)
        _fit(cluster, "prewarmed_model")
        assert _weights(cluster, "prewarmed_model") == walkthrough
        with _connect(cluster) as conn:
            pids = {pid for pid, in conn.execute("SELECT DISTINCT (result->>'pid')::int FROM prewarmed_model_mop_visits "
                                                  "WHERE (result->>'segment')::int = 0")}
        assert pids == prewarmed, (pids, prewarmed)
    finally:
        with psycopg.connect(seg0, autocommit=True) as admin:
            admin.execute("ALTER SYSTEM RESET madlib_mop.prewarm_roles")
            admin.execute("ALTER SYSTEM RESET madlib_mop.prewarm_sessions")
            admin.execute("SELECT pg_reload_conf()")
            admin.execute(sql.SQL("ALTER DATABASE {} RESET madlib_mop.segments").format(sql.Identifier(name)))


def test_another_roles_idle_session_gives_its_slot_to_a_job(cluster, servers, walkthrough):
    """A segment server whose one slot another role's idle session holds: the job's
    session there queues on that server, the idle session ends at once (not after its 300
    s), and the job runs to the walkthrough's weights."""
    name = conninfo_to_dict(cluster)["dbname"]
    seg0 = _server_dsn(servers["seg0"], name)
    with psycopg.connect(seg0, autocommit=True) as admin:
        admin.execute("DO $$ BEGIN CREATE ROLE other_analyst LOGIN PASSWORD 'other-pw'; "
                      "EXCEPTION WHEN duplicate_object THEN NULL; END $$")
        admin.execute(sql.SQL("ALTER DATABASE {} SET madlib_mop.max_worker_sessions = 1").format(sql.Identifier(name)))
    _end_idle_sessions(seg0)
    try:
        other = psycopg.connect(make_conninfo(seg0, user="other_analyst", password="other-pw"), autocommit=True)
        assert other.execute("SELECT madlib_mop._mop_take_slot(1)").fetchone()[0] is not None
        other.execute("SET client_connection_check_interval = 0")
        other.pgconn.send_query(b"CALL madlib_mop._mop_idle(300)")  # as a job's worker is kept
        other.close()
        deadline = time.monotonic() + 30
        while not _idle_pids(servers, name, "seg0"):
            assert time.monotonic() < deadline
            time.sleep(0.1)
        started = time.monotonic()
        _fit(cluster, "reclaimed_model")
        assert time.monotonic() - started < 120
        assert _weights(cluster, "reclaimed_model") == walkthrough
        with psycopg.connect(seg0, autocommit=True) as admin:
            assert admin.execute("SELECT count(*) FROM pg_stat_activity WHERE usename = 'other_analyst'"
                                 ).fetchone()[0] == 0
    finally:
        with psycopg.connect(seg0, autocommit=True) as admin:
            admin.execute(sql.SQL("ALTER DATABASE {} RESET madlib_mop.max_worker_sessions").format(
                sql.Identifier(name)))


def test_a_segment_server_full_to_its_cap_queues_the_job(cluster, servers, walkthrough):
    """A segment server's cap (its own madlib_mop.max_worker_sessions) counts the job's
    sessions there: with its one slot held, the job waits, queued, naming the server, and
    runs once the slot frees, to the walkthrough's weights (with no worker session to be
    had, the helper process checked its models and built their states)."""
    name = conninfo_to_dict(cluster)["dbname"]
    with _only_slot_held(servers, name, "seg0") as holder:
        notices: list[str] = []
        fit = threading.Thread(target=_fit, args=(cluster, "queued_model", notices), daemon=True)
        fit.start()
        deadline = time.monotonic() + 120
        while (_job(cluster, "queued_model") or (None, None))[1] != "queued":
            assert time.monotonic() < deadline and fit.is_alive(), notices
            time.sleep(0.5)
        time.sleep(2)  # still queued: the held slot is the only one
        assert _job(cluster, "queued_model")[1] == "queued"
        holder.close()
        fit.join(timeout=300)
        assert not fit.is_alive()
        assert _job(cluster, "queued_model")[1] == "finished"
        assert _weights(cluster, "queued_model") == walkthrough
        assert any("queued" in n and "seg0" in n for n in notices), notices


def test_distribution_rules_naming_segment_servers(cluster, walkthrough):
    """MADlib's distribution_rules table: with segment servers, the servers its server_name
    (or hostname) column names get the segments, the others none."""
    with _connect(cluster) as conn:
        conn.execute("CREATE TABLE use_seg1 AS SELECT 'seg1'::text AS server_name")
        conn.execute("SELECT training_preprocessor_dl('iris_train', 'iris_seg1', 'class_text', "
                     "'attributes', NULL, 1.0, NULL, 'use_seg1')")
        placed = conn.execute(
            "SELECT DISTINCT s.srvname FROM pg_inherits i "
            "JOIN pg_foreign_table f ON f.ftrelid = i.inhrelid "
            "JOIN pg_foreign_server s ON s.oid = f.ftserver "
            "WHERE i.inhparent = 'iris_seg1'::regclass").fetchall()
        assert placed == [("seg1",)]
        assert conn.execute("SELECT num_segments, num_rows FROM iris_seg1_summary").fetchone() == (1, 150)
        conn.execute("SELECT madlib_keras_fit_multiple_model('iris_seg1', 'seg1_model', 'mst', 1)")
        assert conn.execute("SELECT count(*) FROM seg1_model").fetchone()[0] == 2
        conn.execute("CREATE TABLE use_dbids AS SELECT 2 AS dbid")
        with pytest.raises(psycopg.Error) as raised:
            conn.execute("SELECT training_preprocessor_dl('iris_train', 'iris_dbids', 'class_text', "
                         "'attributes', NULL, 1.0, NULL, 'use_dbids')")
        assert raised.value.sqlstate == "22023" and "server_name" in raised.value.diag.message_hint


def test_segment_tables_left_by_a_dropped_packed_table_are_replaced(cluster, servers, walkthrough):
    """A packed table dropped here leaves its segments' tables there: packing into the same
    name replaces them; a table of that name the packing did not make is left alone."""
    notices = []
    with _connect(cluster, notices) as conn:
        pack = "SELECT training_preprocessor_dl('iris_train', %s, 'class_text', 'attributes')"
        conn.execute(pack, ("again_packed",))
        conn.execute("DROP TABLE again_packed, again_packed_summary")
        conn.execute(pack, ("again_packed",))
        assert sum("replacing public.again_packed_seg" in n for n in notices) == 2, notices
        with psycopg.connect(_server_dsn(servers["seg1"], conn.info.dbname), autocommit=True) as there:
            there.execute("CREATE TABLE IF NOT EXISTS users_own_seg1 (id int)")
        with pytest.raises(psycopg.Error) as raised:
            conn.execute("SELECT training_preprocessor_dl('iris_train', 'users_own', "
                         "'class_text', 'attributes')")
        assert raised.value.sqlstate == "42P07"
        assert "already exists on segment server seg1" in raised.value.diag.message_primary
        assert conn.execute("SELECT to_regclass('users_own') IS NULL").fetchone()[0]
    name = conninfo_to_dict(cluster)["dbname"]
    with psycopg.connect(_server_dsn(servers["seg0"], name)) as there:
        # seg0's table, made before seg1 refused, went with the failure.
        assert there.execute("SELECT to_regclass('users_own_seg0') IS NULL").fetchone()[0]


def test_a_mapping_naming_another_role_is_refused(cluster, servers, walkthrough):
    """Workers run as the calling role on every server: a user mapping cannot change that;
    a role with its own mapping trains as itself there."""
    name = conninfo_to_dict(cluster)["dbname"]
    for server in ("seg0", "seg1"):
        with psycopg.connect(_server_dsn(servers[server], name), autocommit=True) as there:
            there.execute("DO $$ BEGIN CREATE ROLE analyst_c LOGIN PASSWORD 'analyst-pw'; "
                          "EXCEPTION WHEN duplicate_object THEN NULL; END $$")
            there.execute("GRANT USAGE, CREATE ON SCHEMA public TO analyst_c")
    with _connect(cluster) as conn:
        conn.execute("DO $$ BEGIN CREATE ROLE analyst_c LOGIN; "
                     "EXCEPTION WHEN duplicate_object THEN NULL; END $$")
        conn.execute("GRANT USAGE, CREATE ON SCHEMA public TO analyst_c")
        conn.execute("GRANT SELECT ON iris_train, arch, mst, mst_summary TO analyst_c")
        conn.execute("GRANT USAGE ON FOREIGN SERVER seg0, seg1 TO analyst_c")
        # The coordinator's own bookkeeping session as the role (the DBA's pg_ident.conf line).
        servers["coordinator"].allow_role("analyst_c")
        seg_password = servers["seg0"].password
        conn.execute(sql.SQL("CREATE USER MAPPING FOR analyst_c SERVER seg0 OPTIONS "
                             "(user 'postgres', password {})").format(sql.Literal(seg_password)))
        conn.execute("CREATE USER MAPPING FOR analyst_c SERVER seg1 OPTIONS "
                     "(user 'analyst_c', password 'analyst-pw')")
        pack = ("SELECT training_preprocessor_dl('iris_train', 'analyst_packed', 'class_text', "
                "'attributes')")
        for mapping, sqlstate, words in [
                (None, "42501", "names role postgres"),
                ("DROP user", "28000", "names no user"),
                ("ADD user 'analyst_c', DROP password", "28000", "has no password")]:
            if mapping:
                conn.execute(f"ALTER USER MAPPING FOR analyst_c SERVER seg0 OPTIONS ({mapping})")
            conn.execute("SET ROLE analyst_c")
            with pytest.raises(psycopg.Error) as raised:
                conn.execute(pack)
            conn.execute("RESET ROLE")
            assert raised.value.sqlstate == sqlstate
            assert words in raised.value.diag.message_primary
        conn.execute("ALTER USER MAPPING FOR analyst_c SERVER seg0 OPTIONS "
                     "(ADD password 'analyst-pw')")
        conn.execute("SET ROLE analyst_c")
        conn.execute(pack)
        conn.execute("SELECT madlib_keras_fit_multiple_model('analyst_packed', 'analyst_model', "
                     "'mst', 1, FALSE)")
        assert conn.execute("SELECT count(*) FROM analyst_model").fetchone()[0] == 2
        conn.execute("RESET ROLE")
    with psycopg.connect(_server_dsn(servers["seg1"], name)) as there:
        owner = there.execute("SELECT tableowner FROM pg_tables "
                              "WHERE tablename = 'analyst_packed_seg1'").fetchone()
        assert owner == ("analyst_c",)


def _run_in_thread(dsn, out, notices, errors, settings=(), mst="mst"):
    def run():
        try:
            _fit(dsn, out, notices, settings, mst)
        except psycopg.Error as error:
            errors.append(error)
    thread = threading.Thread(target=run)
    thread.start()
    return thread


def test_a_segment_server_stopped_hard_then_the_coordinators_server(cluster, servers, walkthrough):
    """One job: seg0 stopped hard mid-job and started again (the job waits, then goes on),
    then the coordinator's own server stopped hard (the job dies) and started again: resume
    ends with the weights of an uninterrupted run, every sub-epoch recorded once."""
    notices, errors = [], []
    job = _run_in_thread(cluster, "killed_servers", notices, errors)
    with _connect(cluster) as watcher:
        with held_job(watcher, "killed_servers", 2):
            servers["seg0"].crash()  # pg_ctl stop -m immediate, or docker kill
            time.sleep(3)
            servers["seg0"].start()
        # The job cannot end without seg0: its next call there finds the session lost.
        deadline = time.monotonic() + 120
        while not any("segment server seg0" in n and "did not answer" in n and "retrying in" in n
                      for n in notices):
            assert time.monotonic() < deadline, notices
            time.sleep(0.05)
        coordinator = servers["coordinator"]
        with pytest.raises(psycopg.OperationalError):  # the watcher's session dies with it
            with held_job(watcher, "killed_servers", 2):  # seg0's new session is starting
                coordinator.crash()
    job.join(timeout=120)
    assert not job.is_alive() and errors  # its session died with the server
    coordinator.start()
    job_id, state, done, total = _job(cluster, "killed_servers")
    assert state == "running" and 2 <= done < total  # as the dead coordinator left it
    with _connect(cluster) as conn:
        conn.execute("CALL resume(%s)", (job_id,))
    assert _job(cluster, "killed_servers")[1] == "finished"
    assert _weights(cluster, "killed_servers") == walkthrough
    _every_subepoch_once(cluster, "killed_servers")


def test_a_segment_server_that_does_not_come_back_stops_the_job_resumably(cluster, servers,
                                                                          walkthrough):
    notices, errors = [], []
    job = _run_in_thread(cluster, "lost_segment", notices, errors,
                         settings=["SET madlib_mop.segment_wait_seconds = 4"])
    with _connect(cluster) as watcher, held_job(watcher, "lost_segment", 1):
        servers["seg0"].crash()  # most of seg0's sub-epochs are still to come
    job.join(timeout=120)
    assert not job.is_alive() and len(errors) == 1
    error = errors[0]
    assert error.sqlstate == "08006"
    assert "segment server seg0 (127.0.0.1:" in error.diag.message_primary
    assert "has not answered for 4s" in error.diag.message_primary
    assert "resume" in error.diag.message_hint
    job_id, state, done, total = _job(cluster, "lost_segment")
    assert state in ("failed", "interrupted") and 0 < done < total
    servers["seg0"].start()
    with _connect(cluster) as conn:
        conn.execute("CALL resume(%s)", (job_id,))
    assert _job(cluster, "lost_segment")[1] == "finished"
    assert _weights(cluster, "lost_segment") == walkthrough
    _every_subepoch_once(cluster, "lost_segment")


def _every_subepoch_once(dsn, out):
    """Nothing lost or duplicated: each model's visits are steps 0..total-1, once each, and
    its published state is there."""
    with _connect(dsn) as conn:
        tables = conn.execute("SELECT tables, subepochs_total, num_models FROM jobs "
                              "WHERE model_output_table = %s", (f"public.{out}",)).fetchone()
        visits = sql.Identifier(*tables[0]["visits"])
        rows = conn.execute(sql.SQL("SELECT mst_key, count(*), count(DISTINCT step), min(step), "
                                    "max(step) FROM {} GROUP BY 1 ORDER BY 1").format(visits)).fetchall()
        per_model = tables[1] // tables[2]
        assert rows == [(k, per_model, per_model, 0, per_model - 1)
                        for k in range(1, tables[2] + 1)]
        assert conn.execute(sql.SQL("SELECT count(*) FROM {} WHERE model_weights IS NOT NULL")
                            .format(sql.Identifier(out))).fetchone()[0] == tables[2]


# ---- a network cut: a segment server in its own network namespace -------------------------

NAMESPACE, HOST_LINK, NS_LINK, HOST_IP, NS_IP = process_network("cut")


class NamespacedServer(EmbeddedCluster):
    """An embedded server whose commands (pg_ctl, and so the postmaster) run in the network
    namespace: it listens on the namespace's veth address only.  Its Unix socket is a file,
    so the tools reach it as any other."""

    address = NS_IP

    def _as_server_user(self, argv):
        return ["ip", "netns", "exec", NAMESPACE, *super()._as_server_user(argv)]


@pytest.fixture(scope="module")
def namespaced_segment():
    if _uses_containers():
        pytest.skip("the network cut is to a server of this machine's own, in a namespace")
    with veth_namespace(NAMESPACE, HOST_LINK, NS_LINK, HOST_IP, NS_IP):
        server = NamespacedServer(cluster_tool.BASE / "segns", _free_port())
        try:
            server.initialize()
            with open(server.data / "postgresql.auto.conf", "a", encoding="utf-8") as conf:
                conf.write(f"listen_addresses = '{NS_IP}'\n")
            hba = server.data / "pg_hba.conf"
            line = f"host all all {HOST_IP}/32 scram-sha-256\n"
            if line not in hba.read_text(encoding="utf-8"):
                hba.write_text(hba.read_text(encoding="utf-8") + line, encoding="utf-8")
            server.start()
            yield server
        finally:
            try:
                server.stop()
            except Exception:
                pass


def test_a_network_cut_to_a_segment_server(servers, namespaced_segment, walkthrough):
    """The link to a segment server taken down mid-job, then up: the job waits for it and
    ends with the weights of an uninterrupted run."""
    name = f"t_netcut_{uuid.uuid4().hex[:8]}"
    ns_dsn = _server_dsn(namespaced_segment, name)
    for server in (servers["coordinator"], servers["seg1"], namespaced_segment):
        with psycopg.connect(_server_dsn(server, "postgres"), autocommit=True) as admin:
            admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    coordinator = _server_dsn(servers["coordinator"], name)
    try:
        cluster_tool.setup(coordinator, [("segns", ns_dsn), ("seg1", _server_dsn(servers["seg1"], name))])
        _walkthrough_data(coordinator, local=False)
        notices, errors = [], []
        # Find the cut within seconds (the defaults take about 30 s).
        job = _run_in_thread(coordinator, "cut_model", notices, errors, settings=[
            "SET madlib_mop.worker_conninfo = 'connect_timeout=2 keepalives_idle=1 "
            "keepalives_interval=1 keepalives_count=2 tcp_user_timeout=2000'"])
        with _connect(coordinator) as watcher, held_job(watcher, "cut_model", 1):
            ip("link", "set", HOST_LINK, "down")  # most of segns' sub-epochs are to come
        time.sleep(5)
        ip("link", "set", HOST_LINK, "up")
        job.join(timeout=300)
        assert not job.is_alive() and not errors, errors
        assert any("segment server segns" in n and "did not answer" in n for n in notices), notices
        assert _weights(coordinator, "cut_model") == walkthrough
        _every_subepoch_once(coordinator, "cut_model")
    finally:
        ip("link", "set", HOST_LINK, "up", check=False)
        for server in (servers["coordinator"], servers["seg1"], namespaced_segment):
            with psycopg.connect(_server_dsn(server, "postgres"), autocommit=True) as admin:
                admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


def test_a_table_on_the_segment_servers_is_packed_and_predicted_where_it_lies(cluster, servers,
                                                                              walkthrough):
    """Source rows already on the segment servers (a partitioned table of foreign tables):
    each server packs its own rows, and predict runs there too."""
    notices = []
    with _connect(cluster, notices) as conn:
        conn.execute("CREATE TABLE iris_lying (id int, attributes float8[], class_text text) "
                     "PARTITION BY LIST ((id % 2))")
        for part, server in ((0, "seg0"), (1, "seg1")):
            conn.execute(sql.SQL("CREATE FOREIGN TABLE {} PARTITION OF iris_lying FOR VALUES IN "
                                 "({}) SERVER {} OPTIONS (table_name {})").format(
                sql.Identifier(f"iris_lying_{part}"), sql.Literal(part), sql.Identifier(server),
                sql.Literal(f"iris_lying_{part}")))
        for server in ("seg0", "seg1"):  # the tables there (a DBA's or loader's job)
            with psycopg.connect(_server_dsn(servers[server], conn.info.dbname),
                                 autocommit=True) as there:
                part = server[-1]
                there.execute(f"CREATE TABLE IF NOT EXISTS iris_lying_{part} "
                              "(id int, attributes float8[], class_text text)")
        conn.execute("INSERT INTO iris_lying SELECT * FROM iris_train")
        conn.execute("SELECT training_preprocessor_dl('iris_lying', 'lying_packed', 'class_text', "
                     "'attributes')")
        conn.execute("SELECT validation_preprocessor_dl('iris_lying', 'lying_valid', 'class_text', "
                     "'attributes', 'lying_packed')")
        assert sum("each server packing its own rows" in n for n in notices) == 2, notices
        summary = conn.execute("SELECT num_rows, rows_per_segment, class_text_class_values "
                               "FROM lying_packed_summary").fetchone()
        assert summary == (150, [75, 75], ["setosa", "versicolor", "virginica"])
        assert conn.execute("SELECT rows_per_segment FROM lying_valid_summary").fetchone()[0] == [75, 75]
        # Predict where the rows lie: the same predictions as from the coordinator's table.
        for table, out in (("iris_lying", "lying_pred"), ("iris_train", "here_pred")):
            conn.execute("SELECT madlib_keras_predict('iris_model', %s, 'id', 'attributes', %s, "
                         "'prob', FALSE, 1)", (table, out))
        there = conn.execute("SELECT id, class_value, prob FROM lying_pred ORDER BY 1, 2").fetchall()
        here = conn.execute("SELECT id, class_value, prob FROM here_pred ORDER BY 1, 2").fetchall()
        assert len(there) == 450 and [r[:2] for r in there] == [r[:2] for r in here]
        assert all(abs(a[2] - b[2]) < 1e-6 for a, b in zip(there, here))
        # Predict's session on a segment server takes a slot of that server's cap: with
        # seg0's only slot held, it waits there, and gives up after the queue's timeout.
        with _only_slot_held(servers, conn.info.dbname, "seg0"):
            conn.execute("SET madlib_mop.queue_timeout_seconds = 2")
            with pytest.raises(psycopg.Error) as raised:
                conn.execute("SELECT madlib_keras_predict('iris_model', 'iris_lying', 'id', "
                             "'attributes', 'lying_pred_capped', 'prob', FALSE, 1)")
            conn.execute("RESET madlib_mop.queue_timeout_seconds")
        assert raised.value.sqlstate == "53000" and "seg0" in raised.value.diag.message_primary
        assert raised.value.diag.message_hint
        assert any("queued for a worker session of segment server seg0" in n for n in notices), notices


def test_a_table_packed_in_key_order_on_the_segment_servers_grows_by_appending(cluster, walkthrough):
    """Packed in key order onto the segment servers, then its new rows appended there: the
    buffers (training and validation) and the summary of one packing of the grown table,
    and a model trained on it gets the weights of one trained on that packing."""
    with _connect(cluster) as conn:
        # Rows arrive in an order that mixes the classes: `arrived` is the key.
        conn.execute("CREATE TABLE iris_growing AS SELECT row_number() OVER (ORDER BY md5(id::text)) "
                     "AS arrived, attributes, class_text FROM iris_train")
        conn.execute("CREATE VIEW iris_so_far AS SELECT * FROM iris_growing "
                     "WHERE arrived <= current_setting('test.rows')::int")
        conn.execute("SET test.rows = 100")
        calls = {"packed": "SELECT training_preprocessor_dl('iris_so_far', %s, 'class_text', 'attributes', "
                           "buffer_size => 15, key_column => 'arrived')",
                 "valid": "SELECT validation_preprocessor_dl('iris_so_far', %s, 'class_text', 'attributes', "
                          "%s, buffer_size => 15, key_column => 'arrived')"}
        for out in ("grown", "grown_whole"):
            if out == "grown_whole":
                conn.execute("SET test.rows = 150")
            conn.execute(calls["packed"], (f"{out}_packed",))
            conn.execute(calls["valid"], (f"{out}_valid", f"{out}_packed"))
        assert [kind for _, kind, _ in _partitions(conn, "grown_packed")] == ["f", "f"]
        for kind in ("packed", "valid"):
            appended = conn.execute("SELECT preprocessor_dl_append(%s, 'iris_so_far')",
                                    (f"grown_{kind}",)).fetchone()[0]
            assert appended == 50
            buffers = [conn.execute(sql.SQL("SELECT __dist_key__, buffer_id, attributes, class_text, "
                                            "attributes_shape FROM {} ORDER BY 1, 2").format(
                sql.Identifier(table))).fetchall() for table in (f"grown_{kind}", f"grown_whole_{kind}")]
            assert buffers[0] == buffers[1] and len({row[0] for row in buffers[0]}) == 2, kind
            summaries = [conn.execute(sql.SQL("SELECT num_rows, rows_per_segment, buffers_per_segment, "
                                              "packed_by_key FROM {}").format(
                sql.Identifier(f"{table}_summary"))).fetchone() for table in (f"grown_{kind}", f"grown_whole_{kind}")]
            assert summaries[0] == summaries[1] and summaries[0][0] == 150, kind
        for out in ("grown", "grown_whole"):
            conn.execute("SELECT madlib_keras_fit_multiple_model(%s, %s, 'mst', 1, FALSE, %s)",
                         (f"{out}_packed", f"{out}_model", f"{out}_valid"))
    assert _weights(cluster, "grown_model") == _weights(cluster, "grown_whole_model")


def test_a_model_of_two_inputs_and_outputs_gives_the_weights_of_one_server(cluster, extension_dsn,
                                                                          walkthrough):
    """MADlib's multi-io set-up packed onto the segment servers: fit (validating there) and
    evaluate give the weights and the metrics of the same job on one server with 2 segments."""
    results = []
    for dsn, local in ((cluster, False), (extension_dsn, True)):
        with _connect(dsn) as conn:
            iris_mult_table(conn, "iris_train")
            _pack(conn, local, "iris_mult", "mult", "class_text, class_text2", "attributes, attributes2")
            conn.execute("SELECT load_keras_model('arch', %s::json)", (two_in_two_out_json(),))
            model_id = conn.execute("SELECT max(model_id) FROM arch").fetchone()[0]
            conn.execute("SELECT madlib_keras_fit('mult_packed', 'mult_model', 'arch', %s, "
                         "$$loss='categorical_crossentropy', optimizer='Adam(lr=0.01)', "
                         "metrics=['accuracy']$$, 'batch_size=10', 2, NULL, 'mult_valid')", (model_id,))
            conn.execute("SELECT madlib_keras_evaluate('mult_model', 'mult_valid', 'mult_eval')")
            results.append(conn.execute(
                "SELECT md5(model_weights), s.validation_metrics_final, e.metric, e.metrics "
                "FROM mult_model, mult_model_summary s, mult_eval e").fetchone())
    on_cluster, on_one = results
    assert on_cluster[0] == on_one[0]
    # The last validation pass is an evaluation of the same weights, on either side.
    assert on_cluster[1] == pytest.approx(on_one[1], abs=1e-6)
    assert on_cluster[2] == pytest.approx(on_cluster[1], abs=1e-6)
    assert set(on_cluster[3]) == set(on_one[3]) and "dense_5_accuracy" in on_cluster[3]


# ---- states that travel between segment servers (segment.kept_states) ---------------------

def _visits(dsn, out):
    with _connect(dsn) as conn:
        return conn.execute(sql.SQL("SELECT mst_key, step, segment, result FROM {} ORDER BY 1, 2")
                            .format(sql.Identifier(f"{out}_mop_visits"))).fetchall()


def _hops(visits):
    """(visit, the visit before it of the same model) for every visit after a model's first."""
    before = {(m, step): result for m, step, _, result in visits}
    return [((m, step, segment, result), before[(m, step - 1)]) for m, step, segment, result in visits if step]


def test_states_travel_from_segment_server_to_segment_server(cluster, servers, walkthrough):
    """Each visit leaves its model's state on its own segment server, and the next visit's
    worker fetches it from there directly: past each model's first visit (its step-0 state
    is the coordinator's), no state byte passes through the coordinator, what does is the
    call and its record (under 10 kB), and once the job ends no server keeps its states."""
    visits = _visits(cluster, "iris_model")
    assert {result["kept_on"] for _, _, segment, result in visits} == {"seg0", "seg1"}
    assert all(result["kept_on"] == f"seg{segment}" for _, _, segment, result in visits)
    for _, step, _, result in visits:
        if step == 0:
            assert result["coordinator_bytes"] > 1000 and result["fetched_bytes"] == 0
    moved = 0
    for (m, step, _, result), before in _hops(visits):
        assert result["coordinator_bytes"] == 0, (m, step)
        assert len(json.dumps(result)) < 10_000
        if before["kept_on"] != result["kept_on"]:
            assert result["fetched_bytes"] == before["state_bytes"] > 1000, (m, step)
            moved += 1
        else:
            assert result["fetched_bytes"] == 0
    assert moved >= 2
    name = conninfo_to_dict(cluster)["dbname"]
    with _connect(cluster) as conn:
        job_id = _job(cluster, "iris_model")[0]
        store = conn.execute("SELECT id::text FROM madlib_mop.coordinator_id").fetchone()[0] + f"-{job_id}"
    keys = [m for m, *_ in visits]
    steps = [step + 1 for _, step, *_ in visits]
    for server in ("seg0", "seg1"):
        with psycopg.connect(_server_dsn(servers[server], name), autocommit=True) as there:
            held = there.execute("SELECT madlib_mop._mop_segment_states_held(%s, %s, %s)",
                                 (store, keys, steps)).fetchone()[0]
            assert not any(held), server


def test_a_segment_server_that_cannot_reach_another_is_carried_its_states(cluster, servers, walkthrough):
    """seg1 has no foreign server for seg0 (its DBA set none up), then one whose address
    refuses: the coordinator carries seg0's states to seg1's workers, seg0's workers still
    fetch seg1's directly, and the weights are the walkthrough's."""
    name = conninfo_to_dict(cluster)["dbname"]
    seg1 = _server_dsn(servers["seg1"], name)
    try:
        for out, change in [("carried_none", "DROP SERVER seg0 CASCADE"),
                            ("carried_refused", "ALTER SERVER seg0 OPTIONS (SET port '1')")]:
            cluster_tool._peers(seg1, [("seg0", _server_dsn(servers["seg0"], name))])
            with psycopg.connect(seg1, autocommit=True) as admin:
                admin.execute(change)
            _fit(cluster, out)
            assert _weights(cluster, out) == walkthrough, out
            carried = fetched = 0
            for (*_, result), before in _hops(_visits(cluster, out)):
                if before["kept_on"] == result["kept_on"]:
                    continue
                if result["kept_on"] == "seg1":
                    # (read from seg0, sent to seg1)
                    assert result["coordinator_bytes"] == 2 * before["state_bytes"] and not result["fetched_bytes"]
                    carried += 1
                else:
                    assert result["fetched_bytes"] == before["state_bytes"] and not result["coordinator_bytes"]
                    fetched += 1
            assert carried and fetched, out
    finally:
        cluster_tool._peers(seg1, [("seg0", _server_dsn(servers["seg0"], name))])


FUSED = ["SET madlib_mop.fuse_models = on"]
# 4 models of one fusion class (Adam at 4 learning rates): 2 to a segment server's path, fused.
FUSED_COMPILE = COMPILE.replace("[0.01, 0.1]", "[0.01, 0.03, 0.1, 0.3]")


@pytest.fixture(scope="module")
def fused_configs(cluster, extension_dsn, walkthrough):
    for dsn in (cluster, extension_dsn):
        with _connect(dsn) as conn:
            conn.execute("DROP TABLE IF EXISTS mst_fused, mst_fused_summary")
            conn.execute("SELECT generate_model_configs('arch', 'mst_fused', ARRAY[1], %s, %s)",
                         (FUSED_COMPILE, FIT))
    return "mst_fused"


def _fused_evals(dsn, out):
    """(mst_key, step, partition) -> (validation metrics, the models evaluated with it)."""
    with _connect(dsn) as conn:
        return {(key, step, partition): (r["metrics"], r.get("fused_with"))
                for key, step, partition, r in conn.execute(sql.SQL(
                    "SELECT mst_key, step, partition, result FROM {}").format(
                    sql.Identifier(f"{out}_mop_evals")))}


def _hops_moved(visits) -> tuple[int, int]:
    """(hops whose state a worker fetched from the other segment server, hops whose state the
    coordinator carried), checking each hop's bytes."""
    fetched = carried = 0
    for (m, step, _, result), before in _hops(visits):
        if before["kept_on"] == result["kept_on"]:
            assert result["fetched_bytes"] == 0 and result["coordinator_bytes"] == 0, (m, step)
        elif result["fetched_bytes"]:
            assert result["fetched_bytes"] == before["state_bytes"] > 1000 and not result["coordinator_bytes"]
            fetched += 1
        else:  # (read from the server that kept it, sent to this one)
            assert result["coordinator_bytes"] == 2 * before["state_bytes"] > 2000, (m, step)
            carried += 1
    return fetched, carried


def _fused_on_one_server(extension_dsn, fused_configs) -> dict:
    """The weights of the fused job on one server with 2 segments (the job run once, by
    whichever test needs it first)."""
    with _connect(extension_dsn) as conn:
        made = conn.execute("SELECT to_regclass('iris_fused')").fetchone()[0] is not None
    if not made:
        _fit(extension_dsn, "iris_fused", settings=FUSED + ["SET madlib_mop.segments = 2"], mst=fused_configs)
    return _weights(extension_dsn, "iris_fused")


def test_a_fused_job_on_the_segment_servers_gives_the_weights_of_one_server(cluster, extension_dsn,
                                                                          fused_configs):
    """madlib_mop.fuse_models = on: 4 models of one class (Adam at 4 learning rates) train 2
    by 2 as one program on each segment server, each model's state fetched from the server
    its last visit left it on, as a model alone; they validate as one program too.  The
    weights and validation results are those of the same job fused on one server with 2
    segments, bit for bit."""
    _fit(cluster, "iris_fused", settings=FUSED, mst=fused_configs)
    assert _weights(cluster, "iris_fused") == _fused_on_one_server(extension_dsn, fused_configs)
    visits = _visits(cluster, "iris_fused")
    assert len(visits) == 4 * 2 * 2 and all(len(result["fused_with"]) == 2 for *_, result in visits)
    assert {tuple(r["fused_with"]) for *_, r in visits} == {tuple(r["fused_with"])
                                                            for *_, r in _visits(extension_dsn, "iris_fused")}
    assert all(result["kept_on"] == f"seg{segment}" for _, _, segment, result in visits)
    fetched, carried = _hops_moved(visits)
    assert fetched >= 2 and carried == 0
    evals = _fused_evals(cluster, "iris_fused")
    assert evals and all(len(with_) == 2 for _, with_ in evals.values())
    assert evals == _fused_evals(extension_dsn, "iris_fused")


def test_a_fused_group_on_a_server_that_cannot_reach_the_other_is_carried_their_states(cluster, servers,
                                                                                       extension_dsn, fused_configs):
    """seg1's foreign server for seg0 points at a port that refuses: the fused call there
    fails to fetch (08001), the coordinator carries the group's states from then on, and the
    weights are those of the fused job on one server."""
    name = conninfo_to_dict(cluster)["dbname"]
    seg1 = _server_dsn(servers["seg1"], name)
    expected = _fused_on_one_server(extension_dsn, fused_configs)
    try:
        with psycopg.connect(seg1, autocommit=True) as admin:
            admin.execute("ALTER SERVER seg0 OPTIONS (SET port '1')")
        _fit(cluster, "iris_fused_carried", settings=FUSED, mst=fused_configs)
        assert _weights(cluster, "iris_fused_carried") == expected
        fetched, carried = _hops_moved(_visits(cluster, "iris_fused_carried"))
        assert fetched and carried
    finally:
        cluster_tool._peers(seg1, [("seg0", _server_dsn(servers["seg0"], name))])


def test_a_segment_server_whose_extension_predates_fused_training_trains_the_models_alone(
        cluster, servers, fused_configs):
    """Where a segment server's extension has no fused training, a job asked to fuse says
    so in a NOTICE naming the server, and its models train alone: the weights of the job
    with fuse_models off."""
    name = conninfo_to_dict(cluster)["dbname"]
    seg1 = _server_dsn(servers["seg1"], name)
    renamed = "madlib_mop._mop_segment_train_fused(bigint, integer[], integer[], integer, text[], integer[])"
    with psycopg.connect(seg1, autocommit=True) as admin:
        admin.execute(f"ALTER FUNCTION {renamed} RENAME TO _mop_segment_train_fused_hidden")
    notices: list[str] = []
    try:
        _fit(cluster, "iris_unfusable", notices, settings=FUSED, mst=fused_configs)
    finally:
        with psycopg.connect(seg1, autocommit=True) as admin:
            admin.execute(f"ALTER FUNCTION {renamed.replace('_fused(', '_fused_hidden(')} "
                          "RENAME TO _mop_segment_train_fused")
    assert any("train unfused" in n and "seg1" in n for n in notices), notices
    _fit(cluster, "iris_fused_off", settings=["SET madlib_mop.fuse_models = off"], mst=fused_configs)
    assert _weights(cluster, "iris_unfusable") == _weights(cluster, "iris_fused_off")
    assert not any(result.get("fused_with") for *_, result in _visits(cluster, "iris_unfusable"))


def test_segment_servers_restarted_mid_job_lose_the_states_they_kept(cluster, servers, walkthrough):
    """Both segment servers restarted between two hops: the states they kept are gone (their
    files are of the earlier run), so the job goes back to the models' durable states in
    the same call, a NOTICE says so, and it ends with the walkthrough's weights, every
    sub-epoch once."""
    notices, errors = [], []
    job = _run_in_thread(cluster, "restarted_segment", notices, errors)
    with _connect(cluster) as watcher, held_job(watcher, "restarted_segment", 3):
        for name in ("seg0", "seg1"):  # (every model has visits to come: 3 of 8 are done)
            servers[name].stop()
            servers[name].start()
    job.join(timeout=300)
    assert not job.is_alive() and not errors, errors
    assert any("no state of model" in n and "going on from the models' last durable states" in n
               for n in notices), notices
    assert _weights(cluster, "restarted_segment") == walkthrough
    _every_subepoch_once(cluster, "restarted_segment")


def test_a_fused_job_whose_segment_servers_restarted_goes_back_to_durable_states(cluster, servers, extension_dsn,
                                                                                 fused_configs):
    """The same with fused groups, whose calls fetch their states from the other server in
    one request: it finds them gone and names the model, the job goes back to the models'
    durable states and ends with the fused job's weights, every sub-epoch once."""
    expected = _fused_on_one_server(extension_dsn, fused_configs)
    notices, errors = [], []
    job = _run_in_thread(cluster, "restarted_fused", notices, errors, FUSED, fused_configs)
    with _connect(cluster) as watcher, held_job(watcher, "restarted_fused", 6):
        for name in ("seg0", "seg1"):  # (6 of 16 are done: every model has visits to come)
            servers[name].stop()
            servers[name].start()
    job.join(timeout=300)
    assert not job.is_alive() and not errors, errors
    assert any(re.search(r"no state of model \d+ after step \d+ on (segment server seg[01]|this segment server)", n)
               and "going on from the models' last durable states" in n for n in notices), notices
    assert _weights(cluster, "restarted_fused") == expected
    _every_subepoch_once(cluster, "restarted_fused")


def _sending_a_state(servers, name: str, job: threading.Thread) -> tuple[str, int]:
    """(segment server, backend pid) of a backend sending a model's state to another segment
    server's worker, caught sending and paused (SIGSTOP) there: the fetch is mid-way."""
    sessions = {server: psycopg.connect(_server_dsn(servers[server], name), autocommit=True)
                for server in ("seg0", "seg1")}
    sending = ("SELECT pid FROM pg_stat_activity WHERE application_name = 'madlib_mop state fetch' "
               "AND datname = current_database() AND state = 'active' "
               "AND strpos(query, '_mop_segment_state\"(') > 0")
    try:
        while job.is_alive():
            for server, there in sessions.items():
                for (pid,) in there.execute(sending).fetchall():
                    os.kill(pid, signal.SIGSTOP)
                    # (still sending once paused: it may have ended between the look and the pause)
                    if there.execute(sending + " AND pid = %s", (pid,)).fetchone():
                        return server, pid
                    os.kill(pid, signal.SIGCONT)
            time.sleep(0.002)
    finally:
        for there in sessions.values():
            there.close()
    raise AssertionError("the job ended before a state was caught on its way between the segment servers")


def test_a_segment_server_restarted_mid_fetch(cluster, servers, walkthrough):
    """A model of a 32 MB state (8 pieces) hops between the segment servers; the server it
    left is restarted while the other fetches its state (the sending backend caught mid-way
    and paused, the fetcher's partial file written).  The fetch fails, its partial file is
    removed, the job goes back to the model's durable state in the same call and ends with
    the weights of an uninterrupted run, every sub-epoch once."""
    from madlib_mop.job import state_store
    from tests.test_big_states import _architecture

    if _uses_containers():
        pytest.skip("pauses a backend process of a server of this machine")
    name = conninfo_to_dict(cluster)["dbname"]
    fit = ("SELECT madlib_keras_fit('iris_packed', %s, 'fetched_arch', 1, $$loss='categorical_crossentropy', "
           "optimizer='SGD(learning_rate=0.1)', metrics=['accuracy']$$, 'batch_size=50, epochs=1', 2)")
    with _connect(cluster) as conn:
        conn.execute("SELECT load_keras_model('fetched_arch', %s::json)", (_architecture(2_000_000),))
        conn.execute(fit, ("fetched_whole",))
    notices, errors = [], []

    def run():
        try:
            with _connect(cluster, notices) as conn:
                conn.execute(fit, ("fetched_cut",))
        except psycopg.Error as error:
            errors.append(error)
    job = threading.Thread(target=run)
    job.start()
    paused = None
    try:
        source, paused = _sending_a_state(servers, name, job)
        fetcher = "seg1" if source == "seg0" else "seg0"
        hop_files = servers[fetcher].data / state_store.DIRECTORY
        assert list(hop_files.rglob("*.partial")), "the fetcher has written no piece"
        servers[source].crash()  # (its paused backend: killed by its postmaster within 5 s)
        servers[source].start()
        job.join(timeout=300)
    finally:
        if paused is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(paused, signal.SIGCONT)
        for server in ("seg0", "seg1"):
            _end_idle_sessions(_server_dsn(servers[server], name))  # (they hold the model's MBs)
    assert not job.is_alive() and not errors, errors
    assert any("no state of model 1 after step" in n and "going on from the models' last durable states" in n
               for n in notices), notices
    assert not list(hop_files.rglob("*.partial"))  # (the job's end removes its files as well)
    assert _weights(cluster, "fetched_cut") == _weights(cluster, "fetched_whole")
    _every_subepoch_once(cluster, "fetched_cut")


def test_staged_models_on_segment_servers_keep_their_features_there(cluster, servers, walkthrough):
    """Heads on frozen layers of one base (tests/test_staging.py's models), trained on the
    cluster with their frozen layers staged and without: the same weights; the features were
    computed on the segment servers, into their own staged_features (none on the
    coordinator), and the states hopped between servers as any other."""
    from tests.test_staging import MST_COMPILE, _same, _transfer_models

    name = conninfo_to_dict(cluster)["dbname"]
    with _connect(cluster) as conn:
        for arch, weights in _transfer_models():
            conn.execute("SELECT load_keras_model('transfer_arch', %s::json, %s)", (arch, weights))
        conn.execute("SELECT generate_model_configs('transfer_arch', 'transfer_mst', ARRAY[1, 2, 3, 4], "
                     "%s, %s)", (MST_COMPILE, "{'batch_size': [16]}"))
    for out, staged in (("staged_there", "on"), ("whole_there", "off")):
        with _connect(cluster) as conn:
            conn.execute(f"SET madlib_mop.stage_frozen_layers = {staged}")
            conn.execute("SELECT madlib_keras_fit_multiple_model('iris_packed', %s, 'transfer_mst', 2, "
                         "validation_table => 'iris_valid')", (out,))
    with _connect(cluster) as conn:
        weights = {out: dict(conn.execute(sql.SQL("SELECT mst_key, model_weights FROM {}").format(
            sql.Identifier(out))).fetchall()) for out in ("staged_there", "whole_there")}
        assert conn.execute("SELECT count(*) FROM madlib_mop.staged_features").fetchone()[0] == 0
    assert len(weights["staged_there"]) == 8 and _same(weights["staged_there"], weights["whole_there"])
    visits = _visits(cluster, "staged_there")
    assert sum(1 for *_, result in visits if result["staged"]) == 6 * 4  # 6 staged models, 4 visits each
    assert all(result["kept_on"] == f"seg{segment}" for _, _, segment, result in visits)
    for server in ("seg0", "seg1"):
        with psycopg.connect(_server_dsn(servers[server], name), autocommit=True) as there:
            assert there.execute("SELECT count(*) FROM madlib_mop.staged_features").fetchone()[0] > 0, server
    # A staged model's state moved from server to server without its frozen layers (each
    # server fetched those once): smaller than the same model's whole state; the others' alike.
    moved = {out: {} for out in ("staged_there", "whole_there")}
    for out in moved:
        for (m, *_, result), before in _hops(_visits(cluster, out)):
            if before["kept_on"] != result["kept_on"]:
                moved[out].setdefault(m, []).append(result["fetched_bytes"])
    staged_keys = {m for m, _, _, result in visits if result["staged"]}
    assert len(staged_keys) == 6 and moved["staged_there"].keys() == moved["whole_there"].keys()
    for m, sizes in moved["staged_there"].items():
        if m in staged_keys:
            assert min(sizes) < min(moved["whole_there"][m]) - 4 * 16 * 4, m
        else:
            assert sizes == moved["whole_there"][m], m


def test_a_segment_server_whose_workers_cannot_hold_the_models_refuses_the_job(cluster, servers,
                                                                             walkthrough):
    """seg1's worker sessions of this database have a cap so high that each one's share of
    its memory cannot hold TensorFlow: the job is refused before any state is made, naming
    seg1, and leaves nothing (no job, no table)."""
    name = conninfo_to_dict(cluster)["dbname"]
    seg1 = _server_dsn(servers["seg1"], name)
    _end_idle_sessions(seg1)  # (an idle session keeps the settings it started with)
    with psycopg.connect(seg1, autocommit=True) as admin:
        admin.execute(sql.SQL("ALTER DATABASE {} SET madlib_mop.max_worker_sessions = 10000")
                      .format(sql.Identifier(name)))
    try:
        with _connect(cluster) as conn, pytest.raises(psycopg.Error) as refused:
            conn.execute("SELECT madlib_keras_fit_multiple_model('iris_packed', 'too_big_there', 'mst', 1)")
        assert refused.value.sqlstate == "53000"
        assert "segment server seg1's 10000 worker sessions" in refused.value.diag.message_primary
        with _connect(cluster) as conn:
            assert conn.execute("SELECT count(*) FROM jobs WHERE model_output_table = "
                                "'public.too_big_there'").fetchone()[0] == 0
            assert conn.execute("SELECT to_regclass('too_big_there_info')").fetchone()[0] is None
    finally:
        with psycopg.connect(seg1, autocommit=True) as admin:
            admin.execute(sql.SQL("ALTER DATABASE {} RESET madlib_mop.max_worker_sessions")
                          .format(sql.Identifier(name)))
        _end_idle_sessions(seg1)


def test_a_state_over_1_gb_moves_between_segment_servers(cluster, servers, walkthrough):
    """tests/test_big_states.py's model (a state of 1.1 GB) on the cluster's iris: its step-0
    state is built on a segment server and read from there, and carried to the first visit's
    server, a piece per call; the second visit's server fetches it from the first's; the
    durable state and the weights are in pieces; nothing stays on the servers.  (A value or
    message over 1 GB anywhere would fail.)"""
    from tests.test_big_states import MORE_THAN_ONE_VALUE, ROWS, _architecture

    name = conninfo_to_dict(cluster)["dbname"]
    try:
        with _connect(cluster) as conn:
            conn.execute("SELECT load_keras_model('big_arch', %s::json)", (_architecture(),))
            conn.execute("SELECT madlib_keras_fit('iris_packed', 'big_there', 'big_arch', 1, "
                         "$$loss='categorical_crossentropy', optimizer='SGD(learning_rate=0.1)', "
                         "metrics=['accuracy']$$, 'batch_size=50, epochs=1', 1)")
            initial, state_bytes = conn.execute(
                "SELECT sum(octet_length(state)) FILTER (WHERE step = 0), "
                "sum(octet_length(state)) FILTER (WHERE step = 2) FROM big_there_mop_state").fetchone()
            assert state_bytes > MORE_THAN_ONE_VALUE
            assert conn.execute("SELECT model_weights IS NULL FROM big_there").fetchone()[0]
            assert conn.execute("SELECT sum(octet_length(model_weights)) FROM big_there_mop_weights"
                                ).fetchone()[0] == 4 * (ROWS * 4 + 4 * 4 * 3 + 3)
            job_id = _job(cluster, "big_there")[0]
            store = conn.execute("SELECT id::text FROM madlib_mop.coordinator_id").fetchone()[0] + f"-{job_id}"
        (_, _, first_segment, first), (_, _, second_segment, second) = _visits(cluster, "big_there")
        assert first_segment != second_segment and first["kept_on"] != second["kept_on"]
        assert first["coordinator_bytes"] == initial > MORE_THAN_ONE_VALUE  # carried there
        assert second["fetched_bytes"] == first["state_bytes"] and second["coordinator_bytes"] == 0
        for server in ("seg0", "seg1"):
            with psycopg.connect(_server_dsn(servers[server], name), autocommit=True) as there:
                assert not any(there.execute("SELECT madlib_mop._mop_segment_states_held(%s, %s, %s)",
                                             (store, [1, 1], [1, 2])).fetchone()[0]), server
    finally:
        for server in ("seg0", "seg1"):  # (their idle sessions hold the model's GBs)
            _end_idle_sessions(_server_dsn(servers[server], name))


def test_features_of_a_table_on_segment_servers_are_materialized_there(cluster, extension_dsn, servers,
                                                                        walkthrough):
    """materialize_features of the walkthrough's model over its packed table on the segment
    servers: each server computes its own segments' features into its own partition of the
    output (foreign partitions here, no row on the coordinator), with the bits one server
    computes from the same model and segments; a head trained on them there gets the
    weights of the same head trained on one server."""
    name = conninfo_to_dict(cluster)["dbname"]
    head = keras.Sequential([keras.Input((10,)), keras.layers.Dense(3, activation="softmax")]).to_json()
    notices, features, heads = [], {}, {}
    for dsn in (cluster, extension_dsn):
        with _connect(dsn, notices) as conn:
            if dsn == extension_dsn:
                conn.execute("SET madlib_mop.segments = 2")  # (as the walkthrough's fit there)
            conn.execute("SELECT materialize_features('iris_model', 'iris_packed', 'iris_hidden', '0', 1)")
            features[dsn] = conn.execute("SELECT __dist_key__, buffer_id, md5(attributes), attributes_shape "
                                         "FROM iris_hidden ORDER BY 1, 2").fetchall()
            conn.execute("SELECT load_keras_model('head_arch', %s::json)", (head,))
            conn.execute("SELECT madlib_keras_fit('iris_hidden', 'head_out', 'head_arch', 1, "
                         "$$loss='categorical_crossentropy', optimizer='Adam(learning_rate=0.01)', "
                         "metrics=['accuracy']$$, 'batch_size=8, epochs=1', 2)")
            heads[dsn] = bytes(conn.execute("SELECT model_weights FROM head_out").fetchone()[0])
    assert features[cluster] == features[extension_dsn] and len(features[cluster]) >= 2
    assert all(shape[1:] == [10] for *_, shape in features[cluster])
    assert heads[cluster] == heads[extension_dsn]
    assert any("computing on segment server seg0" in n and "seg1" in n for n in notices), notices
    with _connect(cluster) as conn:
        assert _partitions(conn, "iris_hidden") == [("iris_hidden_seg0", "f", "seg0"), ("iris_hidden_seg1", "f", "seg1")]
        assert conn.execute("SELECT features_of FROM iris_hidden_summary").fetchone()[0].startswith(
            "public.iris_model mst_key 1")
    for segment, server in enumerate(("seg0", "seg1")):
        with psycopg.connect(_server_dsn(servers[server], name)) as there:
            assert there.execute(sql.SQL("SELECT count(*) FROM {}").format(
                sql.Identifier(f"iris_hidden_seg{segment}"))).fetchone()[0] > 0, server
    assert all(result["kept_on"] in ("seg0", "seg1") for *_, result in _visits(cluster, "head_out"))



@contextlib.contextmanager
def _not_answering(server):
    """The server stopped (its processes, or its container, paused), as behind a link that
    delays everything, until the block ends: its sessions stay open, nothing answers."""
    if isinstance(server, ContainerServer):
        containers._docker("pause", server.container)
        try:
            yield
        finally:
            containers._docker("unpause", server.container)
        return
    postmaster = int((server.data / "postmaster.pid").read_text().split()[0])
    processes = [postmaster] + [int(stat.parent.name) for stat in Path("/proc").glob("[0-9]*/stat")
                                if _parent(stat) == postmaster]
    for pid in processes:
        os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        for pid in processes:
            os.kill(pid, signal.SIGCONT)


def _parent(stat: Path) -> int | None:
    try:  # (pid (comm) state ppid ...: comm may hold spaces)
        return int(stat.read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


def test_a_segment_server_that_answers_nothing_for_seconds_delays_the_job(cluster, servers, walkthrough):
    """seg1 stops answering for 3 s mid-job (its processes paused: the states it keeps, the
    calls to it and the fetches from it wait): the job waits without an error and ends with
    the walkthrough's weights, every sub-epoch once."""
    notices, errors = [], []
    job = _run_in_thread(cluster, "slow_segment", notices, errors)
    with _connect(cluster) as watcher, contextlib.ExitStack() as paused:
        with held_job(watcher, "slow_segment", 3):
            paused.enter_context(_not_answering(servers["seg1"]))
        time.sleep(3)  # (the job goes on from its hold, then waits for seg1)
        assert job.is_alive()  # (visits on seg1 are to come in both iterations)
    job.join(timeout=300)
    assert not job.is_alive() and not errors, errors
    assert _weights(cluster, "slow_segment") == walkthrough
    _every_subepoch_once(cluster, "slow_segment")
    with _connect(cluster) as conn:  # (it waited out the pause)
        assert conn.execute("SELECT extract(epoch FROM finished_at - started_at) FROM jobs "
                            "WHERE model_output_table = 'public.slow_segment'").fetchone()[0] >= 3
