"""The server's worker sessions as one pool: a cap, slots, a fair queue, idle sessions
given back.

A worker session holds TensorFlow and its programs (about BASE_MB on this machine), so
the server caps how many live at once, busy and idle together, across every job, role and
database:

- **Slots.** A worker session takes one of `cap` slots as its first statement
  (`_mop_take_slot`), and holds it for as long as it lives; a session that ends for any
  reason, a crash included, frees it.  Where the extension's library is preloaded
  (shared_preload_libraries) the slots are the server's, in its shared memory
  (`src/server_slots.c`): one cap for every database.  Elsewhere they are session-level
  advisory locks (class 0x4D4F5057), which PostgreSQL keeps per database, and each call
  says so in a NOTICE.  The view `worker_sessions` lists them.
- **The cap**: `madlib_mop.max_worker_sessions`, which only a superuser may set (declared
  by the extension's library, `src/worker_pool.c`); 0 (the default) is the machine's:
  at most two sessions per core (training is CPU-bound: more add memory, not speed), and
  fewer where memory is short.
- **The queue.** A job that gets no slot waits in the queue (a place per waiting call,
  taken by a session of its own so that others see it at once: the server's, in shared
  memory, or this database's `worker_queue`).  The waiting calls are served in order of
  the slots their role holds, then of arrival: a role's ten jobs do not starve another
  role's one.  `madlib_mop.queue_timeout_seconds` makes a call give up.
- **Idle sessions** (kept warm for their role's next call, from any session:
  `engine.idle_workers`) wait inside `_mop_idle`, which ends the session, freeing its
  slot, as soon as any call is queued (in any database, where the pool is the server's) or
  after `madlib_mop.worker_idle_seconds`.
"""

from __future__ import annotations

import time
from typing import Any, Callable

import psycopg
from psycopg import sql

from madlib_mop import errors
from madlib_mop.db import catalog, settings, worker_session
from madlib_mop.engine import idle_workers
from madlib_mop.errors import MadlibMopError
from madlib_mop.runtime.tf_runtime import available_cores

# A worker session's memory with TensorFlow and Keras imported and a small job's programs
# traced: 0.67 GB of RSS measured for `make demo`'s workers here, with room for larger ones.
BASE_MB = 900
MEMORY_FRACTION = 0.75  # of the machine's memory, for worker sessions
IDLE_SETTING, DEFAULT_IDLE_SECONDS = "madlib_mop.worker_idle_seconds", 300
QUEUE_TIMEOUT_SETTING = "madlib_mop.queue_timeout_seconds"
RECLAIM_SECONDS = 5.0  # how long a job waits for idle sessions to give their slots back

class Pool:
    """Where the pool's slots and queue are, as SQL: the server's shared memory where the
    extension's library is preloaded (one cap and one queue for every database), else this
    database's advisory locks and `worker_queue` table."""

    def __init__(self, schema: str, shared: bool):
        self.schema, self.shared = schema, shared
        # The sessions holding slots: pid, database, role, state (busy, idle).
        self.slots = f"SELECT pid, database, role, state FROM {schema}.worker_sessions"
        # The calls waiting, with the live session that holds each place.
        self.queue = (f"""
            SELECT q.ticket, q.pid, pg_catalog.pg_get_userbyid(q.role) AS role, q.since, d.datname AS database
            FROM {schema}._mop_server_queue() q JOIN pg_catalog.pg_database d ON d.oid = q.database"""
                      if shared else f"""
            SELECT q.ticket, q.pid, q.role, q.since, current_database() AS database FROM {schema}.worker_queue q
            JOIN pg_catalog.pg_stat_activity a ON a.pid = q.pid""")
        self.holders = f"SELECT role, count(*) AS slots FROM ({self.slots}) s GROUP BY role"
        # The calls waiting, in the order they are served: fewest slots held by their role first.
        self.waiting = f"""
            WITH holders AS ({self.holders})
            SELECT q.ticket, row_number() OVER (ORDER BY coalesce(h.slots, 0), q.ticket) AS position
            FROM ({self.queue}) q LEFT JOIN holders h ON h.role = q.role"""
        self.idle_holders = f"SELECT count(*) AS n FROM ({self.slots}) s WHERE state = 'idle'"
        self.any_waiting = f"SELECT EXISTS ({self.queue}) AS w"


