"""Inputs a MADlib script hands over: tables packed by MADlib itself (their summary lacks
madlib_mop's columns and they have no segment column), and inputs made in the caller's
still-open transaction, which worker sessions cannot see."""

from __future__ import annotations

import os
import threading

import numpy as np
import psycopg
import pytest

from tests.conftest import connect, held_job, psql_script

CLASSES = ["Iris-setosa", "Iris-versicolor", "Iris-virginica"]
MLP = ('{"class_name": "Sequential", "config": {"name": "s", "layers": ['
       '{"class_name": "InputLayer", "config": {"batch_shape": [null, 4], "name": "i"}}, '
       '{"class_name": "Dense", "config": {"units": 8, "activation": "relu", "name": "d1"}}, '
       '{"class_name": "Dense", "config": {"units": 3, "activation": "softmax", "name": "d2"}}]}}')
COMPILE = "loss='categorical_crossentropy', optimizer='Adam(lr=0.05)', metrics=['accuracy']"


@pytest.fixture(scope="module")
def iris(extension_dsn):
    from sklearn.datasets import load_iris

    data = load_iris()
    with psycopg.connect(extension_dsn, autocommit=True) as conn:
        conn.execute("SET search_path = public, madlib_mop")
        conn.execute("CREATE TABLE iris (id int, attributes real[], class_text varchar)")
        with conn.cursor().copy("COPY iris FROM STDIN") as copy:
            for i, (x, y) in enumerate(zip(data.data, data.target)):
                copy.write_row((i, [float(v) for v in x], CLASSES[y]))
        # Packed as MADlib's training_preprocessor_dl packs on PostgreSQL: buffers of 30 rows,
        # float32 features and int16 one-hot labels as bytes (its convert_array_to_bytea),
        # shapes, buffer_id; a summary with MADlib's columns only.
        conn.execute("""
            CREATE TABLE iris_madlib AS
            WITH r AS (SELECT row_number() OVER (ORDER BY (id * 37) % 150) - 1 AS n, * FROM iris)
            SELECT madlib_mop.convert_array_to_bytea(array_agg(attributes ORDER BY n)) AS attributes,
                   madlib_mop.convert_array_to_bytea(array_agg(ARRAY[
                       (class_text = 'Iris-setosa')::int, (class_text = 'Iris-versicolor')::int,
                       (class_text = 'Iris-virginica')::int]::smallint[] ORDER BY n)) AS class_text,
                   ARRAY[count(*), 4]::integer[] AS attributes_shape,
                   ARRAY[count(*), 3]::integer[] AS class_text_shape,
                   (n / 30)::integer AS buffer_id
            FROM r GROUP BY n / 30""")
        conn.execute("""
            CREATE TABLE iris_madlib_summary AS SELECT
                'iris'::text AS source_table, 'iris_madlib'::text AS output_table,
                ARRAY['class_text'] AS dependent_varname, ARRAY['attributes'] AS independent_varname,
                ARRAY['character varying'] AS dependent_vartype,
                ARRAY['Iris-setosa', 'Iris-versicolor', 'Iris-virginica']::varchar[]
                    AS class_text_class_values,
                30 AS buffer_size, 1.0::real AS normalizing_const, ARRAY[3] AS num_classes,
                'all_segments'::text AS distribution_rules,
                'all_segments'::text AS __internal_gpu_config__""")
        # MADlib packs a numeric array label as one-hot rows, with NULL class values.
        conn.execute("CREATE TABLE onehot_madlib AS SELECT * FROM iris_madlib")
        conn.execute("CREATE TABLE onehot_madlib_summary AS SELECT source_table, "
                     "'onehot_madlib'::text AS output_table, dependent_varname, independent_varname, "
                     "ARRAY['smallint[]'] AS dependent_vartype, NULL::smallint[] AS class_text_class_values, "
                     "buffer_size, normalizing_const, num_classes, distribution_rules, "
                     "__internal_gpu_config__ FROM iris_madlib_summary")
        conn.execute("SELECT load_keras_model('arch', %s::json)", (MLP,))
        conn.execute("SELECT madlib_keras_fit('iris_madlib', 'from_madlib', 'arch', 1, %s, "
                     "'batch_size=10', 6, validation_table => 'iris_madlib')", (COMPILE,))
    return extension_dsn, data


@pytest.fixture
def conn(iris):
    with psycopg.connect(iris[0], autocommit=True) as connection:
        connection.execute("SET search_path = public, madlib_mop")
        yield connection


