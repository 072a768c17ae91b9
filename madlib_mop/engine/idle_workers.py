"""Idle worker sessions kept for their role, and taken up by any session of that role.

When a job, an evaluation or a prediction ends, its worker sessions hold TensorFlow and
the programs they traced: starting them again costs seconds.  So they are kept, not for
the session that opened them, but for their role: the opener sends `CALL _mop_idle(...)`
and lets go of the session (`LocalWorker.idle`), which then outlives it
(client_connection_check_interval off).  The idle session listens on a Unix socket of its
own, `pgsql_tmp_madlib_mop_idle/<pid>` in the data directory, and the role's next call,
from any session (pg_cron's included), adopts it (`adopt`): from then on that call's
worker calls reach it over the socket (`Channel.call`) instead of over a libpq connection.
When the call ends it hands the session back to idleness (`Channel.release`).

Who may adopt an idle session, and so run calls as its role:
- only a call of the same role (`current_user`, the role a new worker session would log
  in as) on the same database: the adopter looks only at its own role's idle sessions
  (`IDLE_SESSIONS`), and the idle session checks its peer (the socket's SO_PEERCRED
  process id) in pg_stat_activity before it answers: a backend of this database whose
  login role is a member of the session's role (so could act as it anyway);
- only the extension's worker functions (`_mop_*` of its schema) run, with the arguments
  the adopter sends, bound as parameters;
- the socket lies in the data directory, which only the server's OS user can enter.

An idle session still ends, giving its slot of the server's pool back
(`engine.server_slots`), as soon as a call waits for a slot, after
madlib_mop.worker_idle_seconds, or when a DBA terminates it.  A call that reaches an
adopted session is cancelled as one over libpq is: SIGINT to its backend (what
pg_cancel_backend sends), here from the adopter, a backend of the server's OS user.

Messages: a JSON header, then each `bytes` value of it as a message of its own
(`multiprocessing.connection` frames them; states and weights may exceed 1 GB).
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import struct
import time
from multiprocessing.connection import Connection
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from madlib_mop import __version__, errors
from madlib_mop.db import catalog
from madlib_mop.db.worker_session import FORWARDED_SETTINGS
from madlib_mop.errors import MadlibMopError
from madlib_mop.plpy_bridge import SpiError, renew_pin
from madlib_mop.runtime import tf_runtime

SOCKET_DIRECTORY = "pgsql_tmp_madlib_mop_idle"  # under the data directory, a backend's cwd
IDLE_NAME = "madlib_mop idle worker"  # how an idle worker session shows in pg_stat_activity
HANDSHAKE_SECONDS = 5.0
LOOK_SECONDS = 0.2  # how often an idle session looks at the queue and commits
WORKER_FUNCTION = re.compile(r"_mop_[a-z_]+")
# pg_stat_activity is read once per transaction and then kept: looks that must see
# sessions of the last moments clear it first.
FRESH = "SELECT pg_catalog.pg_stat_clear_snapshot()"
# The idle sessions a call of this role may adopt, oldest first.
IDLE_SESSIONS = ("SELECT pid FROM pg_catalog.pg_stat_activity WHERE application_name = $1 "
                 "AND usename = current_user AND datname = pg_catalog.current_database() "
                 "AND pid <> pg_catalog.pg_backend_pid() ORDER BY backend_start")


def socket_path(pid: int) -> str:
    return os.path.join(SOCKET_DIRECTORY, str(pid))


class ChannelClosed(Exception):
    """The other end of a channel went away."""


class Channel:
    """One adopter and one idle session, over a connected Unix socket."""

    def __init__(self, sock: socket.socket):
        self.connection = Connection(sock.detach())

    def send(self, header: dict, blobs: list[bytes] = ()) -> None:
        try:
            self.connection.send_bytes(json.dumps({**header, "blobs": len(blobs)}).encode())
            for blob in blobs:
                self.connection.send_bytes(blob)
        except OSError as error:
            raise ChannelClosed(str(error)) from None

    def receive(self, timeout: float | None = None) -> tuple[dict, list[bytes]]:
        try:
            if timeout is not None and not self.connection.poll(timeout):
                raise ChannelClosed(f"no answer within {timeout:g}s")
            header = json.loads(self.connection.recv_bytes())
            return header, [self.connection.recv_bytes() for _ in range(header["blobs"])]
        except (EOFError, OSError) as error:
            raise ChannelClosed(str(error) or "the other end closed the socket") from None

    def close(self) -> None:
        self.connection.close()

    @property
    def closed(self) -> bool:
        return self.connection.closed


def encode(values: list) -> tuple[list, list[bytes]]:
    """Values with every bytes value replaced by {"blob": i}, and the blobs (a jsonb
    argument goes as its text, as the worker function takes it)."""
    blobs: list[bytes] = []

    def one(value: Any) -> Any:
        if isinstance(value, Jsonb):
            return json.dumps(value.obj)
        if isinstance(value, (bytes, bytearray, memoryview)):
            blobs.append(bytes(value))
            return {"blob": len(blobs) - 1}
        if isinstance(value, (list, tuple)):
            return [one(v) for v in value]
        return value
    return [one(v) for v in values], blobs


def decode(values: list, blobs: list[bytes]) -> list:
    def one(value: Any) -> Any:
        if isinstance(value, dict) and set(value) == {"blob"}:
            return blobs[value["blob"]]
        if isinstance(value, list):
            return [one(v) for v in value]
        return value
    return [one(v) for v in values]


# ---- the adopter's side (a call's engine, in its backend) ----

class Adopted:
    """An idle session this call adopted: the worker calls it runs, over its socket."""

    def __init__(self, pid: int, channel: Channel):
        self.pid, self.channel = pid, channel

    def call(self, function: str, args: tuple) -> tuple:
        values, blobs = encode(list(args))
        try:
            self.channel.send({"kind": "call", "function": function, "args": values}, blobs)
            header, blobs = self.channel.receive()
        except ChannelClosed as error:
            self.channel.close()
            # As a lost libpq connection: the job retries the call on another session.
            raise psycopg.OperationalError(
                f"the worker session (pid {self.pid}) was lost: {error}") from None
        if header["kind"] == "error":
            raise MadlibMopError(header["message"], sqlstate=header["sqlstate"],
                                 detail=header.get("detail"), hint=header.get("hint"))
        return tuple(decode(header["values"], blobs))

    def rename(self, label: str) -> None:
        self._control({"kind": "name", "label": label})

    def _control(self, header: dict) -> None:
        try:
            self.channel.send(header)
        except ChannelClosed:
            self.channel.close()

    def cancel(self) -> None:
        """What pg_cancel_backend does, sent while the session is ours: it holds our socket,
        which has neither closed nor brought an answer yet (a session that ended has closed
        it, so its process id is not signalled once it may be another's)."""
        try:
            if not self.channel.closed and not self.channel.connection.poll(0):
                os.kill(self.pid, signal.SIGINT)
        except OSError:
            pass

    def release(self, seconds: int) -> int:
        """Back to idleness, for `seconds`, kept for the role: its process id."""
        self._control({"kind": "idle", "seconds": int(seconds)})
        self.channel.close()
        return self.pid

    def end(self) -> None:
        self._control({"kind": "end"})
        self.channel.close()

    @property
    def usable(self) -> bool:
        return not self.channel.closed


def adopt(plpy: Any, count: int, threads: int | None, settings: dict[str, str | None],
          labels: list[str]) -> list[Adopted]:
    """Up to `count` idle sessions of this role whose TensorFlow runs `threads` threads
    (None: any), or that have not imported it yet; the i-th named labels[i] and given
    `settings`."""
    if count <= 0:
        return []
    plpy.execute(FRESH)
    plan = plpy.prepare(IDLE_SESSIONS, ["text"])
    adopted: list[Adopted] = []
    for row in plpy.execute(plan, [IDLE_NAME]):
        session = _adopt_one(row["pid"], threads, settings, labels[len(adopted)])
        if session is not None:
            adopted.append(session)
            if len(adopted) == count:
                break
    return adopted


def _adopt_one(pid: int, threads: int | None, settings: dict, label: str) -> Adopted | None:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.settimeout(HANDSHAKE_SECONDS)
        sock.connect(socket_path(pid))
        sock.settimeout(None)
    except OSError:  # taken by another call meanwhile, or ended
        sock.close()
        return None
    channel = Channel(sock)
    try:
        channel.send({"kind": "adopt", "version": __version__, "threads": threads,
                      "settings": settings, "label": label})
        header, _ = channel.receive(HANDSHAKE_SECONDS)
    except ChannelClosed:
        channel.close()
        return None
    if header["kind"] != "adopted":
        channel.close()
        return None
    return Adopted(pid, channel)


def wait_listening(pids: list[int], timeout: float = 2.0) -> None:
    """Wait until the sessions just handed over listen (they named themselves idle first),
    or have ended (a call was queued), so that the role's next call, even this session's
    very next one, finds them."""
    deadline = time.monotonic() + timeout
    waiting = [pid for pid in pids if pid]
    while waiting and time.monotonic() < deadline:
        waiting = [pid for pid in waiting if not os.path.exists(socket_path(pid)) and _alive(pid)]
        if waiting:
            time.sleep(0.005)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False


# ---- the idle session's side (`_mop_idle`, in the worker's backend) ----

def wait(plpy: Any, seconds: float, can_commit: bool, any_waiting: str) -> None:
    """An idle worker session: adopted by its role's calls in turn, until a call waits for
    a slot (`any_waiting`: a query of one boolean column `w`) or it was idle for `seconds`;
    then the session ends, giving its slot back.  Outside a CALL that may commit it cannot
    serve (each served call commits), and only waits."""
    plpy.execute("SELECT pg_catalog.set_config('client_connection_check_interval', '0', false)")
    schema = catalog.extension_schema(plpy)
    queued = plpy.prepare(any_waiting)
    while seconds is not None:
        _named(plpy, IDLE_NAME)
        listener = _listen(plpy) if can_commit else None
        try:
            channel = _wait_for_adopter(plpy, listener, queued, seconds, can_commit)
        finally:
            if listener is not None:
                listener.close()
                _unlink(socket_path(os.getpid()))
        seconds = None if channel is None else _serve(plpy, schema, channel)
    plpy.fatal("madlib_mop: idle worker session ends, giving its slot back")


def _wait_for_adopter(plpy: Any, listener: socket.socket | None, queued: Any, seconds: float,
                      can_commit: bool) -> Channel | None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if plpy.execute(queued)[0]["w"]:
            return None
        if listener is None:
            plpy.execute(f"SELECT pg_catalog.pg_sleep({LOOK_SECONDS})")
        else:
            channel = _accept(plpy, listener)
            if channel is not None:
                return channel
        if can_commit:  # holds no snapshot back from VACUUM while it waits
            plpy.commit()
            renew_pin(plpy)
    return None


def _listen(plpy: Any) -> socket.socket:
    os.makedirs(SOCKET_DIRECTORY, mode=0o700, exist_ok=True)
    live = {r["pid"] for r in plpy.execute("SELECT pid FROM pg_catalog.pg_stat_activity")}
    for name in os.listdir(SOCKET_DIRECTORY):  # those of sessions that ended without a word
        if not (name.isdigit() and int(name) in live):
            _unlink(os.path.join(SOCKET_DIRECTORY, name))
    path = socket_path(os.getpid())
    _unlink(path)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    os.chmod(path, 0o600)
    listener.listen(4)
    listener.settimeout(LOOK_SECONDS)
    return listener


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def _accept(plpy: Any, listener: socket.socket) -> Channel | None:
    """The next adopter, if one came, is of this session's role and database, and wants
    TensorFlow with the threads this session runs."""
    try:
        sock, _ = listener.accept()
    except socket.timeout:
        return None
    pid, _, _ = struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED,
                                                     struct.calcsize("3i")))
    plpy.execute(FRESH)  # the adopter may have started since this loop's last look
    # A backend whose login role may act as this session's role (a member of it: the
    # role itself, or one that may SET ROLE to it), on this database.
    same = plpy.execute(plpy.prepare(
        "SELECT count(*) AS n FROM pg_catalog.pg_stat_activity WHERE pid = $1 "
        "AND pg_catalog.pg_has_role(usesysid, session_user, 'MEMBER') "
        "AND datname = pg_catalog.current_database()", ["int4"]), [pid])
    channel = Channel(sock)
    if not same[0]["n"]:
        channel.close()
        return None
    try:
        header, _ = channel.receive(HANDSHAKE_SECONDS)
        mine, wanted = tf_runtime.configured_threads(), header.get("threads")
        if header["kind"] != "adopt" or header.get("version") != __version__ or (
                wanted is not None and mine not in (None, wanted)):
            channel.send({"kind": "declined", "threads": mine})
            channel.close()
            return None
        for name in FORWARDED_SETTINGS:  # the adopter's values; '' where it has none
            plpy.execute(plpy.prepare("SELECT pg_catalog.set_config($1, $2, false)", ["text", "text"]),
                         [name, header["settings"].get(name) or ""])
        _named(plpy, header["label"])
        plpy.commit()  # kept whatever the first call does (a rollback would undo them)
        renew_pin(plpy)
        channel.send({"kind": "adopted"})
    except ChannelClosed:
        channel.close()
        return None
    return channel


