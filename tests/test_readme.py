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
