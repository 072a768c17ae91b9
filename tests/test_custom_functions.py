"""Custom losses and metrics (MADlib's load_custom_function, delete_custom_function,
load_top_k_accuracy_function and object_table) under PostgreSQL's trust rule: only a role
that may run programs on the server loads one, and a worker runs an object only from a
table such a role owns, from a row such a role wrote.  Statements run as psql runs a script
(autocommit), as the superuser, as a member of pg_execute_server_program and as analysts."""

from __future__ import annotations

import json
import pickle
import uuid

import numpy as np
import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from tests.conftest import (connect, coordinator_killed_mid_job, iris_table, notebook_functions, psql_error,
                            psql_rows)

PASSWORD = "custom-fn-" + uuid.uuid4().hex[:8]
COMPILE = ("loss='scaled_crossentropy', optimizer='Adam(lr=0.05)', "
           "metrics=['accuracy', 'mean_top_probability']")
MLP = json.dumps({"class_name": "Sequential", "config": {"name": "mlp", "layers": [
    {"class_name": "InputLayer", "config": {"batch_input_shape": [None, 4], "name": "i"}},
    {"class_name": "Dense", "config": {"units": 8, "activation": "relu", "name": "h"}},
    {"class_name": "Dense", "config": {"units": 3, "activation": "softmax", "name": "o"}}]}})

# A Keras user's functions, written in a notebook (module __main__): dill serialises them
# by value, as MADlib's users store them.
SOURCE = '''
import keras

def scaled_crossentropy(y_true, y_pred):
    return 2.0 * keras.losses.categorical_crossentropy(y_true, y_pred)

def mean_top_probability(y_true, y_pred):
    return keras.ops.max(y_pred, axis=-1)
'''


def _notebook_functions() -> dict:
    return notebook_functions(SOURCE, ("scaled_crossentropy", "mean_top_probability"))


class _Canary:
    """Unpickling this makes a directory on the server: proof that the bytes ran."""

    def __init__(self, path: str):
        self.path = path

    def __reduce__(self):
        import os

        return os.mkdir, (self.path,)


@pytest.fixture(scope="module")
def setup(extension_dsn, allow_worker_role):
    """Iris in `iris` (packed over 2 segments, and as validation data), the MLP, the two
    functions loaded by the superuser into `fns`; an analyst and a loader (a member of
    pg_execute_server_program, no superuser), allowed as worker roles."""
    suffix = uuid.uuid4().hex[:6]
    roles = {"analyst": f"analyst_{suffix}", "loader": f"loader_{suffix}"}
    with connect(extension_dsn) as admin:
        iris_table(admin, features="real[]", label="species")
        admin.execute("SELECT training_preprocessor_dl('iris', 'iris_packed', 'species', 'attributes', "
                      "distribution_rules => '2')")
        admin.execute("SELECT validation_preprocessor_dl('iris', 'iris_valid', 'species', 'attributes', "
                      "'iris_packed')")
        admin.execute("SELECT load_keras_model('arch', %s::json)", (MLP,))
        for name, blob in _notebook_functions().items():
            admin.execute("SELECT load_custom_function('fns', %s, %s, 'a notebook''s function')",
                          (blob, name))
        for role in roles.values():
            allow_worker_role(role)
            admin.execute(sql.SQL("CREATE ROLE {} LOGIN PASSWORD {}").format(
                sql.Identifier(role), sql.Literal(PASSWORD)))
            admin.execute(sql.SQL("GRANT USAGE ON SCHEMA madlib_mop TO {0}; GRANT CREATE ON SCHEMA "
                                  "public TO {0}; GRANT SELECT ON iris, iris_packed, iris_packed_summary, "
                                  "iris_valid, iris_valid_summary, arch TO {0}").format(sql.Identifier(role)))
        admin.execute(sql.SQL("GRANT pg_execute_server_program TO {}").format(sql.Identifier(roles["loader"])))
    yield extension_dsn, roles
    with connect(extension_dsn) as admin:
        for role in roles.values():
            admin.execute("DELETE FROM madlib_mop.jobs WHERE owner = %s", (role,))
            admin.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(role)))
            admin.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))


