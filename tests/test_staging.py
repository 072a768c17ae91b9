"""Staged transfer learning (`runtime.staging`): which first layers are staged, and staged
training equal to training the whole model, bit for bit -- in a plain process here, and in
jobs (shared and unshared prefixes, spilled features) against the real server."""

from __future__ import annotations

import contextlib
import io
import json
import os

import numpy as np
import pytest

from madlib_mop.runtime import keras_json, model_state, staging, state, training
from madlib_mop.runtime.buffers import Buffer

COMPILE = "optimizer='Adam(learning_rate=0.01)',loss='categorical_crossentropy',metrics=['accuracy']"


def _rows_change_bits() -> bool:
    """Does this machine compute a row of a Dense or convolution layer differently with
    other rows beside it?  oneDNN picks kernels by the number of rows on some CPUs (seen on
    an AMD EPYC): there staged training equals whole training within float rounding, not
    bit for bit, as the README and docs/architecture.md say; elsewhere, bit for bit."""
    import keras

    keras.utils.set_random_seed(0)
    L = keras.layers
    probe = keras.Sequential([keras.Input((12, 12, 3)), L.Conv2D(6, 3), L.Flatten(), L.Dense(16)])
    x = np.random.default_rng(0).normal(size=(40, 12, 12, 3)).astype("float32")
    together = np.asarray(probe(x, training=False))
    alone = np.concatenate([np.asarray(probe(x[i:i + 1], training=False)) for i in range(len(x))])
    return not np.array_equal(together, alone)


ROWS_CHANGE_BITS = _rows_change_bits()


def _same(a, b) -> bool:
    """Equal bit for bit, or within float rounding where rows change bits."""
    if not ROWS_CHANGE_BITS:
        return a == b if not isinstance(a, np.ndarray) else np.array_equal(a, b)
    if a is None or b is None:
        return a is b
    if isinstance(a, (bytes, bytearray)):
        a, b = np.frombuffer(a, "<f4"), np.frombuffer(b, "<f4")
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return bool(np.allclose(a, b, rtol=1e-4, atol=1e-5))


def _config(*layers) -> dict:
    import keras

    return keras_json.parse_model_json(keras.Sequential([keras.Input((8, 8, 3))] + list(layers)).to_json())


def test_the_staged_prefix_is_the_first_frozen_deterministic_layers():
    import keras

    L = keras.layers
    frozen_conv = lambda: L.Conv2D(4, 3, trainable=False)  # noqa: E731
    # Frozen weighted layers, and the layers without weights between and after them.
    assert staging.frozen_prefix(_config(frozen_conv(), L.MaxPooling2D(), frozen_conv(), L.Flatten(),
                                         L.Dense(3))) == 4
    assert staging.frozen_prefix(_config(frozen_conv(), L.BatchNormalization(trainable=False),
                                         L.Flatten(), L.Dense(3))) == 3
    # A trainable layer with weights, a Dropout (it draws at every step in training, frozen
    # or not) or a regularizer ends it.
    assert staging.frozen_prefix(_config(frozen_conv(), L.Conv2D(4, 3), L.Flatten(), L.Dense(3))) == 1
    assert staging.frozen_prefix(_config(frozen_conv(), L.Dropout(0.5, trainable=False), frozen_conv(),
                                         L.Flatten(), L.Dense(3))) == 1
    assert staging.frozen_prefix(_config(
        frozen_conv(), L.Conv2D(4, 3, trainable=False, activity_regularizer="l2"), L.Flatten(),
        L.Dense(3))) == 1
    # Nothing to stage: no frozen layer first, only layers without weights, or all frozen.
    assert staging.frozen_prefix(_config(L.Conv2D(4, 3), L.Flatten(), L.Dense(3))) == 0
    assert staging.frozen_prefix(_config(L.Flatten(), L.Dense(3))) == 0
    assert staging.frozen_prefix(_config(frozen_conv(), L.Flatten(), L.Dense(3, trainable=False))) == 0
    # A mask travels beside the output, not in the features.
    embedded = keras_json.parse_model_json(keras.Sequential([
        keras.Input((5,)), L.Embedding(10, 4, trainable=False), L.Flatten(), L.Dense(3)]).to_json())
    assert staging.frozen_prefix(embedded) == 2
    masked = keras_json.parse_model_json(keras.Sequential([
        keras.Input((5,)), L.Embedding(10, 4, mask_zero=True, trainable=False), L.GlobalAveragePooling1D(),
        L.Dense(3)]).to_json())
    assert staging.frozen_prefix(masked) == 0
    # A functional model is trained whole.
    inputs = keras.Input((4,))
    functional = keras.Model(inputs, L.Dense(3)(L.Dense(4, trainable=False)(inputs)))
    assert staging.frozen_prefix(keras_json.parse_model_json(functional.to_json())) == 0


