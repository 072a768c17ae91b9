"""Who worker sessions are, and what a caller cannot change about it: settings that would
change the role, database, server or search_path of the workers; a hostile search_path;
reading and writing only where the role may; jobs private to their role; the user name map
that cannot be borrowed through dblink."""

from __future__ import annotations

import json
import threading
import time
import uuid

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

import keras

PASSWORD = "analyst-password-" + uuid.uuid4().hex[:8]
MLP = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, activation="relu"),
                        keras.layers.Dense(3, activation="softmax")]).to_json()
COMPILE = "loss='categorical_crossentropy', optimizer='Adam(lr=0.01)', metrics=['accuracy']"


@pytest.fixture(scope="module")
def roles(extension_dsn, allow_worker_role):
    """Two analysts (LOGIN, password, scram over TCP), allowed as worker roles, each with its
    own table of points; `secret` is the superuser's."""
    suffix = uuid.uuid4().hex[:6]
    names = {"alice": f"alice_{suffix}", "bob": f"bob_{suffix}"}
    with psycopg.connect(extension_dsn, autocommit=True) as admin:
        for role in names.values():
            allow_worker_role(role)
            admin.execute(sql.SQL("CREATE ROLE {} LOGIN PASSWORD {}").format(
                sql.Identifier(role), sql.Literal(PASSWORD)))
            admin.execute(sql.SQL("GRANT USAGE ON SCHEMA madlib_mop TO {0}; "
                                  "GRANT CREATE ON SCHEMA public TO {0}; "
                                  "GRANT CREATE ON DATABASE {1} TO {0}").format(
                sql.Identifier(role), sql.Identifier(conninfo_to_dict(extension_dsn)["dbname"])))
        admin.execute("CREATE TABLE public.secret AS SELECT i AS id, "
                      "ARRAY[i % 7, i % 5, i % 3, i % 11]::real[] AS x, (i % 3)::text AS y "
                      "FROM generate_series(1, 60) i")
        admin.execute("CREATE SCHEMA locked")
        admin.execute("CREATE EXTENSION IF NOT EXISTS dblink")
    for role in names.values():
        with _as(extension_dsn, role) as conn:
            table = sql.Identifier(f"points_{role}")
            conn.execute(sql.SQL("CREATE TABLE public.{} AS SELECT i AS id, "
                                 "ARRAY[i % 7, i % 5, i % 3, i % 11]::real[] AS x, "
                                 "(i % 3)::text AS y FROM generate_series(1, 90) i").format(table))
    yield names
    with psycopg.connect(extension_dsn, autocommit=True) as admin:
        for role in names.values():
            admin.execute("DELETE FROM madlib_mop.jobs WHERE owner = %s", (role,))
            admin.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(role)))
            admin.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))


def _as(dsn: str, role: str) -> psycopg.Connection:
    """A login as `role` over TCP with its password (scram-sha-256), as an analyst connects."""
    params = conninfo_to_dict(dsn)
    params.pop("passfile", None)
    params.update(user=role, password=PASSWORD)
    return psycopg.connect(make_conninfo(**params), autocommit=True)


def _prepare(conn, role: str, suffix: str) -> dict:
    """The role's packed table, architecture and configurations: names by what they are."""
    names = {k: f"{k}_{suffix}" for k in ("packed", "arch", "mst", "out")}
    conn.execute("SELECT madlib_mop.training_preprocessor_dl(%s, %s, 'y', 'x', 16, "
                 "distribution_rules => '2')", (f"points_{role}", names["packed"]))
    # The catalog call keeps no session idle (the tests count the sessions a job keeps).
    conn.execute("SET madlib_mop.worker_idle_seconds = 0")
    conn.execute("SELECT madlib_mop.load_keras_model(%s, %s::json)", (names["arch"], MLP))
    conn.execute("RESET madlib_mop.worker_idle_seconds")
    conn.execute("SELECT madlib_mop.load_model_selection_table(%s, %s, ARRAY[1], ARRAY[%s], "
                 "ARRAY['batch_size=16,epochs=1'])", (names["arch"], names["mst"], COMPILE))
    return names


