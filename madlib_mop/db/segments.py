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

Worker sessions on a segment server run as the calling role: the current role's own user
mapping must name that role as its `user` (postgres_fdw, which carries the packed rows
there, logs in as that user) and give its password, and the server must ask for it; host,
port, database and security options come from the foreign server, which must belong to a
superuser.  Nothing a user can set changes them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from psycopg.conninfo import make_conninfo

from madlib_mop import errors
from madlib_mop.db import catalog
from madlib_mop.errors import MadlibMopError

# Options of a foreign server that say where, and how safely, to connect (libpq parameters):
# set by the server's owner, a superuser (`registered` checks it); no setting overrides them.
SERVER_PARAMETERS = ("host", "hostaddr", "port", "dbname", "sslmode", "sslrootcert", "sslcrl",
                     "sslsni", "ssl_min_protocol_version", "channel_binding", "require_auth",
                     "requirepeer", "gssencmode", "krbsrvname")
# Options of a foreign server that tune the network; madlib_mop.worker_conninfo may too.
NETWORK_PARAMETERS = ("connect_timeout", "keepalives", "keepalives_idle", "keepalives_interval",
                      "keepalives_count", "tcp_user_timeout")
# Unless the server or madlib_mop.worker_conninfo says otherwise: give up connecting after
# 10 s, find a silent server within about 25 s by TCP keepalives while a call runs, and
# within 30 s when what was sent is not acknowledged.
NETWORK_DEFAULTS = {"connect_timeout": "10", "keepalives": "1", "keepalives_idle": "10",
                    "keepalives_interval": "5", "keepalives_count": "3",
                    "tcp_user_timeout": "30000"}


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
    def name(self) -> list[str]:
        """[schema, table]: how a task names it (the receiving side quotes it)."""
        return [self.schema, self.table]


def _options(items: list[str] | None) -> dict:
    return dict(item.split("=", 1) for item in (items or []))


def registered(plpy: Any) -> list[SegmentServer]:
    """The registered segment servers, in segment order ([] on one server).  Each must still
    exist and belong to a superuser: its owner decides where workers connect."""
    schema = catalog.extension_schema(plpy)
    rows = plpy.execute(
        f"SELECT r.server_name, r.segments, s.srvoptions, s.oid IS NOT NULL AS found, "
        "o.rolname AS owner, coalesce(o.rolsuper, false) AS trusted "
        f"FROM {schema}.segment_servers r "
        "LEFT JOIN pg_catalog.pg_foreign_server s ON s.srvname = r.server_name "
        "LEFT JOIN pg_catalog.pg_roles o ON o.oid = s.srvowner ORDER BY r.position")
    servers, first = [], 0
    for row in rows:
        check_server(plpy, row["server_name"], row["found"], row["owner"], row["trusted"])
        servers.append(SegmentServer(row["server_name"], row["segments"], first,
                                     _options(row["srvoptions"])))
        first += row["segments"]
    return servers