def _base_and_flat(seed: int = 1):
    """A small CNN with frozen convolutions, and its weights (MADlib's flat float32)."""
    import keras

    keras.utils.set_random_seed(seed)
    L = keras.layers
    model = keras.Sequential([
        keras.Input((12, 12, 3)), L.Conv2D(6, 3, activation="relu", trainable=False),
        L.BatchNormalization(trainable=False), L.MaxPooling2D(),
        L.Conv2D(6, 3, activation="relu", trainable=False), L.Flatten(),
        L.Dense(12, activation="relu"), L.Dropout(0.3), L.Dense(3, activation="softmax")])
    return model.to_json(), b"".join(np.asarray(v.numpy(), "<f4").tobytes() for v in model.weights)


def _buffers(rows=(70, 53)):
    rng = np.random.default_rng(4)
    out = []
    for n in rows:
        x = rng.normal(size=(n, 12, 12, 3)).astype("<f4")
        y = np.eye(3, dtype="<i2")[rng.integers(0, 3, n)]
        out.append(Buffer(n, lambda d=(x, y): d))
    return out


def test_staged_training_gives_the_whole_models_state_bit_for_bit():
    """Sub-epochs (a batch size that does not divide the buffers, a Dropout in the head)
    and an evaluation: the same metrics and the same state bytes, staged or not."""
    arch, flat = _base_and_flat()
    spec = training.ModelSpec(3, arch, COMPILE, "batch_size=16", flat)
    start = model_state.capture_state(training.compiled_model(spec, 11))
    buffers = _buffers()
    whole = training.Program.for_spec(spec)
    staged = staging.StagedProgram.for_spec(spec)
    assert isinstance(staged, staging.StagedProgram) and staged.cut == 5
    results = []
    for program in (whole, staged):
        program.restore(start)
        used = buffers if program is whole else [
            Buffer(b.rows, lambda b=b: (staged.features(b.load()[0]), b.load()[1])) for b in buffers]
        metrics = [training.train_subepoch(program, spec, used, 5, step, True).means() for step in range(3)]
        metrics.append(training.evaluate(program, spec, used, True).means())
        blob = bytes(program.capture())
        results.append((metrics, blob[state.split(blob)[1]:]))
    assert _same(results[0][0], results[1][0])
    assert _same(results[0][1], results[1][1])  # the payload: the names in the header differ


def _same_prefix(a, b) -> bool:
    """Two programs hold the same frozen weights, bit for bit."""
    return all(np.array_equal(x.numpy(), y.numpy()) for x, y in zip(a.prefix.weights, b.prefix.weights, strict=True))


