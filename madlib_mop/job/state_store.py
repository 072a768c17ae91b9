"""Where a job's model states live: durable ones in the job's state table, in pieces; the
ones between two hops in files of the server's data directory.

A state moves from segment to segment after every sub-epoch.  Writing each one durably
into the database (write-ahead log, TOAST, and the coordinator's session in between) cost
several times the sub-epoch for big models.  So:

- **Between hops** the worker that trained a sub-epoch writes the new state to a file of
  the server (`HopFiles`: written and renamed into place, not fsynced: it costs about one
  copy into the page cache) and the worker of the next hop reads it from there.  The
  state never passes through the coordinator, nor through one SQL value (so it may be
  larger than PostgreSQL's 1 GB).  A staged model's hop file leaves out its frozen prefix's
  weights (a head state, `state.head_meta`): they are in a file of their own, written once
  per job and digest; whatever reads a hop file but a worker gets it whole (`compose`).
- **Once per iteration** (the state after a model's last sub-epoch of an iteration) and at
  step 0 the state is also written into the job's state table, in pieces of at most
  `runtime.state.PIECE_BYTES` (`StateTable`), by the coordinator's `DurableWriter`, beside the hops:
  that is the copy a resume can count on after any failure, and the one backups and
  replicas carry.
- A resume uses a hop file only when it was written since the server last started (the
  run directory is named by `pg_postmaster_start_time()`): a killed coordinator or worker
  loses nothing, since the page cache outlives them.  After a restart (or a machine
  crash, which restarts the server) a model goes back to its last durable state, and its
  lost sub-epochs are trained again: the visit order is drawn from the seed, each
  sub-epoch is deterministic, so the weights are the same bits.

Which files a session reads or writes is named by the job id, the mst_key and the step
alone, never by a path a user gives, and the callers (`segment.worker`, `job.coordinator`)
have checked that the job is the current role's.  Files are removed as the steps they hold
are recorded (an iteration's end once a later one is durable), with the job's directory
when the job finishes, and with a run's directory when the job resumes after a restart.
"""

from __future__ import annotations

import contextlib
import errno
import mmap
import os
import queue
import re
import shutil
import threading
from pathlib import Path
from typing import Any, Callable, Iterator

from madlib_mop import errors
from madlib_mop.errors import MadlibMopError
from madlib_mop.runtime import state
from madlib_mop.runtime.state import pieces

# In the server's data directory.  Its name starts with pgsql_tmp, as PostgreSQL's own
# temporary files do, so that base backups and pg_rewind leave it out: a restored or
# rewound server starts a new run, whose jobs never read an earlier run's files.
DIRECTORY = "pgsql_tmp_madlib_mop_states"


def data_directory() -> Path:
    """The server's data directory: every backend runs in it (PostgreSQL changes to it at
    start), so a session needs no superuser setting to find it."""
    here = Path(os.getcwd())
    if not (here / "PG_VERSION").exists():
        raise RuntimeError(f"{here} is not a PostgreSQL data directory")
    return here


