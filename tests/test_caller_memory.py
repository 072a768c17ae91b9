"""The calling session never imports TensorFlow: what a call needs of Keras (shapes, sizes,
initial states) is asked of a worker session (`job.keras_work`), or of a helper process
when the server's pool has none free.  Measured in the caller's own backend: its modules
and its RssAnon (memory of its own, which nothing else frees), before and after each call."""

from __future__ import annotations

import json
import shutil

import psycopg
import pytest

from tests.conftest import ADAM, connect, iris_grid, psql_error

CALLER_STATE = """
CREATE OR REPLACE FUNCTION public.caller_state() RETURNS jsonb LANGUAGE plpython3u AS $$
import json, sys
with open('/proc/self/status') as status:
    fields = dict(line.split(':', 1) for line in status)
return json.dumps({"rss_anon_kb": int(fields['RssAnon'].split()[0]),
                   "imported": sorted({m.split('.')[0] for m in sys.modules} & {'tensorflow', 'keras'})})
$$"""

GROWTH_MB = 60  # what a call may leave in the caller's own memory


def _state(conn: psycopg.Connection) -> dict:
    value = conn.execute("SELECT public.caller_state()").fetchone()[0]
    return value if isinstance(value, dict) else json.loads(value)


@pytest.fixture(scope="module")
def prepared(extension_dsn):
    with connect(extension_dsn) as conn:
        conn.execute(CALLER_STATE)
        iris_grid(conn)
        conn.execute("SELECT validation_preprocessor_dl('iris', 'iris_valid', 'class_text', "
                     "'attributes', 'iris_packed')")
        conn.execute("SELECT madlib_keras_fit_multiple_model('iris_packed', 'trained', 'mst', 2)")
    return extension_dsn


CALLS = {
    "fit": "SELECT madlib_keras_fit('iris_packed', 'one_fit', 'arch', 1, $${adam}$$, "
           "'batch_size=8, epochs=1', 2)".format(adam=ADAM),
    "fit_multiple": "SELECT madlib_keras_fit_multiple_model('iris_packed', 'grid_fit', 'mst', 2, "
                    "validation_table => 'iris_valid')",
    "evaluate": "SELECT madlib_keras_evaluate('trained', 'iris_valid', 'evaluated', mst_key => 1)",
    "predict": "SELECT madlib_keras_predict('trained', 'iris', 'id', 'attributes', 'predicted', "
               "'response', mst_key => 1)",
    "automl": "SELECT madlib_keras_automl('iris_packed', 'automl_out', 'arch', 'automl_mst', ARRAY[1], "
              "$$ {'loss': ['categorical_crossentropy'], 'optimizer_params_list': "
              "[{'optimizer': ['Adam'], 'lr': [0.001, 0.1, 'log']}], 'metrics': ['accuracy']} $$, "
              "$$ {'batch_size': [8], 'epochs': [1]} $$, 'hyperopt', 'num_configs=3, num_iterations=2')",
    "load_keras_model": "SELECT load_keras_model('arch', (SELECT model_arch FROM arch WHERE model_id = 1))",
}


@pytest.mark.parametrize("call", list(CALLS))
def test_a_call_leaves_the_caller_without_tensorflow(prepared, call):
    """In a new session: the call's result is there, TensorFlow and Keras were never
    imported here, and the session's own memory grew by less than GROWTH_MB."""
    with connect(prepared) as conn:
        before = _state(conn)
        conn.execute(CALLS[call])
        after = _state(conn)
    grown = (after["rss_anon_kb"] - before["rss_anon_kb"]) / 1024
    print(f"\n{call}: the caller's RssAnon {before['rss_anon_kb'] / 1024:.0f} -> "
          f"{after['rss_anon_kb'] / 1024:.0f} MB (+{grown:.0f})")
    assert after["imported"] == [], after
    assert grown < GROWTH_MB, (call, before, after)


