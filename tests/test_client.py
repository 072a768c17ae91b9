"""madlib_mop.client and the `madlib-mop` command against the real server: calls with
keyword arguments, the server's errors, a fit with its progress bar, DataFrames equal to the
tables, Ctrl-C cancelling a fit that then resumes, and the CLI's jobs / watch / report /
tensorboard."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import psycopg
import pytest

from madlib_mop.client import Client, JobCancelled, ServerError
from madlib_mop.tools.demo import load_iris
from tests.conftest import REPO_ROOT

ARCH = {"class_name": "Sequential", "config": {"name": "mlp", "layers": [
    {"class_name": "Dense", "config": {"units": 8, "activation": "relu", "batch_input_shape": [None, 4]}},
    {"class_name": "Dense", "config": {"units": 3, "activation": "softmax"}}]}}
CLI = [sys.executable, "-m", "madlib_mop.client.cli"]


@pytest.fixture(scope="module")
def mop(extension_dsn, conn):
    iris = load_iris(conn)  # what make demo loads: madlib_mop_demo.iris
    client = Client(extension_dsn)
    client.training_preprocessor_dl(iris, "iris_packed", "class_text", "attributes",
                                    distribution_rules="2")
    client.validation_preprocessor_dl(source_table=iris, output_table="iris_valid",
                                      dependent_varname="class_text", independent_varname="attributes",
                                      training_preprocessor_table="iris_packed")
    client.load_keras_model(keras_model_arch_table="arch", model_arch=ARCH, name="mlp")
    # Grids given as Python data are sent as JSON, which generate_model_configs reads.
    client.generate_model_configs(
        model_arch_table="arch", model_selection_table="mst", model_id_list=[1],
        compile_params_grid={"loss": ["categorical_crossentropy"],
                             "optimizer_params_list": [{"optimizer": ["Adam"], "lr": [0.001, 0.01]}],
                             "metrics": ["accuracy"]},
        fit_params_grid={"batch_size": [16, 32]})
    yield client
    client.close()


@pytest.fixture(scope="module")
def fitted(mop, extension_dsn):
    """One fit through the client, with its progress bar (stderr) captured."""
    env = dict(os.environ, MADLIB_MOP_DSN=extension_dsn)
    # (Python's own Ctrl-C handler, also where the tests run in a background job, whose
    # shell makes its children ignore SIGINT)
    script = ("import signal\nsignal.signal(signal.SIGINT, signal.default_int_handler)\n"
              "from madlib_mop.client import Client\n"
              "import os\n"
              "c = Client(os.environ['MADLIB_MOP_DSN'])\n"
              "c.madlib_keras_fit_multiple_model(source_table='iris_packed', model_output_table='fitted',"
              " model_selection_table='mst', num_iterations=6, validation_table='iris_valid',"
              " metrics_compute_frequency=2)\n")
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True,
                          timeout=300, cwd=REPO_ROOT)
    assert done.returncode == 0, done.stderr
    return mop.job("fitted"), done.stderr


def test_calls_take_keywords_and_return_values(mop, extension_dsn):
    assert mop.version().startswith("madlib_mop ")  # a scalar function: its value
    assert "madlib_keras_fit_multiple_model" in dir(mop)
    assert "if_output_exists" in mop.help("madlib_keras_fit_multiple_model")
    with psycopg.connect(extension_dsn) as conn:
        configs = conn.execute("SELECT compile_params, fit_params FROM public.mst").fetchall()
        ids = conn.execute("SELECT model_id, name FROM public.arch").fetchall()
    assert len(configs) == 4 and ids == [(1, "mlp")]
    assert {f for _, f in configs} == {"batch_size=16", "batch_size=32"}
    schedule = mop.call("hyperband_schedule", "hb", 9, eta=3)  # void: None
    assert schedule is None
    servers = mop.check_segment_servers()  # set-returning: a DataFrame (no servers here)
    assert servers.empty


def test_server_errors_carry_sqlstate_and_hint(mop):
    with pytest.raises(ServerError) as error:
        mop.madlib_keras_fit_multiple_model(source_table="no_such_table", model_output_table="x",
                                            model_selection_table="mst", num_iterations=1)
    assert error.value.sqlstate == "42P01"
    assert "source_table: Input table 'no_such_table' does not exist" in error.value.message
    assert error.value.hint and "existing table" in error.value.hint
    with pytest.raises(TypeError, match="takes no such arguments"):
        mop.madlib_keras_fit_multiple_model(no_such_argument=1)
    with pytest.raises(AttributeError):
        mop.no_such_function()


def test_a_fit_shows_progress_and_its_frames_equal_the_tables(fitted, mop, extension_dsn):
    job, stderr = fitted
    assert job.state == "finished"
    # the bar: the job, epochs done of the total, the best metric so far
    assert f"job {job.job_id}" in stderr and "6.00/6.00 epochs" in stderr, stderr
    assert "best validation accuracy" in stderr, stderr
    with psycopg.connect(extension_dsn) as conn:
        info = {r[0]: r for r in conn.execute(
            "SELECT mst_key, validation_metrics_final, training_loss_final, training_seconds, "
            "metrics_iters, validation_metrics_all, training_metrics_all, compile_params "
            "FROM public.fitted_info").fetchall()}
        visits = conn.execute("SELECT mst_key, step, segment, (result->>'rows')::int "
                              "FROM public.fitted_mop_visits ORDER BY mst_key, step").fetchall()
    board = mop.leaderboard("fitted")
    assert sorted(board["mst_key"]) == sorted(info)
    assert list(board["validation_metrics_final"]) == sorted(
        (r[1] for r in info.values()), reverse=True)  # best first, by validation accuracy
    for _, row in board.iterrows():
        expected = info[row["mst_key"]]
        assert row["training_loss_final"] == expected[2]
        assert row["training_seconds"] == expected[3]
        assert row["compile_params"] == expected[7]
        assert row["optimizer"] == "Adam" and row["learning_rate"] in (0.001, 0.01)
        assert row["batch_size"] in (16, 32)
    curves = mop.curves(job.job_id)
    for key, expected in info.items():
        mine = curves[curves["mst_key"] == key]
        for split, column in (("validation", 5), ("training", 6)):
            for metric, values in expected[column].items():
                got = mine[(mine["split"] == split) & (mine["metric"] == metric)]
                assert list(got["iteration"]) == expected[4] == [2, 4, 6]
                assert list(got["value"]) == values
    frame = mop.visits(job.job_id)
    assert [tuple(r) for r in frame[["mst_key", "step", "segment", "rows"]].itertuples(index=False)] == visits
    assert (frame["finished"] >= frame["started"]).all()
    history = mop.optimization_history("fitted")  # the view, for this job
    with psycopg.connect(extension_dsn) as conn:
        rows = conn.execute("SELECT report, mst_key, value, best_value FROM madlib_mop.optimization_history "
                            "WHERE job_id = %s ORDER BY report", (job.job_id,)).fetchall()
    assert [tuple(r) for r in history[["report", "mst_key", "value", "best_value"]].itertuples(index=False)] == rows
    assert len(rows) == 4 * 3  # 4 models, validated at iterations 2, 4 and 6
    jobs = mop.jobs()
    assert jobs.loc[jobs["job_id"] == job.job_id, "state"].item() == "finished"


def test_ctrl_c_cancels_the_fit_and_it_resumes(mop, extension_dsn):
    """SIGINT to a Python process fitting through the client: the job is cancelled on the
    server (state interrupted) and the message says how to continue; resume finishes it."""
    env = dict(os.environ, MADLIB_MOP_DSN=extension_dsn)
    # (Python's own Ctrl-C handler, also where the tests run in a background job, whose
    # shell makes its children ignore SIGINT)
    script = ("import signal\nsignal.signal(signal.SIGINT, signal.default_int_handler)\n"
              "from madlib_mop.client import Client\n"
              "import os\n"
              "c = Client(os.environ['MADLIB_MOP_DSN'])\n"
              "c.fit_multiple(source_table='iris_packed', model_output_table='cancelled',"
              " model_selection_table='mst', num_iterations=60)\n")
    process = subprocess.Popen([sys.executable, "-c", script], env=env, cwd=REPO_ROOT,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 180
        with psycopg.connect(extension_dsn, autocommit=True) as conn:
            while time.monotonic() < deadline:
                done = conn.execute("SELECT max(subepochs_done) FROM madlib_mop.jobs WHERE "
                                    "model_output_table = 'public.cancelled'").fetchone()[0]
                if done and done >= 8:
                    break
                assert process.poll() is None, process.communicate()
                time.sleep(0.2)
            process.send_signal(signal.SIGINT)
            _, stderr = process.communicate(timeout=120)
            state, job_id, done = conn.execute(
                "SELECT state, job_id, subepochs_done FROM madlib_mop.jobs "
                "WHERE model_output_table = 'public.cancelled'").fetchone()
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode != 0, (state, stderr)
    assert state == "interrupted", stderr
    assert f"job {job_id} cancelled after" in stderr, stderr
    assert f"mop.resume({job_id})" in stderr and f"CALL madlib_mop.resume({job_id})" in stderr
    assert 8 <= done < 60 * 4 * 2
    mop.progress = False
    try:
        mop.resume(job_id)
    finally:
        mop.progress = True
    assert mop.job(job_id).state == "finished"


def test_cancelled_exception_names_the_job():
    error = JobCancelled(7, "madlib_mop", " after 1 of 2 epochs")
    assert isinstance(error, KeyboardInterrupt)
    assert "job 7 cancelled after 1 of 2 epochs" in str(error)


# ---- the command ------------------------------------------------------------------------------
def _cli(dsn, *args, env_dsn=False, timeout=180):
    env = dict(os.environ)
    env.pop("MADLIB_MOP_DSN", None)
    argv = list(CLI)
    if env_dsn:
        env["MADLIB_MOP_DSN"] = dsn
    else:
        argv += ["--dsn", dsn]
    return subprocess.run(argv + list(args), env=env, capture_output=True, text=True,
                          timeout=timeout, cwd=REPO_ROOT)


def test_cli_jobs_and_watch(fitted, extension_dsn):
    job, _ = fitted
    listed = _cli(extension_dsn, "jobs", env_dsn=True)
    assert listed.returncode == 0, listed.stderr
    line = next(row for row in listed.stdout.splitlines() if row.split()[:1] == [str(job.job_id)])
    assert "finished" in line and "public.fitted" in line
    watched = _cli(extension_dsn, "watch", str(job.job_id))
    assert watched.returncode == 0, watched.stderr
    assert f"job {job.job_id}: finished" in watched.stdout
    by_name = _cli(extension_dsn, "watch", "fitted")
    assert by_name.returncode == 0 and f"job {job.job_id}: finished" in by_name.stdout
    missing = _cli(extension_dsn, "watch", "999999")
    assert missing.returncode == 2 and "no job '999999'" in missing.stderr


def test_cli_reads_the_pg_environment(fitted, extension_dsn):
    from psycopg.conninfo import conninfo_to_dict

    parts = conninfo_to_dict(extension_dsn)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PG") and k != "MADLIB_MOP_DSN"}
    names = {"host": "PGHOST", "port": "PGPORT", "dbname": "PGDATABASE", "user": "PGUSER",
             "password": "PGPASSWORD", "passfile": "PGPASSFILE"}
    env.update({names[k]: str(v) for k, v in parts.items() if k in names})
    done = subprocess.run(CLI + ["jobs"], env=env, capture_output=True, text=True, timeout=120,
                          cwd=REPO_ROOT)
    assert done.returncode == 0, done.stderr
    assert "public.fitted" in done.stdout


def test_cli_report_writes_pngs_and_a_summary(fitted, extension_dsn, tmp_path):
    from PIL import Image

    job, _ = fitted
    out = tmp_path / "report"
    done = _cli(extension_dsn, "report", str(job.job_id), "--out", str(out), "--format", "both")
    assert done.returncode == 0, done.stderr
    for name in ("learning_curves.png", "schedule.png", "hyperparameters.png", "importance.png",
                 "pareto_front.png", "optimization_history.png"):
        path = out / name
        assert path.stat().st_size > 10_000, name
        with Image.open(path) as image:
            width, height = image.size
            assert 900 <= width <= 1600 and 300 <= height <= 1400, (name, image.size)
            # not a blank canvas: the plot has many colours
            assert len(set(map(tuple, np.asarray(image.convert("RGB")).reshape(-1, 3)[::97].tolist()))) > 20
    summary = (out / "report.md").read_text()
    assert f"job {job.job_id}" in summary.lower() and "learning_curves.png" in summary
    for key in mop_keys(extension_dsn):
        assert f"| {key} |" in summary
    assert "<img" in (out / "report.html").read_text()


def mop_keys(dsn) -> list[int]:
    with psycopg.connect(dsn) as conn:
        return [r[0] for r in conn.execute("SELECT mst_key FROM public.fitted_info")]


def test_cli_tensorboard_writes_the_curves(fitted, mop, extension_dsn, tmp_path):
    from madlib_mop.client.tensorboard import read_scalars

    job, _ = fitted
    done = _cli(extension_dsn, "tensorboard", "fitted", "--logdir", str(tmp_path))
    assert done.returncode == 0, done.stderr
    curves = mop.curves(job.job_id)
    for key in sorted(curves["mst_key"].unique()):
        for split, folder in (("training", "train"), ("validation", "validation")):
            scalars = read_scalars(tmp_path / f"mst_key_{key}" / folder)
            mine = curves[(curves["mst_key"] == key) & (curves["split"] == split)]
            for metric, group in mine.groupby("metric"):
                steps = [(int(i), float(np.float32(v))) for i, v in zip(group["iteration"], group["value"])]
                assert [(s, float(np.float32(v))) for s, v in scalars[f"epoch_{metric}"]] == steps


def test_the_readme_python_example_runs(extension_dsn, mop):
    """The guide's client example, as written, after what `make demo` loads (`mop` has)."""
    from tests.docs import block, page

    example = block(page("python.md"), "# From Python and the shell", "python")
    env = dict(os.environ, MADLIB_MOP_DSN=extension_dsn)
    done = subprocess.run([sys.executable, "-c", example + "\nprint(board.to_json())\n"], env=env,
                          capture_output=True, text=True, timeout=300, cwd=REPO_ROOT)
    assert done.returncode == 0, done.stderr
    board = json.loads(done.stdout.strip().splitlines()[-1])
    assert sorted(board["mst_key"].values()) == [1, 2, 3, 4]
    assert "10.00/10.00 epochs" in done.stderr