def test_a_staged_models_hop_leaves_its_frozen_prefix_out():
    """A head state (the state but the prefix's weights) and the prefix's state compose the
    whole state's bytes; a program restores a head state, reading the prefix only where it
    does not hold it; a head state without a prefix to add, or into a model trained whole,
    is refused."""
    arch, flat = _base_and_flat()
    spec = training.ModelSpec(3, arch, COMPILE, "batch_size=16", flat)
    staged = staging.StagedProgram.for_spec(spec)
    staged.restore(model_state.capture_state(training.compiled_model(spec, 11)))
    used = [Buffer(b.rows, lambda b=b: (staged.features(b.load()[0]), b.load()[1])) for b in _buffers()]
    training.train_subepoch(staged, spec, used, 5, 0, True)
    staged.held_prefix = staged.digest()
    head, prefix = io.BytesIO(), io.BytesIO()
    staged.write_head(head)
    staged.write_prefix(prefix)
    whole = bytes(staged.capture())
    assert state.compose(head.getvalue(), prefix.getvalue()) == whole
    # The prefix: 3 frozen layers' weights (2 convolutions, a BatchNormalization), most bytes.
    assert len(staged.prefix_entries) == 8 and len(head.getvalue()) < len(whole) - 2000
    asked = []

    @contextlib.contextmanager
    def prefixes(digest):
        asked.append(digest)
        yield prefix.getvalue()

    other = staging.StagedProgram.for_spec(spec)
    # Its frozen layers start from other weights (no initial weights: drawn from a seed).
    unweighted = training.ModelSpec(3, arch, COMPILE, "batch_size=16", None)
    other.restore(model_state.capture_state(training.compiled_model(unweighted, 12)))
    assert not _same_prefix(other, staged)
    payload = whole[state.split(whole)[1]:]  # (the names in the header differ)
    for _ in range(2):
        other.restore(head.getvalue(), prefixes)
        restored = bytes(other.capture())
        assert restored[state.split(restored)[1]:] == payload
    assert asked == [staged.held_prefix]  # read once: then the model holds it
    assert _same_prefix(other, staged)
    with pytest.raises(state.StateFormatError, match="none to add"):
        staging.StagedProgram.for_spec(spec).restore(head.getvalue())
    with pytest.raises(state.StateFormatError, match="does not fit"):
        training.Program.for_spec(spec).restore(head.getvalue(), prefixes)


def test_features_are_the_same_bits_whatever_the_rows_computed_at_once(monkeypatch):
    arch, flat = _base_and_flat()
    staged = staging.StagedProgram.for_spec(training.ModelSpec(1, arch, COMPILE, "batch_size=8", flat))
    staged.restore(model_state.capture_state(training.compiled_model(
        training.ModelSpec(1, arch, COMPILE, "batch_size=8", flat), 0)))
    x = np.concatenate([b.load()[0] for b in _buffers()])
    together = staged.features(x)
    monkeypatch.setattr(staging, "FEATURE_ROWS", 7)
    assert _same(together, staged.features(x))
    one_by_one = np.concatenate([staged.features(x[i:i + 1]) for i in range(len(x))])
    assert _same(together, one_by_one)
    assert together.shape == (len(x),) + staged.feature_shape == (len(x), 54)


def test_the_digest_is_the_prefix_layers_and_their_weights():
    arch, flat = _base_and_flat()
    other_arch, other_flat = _base_and_flat(seed=2)
    digests = []
    for a, w in ((arch, flat), (arch, flat), (other_arch, other_flat)):
        spec = training.ModelSpec(1, a, COMPILE, "batch_size=8", w)
        program = staging.StagedProgram.for_spec(spec)
        program.restore(model_state.capture_state(training.compiled_model(spec, 9)))
        digests.append(program.digest())
    assert digests[0] == digests[1] != digests[2]
    # The head's weights are not part of it.
    head_changed = bytearray(flat)
    head_changed[-4:] = np.float32(7).tobytes()
    spec = training.ModelSpec(1, arch, COMPILE, "batch_size=8", bytes(head_changed))
    program = staging.StagedProgram.for_spec(spec)
    program.restore(model_state.capture_state(training.compiled_model(spec, 9)))
    assert program.digest() == digests[0]
    assert json.loads(program.description)[0]["class_name"] == "InputLayer"


# ---- jobs on the real server ----

from psycopg import sql  # noqa: E402

from tests.conftest import connect, coordinator_killed_mid_job, packed_iris  # noqa: E402

MST_COMPILE = ("{'loss': ['categorical_crossentropy'], 'optimizer_params_list': [{'optimizer': ['Adam'], "
               "'lr': [0.01, 0.05]}], 'metrics': ['accuracy']}")