def _named(plpy: Any, label: str) -> None:
    plpy.execute(plpy.prepare("SELECT pg_catalog.set_config('application_name', $1, false)",
                              ["text"]), [label])


def _serve(plpy: Any, schema: str, channel: Channel) -> int | None:
    """Run the adopter's calls, each committed on its own as over libpq, until it hands the
    session back (the seconds to stay idle) or ends it (None)."""
    plans: dict[str, Any] = {}
    try:
        while True:
            while not _arrived(channel):
                plpy.execute("SELECT 1")  # a terminate or cancel of this session acts here
            try:
                header, blobs = channel.receive()
            except ChannelClosed:
                return None  # the adopter's backend ended: so does this session
            if header["kind"] == "idle":
                return int(header["seconds"])
            if header["kind"] == "name":
                _named(plpy, header["label"])
                continue
            if header["kind"] != "call":
                return None
            reply = _run(plpy, schema, plans, header["function"], decode(header["args"], blobs))
            values, out = encode(reply.pop("values", []))
            channel.send({**reply, "values": values}, out)
    except ChannelClosed:
        return None
    finally:
        channel.close()


def _arrived(channel: Channel) -> bool:
    """A message (or the end) came within a second."""
    try:
        return channel.connection.poll(1.0)
    except OSError:
        return True