class HopFiles:
    """The states between hops of one job, for the server's current run.  On a segment
    server, a job's are the states its visits there left (`segment.kept_states`), in a
    folder named by the role and the job's `store` token.  `elsewhere`, on the coordinator
    of a job whose workers keep their states on segment servers
    (`engine.segment_states.SegmentStates`): where a state this server has no file of is
    read from."""

    def __init__(self, database_oid: int, job_id: int | str, run: str, root: Path | None = None):
        self.job_directory = (root or data_directory()) / DIRECTORY / str(database_oid) / str(job_id)
        self.run_directory = self.job_directory / run
        self.elsewhere: Any = None

    @classmethod
    def of(cls, query: Callable[[str], Any], job_id: int) -> "HopFiles":
        """`query(sql)`: the first row's first column of a query in the session."""
        oid = query("SELECT oid FROM pg_catalog.pg_database WHERE datname = pg_catalog.current_database()")
        run = query("SELECT to_char(pg_catalog.pg_postmaster_start_time() AT TIME ZONE 'UTC', "
                    "'YYYYMMDD\"T\"HH24MISSUS')")
        return cls(int(oid), job_id, str(run))

    @classmethod
    def of_role(cls, query: Callable[[str], Any], store: str) -> "HopFiles":
        """A segment server's: the current role's states of the job whose token is `store`
        (`engine.segment_states.store_token`: the coordinator and the job).  A role reads
        and removes only its own folder."""
        if not re.fullmatch(r"[0-9a-f-]{1,64}-[0-9]{1,19}", store):
            raise MadlibMopError(f"not a job's store: {store!r}", sqlstate=errors.INVALID_PARAMETER_VALUE,
                                 hint="It is given by the job's coordinator.")
        role = query("SELECT oid FROM pg_catalog.pg_roles WHERE rolname = current_user")
        hops = cls.of(query, 0)
        return cls(int(hops.job_directory.parent.name), f"r{int(role)}-{store}", hops.run_directory.name)

    def path(self, mst_key: int, step: int) -> Path:
        return self.run_directory / f"{int(mst_key)}-{int(step)}.state"

    def create(self) -> None:
        """The run's directory, made by the job's coordinator when it starts (a worker does
        not make it: a late one of a finished job then leaves nothing behind)."""
        self.run_directory.mkdir(parents=True, exist_ok=True)

    def prefix_path(self, digest: str) -> Path:
        """The file of a staged model's frozen prefix (`state.head_meta`), by its digest."""
        if not re.fullmatch(r"[0-9a-f]{1,64}", digest):
            raise ValueError(f"not a prefix digest: {digest!r}")
        return self.run_directory / f"prefix-{digest}.state"

    def write(self, mst_key: int, step: int, blob: bytes | Callable[[Any], None]) -> None:
        """Written whole or not at all: to a file of this process, then renamed.  `blob`:
        the state's bytes, or a function that writes them to a file handle (a big state
        is written a part at a time, never whole in memory)."""
        self._write(self.path(mst_key, step), blob, f"the state of model {mst_key} after step {step}")

    def keep_prefix(self, digest: str, write: Callable[[Any], None]) -> None:
        """The prefix's state, by the first worker that hops a head state of it; it stays
        as long as the job's run directory."""
        if not self.prefix_path(digest).exists():
            self._write(self.prefix_path(digest), write, f"the frozen layers' state {digest}")

    def _write(self, target: Path, blob: bytes | Callable[[Any], None], what: str) -> None:
        # (the coordinator's threads may fetch the same state at once: each its own file)
        partial = target.with_name(f"{target.name}.{os.getpid()}.{threading.get_ident()}.partial")
        try:
            with open(partial, "wb") as handle:
                if callable(blob):
                    blob(handle)
                else:
                    handle.write(blob)
            os.replace(partial, target)
        except OSError as error:
            partial.unlink(missing_ok=True)
            raise self._not_written(what, error) from None
        except BaseException:  # (`blob` failed: a fetch whose server went away mid-way)
            partial.unlink(missing_ok=True)
            raise

    def receive(self, mst_key: int, step: int, piece: bytes, offset: int, last: bool) -> None:
        """A piece of a state another session sends a piece per call (a segment server's,
        from its coordinator), at byte `offset` of it: appended to a file of this process,
        which the `last` piece renames into place.  A first piece (offset 0) starts over."""
        target = self.path(mst_key, step)
        partial = target.with_name(f"{target.name}.{os.getpid()}.received.partial")
        what = f"the state of model {mst_key} after step {step}"
        try:
            with open(partial, "wb" if offset == 0 else "r+b") as handle:
                if handle.seek(0, os.SEEK_END) != offset:
                    raise MadlibMopError(f"{what}: a piece at byte {offset} does not follow the "
                                         f"{handle.tell()} bytes received",
                                         sqlstate=errors.INVALID_PARAMETER_VALUE,
                                         hint="The coordinator sends the state again from its start.")
                handle.write(piece)
            if last:
                os.replace(partial, target)
        except FileNotFoundError:
            raise MadlibMopError(f"{what}: a piece at byte {offset} came before the first",
                                 sqlstate=errors.INVALID_PARAMETER_VALUE,
                                 hint="The coordinator sends the state again from its start.") from None
        except OSError as error:
            partial.unlink(missing_ok=True)
            raise self._not_written(what, error) from None

    def _not_written(self, what: str, error: OSError) -> MadlibMopError:
        return MadlibMopError(
            f"{what} could not be written: {error}",
            sqlstate=errors.DISK_FULL if error.errno == errno.ENOSPC else errors.IO_ERROR,
            detail=f"in {self.run_directory}",
            hint="Free space on the server's data directory, then resume the job "
                 "(CALL resume(job_id)); finished sub-epochs are kept.")

    def read(self, mst_key: int, step: int) -> bytes | bytearray | None:
        """The whole state (a head state composed with its prefix)."""
        with self.mapped(mst_key, step) as blob:
            return blob if blob is None or isinstance(blob, bytearray) else bytes(blob)

    def fetch(self, mst_key: int, step: int) -> bool:
        """A state this server has no file of, copied into its hop file from where it is
        (`elsewhere`), a piece at a time; False if it is nowhere else either."""
        if self.elsewhere is None or self.elsewhere.locate(mst_key, step) is None:
            return False
        self.write(mst_key, step, lambda handle: self.elsewhere.copy(mst_key, step, handle, patient=True))
        return True

    @contextlib.contextmanager
    def mapped(self, mst_key: int, step: int, whole: bool = True) -> Iterator[Any]:
        """The hop file mapped into memory, read-only (None: there is none): a state read
        this way is not copied whole into the process, its pages are the page cache's.
        A head state is given composed with its prefix (a copy in memory), unless not
        `whole`."""
        with _mapped_file(self.path(mst_key, step)) as blob:
            digest = None if blob is None or not whole else state.left_out_prefix(blob)
            if digest is None:
                yield blob
                return
            with self.mapped_prefix(digest) as prefix:
                composed = state.compose(blob, prefix)
        yield composed

    @contextlib.contextmanager
    def mapped_prefix(self, digest: str) -> Iterator[mmap.mmap]:
        """A prefix's state (`keep_prefix`), mapped."""
        with _mapped_file(self.prefix_path(digest)) as blob:
            if blob is None:
                raise MadlibMopError(f"no state of the frozen layers {digest} in the job's store",
                                     sqlstate=errors.OBJECT_NOT_IN_PREREQUISITE_STATE,
                                     hint="Resume the job: it goes back to its last durable states.")
            yield blob

    def holds(self, mst_key: int, step: int) -> bool:
        return self.path(mst_key, step).exists()

    def remove(self, mst_key: int, step: int) -> None:
        self.path(mst_key, step).unlink(missing_ok=True)

    def remove_other_runs(self, databases: set[int] | None = None) -> None:
        """Files of earlier runs of the server, of every job of this database: never read
        again (not fsynced, so not trusted), whether or not their job is resumed; and the
        folders of databases that no longer exist (`databases`: the oids of those that do)."""
        database = self.job_directory.parent
        if databases is not None and database.parent.is_dir():
            for other in database.parent.iterdir():
                if other.name.isdigit() and int(other.name) not in databases:
                    shutil.rmtree(other, ignore_errors=True)
        if not database.is_dir():
            return
        for job in database.iterdir():
            for run in job.iterdir() if job.is_dir() else ():
                if run.name != self.run_directory.name:
                    shutil.rmtree(run, ignore_errors=True)
            if job.is_dir() and not any(job.iterdir()):
                shutil.rmtree(job, ignore_errors=True)

    def remove_older(self, mst_key: int, below: int, ends_from: int, per_iteration: int) -> None:
        """A model's states before step `below` but iteration ends (multiples of
        `per_iteration`) from `ends_from` on: a later one replaced them."""
        for path in self.run_directory.glob(f"{int(mst_key)}-*.state"):
            step = int(path.stem.split("-")[1])
            if step < below and (step < ends_from or step % per_iteration):
                path.unlink(missing_ok=True)

    def remove_job(self) -> None:
        shutil.rmtree(self.job_directory, ignore_errors=True)
        if self.elsewhere is not None:
            self.elsewhere.forget()