def _dsn(dsn: str, role: str | None) -> str:
    """The module's database as the superuser, or as `role` with its password (scram)."""
    if role is None:
        return dsn
    params = conninfo_to_dict(dsn)
    params.pop("passfile", None)
    params.update(user=role, password=PASSWORD)
    return make_conninfo(**params)


def _script(dsn: str, script: str, role: str | None = None) -> list[str]:
    return psql_rows(_dsn(dsn, role), script)


def _error(dsn: str, script: str, role: str | None = None) -> dict:
    return psql_error(_dsn(dsn, role), script)


def _fit(out: str, object_table: str = "fns", compile_params: str = COMPILE, iterations: int = 3) -> str:
    return (f"SELECT madlib_keras_fit('iris_packed', '{out}', 'arch', 1, $${compile_params}$$, "
            f"'batch_size=16', {iterations}, validation_table => 'iris_valid', "
            f"metrics_compute_frequency => 1, object_table => '{object_table}');")


def _fit_in_session(dsn: str, out: str) -> None:
    """The fit in a session of its own (its coordinator is the one a test terminates)."""
    with connect(dsn) as conn:
        conn.execute(_fit(out))


def _weights(conn, table: str) -> bytes:
    return bytes(conn.execute(f"SELECT model_weights FROM {table}").fetchone()[0])


def _expected_on_validation(conn, model: str) -> tuple[float, float]:
    """The custom loss and metric of `model` on iris_valid, computed here in plain Keras."""
    from madlib_mop.runtime import keras_json, model_state
    from madlib_mop.runtime.buffers import decode

    arch = conn.execute(f"SELECT model_arch::text FROM {model}").fetchone()[0]
    net = keras_json.model_from_config(keras_json.parse_model_json(arch), initialised=False)
    model_state.set_flat_weights(net, _weights(conn, model))
    rows = conn.execute("SELECT attributes AS x, species AS y, attributes_shape AS xs, "
                        "species_shape AS ys FROM iris_valid ORDER BY buffer_id").fetchall()
    decoded = [decode(dict(zip(("x", "y", "xs", "ys"), r)), True) for r in rows]
    x = np.concatenate([d[0] for d in decoded])
    y = np.concatenate([d[1] for d in decoded]).astype(np.float32)
    p = net.predict(x, verbose=0)
    loss = float(np.mean(2.0 * -np.sum(y * np.log(np.clip(p, 1e-7, 1.0)), axis=1)))
    return loss, float(np.mean(p.max(axis=1)))


# ---- loading, MADlib's way ------------------------------------------------------------------

def test_the_object_table_has_madlib_columns_and_the_writer(setup):
    dsn, _ = setup
    rows = _script(dsn, """
        SELECT string_agg(attname || ':' || format_type(atttypid, NULL), ',' ORDER BY attnum)
        FROM pg_attribute WHERE attrelid = 'fns'::regclass AND attnum > 0;
        SELECT id, name, written_by FROM fns ORDER BY id;""")
    assert rows[0] == "id:integer,name:text,description:text,object:bytea,written_by:regrole"
    assert rows[1:] == ["1|scaled_crossentropy|postgres", "2|mean_top_probability|postgres"]


def test_madlib_script_of_load_and_delete(setup):
    """MADlib's own test of these functions, in our words."""
    dsn, _ = setup
    blob = _notebook_functions()["scaled_crossentropy"]
    rows = _script(dsn, f"""
        SELECT load_custom_function('scratch_fns', '\\x{blob.hex()}'::bytea, 'sum_fn', 'returns sum');
        SELECT load_custom_function('scratch_fns', '\\x{blob.hex()}'::bytea, 'sum_fn1');
        SELECT id, name, coalesce(description, '-') FROM scratch_fns ORDER BY id;
        SELECT delete_custom_function('scratch_fns', 2);
        SELECT load_custom_function('scratch_fns', '\\x{blob.hex()}'::bytea, 'sum_fn1');
        SELECT delete_custom_function('scratch_fns', 'sum_fn1');
        SELECT count(*) FROM scratch_fns;
        SELECT delete_custom_function('scratch_fns', 1);
        SELECT to_regclass('scratch_fns') IS NULL;""")
    assert rows == ["1|sum_fn|returns sum", "2|sum_fn1|-", "1", "t"]