def test_states_are_the_same_bits_whoever_builds_them(prepared, tmp_path, monkeypatch):
    """A job's step-0 states as its worker sessions built them (2 segments: each of its 2
    workers builds a share), as the helper process builds them (the path of a call that finds no free slot), and as Keras builds them in this
    process: the same bytes.  Where they are built never changes a model."""
    from madlib_mop.job.keras_work import KerasWork
    from madlib_mop.runtime import training

    with connect(prepared) as conn:
        conn.execute("SELECT madlib_keras_fit_multiple_model('iris_packed', 'by_worker', 'mst', 1, "
                     "seed => 7)")
        rows = conn.execute("SELECT mst_key, string_agg(state, ''::bytea ORDER BY piece) "
                            "FROM by_worker_mop_state WHERE step = 0 GROUP BY mst_key "
                            "ORDER BY mst_key").fetchall()
        configs = conn.execute("SELECT mst_key, model_arch::text, compile_params, fit_params, "
                               "initial_weights FROM by_worker_mop_models ORDER BY mst_key").fetchall()
    by_worker = {key: bytes(blob) for key, blob in rows}
    specs = [training.ModelSpec(key, arch, compile_params, fit_params, weights)
             for key, arch, compile_params, fit_params, weights in configs]
    (tmp_path / "PG_VERSION").write_text("15\n")
    monkeypatch.chdir(tmp_path)  # the helper's files go where a server's data directory is
    by_helper = dict(KerasWork(None).initial_states(specs, 7))
    here = dict(training.each_initial_state(specs, 7))
    assert sorted(by_worker) == [1, 2]
    # (Variables' names depend on what Keras named before in the process: not compared.)
    assert _values(by_worker) == _values(by_helper) == _values(here)
    assert not any((tmp_path / "pgsql_tmp_madlib_mop_new_states").iterdir())  # nothing left behind


def test_states_are_shared_out_by_their_building_time():
    """A job's workers each build a share of its step-0 states: by weights' size (largest
    first to the least loaded), the models of one program key together where there are
    keys enough for every worker, every model in one share."""
    from madlib_mop.job.keras_work import _shares

    costs, keys = [400, 900, 500, 400], ["a", "b", "c", "a"]
    assert _shares(costs, keys, 2) == [[1], [0, 2, 3]]  # 900 against 500 + 800 ("a" whole)
    assert sorted(_shares(costs, keys, 3)) == [[0, 3], [1], [2]]
    assert sorted(_shares(costs, keys, 8)) == [[0], [1], [2], [3]]  # fewer keys than workers: by model
    assert _shares(costs, keys, 1) == [[0, 1, 2, 3]]
    assert sorted(map(len, _shares([1] * 5, ["k"] * 5, 2))) == [2, 3]


def test_a_withdrawn_request_leaves_no_state_files(tmp_path, monkeypatch):
    """A worker stops writing step-0 states once the caller removed the request's directory
    (it gave up: a cancel), and leaves nothing behind."""
    from madlib_mop.errors import MadlibMopError
    from madlib_mop.runtime import model_facts

    token = "ab" * 16
    directory = model_facts.request_directory(token, tmp_path)

    def states(request, weights):
        yield 1, b"first"
        shutil.rmtree(directory)  # the caller gives up meanwhile
        yield 2, b"second"
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(model_facts, "each_state", states)
    with pytest.raises(MadlibMopError) as raised:
        model_facts.initial_states({"models": [{}, {}], "seed": 0}, None, token)
    assert raised.value.sqlstate == "55000"
    assert not directory.exists()


def _values(states: dict[int, bytes]) -> dict[int, tuple]:
    """Each state's kinds, dtypes and shapes, and its arrays' bytes."""
    from madlib_mop.runtime import state

    found = {}
    for key, blob in states.items():
        header, offset = state.split(blob)
        found[key] = ([(i["kind"], i["dtype"], i["shape"]) for i in header["layout"]], bytes(blob[offset:]))
    return found


def test_a_bad_architecture_is_refused_by_the_worker_with_its_sqlstate(prepared):
    error = psql_error(prepared, "SET search_path = madlib_mop, public;\n"
                       "SELECT load_keras_model('arch', '{\"class_name\": \"Sequential\", "
                       "\"config\": {\"layers\": [{\"class_name\": \"NoSuchLayer\", \"config\": {}}]}}');")
    assert error["sqlstate"] == "22023", error
    assert "could not be built as a Keras model" in error["message"], error
    assert "NoSuchLayer" in error["detail"] and error["hint"], error


