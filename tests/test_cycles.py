"""Model selection in cycles over a growing table (CALL run_cycle): the new rows packed,
the best models of the last cycle carried over from their weights with new configurations,
each cycle recorded; a stopped cycle continues to the same bits."""

from __future__ import annotations

import numpy as np
import psycopg
import pytest

from tests.conftest import coordinator_killed_mid_job, mlp_json

ROWS = 900
LEARNING_RATES = (0.003, 0.01, 0.03)


def _compile(rate: float) -> str:
    return f"loss='categorical_crossentropy', optimizer='Adam(learning_rate={rate})', metrics=['accuracy']"


@pytest.fixture(scope="module")
def grown(conn):
    """`readings` (id, x real[4], label text) and its held-out rows `readings_valid`, seen
    through views up to the key `test.up_to`; an MLP `arch`, `mst` (3 learning rates) and
    `mst_more` (one more configuration)."""
    conn.execute("SET search_path = public, madlib_mop")
    rng = np.random.default_rng(11)
    x = rng.normal(size=(ROWS, 4)).astype(np.float32)
    label = np.where(x[:, 0] + x[:, 1] > 0.5, "high", np.where(x[:, 2] > 0, "mid", "low"))
    for table, ids in (("readings", [i for i in range(ROWS) if i % 4]), ("readings_valid", range(0, ROWS, 4))):
        conn.execute(f"CREATE TABLE {table} (id int, x real[], label text)")
        with conn.cursor().copy(f"COPY {table} FROM STDIN") as copy:
            for i in ids:
                copy.write_row((i, [float(v) for v in x[i]], str(label[i])))
        conn.execute(f"CREATE VIEW {table}_up_to AS SELECT * FROM {table} "
                     "WHERE id < current_setting('test.up_to')::int")
    conn.execute("SELECT load_keras_model('arch', %s::json)", (mlp_json(4, 8, 3),))
    conn.execute("SELECT load_model_selection_table('arch', 'mst', ARRAY[1], %s, ARRAY['batch_size=16'])",
                 ([_compile(r) for r in LEARNING_RATES],))
    conn.execute("SELECT load_model_selection_table('arch', 'mst_more', ARRAY[1], %s, ARRAY['batch_size=32'])",
                 ([_compile(0.01)],))


def _packed(conn, name: str) -> None:
    """<name>_packed and <name>_valid_packed: the rows below id 600, packed in key order."""
    _up_to(conn, 600)
    conn.execute("SELECT training_preprocessor_dl('readings_up_to', %s, 'label', 'x', "
                 "distribution_rules => '2', key_column => 'id')", (f"{name}_packed",))
    conn.execute("SELECT validation_preprocessor_dl('readings_valid_up_to', %s, 'label', 'x', %s, "
                 "key_column => 'id')", (f"{name}_valid_packed", f"{name}_packed"))


def _up_to(conn, key: int) -> None:
    conn.execute("SELECT set_config('test.up_to', %s, false)", (str(key),))


def _cycle(conn, name: str, mst: str | None, top_k: int = 2) -> None:
    conn.execute("CALL run_cycle(%s, %s, 'readings_up_to', %s, 2, %s, 'readings_valid_up_to', %s)",
                 (name, f"{name}_packed", mst, f"{name}_valid_packed", top_k))


def _weights(conn, table: str) -> dict:
    return dict(conn.execute(f"SELECT mst_key, model_weights FROM {table} ORDER BY mst_key").fetchall())


def test_two_cycles_carry_the_best_models_over_and_record_each_cycle(conn, grown):
    _packed(conn, "nightly")
    _cycle(conn, "nightly", "mst")
    first = conn.execute("SELECT mst_key, validation_loss_final FROM nightly_c1_info "
                         "ORDER BY validation_loss_final, mst_key").fetchall()
    _up_to(conn, 800)
    _cycle(conn, "nightly", "mst_more")
    rows = conn.execute("SELECT cycle, state, num_rows, appended, configurations, carried_over, objective, "
                        "best_mst_key, model_output_table FROM cycle_results WHERE cycle_name = 'nightly' "
                        "ORDER BY cycle").fetchall()
    assert rows[0][:6] == (1, "finished", 450, 0, 3, 0)  # three of every four ids train
    assert rows[1][:6] == (2, "finished", 600, 150, 3, 2)
    assert rows[0][7] == first[0][0] and "loss" in rows[0][6]
    assert [r[8] for r in rows] == ["nightly_c1", "nightly_c2"]
    # The carried models start from cycle 1's final weights of its two best, and keep their
    # configurations; the new configuration comes after them.
    carried = conn.execute("SELECT carried FROM cycles WHERE cycle_name = 'nightly' AND cycle = 2").fetchone()[0]
    assert [c["from_mst_key"] for c in carried] == [m for m, _ in first[:2]]
    assert [c["mst_key"] for c in carried] == [1, 2]
    final = _weights(conn, "nightly_c1")
    for entry in carried:
        start = conn.execute("SELECT model_weights FROM arch WHERE model_id = %s", (entry["model_id"],)).fetchone()[0]
        assert start == final[entry["from_mst_key"]]
    configs = conn.execute("SELECT mst_key, model_id, compile_params, fit_params FROM nightly_c2_mst "
                           "ORDER BY mst_key").fetchall()
    before = dict(conn.execute("SELECT mst_key, compile_params FROM nightly_c1_mst").fetchall())
    assert [c[2] for c in configs[:2]] == [before[m] for m, _ in first[:2]]
    assert [c[1] for c in configs[:2]] == [c["model_id"] for c in carried]
    assert configs[2][1:] == (1, _compile(0.01), "batch_size=32")
    # Cycle 2's job trained on the grown data.
    assert conn.execute("SELECT j.arguments->'packed_rows' FROM jobs j JOIN cycles c USING (job_id) "
                        "WHERE c.cycle_name = 'nightly' AND c.cycle = 2").fetchone()[0] == \
        {"source_table": 600, "validation_table": 200}


