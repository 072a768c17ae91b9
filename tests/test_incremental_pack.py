"""Tables packed in key order, and preprocessor_dl_append: packing a growing table's new
rows alone gives the buffers that packing the grown table whole gives."""

from __future__ import annotations

import threading

import numpy as np
import psycopg
import pytest
from psycopg import sql

from tests.conftest import ADAM, coordinator_killed_mid_job, held_job, mlp_json


ROWS = 1000
BUFFER = 40  # rows of a block's buffer: 80-row blocks over 2 segments


@pytest.fixture(scope="module")
def growing(conn):
    """`growing` (id, x real[3], y text of 3 classes, target float8): ids with gaps, written
    in an order that is not the ids' (a packing in key order must sort them)."""
    conn.execute("SET search_path = public, madlib_mop")
    rng = np.random.default_rng(5)
    ids = rng.permutation(np.arange(ROWS) * 3 + 11)
    conn.execute("CREATE TABLE growing (id bigint, x real[], y text, target float8)")
    with conn.cursor().copy("COPY growing FROM STDIN") as copy:
        for i in ids:
            x = rng.normal(size=3).astype(np.float32)
            copy.write_row((int(i), [float(v) for v in x], "abc"[int(i) // 3 % 3], float(x.sum())))
    conn.execute("CREATE VIEW growing_up_to (id, x, y, target) AS SELECT * FROM growing "
                 "WHERE id <= current_setting('test.up_to')::bigint")
    return sorted(int(i) for i in ids)


def _buffers(conn, table: str, label: str = "y") -> list[tuple]:
    return conn.execute(sql.SQL("SELECT buffer_id, __dist_key__, x, {y}, x_shape, {ys} FROM {} "
                                "ORDER BY buffer_id").format(
        sql.Identifier(table), y=sql.Identifier(label), ys=sql.Identifier(label + "_shape"))).fetchall()


def _counts(conn, table: str) -> tuple:
    return conn.execute(sql.SQL("SELECT num_rows, rows_per_segment, buffers_per_segment, buffer_size, "
                                "packed_by_key FROM {}").format(
        sql.Identifier(table + "_summary"))).fetchone()


def _drop(conn, *tables: str) -> None:
    for table in tables:
        conn.execute(sql.SQL("DROP TABLE IF EXISTS {}, {}").format(
            sql.Identifier(table), sql.Identifier(table + "_summary")))


def _up_to(conn, key: int) -> None:
    conn.execute("SELECT set_config('test.up_to', %s, false)", (str(key),))


PACKINGS = {
    # kind -> (the call packing `source` into `out`, with the key; the label column)
    "training, classes": ("SELECT training_preprocessor_dl({source}, {out}, 'y', 'x', %s, 2.0, NULL, '2', "
                          "7, FALSE, 'id')", "y"),
    "training, regression": ("SELECT training_preprocessor_dl({source}, {out}, 'target', 'x', %s, "
                             "distribution_rules => '2', seed => 3, regression => TRUE, "
                             "key_column => 'id')", "target"),
    "validation": ("SELECT validation_preprocessor_dl({source}, {out}, 'y', 'x', 'growing_train', %s, "
                   "key_column => 'id')", "y"),
}


@pytest.mark.parametrize("kind", PACKINGS)
def test_appending_in_steps_gives_the_buffers_of_one_packing(conn, growing, kind):
    statement, label = PACKINGS[kind]
    _drop(conn, "growing_train", "grown", "appended")
    conn.execute("SELECT training_preprocessor_dl('growing', 'growing_train', 'y', 'x', "
                 "distribution_rules => '2')")

    def pack(source: str, out: str) -> None:
        conn.execute(sql.SQL(statement).format(source=sql.Literal(source), out=sql.Literal(out)),
                     (BUFFER,))

    pack("growing", "grown")
    _up_to(conn, growing[399])
    pack("growing_up_to", "appended")
    untouched = conn.execute("SELECT buffer_id, xmin::text FROM appended WHERE buffer_id < 10 "
                             "ORDER BY buffer_id").fetchall()  # the first 5 blocks, full
    appended = []
    for last in (growing[699], growing[-1]):
        _up_to(conn, last)
        appended.append(conn.execute("SELECT preprocessor_dl_append('appended', 'growing_up_to')").fetchone()[0])
    assert appended == [300, 300]
    assert _buffers(conn, "appended", label) == _buffers(conn, "grown", label)
    assert _counts(conn, "appended") == _counts(conn, "grown")
    assert conn.execute("SELECT buffer_id, xmin::text FROM appended WHERE buffer_id < 10 "
                        "ORDER BY buffer_id").fetchall() == untouched
    # Every row once; segments within one buffer of each other.
    rows = conn.execute("SELECT num_rows, rows_per_segment, buffer_size FROM appended_summary").fetchone()
    assert rows[0] == ROWS == sum(rows[1]) and max(rows[1]) - min(rows[1]) <= BUFFER
    features = np.concatenate([np.frombuffer(b[2], dtype="<f4").reshape(b[4]) for b in _buffers(conn, "appended", label)])
    source = np.array(conn.execute("SELECT x FROM growing").fetchall(), dtype=np.float32).reshape(ROWS, 3)
    if kind.startswith("training, classes"):
        source = source / np.float32(2.0)
    assert sorted(map(tuple, features)) == sorted(map(tuple, source))


def test_rows_at_or_below_the_last_key_are_not_packed_again(conn, growing):
    _drop(conn, "again")
    _up_to(conn, growing[499])
    conn.execute("SELECT training_preprocessor_dl('growing_up_to', 'again', 'y', 'x', distribution_rules => '2', "
                 "key_column => 'id')")
    notices = []

    def heard(notice) -> None:
        notices.append(notice.message_primary)

    conn.add_notice_handler(heard)
    try:
        assert conn.execute("SELECT preprocessor_dl_append('again', 'growing')").fetchone()[0] == ROWS - 500
        assert conn.execute("SELECT preprocessor_dl_append('again', 'growing')").fetchone()[0] == 0
    finally:
        conn.remove_notice_handler(heard)
    assert any(f"above {growing[-1]}" in n and "nothing to append" in n for n in notices), notices
    assert conn.execute("SELECT num_rows FROM again_summary").fetchone()[0] == ROWS


def _refusal(conn, statement: str, params: tuple = ()) -> psycopg.Error:
    with pytest.raises(psycopg.Error) as caught:
        conn.execute(statement, params)
    return caught.value


def test_a_new_class_is_refused_and_nothing_changes(conn, growing):
    _drop(conn, "classes")
    conn.execute("DROP TABLE IF EXISTS growing_more")
    conn.execute("SELECT training_preprocessor_dl('growing', 'classes', 'y', 'x', distribution_rules => '2', "
                 "key_column => 'id')")
    before = (_buffers(conn, "classes"), _counts(conn, "classes"))
    conn.execute("CREATE TABLE growing_more AS SELECT * FROM growing UNION ALL "
                 "SELECT 100000 + i, ARRAY[1, 2, 3]::real[], CASE WHEN i = 1 THEN 'd' ELSE 'a' END, 0 "
                 "FROM generate_series(1, 3) i")
    error = _refusal(conn, "SELECT preprocessor_dl_append('classes', 'growing_more')")
    assert error.sqlstate == "22023" and "'d'" in error.diag.message_primary
    assert "again" in error.diag.message_hint
    assert (_buffers(conn, "classes"), _counts(conn, "classes")) == before
    # A NULL label is a class of training data too (MADlib's meaning): new to this table.
    conn.execute("UPDATE growing_more SET y = NULL WHERE id = 100001")
    assert _refusal(conn, "SELECT preprocessor_dl_append('classes', 'growing_more')").sqlstate == "22023"
    conn.execute("UPDATE growing_more SET y = 'b' WHERE id = 100001")
    assert conn.execute("SELECT preprocessor_dl_append('classes', 'growing_more')").fetchone()[0] == 3


def test_keys_that_give_no_order_are_refused(conn, growing):
    _drop(conn, "keyed", "unkeyed")
    conn.execute("DROP TABLE IF EXISTS bad_keys")
    conn.execute("CREATE TABLE bad_keys AS SELECT id, x, y, ARRAY[id] AS list FROM growing")
    pack = "SELECT training_preprocessor_dl('bad_keys', 'keyed', 'y', 'x', distribution_rules => '2', key_column => %s)"
    assert _refusal(conn, pack, ("list",)).sqlstate == "42804"
    assert _refusal(conn, pack, ("nope",)).sqlstate == "42703"
    conn.execute("UPDATE bad_keys SET id = NULL WHERE id = %s", (growing[10],))
    assert _refusal(conn, pack, ("id",)).sqlstate == "22004"
    conn.execute("UPDATE bad_keys SET id = %s WHERE id IS NULL", (growing[11],))
    error = _refusal(conn, pack, ("id",))
    assert error.sqlstate == "23505" and str(growing[11]) in error.diag.message_primary
    assert conn.execute("SELECT to_regclass('keyed') IS NULL AND to_regclass('keyed_summary') IS NULL").fetchone()[0]
    conn.execute("SELECT training_preprocessor_dl('growing', 'unkeyed', 'y', 'x', distribution_rules => '2')")
    error = _refusal(conn, "SELECT preprocessor_dl_append('unkeyed', 'growing')")
    assert error.sqlstate == "55000" and "key_column" in error.diag.message_hint
    # The key of the rows appended has the packed key's type.
    conn.execute("SELECT training_preprocessor_dl('growing', 'keyed', 'y', 'x', distribution_rules => '2', "
                 "key_column => 'id')")
    conn.execute("DROP TABLE bad_keys")
    conn.execute("CREATE TABLE bad_keys AS SELECT id::text AS id, x, y FROM growing")
    assert _refusal(conn, "SELECT preprocessor_dl_append('keyed', 'bad_keys')").sqlstate == "42804"


@pytest.fixture(scope="module")
def mst(conn):
    """An MLP for `growing` (model_id 1) in `arch`, and `mst`: it at one learning rate."""
    conn.execute("SELECT load_keras_model('arch', %s::json)", (mlp_json(3, 8, 3),))
    conn.execute("SELECT load_model_selection_table('arch', 'mst', ARRAY[1], ARRAY[%s], "
                 "ARRAY['batch_size=16, epochs=1'])", (ADAM,))


def test_a_model_trains_on_appended_rows_as_on_one_packing_and_no_row_is_appended_under_it(
        conn, extension_dsn, growing, mst):
    """Equal buffers give equal weights; and an append waits for the job training on the
    table to end (refused while it runs)."""
    _drop(conn, "whole", "in_steps")
    conn.execute("DROP TABLE IF EXISTS fit_whole, fit_whole_summary, fit_whole_info, "
                 "fit_steps, fit_steps_summary, fit_steps_info")
    conn.execute("SELECT training_preprocessor_dl('growing', 'whole', 'y', 'x', distribution_rules => '2', "
                 "key_column => 'id')")
    _up_to(conn, growing[599])
    conn.execute("SELECT training_preprocessor_dl('growing_up_to', 'in_steps', 'y', 'x', "
                 "distribution_rules => '2', key_column => 'id')")
    failures = []

    def fit() -> None:
        try:
            with psycopg.connect(extension_dsn, autocommit=True) as other:
                other.execute("SET search_path = public, madlib_mop")
                other.execute("SELECT madlib_keras_fit_multiple_model('in_steps', 'fit_steps', 'mst', 2)")
        except psycopg.Error as error:
            failures.append(error)

    job = threading.Thread(target=fit)
    job.start()
    with psycopg.connect(extension_dsn, autocommit=True) as watcher:
        watcher.execute("SET search_path = public, madlib_mop")
        with held_job(watcher, "fit_steps", 1):
            error = _refusal(conn, "SELECT preprocessor_dl_append('in_steps', 'growing')")
    job.join()
    assert not failures, failures
    assert error.sqlstate == "55006" and "job" in error.diag.message_primary
    assert conn.execute("SELECT preprocessor_dl_append('in_steps', 'growing')").fetchone()[0] == ROWS - 600
    conn.execute("DROP TABLE fit_steps, fit_steps_summary, fit_steps_info")
    for packed, out in (("in_steps", "fit_steps"), ("whole", "fit_whole")):
        conn.execute("SELECT madlib_keras_fit_multiple_model(%s, %s, 'mst', 2)", (packed, out))
    weights = conn.execute("SELECT a.model_weights = b.model_weights, length(a.model_weights) FROM fit_steps a "
                           "JOIN fit_whole b USING (mst_key)").fetchall()
    assert weights == [(True, 4 * (3 * 8 + 8 + 8 * 3 + 3))]


def test_a_job_does_not_go_on_over_rows_appended_since_it_started(conn, extension_dsn, growing, mst):
    _drop(conn, "stopped")
    conn.execute("DROP TABLE IF EXISTS halted, halted_summary, halted_info")
    _up_to(conn, growing[599])
    conn.execute("SELECT training_preprocessor_dl('growing_up_to', 'stopped', 'y', 'x', "
                 "distribution_rules => '2', key_column => 'id')")

    def fit() -> None:
        with psycopg.connect(extension_dsn, autocommit=True) as other:
            other.execute("SET search_path = public, madlib_mop")
            other.execute("SELECT madlib_keras_fit_multiple_model('stopped', 'halted', 'mst', 3)")

    with psycopg.connect(extension_dsn, autocommit=True) as watcher:
        watcher.execute("SET search_path = public, madlib_mop")
        job_id = coordinator_killed_mid_job(watcher, "halted", 2, fit)
    assert conn.execute("SELECT arguments->'packed_rows' FROM jobs WHERE job_id = %s",
                        (job_id,)).fetchone()[0] == {"source_table": 600}
    assert conn.execute("SELECT preprocessor_dl_append('stopped', 'growing')").fetchone()[0] == ROWS - 600
    error = _refusal(conn, "CALL resume(%s)", (job_id,))
    assert error.sqlstate == "55000" and "600 rows" in error.diag.message_primary
    assert "new job" in error.diag.message_hint
    # Nor does a replay of its visits (they read the rows they were recorded on).
    from madlib_mop.errors import MadlibMopError
    from madlib_mop.tools.replay import replay

    with psycopg.connect(extension_dsn, autocommit=True) as own, pytest.raises(MadlibMopError) as refused:
        own.execute("SET search_path = public, madlib_mop")
        replay(own, "halted", 1)
    assert refused.value.sqlstate == "55000"


def test_features_are_computed_for_the_rows_appended_since_and_again_for_new_weights(conn, growing):
    """materialize_features into its own output again: the rows appended since (and the
    block that was not full) are computed, every other buffer is left as it was, and the
    table equals features computed from nothing; new weights of the layers compute every row."""
    _drop(conn, "feature_source", "features", "features_fresh")
    conn.execute("DROP TABLE IF EXISTS feature_arch")
    weights = np.linspace(-1, 1, 3 * 8 + 8 + 8 * 3 + 3, dtype=np.float32)
    conn.execute("SELECT load_keras_model('feature_arch', %s::json, %s)", (mlp_json(3, 8, 3), weights.tobytes()))
    _up_to(conn, growing[399])
    conn.execute("SELECT training_preprocessor_dl('growing_up_to', 'feature_source', 'y', 'x', %s, "
                 "distribution_rules => '2', key_column => 'id')", (BUFFER,))
    materialize = "SELECT materialize_features_byom('feature_arch', 1, 'feature_source', %s, '0')"
    conn.execute(materialize, ("features",))
    kept = conn.execute("SELECT buffer_id, xmin::text FROM features ORDER BY buffer_id").fetchall()
    assert len(kept) == 10  # 5 full blocks of 2 buffers
    _up_to(conn, growing[749])
    conn.execute("SELECT preprocessor_dl_append('feature_source', 'growing_up_to')")
    notices = []

    def heard(notice) -> None:
        notices.append(notice.message_primary)

    conn.add_notice_handler(heard)
    try:
        conn.execute(materialize, ("features",))
    finally:
        conn.remove_notice_handler(heard)
    assert any("750 rows" in n and "350 of them computed now" in n for n in notices), notices
    now = conn.execute("SELECT buffer_id, xmin::text FROM features ORDER BY buffer_id").fetchall()
    assert now[:10] == kept and len(now) >= 19  # 9 full blocks, and the 30 rows of the 10th
    conn.execute(materialize, ("features_fresh",))
    assert _buffers(conn, "features") == _buffers(conn, "features_fresh")
    summary = "SELECT num_rows, rows_per_segment, features_digest FROM {}_summary"
    assert conn.execute(summary.format("features")).fetchone() == conn.execute(summary.format("features_fresh")).fetchone()
    # The layer's weights changed: every row again.
    conn.execute("UPDATE feature_arch SET model_weights = %s", ((weights * 2).tobytes(),))
    conn.execute(materialize, ("features",))
    assert not set(conn.execute("SELECT buffer_id, xmin::text FROM features").fetchall()) & set(now)
    assert conn.execute(summary.format("features")).fetchone()[2] != conn.execute(summary.format("features_fresh")).fetchone()[2]
    _drop(conn, "features_fresh")
    conn.execute(materialize, ("features_fresh",))
    assert _buffers(conn, "features") == _buffers(conn, "features_fresh")
    # Another model's features are not written into it.
    conn.execute("SELECT load_keras_model('feature_arch', %s::json, %s)", (mlp_json(3, 8, 3), weights.tobytes()))
    error = _refusal(conn, "SELECT materialize_features_byom('feature_arch', 2, 'feature_source', 'features', '0')")
    assert error.sqlstate == "42P07"


@pytest.mark.parametrize("key", ["stamp", "label"])
def test_keys_of_time_and_text_append_alike_under_other_session_settings(conn, growing, key):
    """A timestamp key (its last value read back under another DateStyle than it was
    written under) and a text key (in byte order, whatever the collation) append to the
    buffers of one packing."""
    _drop(conn, "by_key", "by_key_whole")
    conn.execute("DROP TABLE IF EXISTS keyed_rows")
    conn.execute("CREATE TABLE keyed_rows AS SELECT timestamptz '2026-01-01 00:00:00+00' + id * interval '1.5 s' "
                 "AS stamp, 'k' || lpad(id::text, 8, '0') || CASE WHEN id % 2 = 0 THEN 'B' ELSE 'a' END AS label, "
                 "x, y, id FROM growing")
    conn.execute("CREATE VIEW keyed_rows_up_to AS SELECT * FROM keyed_rows "
                 "WHERE id <= current_setting('test.up_to')::bigint")
    pack = ("SELECT training_preprocessor_dl({}, {}, 'y', 'x', %s, distribution_rules => '2', "
            "key_column => %s)")
    conn.execute(sql.SQL(pack).format(sql.Literal("keyed_rows"), sql.Literal("by_key_whole")), (BUFFER, key))
    _up_to(conn, growing[449])
    conn.execute("SET DateStyle = 'ISO, MDY'")
    conn.execute(sql.SQL(pack).format(sql.Literal("keyed_rows_up_to"), sql.Literal("by_key")), (BUFFER, key))
    conn.execute("SET DateStyle = 'SQL, DMY'")
    try:
        assert conn.execute("SELECT preprocessor_dl_append('by_key', 'keyed_rows')").fetchone()[0] == ROWS - 450
        assert conn.execute("SELECT preprocessor_dl_append('by_key', 'keyed_rows')").fetchone()[0] == 0
        assert conn.execute("SHOW DateStyle").fetchone()[0] == "SQL, DMY"
    finally:
        conn.execute("RESET DateStyle")
    assert _buffers(conn, "by_key") == _buffers(conn, "by_key_whole")
    conn.execute("DROP VIEW keyed_rows_up_to")