def test_table_packed_by_madlib_trains_evaluates_and_predicts(conn, iris):
    conn.execute("DROP TABLE IF EXISTS madlib_eval, madlib_pred")
    summary = conn.execute("SELECT num_classes, class_text_class_values, num_segments, "
                           "training_loss, validation_metrics_final FROM from_madlib_summary").fetchone()
    num_classes, class_values, segments, losses, accuracy = summary
    assert num_classes == [3] and class_values == CLASSES
    assert segments == min(os.cpu_count(), 5)  # one per CPU, at most one per buffer
    # Each iteration visits every segment once, so every buffer (b on segment b % S) once.
    visits = conn.execute("SELECT subepochs_done FROM madlib_mop.jobs WHERE model_output_table "
                          "LIKE '%%from_madlib' ORDER BY job_id DESC LIMIT 1").fetchone()[0]
    assert visits == 6 * segments
    assert losses[-1] < 0.6 and accuracy > 0.8  # it learned from MADlib's bytes (ln 3 at first)
    conn.execute("SELECT madlib_keras_evaluate('from_madlib', 'iris_madlib', 'madlib_eval')")
    loss, metric = conn.execute("SELECT loss, metric FROM madlib_eval").fetchone()
    assert np.isfinite(loss) and metric == pytest.approx(accuracy, abs=1e-6)
    conn.execute("SELECT madlib_keras_predict('from_madlib', 'iris', 'id', 'attributes', "
                 "'madlib_pred', 'response')")
    right = conn.execute("SELECT avg((p.class_value = i.class_text)::int) FROM madlib_pred p "
                         "JOIN iris i USING (id)").fetchone()[0]
    assert float(right) == pytest.approx(accuracy, abs=0.02)


def test_one_hot_table_packed_by_madlib_gives_position_classes(conn, iris):
    conn.execute("DROP TABLE IF EXISTS onehot_model, onehot_model_summary, onehot_model_info, "
                 "onehot_eval, onehot_pred")
    conn.execute("SELECT madlib_keras_fit('onehot_madlib', 'onehot_model', 'arch', 1, %s, "
                 "'batch_size=10', 3)", (COMPILE,))
    assert conn.execute("SELECT class_text_class_values FROM onehot_model_summary").fetchone()[0] \
        == [0, 1, 2]
    conn.execute("SELECT madlib_keras_evaluate('onehot_model', 'onehot_madlib', 'onehot_eval')")
    assert np.isfinite(conn.execute("SELECT loss FROM onehot_eval").fetchone()[0])
    conn.execute("SELECT madlib_keras_predict('onehot_model', 'iris', 'id', 'attributes', "
                 "'onehot_pred', 2)")
    rows = conn.execute("SELECT count(*), count(DISTINCT id), array_agg(DISTINCT class_value) "
                        "FROM onehot_pred").fetchone()
    assert rows[0] == 300 and rows[1] == 150 and set(rows[2]) <= {"0", "1", "2"}


def test_inputs_of_an_open_transaction_are_refused(iris):
    with psycopg.connect(iris[0]) as conn:  # not autocommit: one open transaction
        conn.execute("SET search_path = public, madlib_mop")
        conn.execute("SELECT training_preprocessor_dl('iris', 'tx_packed', 'class_text', "
                     "'attributes')")
        with pytest.raises(psycopg.Error) as raised:
            conn.execute("SELECT madlib_keras_fit('tx_packed', 'tx_model', 'arch', 1, %s, "
                         "'batch_size=10', 1)", (COMPILE,))
        diag = raised.value.diag
        assert diag.sqlstate == "25000" and "tx_packed" in diag.message_primary
        assert "COMMIT" in diag.message_hint
        conn.rollback()
        conn.execute("SET search_path = public, madlib_mop")
        conn.execute("CREATE TABLE tx_rows AS SELECT * FROM iris")
        with pytest.raises(psycopg.Error) as raised:
            conn.execute("SELECT madlib_keras_predict('from_madlib', 'tx_rows', 'id', "
                         "'attributes', 'tx_pred')")
        assert raised.value.diag.sqlstate == "25000" and "tx_rows" in raised.value.diag.message_primary
        conn.rollback()
    with psycopg.connect(iris[0], autocommit=True) as conn:
        assert conn.execute("SELECT to_regclass('public.tx_packed'), to_regclass('public.tx_model'), "
                            "to_regclass('public.tx_rows'), to_regclass('public.tx_pred')").fetchone() == (None,) * 4


def test_a_table_filled_then_trained_at_once_is_not_refused(iris):
    """The commonest psql script: create and fill a table, pack it, fit, predict, one
    statement after another in autocommit.  Each input was committed by an earlier statement;
    the session's statistics, not yet flushed, still count those writes and must not be read
    as this transaction's."""
    done = psql_script(iris[0], f"""
        CREATE TABLE fresh (id int, attributes real[], class_text varchar);
        INSERT INTO fresh SELECT * FROM iris WHERE id % 2 = 0;
        INSERT INTO fresh SELECT * FROM iris WHERE id % 2 = 1;
        SELECT training_preprocessor_dl('fresh', 'fresh_packed', 'class_text', 'attributes');
        SELECT madlib_keras_fit('fresh_packed', 'fresh_model', 'arch', 1, $${COMPILE}$$,
                                $$batch_size=10$$, 1);
        SELECT madlib_keras_evaluate('fresh_model', 'fresh_packed', 'fresh_eval');
        INSERT INTO fresh SELECT id + 1000, attributes, class_text FROM iris WHERE id < 5;
        SELECT madlib_keras_predict('fresh_model', 'fresh', 'id', 'attributes', 'fresh_pred');
        SELECT count(DISTINCT id) FROM fresh_pred;
        """)
    assert done.returncode == 0, done.stderr
    assert "155" in done.stdout


