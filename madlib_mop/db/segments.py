"""Segment servers: PostgreSQL servers that hold segments of packed tables.

A segment server is a `postgres_fdw` foreign server (its host, port and database are the
server's options, set by whoever created it) registered in the extension's table
`segment_servers` (by a DBA: only the extension's owner may write it), with a number of
segments.  The registered servers, in registration order, hold segments 0, 1, ... of every
packed table made while they are registered: server i holds the segments after those of
servers 0 .. i-1.

Where a packed table's segments are is read from PostgreSQL's catalogs alone: the table is
partitioned by `__dist_key__`; a partition is either a table of this server or a foreign
table on a registered segment server (`placement`).

Worker sessions on a segment server run as the calling role: the user mapping of the
current role (or PUBLIC) must name that role as its `user` (postgres_fdw, which carries the
packed rows there, logs in as that user) and gives its password; host, port and database
come from the foreign server.  Nothing a user can set changes them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from psycopg.conninfo import make_conninfo

from madlib_mop import errors
from madlib_mop.db import catalog
from madlib_mop.errors import MadlibMopError

# Options of a foreign server that say where and how to connect (libpq parameters).
SERVER_PARAMETERS = ("host", "hostaddr", "port", "dbname", "sslmode", "sslrootcert",
                     "sslcrl", "connect_timeout", "keepalives", "keepalives_idle",
                     "keepalives_interval", "keepalives_count", "tcp_user_timeout")
# Unless madlib_mop.worker_conninfo says otherwise: give up connecting after 10 s, find a
# silent server within about 25 s by TCP keepalives while a call runs, and within 30 s when
# what was sent is not acknowledged.
NETWORK_DEFAULTS = {"connect_timeout": "10", "keepalives": "1", "keepalives_idle": "10",
                    "keepalives_interval": "5", "keepalives_count": "3",
                    "tcp_user_timeout": "30000"}
# Options of a user mapping a worker session uses (postgres_fdw's own names).
MAPPING_PARAMETERS = ("password", "sslcert", "sslkey")


@dataclass(frozen=True)
class SegmentServer:
    name: str  # the foreign server's name
    segments: int
    first_segment: int
    options: dict  # the foreign server's options

    @property
    def address(self) -> str:
        host = self.options.get("host") or self.options.get("hostaddr") or "localhost"
        return f"{host}:{self.options.get('port', '5432')}"

    @property
    def label(self) -> str:
        """How messages name it: segment server seg0 (10.0.0.5:5432)."""
        return f"segment server {self.name} ({self.address})"


@dataclass(frozen=True)
class Partition:
    segment: int
    server: SegmentServer | None  # None: a table of this server
    schema: str  # where the segment's rows are, on its server
    table: str

    @property
    def quoted(self) -> str:
        return f"{_quote(self.schema)}.{_quote(self.table)}"


def _quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _options(items: list[str] | None) -> dict:
    return dict(item.split("=", 1) for item in (items or []))


def registered(plpy: Any) -> list[SegmentServer]:
    """The registered segment servers, in segment order ([] on one server)."""
    schema = catalog.extension_schema(plpy)
    rows = plpy.execute(
        f"SELECT r.server_name, r.segments, s.srvoptions FROM {schema}.segment_servers r "
        "LEFT JOIN pg_catalog.pg_foreign_server s ON s.srvname = r.server_name "
        "ORDER BY r.position")
    servers, first = [], 0
    for row in rows:
        servers.append(SegmentServer(row["server_name"], row["segments"], first,
                                     _options(row["srvoptions"])))
        first += row["segments"]
    return servers


def server_of(servers: list[SegmentServer], segment: int) -> SegmentServer:
    for server in servers:
        if server.first_segment <= segment < server.first_segment + server.segments:
            return server
    raise IndexError(segment)


_PARTITIONS = """
    SELECT pg_catalog.pg_get_expr(c.relpartbound, c.oid) AS bound, c.relkind AS kind,
           n.nspname AS schema, c.relname AS name, s.srvname AS server, ft.ftoptions AS options
    FROM pg_catalog.pg_inherits i
    JOIN pg_catalog.pg_class c ON c.oid = i.inhrelid
    JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
    LEFT JOIN pg_catalog.pg_foreign_table ft ON ft.ftrelid = c.oid
    LEFT JOIN pg_catalog.pg_foreign_server s ON s.oid = ft.ftserver
    WHERE i.inhparent = $1
