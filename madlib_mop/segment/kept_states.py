"""A segment server's side of states that travel between segment servers.

A worker of a segment server keeps the state each of its visits leaves, in a hop file of its
own server (`state_store.HopFiles.of_role`: the role's folder for the job's `store` token),
and does not send it back.  The next visit of the model, on whichever segment server, is
told where the state is (`state_from`: the name of a foreign server of *its* server, as
the coordinator names the segment servers) and fetches it from there over a session of its
own, as the role, with the password of the role's user mapping on its server
(`db.segments.peer_conninfo`: the same checks as a coordinator's), a piece at a time
(`serve`), into its own hop file.  The coordinator sends decisions, not bytes
(`engine.segment_states`).

A server keeps a model's states until a later call of that model there says they are not
needed (`forget_below`: the coordinator's durable copy and pending validation passes), and
the job's folder until the coordinator's job ends (`forget`).
"""

from __future__ import annotations

import contextlib
import itertools
import time
from typing import TYPE_CHECKING, Any, Callable, Iterator

from madlib_mop import errors
from madlib_mop.db import catalog
from madlib_mop.engine.base import VisitRecord
from madlib_mop.errors import MadlibMopError
from madlib_mop.job import state_store
from madlib_mop.runtime import state

if TYPE_CHECKING:
    import psycopg

    from madlib_mop.db import segments

# Sessions to other segment servers, by (role, conninfo): kept for the worker's later
# fetches (a login costs milliseconds; a job fetches once per hop).  (psycopg and the
# segment servers' catalog are imported by the functions that fetch: a session that only
# serves or forgets states, another server's or the coordinator's, stays light.)
_peers: dict[tuple[str, str], psycopg.Connection] = {}
# How the role reaches each other segment server, as checked when the session last got a
# job (`reachable`): a DBA's change to a foreign server or mapping applies from the next job.
_reached: dict[tuple[str, str], tuple[str, segments.SegmentServer]] = {}
# A role's folders of jobs' states in this session (`hops`), by (role, store).
_folders: dict[tuple[str, str], state_store.HopFiles] = {}


def _worker() -> Any:
    """`segment.worker`, imported by a worker's call only: a session that serves or forgets
    states (another server's fetch, the coordinator's) loads no training code."""
    from madlib_mop.segment import worker
    return worker


def _role(plpy: Any) -> str:
    return plpy.execute("SELECT current_user AS r")[0]["r"]


def hops(plpy: Any, store: str) -> state_store.HopFiles:
    """The role's folder of the job's states on this server (for this server's run)."""
    key = (_role(plpy), store)
    if key not in _folders:
        _folders[key] = state_store.HopFiles.of_role(lambda q: plpy.execute(q)[0].popitem()[1], store)
    return _folders[key]


def reachable(plpy: Any, server_names: list[str]) -> list[str]:
    """Of the segment servers `names` (as the coordinator names them), those this server has
    a foreign server and a usable user mapping of the role for: its workers fetch states
    from them directly; the coordinator carries the others' (checked, not connected)."""
    from madlib_mop.db import segments

    role, found = _role(plpy), []
    for name in server_names:
        _reached.pop((role, name), None)
        try:
            _reached[(role, name)] = segments.peer_conninfo(plpy, name)
        except MadlibMopError:
            continue
        found.append(name)
    return found


def _peer(plpy: Any, role: str, name: str) -> psycopg.Connection:
    """A session on segment server `name` as `role` (the current one), kept by what it
    connects to (a DBA who changes the foreign server or the mapping changes where the next
    job's fetches go)."""
    from madlib_mop.db import segments

    info, server = _reached.get((role, name)) or segments.peer_conninfo(plpy, name)
    connection = _peers.get((role, info))
    if connection is not None and not (connection.closed or connection.broken):
        return connection
    _peers[(role, info)] = connection = segments.connect(
        info, server, segments.refused_hint(server, role), application_name="madlib_mop state fetch")
    return connection


def fetch(plpy: Any, kept: state_store.HopFiles, store: str, mst_key: int, step: int, source: str) -> int:
    """The model's state after `step` sub-epochs, from segment server `source` into this
    server's hop file, a piece at a time: its bytes.  A server this one cannot reach (or
    that stops answering meanwhile) is refused with 08001: the coordinator then carries the
    state itself, which names the server if it is down."""
    return fetch_several(plpy, kept, store, [(mst_key, step)], source)[0]