@contextlib.contextmanager
def _mapped_file(path: Path) -> Iterator[mmap.mmap | None]:
    """A file mapped into memory, read-only (None: there is none)."""
    try:
        handle = open(path, "rb")
    except FileNotFoundError:
        yield None
        return
    with handle:
        mapped = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ)
        try:
            yield mapped
        finally:
            try:
                mapped.close()
            except BufferError:  # a view of it outlives the block (an error's traceback):
                pass             # it is unmapped when the last one goes


def found(blob: Any, mst_key: int, step: int) -> Any:
    if blob is None:
        raise MadlibMopError(f"no state of model {mst_key} after step {step} in the job's store",
                             sqlstate=errors.UNDEFINED_FILE,
                             hint="Resume the job (CALL resume(job_id)): a model whose state "
                                  "is lost goes back to its last kept one.")
    return blob


class StateTable:
    """The durable states of a job's state table (mst_key, step, piece, state), through any
    session: `execute(sql, params)` runs a statement with %s-style placeholders and
    returns its rows as tuples."""

    def __init__(self, execute: Callable[[str, tuple], list], table: str):
        self.execute, self.table = execute, table  # table: qualified and quoted

    def write(self, mst_key: int, step: int, blob: bytes) -> None:
        """A state's pieces (a state written again, by a retried call, is the same bits:
        kept once)."""
        for number, piece in pieces(blob):
            self.execute(f"INSERT INTO {self.table} (mst_key, step, piece, state) "
                         "VALUES (%s, %s, %s, %s) ON CONFLICT DO NOTHING",
                         (mst_key, step, number, piece))

    def read(self, mst_key: int, step: int) -> bytes | None:
        rows = self.execute(f"SELECT state FROM {self.table} WHERE mst_key = %s AND step = %s "
                            "ORDER BY piece", (mst_key, step))
        if not rows:
            return None
        return b"".join(bytes(row[0]) for row in rows) if len(rows) > 1 else bytes(rows[0][0])

    def last_step(self, mst_key: int, at_most: int) -> int | None:
        rows = self.execute(f"SELECT max(step) FROM {self.table} WHERE mst_key = %s AND step <= %s",
                            (mst_key, at_most))
        return rows[0][0] if rows else None

    def sizes(self) -> dict[int, int]:
        """Each model's state size in bytes, from its initial state (kept for replay; a
        model's states are all of one size).  octet_length reads no stored value."""
        return {int(k): int(n) for k, n in self.execute(
            f"SELECT mst_key, sum(octet_length(state)) FROM {self.table} WHERE step = 0 "
            "GROUP BY mst_key", ())}

    def prune(self, mst_key: int, below: int) -> None:
        """Delete the states between the initial one (kept for replay) and `below`."""
        self.execute(f"DELETE FROM {self.table} WHERE mst_key = %s AND step > 0 AND step < %s",
                     (mst_key, below))


