"""The analyst's client without the server's runtime: `pip install 'madlib_mop[client]'`
installs no TensorFlow, Keras, Optuna, scikit-learn or dill (the `server` extra), and
every module of the client, the `madlib-mop` command and its TensorBoard event files work
in a Python where those cannot be imported."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SERVER_ONLY = ("tensorflow", "keras", "optuna", "sklearn", "dill")


def _requirement_names(requirements: list[str]) -> set[str]:
    return {r.split("==")[0].split("[")[0].strip().lower() for r in requirements}


def test_the_client_extra_installs_none_of_the_servers_runtime():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    client = _requirement_names(project["dependencies"] + project["optional-dependencies"]["client"])
    server = _requirement_names(project["optional-dependencies"]["server"])
    assert {"tensorflow", "keras", "optuna", "scikit-learn", "dill"} <= server
    assert client & server == set()


def test_the_client_runs_where_the_servers_runtime_cannot_be_imported(tmp_path):
    script = textwrap.dedent(f"""
        import importlib.abc, sys

        class Refused(importlib.abc.MetaPathFinder):
            def find_spec(self, name, path, target=None):
                if name.split(".")[0] in {SERVER_ONLY!r}:
                    raise ImportError(f"{{name}}: not installed on this client")

        sys.meta_path.insert(0, Refused())
        import pandas as pd
        from madlib_mop.client import cli, dashboard, frames, plots, progress, report, session
        from madlib_mop.client.tensorboard import read_scalars, write_run

        curves = pd.DataFrame({{"mst_key": [4, 4, 4], "split": ["training", "training", "validation"],
                               "metric": ["loss", "loss", "loss"], "iteration": [1, 2, 2],
                               "value": [0.75, 0.5, 0.625]}})  # float32 in event files
        run = write_run(r"{tmp_path}" + "/mst_key_4", curves, {{"mst_key": 4, "learning_rate": 0.01}})
        assert read_scalars(run / "train") == {{"epoch_loss": [(1, 0.75), (2, 0.5)]}}, read_scalars(run / "train")
        assert read_scalars(run / "validation") == {{"epoch_loss": [(2, 0.625)]}}
        try:
            cli.main(["--help"])
        except SystemExit as done:
            assert done.code == 0
        loaded = {{m.split(".")[0] for m in sys.modules}}
        assert not loaded & set({SERVER_ONLY!r}), loaded & set({SERVER_ONLY!r})
        print("client ok")
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "client ok" in done.stdout
    assert "usage: madlib-mop" in done.stdout
