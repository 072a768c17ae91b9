"""Worker sessions kept ready for named roles (`madlib_mop.prewarm_roles`), so that a role's
first job after the server starts, and every pg_cron firing, runs on sessions that have
TensorFlow imported.

The extension's preloaded library starts a background worker per database the setting
names (`src/prewarm.c`); every few seconds it calls `_mop_prewarm()` here, as the bootstrap
superuser.  For each role listed for this database that has fewer sessions (idle, or busy
with its jobs) than `madlib_mop.prewarm_sessions`, it opens one as that role (the same socket and peer map as
every worker session: `db.worker_session`), on a slot of the server's pool, imports
TensorFlow in it with the threads a job of the default segment count runs, traces the
programs of the role's latest job in this database (`segment.worker.trace_latest_job`: a
nightly job of the same configurations then starts without tracing), and leaves it idle
for the role's calls (`engine.idle_workers`).  So they are counted by the cap, and
yield: nothing is opened while a call waits for a slot, and an idle session ends as soon
as one does.  A prewarmed session stays idle until a call waits or a DBA ends it; once a
job has used it, it waits `madlib_mop.worker_idle_seconds` as every job's sessions do, and
a new one is opened when it ends.

Only the superuser's settings name the roles: no argument, no setting a role may change,
chooses whom a session runs as.
"""

from __future__ import annotations

import time
from typing import Any

from madlib_mop import errors
from madlib_mop.db import catalog, settings, worker_session
from madlib_mop.engine import idle_workers, server_slots
from madlib_mop.engine.local import LocalWorker
from madlib_mop.errors import MadlibMopError

ROLES_SETTING = "madlib_mop.prewarm_roles"
SESSIONS_SETTING = "madlib_mop.prewarm_sessions"
LABEL = "madlib_mop prewarm worker"  # while it imports TensorFlow; then idle
# Idle until a call waits for a slot or a DBA ends it (`_mop_idle` takes an integer).
KEPT_SECONDS = 2**31 - 1
# A role that cannot have sessions (no login, not in the peer map) is reported this often.
REPORT_SECONDS = 3600.0
_reported: dict[tuple[str, str], float] = {}  # (role, what) -> when, in this background worker


def entries(value: str | None, database: str) -> list[str]:
    """The roles of `value` (role@database, comma-separated; a name may be double-quoted)
    listed for `database`, in order, once each."""
    roles: list[str] = []
    for item in (value or "").split(","):
        item = item.strip()
        role, at, where = item.rpartition("@")
        if not at or not role:
            continue
        role, where = _unquoted(role.strip()), _unquoted(where.strip())
        if where == database and role not in roles:
            roles.append(role)
    return roles


def _unquoted(name: str) -> str:
    if len(name) >= 2 and name[0] == name[-1] == '"':
        return name[1:-1].replace('""', '"')
    return name


def _report(plpy: Any, role: str, what: str, message: str, hint: str) -> None:
    """A WARNING in the server log, once an hour per role and reason."""
    now = time.monotonic()
    if now - _reported.get((role, what), -REPORT_SECONDS) >= REPORT_SECONDS:
        _reported[(role, what)] = now
        plpy.warning(f"madlib_mop.prewarm_roles: {message}", hint=hint)


def prewarm(plpy: Any) -> int:
    """One look: open the sessions the roles listed for this database lack (as many as free
    slots allow, none while a call waits).  How many it opened."""
    if not plpy.execute("SELECT rolsuper FROM pg_catalog.pg_roles WHERE rolname = current_user")[0]["rolsuper"]:
        raise MadlibMopError("_mop_prewarm runs only as a superuser",
                             sqlstate=errors.INSUFFICIENT_PRIVILEGE,
                             hint="The extension's background worker calls it; a DBA sets "
                                  f"{ROLES_SETTING} in postgresql.conf.")
    database = plpy.execute("SELECT pg_catalog.current_database() AS d")[0]["d"]
    roles = entries(settings.setting(plpy, ROLES_SETTING), database)
    wanted = settings.whole_number(plpy, SESSIONS_SETTING, minimum=0)
    wanted = 1 if wanted is None else wanted
    if not roles or not wanted:
        return 0
    schema = catalog.extension_schema_name(plpy)
    server = server_slots.pool(plpy)
    cap = server_slots.cap(plpy)
    segments = settings.default_segments(plpy)
    # The role's sessions busy with its jobs count too: none is opened beside a running job
    # (its import and tracing would take the job's cores); each is replaced once it ends.
    held = plpy.prepare(f"SELECT count(*) AS n FROM ({server.slots}) s WHERE s.role = $1 "
                        "AND s.database = pg_catalog.current_database()", ["text"])
    opened = 0
    for role in roles:
        if not plpy.execute(plpy.prepare("SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = $1 "
                                         "AND rolcanlogin", ["text"]), [role]):
            _report(plpy, role, "login", f"role {role} does not exist or cannot log in",
                    "CREATE ROLE ... LOGIN, or take it off the list.")
            continue
        plpy.execute(idle_workers.FRESH)
        have = plpy.execute(held, [role])[0]["n"]
        while have < wanted:
            if server_slots.waiting_calls(plpy):  # a waiting call goes first
                return opened
            worker = LocalWorker(worker_session.conninfo(plpy, prewarmed_role=role), schema, 0,
                                 LABEL, cap)
            try:
                if not worker.open_with_slot():
                    return opened  # every slot is taken: a later look tries again
                worker.warm_up(segments)
            except Exception as error:  # e.g. the peer map does not let the server in as the role
                worker.close()
                _report(plpy, role, "open", f"no worker session as {role}: {error}",
                        f"Let the server's OS user in as {role} (madlib-mop-server-auth allow, "
                        "or the pg_ident.conf line of docs/deploy.md).")
                break
            try:
                worker.trace_latest_job()
            except Exception as error:  # the session is ready all the same: it traces at its first visit
                _report(plpy, role, "trace", f"the programs of {role}'s latest job were not traced "
                        f"in a prewarmed session: {error}",
                        "Nothing is lost: its next job traces them at its first visits, as a new "
                        "session's job does.")
            idle_workers.wait_listening([worker.idle(KEPT_SECONDS)])
            have += 1
            opened += 1
    return opened
