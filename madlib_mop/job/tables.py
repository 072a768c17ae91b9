"""A job's tables, declared once: their names beside the output table, their columns, and
the statements that create and fill them.

Per-job tables, next to the output table:
    <out>_mop_models   the configurations as the job started (mst_key, architecture, params)
    <out>_mop_state    durable model states (mst_key, step, piece, state): step = sub-epochs
                       completed; a state in pieces of at most 4 MB (`job.state_store`)
    <out>_mop_visits   every finished sub-epoch: segment, rows, loss/metrics, timings
    <out>_mop_evals    every finished validation pass over one validation partition
    <out>_mop_weights  the weights of models too big for one value of `<out>`.model_weights,
                       in pieces; made when a model needs it (`job.outputs.store_weights`)

MADlib's outputs (`<out>`, `<out>_summary`, `<out>_info`) are declared by `job.outputs`.
The `jobs` row names every table as a [schema, table] pair (never SQL text); `identifiers`
turns them into `psycopg.sql.Identifier`s.
"""

from __future__ import annotations

from dataclasses import dataclass

import psycopg
from psycopg import sql

from madlib_mop.job.state_store import StateTable, psycopg_executor


@dataclass(frozen=True)
class JobTable:
    key: str  # how the jobs row names it
    columns: tuple[tuple[str, str], ...]  # (name, type)
    primary_key: tuple[str, ...]
    external: str | None = None  # a bytea column stored uncompressed (states are not compressible)

    @property
    def column_names(self) -> tuple[str, ...]:
        return tuple(name for name, _ in self.columns)

    def create(self, db: psycopg.Connection, table: sql.Identifier) -> None:
        db.execute(sql.SQL("CREATE TABLE {} ({}, PRIMARY KEY ({}))").format(
            table, sql.SQL(", ").join(sql.SQL("{} " + kind).format(sql.Identifier(name))
                                      for name, kind in self.columns),
            sql.SQL(", ").join(map(sql.Identifier, self.primary_key))))
        if self.external:
            db.execute(sql.SQL("ALTER TABLE {} ALTER COLUMN {} SET STORAGE EXTERNAL").format(
                table, sql.Identifier(self.external)))

    def insert(self, table: sql.Identifier, conflict: bool = False) -> sql.Composed:
        """INSERT of one row with every column (ON CONFLICT on the key: DO NOTHING, so that
        a record written twice, by a retried commit, counts once)."""
        return sql.SQL("INSERT INTO {} ({}) VALUES ({})" + (" ON CONFLICT ({}) DO NOTHING" if conflict else "")).format(
            table, sql.SQL(", ").join(map(sql.Identifier, self.column_names)),
            sql.SQL(", ").join(sql.Placeholder() * len(self.columns)),
            sql.SQL(", ").join(map(sql.Identifier, self.primary_key)))


MODELS = JobTable("models", (("mst_key", "integer"), ("model_id", "integer"), ("model_arch", "json"),
                             ("compile_params", "text"), ("fit_params", "text"),
                             ("initial_weights", "bytea")), ("mst_key",))
STATE = JobTable("state", (("mst_key", "integer"), ("step", "integer"), ("piece", "integer"),
                           ("state", "bytea NOT NULL")),
                 ("mst_key", "step", "piece"), external="state")
VISITS = JobTable("visits", (("mst_key", "integer"), ("step", "integer"), ("segment", "integer"),
                             ("result", "jsonb NOT NULL")), ("mst_key", "step"))
EVALS = JobTable("evals", (("mst_key", "integer"), ("step", "integer"), ("partition", "integer"),
                           ("result", "jsonb NOT NULL")), ("mst_key", "step", "partition"))
JOB_TABLES = (MODELS, STATE, VISITS, EVALS)
# Made when a model's weights first need it (`job.outputs.store_weights`), not with the job.
WEIGHTS = JobTable("weights", (("mst_key", "integer"), ("piece", "integer"),
                               ("model_weights", "bytea NOT NULL")),
                   ("mst_key", "piece"), external="model_weights")

# Every table of a job, by key: the suffix its name adds to the output table's.
TABLE_SUFFIXES = {"output": "", "summary": "_summary", "info": "_info",
                  **{t.key: f"_mop_{t.key}" for t in JOB_TABLES + (WEIGHTS,)}}
# Longest first: a name checked against them is refused for the longest, whose limit is the one
# its HINT then gives.
SUFFIXES_LONGEST_FIRST = sorted(TABLE_SUFFIXES.values(), key=len, reverse=True)


def names(schema: str, output: str) -> dict[str, list[str]]:
    """The job's tables as [schema, table] (how the jobs row records them)."""
    return {key: [schema, output + suffix] for key, suffix in TABLE_SUFFIXES.items()}


def identifiers(tables: dict) -> dict[str, sql.Identifier]:
    """The jobs row's {key: [schema, table]} as identifiers (a job of 0.8.x or earlier
    names no weights table: it is the output's sibling all the same)."""
    if "output" in tables and "weights" not in tables:
        schema, output = tables["output"]
        tables = {**tables, "weights": [schema, output + TABLE_SUFFIXES["weights"]]}
    return {key: sql.Identifier(*parts) for key, parts in tables.items()}


def create(db: psycopg.Connection, tables: dict[str, sql.Identifier]) -> None:
    for table in JOB_TABLES:
        table.create(db, tables[table.key])


def drop(db: psycopg.Connection, tables) -> None:
    for table in tables:
        db.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(table))


def add_model(db: psycopg.Connection, tables: dict[str, sql.Identifier], entry: dict,
              state: bytes) -> None:
    """A model's configuration and its initial state (step 0).  `entry`: mst_key, model_id,
    model_arch, compile_params, fit_params, weights."""
    db.execute(MODELS.insert(tables["models"]),
               (entry["mst_key"], entry["model_id"], entry["model_arch"], entry["compile_params"],
                entry["fit_params"], entry["weights"]))
    # A new job's table, or one its coordinator brought up to date (`state_table`).
    StateTable(psycopg_executor(db), tables["state"].as_string(db)).write(entry["mst_key"], 0, state)


def state_table(db: psycopg.Connection, table: sql.Identifier) -> StateTable:
    """The job's durable states.  A state table of a job made by version 0.8.0 or earlier
    (one piece per state, no piece column) gets its column here."""
    has_piece = db.execute("SELECT 1 FROM pg_catalog.pg_attribute WHERE attrelid = %s::regclass "
                           "AND attname = 'piece' AND NOT attisdropped",
                           (table.as_string(db),)).fetchone()
    if not has_piece:
        key = db.execute("SELECT conname FROM pg_catalog.pg_constraint WHERE conrelid = %s::regclass "
                         "AND contype = 'p'", (table.as_string(db),)).fetchone()[0]
        db.execute(sql.SQL("ALTER TABLE {} ADD COLUMN piece integer NOT NULL DEFAULT 0, "
                           "DROP CONSTRAINT {}, ADD PRIMARY KEY (mst_key, step, piece)")
                   .format(table, sql.Identifier(key)))
    return StateTable(psycopg_executor(db), table.as_string(db))
