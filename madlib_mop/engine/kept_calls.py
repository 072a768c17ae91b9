"""A segment server's worker's calls whose states stay on segment servers
(`segment.kept_states`): a visit's state is found where the model's last visit left it (its
worker fetches it from that server), or carried by the coordinator (a step-0 state, a
durable one, or one kept on a server the worker's server cannot reach), a piece per call.
A fused group's call finds each of its models' states so.  `engine.cluster.ClusterWorker`
has them; a server whose extension predates kept states gets a model's state with the call
and returns the new one, as on one server (and trains no fused group).
"""

from __future__ import annotations

import time
from typing import Any, Callable

import psycopg

from madlib_mop import errors
from madlib_mop.engine.base import VisitRecord
from madlib_mop.errors import MadlibMopError
from madlib_mop.json_values import json_value
from madlib_mop.runtime import state


class KeptStateCalls:
    """Training and validation calls of a segment server's worker (mixed into
    `engine.cluster.ClusterWorker`, whose session, job, `states` (`SegmentStates`), `peers`
    and `receives` they use)."""

    def _source(self, mst_key: int, step: int, model_state: bytes | None) -> tuple[str | None, bytes | None]:
        """Where the call finds the state: (the segment server it fetches it from, None: its
        own server or the state given), and the state's bytes when the coordinator carries
        them (its server cannot reach the one that keeps it)."""
        if model_state is not None:
            return None, model_state
        source = self.states.locate(mst_key, step) if self.states is not None else None
        if source is None:
            raise MadlibMopError(f"no state of model {mst_key} after step {step} is known",
                                 sqlstate=errors.UNDEFINED_FILE, hint="Resume the job.")
        if source == self.server.name:
            return None, None
        if source in self.peers:
            return source, None
        return None, self.states.read(mst_key, step)

    def train(self, job_id, mst_key, step, segment, model_state):
        """A sub-epoch whose new state stays on this worker's server (`segment.kept_states`),
        its state fetched from where the last visit left it; on a server whose extension
        predates that, the state goes with the call and comes back."""
        self._send_job()
        if self.peers is None:
            new_state, record = super().train(job_id, mst_key, step, segment, model_state)
            record.coordinator_bytes = len(model_state or b"") + len(new_state or b"")
            return new_state, record
        started = time.perf_counter()
        model = self.states.models.get(mst_key)
        (result,), carried = self._from_source(
            "_mop_segment_train", job_id, mst_key, step, model_state,
            lambda source, carried: (job_id, mst_key, step, segment, source, carried,
                                     model.pruned_below if model is not None else 1))
        record = VisitRecord.from_json(result)
        record.seconds["call"] = time.perf_counter() - started
        # A carried state came in from the server that kept it, unless it was the job's own.
        record.kept_on = self.server.name
        record.coordinator_bytes = len(carried or b"") * (1 if model_state is not None else 2)
        return None, record

    def evaluate(self, job_id, mst_key, step, partition, model_state):
        self._send_job()
        if self.peers is None:
            return super().evaluate(job_id, mst_key, step, partition, model_state)
        (result,), _ = self._from_source("_mop_segment_validate", job_id, mst_key, step, model_state,
                                         lambda *found: (job_id, mst_key, step, partition, *found))
        return json_value(result)

    def train_fused(self, job_id, mst_keys, steps, segment, model_states):
        """A fused group's sub-epoch (`segment.kept_states.train_fused`): each model's state
        found as `train` finds it, the new states kept on this worker's server."""
        started = time.perf_counter()
        below = [getattr(self.states.models.get(key), "pruned_below", 1) for key in mst_keys]
        (results,), carried = self._from_sources(
            "_mop_segment_train_fused", job_id, mst_keys, steps, model_states,
            lambda sources: (job_id, list(mst_keys), list(steps), segment, sources, below))
        records = [VisitRecord.from_json(result) for result in results]
        for record, blob, given in zip(records, carried, model_states):
            record.seconds["call"] = (time.perf_counter() - started) / len(records)
            record.kept_on = self.server.name
            record.coordinator_bytes = len(blob or b"") * (1 if given is not None else 2)
        return [(None, record) for record in records]

    def evaluate_fused(self, job_id, mst_keys, steps, partition, model_states):
        (results,), _ = self._from_sources(
            "_mop_segment_validate_fused", job_id, mst_keys, steps, model_states,
            lambda sources: (job_id, list(mst_keys), list(steps), partition, sources))
        return [json_value(result) for result in results]

    def _from_sources(self, function: str, job_id: int, mst_keys: tuple[int, ...], steps: tuple[int, ...],
                      model_states: tuple[bytes | None, ...], arguments: Callable[[list[str | None]], tuple]
                      ) -> tuple[tuple, list[bytes | None]]:
        """A fused call, each model's state found as `_from_source` finds one (the carried ones
        sent in pieces before the call): the call's row, and what was carried of each."""
        self._send_job()
        if self.peers is None:  # (kept states came before fused calls: `Engine.without_fusion` names it)
            raise self._unfused()
        found = [self._source(key, step, given) for key, step, given in zip(mst_keys, steps, model_states)]
        try:
            return self._call(function, *arguments(self._sent(job_id, mst_keys, steps, found))), [c for _, c in found]
        except psycopg.Error as error:
            sources = {source for source, _ in found if source}
            if error.sqlstate != errors.UNABLE_TO_CONNECT or not self.usable or not sources:
                raise
            # The server the fetch could not reach, as its message names it (else all of them).
            failed = {s for s in sources if f"segment server {s} could not be reached" in str(error)} or sources
        self.peers -= failed
        again = [(None, self.states.read(key, step)) if source in failed else (source, None)
                 for (source, _), key, step in zip(found, mst_keys, steps)]
        # (the states carried before are on the server: only those read now are sent)
        row = self._call(function, *arguments(self._sent(job_id, mst_keys, steps, again)))
        return row, [first if first is not None else then for (_, first), (_, then) in zip(found, again)]

    def _sent(self, job_id: int, mst_keys: tuple[int, ...], steps: tuple[int, ...],
              found: list[tuple[str | None, bytes | None]]) -> list[str | None]:
        """The carried states of a fused call sent to its server (`_carry`): where each
        model's state is fetched from."""
        for (_, carried), key, step in zip(found, mst_keys, steps):
            if self._carry(job_id, key, step, carried) is not None:
                raise self._unfused()
        return [source for source, _ in found]

    def _unfused(self) -> MadlibMopError:
        """A server whose extension predates kept states, or states taken in pieces: it
        trains no fused group."""
        return MadlibMopError(f"{self.server.label}'s extension trains no fused group",
                              sqlstate=errors.FEATURE_NOT_SUPPORTED,
                              hint=f"ALTER EXTENSION madlib_mop UPDATE on {self.server.label}, or "
                                   "SET madlib_mop.fuse_models = off.")

    def _from_source(self, function: str, job_id: int, mst_key: int, step: int, model_state: bytes | None,
                     arguments: Callable[[str | None, bytes | None], tuple]) -> tuple[tuple, bytes | None]:
        """The call, its state found where it is (`_source`); when its server cannot reach
        the one that keeps the state (08001), the coordinator carries it, from then on."""
        source, carried = self._source(mst_key, step, model_state)
        try:
            return self._call(function, *arguments(source, self._carry(job_id, mst_key, step, carried))), carried
        except psycopg.Error as error:
            if source is None or error.sqlstate != errors.UNABLE_TO_CONNECT or not self.usable:
                raise
        self.peers.discard(source)
        carried = self.states.read(mst_key, step)
        return self._call(function, *arguments(None, self._carry(job_id, mst_key, step, carried))), carried

    def _carry(self, job_id: int, mst_key: int, step: int, blob: bytes | None) -> bytes | None:
        """None: the carried state went to its server (`sent_in_pieces`); else it goes with the call."""
        if blob is None or not self.receives:
            return blob
        self.receives = sent_in_pieces(lambda *a: self._call("_mop_segment_receive", job_id, mst_key, step, *a),
                                       blob)
        return None if self.receives else blob


def sent_in_pieces(receive: Callable[[bytes, int, bool], Any], blob: bytes) -> bool:
    """A state the coordinator carries to a segment server's worker, into the hop file of
    its server, a piece per call (`receive(piece, offset, last)`: `_mop_segment_receive`),
    where the call that trains or validates it finds it: so it may be of any size (as an
    argument of that call it would be one value, at most 1 GB).  False: that server's
    extension predates this (0.18.0), nothing was sent."""
    try:
        for number, piece in state.pieces(blob):
            offset = number * state.PIECE_BYTES
            receive(piece, offset, offset + len(piece) >= len(blob))
    except psycopg.Error as error:
        if error.sqlstate != errors.UNDEFINED_FUNCTION:
            raise
        return False
    return True
