"""`madlib-mop dashboard` in a real browser (Debian's chromium, headless, through its
chromedriver): the page follows a job while it runs (its row, the learning curves, the
schedule's bars per segment, then its end) and equals what the server says at that moment;
another role sees none of it; the dashboard's sessions cannot write; the command serves it.

An analyst role runs the jobs, as analysts do (a LOGIN role with a password, its workers
allowed by the DBA's pg_ident.conf line).  The running job is held still at a known
sub-epoch (a lock on its visits table, `conftest.held_job`) while the page is compared
with the tables, then let go to finish.

MADLIB_MOP_DASHBOARD_SCREENSHOT=path also runs `make demo`'s job (digits, eight
configurations) and saves its whole page there once it has finished: the README's picture,
docs/images/dashboard.png.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from tests.conftest import REPO_ROOT, connect, held_job, iris_table

CHROMIUM, CHROMEDRIVER = Path("/usr/bin/chromium"), Path("/usr/bin/chromedriver")
pytestmark = pytest.mark.skipif(
    not CHROMIUM.exists() or not CHROMEDRIVER.exists(),
    reason="needs Debian's chromium and chromium-driver (/usr/bin/chromium, /usr/bin/chromedriver): "
           "sudo make browser")

SCREENSHOT_VARIABLE = "MADLIB_MOP_DASHBOARD_SCREENSHOT"
PASSWORD = "analyst-password-" + uuid.uuid4().hex[:8]
ARCH = json.dumps({"class_name": "Sequential", "config": {"name": "mlp", "layers": [
    {"class_name": "Dense", "config": {"units": 8, "activation": "relu", "batch_input_shape": [None, 4]}},
    {"class_name": "Dense", "config": {"units": 3, "activation": "softmax"}}]}})
COMPILE = [f"loss='categorical_crossentropy', optimizer='Adam(lr={lr})', metrics=['accuracy']"
           for lr in (0.003, 0.01, 0.03)]
FIT = ["batch_size=16", "batch_size=32"]
MODELS, SEGMENTS, ITERATIONS = len(COMPILE) * len(FIT), 2, 4
HELD_AT = MODELS * SEGMENTS + 3  # sub-epochs: past the first iteration, well before the end
WAIT = 90  # seconds: the page polls every 2 s


# ---- roles, data, a finished job --------------------------------------------------------------
def _login(dsn: str, role: str) -> str:
    """`dsn` as `role` over TCP with its password (scram-sha-256), as an analyst connects."""
    params = conninfo_to_dict(dsn)
    params.pop("passfile", None)
    params.update(user=role, password=PASSWORD)
    return make_conninfo(**params)


@pytest.fixture(scope="module")
def analysts(extension_dsn, allow_worker_role):
    """Two analysts' DSNs: `alice` runs jobs (allowed as a worker role), `bob` runs none."""
    suffix = uuid.uuid4().hex[:6]
    names = {"alice": f"alice_{suffix}", "bob": f"bob_{suffix}"}
    database = conninfo_to_dict(extension_dsn)["dbname"]
    with psycopg.connect(extension_dsn, autocommit=True) as admin:
        for role in names.values():
            admin.execute(sql.SQL("CREATE ROLE {} LOGIN PASSWORD {}").format(
                sql.Identifier(role), sql.Literal(PASSWORD)))
            admin.execute(sql.SQL("GRANT USAGE ON SCHEMA madlib_mop TO {0}; "
                                  "GRANT CREATE ON SCHEMA public TO {0}; "
                                  "GRANT CREATE ON DATABASE {1} TO {0}").format(
                sql.Identifier(role), sql.Identifier(database)))
    allow_worker_role(names["alice"])
    yield {key: _login(extension_dsn, role) for key, role in names.items()} | {"roles": names}
    with psycopg.connect(extension_dsn, autocommit=True) as admin:
        for role in names.values():
            admin.execute("DELETE FROM madlib_mop.jobs WHERE owner = %s", (role,))
            admin.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(role)))
            admin.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))


