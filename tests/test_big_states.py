"""A model whose state is larger than one PostgreSQL value (1 GB): it trains, resumes after
a killed coordinator to the same bits, evaluates and predicts.

The model is kept cheap to train: an Embedding of 23 million rows (4 columns) on iris,
whose features cast to the row numbers 0-7.  With Adam's two moments its state is
1.1 GB; its weights (368 MB) still fit `<out>.model_weights`.
"""

from __future__ import annotations

import pytest

from tests.conftest import connect, coordinator_killed_mid_job, iris_table

ROWS = 23_000_000
STATE_BYTES_MORE_THAN = 1 << 30


def _architecture() -> str:
    import keras

    return keras.Sequential([keras.Input((4,)), keras.layers.Embedding(ROWS, 4),
                             keras.layers.Flatten(),
                             keras.layers.Dense(3, activation="softmax")]).to_json()


@pytest.fixture(scope="module")
def data(extension_dsn):
    with connect(extension_dsn) as conn:
        iris_table(conn)
        conn.execute("SELECT training_preprocessor_dl('iris', 'iris_packed', 'class_text', "
                     "'attributes', distribution_rules => '2')")
        conn.execute("SELECT load_keras_model('arch', %s::json)", (_architecture(),))
    return extension_dsn


def _fit(dsn: str, out: str) -> None:
    with connect(dsn) as conn:
        conn.execute("SELECT madlib_keras_fit('iris_packed', %s, 'arch', 1, "
                     "$$loss='categorical_crossentropy', optimizer='Adam(learning_rate=0.01)', "
                     "metrics=['accuracy']$$, 'batch_size=50, epochs=1', 1)", (out,))


def test_a_state_over_1_gb_trains_resumes_evaluates_and_predicts(data):
    _fit(data, "big")
    with connect(data) as conn:
        # Killed between its 2 hops: the resume starts from the state in the hop file.
        job_id = coordinator_killed_mid_job(conn, "big_resumed", 1, lambda: _fit(data, "big_resumed"),
                                            timeout=600)
        conn.execute("CALL resume(%s)", (job_id,))
        state_bytes = conn.execute("SELECT sum(octet_length(state)) FROM big_mop_state "
                                   "WHERE step = 2").fetchone()[0]
        assert state_bytes > STATE_BYTES_MORE_THAN
        assert conn.execute("SELECT max(piece) FROM big_mop_state").fetchone()[0] >= 4  # 256 MB each
        weights = conn.execute("SELECT model_weights FROM big").fetchone()[0]
        assert len(weights) == 4 * (ROWS * 4 + 4 * 4 * 3 + 3)
        assert conn.execute("SELECT model_weights FROM big_resumed").fetchone()[0] == weights
        conn.execute("SELECT madlib_keras_evaluate('big', 'iris_packed', 'big_evaluated')")
        loss, accuracy = conn.execute("SELECT loss, metric FROM big_evaluated").fetchone()
        assert loss > 0 and 0 <= accuracy <= 1
        conn.execute("SELECT madlib_keras_predict('big', 'iris', 'id', 'attributes', 'big_predicted')")
        assert conn.execute("SELECT count(DISTINCT id) FROM big_predicted").fetchone()[0] == 150