def _fit_sql(names: dict) -> tuple[str, tuple]:
    return ("SELECT madlib_mop.madlib_keras_fit_multiple_model(%s, %s, %s, 1)",
            (names["packed"], names["out"], names["mst"]))


def _watch_sessions(admin_dsn: str, database: str, stop: threading.Event, seen: set) -> None:
    with psycopg.connect(admin_dsn, autocommit=True) as admin:
        while not stop.is_set():
            seen.update(admin.execute(
                "SELECT usename, application_name, pid FROM pg_stat_activity "
                "WHERE datname = %s AND application_name LIKE 'madlib_mop%%'", (database,)).fetchall())
            time.sleep(0.05)


def _exists(conn, table: str) -> bool:
    return conn.execute("SELECT to_regclass(%s) IS NOT NULL", (table,)).fetchone()[0]


def test_workers_are_the_calling_role(extension_dsn, roles):
    alice = roles["alice"]
    database = conninfo_to_dict(extension_dsn)["dbname"]
    seen: set = set()
    stop = threading.Event()
    watcher = threading.Thread(target=_watch_sessions, args=(extension_dsn, database, stop, seen))
    with _as(extension_dsn, alice) as conn:
        names = _prepare(conn, alice, "who")
        conn.execute("SET madlib_mop.worker_conninfo = 'connect_timeout=10'")  # allowed
        watcher.start()
        try:
            conn.execute(*_fit_sql(names))
        finally:
            stop.set()
            watcher.join()
        assert conn.execute(sql.SQL("SELECT count(*) FROM {}").format(
            sql.Identifier(names["out"]))).fetchone()[0] == 1
    workers = {pid for user, app, pid in seen if app.startswith("madlib_mop worker")}
    assert len(workers) == 2, seen  # one session per segment, for the whole job
    assert {user for user, _, _ in seen} == {alice}


# Speaks to an idle worker session's socket as the extension's own code does (a superuser's
# function in an untrusted language, granted to the analysts for this test only).
PROBE = """
CREATE FUNCTION public.idle_worker_probe(pid integer) RETURNS text LANGUAGE plpython3u AS $$
from madlib_mop.engine import idle_workers
adopted = idle_workers._adopt_one(pid, None, {}, "idle worker probe")
if adopted is None:
    return "refused"
adopted.release(60)
return "adopted"
$$"""


def test_an_idle_worker_serves_only_its_role(extension_dsn, roles):
    """Idle worker sessions are kept for their role: another role's backend that reaches
    one's socket is refused (the session checks who its peer is), and that role's own
    backend is served; another role's job never gets them."""
    alice, bob = roles["alice"], roles["bob"]
    with _as(extension_dsn, alice) as conn:
        names = _prepare(conn, alice, "idle_a")
        conn.execute(*_fit_sql(names))
    with psycopg.connect(extension_dsn, autocommit=True) as admin:
        idle = [pid for pid, in admin.execute(
            "SELECT pid FROM pg_stat_activity WHERE usename = %s AND application_name = "
            "'madlib_mop idle worker'", (alice,))]
        assert len(idle) == 2
        admin.execute(PROBE)
        admin.execute(sql.SQL("GRANT EXECUTE ON FUNCTION public.idle_worker_probe(integer) TO {}, {}")
                      .format(sql.Identifier(alice), sql.Identifier(bob)))
        try:
            answers = {}
            for role in (bob, alice):
                with _as(extension_dsn, role) as conn:
                    conn.execute("SELECT madlib_mop.version()")  # the runtime on the path
                    answers[role] = conn.execute("SELECT public.idle_worker_probe(%s)",
                                                 (idle[0],)).fetchone()[0]
        finally:
            admin.execute("DROP FUNCTION public.idle_worker_probe(integer)")
        assert answers == {bob: "refused", alice: "adopted"}
        with _as(extension_dsn, bob) as conn:
            theirs = _prepare(conn, bob, "idle_b")
            conn.execute(*_fit_sql(theirs))
            used = {pid for pid, in conn.execute(sql.SQL(
                "SELECT DISTINCT (result->>'pid')::int FROM {}").format(
                sql.Identifier(theirs["out"] + "_mop_visits")))}
        assert used and not used & set(idle)