def _transfer_models() -> list[tuple[str, bytes]]:
    """(architecture, weights) of 4 models on one base MLP (4 -> 16 -> 8): heads on its
    first layer (1, 2: one prefix), on its second (3: another prefix), and the base
    trainable whole (4: not staged)."""
    import keras

    keras.utils.set_random_seed(3)
    L = keras.layers
    first, second = L.Dense(16, activation="relu"), L.Dense(8, activation="relu")
    keras.Sequential([keras.Input((4,)), first, second])  # builds the shared layers on 4 inputs
    models = []
    for kept, frozen, head in (((first,), True, [L.Dense(6, activation="relu"), L.Dense(3, activation="softmax")]),
                               ((first,), True, [L.Dense(3, activation="softmax")]),
                               ((first, second), True, [L.Dense(3, activation="softmax")]),
                               ((first, second), False, [L.Dense(3, activation="softmax")])):
        layers = [L.Dense.from_config(layer.get_config() | {"trainable": not frozen}) for layer in kept]
        model = keras.Sequential([keras.Input((4,))] + layers + head)
        for copy, original in zip(layers, kept):
            copy.set_weights(original.get_weights())
        models.append((model.to_json(), b"".join(np.asarray(v.numpy(), "<f4").tobytes()
                                                  for v in model.weights)))
    return models


@pytest.fixture(scope="module")
def db(extension_dsn):
    with connect(extension_dsn) as conn:
        packed_iris(conn)
        for arch, weights in _transfer_models():
            conn.execute("SELECT load_keras_model('transfer_arch', %s::json, %s)", (arch, weights))
        conn.execute("SELECT generate_model_configs('transfer_arch', 'transfer_mst', ARRAY[1, 2, 3, 4], "
                     "%s, %s)", (MST_COMPILE, "{'batch_size': [16]}"))
        yield conn


def _fit(dsn: str, out: str, staged: bool, caching: bool = True) -> list[str]:
    notices: list[str] = []
    with connect(dsn, notices) as conn:
        conn.execute(f"SET madlib_mop.stage_frozen_layers = {'on' if staged else 'off'}")
        conn.execute("SELECT madlib_keras_fit_multiple_model('iris_packed', %s, 'transfer_mst', 2, "
                     "validation_table => 'iris_valid', use_caching => %s)", (out, caching))
    return notices


def _weights(conn, out: str) -> dict[int, bytes]:
    return dict(conn.execute(sql.SQL("SELECT mst_key, model_weights FROM {}").format(
        sql.Identifier(out))).fetchall())


def _validation(conn, out: str) -> dict[int, tuple]:
    return {k: (loss, acc) for k, loss, acc in conn.execute(sql.SQL(
        "SELECT mst_key, validation_loss, validation_metrics FROM {}").format(
        sql.Identifier(f"{out}_info"))).fetchall()}


def _staged_visits(conn, out: str) -> list[tuple]:
    return conn.execute(sql.SQL(
        "SELECT m.model_id, v.result->'staged', (v.result->>'pid')::int, v.segment FROM {} v "
        "JOIN {} m USING (mst_key) ORDER BY v.mst_key, v.step").format(
        sql.Identifier(f"{out}_mop_visits"), sql.Identifier(out + "_info"))).fetchall()