class DurableWriter:
    """Copies iteration-end states from their hop files into the state table, and their
    weights into `<out>.model_weights`, in a session and a thread of its own, beside the
    hops rather than in their way: a hop waits for one copy into the page cache, not for
    the write-ahead log.  Until a state is written, the model's previous durable state is
    kept (`durable_step` bounds what may be pruned), so a restart in between only retrains
    a little more.  Work is done in the order it is given: a model's weights of an
    iteration are published before its state of that iteration is durable.  A state or
    weights already superseded by a later one of the same model is skipped: when writes
    fall behind (big states, a busy disk) only the latest of each model are made."""

    def __init__(self, connect: Callable[[], Any], table: str, hops: HopFiles,
                 set_weights: Callable[[Any, int, Any], None]):
        """`set_weights(db, mst_key, weights)`: writes a model's `<out>`.model_weights in
        the writer's session (`job.outputs.store_weights`)."""
        self._connect, self._table, self._hops = connect, table, hops
        self._set_weights = set_weights
        self._queue: queue.Queue = queue.Queue()
        self._done: dict[int, int] = {}
        self._latest: dict[tuple[str, int], int] = {}  # (kind, mst_key) -> latest step given
        self._lock = threading.Lock()
        self.error: BaseException | None = None
        self._thread: threading.Thread | None = None
        self._db: Any = None
        self._abandoned = False

    def submit(self, mst_key: int, step: int) -> None:
        """Write the model's state after `step` sub-epochs into the state table."""
        self._put(("state", mst_key, step))

    def publish_weights(self, mst_key: int, step: int) -> None:
        """Set the model's `<out>.model_weights` to those of its state after `step` sub-epochs."""
        self._put(("weights", mst_key, step))

    def _put(self, item: tuple) -> None:
        with self._lock:
            self._latest[item[:2]] = max(item[2], self._latest.get(item[:2], 0))
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="madlib_mop durable states",
                                            daemon=True)
            self._thread.start()
        self._queue.put(item)

    def durable_step(self, mst_key: int) -> int:
        """The model's latest state written by this writer (0: none yet)."""
        with self._lock:
            return self._done.get(mst_key, 0)

    def _run(self) -> None:
        try:
            db = self._db = self._connect()
        except BaseException as error:  # every later submit is then reported by drain
            self.error = error
            db = None
        table = StateTable(psycopg_executor(db), self._table) if db is not None else None
        store = StateStore(table, self._hops) if table is not None else None
        while True:
            item = self._queue.get()
            try:
                if item is None:
                    break
                if table is None or self.error is not None or self._abandoned:
                    continue
                kind, mst_key, step = item
                with self._lock:
                    if step < self._latest[(kind, mst_key)]:
                        continue
                if kind == "weights":
                    with store.madlib_weights(mst_key, step) as weights, db.transaction():
                        self._set_weights(db, mst_key, found(weights, mst_key, step))
                    continue
                if not self._hops.holds(mst_key, step):  # kept on a segment server
                    self._hops.fetch(mst_key, step)
                with self._hops.mapped(mst_key, step) as blob, db.transaction():
                    table.write(mst_key, step, found(blob, mst_key, step))
                with self._lock:
                    self._done[mst_key] = max(step, self._done.get(mst_key, 0))
            except BaseException as error:
                self.error = error
            finally:
                self._queue.task_done()
        if db is not None:
            db.close()

    def check(self) -> None:
        """Raise what failed (the job stops, resumably), at the coordinator's next iteration
        boundary: where it would write the job's outputs itself."""
        if self.error is not None:
            raise self.error

    def drain(self) -> None:
        """Wait until everything given is written; raise what failed."""
        if self._thread is not None:
            self._queue.join()
        self.check()

    def close(self, abandon: bool = False) -> None:
        """Stop the thread: after writing what it was given, or (`abandon`: the job failed
        or was cancelled) at once, cancelling the write under way.  What is not written
        then is queued again when the job resumes (`store.JobStore.load_models`)."""
        if self._thread is None:
            return
        if abandon:
            self._abandoned = True
            if self._db is not None:
                self._db.cancel_safe()
        self._queue.put(None)
        self._thread.join(timeout=60)
        self._thread = None


