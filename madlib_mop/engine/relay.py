"""A segment server's idle worker sessions, taken up by a coordinator's job (the relay).

An idle session listens on a socket in its own server's data directory
(`engine.idle_workers`), so only a backend of that server can adopt it.  A job whose
segments lie on segment servers therefore opens a plain session there as the calling
role, as for any worker (`engine.cluster`).  That session adopts one of the role's idle
sessions (`_mop_relay_adopt`), then relays the job's worker calls to it
(`_mop_relay_call`: arguments and results pass through as the socket frames them, bytes
as bytes).  When the job ends it hands the session back to idleness on its server
(`_mop_relay_release`).

The relaying session imports no TensorFlow and holds no slot of its server's cap: the
adopted session holds one, as it did while idle.  Who may adopt is unchanged.  The idle
session checks its peer as for any adopter: a backend of its database whose login role
may act as its role.  Only worker functions are relayed.  A cancel of the relaying call
(the coordinator's cancel, or pg_cancel_backend) is passed on to the adopted session, as
SIGINT to its backend, and its answer awaited, so the channel stays in step.
"""

from __future__ import annotations

from typing import Any

from madlib_mop import errors
from madlib_mop.db import worker_session
from madlib_mop.engine import idle_workers, server_slots
from madlib_mop.engine.idle_workers import Adopted, ChannelClosed
from madlib_mop.errors import MadlibMopError
from madlib_mop.runtime.tf_runtime import worker_threads

LISTEN_SECONDS = 2.0  # how long an adopter waits for a session just handed back to idleness
CANCELLED_ANSWER_SECONDS = 30.0  # how long a cancelled call's answer is awaited

# This backend's adopted session (a relaying session serves one worker of one job).
_adopted: Adopted | None = None


def adopt(plpy: Any, local_segments: int, label: str) -> int | None:
    """One of the role's idle sessions of this server, whose TensorFlow runs the threads of
    a job with `local_segments` segments here (or not imported yet), named `label`: its
    process id, None when there is none to take, or calls of this server wait for slots
    (they go first: its idle sessions are ending for them)."""
    global _adopted
    release(plpy, end=True)
    plpy.execute(idle_workers.FRESH)
    if server_slots.waiting_calls(plpy):
        return None
    # Sessions a job just handed back name themselves idle a moment before they listen.
    idle = [row["pid"] for row in plpy.execute(plpy.prepare(idle_workers.IDLE_SESSIONS, ["text"]),
                                               [idle_workers.IDLE_NAME])]
    idle_workers.wait_listening(idle, LISTEN_SECONDS)
    found = idle_workers.adopt(plpy, 1, worker_threads(local_segments),
                               worker_session.forwarded_settings(plpy), [label])
    _adopted = found[0] if found else None
    return None if _adopted is None else _adopted.pid


def call(plpy: Any, function_name: str, arguments: list, blobs: list[bytes] | None) -> tuple[list, list[bytes]]:
    """One worker call, relayed: its result values (bytes as {"blob": i}) and blobs."""
    adopted = _adopted
    if adopted is None or not adopted.usable:
        raise MadlibMopError("this session relays to no worker session",
                             sqlstate=errors.CONNECTION_FAILURE,
                             hint="A job's session adopts one first (_mop_relay_adopt).")
    if not idle_workers.WORKER_FUNCTION.fullmatch(function_name) or function_name.startswith("_mop_relay"):
        raise MadlibMopError(f"{function_name} is not a worker function", sqlstate=errors.UNDEFINED_FUNCTION,
                             hint="Only the extension's worker functions are relayed.")
    try:
        adopted.channel.send({"kind": "call", "function": function_name, "args": arguments}, blobs or [])
        header, out = _answer(plpy, adopted)
    except ChannelClosed as error:
        adopted.channel.close()
        raise MadlibMopError(f"the worker session (pid {adopted.pid}) was lost: {error}",
                             sqlstate=errors.CONNECTION_FAILURE,
                             hint="The job retries the call on another session.") from None
    if header["kind"] == "error":
        raise MadlibMopError(header["message"], sqlstate=header["sqlstate"],
                             detail=header.get("detail"), hint=header.get("hint"))
    return header["values"], out


def _answer(plpy: Any, adopted: Adopted) -> tuple[dict, list[bytes]]:
    """The adopted session's answer; a cancel or terminate of this session acts while it
    waits, and a cancel is passed on."""
    while True:
        try:
            if adopted.channel.connection.poll(0.2):
                return adopted.channel.receive()
        except OSError:
            return adopted.channel.receive()
        try:
            plpy.execute("SELECT 1")
        except plpy.SPIError:
            adopted.cancel()
            try:  # its answer (the cancel's error), so that the next call gets its own
                adopted.channel.receive(CANCELLED_ANSWER_SECONDS)
            except ChannelClosed:
                adopted.channel.close()
            raise


def release(plpy: Any, end: bool = False) -> int | None:
    """The adopted session back to idleness for this server's madlib_mop.worker_idle_seconds
    (or ended, `end`): its process id once it listens again, None if there is none."""
    global _adopted
    adopted, _adopted = _adopted, None
    if adopted is None or not adopted.usable:
        return None
    if end:
        adopted.end()
        return None
    pid = adopted.release(server_slots.idle_seconds(plpy))
    idle_workers.wait_listening([pid], LISTEN_SECONDS)
    return pid