def test_a_job_trains_staged_models_to_the_unstaged_weights(db, extension_dsn):
    """Heads on two cuts of one base and the base trained whole, in one job: the staged job
    gives the weights and validation metrics of the same job trained whole, bit for bit;
    models 1 and 2 (one prefix) share features, model 3 has its own, model 4 none."""
    notices = _fit(extension_dsn, "staged_out", staged=True)
    assert any("6 of the 8 models train on the features of their frozen first layers" in n
               for n in notices), notices
    _fit(extension_dsn, "whole_out", staged=False)
    staged, whole = _weights(db, "staged_out"), _weights(db, "whole_out")
    assert staged.keys() == whole.keys() and len(staged) == 8
    assert _same(staged, whole)
    assert _same(_validation(db, "staged_out"), _validation(db, "whole_out"))
    visits = _staged_visits(db, "staged_out")
    prefixes = {}
    for model_id, report, _, _ in visits:
        prefixes.setdefault(model_id, set()).add(report and report["prefix"])
    assert prefixes[1] == prefixes[2] and len(prefixes[1]) == 1 and None not in prefixes[1]
    assert len(prefixes[3]) == 1 and prefixes[3] != prefixes[1] and None not in prefixes[3]
    assert prefixes[4] == {None}
    # Computed at most once per worker, segment and prefix, whichever worker the schedule
    # sends where: every other visit of that worker reused the features it kept.
    computed = [(pid, segment, r["prefix"]) for _, r, pid, segment in visits if r and r["computed"]]
    assert len(computed) == len(set(computed))
    assert not any(r["spilled"] for _, r, _, _ in visits if r)
    assert all(r["bytes"] > 0 for _, r, _, _ in visits if r)
    # Unstaged, no visit has features.
    assert all(r is None for _, r, _, _ in _staged_visits(db, "whole_out"))
    # The staged models' hops left their frozen weights out; model 4's state is whole.
    staged_bytes, whole_bytes = _state_bytes(db, "staged_out"), _state_bytes(db, "whole_out")
    assert staged_bytes[4] == whole_bytes[4]
    for model_id in (1, 2, 3):
        assert 0 < staged_bytes[model_id] < whole_bytes[model_id] - 4 * 16 * 4, model_id


def _state_bytes(conn, out: str) -> dict[int, int]:
    """Each architecture's largest state left by a visit."""
    return dict(conn.execute(sql.SQL(
        "SELECT m.model_id, max((v.result->>'state_bytes')::bigint) FROM {} v JOIN {} m USING (mst_key) "
        "GROUP BY m.model_id").format(sql.Identifier(f"{out}_mop_visits"), sql.Identifier(out + "_info"))))


def test_a_staged_job_killed_between_hops_resumes_to_the_same_weights(db, extension_dsn):
    """The coordinator dies while hop files hold head states: the resumed job composes the
    whole states it needs and ends with the weights of a job never stopped."""
    _fit(extension_dsn, "staged_reference", staged=True)
    with connect(extension_dsn) as watcher:
        job_id = coordinator_killed_mid_job(watcher, "staged_killed", 9,
                                            lambda: _fit(extension_dsn, "staged_killed", staged=True))
        watcher.execute("CALL resume(%s)", (job_id,))
    assert _same(_weights(db, "staged_killed"), _weights(db, "staged_reference"))
    assert _same(_validation(db, "staged_killed"), _validation(db, "staged_reference"))


def test_features_over_the_memory_budget_spill_to_a_table_with_the_same_weights(db, extension_dsn):
    """use_caching => FALSE keeps nothing decoded: the features go to the table of staged
    features, and are read back a buffer at a time."""
    db.execute("DELETE FROM madlib_mop.staged_features")  # computed by this job, not kept before
    _fit(extension_dsn, "spilled_out", staged=True, caching=False)
    _fit(extension_dsn, "whole_uncached_out", staged=False, caching=False)
    assert _same(_weights(db, "spilled_out"), _weights(db, "whole_uncached_out"))
    # Again, in the worker sessions kept for the role, whose temporary table exists: they
    # serve the job (no session lost, no retry) and empty it of the last job's features.
    notices = _fit(extension_dsn, "spilled_again_out", staged=True, caching=False)
    assert not [n for n in notices if "retrying" in n or "did not answer" in n], notices
    assert _weights(db, "spilled_again_out") == _weights(db, "spilled_out")
    assert _same(_validation(db, "spilled_out"), _validation(db, "whole_uncached_out"))
    reports = [r for _, r, _, _ in _staged_visits(db, "spilled_out") if r]
    assert reports and all(r["spilled"] for r in reports)
    computed = [r for r in reports if r["computed"]]
    assert 0 < len(computed) < len(reports)


def _stored(conn) -> list[tuple]:
    return conn.execute("SELECT source::regclass::text, segment, prefix, buffer_id, rows, md5(x) "
                        "FROM madlib_mop.staged_features ORDER BY 1, 2, 3, 4, 5").fetchall()


