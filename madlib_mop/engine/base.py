"""The engine contract: where a job's segments live and how work reaches them.

An engine gives workers; a worker is one session on the server that holds a segment (or
a part of a table to predict on) and runs one call at a time.  Everything above the engine
(the coordinator, evaluate, predict) speaks only to these two classes.

Contract of a `Worker`:
- A call blocks until done and runs in the worker's session, as the role that called the
  SQL function, on the same database name.  `cancel()` may be called from another thread
  and makes the running call fail soon; `close()` ends the session.
- **The state.**  `train` gets the model's whole state (the bytes of
  `madlib_mop.runtime.state`) and returns the new state with the visit's record; `evaluate`
  gets the state to evaluate.  A worker of an engine that `stores_states` (on the job's
  own server) is given None instead: it reads the state from the job's store and writes
  the new one there (`job.state_store`), and returns None.  Either way a sub-epoch counts
  once the caller has committed the visit's record, so a worker that dies loses nothing
  but the call it was running.
- The same call with the same arguments gives the same bytes (seeded; see
  `madlib_mop.runtime.training`), on any worker of the same segment.
- A worker may cache what it derives from the job (the decoded segment, compiled models)
  but must look the job up as the current role on every call.
- Errors are raised as exceptions carrying a SQLSTATE (`psycopg.Error.diag.sqlstate` or
  `MadlibMopError.sqlstate`); the caller decides about retries.

Contract of an `Engine`:
- `worker(segment, label)` opens a worker for a segment (a new session; `label` names it
  in `pg_stat_activity`).  Opening is cheap enough to call again after a failure.
- `training_workers(segments)` gives a job's workers and `inference_workers(count)` those of
  evaluate/predict; an engine may keep them for the session's later calls (TensorFlow
  imported, functions traced once).  A kept worker's session is the same role's, on the
  same database: the key of what is kept includes the connection string.

Engines: `local.LocalEngine` (the segments are partitions of one server's packed table;
workers are sessions of that server) and `cluster.ClusterEngine` (the partitions are foreign
tables on segment servers; workers are sessions there).  Greenplum's segments would be
reached the same way (docs/architecture.md).
"""

from __future__ import annotations

import abc
from dataclasses import asdict, dataclass, field
from typing import Any, Callable

from madlib_mop import errors
from madlib_mop.errors import MadlibMopError
from madlib_mop.json_values import finite_json, json_value


@dataclass
class VisitRecord:
    """What a worker reports of one sub-epoch, as the job's visits table keeps it (jsonb)."""

    rows: int
    metrics: dict[str, float]  # means over the segment's rows: loss and the compiled metrics
    segment: int
    pid: int  # the worker session's
    in_memory: bool  # the segment's buffers were kept decoded (else read per sub-epoch)
    finished_at: float  # epoch seconds
    # setup, read, build, load, restore, stage, train, other, save, keep, total; `call` as
    # the coordinator saw it
    seconds: dict[str, float] = field(default_factory=dict)
    # Why the model diverged in this sub-epoch (its loss, a metric or a weight became NaN
    # or infinite), else None.  A diverged visit brings no state back and does not count.
    diverged: str | None = None
    # A staged model's features (`segment.features.Report`): their prefix digest, whether
    # this call computed them, spilled or not, their size and the seconds computing them.
    staged: dict | None = None
    # Functions this sub-epoch traced (0: its program's were ready, from an earlier visit,
    # job, or a session kept ready for the role).
    traced: int = 0
    # The bytes of the state this sub-epoch left (its hop file, or the state shipped back):
    # a staged model's hop leaves its frozen prefix out.
    state_bytes: int = 0
    # A fused call's models (this one among them), in their order; None: it trained alone.
    # They evaluate that iteration's validation together (`job.assignment.eval_partners`).
    fused_with: list[int] | None = None
    # Where the state it left is kept: the segment server's name (as the coordinator names
    # it) whose worker kept it (`segment.kept_states`); None: in the job's store.
    kept_on: str | None = None
    # The bytes of states this visit moved: fetched from another segment server directly,
    # and through the coordinator (read from a server and sent with the call, or sent back).
    fetched_bytes: int = 0
    coordinator_bytes: int = 0

    def to_json(self) -> str:
        return finite_json(asdict(self))

    @classmethod
    def from_json(cls, value: Any) -> "VisitRecord":
        return cls(**json_value(value))

    def as_dict(self) -> dict:
        return asdict(self)


