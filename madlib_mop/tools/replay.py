"""Replay: train one model of a finished job again, in plain Keras, in this process.

It reads the job's recorded visits (which segment, in which order), the model's initial
state and the packed data, and runs the same sub-epochs one after another with no
database in between.  The result equals the weights the job stored (up to float rounding
of a different thread count), which shows that model hopping is plain sequential SGD over
a permuted order of the partitions.

    python -m madlib_mop.tools.replay iris_model 1        # prints the largest difference
"""

from __future__ import annotations

import argparse
import sys

import numpy as np
import psycopg
from psycopg.rows import dict_row, tuple_row
from psycopg.sql import SQL, Identifier

from madlib_mop.db import packed
from madlib_mop.errors import MadlibMopError
from madlib_mop.job import outputs, repository, tables as job_tables
from madlib_mop.job.record import JobArguments, JobRecord
from madlib_mop.job.tables import identifiers
from madlib_mop.runtime import training
from madlib_mop.runtime.custom_functions import CustomFunctions, digest, unpickle
from madlib_mop.runtime.buffers import Buffer, PackedColumns, in_memory
from madlib_mop.tools.embedded import configured_dsn


def _job(conn: psycopg.Connection, model_output_table: str) -> JobRecord:
    job = repository.own_job_writing(conn, model_output_table)
    if job is None:
        raise LookupError(f"no madlib_mop job of yours wrote {model_output_table}")
    return job


def _segment_buffers(conn: psycopg.Connection, summary: dict, segment: int,
                     segments: int) -> list[Buffer]:
    x, y = packed.packed_columns(summary)
    # A table packed by MADlib (no label_kind in its summary) has no segment column: buffer
    # b is on segment b % S, S the job's segments.
    modulus = None if "label_kind" in summary else segments
    columns = PackedColumns(x, y, summary.get("label_kind", "classification") == "classification",
                            modulus)
    select = columns.select_list(lambda name: psycopg.sql.Identifier(name).as_string(conn))
    rows = conn.execute(f"SELECT {select} FROM {summary['packed_table']} "  # quoted by the server
                        f"WHERE {columns.in_partition('%s')} ORDER BY buffer_id",
                        (segment,)).fetchall()
    return in_memory(rows, columns)


def replay(conn: psycopg.Connection, model_output_table: str, mst_key: int) -> np.ndarray:
    """The model's weights after replaying its recorded visits (float32, get_weights order)."""
    job = _job(conn, model_output_table)
    if job.arguments.packed_rows:  # rows appended since: the visits would read other data
        packed.check_not_grown(conn, job.job_id, {"source_table": job.source_table,
                                                  "validation_table": job.validation_table},
                               job.arguments.packed_rows)
    conn.row_factory = dict_row
    tables = identifiers(job.table_names)
    spec_row = conn.execute(SQL("SELECT * FROM {} WHERE mst_key = %s").format(tables["models"]),
                            (mst_key,)).fetchone()
    if spec_row is None:
        raise LookupError(f"mst_key {mst_key} is not a model of {model_output_table}")
    spec = training.ModelSpec(mst_key, _json_text(spec_row["model_arch"]), spec_row["compile_params"],
                              spec_row["fit_params"], spec_row["initial_weights"],
                              _custom_functions(conn, job.arguments))
    summary_name = conn.execute(
        "SELECT format('%%I.%%I', n.nspname, c.relname || '_summary') AS s FROM pg_class c "
        "JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.oid = to_regclass(%s)",
        (job.source_table,)).fetchone()["s"]
    summary = conn.execute(f"SELECT * FROM {summary_name}").fetchone()  # quoted by format()
    summary["packed_table"] = job.source_table
    initial = job_tables.state_table(conn, tables["state"]).read(mst_key, 0)
    visits = conn.execute(SQL("SELECT step, segment FROM {} WHERE mst_key = %s ORDER BY step")
                          .format(tables["visits"]), (mst_key,)).fetchall()
    classification = summary.get("label_kind", "classification") == "classification"
    program = training.Program.for_spec(spec)
    program.restore(bytes(initial))
    buffers: dict[int, list[Buffer]] = {}
    for visit in visits:
        segment = visit["segment"]
        if segment not in buffers:
            buffers[segment] = _segment_buffers(conn, summary, segment, job.num_segments)
        training.train_subepoch(program, spec, buffers[segment], job.seed, visit["step"],
                                classification)
    return np.concatenate([w.ravel() for w in program.model.get_weights()]).astype(np.float32)


def _custom_functions(conn: psycopg.Connection, arguments: JobArguments) -> CustomFunctions | None:
    """The job's custom functions, the bytes it recorded (by digest), loaded in this process
    (the caller's own Python: replaying runs the job's loss and metrics here)."""

    recorded = arguments.custom_functions
    if not recorded:
        return None
    table = Identifier(*recorded["table"])
    rows = {r["name"]: r["object"] for r in conn.execute(
        SQL("SELECT name, object FROM {} WHERE name = ANY(%s)").format(table), (list(recorded["digests"]),))}
    objects = {}
    for name, expected in recorded["digests"].items():
        if name not in rows or digest(rows[name]) != expected:
            raise LookupError(f"custom function {name!r} of {'.'.join(recorded['table'])} is gone "
                              "or changed since the job ran")
        objects[name] = unpickle(name, rows[name], ".".join(recorded["table"]))
    return CustomFunctions(".".join(recorded["table"]), dict(recorded["digests"]), objects)


def _json_text(value) -> str:
    import json

    return value if isinstance(value, str) else json.dumps(value)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Replay one model of a madlib_mop job in plain Keras.")
    parser.add_argument("model_output_table")
    parser.add_argument("mst_key", type=int)
    args = parser.parse_args(argv)
    with psycopg.connect(configured_dsn()) as conn:
        try:
            replayed = replay(conn, args.model_output_table, args.mst_key)
        except (LookupError, MadlibMopError) as error:
            print(f"replay: {error}" + (f"\nHINT: {error.hint}" if getattr(error, "hint", None) else ""),
                  file=sys.stderr)
            return 1
        tables = identifiers(_job(conn, args.model_output_table).table_names)
        conn.row_factory = tuple_row
        stored = outputs.read_weights(conn, tables, args.mst_key)
    stored = np.frombuffer(stored, dtype=np.float32)
    print(f"{replayed.size} weights; largest difference from the job's: "
          f"{float(np.max(np.abs(replayed - stored))):.3g}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
