"""The packed table and its summary: how many segments, on which servers, and the DDL
that makes the table's partitions (tables of this server, or foreign tables whose rows are
stored on segment servers, made there in a session of the calling role)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import psycopg

from madlib_mop import errors
from madlib_mop.db import catalog, segments, settings
from madlib_mop.errors import MadlibMopError
from madlib_mop.preprocess.buffers import Packed


SEGMENTS_SETTING = settings.SEGMENTS


def segment_count(plpy: Any, distribution_rules: str | None) -> int:
    """S from distribution_rules: NULL/'all_segments' -> the setting madlib_mop.segments,
    else the server's CPU count; a positive number of segments; or (MADlib's form) a table
    listing the segments to use, one row each."""
    rules = (distribution_rules or "all_segments").strip().lower()
    # A job opens a session per segment: a quarter of the server's connections at most, so
    # that one role's job cannot take every connection slot of the server.
    limit = settings.worker_session_limit(plpy)
    listed = segments_table(plpy, distribution_rules)
    if rules == "all_segments":
        wanted = settings.whole_number(plpy, SEGMENTS_SETTING)
        if wanted is None:
            return min(os.cpu_count() or 1, limit)
    elif rules.isdigit() and int(rules) >= 1:
        wanted = int(rules)
    elif listed is not None:
        wanted = len(listed.rows)
        plpy.notice(f"madlib_mop: distribution_rules {listed.table.name} lists {wanted} "
                    f"segment(s); on one PostgreSQL server that is {wanted} segment(s) of this "
                    "server, each served by a worker session")
    else:
        wanted = None
    if wanted is not None:
        if wanted > limit:
            raise MadlibMopError(
                f"{wanted} segments are more than this server serves ({limit})",
                sqlstate=errors.INVALID_PARAMETER_VALUE,
                detail="A job opens one worker session per segment; a server takes at most a "
                       "quarter of max_connections.",
                hint=f"Use at most {limit} segments (or raise max_connections).")
        return wanted
    if rules == "gpu_segments":
        raise MadlibMopError("distribution_rules 'gpu_segments' is not supported",
                             sqlstate=errors.FEATURE_NOT_SUPPORTED,
                             hint="Use 'all_segments' or a number of segments, e.g. '4'.")
    raise MadlibMopError(f"distribution_rules '{distribution_rules}' is not understood",
                         sqlstate=errors.INVALID_PARAMETER_VALUE,
                         hint="Use NULL or 'all_segments' (one segment per CPU, or the setting "
                              f"{SEGMENTS_SETTING}), a number of segments such as '4', or the "
                              "name of a table listing the segments to use, one row each.")


@dataclass
class SegmentsTable:
    """A table that distribution_rules names: the segments to use, a row each.  MADlib's
    has a dbid column (from gp_segment_configuration); on several servers a row names its
    segment server by a server_name or hostname column."""
    table: catalog.Table
    rows: list[dict]

    def servers(self, registered: list[segments.SegmentServer]) -> list[segments.SegmentServer]:
        """The registered segment servers the rows name, in registration order."""
        names = {str(row["server_name"]) for row in self.rows if row.get("server_name")}
        hosts = {str(row["hostname"]) for row in self.rows if row.get("hostname")}
        if not names and not hosts:
            raise MadlibMopError(
                f"distribution_rules {self.table.name} does not say which segment servers to use",
                sqlstate=errors.INVALID_PARAMETER_VALUE,
                detail="With segment servers, a row names its server by a server_name or "
                       "hostname column; dbid numbers Greenplum's segments, which are not these.",
                hint="Add a server_name column with names from check_segment_servers().")
        chosen = [server for server in registered if server.name in names
                  or server.options.get("host") in hosts or server.options.get("hostaddr") in hosts]
        if not chosen:
            raise MadlibMopError(
                f"distribution_rules {self.table.name} names no registered segment server",
                sqlstate=errors.INVALID_PARAMETER_VALUE,
                detail="Registered: " + ", ".join(server.label for server in registered) + ".",
                hint="Name servers as check_segment_servers() lists them.")
        return chosen


def segments_table(plpy: Any, distribution_rules: str | None) -> SegmentsTable | None:
    """The table distribution_rules names, read; None when it is a keyword or a number."""
    rules = (distribution_rules or "all_segments").strip()
    if rules.lower() in ("all_segments", "gpu_segments") or rules.isdigit():
        return None
    oid = catalog.resolve_name(plpy, rules)
    if oid is None:
        return None
    table = catalog.resolve_table(plpy, oid, argument="distribution_rules")
    wanted = [name for name in ("dbid", "server_name", "hostname") if name in catalog.columns(plpy, table)]
    if not wanted:
        raise MadlibMopError(
            f"distribution_rules {table.name} has none of the columns dbid, server_name, hostname",
            sqlstate=errors.INVALID_PARAMETER_VALUE,
            hint="Give it MADlib's dbid column (a row per segment), or server_name.")
    rows = [dict(row) for row in plpy.execute(
        f"SELECT DISTINCT {', '.join(plpy.quote_ident(n) for n in wanted)} FROM {table.name}")]
    if not rows:
        raise MadlibMopError(f"distribution_rules {table.name} lists no segments",
                             sqlstate=errors.INVALID_PARAMETER_VALUE,
                             hint="Insert a row per segment to use, or pass 'all_segments'.")
    return SegmentsTable(table, rows)


def segment_homes(plpy: Any, distribution_rules: str | None, training: dict | None
                  ) -> list[segments.SegmentServer] | None:
    """The segment server of each segment of a new packed table, or None (this server).
    Training data: 'all_segments' spreads it over every registered segment server, a table
    of segments over the servers it names.
    Validation data: partition p goes where the training data's segment p % S is, so that
    the worker of that segment evaluates it where it lies."""
    if training is None:
        listed = segments_table(plpy, distribution_rules)
        if listed is None and (distribution_rules or "all_segments").strip().lower() != "all_segments":
            return None
        servers = segments.registered(plpy)
        if not servers:
            return None
        if listed is not None:
            servers = listed.servers(servers)
        return [server for server in servers for _ in range(server.segments)]
    placed = segments.placement(plpy, catalog.resolve_table(plpy, training["packed_oid"]))
    if placed is None:
        return None
    count = (segment_count(plpy, distribution_rules) if distribution_rules is not None
             else int(training["num_segments"]))
    return [placed[k % len(placed)].server for k in range(count)]


class PackedOutput:
    """The packed table: partitioned by segment; a partition is a table of this server, or a
    foreign table whose rows are stored on the segment's segment server (`homes`)."""

    def __init__(self, plpy: Any, out: catalog.NewTable, feature_columns: list[str],
                 label_columns: list[str], homes: list[segments.SegmentServer] | None):
        self.plpy, self.out, self.homes = plpy, out, homes
        q = plpy.quote_ident
        # A feature column per input of the model, a label column per output.
        self.xs = [q(name) for name in feature_columns]
        self.ys = [q(name) for name in label_columns]
        self.shapes = [q(name + "_shape") for name in [*feature_columns, *label_columns]]
        self.remote: list[tuple[Any, str]] = []  # (server, table) made on segment servers
        self.partition_names: dict[int, list[str]] = {}  # segment -> [schema, table] there
        self.sessions: dict[str, Any] = {}

    def _columns(self) -> str:
        return ", ".join(["__dist_key__ integer NOT NULL"]
                         + [f"{c} bytea NOT NULL" for c in self.xs + self.ys]
                         + [f"{c} integer[] NOT NULL" for c in self.shapes]
                         + ["buffer_id integer NOT NULL"])

    def insert_sql(self, table: str) -> tuple[str, list[str]]:
        """An INSERT of one buffer into `table`, in the order `write_buffers` gives its
        values, and the values' types."""
        columns = self.xs + self.ys + self.shapes + ["buffer_id", "__dist_key__"]
        types = (["bytea"] * len(self.xs + self.ys) + ["integer[]"] * len(self.shapes)
                 + ["integer", "integer"])
        return (f"INSERT INTO {table} ({', '.join(columns)}) VALUES "
                f"({', '.join(f'${i + 1}' for i in range(len(columns)))})", types)

    def _store_out_of_line(self, table: str, execute) -> None:
        """Float bytes do not compress: store them out of line without trying."""
        for column in self.xs:
            execute(f"ALTER TABLE {table} ALTER COLUMN {column} SET STORAGE EXTERNAL")

    def create(self, count: int):
        """Create the table and its partitions; the INSERT plan its buffers go through."""
        plpy, out = self.plpy, self.out
        # Foreign partitions take no index: the key is kept on each segment server.
        key = ", PRIMARY KEY (__dist_key__, buffer_id)" if self.homes is None else ""
        plpy.execute(f"CREATE TABLE {out.quoted} ({self._columns()}{key}) "
                     "PARTITION BY LIST (__dist_key__)")
        try:
            for segment in range(count):
                self._create_partition(segment)
        finally:
            for session in self.sessions.values():
                session.close()
            self.sessions.clear()
        return plpy.prepare(*self.insert_sql(out.quoted))

    def _create_partition(self, segment: int) -> None:
        plpy, out = self.plpy, self.out
        part = out.sibling(f"_seg{segment}", plpy)
        part.must_not_exist(plpy)
        if self.homes is None:
            plpy.execute(f"CREATE TABLE {part.quoted} PARTITION OF {out.quoted} "
                         f"FOR VALUES IN ({segment})")
            self._store_out_of_line(part.quoted, plpy.execute)
            return
        server = self.homes[segment]
        self._create_remote(server, part, segment)
        self.partition_names[segment] = [part.schema, part.name]
        plpy.execute(
            f"CREATE FOREIGN TABLE {part.quoted} PARTITION OF {out.quoted} "
            f"FOR VALUES IN ({segment}) SERVER {plpy.quote_ident(server.name)} "
            f"OPTIONS (schema_name {plpy.quote_literal(part.schema)}, "
            f"table_name {plpy.quote_literal(part.name)})")

    def _marker(self, segment: int) -> str:
        """What the segment's table there says it is: which coordinator's which packed table."""
        row = self.plpy.execute(
            f"SELECT id::text AS id, current_database() AS db "
            f"FROM {catalog.extension_schema(self.plpy)}.coordinator_id")[0]
        return (f"madlib_mop: segment {segment} of {self.out.quoted} of database {row['db']} "
                f"of coordinator {row['id']}")

    def _used_here(self, server: segments.SegmentServer, part: catalog.NewTable) -> bool:
        """A foreign table of this database points at that table of the server."""
        return bool(self.plpy.execute(self.plpy.prepare(
            "SELECT 1 FROM pg_catalog.pg_foreign_table ft "
            "JOIN pg_catalog.pg_foreign_server s ON s.oid = ft.ftserver "
            "WHERE s.srvname = $1 AND ft.ftoptions @> ARRAY['schema_name=' || $2, "
            "'table_name=' || $3]", ["name", "text", "text"]),
            [server.name, part.schema, part.name]))

    def _create_remote(self, server: segments.SegmentServer, part: catalog.NewTable,
                       segment: int) -> None:
        """The segment's table on its server, made in a session of the calling role there.
        A table of the same name left by an earlier packing into this name of this
        coordinator (its packed table since dropped, or its transaction rolled back) is
        replaced; any other is left alone."""
        plpy = self.plpy
        if server.name not in self.sessions:
            self.sessions[server.name] = segments.session(plpy, server)
        session = self.sessions[server.name]
        marker = self._marker(segment)
        q_schema = plpy.quote_ident(part.schema)
        try:
            found = session.execute(
                "SELECT c.oid, obj_description(c.oid, 'pg_class') AS note, "
                "(SELECT true FROM pg_namespace WHERE nspname = %s) AS schema_exists "
                "FROM (SELECT to_regclass(%s) AS oid) c", (part.schema, part.quoted)).fetchone()
            if not found[2]:  # the packed table's schema, made there by the same role
                session.execute(f"CREATE SCHEMA IF NOT EXISTS {q_schema}")
            if found[0] is not None:
                if found[1] != marker or self._used_here(server, part):
                    raise MadlibMopError(
                        f"table {part.quoted} already exists on {server.label}",
                        sqlstate=errors.DUPLICATE_TABLE,
                        hint="Drop it there, or pass another output_table.")
                plpy.notice(f"madlib_mop: replacing {part.quoted} on {server.label}, left by an "
                            "earlier packing into this name")
                session.execute(f"DROP TABLE {part.quoted}")
            session.execute(f"CREATE TABLE {part.quoted} ({self._columns()}, "
                            f"CHECK (__dist_key__ = {segment}), PRIMARY KEY (__dist_key__, buffer_id))")
            self._store_out_of_line(part.quoted, session.execute)
            session.execute(f"COMMENT ON TABLE {part.quoted} IS {plpy.quote_literal(marker)}")
        except psycopg.Error as error:
            diag = error.diag
            role = plpy.execute("SELECT current_user AS r")[0]["r"]
            raise MadlibMopError(
                f"{server.label}: could not create {part.quoted}: "
                f"{diag.message_primary or error}", sqlstate=diag.sqlstate or errors.DATA_EXCEPTION,
                hint=f"The role needs to create tables in schema {part.schema} there: GRANT "
                     f"CREATE ON SCHEMA {q_schema} TO {plpy.quote_ident(role)};") from None
        self.remote.append((server, part.quoted))

    def drop_remote(self) -> None:
        """After a failure: the tables made on segment servers go (this server's tables go
        with the transaction).  One this transaction wrote to through postgres_fdw stays
        locked until it ends: it is left (the next packing into this name replaces it)."""
        by_server: dict[str, tuple[segments.SegmentServer, list[str]]] = {}
        for server, table in self.remote:
            by_server.setdefault(server.name, (server, []))[1].append(table)
        for server, tables in by_server.values():
            try:
                with segments.session(self.plpy, server) as session:
                    session.execute("SET lock_timeout = '2s'")
                    for table in tables:
                        try:
                            session.execute(f"DROP TABLE IF EXISTS {table}")
                        except psycopg.Error as error:
                            self.plpy.warning(f"madlib_mop: left {table} on {server.label} "
                                              f"({error.diag.message_primary}); packing into "
                                              "this name again replaces it")
            except Exception as error:  # the failure being raised matters more
                self.plpy.warning(f"madlib_mop: left {', '.join(tables)} on {server.label} "
                                  f"({str(error).strip()}); packing into this name again "
                                  "replaces them")
        self.remote.clear()