def _run(plpy: Any, schema: str, plans: dict, function: str, args: list) -> dict:
    if function not in plans:
        plans[function] = _plan(plpy, schema, function, len(args))
    if plans[function] is None:
        return {"kind": "error", "sqlstate": errors.UNDEFINED_FUNCTION,
                "message": f"{function} is not a worker function",
                "hint": "An idle worker session runs only the extension's worker functions."}
    try:
        rows = plpy.execute(plans[function], args)
        plpy.commit()
        renew_pin(plpy)
        return {"kind": "row", "values": [rows[0][c] for c in rows.colnames()]}
    except plpy.SPIError as error:
        plpy.rollback()
        renew_pin(plpy)
        said = SpiError.of(error)
        return {"kind": "error", "sqlstate": said.sqlstate or "XX000",
                "message": said.message.replace("madlib_mop: ", ""),
                "detail": said.detail, "hint": said.hint}


def _plan(plpy: Any, schema: str, function: str, count: int) -> Any:
    """The statement running one of the extension's worker functions, its arguments bound
    (None for any other name)."""
    if not WORKER_FUNCTION.fullmatch(function):
        return None
    types = plpy.execute(plpy.prepare(
        "SELECT p.proargtypes::regtype[]::text[] AS types FROM pg_catalog.pg_proc p "
        "JOIN pg_catalog.pg_depend d ON d.classid = 'pg_catalog.pg_proc'::regclass AND d.objid = p.oid "
        "AND d.deptype = 'e' JOIN pg_catalog.pg_extension e ON e.oid = d.refobjid "
        "WHERE e.extname = 'madlib_mop' AND p.proname = $1 AND p.pronargs = $2", ["text", "int4"]),
        [function, count])
    if len(types) != 1:
        return None
    placeholders = ", ".join(f"${i + 1}" for i in range(count))
    return plpy.prepare(f"SELECT * FROM {schema}.{plpy.quote_ident(function)}({placeholders})",
                        types[0]["types"])