def test_a_workers_step0_states_are_kept_for_a_job_of_the_same_configurations(monkeypatch):
    """A process keeps the step-0 states it built (`model_facts.each_state`): asked again for
    the same configurations and seed (the next pg_cron firing, a cell run again, a session
    kept ready that built its role's latest job's), it gives the kept bytes without building
    a model; a model built alone is the same as built with others; another seed builds anew;
    the kept states stay within their budget."""
    import collections

    import keras

    from madlib_mop.runtime import model_facts, training

    arch = keras.Sequential([keras.Input((4,)), keras.layers.Dense(5, activation="relu"),
                             keras.layers.Dense(3, activation="softmax")]).to_json()
    models = [{"mst_key": key, "model_arch": arch, "compile_params": ADAM.replace("0.01", rate),
               "fit_params": "batch_size=8, epochs=1"} for key, rate in ((1, "0.01"), (2, "0.05"), (3, "0.01"))]
    monkeypatch.setattr(model_facts, "_kept", collections.OrderedDict())
    monkeypatch.setattr(model_facts, "_kept_bytes", 0)
    built = dict(model_facts.each_state({"seed": 7, "models": models}, None))
    assert sorted(built) == [1, 2, 3] and len(model_facts._kept) == 3
    spec = training.ModelSpec(2, arch, models[1]["compile_params"], models[1]["fit_params"])
    assert _values({2: built[2]}) == _values(dict(training.each_initial_state([spec], 7)))

    building = training.each_initial_state

    def refused(specs, seed):
        assert not specs, "a kept state was built again"
        return iter(())
    monkeypatch.setattr(training, "each_initial_state", refused)
    again = dict(model_facts.each_state({"seed": 7, "models": models[::-1]}, None))
    assert again == built
    assert all(any(state is kept for kept in model_facts._kept.values()) for state in again.values())

    monkeypatch.setattr(training, "each_initial_state", building)
    other = dict(model_facts.each_state({"seed": 8, "models": models[:1]}, None))
    assert _values(other)[1][1] != _values(built)[1][1]  # another seed draws other weights
    monkeypatch.setattr(model_facts, "KEPT_STATES_BYTES", 8 * len(built[1]) + 1)
    model_facts.each_state({"seed": 9, "models": models[:1]}, None).__next__()
    assert model_facts._kept_bytes == sum(map(len, model_facts._kept.values())) <= model_facts.KEPT_STATES_BYTES


def test_kept_step0_states_pushed_out_by_the_states_of_the_same_job(monkeypatch):
    """A job whose first models' states were kept and whose others are built anew: the new
    states push the kept ones out of the budget before their turn.  Each model still gets
    its state, the one it would get alone (the kept states a job asks for are taken when it
    asks, not when their turn comes)."""
    import collections

    import keras

    from madlib_mop.runtime import model_facts

    arch = keras.Sequential([keras.Input((4,)), keras.layers.Dense(5, activation="relu"),
                             keras.layers.Dense(3, activation="softmax")]).to_json()
    models = [{"mst_key": key, "model_arch": arch, "compile_params": ADAM,
               "fit_params": "batch_size=8, epochs=1"} for key in (1, 2, 3, 4)]
    monkeypatch.setattr(model_facts, "_kept", collections.OrderedDict())
    monkeypatch.setattr(model_facts, "_kept_bytes", 0)
    alone = dict(model_facts.each_state({"seed": 7, "models": models}, None))
    # The budget full: models 3 and 4's states, the oldest, and others' (of other jobs).
    # Asked in the order 1, 2, 3, 4, the states of 1 and 2 are built, kept, and push
    # those of 3 and 4 out before their turn.
    size = len(alone[1])
    monkeypatch.setattr(model_facts, "KEPT_STATES_BYTES", 16 * size)  # states up to 2 * size kept
    kept = [model_facts._state_key(models[index], 7, None, None) for index in (2, 3)]
    monkeypatch.setattr(model_facts, "_kept", collections.OrderedDict(
        [(key, model_facts._kept[key]) for key in kept]
        + [(f"other {n}", bytes((14 * size - 1) // 6)) for n in range(6)]))
    monkeypatch.setattr(model_facts, "_kept_bytes", sum(map(len, model_facts._kept.values())))
    again = dict(model_facts.each_state({"seed": 7, "models": models}, None))
    assert not set(kept) & set(model_facts._kept)  # (pushed out, as said)
    assert sorted(again) == [1, 2, 3, 4]
    assert _values(again) == _values(alone)