def test_a_session_cannot_make_itself_an_idle_worker(extension_dsn, roles):
    """_mop_idle serves only worker sessions of the pool: a session of its own (no slot)
    would serve its role's calls outside the cap, or as the role SET ROLE chose."""
    with _as(extension_dsn, roles["alice"]) as conn:
        with pytest.raises(psycopg.errors.InsufficientPrivilege) as caught:
            conn.execute("CALL madlib_mop._mop_idle(1)")
        assert "worker session of the server's pool" in caught.value.diag.message_primary


@pytest.mark.parametrize("setting", [
    "user=postgres", "dbname=postgres", "options='-c role=postgres'",
    "options='-c search_path=evil,pg_catalog'", "host=127.0.0.1", "hostaddr=127.0.0.1",
    "port=5432", "service=other", "password=secret", "passfile=/tmp/pgpass",
    "host=127.0.0.1 port=5432 user=postgres dbname=template1",
])
def test_worker_conninfo_cannot_change_who_or_where(extension_dsn, roles, setting):
    alice = roles["alice"]
    with _as(extension_dsn, alice) as conn:
        names = _prepare(conn, alice, "c" + uuid.uuid4().hex[:6])
        conn.execute("SELECT set_config('madlib_mop.worker_conninfo', %s, false)", (setting,))
        with pytest.raises(psycopg.errors.InsufficientPrivilege) as caught:
            conn.execute(*_fit_sql(names))
        assert "madlib_mop.worker_conninfo cannot set" in caught.value.diag.message_primary
        assert "RESET madlib_mop.worker_conninfo" in caught.value.diag.message_hint
        assert not _exists(conn, names["out"])
        assert conn.execute("SELECT count(*) FROM madlib_mop.jobs WHERE model_output_table "
                            "LIKE %s", (f"%{names['out']}%",)).fetchone()[0] == 0


def test_a_superuser_cannot_be_given_another_search_path_either(conn, roles):
    """The escalation path: a superuser's own workers with a search_path from a setting."""
    names = _prepare(conn, roles["alice"], "su")
    conn.execute("SELECT set_config('madlib_mop.worker_conninfo', %s, false)",
                 ("options='-c search_path=public'",))
    try:
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute(*_fit_sql(names))
    finally:
        conn.execute("RESET madlib_mop.worker_conninfo")
    assert not _exists(conn, names["out"])


def test_unknown_worker_conninfo_parameters_are_refused(extension_dsn, roles):
    with _as(extension_dsn, roles["alice"]) as conn:
        names = _prepare(conn, roles["alice"], "u")
        for setting, error in (("sslmode=disable", psycopg.errors.InvalidParameterValue),
                               ("not a conninfo", psycopg.errors.InvalidParameterValue)):
            conn.execute("SELECT set_config('madlib_mop.worker_conninfo', %s, false)", (setting,))
            with pytest.raises(error) as caught:
                conn.execute(*_fit_sql(names))
            assert caught.value.diag.message_hint
        assert not _exists(conn, names["out"])