class Worker(abc.ABC):
    segment: int

    @property
    def where(self) -> str:
        """The server it runs on, as messages name it."""
        return "this server"

    def rename(self, label: str) -> None:
        """How the worker's session shows in pg_stat_activity from its next call on."""

    def serves(self, segment: int) -> bool:
        """Can it run the calls of `segment` (read its data)?  A worker of this server
        serves any segment of it; a segment server's, its own segments."""
        return True

    @abc.abstractmethod
    def warm_up(self, segments: int) -> None:
        """Import TensorFlow (sized for `segments` workers) before the first call needs it."""

    @abc.abstractmethod
    def train(self, job_id: int, mst_key: int, step: int, segment: int,
              model_state: bytes) -> tuple[bytes, VisitRecord]:
        """One sub-epoch of model `mst_key` on `segment` from its state after `step`
        sub-epochs: (the new state, the visit's record)."""

    def train_fused(self, job_id: int, mst_keys: tuple[int, ...], steps: tuple[int, ...],
                    segment: int, model_states: tuple[bytes | None, ...]) -> list[tuple[None, VisitRecord]]:
        """One sub-epoch of models of one fusion group, as one program (`runtime.fusion`),
        each from its state after its `steps` sub-epochs (a clone's count is its own): each
        model's (None, record), in their order.  The states are where the workers find them
        (the job's store; a segment server's, `engine.cluster`), or given (`model_states`:
        a state the coordinator gives as it gives `train` one, else None); the new ones stay
        there.  Only the workers of an engine with nothing `without_fusion` have it."""
        raise MadlibMopError("this engine's workers do not train fused models",
                             sqlstate=errors.FEATURE_NOT_SUPPORTED,
                             hint="SET madlib_mop.fuse_models = off.")

    @abc.abstractmethod
    def evaluate(self, job_id: int, mst_key: int, step: int, partition: int,
                 model_state: bytes) -> dict:
        """Validation loss and metrics of the state on one partition of the job's
        validation table: {rows, metrics, finished_at, ...}."""

    def evaluate_fused(self, job_id: int, mst_keys: tuple[int, ...], steps: tuple[int, ...],
                       partition: int, model_states: tuple[bytes | None, ...]) -> list[dict]:
        """`evaluate` of the models of one fused call, each after its `steps` sub-epochs, as one
        program, their states found or given as `train_fused`'s: each model's result, in
        their order."""
        raise MadlibMopError("this engine's workers do not evaluate fused models",
                             sqlstate=errors.FEATURE_NOT_SUPPORTED,
                             hint="SET madlib_mop.fuse_models = off.")

    @abc.abstractmethod
    def evaluate_models(self, task: dict, partition: int) -> list[dict]:
        """madlib_keras_evaluate's part: each model of `task` over one partition of a
        packed table, [{rows, metrics}] in the task's model order."""

    @abc.abstractmethod
    def predict_blocks(self, task: dict, first_block: int, last_block: int,
                       weights: bytes) -> dict:
        """madlib_keras_predict's part: predict the rows in table blocks [first, last)
        and insert them into the task's output table: {rows, seconds}."""

    @abc.abstractmethod
    def model_facts(self, request: dict) -> list[dict]:
        """Shapes and sizes of the request's configurations (`runtime.model_facts.facts`)."""

    @abc.abstractmethod
    def initial_states(self, request: dict, weights: list[bytes | None],
                       token: str | None) -> tuple[list[bytes | None], list[int]]:
        """The configurations' step-0 states, into the token's directory or returned
        (`runtime.model_facts.initial_states`)."""

    @abc.abstractmethod
    def cancel(self) -> None: ...

    @abc.abstractmethod
    def close(self) -> None: ...

    @property
    @abc.abstractmethod
    def usable(self) -> bool:
        """False once the session is broken: open a new worker."""