@pytest.fixture(scope="module")
def prepared(analysts):
    """Alice's iris, packed over two segments with a validation set, six configurations,
    and a first finished job (one iteration; it also starts her worker sessions)."""
    with connect(analysts["alice"]) as conn:
        iris_table(conn)
        conn.execute("SELECT training_preprocessor_dl('iris', 'iris_packed', 'class_text', "
                     "'attributes', distribution_rules => %s)", (str(SEGMENTS),))
        conn.execute("SELECT validation_preprocessor_dl('iris', 'iris_valid', 'class_text', "
                     "'attributes', 'iris_packed')")
        conn.execute("SELECT load_keras_model('arch', %s::json)", (ARCH,))
        conn.execute("SELECT load_model_selection_table('arch', 'mst', ARRAY[1], %s, %s)",
                     (COMPILE, FIT))
        conn.execute("SELECT madlib_keras_fit_multiple_model('iris_packed', 'first_models', 'mst', 1, "
                     "FALSE, 'iris_valid', 1)")
        first = conn.execute("SELECT job_id FROM job_progress WHERE model_output_table = "
                             "'public.first_models'").fetchone()[0]
    return {"first": first}


# ---- the browser and the app ----------------------------------------------------------------
@pytest.fixture(scope="module")
def browser():
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for argument in ("--headless=new", "--no-sandbox", "--disable-gpu", "--window-size=1400,1000",
                     "--disable-dev-shm-usage", "--lang=en-US"):
        options.add_argument(argument)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(str(CHROMEDRIVER)), options=options)
    driver.set_page_load_timeout(60)
    yield driver
    driver.quit()


@pytest.fixture
def dashboard():
    """dashboard(dsn) -> the app's URL, served in a thread until the test ends."""
    from madlib_mop.client.dashboard import create_app, running

    with_blocks = []

    def start(target) -> str:
        app = create_app(target)
        block = running(app)
        with_blocks.append((block, app))
        return block.__enter__()

    yield start
    for block, app in reversed(with_blocks):
        block.__exit__(None, None, None)
        app.extensions["madlib_mop_dashboard"].engine.dispose()


def _wait(driver, condition, timeout: float = WAIT, what: str = ""):
    """condition(driver) until it is truthy; its value."""
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(driver, timeout, poll_frequency=0.1).until(
        condition, message=f"the page did not show {what} in {timeout:g}s")


def _polls(driver) -> int:
    return int(driver.execute_script("return document.body.dataset.polls || 0"))


def _row(driver, job_id: int) -> dict:
    """The job's row of the jobs table: {field: text}."""
    return driver.execute_script(
        "const row = document.querySelector(`#jobs tr[data-job-id='${arguments[0]}']`);"
        "if (!row) return null;"
        "return Object.fromEntries([...row.cells].map(c => [c.dataset.field, c.textContent]));",
        job_id)


def _bars(driver) -> dict:
    """The schedule's bars drawn: {'job': id, 'bars': [[mst_key, segment], ...]}."""
    return driver.execute_script(
        "const div = document.getElementById('schedule');"
        "return {job: Number(div.dataset.job), count: Number(div.dataset.count),"
        "  bars: (div.data || []).flatMap(t => t.y.map(y => [t.meta.mst_key, Number(y.split(' ')[1])]))};")


def _curves(driver) -> dict:
    """The learning curves drawn: {'job': id, 'traces': [[mst_key, split, metric], ...]}."""
    return driver.execute_script(
        "const div = document.getElementById('curves');"
        "return {job: Number(div.dataset.job),"
        "  traces: (div.data || []).map(t => [t.meta.mst_key, t.meta.split, t.meta.metric])};")


def _open(driver, url: str) -> None:
    """Loads `url`, leaving the page before behind (it may have polled a server since stopped)."""
    driver.get("about:blank")
    driver.get_log("browser")  # read: gone
    driver.get(url)


def _click_row(driver, job_id: int) -> None:
    """Clicks the job's row (again if a poll redrew the table under the pointer)."""
    from selenium.common.exceptions import StaleElementReferenceException

    for _ in range(5):
        try:
            driver.find_element("css selector", f"#jobs tr[data-job-id='{job_id}']").click()
            return
        except StaleElementReferenceException:
            continue
    raise AssertionError(f"could not click job {job_id}'s row")


def _no_errors(driver) -> None:
    """Nothing went wrong in the page: no JavaScript error, no refused resource."""
    severe = [entry["message"] for entry in driver.get_log("browser") if entry["level"] == "SEVERE"]
    assert not severe, severe


# ---- what the server says -------------------------------------------------------------------
def _progress(conn, job_id: int) -> dict:
    cursor = conn.execute("SELECT * FROM job_progress WHERE job_id = %s", (job_id,))
    return dict(zip([c.name for c in cursor.description], cursor.fetchone()))