def fetch_several(plpy: Any, kept: state_store.HopFiles, store: str, states: list[tuple[int, int]],
                  source: str) -> list[int]:
    """`fetch` of several states (mst_key, step) from one server: a fused call's, in one
    request (`serve_several`: one round trip, not one per model).  Each one's bytes."""
    import psycopg
    from psycopg import sql

    schema = catalog.extension_schema_name(plpy)
    role = _role(plpy)
    written = [0] * len(states)
    done = 0  # (the states written whole: a failure is of the next one)

    def rows(function: str, arguments: tuple, columns: str = "") -> Iterator[tuple]:
        """The function's rows as they come: called in the select list (in FROM, the server
        would hold them all before the first), a composite's `columns` taken apart outside."""
        called = sql.SQL("{}.{}({})").format(sql.Identifier(schema), sql.Identifier(function),
                                             sql.SQL(", ").join(sql.Placeholder() * len(arguments)))
        query = (sql.SQL("SELECT {}").format(called) if not columns else sql.SQL(
            "SELECT {} FROM (SELECT {} AS r) AS called").format(sql.SQL(columns), called))
        cursor = _peer(plpy, role, source).cursor(binary=True)
        yield from cursor.stream(query, arguments, binary=True)

    def copied(pieces: Iterator[tuple], index: int | None) -> Callable[[Any], None]:
        def copy(handle: Any) -> None:
            for row in pieces:
                handle.write(row[-1])
                if index is not None:
                    written[index] += len(row[-1])
        return copy
    try:
        if len(states) == 1:  # (a visit alone: asked as of servers older than _mop_segment_states)
            kept.write(*states[0], copied(rows("_mop_segment_state", (store, *states[0], False)), 0))
        else:
            streamed = rows("_mop_segment_states", (store, [k for k, _ in states], [s for _, s in states]),
                            "(r).mst_key, (r).piece")
            try:
                for index, (key, group) in enumerate(itertools.groupby(streamed, key=lambda row: row[0])):
                    if index >= len(states) or states[index][0] != key:
                        raise MadlibMopError(f"segment server {source} sent model {key}'s state out of turn",
                                             sqlstate=errors.DATA_EXCEPTION)
                    kept.write(*states[index], copied(group, index))
                    done += 1
            finally:
                streamed.close()  # (a stream left behind would hold the session)
            if done < len(states):
                raise MadlibMopError(f"segment server {source} sent {done} of {len(states)} states",
                                     sqlstate=errors.DATA_EXCEPTION)
        for index, (mst_key, step) in enumerate(states):
            done = index
            # A staged model's head state: its frozen layers' state once per job and digest.
            with kept.mapped(mst_key, step, whole=False) as blob:
                digest = state.left_out_prefix(blob)
            if digest is not None:
                kept.keep_prefix(digest, copied(rows("_mop_segment_prefix", (store, digest)), None))
    except (psycopg.Error, MadlibMopError) as error:
        mst_key, step = states[min(done, len(states) - 1)]
        if getattr(error, "sqlstate", None) == errors.UNDEFINED_FILE:
            # (the server's message names the state it misses; a request of several reads ahead)
            said = getattr(getattr(error, "diag", None), "message_primary", None) or ""
            if "no state of model" not in said:
                raise lost(mst_key, step, f"segment server {source}") from None
            failure = lost(mst_key, step, f"segment server {source}")
            raise MadlibMopError(said.replace("madlib_mop: ", "").replace("this segment server",
                                                                          f"segment server {source}"),
                                 sqlstate=errors.UNDEFINED_FILE, detail=failure.detail, hint=failure.hint) from None
        if isinstance(error, MadlibMopError) and not (error.sqlstate or "").startswith("08"):
            raise
        for key in [k for k, c in _peers.items() if k[0] == role and (c.closed or c.broken)]:
            del _peers[key]
        raise MadlibMopError(f"segment server {source} could not be reached from here to read the state "
                             f"of model {mst_key} after step {step}: {str(error).strip().splitlines()[0]}",
                             sqlstate=errors.UNABLE_TO_CONNECT,
                             hint="The coordinator carries the state instead.") from None
    return written


def lost(mst_key: int, step: int, where: str) -> MadlibMopError:
    return MadlibMopError(f"no state of model {mst_key} after step {step} on {where}",
                          sqlstate=errors.UNDEFINED_FILE,
                          detail="A segment server keeps states in files of its current run: "
                                 "one restarted since has none.",
                          hint="The job goes back to the model's last durable state, kept by "
                               "the coordinator, and trains again to the same weights.")