@pytest.mark.parametrize(("statement", "sqlstate", "phrase"), [
    ("SELECT load_custom_function('fns', '\\x00'::bytea, 'scaled_crossentropy')", "22023",
     "Invalid function object"),
    ("SELECT load_custom_function('fns', 'invalid_obj'::bytea, 'other')", "22023", "Invalid function object"),
    ("SELECT load_custom_function('fns', NULL, 'other')", "22004", "function object cannot be NULL"),
    ("SELECT load_custom_function('fns', '\\x80044b012e'::bytea, NULL)", "22004",
     "function name cannot be NULL"),
    ("SELECT load_custom_function('fns', (SELECT object FROM fns WHERE id = 1), 'scaled_crossentropy')",
     "42710", "Function 'scaled_crossentropy' already exists in public.fns"),
    ("SELECT load_custom_function('pg_temp.fns', (SELECT object FROM fns WHERE id = 1), 'x')", "0A000",
     "may not be temporary"),
    ("SELECT delete_custom_function('fns', 99)", "22023", "Object id 99 not found"),
    ("SELECT delete_custom_function('no_such_fns', 1)", "42P01", "Input table 'no_such_fns' does not exist"),
    ("SELECT delete_custom_function('fns', NULL::integer)", "22004", "function id/name cannot be NULL"),
    ("SELECT load_top_k_accuracy_function('fns', 0)", "22023", "k has to be a positive integer"),
    ("CREATE TABLE not_fns (id int, name text); SELECT load_custom_function('not_fns', "
     "(SELECT object FROM fns WHERE id = 1), 'x')", "42703", "Invalid custom function table"),
])
def test_bad_calls_are_refused(setup, statement, sqlstate, phrase):
    dsn, _ = setup
    error = _error(dsn, statement)
    assert error["sqlstate"] == sqlstate and phrase in error["message"], error
    assert error["hint"]
    assert _script(dsn, "SELECT count(*) FROM fns;") == ["2"]


def test_help_texts(setup):
    dsn, _ = setup
    rows = _script(dsn, "SELECT load_custom_function('usage') LIKE '%pg_execute_server_program%';")
    assert rows == ["t"]


# ---- training, hopping, resuming and evaluating with them -----------------------------------

@pytest.fixture(scope="module")
def reference(setup):
    """A custom loss and metric trained without interruption: its weights."""
    dsn, _ = setup
    _script(dsn, _fit("custom_ref"))
    with connect(dsn) as conn:
        return _weights(conn, "custom_ref")


def test_custom_loss_and_metric_train_and_are_reported_by_name(setup, reference):
    dsn, _ = setup
    rows = _script(dsn, """
        SELECT object_table, loss_type, metrics_type FROM custom_ref_summary;
        SELECT count(*) FROM custom_ref_mop_visits;
        SELECT array_length(training_loss, 1), validation_metrics_final IS NOT NULL FROM custom_ref_info;
        SELECT arguments->'custom_functions'->'table' FROM jobs WHERE model_output_table = 'public.custom_ref';""")
    assert rows[0] == "public.fns|scaled_crossentropy|{accuracy,mean_top_probability}"
    assert rows[1] == "6"  # 3 iterations x 2 segments: the model hopped
    assert rows[2] == "3|t"
    assert rows[3] == '["public", "fns"]'
    with connect(dsn) as conn:
        loss, top = _expected_on_validation(conn, "custom_ref")
        final = conn.execute("SELECT validation_loss_final FROM custom_ref_info").fetchone()[0]
        assert final == pytest.approx(loss, rel=1e-4)  # twice the cross-entropy: our loss ran


