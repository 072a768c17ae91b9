"""The README's SQL session, and the guide's sessions, run as written."""

from __future__ import annotations


import numpy as np

from madlib_mop.tools.demo import load_iris
from tests.docs import block, page


def _readme_session() -> str:
    return block(page("README.md"), "A session, after `make demo`")


def test_readme_session_runs(conn):
    load_iris(conn)  # what make demo loads: madlib_mop_demo.iris
    # One statement at a time, as psql runs them: the fit's workers are other sessions and
    # see only what is committed.
    for statement in _readme_session().split(";\n"):
        if statement.strip():
            conn.execute(statement)
    rows = conn.execute("SELECT mst_key, compile_params, fit_params FROM mst ORDER BY 1").fetchall()
    assert len(rows) == 4 and rows[0][2] == "batch_size=16,epochs=1"
    assert conn.execute("SELECT num_rows FROM iris_packed_summary").fetchone()[0] == 150
    assert conn.execute("SELECT name FROM model_arch").fetchone()[0] == "mlp"
    assert conn.execute("SELECT count(*) FROM iris_models_info i, iris_models_summary s "
                        "WHERE i.subepochs_done = 3 * s.num_segments").fetchone()[0] == 4




def test_the_guide_has_the_readmes_session_and_what_follows_it_runs(conn):
    """The guide's model selection starts with the README's session; the README's next
    statements (evaluate, predict, importance) run on its job."""
    assert block(page("model-selection.md"), "# Model selection from SQL") == _readme_session()
    if conn.execute("SELECT to_regclass('public.iris_models')").fetchone()[0] is None:
        test_readme_session_runs(conn)
    results = [conn.execute(statement).fetchall()
               for statement in block(page("README.md"), "Then, for example").split(";\n") if statement.strip()]
    _, (loss_metric,), _, predicted, importance = results
    assert loss_metric[0] > 0 and 0 <= loss_metric[1] <= 1
    assert len(predicted) == 5 and {row[2] for row in predicted} <= {"setosa", "versicolor",
                                                                       "virginica"}
    assert {name for name, _ in importance} == {"learning_rate", "batch_size"}


def test_readme_after_the_search_runs(conn):
    """The section's statements, on the session's job (run above, or here if alone)."""
    if conn.execute("SELECT to_regclass('public.iris_models')").fetchone()[0] is None:
        test_readme_session_runs(conn)
    conn.execute("SET search_path = public, madlib_mop")
    results = [conn.execute(statement).fetchall()
               for statement in block(page("after-search.md"), "# After the search").split(";\n") if statement.strip()]
    importance, front, deployed, _, redeployed, rolled_back, registry, history, values = results
    assert {name for name, _ in importance} == {"learning_rate", "batch_size"}
    assert front and all(len(v) == 2 for _, v in front)
    assert (deployed, redeployed, rolled_back) == ([(1,)], [(2,)], [(1,)])
    assert [(r[1], r[4], r[6]) for r in registry] == [(1, "best_score", False), (2, "mst_key", True)]
    assert conn.execute("SELECT count(DISTINCT id) FROM iris_scored").fetchone()[0] == 150
    assert len(history) == len(values) == 4 * 3 and history[-1][5] == min(v[3] for v in values)