def test_written_in_transaction_is_exact(conn):
    """What the open-transaction check asks: true for this transaction's creations, writes,
    truncations and released savepoints; false for committed writes (even right after them),
    for a savepoint rolled back, and outside a transaction with an id."""
    conn.execute("CREATE TABLE wt (x int)")
    conn.execute("INSERT INTO wt VALUES (1)")
    conn.execute("CREATE TABLE wt_other (x int)")

    def written(table: str = "wt") -> bool:
        return conn.execute("SELECT written_in_transaction(%s::regclass)", (table,)).fetchone()[0]

    assert not written()
    conn.execute("BEGIN")
    conn.execute("INSERT INTO wt_other VALUES (1)")  # this transaction has an id now
    stale = conn.execute("SELECT n_tup_ins FROM pg_stat_xact_all_tables WHERE relid = "
                         "'wt'::regclass").fetchone()
    assert not written() and written("wt_other")
    conn.execute("SAVEPOINT s")
    conn.execute("INSERT INTO wt VALUES (2)")
    assert written()
    conn.execute("ROLLBACK TO SAVEPOINT s")  # its insert is gone
    assert not written()
    conn.execute("DELETE FROM wt")
    conn.execute("RELEASE SAVEPOINT s")  # its delete is this transaction's
    assert written()
    conn.execute("ROLLBACK")
    for change in ("TRUNCATE wt", "UPDATE wt SET x = 3", "CREATE TABLE wt_new (x int)",
                   "ALTER TABLE wt ADD COLUMN y int"):
        table = "wt_new" if "wt_new" in change else "wt"
        conn.execute("BEGIN")
        conn.execute("INSERT INTO wt_other VALUES (1)")
        conn.execute(change)
        assert written(table), change
        conn.execute("ROLLBACK")
    # What makes the check exact: the statistics still count the committed insert.
    assert stale is not None and stale[0] >= 1


def test_a_running_job_is_not_replaced_when_its_output_is_dropped(iris):
    """A script's DROP of <model> while its job still trains, then the same fit: refused
    (55006), nothing of the running job dropped."""
    fit = ("SELECT madlib_keras_fit('iris_madlib', 'busy', 'arch', 1, %s, 'batch_size=10', 40)",
           (COMPILE,))
    outcome: list[BaseException] = []

    def train():
        try:
            with connect(iris[0]) as conn:
                conn.execute(*fit)
        except BaseException as error:  # the job fails once its output is gone
            outcome.append(error)

    with connect(iris[0]) as conn:
        conn.execute("DROP TABLE IF EXISTS busy, busy_summary, busy_info, busy_mop_models, "
                     "busy_mop_state, busy_mop_visits, busy_mop_evals")
    job = threading.Thread(target=train)
    job.start()
    with connect(iris[0]) as watcher, connect(iris[0]) as caller:
        with held_job(watcher, "busy", 1):
            caller.execute("SET lock_timeout = '10s'")
            caller.execute("DROP TABLE busy, busy_summary")
            with pytest.raises(psycopg.Error) as raised:
                caller.execute(*fit)
            assert raised.value.diag.sqlstate == "55006"
            assert "pg_cancel_backend" in raised.value.diag.message_hint
            assert caller.execute("SELECT to_regclass('public.busy_mop_state') IS NOT NULL").fetchone()[0]
            caller.execute("SELECT pg_cancel_backend(coordinator_pid) FROM madlib_mop.jobs "
                           "WHERE model_output_table = 'public.busy'")
    job.join(timeout=120)
    assert not job.is_alive() and outcome


def test_call_fit_multiple_inside_a_transaction_block_is_refused(iris):
    """The procedure commits as it goes: inside BEGIN ... COMMIT it cannot (25001, with a
    HINT).  (Only that error of a commit says so: test_client's Ctrl-C test cancels a CALL,
    which must end interrupted, not failed, whenever the cancel is acted on.)"""
    with connect(iris[0]) as conn:
        conn.execute("DROP TABLE IF EXISTS mst_tx, mst_tx_summary")
        conn.execute("SELECT load_model_selection_table('arch', 'mst_tx', ARRAY[1], ARRAY[%s], "
                      "ARRAY['batch_size=10'])", (COMPILE,))
    with psycopg.connect(iris[0]) as conn:  # not autocommit: the CALL runs in a block
        conn.execute("SET search_path = public, madlib_mop")
        with pytest.raises(psycopg.Error) as raised:
            conn.execute("CALL fit_multiple('iris_madlib', 'in_block', 'mst_tx', 1)")
        assert raised.value.diag.sqlstate == "25001" and "BEGIN" in raised.value.diag.message_hint