def test_evaluate_runs_the_custom_loss_and_metric(setup, reference):
    dsn, _ = setup
    rows = _script(dsn, """
        SELECT madlib_keras_evaluate('custom_ref', 'iris_valid', 'custom_eval');
        SELECT loss_type, metrics_type, metrics->>'mean_top_probability' IS NOT NULL FROM custom_eval;""")
    assert rows == ["scaled_crossentropy|{accuracy,mean_top_probability}|t"]
    with connect(dsn) as conn:
        loss, top = _expected_on_validation(conn, "custom_ref")
        measured = conn.execute("SELECT loss, (metrics->>'mean_top_probability')::float8 "
                                "FROM custom_eval").fetchone()
    assert measured[0] == pytest.approx(loss, rel=1e-4) and measured[1] == pytest.approx(top, rel=1e-4)


def test_a_killed_job_resumes_to_the_same_bits(setup, reference):
    dsn, _ = setup
    with connect(dsn) as watcher:
        job_id = coordinator_killed_mid_job(
            watcher, "custom_resumed", 3,
            lambda: _fit_in_session(dsn, "custom_resumed"))
        watcher.execute("CALL resume(%s)", (job_id,))
        assert _weights(watcher, "custom_resumed") == reference


def test_a_function_changed_after_the_job_started_is_refused_at_resume(setup, reference):
    dsn, _ = setup
    with connect(dsn) as watcher:
        watcher.execute("CREATE TABLE fns_kept AS SELECT * FROM fns")
        job_id = coordinator_killed_mid_job(
            watcher, "custom_changed", 3, lambda: _fit_in_session(dsn, "custom_changed"))
        watcher.execute("UPDATE fns SET object = (SELECT object FROM fns WHERE name = 'mean_top_probability') "
                        "WHERE name = 'scaled_crossentropy'")
        try:
            with pytest.raises(psycopg.Error) as raised:
                watcher.execute("CALL resume(%s)", (job_id,))
            diag = raised.value.diag
            assert diag.sqlstate == "55000", (diag.message_primary, diag.message_detail)
            assert "changed since the job started" in raised.value.diag.message_primary
        finally:
            watcher.execute("UPDATE fns f SET object = k.object FROM fns_kept k WHERE f.name = k.name")
        watcher.execute("CALL resume(%s)", (job_id,))
        assert _weights(watcher, "custom_changed") == reference


def test_replay_runs_the_recorded_functions(setup, reference):
    from madlib_mop.tools.replay import replay

    dsn, _ = setup
    with psycopg.connect(dsn) as conn:
        conn.execute("SET search_path = public, madlib_mop")
        replayed = replay(conn, "custom_ref", 1)
    assert np.max(np.abs(replayed - np.frombuffer(reference, dtype=np.float32))) < 1e-5


