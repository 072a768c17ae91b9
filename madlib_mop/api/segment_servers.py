"""add_segment_server, drop_segment_server, check_segment_servers: the DBA's registry of
segment servers (madlib_mop.db.segments)."""

from __future__ import annotations

from typing import Any

from madlib_mop import __version__, errors
from madlib_mop.db import catalog, worker_session
from madlib_mop.db import segments as segment_servers
from madlib_mop.errors import MadlibMopError


def _foreign_server(plpy: Any, name: str) -> dict | None:
    rows = plpy.execute(plpy.prepare(
        "SELECT s.oid, w.fdwname, o.rolname AS owner, o.rolsuper AS trusted "
        "FROM pg_catalog.pg_foreign_server s "
        "JOIN pg_catalog.pg_foreign_data_wrapper w ON w.oid = s.srvfdw "
        "JOIN pg_catalog.pg_roles o ON o.oid = s.srvowner WHERE s.srvname = $1",
        ["name"]), [name])
    return dict(rows[0]) if rows else None


def _may_register(plpy: Any, schema: str) -> None:
    """Registering is a DBA's: the extension's owner (or whom it granted INSERT)."""
    row = plpy.execute(f"SELECT has_table_privilege('{schema}.segment_servers', 'INSERT') AS may, "
                       "current_user AS role")[0]
    if not row["may"]:
        raise MadlibMopError(f"permission denied: role {row['role']} may not register segment "
                             "servers", sqlstate=errors.INSUFFICIENT_PRIVILEGE,
                             hint="A DBA (the extension's owner) registers them.")


def add_segment_server(plpy: Any, server_name: str, host: str | None, port: int | None,
                       dbname: str | None, segments: int | None) -> None:
    schema = catalog.extension_schema(plpy)
    _may_register(plpy, schema)
    if not server_name or not server_name.strip():
        raise MadlibMopError("server_name must name a foreign server",
                             sqlstate=errors.INVALID_PARAMETER_VALUE,
                             hint=f"e.g. SELECT {schema}.add_segment_server('seg1', "
                                  "'10.0.0.5', 5432, 'analytics');")
    count = 1 if segments is None else segments
    if count < 1:
        raise MadlibMopError(f"segments must be at least 1, not {count}",
                             sqlstate=errors.INVALID_PARAMETER_VALUE,
                             hint="Pass how many segments this server holds, e.g. its CPU count.")
    if not plpy.execute("SELECT 1 FROM pg_catalog.pg_extension WHERE extname = 'postgres_fdw'"):
        raise MadlibMopError("segment servers are postgres_fdw foreign servers: postgres_fdw "
                             "is not installed in this database",
                             sqlstate=errors.UNDEFINED_OBJECT,
                             hint="CREATE EXTENSION postgres_fdw;")
    existing = _foreign_server(plpy, server_name)
    if existing is None:
        if host is None:
            raise MadlibMopError(f"foreign server {server_name} does not exist",
                                 sqlstate=errors.UNDEFINED_OBJECT,
                                 hint="Pass its host (and port, dbname) to create it, or "
                                      "CREATE SERVER ... FOREIGN DATA WRAPPER postgres_fdw first.")
        database = dbname or plpy.execute("SELECT current_database() AS d")[0]["d"]
        options = [f"host {plpy.quote_literal(host)}",
                   f"dbname {plpy.quote_literal(database)}"]
        if port is not None:
            options.append(f"port {plpy.quote_literal(str(int(port)))}")
        plpy.execute(f"CREATE SERVER {plpy.quote_ident(server_name)} FOREIGN DATA WRAPPER "
                     f"postgres_fdw OPTIONS ({', '.join(options)})")
    elif existing["fdwname"] != "postgres_fdw":
        raise MadlibMopError(f"foreign server {server_name} uses {existing['fdwname']}, not "
                             "postgres_fdw", sqlstate=errors.INVALID_PARAMETER_VALUE,
                             hint="Segment servers are PostgreSQL servers reached by postgres_fdw.")
    elif not existing["trusted"]:
        segment_servers.check_server(plpy, server_name, True, existing["owner"], False)
    elif host is not None or port is not None or dbname is not None:
        raise MadlibMopError(
            f"foreign server {server_name} exists already: host, port and dbname are its own",
            sqlstate=errors.DUPLICATE_OBJECT,
            hint=f"SELECT {schema}.add_segment_server('{server_name}'); registers it as it is "
                 "(ALTER SERVER changes its options).")
    if plpy.execute(plpy.prepare(f"SELECT 1 FROM {schema}.segment_servers WHERE server_name = $1",
                                 ["name"]), [server_name]):
        raise MadlibMopError(f"{server_name} is a segment server already",
                             sqlstate=errors.DUPLICATE_OBJECT,
                             hint=f"SELECT * FROM {schema}.segment_servers; lists them.")
    plpy.execute(plpy.prepare(
        f"INSERT INTO {schema}.segment_servers (server_name, segments, position) "
        f"SELECT $1, $2, coalesce(max(position), 0) + 1 FROM {schema}.segment_servers",
        ["name", "integer"]), [server_name, count])
    servers = segment_servers.registered(plpy)
    mine = next(s for s in servers if s.name == server_name)
    total = sum(s.segments for s in servers)
    plpy.notice(
        f"madlib_mop: {mine.label} holds segments {mine.first_segment}.."
        f"{mine.first_segment + count - 1}; training_preprocessor_dl now spreads new packed "
        f"tables over {total} segments on {len(servers)} servers. Each role that runs jobs "
        f"needs a user mapping: CREATE USER MAPPING FOR <role> SERVER {server_name} "
        "OPTIONS (user '<role>', password '...');")


