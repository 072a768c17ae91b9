"""Worker sessions: the sessions a call opens on this server to train, evaluate and predict
in parallel (and the coordinator's own bookkeeping session).

Who a worker session is never depends on anything a user can set: it is always the role
that made the call (`current_user`), on the same database, over this server's own Unix
socket, with the extension's search_path; or, for sessions kept ready (`engine.prewarm`), a
role that a superuser named in the server's configuration (madlib_mop.prewarm_roles).  It
authenticates by peer with the `madlib_mop` user name map (see
`madlib_mop.tools.server_auth`): no password exists or is typed anywhere.

`madlib_mop.worker_conninfo` may still add libpq parameters that change how, not as whom,
the session connects (timeouts); any other parameter is refused.
"""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from madlib_mop import errors
from madlib_mop.errors import MadlibMopError
from madlib_mop.plpy_bridge import SAFE_SEARCH_PATH

CONNINFO_SETTING = "madlib_mop.worker_conninfo"
# Settings of the caller's session that its workers get (validated: whole numbers).
FORWARDED_SETTINGS = ("madlib_mop.worker_memory_mb",)
# What madlib_mop.worker_conninfo may set: how to connect, never as whom or where.
ALLOWED_PARAMETERS = ("connect_timeout", "keepalives", "keepalives_idle",
                      "keepalives_interval", "keepalives_count", "tcp_user_timeout")
# Parameters that would change the worker's role, database, server, search_path or
# credentials: refused as a privilege matter, not as a typo.
IDENTITY_PARAMETERS = ("user", "dbname", "options", "host", "hostaddr", "port", "service",
                       "servicefile", "passfile", "password", "target_session_attrs",
                       "sslcert", "sslkey", "sslpassword", "krbsrvname", "gssencmode",
                       "require_auth", "load_balance_hosts", "channel_binding")


def _extra_parameters(text: str | None) -> dict[str, str]:
    if not text or not text.strip():
        return {}
    try:
        given = conninfo_to_dict(text)
    except psycopg.ProgrammingError as error:
        raise MadlibMopError(f"{CONNINFO_SETTING} is not a connection string: {error}",
                             sqlstate=errors.INVALID_PARAMETER_VALUE,
                             hint=f"e.g. SET {CONNINFO_SETTING} = 'connect_timeout=10', or "
                                  f"RESET {CONNINFO_SETTING}.") from None
    for key in given:
        if key in IDENTITY_PARAMETERS:
            raise MadlibMopError(
                f"{CONNINFO_SETTING} cannot set {key}",
                sqlstate=errors.INSUFFICIENT_PRIVILEGE,
                detail="Worker sessions always run as the calling role, on this database of "
                       "this server, with the extension's own search_path.",
                hint=f"RESET {CONNINFO_SETTING}; it may set only "
                     f"{', '.join(ALLOWED_PARAMETERS)}.")
        if key not in ALLOWED_PARAMETERS:
            raise MadlibMopError(
                f"{CONNINFO_SETTING}: parameter {key} is not supported",
                sqlstate=errors.INVALID_PARAMETER_VALUE,
                hint=f"It may set only {', '.join(ALLOWED_PARAMETERS)}.")
        if not str(given[key]).isdigit():  # every allowed parameter is a whole number
            raise MadlibMopError(
                f"{CONNINFO_SETTING}: {key} = '{given[key]}' is not a whole number",
                sqlstate=errors.INVALID_PARAMETER_VALUE,
                hint=f"e.g. SET {CONNINFO_SETTING} = 'connect_timeout=10'.")
    return given