"""
_BOUND = re.compile(r"^FOR VALUES IN \((\d+)\)$")


def placement(plpy: Any, table: catalog.Table, servers: list[SegmentServer] | None = None
              ) -> dict[int, Partition] | None:
    """Segment -> where its rows are, for a packed table whose partitions are foreign tables
    on segment servers; None for a packed table of this server alone."""
    rows = plpy.execute(plpy.prepare(_PARTITIONS, ["oid"]), [table.oid])
    if not any(row["kind"] == "f" for row in rows):
        return None
    by_name = {s.name: s for s in (servers if servers is not None else registered(plpy))}
    found: dict[int, Partition] = {}
    for row in rows:
        match = _BOUND.match(row["bound"] or "")
        if match is None:
            continue
        segment = int(match.group(1))
        if row["kind"] != "f":
            found[segment] = Partition(segment, None, row["schema"], row["name"])
            continue
        if row["server"] not in by_name:
            raise MadlibMopError(
                f"segment {segment} of {table.name} is on foreign server {row['server']}, "
                "which is not a registered segment server",
                sqlstate=errors.INSUFFICIENT_PRIVILEGE,
                detail="Workers run only on the servers a DBA registered.",
                hint=f"SELECT * FROM {catalog.extension_schema(plpy)}.segment_servers; lists "
                     "them; a DBA adds one with add_segment_server().")
        options = _options(row["options"])
        found[segment] = Partition(segment, by_name[row["server"]],
                                   options.get("schema_name", row["schema"]),
                                   options.get("table_name", row["name"]))
    return found


def worker_conninfo(plpy: Any, server: SegmentServer, extra: dict[str, str],
                    options: str) -> str:
    """How a worker session reaches `server`: its foreign server's options, the current role,
    and that role's user mapping's password."""
    rows = plpy.execute(plpy.prepare(
        "SELECT m.umoptions, m.usename FROM pg_catalog.pg_user_mappings m "
        "WHERE m.srvname = $1 AND m.usename IN (current_user, 'public') "
        "ORDER BY m.usename = 'public'", ["name"]), [server.name])
    role = plpy.execute("SELECT current_user AS r")[0]["r"]
    if not rows:
        raise MadlibMopError(
            f"role {role} has no user mapping for {server.label}",
            sqlstate=errors.INVALID_AUTHORIZATION,
            hint=f"A DBA runs CREATE USER MAPPING FOR {role} SERVER {server.name} "
                 f"OPTIONS (user '{role}', password '...'), with the role's password on "
                 f"{server.name}.")
    mapping = _options(rows[0]["umoptions"])
    if "user" not in mapping:  # postgres_fdw would log in as the server's OS user
        raise MadlibMopError(
            f"the user mapping of role {role} for {server.label} names no user",
            sqlstate=errors.INVALID_AUTHORIZATION,
            detail="Without one, postgres_fdw logs in as the server's OS user.",
            hint=f"ALTER USER MAPPING FOR {role} SERVER {server.name} OPTIONS (ADD user '{role}');")
    if mapping["user"] != role:
        raise MadlibMopError(
            f"the user mapping of role {role} for {server.label} names role {mapping['user']}",
            sqlstate=errors.INSUFFICIENT_PRIVILEGE,
            detail="Worker sessions run as the calling role on every server.",
            hint=f"ALTER USER MAPPING FOR {role} SERVER {server.name} OPTIONS (SET user '{role}'), "
                 "with that role's password there.")
    where = {k: v for k, v in server.options.items() if k in SERVER_PARAMETERS}
    where.setdefault("dbname", plpy.execute("SELECT current_database() AS d")[0]["d"])
    secret = {k: v for k, v in mapping.items() if k in MAPPING_PARAMETERS}
    # A server that stops answering (stopped, cut off) must fail a call, not hang it: the
    # coordinator then waits for it (job.coordinator.RetryPolicy).
    extra = {**NETWORK_DEFAULTS, **extra}
    # Identity last: neither the extra parameters nor the server's options name the role.
    return make_conninfo("", **extra, **where, **secret, user=role, options=options)


def refused_hint(server: SegmentServer, role: str) -> str:
    return (f"{server.name} refused role {role}: the role must exist there with the password "
            f"of its user mapping (ALTER USER MAPPING FOR {role} SERVER {server.name} "
            "OPTIONS (SET password '...')), and that server's pg_hba.conf must let it in.")


def session(plpy: Any, server: SegmentServer):
    """A session on `server` as the calling role (for the preprocessor's DDL there)."""
    from madlib_mop.db import worker_session

    extra, options = worker_session.session_settings(plpy)
    info = worker_conninfo(plpy, server, extra, options)
    role = plpy.execute("SELECT current_user AS r")[0]["r"]
    try:
        return worker_session.connect(info, refused_hint=refused_hint(server, role))
    except MadlibMopError:
        raise
    except Exception as error:
        raise unreachable(server, error) from None


def unreachable(server: SegmentServer, error: BaseException) -> MadlibMopError:
    text = str(error).strip()
    return MadlibMopError(
        f"{server.label} is not reachable: {text.splitlines()[0] if text else type(error).__name__}",
        sqlstate=errors.CONNECTION_FAILURE,
        hint="Start it, or check the network; SELECT * FROM check_segment_servers(); shows "
             "what each segment server answers.")


_LEAVES = """
    SELECT c.relkind AS kind, s.srvname AS server, ft.ftoptions AS options,
           n.nspname AS schema, c.relname AS name
    FROM pg_catalog.pg_partition_tree($1) t
    JOIN pg_catalog.pg_class c ON c.oid = t.relid
    JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
    LEFT JOIN pg_catalog.pg_foreign_table ft ON ft.ftrelid = c.oid
    LEFT JOIN pg_catalog.pg_foreign_server s ON s.oid = ft.ftserver
    WHERE t.isleaf
"""


def source_parts(plpy: Any, table: catalog.Table) -> dict[str, tuple[SegmentServer, list[str]]] | None:
    """A table whose rows all lie on registered segment servers (a foreign table there, or
    a partitioned table whose every partition is one): server name -> (server, the quoted
    names of its tables there).  None when any row is elsewhere."""
    if table.kind not in ("p", "f"):
        return None
    by_name = {s.name: s for s in registered(plpy)}
    parts: dict[str, tuple[SegmentServer, list[str]]] = {}
    for row in plpy.execute(plpy.prepare(_LEAVES, ["regclass"]), [table.oid]):
        if row["kind"] != "f" or row["server"] not in by_name:
            return None
        options = _options(row["options"])
        name = (f"{_quote(options.get('schema_name', row['schema']))}."
                f"{_quote(options.get('table_name', row['name']))}")
        parts.setdefault(row["server"], (by_name[row["server"]], []))[1].append(name)
    return parts or None