def test_the_map_cannot_be_borrowed_through_dblink(extension_dsn, roles):
    """The server's OS user may open sessions as the analysts; a role's own dblink session
    is opened by that same OS user, but PostgreSQL refuses it without a password."""
    params = conninfo_to_dict(extension_dsn)
    with _as(extension_dsn, roles["alice"]) as conn:
        socket = conn.execute("SELECT madlib_mop._server_socket_directory()").fetchone()[0]
        for target in (roles["bob"], roles["alice"], "postgres"):
            target_info = make_conninfo(host=socket, port=params["port"], dbname=params["dbname"],
                                        user=target)
            with pytest.raises(psycopg.Error) as caught:
                conn.execute("SELECT public.dblink_connect_u('x', %s)", (target_info,))
            assert caught.value.diag.sqlstate == "42501"  # dblink_connect_u: superusers only
            with pytest.raises(psycopg.Error) as caught:
                conn.execute("SELECT public.dblink_connect('x', %s)", (target_info,))
            assert caught.value.diag.sqlstate == "2F003", caught.value  # password is required


LOOK_ALIKES = [
    # (signature, body returning the real value): a schema of the caller's, ahead of
    # pg_catalog on its search_path, with functions and operators of the same names.
    ("to_regclass(text) RETURNS regclass", "pg_catalog.to_regclass($1)"),
    ("current_setting(text) RETURNS text", "pg_catalog.current_setting($1)"),
    ("current_setting(text, boolean) RETURNS text", "pg_catalog.current_setting($1, $2)"),
    ("set_config(text, text, boolean) RETURNS text", "pg_catalog.set_config($1, $2, $3)"),
    ("format_type(oid, integer) RETURNS text", "pg_catalog.format_type($1, $2)"),
    ("quote_ident(text) RETURNS text", "pg_catalog.quote_ident($1)"),
    ("parse_ident(text, boolean DEFAULT true) RETURNS text[]", "pg_catalog.parse_ident($1, $2)"),
    ("current_database() RETURNS name", "pg_catalog.current_database()"),
    ("pg_relation_size(regclass) RETURNS bigint", "pg_catalog.pg_relation_size($1)"),
    ("decode(text, text) RETURNS bytea", "pg_catalog.decode($1, $2)"),
    ("length(bytea) RETURNS integer", "pg_catalog.length($1)"),
    ("int4eq_hit(integer, integer) RETURNS boolean", "pg_catalog.int4eq($1, $2)"),
    ("texteq_hit(text, text) RETURNS boolean", "pg_catalog.texteq($1, $2)"),
    ("textcat_hit(text, text) RETURNS text", "pg_catalog.textcat($1, $2)"),
]


def test_a_hostile_search_path_changes_nothing_the_extension_runs(extension_dsn, roles):
    bob = roles["bob"]
    with _as(extension_dsn, bob) as conn:
        conn.execute("CREATE SCHEMA evil")
        conn.execute("CREATE SEQUENCE evil.hits")  # not rolled back: counts every call
        for signature, body in LOOK_ALIKES:
            conn.execute(f"CREATE FUNCTION evil.{signature} LANGUAGE sql AS $$ "
                         f"SELECT pg_catalog.nextval('evil.hits'); SELECT {body} $$")
        conn.execute("CREATE OPERATOR evil.= (LEFTARG = integer, RIGHTARG = integer, "
                     "FUNCTION = evil.int4eq_hit)")
        conn.execute("CREATE OPERATOR evil.= (LEFTARG = text, RIGHTARG = text, "
                     "FUNCTION = evil.texteq_hit)")
        conn.execute("CREATE OPERATOR evil.|| (LEFTARG = text, RIGHTARG = text, "
                     "FUNCTION = evil.textcat_hit)")
        assert conn.execute("SELECT pg_catalog.current_setting('search_path')").fetchone()[0]
        hostile = "evil, pg_catalog, public"
        # Also the default of the role's new sessions, i.e. of its worker sessions.
        conn.execute(f"ALTER ROLE CURRENT_USER SET search_path = {hostile}")
        try:
            conn.execute(f"SET search_path = {hostile}")
            conn.execute("SELECT 1 = 1")  # the look-alikes are live for the caller ...
            before = conn.execute("SELECT pg_catalog.nextval('evil.hits')").fetchone()[0]
            names = _prepare(conn, bob, "hostile")  # ... and these resolve 'points_bob' on it
            conn.execute("SELECT madlib_mop.validation_preprocessor_dl(%s, 'valid_hostile', 'y', "
                         "'x', %s)", (f"points_{bob}", names["packed"]))
            conn.execute("SELECT madlib_mop.madlib_keras_fit_multiple_model(%s, %s, %s, 1, "
                         "FALSE, 'valid_hostile')", (names["packed"], names["out"], names["mst"]))
            conn.execute("SELECT madlib_mop.madlib_keras_evaluate(%s, 'valid_hostile', "
                         "'eval_hostile', mst_key => 1)", (names["out"],))
            conn.execute("SELECT madlib_mop.madlib_keras_predict(%s, %s, 'id', 'x', "
                         "'pred_hostile', 'response', mst_key => 1)", (names["out"], f"points_{bob}"))
            after = conn.execute("SELECT pg_catalog.nextval('evil.hits')").fetchone()[0]
            assert after == before + 1, f"{after - before - 1} calls of look-alike functions"
            # The caller's search_path is the caller's again.
            assert conn.execute("SHOW search_path").fetchone()[0] == hostile
            # Outputs go where the caller's CREATE TABLE would put them: its current schema.
            assert conn.execute("SELECT pg_catalog.count(*) FROM evil.pred_hostile"
                                ).fetchone()[0] == 90
        finally:
            conn.execute("ALTER ROLE CURRENT_USER RESET search_path")