def test_staged_features_are_computed_once_per_buffer_for_every_worker_and_job(db, extension_dsn):
    """A job computes each buffer's features once (whichever worker visits a segment first),
    the other workers and the next job read them; the next job ends with the same bits."""
    db.execute("DELETE FROM madlib_mop.staged_features")
    _fit(extension_dsn, "kept_first_out", staged=True)
    visits = [r for _, r, _, _ in _staged_visits(db, "kept_first_out") if r]
    computed = [(r["prefix"], segment) for _, r, _, segment in _staged_visits(db, "kept_first_out")
                if r and r.get("computed_buffers")]  # (a worker's later visits: from its memory)
    assert len(computed) == len(set(computed)) == 2 * 2  # 2 prefixes x 2 segments, once each
    buffers = db.execute("SELECT count(*) FROM iris_packed").fetchone()[0] + \
        db.execute("SELECT count(*) FROM iris_valid").fetchone()[0]
    stored = _stored(db)
    assert len(stored) == 2 * buffers and {row[0] for row in stored} == {"iris_packed", "iris_valid"}
    _fit(extension_dsn, "kept_again_out", staged=True)
    again = [r for _, r, _, _ in _staged_visits(db, "kept_again_out") if r]
    assert again and not any(r["computed"] for r in again)
    read = [(r["prefix"], segment, pid) for _, r, pid, segment in _staged_visits(db, "kept_again_out")
            if r and r.get("stored_buffers")]
    assert read and len(read) == len(set(read))  # once per worker, segment and prefix
    assert _weights(db, "kept_again_out") == _weights(db, "kept_first_out")
    assert _stored(db) == stored and len(visits) == len(again)
    # Another role sees none of them (and computes its own).
    stranger = sql.Identifier(f"staged_stranger_{os.getpid()}")
    db.execute(sql.SQL("CREATE ROLE {0}; GRANT USAGE ON SCHEMA madlib_mop TO {0}").format(stranger))
    try:
        db.execute(sql.SQL("SET ROLE {}").format(stranger))
        assert db.execute("SELECT count(*) FROM madlib_mop.staged_features").fetchone()[0] == 0
    finally:
        db.execute("RESET ROLE")
        db.execute(sql.SQL("DROP OWNED BY {0}; DROP ROLE {0}").format(stranger))


def test_a_bad_staging_setting_is_refused(db):
    import psycopg

    db.execute("SET madlib_mop.stage_frozen_layers = 'sometimes'")
    try:
        with pytest.raises(psycopg.errors.InvalidParameterValue, match="neither on nor off"):
            db.execute("SELECT madlib_keras_fit_multiple_model('iris_packed', 'never_out', "
                       "'transfer_mst', 1)")
    finally:
        db.execute("RESET madlib_mop.stage_frozen_layers")
    assert db.execute("SELECT to_regclass('never_out')").fetchone()[0] is None


