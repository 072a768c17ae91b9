"""The README's SQL session runs as written."""

from __future__ import annotations

import re

from madlib_mop.tools.demo import load_iris
from madlib_mop.tools.embedded import REPO_ROOT


def _readme_session() -> str:
    text = (REPO_ROOT / "README.md").read_text()
    start = text.index("A session, after `make demo`")
    return re.search(r"```sql\n(.*?)```", text[start:], re.S).group(1)


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


def _readme_block(heading: str) -> str:
    text = (REPO_ROOT / "README.md").read_text()
    return re.search(r"```sql\n(.*?)```", text[text.index(heading):], re.S).group(1)


def test_readme_after_the_search_runs(conn):
    """The section's statements, on the session's job (run above, or here if alone)."""
    if conn.execute("SELECT to_regclass('public.iris_models')").fetchone()[0] is None:
        test_readme_session_runs(conn)
    conn.execute("SET search_path = public, madlib_mop")
    results = [conn.execute(statement).fetchall()
               for statement in _readme_block("## After the search").split(";\n") if statement.strip()]
    importance, front, deployed, _, redeployed, rolled_back, registry, history, values = results
    assert {name for name, _ in importance} == {"learning_rate", "batch_size"}
    assert front and all(len(v) == 2 for _, v in front)
    assert (deployed, redeployed, rolled_back) == ([(1,)], [(2,)], [(1,)])
    assert [(r[1], r[4], r[6]) for r in registry] == [(1, "best_score", False), (2, "mst_key", True)]
    assert conn.execute("SELECT count(DISTINCT id) FROM iris_scored").fetchone()[0] == 150
    assert len(history) == len(values) == 4 * 3 and history[-1][5] == min(v[3] for v in values)