def test_every_function_pins_its_search_path(conn):
    rows = conn.execute("""
        SELECT p.proname, l.lanname, p.prosecdef, p.proconfig, p.prosrc
        FROM pg_proc p JOIN pg_language l ON l.oid = p.prolang AND p.prokind <> 'a'
        JOIN pg_depend d ON d.classid = 'pg_proc'::regclass AND d.objid = p.oid AND d.deptype = 'e'
        JOIN pg_extension e ON e.oid = d.refobjid AND e.extname = 'madlib_mop'""").fetchall()
    assert len(rows) > 30
    for name, language, definer, config, source in rows:
        pinned = any(c.startswith("search_path=") for c in config or [])
        if language == "plpython3u":  # pinned by plpy_bridge.run, which every body calls
            # (or, for the converters, which run no SQL, pinned in their declaration)
            assert "run(plpy, " in source or ("run_pure(plpy, " in source and pinned), name
        elif language != "c":
            assert pinned, name
        if definer:
            assert pinned and name == "_server_socket_directory", name


def test_tables_the_role_cannot_read_or_write(extension_dsn, roles):
    with _as(extension_dsn, roles["alice"]) as conn:
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute("SELECT madlib_mop.training_preprocessor_dl('public.secret', "
                         "'secret_packed', 'y', 'x')")
        assert not _exists(conn, "secret_packed")
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute("SELECT madlib_mop.training_preprocessor_dl(%s, 'locked.packed', 'y', "
                         "'x')", (f"points_{roles['alice']}",))
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute("SELECT madlib_mop.load_keras_model('locked.arch', %s::json)", (MLP,))


def test_a_role_never_sees_or_resumes_another_roles_job(extension_dsn, roles):
    alice, bob = roles["alice"], roles["bob"]
    with _as(extension_dsn, alice) as conn:
        names = _prepare(conn, alice, "private")
        conn.execute(*_fit_sql(names))
        job = conn.execute("SELECT job_id FROM madlib_mop.job_progress WHERE model_output_table "
                           "LIKE %s", (f"%{names['out']}",)).fetchone()[0]
    with _as(extension_dsn, bob) as conn:
        assert conn.execute("SELECT count(*) FROM madlib_mop.job_progress WHERE job_id = %s",
                            (job,)).fetchone()[0] == 0
        assert conn.execute("SELECT count(*) FROM madlib_mop.jobs WHERE job_id = %s",
                            (job,)).fetchone()[0] == 0
        with pytest.raises(psycopg.errors.InvalidParameterValue) as caught:
            conn.execute("CALL madlib_mop.resume(%s)", (job,))
        assert "another role" in caught.value.diag.message_primary
        with pytest.raises(psycopg.Error) as caught:  # a worker entry point, called directly
            conn.execute("SELECT madlib_mop._mop_train(%s, 1, 0, 0, ''::bytea)", (job,))
        assert caught.value.diag.sqlstate != "XX000"
        with pytest.raises(psycopg.errors.InsufficientPrivilege):  # its outputs are alice's
            conn.execute(sql.SQL("SELECT * FROM public.{}").format(sql.Identifier(names["out"])))
        assert conn.execute("UPDATE madlib_mop.jobs SET state = 'failed' WHERE job_id = %s",
                            (job,)).rowcount == 0


