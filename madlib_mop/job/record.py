"""A job as the package reads it: its `jobs` row as a frozen, typed record.

`JobArguments` are the call's arguments as the job records them (a repeat call with equal
arguments continues the job; a coordinator rebuilds the job's search from them); `JobRecord`
is the whole row, its tables as identifiers and its state a `JobState`.  Only
`job.repository` reads and writes `jobs`; everything else takes these records.
"""

from __future__ import annotations

import dataclasses
import enum
import json
from dataclasses import dataclass
from typing import Any, Mapping

from madlib_mop import errors
from madlib_mop.errors import MadlibMopError
from madlib_mop.json_values import json_value


class JobState(str, enum.Enum):
    """`jobs.state` (the same six words as the table's CHECK constraint)."""

    CREATED = "created"
    QUEUED = "queued"
    RUNNING = "running"
    FINISHED = "finished"
    FAILED = "failed"
    INTERRUPTED = "interrupted"

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class JobArguments:
    """The arguments a job records.  Those after `seed` are recorded only when a call set
    them (`as_json` leaves out their defaults), so that a job an earlier version recorded
    reads back equal to the same call today."""

    source_table: str
    model_output_table: str
    model_selection_table: str
    num_iterations: int
    validation_table: str | None
    metrics_compute_frequency: int
    warm_start: bool
    name: str | None
    description: str | None
    use_caching: bool
    seed: int
    single: bool = False  # madlib_keras_fit: one model, MADlib's single-model outputs
    pruner: str | None = None
    automl: Mapping[str, Any] | None = None  # madlib_keras_automl's search, as it recorded it
    initial_models: int | None = None  # automl: the models proposed before the job started
    custom_functions: Mapping[str, Any] | None = None  # object table and digests (`job.plan`)
    stage_frozen_layers: bool = True
    fuse_models: str = "off"  # madlib_mop.fuse_models when the job started (`job.fusing`)
    # How the models' paths are drawn (`job.schedule.visit_orders`): {"by_class": the
    # mst_keys of each fusion class of two or more, "clones": "source_path"} for every job
    # started now (`job.fusing.path_grouping`; a job recorded without "clones" draws its
    # clones' orders from their own streams); "rotation" for a job started before jobs
    # recorded it (resumed with the orders it had).
    orders: Any = "rotation"
    if_output_exists: str | None = None
    output_family: str | None = None  # if_output_exists => 'new_version': the first name
    # Tables packed in key order: argument -> the rows they held when the job started (a
    # job does not continue on rows appended since, `db.packed.check_not_grown`).
    packed_rows: Mapping[str, int] | None = None
    # Keys this version does not know (an earlier version's): kept, recorded back as they were.
    other: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    @classmethod
    def of(cls, values: Mapping[str, Any] | str) -> "JobArguments":
        """From the recorded JSON (text or decoded), or from a call's arguments as a dict
        (they pass through JSON first: what is compared is what is recorded)."""
        decoded = json.loads(json.dumps(json_value(values)))
        fields = dataclasses.fields(cls)
        missing = [f.name for f in fields[:_LAST_ALWAYS_RECORDED + 1]
                   if not isinstance(decoded, dict) or f.name not in decoded]
        if missing:
            raise MadlibMopError(f"a job's recorded arguments lack {', '.join(missing)}",
                                 sqlstate=errors.DATA_EXCEPTION,
                                 hint="The job's row in jobs was not written by madlib_mop: "
                                      "start the job again.")
        known = {f.name for f in fields} - {"other"}
        return cls(**{key: value for key, value in decoded.items() if key in known},
                   other={key: value for key, value in decoded.items() if key not in known})

    def as_json(self) -> dict:
        """The arguments as `jobs.arguments` records them."""
        recorded = {}
        for index, f in enumerate(dataclasses.fields(self)):
            value = getattr(self, f.name)
            if f.name != "other" and (index <= _LAST_ALWAYS_RECORDED or value != f.default):
                recorded[f.name] = value
        return {**recorded, **self.other}

    def replace(self, **changes: Any) -> "JobArguments":
        return dataclasses.replace(self, **changes)

    def same_call(self, other: "JobArguments") -> bool:
        """Whether `other` (a call's arguments now) is the call that started this job.  How
        the job draws its paths (`orders`) is the job's own record, not a part of the call:
        a job started before jobs recorded it goes on with its rotations."""
        return self == other.replace(orders=self.orders)


_LAST_ALWAYS_RECORDED = [f.name for f in dataclasses.fields(JobArguments)].index("seed")


@dataclass(frozen=True)
class JobRecord:
    """A `jobs` row."""

    job_id: int
    owner: str
    state: JobState
    model_output_table: str  # quoted, as the job's outputs are named in SQL
    source_table: str
    validation_table: str | None
    model_selection_table: str
    arguments: JobArguments
    table_names: Mapping[str, tuple[str, str]]  # key -> (schema, table), as `job.tables` names them
    num_models: int
    num_segments: int
    validation_partitions: int | None
    seed: int
    subepochs_total: int
    subepochs_done: int
    coordinator_pid: int | None
    last_error: str | None
    model_failures: Mapping[str, Any] | None

    @classmethod
    def of(cls, row: Mapping[str, Any]) -> "JobRecord":
        """From a `jobs` row as psycopg or PL/Python gives it (json values as text or decoded)."""
        return cls(
            job_id=row["job_id"], owner=row["owner"], state=JobState(row["state"]),
            model_output_table=row["model_output_table"], source_table=row["source_table"],
            validation_table=row["validation_table"], model_selection_table=row["model_selection_table"],
            arguments=JobArguments.of(row["arguments"]),
            table_names={key: tuple(parts) for key, parts in json_value(row["tables"]).items()},
            num_models=row["num_models"], num_segments=row["num_segments"],
            validation_partitions=row["validation_partitions"], seed=row["seed"],
            subepochs_total=row["subepochs_total"], subepochs_done=row["subepochs_done"],
            coordinator_pid=row["coordinator_pid"], last_error=row["last_error"],
            model_failures=json_value(row["model_failures"]) if row["model_failures"] is not None else None)

    @property
    def finished(self) -> bool:
        return self.state is JobState.FINISHED