def drop_segment_server(plpy: Any, server_name: str) -> None:
    schema = catalog.extension_schema(plpy)
    _may_register(plpy, schema)
    if not plpy.execute(plpy.prepare(f"SELECT 1 FROM {schema}.segment_servers "
                                     "WHERE server_name = $1", ["name"]), [server_name]):
        raise MadlibMopError(f"{server_name} is not a segment server",
                             sqlstate=errors.UNDEFINED_OBJECT,
                             hint=f"SELECT * FROM {schema}.segment_servers; lists them.")
    used = plpy.execute(plpy.prepare(
        "SELECT c.oid::regclass::text AS t FROM pg_catalog.pg_foreign_table ft "
        "JOIN pg_catalog.pg_class c ON c.oid = ft.ftrelid "
        "JOIN pg_catalog.pg_foreign_server s ON s.oid = ft.ftserver "
        "WHERE s.srvname = $1 ORDER BY 1", ["name"]), [server_name])
    if used:
        names = [row["t"] for row in used]
        raise MadlibMopError(
            f"foreign tables use {server_name}: {', '.join(names[:5])}"
            + (" ..." if len(names) > 5 else ""),
            sqlstate=errors.DEPENDENT_OBJECTS_STILL_EXIST,
            hint="Drop them first (a packed table's partitions are foreign tables there).")
    plpy.execute(plpy.prepare(f"DELETE FROM {schema}.segment_servers WHERE server_name = $1",
                              ["name"]), [server_name])
    plpy.notice(f"madlib_mop: {server_name} is no longer a segment server (the foreign server "
                "itself is kept)")


def check_segment_servers(plpy: Any) -> list[dict]:
    """Each registered server as the calling role reaches it."""
    extra, options = worker_session.session_settings(plpy)
    extra.setdefault("connect_timeout", "5")
    role = plpy.execute("SELECT current_user AS r")[0]["r"]
    rows = []
    for server in segment_servers.registered(plpy):
        row = {"server_name": server.name, "address": server.address,
               "segments": server.segments, "first_segment": server.first_segment,
               "reachable": False, "extension_version": None, "message": None}
        try:
            info = segment_servers.worker_conninfo(plpy, server, extra, options)
            with segment_servers.connect(info, server, segment_servers.refused_hint(server, role)) as session:
                row["reachable"] = True
                found = session.execute("SELECT extversion FROM pg_catalog.pg_extension "
                                        "WHERE extname = 'madlib_mop'").fetchone()
                row["extension_version"] = found[0] if found else None
                row["message"] = ("ok" if found and found[0] == __version__ else
                                  f"madlib_mop {__version__} is needed there"
                                  if found else "madlib_mop is not installed there")
        except Exception as error:
            row["message"] = str(getattr(error, "message", None) or error).strip().splitlines()[0]
        rows.append(row)
    return rows
