"""The job's state store without a database: pieces, hop files and their clean-up, and
MADlib's weights read from a state without copying it whole."""

from __future__ import annotations

import numpy as np
import pytest

from madlib_mop.errors import MadlibMopError
from madlib_mop.job.state_store import HopFiles
from madlib_mop.runtime import state


def test_a_state_is_cut_into_pieces_of_at_most_the_limit(monkeypatch):
    monkeypatch.setattr(state, "PIECE_BYTES", 10)
    blob = bytes(range(25))
    parts = list(state.pieces(blob))
    assert [n for n, _ in parts] == [0, 1, 2]
    assert [len(p) for _, p in parts] == [10, 10, 5]
    assert b"".join(p for _, p in parts) == blob
    assert list(state.pieces(b"")) == [(0, b"")]  # an empty state is one empty piece


def test_hop_files_are_written_whole_read_and_removed(tmp_path):
    hops = HopFiles(16384, 7, "run-a", root=tmp_path)
    with pytest.raises(MadlibMopError) as raised:  # only the job's coordinator makes the folder
        hops.write(1, 3, b"state bytes")
    assert raised.value.sqlstate == "58030" and not hops.job_directory.exists()
    hops.create()
    assert hops.read(1, 3) is None and not hops.holds(1, 3)
    hops.write(1, 3, b"state bytes")
    assert hops.read(1, 3) == b"state bytes" and hops.holds(1, 3)
    assert [p.name for p in hops.run_directory.iterdir()] == ["1-3.state"]  # no partial file left
    hops.remove(1, 3)
    hops.remove(1, 3)  # removing twice is harmless
    assert hops.read(1, 3) is None


def test_a_state_written_a_piece_at_a_time_that_fails_mid_way_leaves_no_file(tmp_path):
    """A fetch whose sending server goes away after some pieces (a connection error, not an
    OS error): neither the state nor its partial file is left."""
    class ConnectionLost(Exception):
        pass

    hops = HopFiles(16384, 7, "run-a", root=tmp_path)
    hops.create()

    def fetched(handle):
        handle.write(b"a piece")
        raise ConnectionLost()
    with pytest.raises(ConnectionLost):
        hops.write(1, 2, fetched)
    assert not hops.holds(1, 2)
    assert list(hops.run_directory.iterdir()) == []


def test_files_of_an_earlier_server_run_are_removed_for_every_job(tmp_path):
    old_run = HopFiles(16384, 7, "run-a", root=tmp_path)
    other_job_old = HopFiles(16384, 8, "run-a", root=tmp_path)
    other_job_now = HopFiles(16384, 9, "run-b", root=tmp_path)
    other_database = HopFiles(99, 7, "run-a", root=tmp_path)
    for hops, mst_key, blob in ((old_run, 1, b"x"), (other_job_old, 2, b"y"),
                                (other_job_now, 3, b"z"), (other_database, 1, b"w")):
        hops.create()
        hops.write(mst_key, 1, blob)
    dropped_database = HopFiles(77, 1, "run-b", root=tmp_path)
    dropped_database.create()
    dropped_database.write(1, 1, b"v")
    current = HopFiles(16384, 7, "run-b", root=tmp_path)
    current.remove_other_runs({16384, 99})
    assert old_run.read(1, 1) is None and other_job_old.read(2, 1) is None
    assert not other_job_old.job_directory.exists()  # nothing left of job 8
    assert other_job_now.read(3, 1) == b"z"  # this run's files stay
    assert other_database.read(1, 1) == b"w"  # another database's are its own
    assert not dropped_database.job_directory.parent.exists()  # a dropped database's go


def test_madlib_weights_of_a_state_are_a_view_when_they_are_float32():
    entries = [state.Entry("weights", "w", np.arange(6, dtype="<f4").reshape(2, 3)),
               state.Entry("weights", "b", np.ones(3, dtype="<f4")),
               state.Entry("optimizer", "m", np.full(9, 7, dtype="<f4"))]
    blob = state.encode(entries)
    view = state.madlib_weights(blob)
    assert isinstance(view, memoryview)
    assert np.array_equal(np.frombuffer(view, dtype="<f4"), np.r_[np.arange(6), np.ones(3)])
    # float16 weights are converted (a copy), as MADlib's model_weights are float32
    half = state.encode([state.Entry("weights", "w", np.arange(4, dtype="<f2"))])
    assert np.array_equal(np.frombuffer(state.madlib_weights(half), dtype="<f4"), np.arange(4))


def _entries(*arrays) -> list[state.Entry]:
    return [state.Entry("weights" if i < 3 else "optimizer", f"v{i}", a) for i, a in enumerate(arrays)]


def test_a_head_state_is_read_whole_composed_with_its_prefix(tmp_path):
    """A hop file without a staged model's frozen prefix: read whole (the prefix's arrays in
    their places, the bytes of the whole state), or as stored where a worker asks so."""
    arrays = [np.arange(6, dtype="<f4").reshape(2, 3), np.ones(4, "<f4"), np.full(3, 7, "<f4"),
              np.array([5], "<i8")]
    whole = bytes(state.encode(_entries(*arrays)))
    digest = "ab12"
    prefix = bytes(state.encode([_entries(*arrays)[i] for i in (0, 2)], state.prefix_meta(digest)))
    head = bytes(state.encode([_entries(*arrays)[i] for i in (1, 3)], state.head_meta(digest, [0, 2])))
    assert state.compose(head, prefix) == whole
    hops = HopFiles(16384, 7, "run-a", root=tmp_path)
    hops.create()
    hops.write(1, 2, head)
    with pytest.raises(MadlibMopError) as raised:  # its prefix is not kept: not read as whole
        hops.read(1, 2)
    assert raised.value.sqlstate == "55000"
    written = []
    for _ in range(2):  # kept once
        hops.keep_prefix(digest, lambda handle: written.append(handle.write(prefix)))
    assert len(written) == 1
    assert hops.read(1, 2) == whole
    with hops.mapped(1, 2, whole=False) as stored:
        assert bytes(stored) == head and state.left_out_prefix(stored) == digest
    with pytest.raises(state.StateFormatError, match="not the one"):  # another prefix's
        state.compose(head, bytes(state.encode(_entries(*arrays)[:2], state.prefix_meta("cd34"))))
    with pytest.raises(ValueError, match="digest"):  # a digest never names another path
        hops.prefix_path("../x")