def test_a_stopped_cycle_continues_to_the_bits_of_one_run(conn, extension_dsn, grown):
    """The same two cycles under another name, over their own packed tables, the second
    cycle's job killed mid-way and the cycle called again: the weights of the first name's
    cycles, bit for bit."""
    if conn.execute("SELECT count(*) FROM cycles WHERE cycle_name = 'nightly' AND state = 'finished'"
                    ).fetchone()[0] < 2:
        pytest.skip("needs test_two_cycles_carry_the_best_models_over_and_record_each_cycle")
    _packed(conn, "again")
    _cycle(conn, "again", "mst")
    assert _weights(conn, "again_c1") == _weights(conn, "nightly_c1")
    _up_to(conn, 800)

    def cycle() -> None:
        with psycopg.connect(extension_dsn, autocommit=True) as other:
            other.execute("SET search_path = public, madlib_mop")
            _up_to(other, 800)
            _cycle(other, "again", "mst_more")

    with psycopg.connect(extension_dsn, autocommit=True) as watcher:
        watcher.execute("SET search_path = public, madlib_mop")
        coordinator_killed_mid_job(watcher, "again_c2", 4, cycle)
    assert conn.execute("SELECT state FROM cycles WHERE cycle_name = 'again' AND cycle = 2").fetchone()[0] == "training"
    notices = []

    def heard(notice) -> None:
        notices.append(notice.message_primary)

    conn.add_notice_handler(heard)
    try:
        _cycle(conn, "again", "mst_more")
    finally:
        conn.remove_notice_handler(heard)
    assert any("continuing cycle 2 of again" in n for n in notices), notices
    assert any("continuing job" in n for n in notices), notices
    assert _weights(conn, "again_c2") == _weights(conn, "nightly_c2")
    assert conn.execute("SELECT count(*) FROM cycles WHERE cycle_name = 'again'").fetchone()[0] == 2
    # A cycle whose data and configurations are committed is continued with its own
    # arguments only; deleting its row abandons it.
    conn.execute("INSERT INTO cycles (cycle_name, cycle, arguments) VALUES ('again', 3, '{}')")
    conn.execute("UPDATE cycles SET state = 'training' WHERE cycle_name = 'again' AND cycle = 3")
    error = _refusal(conn, "CALL run_cycle('again', 'again_packed', 'readings_up_to', 'mst', 1)")
    assert error.sqlstate == "55000" and "other arguments" in error.diag.message_primary
    assert "DELETE FROM" in error.diag.message_hint
    conn.execute("DELETE FROM cycles WHERE cycle_name = 'again' AND cycle = 3")


def test_a_cycle_that_stopped_before_its_data_takes_the_next_calls_arguments(conn, grown):
    """A refusal after the cycle's row is written (here: its packed table has no key) leaves
    the cycle `packing`; the next call, with other arguments, goes on with those."""
    _packed(conn, "later")
    conn.execute("SELECT training_preprocessor_dl('readings_up_to', 'unkeyed', 'label', 'x', "
                 "distribution_rules => '2')")
    error = _refusal(conn, "CALL run_cycle('later', 'unkeyed', 'readings_up_to', 'mst', 1)")
    assert error.sqlstate == "55000"
    assert conn.execute("SELECT state FROM cycles WHERE cycle_name = 'later'").fetchall() == [("packing",)]
    conn.execute("CALL run_cycle('later', 'later_packed', 'readings_up_to', 'mst', 1)")
    assert conn.execute("SELECT cycle, state, arguments->>'packed_table' FROM cycles WHERE cycle_name = 'later'"
                        ).fetchall() == [(1, "finished", "later_packed")]
    # Its rows deleted and its outputs dropped, the name starts again: the finished job of the
    # dropped output is not taken for this cycle's.
    conn.execute("DELETE FROM cycles WHERE cycle_name = 'later'")
    conn.execute("DROP TABLE later_c1, later_c1_summary, later_c1_info, later_c1_mst, later_c1_mst_summary")
    conn.execute("CALL run_cycle('later', 'later_packed', 'readings_up_to', 'mst', 1)")
    assert conn.execute("SELECT count(*) FROM later_c1_info").fetchone()[0] == 3
    assert conn.execute("SELECT state FROM cycles WHERE cycle_name = 'later'").fetchall() == [("finished",)]


def _refusal(conn, statement: str, params: tuple = ()) -> psycopg.Error:
    with pytest.raises(psycopg.Error) as caught:
        conn.execute(statement, params)
    return caught.value


def test_a_cycle_refuses_what_it_cannot_do(conn, grown):
    error = _refusal(conn, "SELECT model_selection_cycle('once', 'nightly_packed', 'readings_up_to', 'mst', 1)")
    assert error.sqlstate == "25001" and "CALL run_cycle" in error.diag.message_hint
    error = _refusal(conn, "CALL run_cycle('empty', 'nightly_packed', 'readings_up_to', NULL, 1)")
    assert error.sqlstate == "22023" and "first cycle" in error.diag.message_hint
    assert conn.execute("SELECT count(*) FROM cycles WHERE cycle_name IN ('once', 'empty')").fetchone()[0] == 0
    error = _refusal(conn, "CALL run_cycle('neg', 'nightly_packed', 'readings_up_to', 'mst', 1, top_k => -1)")
    assert error.sqlstate == "22023"