def _visits_by_segment(conn, out: str) -> dict[int, int]:
    return dict(conn.execute(sql.SQL("SELECT segment, count(*) FROM {} GROUP BY segment").format(
        sql.Identifier(f"{out}_mop_visits"))).fetchall())


def _models_with_curves(conn, out: str) -> set[int]:
    return {r[0] for r in conn.execute(sql.SQL(
        "SELECT mst_key FROM {} WHERE cardinality(metrics_iters) > 0").format(
        sql.Identifier(f"{out}_info")))}


def _check_row(row: dict, progress: dict) -> None:
    assert row["state"] == progress["state"]
    assert row["subepochs"] == f"{progress['subepochs_done']} / {progress['subepochs_total']}"
    for field in ("models", "models_training", "models_finished", "models_stopped", "models_failed"):
        assert row[field] == str(progress[field]), field


def _check_bars(drawn: dict, by_segment: dict[int, int], job_id: int) -> None:
    assert drawn["job"] == job_id
    found: dict[int, int] = {}
    for _, segment in drawn["bars"]:
        found[segment] = found.get(segment, 0) + 1
    assert found == by_segment  # every sub-epoch recorded, on its segment
    assert sorted(found) == list(range(SEGMENTS))


def _check_curves(drawn: dict, before: set[int], after: set[int], job_id: int) -> None:
    """One trace per model with curves, for each (split, metric) drawn."""
    assert drawn["job"] == job_id
    by_panel: dict[tuple, list[int]] = {}
    for key, split, metric in drawn["traces"]:
        by_panel.setdefault((split, metric), []).append(key)
    assert set(by_panel) == {(s, m) for s in ("training", "validation") for m in ("loss", "accuracy")}
    for panel, keys in by_panel.items():
        assert len(keys) == len(set(keys)), panel
        assert before <= set(keys) <= after, (panel, keys, before, after)


# ---- tests ------------------------------------------------------------------------------------
def test_the_page_follows_a_running_job(prepared, analysts, browser, dashboard, extension_dsn, tmp_path):
    url = dashboard(analysts["alice"])
    failures: list[BaseException] = []

    def fit() -> None:
        try:
            with connect(analysts["alice"]) as conn:
                conn.execute("SELECT madlib_keras_fit_multiple_model('iris_packed', 'live_models', "
                             "'mst', %s, FALSE, 'iris_valid', 1)", (ITERATIONS,))
        except BaseException as error:  # seen by the test, below
            failures.append(error)

    job = threading.Thread(target=fit)
    with connect(extension_dsn) as watcher, connect(analysts["alice"]) as alice:
        job.start()
        try:
            with held_job(watcher, "live_models", HELD_AT):
                job_id = alice.execute("SELECT job_id FROM job_progress WHERE model_output_table = "
                                       "'public.live_models'").fetchone()[0]
                progress = _progress(alice, job_id)
                assert progress["state"] == "running" and progress["subepochs_done"] >= HELD_AT
                by_segment = _visits_by_segment(alice, "live_models")
                curves_before = _models_with_curves(alice, "live_models")
                _open(browser, url)
                _wait(browser, lambda d: _bars(d)["job"] == job_id and _curves(d)["job"] == job_id,
                      what=f"job {job_id}'s panels")
                # The newest job is shown; held, the job's numbers are the server's.
                assert browser.execute_script("return document.body.dataset.selectedJob") == str(job_id)
                _check_row(_row(browser, job_id), progress)
                _check_row(_row(browser, job_id), _progress(alice, job_id))
                _check_bars(_bars(browser), by_segment, job_id)
                _check_curves(_curves(browser), curves_before,
                              _models_with_curves(alice, "live_models"), job_id)
                assert len(curves_before) >= 1
                facts = browser.find_element("id", "job-facts").text
                assert f"{progress['subepochs_done']} of {progress['subepochs_total']}" in facts
                assert "ETA" in _row(browser, job_id)["when"]
                browser.save_screenshot(str(tmp_path / "running.png"))
            # Let go: the page follows the job to its end without being reloaded.
            _wait(browser, lambda d: (_row(d, job_id) or {}).get("state") == "finished",
                  what=f"job {job_id} finished")
        finally:
            job.join(timeout=300)
        assert not failures, failures
        final = _progress(alice, job_id)
        by_segment = _visits_by_segment(alice, "live_models")
        assert sum(by_segment.values()) == MODELS * SEGMENTS * ITERATIONS == final["subepochs_done"]
        _wait(browser, lambda d: len(_bars(d)["bars"]) == sum(by_segment.values()),
              what="every sub-epoch's bar")
        _check_row(_row(browser, job_id), final)
        _check_bars(_bars(browser), by_segment, job_id)
        models = _models_with_curves(alice, "live_models")
        assert len(models) == MODELS
        _wait(browser, lambda d: {k for k, _, _ in _curves(d)["traces"]} == models,
              what="every model's curves")
        _check_curves(_curves(browser), models, models, job_id)
        # Importance and the front, asked again now that the job has finished.
        _wait(browser, lambda d: all(d.execute_script(
            "const note = document.getElementById(arguments[0] + '-note').textContent;"
            "return document.getElementById(arguments[0]).dataset.job == arguments[1] && note"
            "  && !note.includes('when the job has finished');", panel, job_id)
            for panel in ("importance", "pareto")), what="the panels of a finished job")
        browser.save_screenshot(str(tmp_path / "finished.png"))

        # Another job, clicked: its panels.
        first_visits = _visits_by_segment(alice, "first_models")
        _click_row(browser, prepared["first"])
        _wait(browser, lambda d: _bars(d)["job"] == prepared["first"], what="the clicked job")
        _check_bars(_bars(browser), first_visits, prepared["first"])
        assert "selected" in browser.find_element(
            "css selector", f"#jobs tr[data-job-id='{prepared['first']}']").get_attribute("class")
    _no_errors(browser)


