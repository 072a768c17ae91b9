"""A model whose state and weights are larger than one PostgreSQL value (1 GB): it trains,
resumes after a killed coordinator to the same bits, evaluates, predicts and warm starts.

The model is kept cheap to train: an Embedding of 70 million rows (4 columns) on iris,
whose features cast to the row numbers 0-7, trained with plain SGD (no optimizer
variables): its state and its weights are 1.1 GB each.  `<out>`.model_weights is then NULL
and the weights are in `<out>_mop_weights`, in pieces.
"""

from __future__ import annotations

import json

import pytest

from tests.conftest import connect, coordinator_killed_mid_job, iris_table

ROWS = 70_000_000
MORE_THAN_ONE_VALUE = 1 << 30


def _architecture(rows: int = ROWS) -> str:
    """The model's JSON, written from a model of 8 rows whose Embedding then says `rows`: a
    model built with ROWS would hold its 1.1 GB of weights in this process for nothing."""
    import keras

    config = json.loads(keras.Sequential([keras.Input((4,)), keras.layers.Embedding(8, 4, name="rows"),
                                          keras.layers.Flatten(),
                                          keras.layers.Dense(3, activation="softmax")]).to_json())
    [embedding] = [layer for layer in config["config"]["layers"] if layer["config"]["name"] == "rows"]
    embedding["config"]["input_dim"] = rows
    return json.dumps(config)


@pytest.fixture(scope="module")
def data(extension_dsn):
    with connect(extension_dsn) as conn:
        iris_table(conn)
        conn.execute("SELECT training_preprocessor_dl('iris', 'iris_packed', 'class_text', "
                     "'attributes', distribution_rules => '2')")
        conn.execute("SELECT load_keras_model('arch', %s::json)", (_architecture(),))
    return extension_dsn


def _connect(dsn: str):
    """A session whose worker sessions end with each call (none kept idle, holding a model of
    GBs, beside the next call's)."""
    conn = connect(dsn)
    conn.execute("SET madlib_mop.worker_idle_seconds = 0")
    return conn


def _fit(dsn: str, out: str, warm_start: bool = False) -> None:
    with _connect(dsn) as conn:
        conn.execute("SELECT madlib_keras_fit('iris_packed', %s, 'arch', 1, "
                     "$$loss='categorical_crossentropy', optimizer='SGD(learning_rate=0.1)', "
                     "metrics=['accuracy']$$, 'batch_size=50, epochs=1', 1, "
                     "warm_start => %s)", (out, warm_start))


def test_a_state_over_1_gb_trains_resumes_evaluates_predicts_and_warm_starts(data):
    _fit(data, "big")
    with _connect(data) as conn:
        # Killed between its 2 hops: the resume starts from the state in the hop file.
        job_id = coordinator_killed_mid_job(conn, "big_resumed", 1, lambda: _fit(data, "big_resumed"),
                                            timeout=600)
        conn.execute("CALL resume(%s)", (job_id,))
        state_bytes = conn.execute("SELECT sum(octet_length(state)) FROM big_mop_state "
                                   "WHERE step = 2").fetchone()[0]
        assert state_bytes > MORE_THAN_ONE_VALUE
        assert conn.execute("SELECT max(piece) FROM big_mop_state").fetchone()[0] >= 256  # 4 MB each
        # The weights too big for model_weights: NULL there, in pieces beside it.
        assert conn.execute("SELECT model_weights IS NULL FROM big").fetchone()[0]
        pieces, weight_bytes = conn.execute("SELECT count(*), sum(octet_length(model_weights)) "
                                            "FROM big_mop_weights").fetchone()
        assert pieces >= 256 and weight_bytes == 4 * (ROWS * 4 + 4 * 4 * 3 + 3) > MORE_THAN_ONE_VALUE
        assert conn.execute("SELECT count(*) FROM big_mop_weights a FULL JOIN big_resumed_mop_weights b "
                            "USING (mst_key, piece) WHERE a.model_weights IS DISTINCT FROM "
                            "b.model_weights").fetchone()[0] == 0
        conn.execute("SELECT madlib_keras_evaluate('big', 'iris_packed', 'big_evaluated')")
        loss, accuracy = conn.execute("SELECT loss, metric FROM big_evaluated").fetchone()
        assert loss > 0 and 0 <= accuracy <= 1
        conn.execute("SELECT madlib_keras_predict('big', 'iris', 'id', 'attributes', 'big_predicted', "
                     "'response')")
        assert conn.execute("SELECT count(DISTINCT id) FROM big_predicted").fetchone()[0] == 150
        # The predictions are the evaluated model's: their accuracy is evaluate's.
        predicted = conn.execute("SELECT avg((p.class_value = i.class_text)::int) FROM big_predicted p "
                                 "JOIN iris i USING (id)").fetchone()[0]
        assert abs(float(predicted) - accuracy) < 1e-6
        trained = conn.execute("SELECT array_agg(md5(state) ORDER BY piece) FROM big_mop_state "
                               "WHERE step = 2").fetchone()[0]
    _fit(data, "big", warm_start=True)  # continues from the state table's pieces
    with _connect(data) as conn:
        assert conn.execute("SELECT array_agg(md5(state) ORDER BY piece) FROM big_mop_state "
                            "WHERE step = 0").fetchone()[0] == trained
        assert conn.execute("SELECT count(*) FROM big_mop_weights").fetchone()[0] == pieces