def check_server(plpy: Any, name: str, found: bool, owner: str | None, trusted: bool) -> None:
    """A segment server's foreign server exists and belongs to a superuser."""
    schema = catalog.extension_schema(plpy)
    if not found:
        raise MadlibMopError(f"segment server {name} is registered but its foreign server is gone",
                             sqlstate=errors.UNDEFINED_OBJECT,
                             hint=f"Create it again (CREATE SERVER ... FOREIGN DATA WRAPPER "
                                  f"postgres_fdw), or SELECT {schema}.drop_segment_server("
                                  f"{plpy.quote_literal(name)});")
    if not trusted:
        raise MadlibMopError(
            f"foreign server {name} belongs to role {owner}, which is not a superuser",
            sqlstate=errors.INSUFFICIENT_PRIVILEGE,
            detail="Its owner sets where workers connect and may map any role: a segment "
                   "server must be a DBA's.",
            hint=f"A superuser runs ALTER SERVER {plpy.quote_ident(name)} OWNER TO CURRENT_USER;")


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
    and the password of that role's user mapping (its own: a PUBLIC mapping's options are
    the server owner's to read)."""
    role = plpy.execute("SELECT current_user AS r")[0]["r"]
    rows = plpy.execute(plpy.prepare(
        "SELECT m.umoptions FROM pg_catalog.pg_user_mappings m "
        "WHERE m.srvname = $1 AND m.usename = current_user", ["name"]), [server.name])
    q_role, q_server = plpy.quote_ident(role), plpy.quote_ident(server.name)
    if not rows:
        raise MadlibMopError(
            f"role {role} has no user mapping for {server.label}",
            sqlstate=errors.INVALID_AUTHORIZATION,
            hint=f"A DBA runs CREATE USER MAPPING FOR {q_role} SERVER {q_server} "
                 f"OPTIONS (user {plpy.quote_literal(role)}, password '...'), with the role's "
                 f"password on {server.name}.")
    if rows[0]["umoptions"] is None:
        raise MadlibMopError(
            f"role {role} may not read its user mapping for {server.label}",
            sqlstate=errors.INSUFFICIENT_PRIVILEGE,
            hint=f"A DBA runs GRANT USAGE ON FOREIGN SERVER {q_server} TO {q_role};")
    mapping = _options(rows[0]["umoptions"])
    if "user" not in mapping:  # postgres_fdw would log in as the server's OS user
        raise MadlibMopError(
            f"the user mapping of role {role} for {server.label} names no user",
            sqlstate=errors.INVALID_AUTHORIZATION,
            detail="Without one, postgres_fdw logs in as the server's OS user.",
            hint=f"ALTER USER MAPPING FOR {q_role} SERVER {q_server} OPTIONS "
                 f"(ADD user {plpy.quote_literal(role)});")
    if mapping["user"] != role:
        raise MadlibMopError(
            f"the user mapping of role {role} for {server.label} names role {mapping['user']}",
            sqlstate=errors.INSUFFICIENT_PRIVILEGE,
            detail="Worker sessions run as the calling role on every server.",
            hint=f"ALTER USER MAPPING FOR {q_role} SERVER {q_server} OPTIONS "
                 f"(SET user {plpy.quote_literal(role)}), with that role's password there.")
    if not mapping.get("password"):
        raise MadlibMopError(
            f"the user mapping of role {role} for {server.label} has no password",
            sqlstate=errors.INVALID_AUTHORIZATION,
            detail="Worker sessions log in with the role's own password, never with the "
                   "server's OS credentials.",
            hint=f"ALTER USER MAPPING FOR {q_role} SERVER {q_server} OPTIONS (ADD password '...');")
    parameters = {**NETWORK_DEFAULTS,
                  **{k: v for k, v in server.options.items() if k in NETWORK_PARAMETERS},
                  **extra,  # madlib_mop.worker_conninfo: network parameters only
                  **{k: v for k, v in server.options.items() if k in SERVER_PARAMETERS},
                  # Identity last, and no password file or service of the server's OS user.
                  "password": mapping["password"], "passfile": "/dev/null",
                  "user": role, "options": options}
    return make_conninfo("", **parameters)


def peer_conninfo(plpy: Any, name: str) -> tuple[str, SegmentServer]:
    """On a segment server: how its worker reaches another segment server that the
    coordinator names `name`, to fetch a state from it (`segment.kept_states`).  The foreign
    server of that name here (a superuser's, as on the coordinator) and the role's own user
    mapping for it, checked as `worker_conninfo` checks a coordinator's."""
    rows = plpy.execute(plpy.prepare(
        "SELECT s.srvoptions, o.rolname AS owner, o.rolsuper AS trusted "
        "FROM pg_catalog.pg_foreign_server s JOIN pg_catalog.pg_roles o ON o.oid = s.srvowner "
        "WHERE s.srvname = $1", ["name"]), [name])
    check_server(plpy, name, bool(rows), rows[0]["owner"] if rows else None,
                 bool(rows and rows[0]["trusted"]))
    server = SegmentServer(name, 0, 0, _options(rows[0]["srvoptions"]))
    return worker_conninfo(plpy, server, {}, "-c statement_timeout=0 -c jit=off"), server