def write_summary(plpy, summary_table, source_table, output_table, labels, features, buffer_size,
                  normalizing_const, classes, distribution_rules, segments, rows, packed: Packed,
                  seed):
    """MADlib's summary (a `<label>_class_values` column per label, num_classes per label)
    and madlib_mop's columns (the first input's feature_shape: the packed table's
    `<x>_shape` columns have each input's)."""
    q = plpy.quote_ident
    class_columns, class_types, class_values = [], [], []
    for label, count in zip(labels, classes):
        class_columns.append(q(f"{label.name}_class_values"))
        class_types.append("integer[]" if label.one_hot else f"{label.base_type}[]"
                           if label.classification else "text[]")
        # One-hot label arrays: no class values and no num_classes, as MADlib writes them
        # (the readers take the classes from the arrays' width, `db.packed.read_summary`).
        class_values.append(list(label.class_values) + [None] * (count - len(label.class_values))
                            if label.classification and not label.one_hot else None)
    rows_per_segment = [packed.rows_per_segment.get(k, 0) for k in range(segments)]
    buffers_per_segment = [packed.buffers_per_segment.get(k, 0) for k in range(segments)]
    counts = [None if count is None or label.one_hot else count for label, count in zip(labels, classes)]
    plpy.execute(f"""
        CREATE TABLE {summary_table.quoted} (
            source_table text, output_table text,
            dependent_varname text[], independent_varname text[], dependent_vartype text[],
            {', '.join(f"{c} {t}" for c, t in zip(class_columns, class_types))},
            buffer_size integer, normalizing_const real, num_classes integer[],
            distribution_rules text, __internal_gpu_config__ text,
            num_segments integer, num_rows bigint, rows_per_segment bigint[],
            buffers_per_segment integer[], feature_shape integer[], label_kind text,
            shuffle_seed integer)""")
    n = len(labels)
    plan = plpy.prepare(
        f"INSERT INTO {summary_table.quoted} VALUES ($1, $2, $3, $4, $5, "
        + "".join(f"${6 + i}, " for i in range(n))
        + ", ".join(f"${6 + n + i}" for i in range(3)) + f", ${9 + n}, 'all_segments', "
        + ", ".join(f"${10 + n + i}" for i in range(7)) + ")",
        ["text", "text", "text[]", "text[]", "text[]", *class_types, "integer", "real", "integer[]",
         "text", "integer", "bigint", "bigint[]", "integer[]", "integer[]", "text", "integer"])
    plpy.execute(plan, [
        source_table, output_table, [label.name for label in labels],
        [name for f in features for name in f.names], [label.base_type for label in labels],
        *class_values, int(packed.max_buffer_rows), float(normalizing_const),
        counts if any(c is not None for c in counts) else None,
        (distribution_rules or "all_segments"), segments, rows, rows_per_segment,
        buffers_per_segment, list(packed.feature_shape),
        "classification" if labels[0].classification else "regression", seed])