def found(plpy: Any, kept: state_store.HopFiles, store: str, mst_key: int, step: int,
          state_from: str | None) -> dict:
    """Before a visit: the state it restores is in this server's hop file (fetched when
    `state_from` names another server).  What the visit's record says of the fetch."""
    started = time.perf_counter()
    fetched = 0
    if state_from is not None:
        fetched = fetch(plpy, kept, store, mst_key, step, state_from)
    elif not kept.holds(mst_key, step):
        raise lost(mst_key, step, "this segment server")
    return {"fetched_bytes": fetched, "fetch_seconds": time.perf_counter() - started}


def forget_older(kept: state_store.HopFiles, spec: Any, segments_count: int, mst_key: int,
                 step: int, forget_below: int) -> None:
    """After a visit from `step`: the model's earlier states here are not needed but the
    iteration ends from `forget_below` on (the coordinator's durable copy, validation)."""
    per_iteration = spec.epochs * segments_count
    kept.remove_older(mst_key, step, forget_below, per_iteration)


def serve(plpy: Any, store: str, mst_key: int, step: int, whole: bool) -> Iterator[bytes]:
    """The state, in pieces of `runtime.state.PIECE_BYTES`, to another server's worker of the
    same role (`fetch`: as kept, a staged model's head alone) or the coordinator's (whole):
    read from its mapped hop file."""
    kept = hops(plpy, store)
    stack = contextlib.ExitStack()
    blob = stack.enter_context(kept.mapped(mst_key, step, whole=whole))
    if blob is None:
        stack.close()
        raise lost(mst_key, step, "this segment server")
    return _pieces(stack, blob)


def serve_several(plpy: Any, store: str, mst_keys: list[int], steps: list[int]) -> Iterator[tuple[int, bytes]]:
    """`serve` of several states, as kept, one after the other: (mst_key, piece) rows.  Each
    is mapped before the first row, so that a missing one is refused at once (UNDEFINED_FILE,
    naming it), as `serve` refuses one."""
    if len(mst_keys) != len(steps):
        raise MadlibMopError(f"{len(mst_keys)} models and {len(steps)} steps", sqlstate=errors.INVALID_PARAMETER_VALUE,
                             hint="Give one step per model, in the order of mst_keys.")
    kept = hops(plpy, store)
    stack = contextlib.ExitStack()
    blobs = []
    try:
        for mst_key, step in zip(mst_keys, steps):
            blob = stack.enter_context(kept.mapped(mst_key, step, whole=False))
            if blob is None:
                raise lost(mst_key, step, "this segment server")
            blobs.append((mst_key, blob))
    except BaseException:
        stack.close()
        raise
    return _rows(stack, blobs)


def _rows(stack: contextlib.ExitStack, blobs: list[tuple[int | None, Any]]) -> Iterator[tuple[int | None, bytes]]:
    with stack:
        for mst_key, blob in blobs:
            for _, piece in state.pieces(blob):
                yield mst_key, piece


def serve_prefix(plpy: Any, store: str, digest: str) -> Iterator[bytes]:
    """A staged model's frozen layers' state kept here (`HopFiles.keep_prefix`), in pieces."""
    stack = contextlib.ExitStack()
    blob = stack.enter_context(hops(plpy, store).mapped_prefix(digest))
    return _pieces(stack, blob)


def _pieces(stack: contextlib.ExitStack, blob: Any) -> Iterator[bytes]:
    return (piece for _, piece in _rows(stack, [(None, blob)]))


def held(plpy: Any, store: str, mst_keys: list[int], steps: list[int]) -> list[bool]:
    kept = hops(plpy, store)
    return [kept.holds(k, s) for k, s in zip(mst_keys, steps)]


def forget(plpy: Any, store: str) -> None:
    """The job ended: its states here go."""
    hops(plpy, store).remove_job()


def _kept(plpy: Any, job_id: int) -> tuple[Any, state_store.HopFiles, str]:
    ctx = _worker().context(plpy, job_id)
    if ctx.states is None or ctx.states.table is not None:
        raise MadlibMopError(f"job {job_id}: this session keeps no states of it",
                             sqlstate=errors.INVALID_PARAMETER_VALUE,
                             hint="Only a segment server's worker sessions, given the job with its store, keep states.")
    return ctx, ctx.states.hops, ctx.store


def receive(plpy: Any, job_id: int, mst_key: int, step: int, piece: bytes, at_byte: int, last: bool) -> None:
    """A state the coordinator carries (a step-0 state, or one kept on a server this one
    cannot reach), a piece per call, into this server's hop file: the visit's call then
    finds it here.  A state of any size, never one value over 1 GB."""
    _, kept, _ = _kept(plpy, job_id)
    kept.receive(mst_key, step, piece, at_byte, last)