def refused_hint(server: SegmentServer, role: str) -> str:
    return (f"{server.name} refused role {role}: the role must exist there with the password "
            f"of its user mapping (ALTER USER MAPPING FOR {role} SERVER {server.name} "
            "OPTIONS (SET password '...')), and that server's pg_hba.conf must let it in.")


def session(plpy: Any, server: SegmentServer):
    """A session on `server` as the calling role (for the preprocessor's and predict's work
    there)."""
    from madlib_mop.db import worker_session

    extra, options = worker_session.session_settings(plpy)
    info = worker_conninfo(plpy, server, extra, options)
    role = plpy.execute("SELECT current_user AS r")[0]["r"]
    return connect(info, server, refused_hint(server, role))


def connect(info: str, server: SegmentServer, hint: str, **kwargs: Any):
    """A session on a segment server that logged in with the role's password (a server
    letting the role in without it would not be telling who is connecting)."""
    from madlib_mop.db import worker_session

    try:
        connection = worker_session.connect(info, refused_hint=hint, **kwargs)
    except MadlibMopError:
        raise
    except Exception as error:
        raise unreachable(server, error) from None
    if not connection.pgconn.used_password:
        connection.close()
        raise MadlibMopError(
            f"{server.label} let the role in without asking for its password",
            sqlstate=errors.INVALID_AUTHORIZATION,
            hint="Its pg_hba.conf must ask for a password (scram-sha-256) on the coordinator's "
                 "address.")
    return connection


def unreachable(server: SegmentServer, error: BaseException) -> MadlibMopError:
    text = str(error).strip()
    return MadlibMopError(
        f"{server.label} is not reachable: {text.splitlines()[0] if text else type(error).__name__}",
        sqlstate=errors.CONNECTION_FAILURE,
        hint="Start it, or check the network; SELECT * FROM check_segment_servers(); shows "
             "what each segment server answers.")


_LEAVES = """
    SELECT c.oid, c.relkind AS kind, s.srvname AS server, ft.ftoptions AS options,
           n.nspname AS schema, c.relname AS name
    FROM pg_catalog.pg_partition_tree($1) t
    JOIN pg_catalog.pg_class c ON c.oid = t.relid
    JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
    LEFT JOIN pg_catalog.pg_foreign_table ft ON ft.ftrelid = c.oid
    LEFT JOIN pg_catalog.pg_foreign_server s ON s.oid = ft.ftserver
    WHERE t.isleaf
"""


@dataclass
class SourcePart:
    """The rows of a table that lie on one segment server."""
    server: SegmentServer
    tables: list[list[str]]  # [schema, table] there
    foreign_tables: list[str]  # the foreign tables here that read them (quoted names)

    def rows(self, plpy: Any) -> int:
        """Counted there (postgres_fdw sends count(*) to the server)."""
        return sum(plpy.execute(f"SELECT count(*) AS n FROM {name}")[0]["n"]
                   for name in self.foreign_tables)


def source_parts(plpy: Any, table: catalog.Table) -> dict[str, SourcePart] | None:
    """A table whose rows all lie on registered segment servers (a foreign table there, or
    a partitioned table whose every partition is one): server name -> its part.  None when
    any row is elsewhere."""
    if table.kind not in ("p", "f"):
        return None
    by_name = {s.name: s for s in registered(plpy)}
    parts: dict[str, SourcePart] = {}
    for row in plpy.execute(plpy.prepare(_LEAVES, ["regclass"]), [table.oid]):
        if row["kind"] != "f" or row["server"] not in by_name:
            return None
        options = _options(row["options"])
        part = parts.setdefault(row["server"], SourcePart(by_name[row["server"]], [], []))
        part.tables.append([options.get("schema_name", row["schema"]),
                            options.get("table_name", row["name"])])
        part.foreign_tables.append(f"{plpy.quote_ident(row['schema'])}.{plpy.quote_ident(row['name'])}")
    return parts or None