class Engine(abc.ABC):
    # Its workers write to this server's data directory: files they write (a job's initial
    # states, `job.keras_work`) can be read by the calling session.
    shares_files = True
    # Do its training workers come from the server's capped pool (`engine.server_slots`)?
    pooled = False
    # Do its workers read a model's state from the job's store and write the new one there
    # (`job.state_store`: they run on the coordinator's server), rather than get it with
    # the call and send it back?
    stores_states = False

    def without_fusion(self) -> list[str]:
        """Where its workers cannot train and validate models as fused groups
        (`Worker.train_fused`), as messages name it; none: they all can.  A job fuses only
        where none is named (`job.fusing`)."""
        return ["this engine's workers"]

    @abc.abstractmethod
    def worker(self, segment: int, label: str) -> Worker: ...

    def training_workers(self, segments: int) -> list[Worker]:
        """A job's workers, worker i for segment i.  An engine may give workers that an
        earlier job of this session left open (TensorFlow imported, functions traced)."""
        return [self.worker(s, f"madlib_mop worker segment {s}") for s in range(segments)]

    def new_workers(self, count: int, first: int) -> list[Worker]:
        """More workers for a running or waiting job, as many as the server's pool allows
        now (an engine without a pool gives none: its jobs have one worker per segment)."""
        return []

    def waiting_for(self) -> str | None:
        """Why `new_workers` gave none, when another server than this one's pool is full."""
        return None

    def kept_states(self, plpy: Any, job: Any) -> Any:
        """Where the states its workers keep are read from (`engine.segment_states`), for a
        job's coordinator; None: they are in the job's store on this server."""
        return None

    def worker_limits(self) -> list[tuple[str, dict]]:
        """(where, its limits: cap, share_mb, budget_mb) of each other server its workers
        run on, as that server's `_mop_worker_limits` gives them; none: this server's."""
        return []

    def keep_idle(self, workers: list[Worker], segments: int) -> None:
        """The job ended with these workers idle: an engine may keep them for the
        session's next job."""

    def prepare_job(self, plpy: Any, job: Any, models: Callable[[], list[dict]]) -> None:
        """Called in the coordinator's thread before the job's first call, and when models
        join: an engine whose workers cannot read the job's row gives them what they need
        of `job` (its `jobs` row) and `models()` (its models table's rows, read only by an
        engine that ships them)."""

    @abc.abstractmethod
    def inference_workers(self, count: int) -> list[Worker]: ...

    def keep_inference(self, workers: list[Worker]) -> None:
        """An evaluation or prediction ended: an engine may keep its sessions for the role's
        next call."""
        for worker in workers:
            worker.close()



def failure_sqlstate(error: BaseException) -> str | None:
    """The SQLSTATE of a worker call's failure, whichever side raised it."""
    if isinstance(error, MadlibMopError):
        return error.sqlstate
    return getattr(getattr(error, "diag", None), "sqlstate", None)


# Lost sessions (the server stopped, restarted or is cut off): their calls wait for it.
SESSION_LOST_SQLSTATES = (errors.ADMIN_SHUTDOWN, errors.CRASH_SHUTDOWN, errors.CANNOT_CONNECT_NOW)


def session_lost(error: BaseException) -> bool:
    """Did the failure lose its session (no SQLSTATE, class 08 or 57P0x), rather than fail
    in it?"""
    import psycopg  # (not at the module's top: a segment server's plain sessions import this module)

    sqlstate = failure_sqlstate(error)
    if sqlstate is None:
        return isinstance(error, psycopg.OperationalError)
    return sqlstate[:2] == "08" or sqlstate in SESSION_LOST_SQLSTATES


def as_error(error: BaseException, default_hint: str = "See the server log.") -> MadlibMopError:
    """A worker's failure as the MadlibMopError the caller raises (its SQLSTATE, message,
    DETAIL and HINT kept)."""
    if isinstance(error, MadlibMopError):
        return error
    diag = getattr(error, "diag", None)
    return MadlibMopError(
        (diag.message_primary if diag and diag.message_primary else str(error)).replace(
            "madlib_mop: ", ""),
        sqlstate=(diag.sqlstate if diag and diag.sqlstate else errors.DATA_EXCEPTION),
        detail=diag.message_detail if diag else None,
        hint=(diag.message_hint if diag and diag.message_hint else default_hint))