def test_top_k_accuracy_matches_keras_for_k_1_to_5(setup):
    """load_top_k_accuracy_function's objects against Keras' top_k_categorical_accuracy on
    the model's own predictions (digits: 10 classes)."""
    import keras

    from sklearn.datasets import load_digits

    dsn, _ = setup
    digits = load_digits()
    with connect(dsn) as conn:
        conn.execute("CREATE TABLE digits (id int, x real[], y int)")
        with conn.cursor().copy("COPY digits FROM STDIN") as copy:
            for i, (x, y) in enumerate(zip(digits.data[:400], digits.target[:400])):
                copy.write_row((i, [float(v) / 16 for v in x], int(y)))
        conn.execute("SELECT load_keras_model('digits_arch', %s::json)", (keras.Sequential([
            keras.Input((64,)), keras.layers.Dense(10, activation="softmax")]).to_json(),))
    metrics = [f"top_{k}_accuracy" for k in range(1, 6)]
    _script(dsn, "\n".join(f"SELECT load_top_k_accuracy_function('topk', {k});" for k in range(1, 6)) + f"""
        SELECT training_preprocessor_dl('digits', 'digits_packed', 'y', 'x', distribution_rules => '2');
        SELECT madlib_keras_fit('digits_packed', 'digits_model', 'digits_arch', 1,
            $$loss='categorical_crossentropy', optimizer='SGD(lr=0.05)', metrics={metrics!r}$$,
            'batch_size=32', 1, object_table => 'topk');
        SELECT madlib_keras_evaluate('digits_model', 'digits_packed', 'digits_eval');
        SELECT madlib_keras_predict('digits_model', 'digits', 'id', 'x', 'digits_prob', 'prob');""")
    with connect(dsn) as conn:
        measured = json.loads(json.dumps(conn.execute("SELECT metrics FROM digits_eval").fetchone()[0]))
        probs = np.zeros((400, 10))
        labels = np.zeros((400, 10))
        for i, c, p in conn.execute("SELECT id, class_value::int, prob FROM digits_prob"):
            probs[i, c] = p
        for i, y in conn.execute("SELECT id, y FROM digits"):
            labels[i, y] = 1
        assert conn.execute("SELECT name FROM topk ORDER BY id").fetchall() == [(m,) for m in metrics]
    for k in range(1, 6):
        keras_value = float(np.mean(keras.metrics.top_k_categorical_accuracy(
            labels.astype(np.float32), probs.astype(np.float32), k=k)))
        assert measured[f"top_{k}_accuracy"] == pytest.approx(keras_value, abs=1e-6), k
    assert measured["top_1_accuracy"] < measured["top_5_accuracy"]


# ---- who may load, and what runs ------------------------------------------------------------

def test_an_analyst_cannot_load_and_is_told_the_grant(setup):
    dsn, roles = setup
    blob = _notebook_functions()["scaled_crossentropy"]
    error = _error(dsn, f"SELECT madlib_mop.load_custom_function('analyst_fns', "
                        f"'\\x{blob.hex()}'::bytea, 'mine');", roles["analyst"])
    assert error["sqlstate"] == "42501", error
    assert f"GRANT pg_execute_server_program TO {roles['analyst']}" in error["hint"]
    assert _script(dsn, "SELECT to_regclass('analyst_fns') IS NULL;") == ["t"]


def test_a_member_of_pg_execute_server_program_loads_and_an_analyst_trains_with_it(setup):
    dsn, roles = setup
    blob = _notebook_functions()["scaled_crossentropy"]
    _script(dsn, f"SELECT madlib_mop.load_custom_function('loader_fns', '\\x{blob.hex()}'::bytea, "
                 "'scaled_crossentropy');", roles["loader"])
    rows = _script(dsn, "SET search_path = public, madlib_mop;\n" + _fit(
        "analyst_model", "loader_fns", "loss='scaled_crossentropy', optimizer='Adam(lr=0.05)'", 1)
        + "\nSELECT loss_type FROM analyst_model_summary;", roles["analyst"])
    assert rows[-1] == "scaled_crossentropy"


def _canary_exists(dsn: str, path: str) -> bool:
    return _script(dsn, f"SELECT (pg_stat_file('{path}', true)).size IS NOT NULL;") == ["t"]


def test_an_object_in_a_table_the_analyst_owns_never_runs(setup):
    """The analyst makes a table like an object table, with the extension's trigger too,
    and puts bytes in it that run code when unpickled: no worker unpickles them."""
    dsn, roles = setup
    path = f"/tmp/madlib_mop_canary_{uuid.uuid4().hex}"
    evil = pickle.dumps(_Canary(path))
    error = _error(dsn, f"""
        SET search_path = public, madlib_mop;
        CREATE TABLE analyst_objects (id serial, name text PRIMARY KEY, description text,
                                      object bytea NOT NULL, written_by regrole NOT NULL);
        CREATE TRIGGER madlib_mop_written_by BEFORE INSERT OR UPDATE ON analyst_objects
            FOR EACH ROW EXECUTE FUNCTION madlib_mop._custom_function_written_by();
        ALTER TABLE analyst_objects ENABLE ALWAYS TRIGGER madlib_mop_written_by;
        INSERT INTO analyst_objects (name, object) VALUES ('scaled_crossentropy', '\\x{evil.hex()}');
        {_fit("evil_model", "analyst_objects", "loss='scaled_crossentropy', optimizer='Adam(lr=0.05)'", 1)}""",
        roles["analyst"])
    assert error["sqlstate"] == "42501" and f"owned by role {roles['analyst']}" in error["message"], error
    assert "GRANT pg_execute_server_program" in error["hint"]
    assert not _canary_exists(dsn, path)
    assert _script(dsn, "SELECT to_regclass('evil_model') IS NULL;") == ["t"]