def session_settings(plpy: Any) -> tuple[dict[str, str], str]:
    """What every worker session of this call gets, on any server: the libpq parameters of
    madlib_mop.worker_conninfo (how to connect) and its `options`: no statement timeout,
    JIT off (they load TensorFlow, whose LLVM cannot live next to the JIT's), the runtime's
    search_path and the caller's madlib_mop settings (e.g. worker_memory_mb)."""
    # search_path: the one the runtime pins (plpy_bridge) from the session's first statement
    # on; every name of the extension and of the user's tables is schema-qualified.
    # client_connection_check_interval: a worker whose caller's backend ended stops within
    # a second, even while it waits idle (engine.server_slots), and gives its slot back.
    options = ["-c statement_timeout=0", "-c idle_in_transaction_session_timeout=0",
               "-c jit=off", "-c client_connection_check_interval=1000",
               "-c search_path=" + SAFE_SEARCH_PATH.replace(" ", "")]
    options += [f"-c {name}={value}" for name, value in forwarded_settings(plpy).items() if value]
    setting = plpy.prepare("SELECT pg_catalog.current_setting($1, true) AS v", ["text"])
    extra = _extra_parameters(plpy.execute(setting, [CONNINFO_SETTING])[0]["v"])
    return extra, " ".join(options)


def forwarded_settings(plpy: Any) -> dict[str, str | None]:
    """The caller's values of FORWARDED_SETTINGS (None: not set), checked."""
    setting = plpy.prepare("SELECT pg_catalog.current_setting($1, true) AS v", ["text"])
    values: dict[str, str | None] = {}
    for name in FORWARDED_SETTINGS:
        value = plpy.execute(setting, [name])[0]["v"] or None
        if value is not None and not value.isdigit():
            raise MadlibMopError(f"setting {name} = '{value}' is not a whole number",
                                 sqlstate=errors.INVALID_PARAMETER_VALUE,
                                 hint=f"SET {name} = 1024, or RESET {name}.")
        values[name] = value
    return values


def conninfo(plpy: Any, prewarmed_role: str | None = None) -> str:
    """How this call's worker sessions on this server connect: this server's socket
    (127.0.0.1 on a server without one) and port, this database, the current role; or the
    role `prewarmed_role`, which only `engine.prewarm` passes, for a role the superuser's
    madlib_mop.prewarm_roles names, from a superuser's session."""
    row = plpy.execute(
        "SELECT pg_catalog.current_setting('port') AS port, pg_catalog.current_database() AS db, "
        "CURRENT_USER AS usr, (SELECT pg_catalog.quote_ident(n.nspname) FROM pg_catalog.pg_extension e "
        "JOIN pg_catalog.pg_namespace n ON n.oid = e.extnamespace WHERE e.extname = 'madlib_mop') AS schema")[0]
    socket = plpy.execute(f"SELECT {row['schema']}._server_socket_directory() AS s")[0]["s"]
    extra, options = session_settings(plpy)
    # The identity comes last and from the server alone: nothing in `extra` can name it.
    return make_conninfo("", **extra, host=socket or "127.0.0.1", port=row["port"],
                         dbname=row["db"], user=prewarmed_role or row["usr"], options=options)


def connect(info: str, autocommit: bool = True, refused_hint: str | None = None,
            **kwargs: Any) -> psycopg.Connection:
    """A worker session; a refused login becomes an error that says what the DBA must do
    (`refused_hint`, or this server's set-up)."""
    try:
        # UTF-8 whatever the database's encoding: psycopg gives bytes, not text, in a
        # SQL_ASCII database (legacy clusters, and containers without a locale make them).
        return psycopg.connect(info, autocommit=autocommit, client_encoding="UTF8", **kwargs)
    except psycopg.OperationalError as error:
        params = conninfo_to_dict(info)
        role, host = params.get("user"), params.get("host")
        text = str(error).strip()
        refused = any(word in text for word in ("authentication failed", "no pg_hba.conf entry",
                                                "password", "does not match"))
        if not refused:
            raise
        raise MadlibMopError(
            f"the server could not open a worker session as role {role}",
            sqlstate=errors.INVALID_AUTHORIZATION,
            detail=f"Connecting over {host}: {text}",
            hint=refused_hint or (
                "Worker sessions are opened by the server's OS user over its Unix socket with "
                 "peer authentication and the madlib_mop user name map. A DBA allows this role "
                 f"once: add 'madlib_mop  postgres  {role}' to pg_ident.conf (the server's OS "
                 "user, then the role), with 'local all all peer map=madlib_mop' in "
                 "pg_hba.conf, and reload (docs/deploy.md: Deploying on your server).")) from None