class StateStore:
    """A job's states: read from the hop files, else the table (the hop files are written by
    the workers, or by the coordinator for a segment server's; the table by the writer)."""

    def __init__(self, table: StateTable, hops: HopFiles, writer: DurableWriter | None = None):
        self.table, self.hops, self.writer = table, hops, writer

    def read(self, mst_key: int, step: int) -> bytes | None:
        with self.mapped(mst_key, step) as blob:
            return blob if blob is None or isinstance(blob, (bytes, bytearray)) else bytes(blob)

    @contextlib.contextmanager
    def mapped(self, mst_key: int, step: int, whole: bool = True) -> Iterator[Any]:
        """The state, its hop file mapped (`HopFiles.mapped`: a head state unless `whole`),
        else read from the table; None if there is neither.  Views of it must not outlive
        the block."""
        if self.hops.holds(mst_key, step):
            with self.hops.mapped(mst_key, step, whole) as mapped:
                yield mapped
            return
        blob = self.table.read(mst_key, step) if self.table is not None else None
        if blob is None and self.hops.fetch(mst_key, step):  # kept on a segment server
            with self.hops.mapped(mst_key, step, whole) as mapped:
                yield mapped
            return
        yield blob

    @contextlib.contextmanager
    def madlib_weights(self, mst_key: int, step: int) -> Iterator[Any]:
        """The state's weights as MADlib's model_weights (None: no such state), a view of
        the mapped hop file where it is (a state may be GBs: not copied)."""
        with self.mapped(mst_key, step) as blob:
            view = None if blob is None else state.madlib_weights(blob)
            try:
                yield view
            finally:
                if isinstance(view, memoryview):
                    view.release()

    def visit_recorded(self, mst_key: int, step: int, per_iteration: int) -> None:
        """The visit from `step` is recorded: an iteration's end goes to the state table, and
        the state the visit started from is needed no more between hops (an iteration's end
        stays until a later one is durable: `iteration_done`)."""
        if (step + 1) % per_iteration == 0:
            self.writer.submit(mst_key, step + 1)
        if step % per_iteration:
            self.hops.remove(mst_key, step)

    def iteration_done(self, model: Any, step: int, needed: list[int]) -> None:
        """The model's state after `step` sub-epochs ends its latest iteration: its weights
        go to `<out>`.model_weights (once per iteration), and the states before the
        latest durable one are deleted but step 0 (replay) and those `needed` (by pending
        validation).  `model`: the coordinator's `store.ModelRecord`."""
        self.writer.check()  # what failed of the earlier iterations' writes
        if step != model.published_step:
            self.writer.publish_weights(model.mst_key, step)
            model.published_step = step
        keep_from = min([step, max(model.pruned_below, self.writer.durable_step(model.mst_key))] + needed)
        if keep_from > model.pruned_below:
            self.table.prune(model.mst_key, keep_from)
            for earlier in range(model.pruned_below, keep_from):
                if earlier % model.per_iteration == 0:
                    self.hops.remove(model.mst_key, earlier)
            model.pruned_below = keep_from

    def available(self, mst_key: int, step: int) -> bool:
        """Can `read(mst_key, step)` find the state?"""
        return self.hops.holds(mst_key, step) or self.table.last_step(mst_key, step) == step


def plpy_executor(plpy: Any) -> Callable[[str, tuple], list]:
    """`StateTable`'s `execute` over PL/Python's SPI (plans prepared once per statement)."""
    plans: dict[tuple, Any] = {}
    types = {int: "bigint", bytes: "bytea", str: "text"}

    def execute(statement: str, params: tuple) -> list:
        key = (statement,) + tuple(type(p) for p in params)
        if key not in plans:
            numbered = statement
            for number in range(1, len(params) + 1):
                numbered = numbered.replace("%s", f"${number}", 1)
            plans[key] = plpy.prepare(numbered, [types[type(p)] for p in params])
        result = plpy.execute(plans[key], list(params))
        if not statement.startswith("SELECT") or result.nrows() == 0:
            return []
        names = result.colnames()
        return [tuple(row[name] for name in names) for row in result]
    return execute


def psycopg_executor(db: Any) -> Callable[[str, tuple], list]:
    """`StateTable`'s `execute` over a psycopg connection."""
    from psycopg.rows import tuple_row

    def execute(statement: str, params: tuple) -> list:
        cursor = db.cursor(row_factory=tuple_row, binary=True)
        cursor.execute(statement, params)
        return cursor.fetchall() if cursor.description else []
    return execute