def test_an_object_an_analyst_wrote_into_a_trusted_table_never_runs(setup):
    """The trusted table's owner granted the analyst UPDATE: the analyst swaps in bytes that
    run code, and even names the superuser as the writer.  The trigger records the analyst;
    no worker unpickles the row."""
    dsn, roles = setup
    path = f"/tmp/madlib_mop_canary_{uuid.uuid4().hex}"
    evil = pickle.dumps(_Canary(path))
    blob = _notebook_functions()["scaled_crossentropy"]
    _script(dsn, f"""
        SELECT load_custom_function('shared_fns', '\\x{blob.hex()}'::bytea, 'scaled_crossentropy');
        GRANT UPDATE, INSERT ON shared_fns TO {roles['analyst']};""")
    disable = _error(dsn, "ALTER TABLE public.shared_fns DISABLE TRIGGER madlib_mop_written_by;",
                     roles["analyst"])
    assert disable["sqlstate"] == "42501"
    error = _error(dsn, f"""
        SET search_path = public, madlib_mop;
        UPDATE shared_fns SET object = '\\x{evil.hex()}', written_by = 'postgres' WHERE name = 'scaled_crossentropy';
        {_fit("evil_model2", "shared_fns", "loss='scaled_crossentropy', optimizer='Adam(lr=0.05)'", 1)}""",
        roles["analyst"])
    assert error["sqlstate"] == "42501", error
    assert f"written by role {roles['analyst']}" in error["message"], error
    assert not _canary_exists(dsn, path)
    assert _script(dsn, "SELECT written_by FROM shared_fns;") == [roles["analyst"]]
    # Whoever trains with the table, the superuser too: the row is not run.
    error = _error(dsn, _fit("evil_model3", "shared_fns",
                             "loss='scaled_crossentropy', optimizer='Adam(lr=0.05)'", 1))
    assert error["sqlstate"] == "42501"
    assert not _canary_exists(dsn, path)


def test_another_trigger_on_the_table_is_refused(setup):
    """A role with the TRIGGER right could add a trigger that rewrites written_by after ours."""
    dsn, _ = setup
    blob = _notebook_functions()["scaled_crossentropy"]
    error = _error(dsn, f"""
        SELECT load_custom_function('triggered_fns', '\\x{blob.hex()}'::bytea, 'scaled_crossentropy');
        CREATE FUNCTION pg_temp.noop() RETURNS trigger LANGUAGE plpgsql AS $$BEGIN RETURN NEW; END$$;
        CREATE TRIGGER zz_other BEFORE UPDATE ON triggered_fns FOR EACH ROW EXECUTE FUNCTION pg_temp.noop();
        {_fit("triggered_model", "triggered_fns", "loss='scaled_crossentropy', optimizer='Adam(lr=0.05)'", 1)}""")
    assert error["sqlstate"] == "42501" and "other triggers" in error["message"], error


def test_a_name_that_is_no_function_of_the_table_is_refused(setup):
    dsn, _ = setup
    error = _error(dsn, _fit("unknown_fn", "fns", "loss='no_such_loss', optimizer='Adam(lr=0.05)'", 1))
    assert error["sqlstate"] == "22023" and "loss 'no_such_loss' is not supported" in error["message"]
    error = _error(dsn, _fit("unknown_fn", "fns", COMPILE, 1).replace(", object_table => 'fns'", ""))
    assert error["sqlstate"] == "22023" and "scaled_crossentropy" in error["message"]