def train(plpy: Any, job_id: int, mst_key: int, step: int, segment: int, state_from: str | None,
          model_state: bytes | None, forget_below: int) -> str:
    """`segment.worker.train` on a segment server that keeps the states: the state from
    `model_state` (the coordinator carried it), else from `state_from`'s server (None: this
    one's); the new state stays here.  The visit's record, with what the fetch took."""
    ctx, kept, store = _kept(plpy, job_id)
    fetched = {"fetched_bytes": 0, "fetch_seconds": 0.0} if model_state is not None else found(
        plpy, kept, store, mst_key, step, state_from)
    record = VisitRecord.from_json(_worker().train(plpy, job_id, mst_key, step, segment, model_state)["result"])
    record.seconds["fetch"] = fetched["fetch_seconds"]
    record.fetched_bytes = fetched["fetched_bytes"]
    forget_older(kept, ctx.specs[mst_key], ctx.segments, mst_key, step, forget_below)
    return record.to_json()


def validate(plpy: Any, job_id: int, mst_key: int, step: int, partition: int, state_from: str | None,
             model_state: bytes | None) -> str:
    """`segment.worker.evaluate` of a state kept on segment servers (as `train` finds it)."""
    _, kept, store = _kept(plpy, job_id)
    if model_state is None:
        found(plpy, kept, store, mst_key, step, state_from)
    return _worker().evaluate(plpy, job_id, mst_key, step, partition, model_state)


def _found_all(plpy: Any, job_id: int, mst_keys: list[int], steps: list[int], states_from: list[str | None],
               forget_below: list[int] | None = None) -> tuple[Any, state_store.HopFiles, list[dict]]:
    """Before a fused call: each model's state in this server's hop file, as `found` puts
    it there (a state the coordinator carries was received before the call)."""
    ctx, kept, store = _kept(plpy, job_id)
    given = [steps, states_from] + ([forget_below] if forget_below is not None else [])
    if any(len(values) != len(mst_keys) for values in given):
        raise MadlibMopError(f"job {job_id}: {len(mst_keys)} models, and not as many steps, servers "
                             "to find their states on or steps to keep",
                             sqlstate=errors.INVALID_PARAMETER_VALUE,
                             hint="Give one of each per model, in the order of mst_keys.")
    fetched = [{"fetched_bytes": 0, "fetch_seconds": 0.0} for _ in mst_keys]
    for source in dict.fromkeys(states_from):
        at = [i for i, s in enumerate(states_from) if s == source]
        if source is None:
            for i in at:
                fetched[i] = found(plpy, kept, store, mst_keys[i], steps[i], None)
            continue
        started = time.perf_counter()  # (the models fetched from one server share the request's time)
        sizes = fetch_several(plpy, kept, store, [(mst_keys[i], steps[i]) for i in at], source)
        for i, size in zip(at, sizes):
            fetched[i] = {"fetched_bytes": size, "fetch_seconds": (time.perf_counter() - started) / len(at)}
    return ctx, kept, fetched


def train_fused(plpy: Any, job_id: int, mst_keys: list[int], steps: list[int], segment: int,
                states_from: list[str | None], forget_below: list[int]) -> list[str]:
    """`segment.worker.train_fused` on a segment server that keeps the states: each model's
    state found as `train` finds it (`states_from`, one per model), the new states kept
    here.  Each model's record, with what its fetch took."""
    ctx, kept, fetched = _found_all(plpy, job_id, mst_keys, steps, states_from, forget_below)
    records = [VisitRecord.from_json(result)
               for result in _worker().train_fused(plpy, job_id, mst_keys, steps, segment)]
    for record, fetch, key, step, below in zip(records, fetched, mst_keys, steps, forget_below):
        record.seconds["fetch"] = fetch["fetch_seconds"]
        record.fetched_bytes = fetch["fetched_bytes"]
        forget_older(kept, ctx.specs[key], ctx.segments, key, step, below)
    return [record.to_json() for record in records]


def validate_fused(plpy: Any, job_id: int, mst_keys: list[int], steps: list[int], partition: int,
                   states_from: list[str | None]) -> list[str]:
    """`segment.worker.evaluate_fused` of states kept on segment servers (as `train_fused`
    finds them)."""
    _found_all(plpy, job_id, mst_keys, steps, states_from)
    return _worker().evaluate_fused(plpy, job_id, mst_keys, steps, partition)