def test_after_the_search_importance_and_pareto_front(prepared, analysts, browser, dashboard):
    """A finished job: hyperparameter_importance() as a bar chart (or the server's message
    why not), and every model against its cost with pareto_front()'s models highlighted."""
    url = dashboard(analysts["alice"])
    job_id = prepared["first"]
    _open(browser, f"{url}#job={job_id}")
    outcome = {}
    for panel in ("importance", "pareto"):
        outcome[panel] = _wait(browser, lambda d, panel=panel: d.execute_script(
            "const div = document.getElementById(arguments[0]);"
            "return div.dataset.job == arguments[1] && div.dataset.outcome;", panel, job_id),
            what=f"the {panel} panel")
    with connect(analysts["alice"]) as conn:
        functions = {name for (name,) in conn.execute(
            "SELECT proname FROM pg_proc WHERE pronamespace = 'madlib_mop'::regnamespace "
            "AND proname IN ('hyperparameter_importance', 'pareto_front')")}
        if functions != {"hyperparameter_importance", "pareto_front"}:
            for panel in ("importance", "pareto"):
                assert outcome[panel] == "unavailable"
                assert "Not available" in browser.find_element("id", f"{panel}-note").text
            pytest.skip("the extension installed here has no hyperparameter_importance() / "
                        "pareto_front() yet: the panels say so; their charts are checked once it has")
        _check_importance(browser, conn, outcome["importance"])
        _check_pareto(browser, conn, outcome["pareto"])
    _no_errors(browser)


def _check_importance(driver, conn, outcome: str) -> None:
    try:
        with conn.transaction():
            rows = conn.execute("SELECT hyperparameter, importance FROM "
                                "hyperparameter_importance('first_models')").fetchall()
    except psycopg.Error as error:
        assert outcome == "error"
        assert error.diag.message_primary in driver.find_element("id", "importance-note").text
        return
    assert outcome == "chart"
    drawn = driver.execute_script("const t = document.getElementById('importance').data[0];"
                                  "return t.y.map((name, k) => [name, t.x[k]]);")
    assert sorted(drawn) == sorted([name, pytest.approx(value)] for name, value in rows)


def _check_pareto(driver, conn, outcome: str) -> None:
    assert outcome == "chart", driver.find_element("id", "pareto-note").text
    info = conn.execute("SELECT count(*), count(inference_ms_per_row) FROM first_models_info").fetchone()
    x = "inference_ms_per_row" if info[1] else "parameter_count"
    front = {r[0] for r in conn.execute(
        "SELECT mst_key FROM pareto_front('first_models', %s)",
        (["validation_metrics_final max", f"{x} min"],))}
    drawn = driver.execute_script(
        "return document.getElementById('pareto').data.map(t => [t.meta.front, t.customdata]);")
    points = {front_: set(keys) for front_, keys in drawn}
    assert points[True] == front and front
    assert len(points[True]) + len(points[False]) == info[0] == MODELS