def test_materialized_features_train_a_head_to_the_staged_jobs_weights(db, extension_dsn):
    """materialize_features_byom writes model 2's first layer's output for the training and
    the validation data; the head alone, trained on them with model 2's configurations
    (same mst_keys, seed, visit orders and head weights), ends with the staged job's head weights, bit for
    bit.  materialize_features reads a fit's output the same way."""
    import keras
    import psycopg

    if db.execute("SELECT to_regclass('staged_out')").fetchone()[0] is None:
        _fit(extension_dsn, "staged_out", staged=True)
    notices: list[str] = []
    with connect(extension_dsn, notices) as conn:
        for source, out in (("iris_packed", "iris_features"), ("iris_valid", "iris_valid_features")):
            conn.execute("SELECT materialize_features_byom('transfer_arch', 2, %s, %s, '0')", (source, out))
    assert any("segment 2 of 2" in n for n in notices) and any("holds 150 rows" in n for n in notices)
    summary = db.execute("SELECT feature_shape, normalizing_const, features_of, num_segments, "
                         "rows_per_segment FROM iris_features_summary").fetchone()
    packed = db.execute("SELECT num_segments, rows_per_segment FROM iris_packed_summary").fetchone()
    assert summary[:2] == ([16], 1.0) and "transfer_arch model_id 2" in summary[2]
    assert summary[3:] == packed
    assert db.execute("SELECT count(*), sum(attributes_shape[1]) FROM iris_features").fetchone() == (
        db.execute("SELECT count(*), sum(attributes_shape[1]) FROM iris_packed").fetchone())

    weights = {k: w for k, w in db.execute(
        "SELECT mst_key, model_weights FROM staged_out WHERE mst_key IN "
        "(SELECT mst_key FROM transfer_mst WHERE model_id = 2)").fetchall()}
    head_bytes = 4 * (16 * 3 + 3)
    head = keras.Sequential([keras.Input((16,)), keras.layers.Dense(3, activation="softmax")])
    first = next(iter(weights))
    db.execute("SELECT load_keras_model('head_arch', %s::json, %s)", (
        head.to_json(), bytes(db.execute("SELECT model_weights FROM transfer_arch WHERE model_id = 2")
                              .fetchone()[0])[-head_bytes:]))
    # Every mst_key of the staged job (the head under all of them): a model's visit orders
    # are drawn with those of the job's other models.
    db.execute("CREATE TABLE head_mst AS SELECT mst_key, 1 AS model_id, compile_params, fit_params "
               "FROM transfer_mst")
    db.execute("CREATE TABLE head_mst_summary AS SELECT * FROM transfer_mst_summary")
    db.execute("UPDATE head_mst_summary SET model_arch_table = 'head_arch'")
    db.execute("SELECT madlib_keras_fit_multiple_model('iris_features', 'head_out', 'head_mst', 2, "
               "validation_table => 'iris_valid_features')")
    heads = dict(db.execute("SELECT mst_key, model_weights FROM head_out").fetchall())
    assert weights.keys() < heads.keys() and len(weights) == 2
    for mst_key, whole in weights.items():
        assert bytes(heads[mst_key]) == bytes(whole)[-head_bytes:]

    # From a fit's output, by layer name; the errors.
    layer = json.loads(db.execute("SELECT model_arch::text FROM staged_out WHERE mst_key = %s",
                                  (first,)).fetchone()[0])["config"]["layers"][1]["config"]["name"]
    db.execute("SELECT materialize_features('staged_out', 'iris_packed', 'iris_from_fit', %s, %s)",
               (layer, first))
    assert db.execute("SELECT array_agg(attributes ORDER BY __dist_key__, buffer_id) FROM iris_from_fit").fetchone() == \
        db.execute("SELECT array_agg(attributes ORDER BY __dist_key__, buffer_id) FROM iris_features").fetchone()
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="is not a layer") as error:
        db.execute("SELECT materialize_features('staged_out', 'iris_packed', 'never', 'nope', %s)", (first,))
    assert layer in error.value.diag.message_detail
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="is not a layer"):
        db.execute("SELECT materialize_features('staged_out', 'iris_packed', 'never', '--1', %s)", (first,))
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="is the model's output"):
        db.execute("SELECT materialize_features('staged_out', 'iris_packed', 'never', '-1', %s)", (first,))
    with pytest.raises(psycopg.errors.DuplicateTable):
        db.execute("SELECT materialize_features_byom('transfer_arch', 2, 'iris_packed', 'iris_features', '0')")
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="does not match the input shape"):
        db.execute("SELECT materialize_features_byom('head_arch', 1, 'iris_packed', 'never', '0')")
    assert db.execute("SELECT to_regclass('never'), to_regclass('never_summary')").fetchone() == (None, None)