def test_readme_transfer_learning_runs(conn):
    """The section's statements, on the digits `make demo` loads: a base CNN, heads on two
    of its layers, staged, and a layer's features materialized."""
    from madlib_mop.tools.demo import load_digits

    if conn.execute("SELECT to_regclass('madlib_mop_demo.digits')").fetchone()[0] is None:
        load_digits(conn)
    notices: list[str] = []
    conn.add_notice_handler(lambda diag: notices.append(diag.message_primary))
    results: list = []
    for statement in block(page("transfer-learning.md"), "# Transfer learning").split(";\n"):
        if statement.strip():
            cursor = conn.execute(statement)
            results.append(cursor.fetchall() if cursor.description else None)
    assert conn.execute("SELECT model_id, name FROM transfer_arch ORDER BY 1").fetchall() == [
        (1, "conv_2 + linear"), (2, "conv_2 + mlp_32"), (3, "dense_1 + linear"), (4, "dense_1 + mlp_32")]
    assert any(n.startswith("8 of the 8 models train on the features of their frozen first layers")
               and "3 frozen layers: mst_key 1, 2, 3, 4; 5 frozen layers: mst_key 5, 6, 7, 8" in n
               for n in notices), notices
    ranking = results[-4]
    assert len(ranking) == 8 and max(float(r[3]) for r in ranking) > 0.8
    assert conn.execute("SELECT count(*) FROM transfer_models_mop_visits "
                        "WHERE result->'staged'->>'computed' = 'true'").fetchone()[0] > 0
    assert results[-1] == [([64], "public.base_cnn, layers up to dense_1")]
    assert conn.execute("SELECT num_rows FROM new_packed_summary").fetchone() == \
        conn.execute("SELECT sum(image_shape[1]) FROM new_dense_1").fetchone()
    # Trained whole, the same job ends within float rounding of the staged weights (oneDNN's
    # convolutions round a row by the number of rows computed with it), its frozen weights
    # unchanged and equal.
    conn.execute("SET madlib_mop.stage_frozen_layers = off")
    conn.execute("SELECT madlib_keras_fit_multiple_model('new_packed', 'transfer_whole', 'transfer_mst', 4, "
                 "FALSE, 'new_valid')")
    conn.execute("RESET madlib_mop.stage_frozen_layers")
    frozen_bytes = 4 * (3 * 3 * 1 * 16 + 16 + 3 * 3 * 16 * 32 + 32)  # conv_1, conv_2
    for staged, whole, arch in conn.execute(
            "SELECT s.model_weights, w.model_weights, a.model_weights FROM transfer_models s "
            "JOIN transfer_whole w USING (mst_key) JOIN transfer_models_info i USING (mst_key) "
            "JOIN transfer_arch a USING (model_id)").fetchall():
        staged, whole = np.frombuffer(staged, "<f4"), np.frombuffer(whole, "<f4")
        assert bytes(staged[:frozen_bytes // 4]) == bytes(whole[:frozen_bytes // 4]) == bytes(arch)[:frozen_bytes]
        assert np.abs(staged - whole).max() < 1e-4




def test_readme_custom_functions_run(conn, extension_dsn):
    """The section's Python (as a notebook runs it: module __main__) loads the loss; its SQL
    trains and evaluates with it and with a top-k metric loaded from SQL."""
    if conn.execute("SELECT to_regclass('public.iris_packed')").fetchone()[0] is None:
        test_readme_session_runs(conn)
    exec(compile(block(page("custom-functions.md"), "# Custom losses", "python"), "custom-functions.md", "exec"),
         {"__name__": "__main__", "dsn": extension_dsn})
    results = [conn.execute(statement).fetchall() if statement.strip().startswith("SELECT")
               else conn.execute(statement) and None
               for statement in block(page("custom-functions.md"), "# Custom losses").split(";\n")
               if statement.strip()]
    functions, evaluation = results[2], results[-1]
    assert [(r[0], r[1]) for r in functions] == [(1, "focal_crossentropy"), (2, "top_2_accuracy")]
    (loss_type, metrics), = evaluation
    assert loss_type == "focal_crossentropy" and 0.0 < metrics["top_2_accuracy"] <= 1.0
    assert 0.0 < metrics["loss"] < 2.0


def test_readme_cycles_run(conn):
    """The README's two cycles (the guide's block, the same), after its session: the rows
    so far, then a day's more, each cycle recorded."""
    assert block(page("README.md"), "### Data that grows") == block(page("growing-data.md"), "## Cycles")
    if conn.execute("SELECT to_regclass('public.iris_models')").fetchone()[0] is None:
        test_readme_session_runs(conn)
    conn.execute("SET search_path = public, madlib_mop")
    results = [conn.execute(statement) for statement in
               block(page("README.md"), "### Data that grows").split(";\n") if statement.strip()]
    cycles = results[-1].fetchall()
    assert [row[:5] for row in cycles] == [(1, 100, 0, 4, 0), (2, 150, 50, 2, 2)]
    assert all(row[6] is not None and row[7] > 0 for row in cycles)
    assert conn.execute("SELECT count(*) FROM iris_nightly_c2_info").fetchone()[0] == 2
