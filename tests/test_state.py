"""The model state's byte format (madlib_mop.runtime.state), without a database or Keras."""

from __future__ import annotations

import numpy as np
import pytest

from madlib_mop.runtime import state


def _entries():
    return [state.Entry("weights", "dense/kernel", np.arange(6, dtype=np.float32).reshape(2, 3)),
            state.Entry("weights", "dense/bias", np.array([0.5, -1.0, 2.0], dtype=np.float32)),
            state.Entry("variables", "seed_generator/state", np.array([7, 9], dtype=np.uint32)),
            state.Entry("optimizer", "iteration", np.array(12, dtype=np.int64)),
            state.Entry("optimizer", "adam/m", np.full((2, 3), 0.25, dtype=np.float64))]


def test_round_trip_keeps_kinds_names_dtypes_shapes_and_bytes():
    blob = state.encode(_entries(), {"step": 4})
    decoded, meta = state.decode(blob)
    assert meta == {"step": 4}
    for found, expected in zip(decoded, _entries(), strict=True):
        assert (found.kind, found.name) == (expected.kind, expected.name)
        assert found.array.dtype == expected.array.dtype.newbyteorder("<")
        assert found.array.shape == expected.array.shape
        assert np.array_equal(found.array, expected.array)
    assert state.encode(decoded, meta) == blob  # bitwise stable


def test_big_endian_input_is_stored_little_endian():
    big = np.array([1.5, 2.5], dtype=">f4")
    decoded, _ = state.decode(state.encode([state.Entry("weights", "w", big)]))
    assert decoded[0].array.dtype.str == "<f4" and decoded[0].array.tolist() == [1.5, 2.5]


def test_madlib_weights_are_the_weights_alone_as_float32():
    weights = np.frombuffer(state.madlib_weights(state.encode(_entries())), dtype="<f4")
    assert weights.tolist() == [0, 1, 2, 3, 4, 5, 0.5, -1.0, 2.0]


@pytest.mark.parametrize("blob", [b"", b"NOTSTATE" + b"\0" * 20, state.encode(_entries())[:-3]])
def test_other_bytes_are_refused(blob):
    with pytest.raises(state.StateFormatError):
        state.decode(blob)


def test_a_state_of_another_model_is_refused():
    other = [state.Entry("weights", "dense/kernel", np.zeros((3, 3), dtype=np.float32))]
    with pytest.raises(state.StateFormatError):
        state.check_layout(state.layout_of(state.decode(state.encode(_entries()))[0][:1]),
                           state.layout_of(other))