def test_load_transfer_model_freezes_a_stored_models_first_layers_under_a_new_head(db, extension_dsn):
    """From an architecture table's model with weights (model 4: the base trainable whole):
    the layers up to the one named, frozen with their weights, then the head from its JSON,
    initialised from the seed.  The errors say what to pass."""
    import psycopg

    head = '[{"class_name": "Dense", "config": {"units": 3, "activation": "softmax"}}]'
    names = [layer["config"]["name"] for layer in json.loads(db.execute(
        "SELECT model_arch::text FROM transfer_arch WHERE model_id = 4").fetchone()[0])["config"]["layers"]
        if layer["class_name"] != "InputLayer"]
    made = [db.execute("SELECT load_transfer_model('tl_arch', 'transfer_arch', 4, %s, %s, 'tl')",
                       (layer, head)).fetchone()[0] for layer in (names[1], "1", names[0])]
    assert made == [1, 2, 3]
    rows = db.execute("SELECT model_id, model_arch::text, model_weights FROM tl_arch ORDER BY 1").fetchall()
    base = bytes(db.execute("SELECT model_weights FROM transfer_arch WHERE model_id = 4").fetchone()[0])
    assert rows[0][2] == rows[1][2]  # by name or by index, and the same seed: the same model
    for (_, arch, weights), frozen in zip(rows, (2, 2, 1)):
        config = keras_json.parse_model_json(arch)
        assert staging.frozen_prefix(config) == frozen
        prefix = 4 * (4 * 16 + 16 + (16 * 8 + 8 if frozen == 2 else 0))
        assert bytes(weights)[:prefix] == base[:prefix]
    assert json.loads(rows[0][1])["config"]["layers"][-1]["config"]["name"] == "head_1_dense"
    other_seed = db.execute("SELECT load_transfer_model('tl_arch', 'transfer_arch', 4, %s, %s, seed => 5)",
                            (names[1], head)).fetchone()[0]
    assert db.execute("SELECT model_weights FROM tl_arch WHERE model_id = %s", (other_seed,)).fetchone()[0] \
        != rows[0][2]
    for layer, bad_head, error, text in (
            ("nope", head, psycopg.errors.InvalidParameterValue, "is not a layer"),
            (names[0], '{"class_name": "Dense"}', psycopg.errors.InvalidParameterValue, "JSON array"),
            (names[0], '[{"class_name": "Lambda", "config": {"function": "x"}}]',
             psycopg.errors.InvalidParameterValue, "Lambda"),
            (names[0], json.dumps([{"class_name": "Dense", "config": {"units": 3, "name": names[0]}}]),
             psycopg.errors.InvalidParameterValue, "name of a base layer")):
        with pytest.raises(error, match=text):
            db.execute("SELECT load_transfer_model('tl_arch', 'transfer_arch', 4, %s, %s)", (layer, bad_head))
    with pytest.raises(psycopg.errors.NullValueNotAllowed, match="base_id is NULL"):
        db.execute("SELECT load_transfer_model('tl_arch', 'transfer_arch', NULL, '0', %s)", (head,))
    # From a fit's output, by a deployment's name.
    if db.execute("SELECT to_regclass('staged_out')").fetchone()[0] is None:
        _fit(extension_dsn, "staged_out", staged=True)
    db.execute("SELECT deploy_model('staged_out', 1, 'tl_prod')")
    deployed = db.execute("SELECT load_transfer_model('tl_arch', 'tl_prod', NULL, '0', %s)", (head,)).fetchone()[0]
    assert bytes(db.execute("SELECT model_weights FROM tl_arch WHERE model_id = %s", (deployed,)).fetchone()[0]
                 )[:4 * 80] == bytes(db.execute("SELECT model_weights FROM staged_out WHERE mst_key = 1")
                                     .fetchone()[0])[:4 * 80]
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="neither a fit's output"):
        db.execute("SELECT load_transfer_model('tl_arch', 'iris', 4, '0', %s)", (head,))
    with pytest.raises(psycopg.errors.NullValueNotAllowed, match="base_id is NULL"):
        db.execute("SELECT load_transfer_model('tl_arch', 'staged_out', NULL, '0', %s)", (head,))
    with pytest.raises(psycopg.errors.NullValueNotAllowed, match="layer is NULL"):
        db.execute("SELECT load_transfer_model('tl_arch', 'transfer_arch', 4, NULL, %s)", (head,))
    # From a transfer model: the new head's layers are named apart from the base's head.
    again = db.execute("SELECT load_transfer_model('tl_arch', 'tl_arch', 1, '0', %s)", (head,)).fetchone()[0]
    layers = json.loads(db.execute("SELECT model_arch::text FROM tl_arch WHERE model_id = %s",
                                   (again,)).fetchone()[0])["config"]["layers"]
    assert layers[-1]["config"]["name"] == "head_1_dense_new" and len(layers) == 3  # input, frozen, head
    assert db.execute("SELECT count(*) FROM tl_arch").fetchone()[0] == 6