def test_a_superuser_does_not_run_a_job_row_another_role_forged(conn, extension_dsn, roles):
    """Any role may insert job rows (its own); their stored table names are SQL.  A
    superuser, whom row-level security does not bind, never runs another role's job."""
    payload = "public.secret; CREATE TABLE public.pwned (); --"
    tables = {"models": payload, "state": payload, "visits": payload, "evals": payload,
              "output": payload, "info": payload, "summary": payload}
    with _as(extension_dsn, roles["bob"]) as bob:
        for column, value in (("job_id", 10 ** 9), ("owner", "postgres")):
            with pytest.raises(psycopg.errors.InsufficientPrivilege):  # never chosen by a role
                bob.execute(f"INSERT INTO madlib_mop.jobs ({column}, model_output_table, source_table, "
                            "model_selection_table, arguments, tables, num_models, num_segments, "
                            "seed, subepochs_total) VALUES (%s, 'x', 'x', 'x', '{}', '{}', 1, 1, 0, 1)",
                            (value,))
        job = bob.execute(
            "INSERT INTO madlib_mop.jobs (model_output_table, source_table, model_selection_table, "
            "arguments, tables, num_models, num_segments, seed, subepochs_total) "
            "VALUES ('public.secret', 'public.secret', 'public.secret', '{}', %s, 1, 1, 0, 1) "
            "RETURNING job_id", (json.dumps(tables),)).fetchone()[0]
    for statement in ("CALL madlib_mop.resume(%s)", "SELECT madlib_mop.resume_job(%s)",
                      "SELECT madlib_mop._mop_train(%s, 1, 0, 0, ''::bytea)",
                      "SELECT madlib_mop._mop_evaluate(%s, 1, 0, 0, ''::bytea)",
                      "SELECT madlib_mop._mop_train_fused(%s, ARRAY[1, 2], ARRAY[0, 0], 0)",
                      "SELECT madlib_mop._mop_evaluate_fused(%s, ARRAY[1, 2], ARRAY[0, 0], 0)"):
        with pytest.raises(psycopg.errors.InvalidParameterValue) as caught:
            conn.execute(statement, (job,))
        assert "another role" in caught.value.diag.message_primary
    assert not _exists(conn, "public.pwned")


def test_another_role_cannot_block_a_job_by_taking_its_lock(extension_dsn, roles):
    """Job ids are visible (application_name) and predictable; the coordinator's advisory
    lock is a random key only the owner can read."""
    alice, bob = roles["alice"], roles["bob"]
    with _as(extension_dsn, bob) as squatter, _as(extension_dsn, alice) as conn:
        names = _prepare(conn, alice, "lock")
        for guess in range(1, 150):  # every likely job id, in the old scheme's keys and as is
            squatter.execute("SELECT pg_advisory_lock(%s, %s), pg_advisory_lock(%s)",
                             (0x4D4F50, guess, guess))
        conn.execute(*_fit_sql(names))
        assert conn.execute("SELECT state FROM madlib_mop.jobs WHERE model_output_table LIKE %s",
                            (f"%{names['out']}",)).fetchone()[0] == "finished"
        assert squatter.execute("SELECT count(lock_key) FROM madlib_mop.jobs WHERE owner = %s",
                                (alice,)).fetchone()[0] == 0  # alice's keys are hers