def test_the_cycles_panel_draws_each_cycles_best_value(prepared, analysts, browser, dashboard):
    """Two cycles of Alice's over a growing table: the panel draws the best value of each,
    as the view cycle_results has it."""
    with connect(analysts["alice"]) as conn:
        conn.execute("CREATE TABLE arrivals (arrival bigint GENERATED ALWAYS AS IDENTITY, id integer, "
                     "attributes float8[], class_text text)")
        arrive = ("INSERT INTO arrivals (id, attributes, class_text) SELECT id, attributes, class_text "
                  "FROM iris WHERE id % 3 {} 0 ORDER BY id")
        conn.execute(arrive.format("<>"))
        conn.execute("SELECT training_preprocessor_dl('arrivals', 'arrivals_packed', 'class_text', 'attributes', "
                     "distribution_rules => %s, key_column => 'arrival')", (str(SEGMENTS),))
        conn.execute("CALL run_cycle('weekly', 'arrivals_packed', 'arrivals', 'mst', 1)")
        conn.execute(arrive.format("="))
        conn.execute("CALL run_cycle('weekly', 'arrivals_packed', 'arrivals', NULL, 1, top_k => 2)")
        expected = conn.execute("SELECT cycle, best_value FROM cycle_results WHERE cycle_name = 'weekly' "
                                "ORDER BY cycle").fetchall()
    driver = browser
    _open(driver, dashboard(analysts["alice"]))
    drawn = _wait(driver, lambda d: d.execute_script(
        "const div = document.getElementById('cycles');"
        "return div.data && div.data.length ? div.data.map(t => [t.meta.cycle_name, t.x, t.y]) : null;"),
        what="the cycles")
    assert [cycle for cycle, _ in expected] == [1, 2] and all(value is not None for _, value in expected)
    assert drawn == [["weekly", [1, 2], [value for _, value in expected]]]
    _no_errors(driver)


def test_another_role_sees_none_of_it(prepared, analysts, browser, dashboard):
    url = dashboard(analysts["bob"])
    _open(browser, url)
    _wait(browser, lambda d: _polls(d) >= 1, what="a poll")
    assert browser.find_element("id", "no-jobs").is_displayed()
    assert browser.execute_script("return document.querySelectorAll('#jobs tbody tr').length") == 0
    assert browser.find_element("id", "job-panel").is_displayed() is False
    assert json.loads(_get(url + "api/jobs")) == {"jobs": []}
    assert json.loads(_get(url + "api/cycles")) == {"cycles": []}
    assert browser.find_element("id", "cycles-panel").is_displayed() is False
    for panel in ("curves", "schedule", "importance", "pareto"):
        with pytest.raises(urllib.error.HTTPError) as refused:
            _get(f"{url}api/jobs/{prepared['first']}/{panel}")
        assert refused.value.code == 404
        assert "no job" in json.loads(refused.value.read())["error"]
    who = browser.find_element("id", "who").text
    assert analysts["roles"]["bob"] in who
    # ... while alice's own dashboard lists her jobs, hers only.
    mine = json.loads(_get(dashboard(analysts["alice"]) + "api/jobs"))["jobs"]
    assert mine and {job["owner"] for job in mine} == {analysts["roles"]["alice"]}
    _no_errors(browser)


def test_metrics_for_prometheus_show_the_roles_own_jobs(prepared, analysts, dashboard):
    from prometheus_client.parser import text_string_to_metric_families

    def jobs(dsn: str) -> dict[str, float]:
        families = text_string_to_metric_families(_get(dashboard(dsn) + "metrics").decode())
        return {s.labels["role"]: s.value for f in families if f.name == "madlib_mop_jobs"
                for s in f.samples if s.labels["state"] == "finished"}

    alice, bob = analysts["roles"]["alice"], analysts["roles"]["bob"]
    with connect(analysts["alice"]) as conn:
        finished = conn.execute("SELECT count(*) FROM job_progress WHERE owner = current_user "
                                "AND state = 'finished'").fetchone()[0]
    assert finished >= 1
    assert jobs(analysts["alice"]) == {alice: finished}
    assert jobs(analysts["bob"]) == {}  # bob sees no job of alice's, and has none
    assert bob not in jobs(analysts["alice"])