def write_features_summary(plpy: Any, source: catalog.Table, summary_table: catalog.NewTable,
                           source_table: str, output_table: str, feature_shape: list[int],
                           features_of: str, digest: str) -> None:
    """The summary of a packed table of features computed from the packed table `source`
    (its segments, buffers and labels): the source's summary, with the features' shape, no
    normalizing (the source's was applied before the model saw them), whose features they
    are (`features_of`), the digest of the layers and weights that computed them and the
    source's oid (a source packed again is another table)."""
    source_summary = catalog.sibling_table(plpy, source, "_summary")
    plpy.execute(f"CREATE TABLE {summary_table.quoted} AS SELECT * FROM {source_summary.name}")
    for column, kind in (("features_of", "text"), ("features_digest", "text"), ("features_source_oid", "oid")):
        if column not in catalog.columns(plpy, catalog.resolve_table(plpy, summary_table.quoted)):
            plpy.execute(f"ALTER TABLE {summary_table.quoted} ADD COLUMN {column} {kind}")
    plpy.execute(plpy.prepare(
        f"UPDATE {summary_table.quoted} SET source_table = $1, output_table = $2, feature_shape = $3, "
        "normalizing_const = 1.0, features_of = $4, features_digest = $5, features_source_oid = $6",
        ["text", "text", "integer[]", "text", "text", "oid"]),
        [source_table, output_table, feature_shape, features_of, digest, source.oid])