@pytest.fixture(scope="module")
def fresh_client(tmp_path_factory):
    """A new virtualenv of Debian's Python with `pip install '<this package>[client]'`, as
    an analyst installs the client on a laptop (pip's cache makes it quick)."""
    venv = tmp_path_factory.mktemp("client") / "venv"
    subprocess.run(["/usr/bin/python3", "-m", "venv", str(venv)], check=True, timeout=120)
    done = subprocess.run([str(venv / "bin" / "pip"), "install", "-q", "--disable-pip-version-check",
                           f"{REPO_ROOT}[client]"], capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    return venv


def test_a_fresh_virtualenv_gets_the_client_without_the_servers_runtime(fresh_client, fitted,
                                                                        extension_dsn, tmp_path):
    job, _ = fitted
    python = str(fresh_client / "bin" / "python")
    installed = subprocess.run([python, "-c", "import importlib.metadata as m; "
                                "print(' '.join(sorted(d.metadata['Name'].lower() for d in m.distributions())))"],
                               capture_output=True, text=True, timeout=60, cwd=tmp_path).stdout.split()
    assert "sqlalchemy" in installed and "tensorboard" in installed
    assert not {"tensorflow", "keras", "optuna", "scikit-learn", "dill"} & set(installed)
    size_mb = sum(f.stat().st_size for f in fresh_client.rglob("*") if f.is_file()) / 2 ** 20
    assert size_mb < 700, size_mb  # the server's runtime alone is over 2 GB

    def command(*args, timeout=180):
        return subprocess.run([str(fresh_client / "bin" / "madlib-mop"), "--dsn", extension_dsn, *args],
                              capture_output=True, text=True, timeout=timeout, cwd=tmp_path)

    listed = command("jobs")
    assert listed.returncode == 0 and "public.fitted" in listed.stdout, listed.stderr
    watched = command("watch", str(job.job_id))
    assert watched.returncode == 0 and f"job {job.job_id}: finished" in watched.stdout, watched.stderr
    reported = command("report", str(job.job_id), "--out", str(tmp_path / "report"))
    assert reported.returncode == 0 and (tmp_path / "report" / "learning_curves.png").stat().st_size > 0
    board = command("tensorboard", str(job.job_id), "--logdir", str(tmp_path / "runs"))
    assert board.returncode == 0 and sorted(p.name for p in (tmp_path / "runs").iterdir()) == \
        [f"mst_key_{k}" for k in (1, 2, 3, 4)]
    steered = command("steer", str(job.job_id), "stop", "1")
    assert steered.returncode == 2 and "nothing left to steer" in steered.stderr  # the server's answer
    server = subprocess.Popen([str(fresh_client / "bin" / "madlib-mop"), "--dsn", extension_dsn,
                               "dashboard", "--port", "0"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True, cwd=tmp_path)
    try:
        line = ""
        deadline = time.monotonic() + 120
        while "http://" not in line and time.monotonic() < deadline:
            line = server.stdout.readline()
        address = line[line.index("http://"):].split()[0]
        import urllib.request

        with urllib.request.urlopen(f"{address.rstrip('/')}/api/jobs", timeout=30) as answer:
            assert any(j["job_id"] == job.job_id for j in json.load(answer)["jobs"])
    finally:
        server.send_signal(signal.SIGINT)
        server.wait(timeout=30)


def test_cli_errors_say_what_is_wrong_and_what_to_do(fitted, extension_dsn, conn):
    """The common mistakes give a sentence and exit code 2: never SQLAlchemy's statement,
    its link or a traceback."""
    from psycopg.conninfo import conninfo_to_dict, make_conninfo

    job, _ = fitted
    said = {}
    said["unknown job"] = _cli(extension_dsn, "report", "999999", "--out", "/tmp/unused")
    conn.execute("ALTER TABLE fitted_info RENAME TO fitted_info_away")
    try:
        said["dropped tables"] = _cli(extension_dsn, "report", str(job.job_id), "--out", "/tmp/unused")
        said["dropped tables, tensorboard"] = _cli(extension_dsn, "tensorboard", str(job.job_id),
                                                   "--logdir", "/tmp/unused")
    finally:
        conn.execute("ALTER TABLE fitted_info_away RENAME TO fitted_info")
    conn.execute("DROP ROLE IF EXISTS cli_stranger")
    conn.execute("CREATE ROLE cli_stranger LOGIN PASSWORD 'stranger'")
    try:
        parts = {k: v for k, v in conninfo_to_dict(extension_dsn).items() if k != "passfile"}
        said["no rights"] = _cli(make_conninfo(**{**parts, "user": "cli_stranger", "password": "stranger"}), "jobs")
    finally:
        conn.execute("DROP ROLE cli_stranger")
    said["server down"] = _cli("host=127.0.0.1 port=1 dbname=x user=x connect_timeout=5", "jobs")
    said["folder not writable"] = _cli(extension_dsn, "report", str(job.job_id), "--out", "/proc/not_here")
    for case, done in said.items():
        assert done.returncode == 2, (case, done.stdout, done.stderr)
        assert "sqlalche.me" not in done.stderr and "[SQL:" not in done.stderr and "Traceback" not in done.stderr, \
            (case, done.stderr)
    assert "no job '999999' of yours" in said["unknown job"].stderr
    for case in ("dropped tables", "dropped tables, tensorboard"):
        assert f"the tables of job {job.job_id} are gone" in said[case].stderr
        assert "madlib-mop jobs" in said[case].stderr
    assert "permission denied for schema madlib_mop" in said["no rights"].stderr
    assert "GRANT USAGE ON SCHEMA madlib_mop" in said["no rights"].stderr
    assert "cannot connect to the server" in said["server down"].stderr and "--dsn" in said["server down"].stderr
    # An error that is not the server's is said as it is, not as a connection failure.
    assert "/proc/not_here" in said["folder not writable"].stderr
    assert "cannot connect" not in said["folder not writable"].stderr