def _get(url: str, headers: dict | None = None) -> bytes:
    with urllib.request.urlopen(urllib.request.Request(url, headers=headers or {}), timeout=30) as answer:
        return answer.read()


def test_the_dashboard_cannot_write(prepared, analysts):
    import sqlalchemy as sa

    from madlib_mop.client.dashboard import DashboardData
    from madlib_mop.client.session import make_engine

    data = DashboardData(analysts["alice"])
    writes = ["CREATE TABLE public.written_by_the_dashboard (i int)",
              "UPDATE madlib_mop.jobs SET state = 'failed'",
              "DELETE FROM public.iris"]
    try:
        with data.engine.connect() as conn:  # any session of its own, not only its reads
            assert conn.execute(sa.text("SHOW default_transaction_read_only")).scalar() == "on"
        for statement in writes:
            with pytest.raises(sa.exc.DBAPIError) as refused, data.connection() as conn:
                conn.execute(sa.text(statement))
            assert refused.value.orig.diag.sqlstate == "25006"  # read_only_sql_transaction
    finally:
        data.engine.dispose()
    # Given an Engine, it leaves the Engine's sessions as they are, and its reads still write nothing.
    engine = make_engine(analysts["alice"])
    try:
        data = DashboardData(engine)
        with pytest.raises(sa.exc.DBAPIError) as refused, data.connection() as conn:
            conn.execute(sa.text(writes[0]))
        assert refused.value.orig.diag.sqlstate == "25006"
        with engine.connect() as conn:
            assert conn.execute(sa.text("SHOW transaction_read_only")).scalar() == "off"
    finally:
        engine.dispose()
    with connect(analysts["alice"]) as conn:
        assert conn.execute("SELECT count(*) FROM iris").fetchone()[0] == 150
        assert conn.execute("SELECT to_regclass('public.written_by_the_dashboard')").fetchone()[0] is None


def test_curves_from_the_view_equal_the_info_tables(prepared, analysts):
    """The learning curves read from the extension's `intermediate_values` view are those of
    the job's `_info` table (what the page reads from a version without the view)."""
    from madlib_mop.client import frames
    from madlib_mop.client.dashboard import DashboardData, curves_payload, learning_curves, read_info

    data = DashboardData(analysts["alice"])
    try:
        with data.connection() as conn:
            ref = data.job(conn, prepared["first"])
            from_view, source = learning_curves(conn, data.schema, ref)
            info = read_info(conn, ref)
            from_info = frames.curves(conn, ref)
    finally:
        data.engine.dispose()
    if source != "intermediate_values":
        pytest.skip("the extension installed here has no intermediate_values view")

    def drawn(payload: dict) -> dict:
        return {(m["mst_key"], s["split"], s["metric"]): (s["iterations"], s["values"])
                for m in payload["models"] for s in m["series"]}

    expected = drawn(curves_payload(from_info, "_info", info))
    assert len(expected) == MODELS * 4  # 2 splits x 2 metrics
    assert drawn(curves_payload(from_view, source, info)) == {
        key: (iterations, pytest.approx(values)) for key, (iterations, values) in expected.items()}


def test_the_command_serves_the_dashboard(prepared, analysts):
    """`madlib-mop dashboard --port 0`: the URL it prints serves the page, Plotly.js (from
    the plotly package) and the jobs; a Host that is not this machine's is refused (a page
    of another site re-pointed at 127.0.0.1); Ctrl-C stops it with status 0."""
    env = {k: v for k, v in os.environ.items() if k != "MADLIB_MOP_DSN"}
    process = subprocess.Popen(
        [sys.executable, "-m", "madlib_mop.client.cli", "--dsn", analysts["alice"], "dashboard",
         "--port", "0"], env=env, cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True)
    try:
        line = process.stdout.readline()
        if not line.startswith("madlib-mop dashboard: http://127.0.0.1:"):
            process.kill()
            pytest.fail(f"the command said {line!r}; stderr: {process.communicate()[1]}")
        url = line.split()[2]
        assert b"madlib_mop" in _get(url)
        plotly = _get(url + "plotly.min.js")
        assert len(plotly) > 1_000_000 and b"plotly" in plotly[:2000].lower()
        jobs = json.loads(_get(url + "api/jobs"))["jobs"]
        assert prepared["first"] in {job["job_id"] for job in jobs}
        with pytest.raises(urllib.error.HTTPError) as refused:
            _get(url + "api/jobs", headers={"Host": "attacker.example"})
        assert refused.value.code == 400
        assert json.loads(_get(url + "api/jobs", headers={"Host": "localhost"}))["jobs"] == jobs
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=30) == 0, process.stderr.read()
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