def pool(plpy: Any) -> Pool:
    """This server's pool, as this call sees it (`_mop_pool_shared`: the library preloaded)."""
    schema = catalog.extension_schema(plpy)
    return Pool(schema, plpy.execute(f"SELECT {schema}._mop_pool_shared() AS s")[0]["s"])


def memory_mb() -> float:
    """The machine's memory (MB), from /proc/meminfo."""
    with open("/proc/meminfo", encoding="ascii") as meminfo:
        for line in meminfo:
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) / 1024
    raise OSError("MemTotal not in /proc/meminfo")


def machine_cap() -> int:
    return max(1, min(2 * available_cores(), int(memory_mb() * MEMORY_FRACTION // BASE_MB)))


def cap(plpy: Any) -> int:
    """The cap on live worker sessions: the superuser's setting, else the machine's."""
    schema = catalog.extension_schema(plpy)
    value = plpy.execute(f"SELECT {schema}._mop_max_worker_sessions() AS v")[0]["v"]
    return value or machine_cap()


def slot_share_mb(cap_value: int) -> float:
    """The memory one worker session may count on when every slot is taken."""
    return memory_mb() * MEMORY_FRACTION / cap_value


def idle_seconds(plpy: Any) -> int:
    value = settings.whole_number(plpy, IDLE_SETTING, minimum=0)
    return DEFAULT_IDLE_SECONDS if value is None else value


def queue_timeout(plpy: Any) -> int | None:
    """Seconds a call waits for a worker session before it gives up (None: no limit)."""
    return settings.whole_number(plpy, QUEUE_TIMEOUT_SETTING, minimum=0) or None


def take_slot(db: psycopg.Connection, schema: str, cap_value: int) -> int | None:
    """In a new worker session: its slot, or None when all are taken."""
    return db.execute(sql.SQL("SELECT {}._mop_take_slot(%s)").format(sql.Identifier(schema)),
                      (cap_value,)).fetchone()[0]


def idle_holders(plpy: Any) -> int:
    """Idle worker sessions holding slots (they end as soon as a call is queued), as of
    now: the call's transaction would otherwise see pg_stat_activity as of its first look."""
    plpy.execute(idle_workers.FRESH)
    return plpy.execute(pool(plpy).idle_holders)[0]["n"]


def waiting_calls(plpy: Any) -> int:
    """Live calls waiting for a slot."""
    return plpy.execute(f"SELECT count(*) AS n FROM ({pool(plpy).queue}) q")[0]["n"]


class Queue:
    """A call waiting for worker sessions: its place in the queue, taken over an autocommit
    session of its own (the waiting call's own transaction is not committed until it ends),
    and given back when it leaves; if the call's backend dies, the session dies with it and
    its place no longer counts.  The place is in the server's shared memory where the
    library is preloaded, else a row of `worker_queue`.  `db`: an autocommit session of
    the server to queue in instead (a coordinator's worker session on a segment server,
    which then takes the slot itself); it stays open."""

    def __init__(self, conninfo: str | None, schema: str, job_id: int | None,
                 db: psycopg.Connection | None = None):
        self.schema = sql.Identifier(schema)
        self.own = db is None
        self.db = worker_session.connect(conninfo, application_name="madlib_mop queue") if db is None else db
        quoted = self.schema.as_string(self.db)
        shared = self.db.execute(sql.SQL("SELECT {}._mop_pool_shared()").format(self.schema)).fetchone()[0]
        self.pool = Pool(quoted, shared)
        if shared:
            self.ticket = self.db.execute(sql.SQL("SELECT {}._mop_queue_enter()").format(self.schema)).fetchone()[0]
        else:
            self.db.execute(sql.SQL("DELETE FROM {}.worker_queue WHERE role = current_user AND pid NOT IN "
                                    "(SELECT pid FROM pg_catalog.pg_stat_activity)").format(self.schema))
            self.ticket = self.db.execute(sql.SQL("INSERT INTO {}.worker_queue (job_id) VALUES (%s) "
                                                  "RETURNING ticket").format(self.schema),
                                          (job_id,)).fetchone()[0]
        self.since = time.monotonic()

    def turn(self, cap_value: int) -> tuple[int, int, int]:
        """(this call's position, 1 = next; slots free now; calls waiting)."""
        position, waiting = self.db.execute(sql.SQL(
            "SELECT max(position) FILTER (WHERE ticket = %s), count(*) FROM ({}) w").format(
            sql.SQL(self.pool.waiting)), (self.ticket,)).fetchone()
        held = self.db.execute(sql.SQL(f"SELECT coalesce(sum(slots), 0) FROM ({self.pool.holders}) h")).fetchone()[0]
        return position, cap_value - int(held), waiting

    def held_elsewhere(self) -> int:
        """Slots held by worker sessions of the server's other databases."""
        return self.db.execute(sql.SQL(f"SELECT count(*) FROM ({self.pool.slots}) s "
                                       "WHERE database <> current_database()")).fetchone()[0]

    def idle_holders(self) -> int:
        """Idle worker sessions holding slots, as of now (this session autocommits: a
        call's own transaction would see pg_stat_activity as of its first look)."""
        return self.db.execute(sql.SQL(self.pool.idle_holders)).fetchone()[0]

    def leave(self) -> None:
        try:
            if self.pool.shared:
                self.db.execute(sql.SQL("SELECT {}._mop_queue_leave(%s)").format(self.schema), (self.ticket,))
            else:
                self.db.execute(sql.SQL("DELETE FROM {}.worker_queue WHERE ticket = %s").format(self.schema),
                                (self.ticket,))
        finally:
            if self.own:
                self.db.close()


def taken_text(cap_value: int, elsewhere: int) -> str:
    """What a queued call's NOTICE says of the taken slots."""
    held = f", {elsewhere} of them by other databases" if elsewhere else ""
    return f"all {cap_value} of this server's are taken{held}"


def share(position: int, free: int, waiting: int, wanted: int) -> int:
    """Slots a waiting call takes in its turn: none before it is among the first `free`
    waiting; then those that leave one for each call behind it, at least one, at most
    `wanted`."""
    if position > free:
        return 0
    return min(wanted, max(1, free - waiting + 1))


def wait_in_queue(plpy: Any, conninfo: str, schema_name: str, job_id: int | None, wanted: int,
                  take: Callable[[int], list], shown: Callable[[int, int, bool, int], None],
                  interruption: Callable[[], None], hint: str) -> list:
    """Wait in the queue until this call's turn, then `take(n)` (the workers it could open
    of n: slots may go to another call meanwhile, then it waits on).  `shown(position, cap,
    first, held by other databases)` when its position changes.  Gives up after madlib_mop.queue_timeout_seconds."""
    cap_value, timeout = cap(plpy), queue_timeout(plpy)
    queue = Queue(conninfo, schema_name, job_id)
    last = None
    try:
        while True:
            position, free, waiting = queue.turn(cap_value)
            taken = take(share(position, free, waiting, wanted)) if position <= free else []
            if taken:
                return taken
            if position != last:
                shown(position, cap_value, last is None, queue.held_elsewhere())
                last = position
            if timeout is not None and time.monotonic() - queue.since > timeout:
                raise MadlibMopError(f"waited {timeout}s for a worker session",
                                     sqlstate=errors.INSUFFICIENT_RESOURCES,
                                     detail=f"All {cap_value} worker sessions of this server are taken.",
                                     hint=f"{hint}, or SET {QUEUE_TIMEOUT_SETTING} higher (0: no limit).")
            interruption()
            time.sleep(0.25)
    finally:
        queue.leave()


def idle(plpy: Any, seconds: float, can_commit: bool = False) -> None:
    """An idle worker session's wait (`_mop_idle`, in the worker): kept for its role, it
    serves the role's calls that adopt it, and ends, giving its slot back, as soon as a
    call waits for a slot, or after `seconds` idle (`engine.idle_workers`).  Only a worker
    session of the pool (it holds a slot) as its own login role may be one: any other
    session would serve its role's calls outside the cap, or as a role SET ROLE chose.
    `seconds` None: this server's madlib_mop.worker_idle_seconds (a coordinator's job on a
    segment server keeps the segment server's setting)."""
    server = pool(plpy)
    row = plpy.execute(f"SELECT current_user = session_user AS own, EXISTS (SELECT 1 FROM "
                       f"({server.slots}) s WHERE s.pid = pg_catalog.pg_backend_pid()) AS slot")[0]
    if not (row["own"] and row["slot"]):
        raise MadlibMopError("_mop_idle runs only in a worker session of the server's pool",
                             sqlstate=errors.INSUFFICIENT_PRIVILEGE,
                             hint="The extension calls it when a job's worker sessions are idle.")
    idle_workers.wait(plpy, idle_seconds(plpy) if seconds is None else seconds, can_commit,
                      server.any_waiting)