# ---- the README's picture -----------------------------------------------------------------------
def _architecture(layers: list[dict]) -> str:
    return json.dumps({"class_name": "Sequential", "config": {"name": "m", "layers": layers}})


DIGITS_ARCHITECTURES = [  # make demo's two
    _architecture([{"class_name": "Flatten", "config": {"batch_input_shape": [None, 8, 8, 1]}},
                   {"class_name": "Dense", "config": {"units": 32, "activation": "relu"}},
                   {"class_name": "Dense", "config": {"units": 10, "activation": "softmax"}}]),
    _architecture([{"class_name": "Conv2D", "config": {"filters": 16, "kernel_size": [3, 3],
                                                       "activation": "relu",
                                                       "batch_input_shape": [None, 8, 8, 1]}},
                   {"class_name": "Flatten", "config": {}},
                   {"class_name": "Dense", "config": {"units": 32, "activation": "relu"}},
                   {"class_name": "Dense", "config": {"units": 10, "activation": "softmax"}}]),
]


def _full_page_png(driver) -> bytes:
    """The whole page (not only the window), as Chrome renders it."""
    import base64

    size = driver.execute_cdp_cmd("Page.getLayoutMetrics", {})["cssContentSize"]
    shot = driver.execute_cdp_cmd("Page.captureScreenshot", {
        "format": "png", "captureBeyondViewport": True,
        "clip": {"x": 0, "y": 0, "width": size["width"], "height": size["height"], "scale": 1}})
    return base64.b64decode(shot["data"])


@pytest.mark.skipif(not os.environ.get(SCREENSHOT_VARIABLE),
                    reason=f"makes the README's picture when {SCREENSHOT_VARIABLE} names a file")
def test_readme_screenshot(prepared, analysts, browser, dashboard):
    from madlib_mop.tools.demo import load_digits

    path = Path(os.environ[SCREENSHOT_VARIABLE])
    with connect(analysts["alice"]) as conn:
        digits = load_digits(conn)
        conn.execute(f"CREATE VIEW digits_train AS SELECT * FROM {digits} WHERE id % 5 <> 0")
        conn.execute(f"CREATE VIEW digits_test AS SELECT * FROM {digits} WHERE id % 5 = 0")
        conn.execute("SELECT training_preprocessor_dl('digits_train', 'digits_packed', 'digit', "
                     "'image', normalizing_const => 16, distribution_rules => '2')")
        conn.execute("SELECT validation_preprocessor_dl('digits_test', 'digits_valid', 'digit', "
                     "'image', 'digits_packed')")
        for architecture in DIGITS_ARCHITECTURES:
            conn.execute("SELECT load_keras_model('digits_arch', %s::json)", (architecture,))
        conn.execute("""SELECT generate_model_configs('digits_arch', 'digits_mst', ARRAY[1, 2],
            $${'loss': ['categorical_crossentropy'],
               'optimizer_params_list': [{'optimizer': ['Adam'], 'lr': [0.001, 0.01]}],
               'metrics': ['accuracy']}$$, $${'batch_size': [16, 64]}$$)""")
        conn.execute("SELECT madlib_keras_fit_multiple_model('digits_packed', 'digits_models', "
                     "'digits_mst', 6, FALSE, 'digits_valid', 1)")
        job_id = conn.execute("SELECT job_id FROM job_progress WHERE model_output_table = "
                              "'public.digits_models'").fetchone()[0]
    _open(browser, f"{dashboard(analysts['alice'])}#job={job_id}")
    _wait(browser, lambda d: all(d.execute_script(
        "return document.getElementById(arguments[0]).dataset.job", panel) == str(job_id)
        for panel in ("curves", "schedule", "importance", "pareto")), what="every panel")
    time.sleep(1.0)  # Plotly's transitions
    path.parent.mkdir(parents=True, exist_ok=True)
    picture = _full_page_png(browser)
    assert picture.startswith(b"\x89PNG\r\n\x1a\n") and len(picture) > 10_000  # a page, not a blank
    path.write_bytes(picture)
    _no_errors(browser)
