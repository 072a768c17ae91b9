"""The Docker image's entrypoint: one PostgreSQL server, set up as `make db-start` sets up the
embedded one (`madlib_mop.tools.embedded`), then run in the foreground as the container's
main process.

On every start: initdb on the first (Debian's authentication: peer on the Unix socket with
the madlib_mop map for worker sessions, scram-sha-256 on TCP; JIT off; pg_cron), the
extension created or updated in the database POSTGRES_DB names, then `postgres` itself
(execve as the postgres OS user, so `docker stop` and `docker kill` reach the postmaster).

    python -m madlib_mop.tools.container_server serve|ready

As the official PostgreSQL image does, the server listens on all the container's addresses
and takes the superuser's password (scram-sha-256) on TCP from any address, so that
`docker run -p 5432:5432 -e POSTGRES_PASSWORD=...` reaches it; worker sessions keep peer
authentication on the Unix socket.  MADLIB_MOP_LISTEN_ADDRESSES narrows what it listens on
(the compose cluster's servers, on the host's network, listen on 127.0.0.1).  The set-up's
own short-lived server listens on its Unix socket only, so no client reaches a server that
is not set up yet.

Environment: POSTGRES_PASSWORD (the superuser's password, read on the first start, when
the data volume is made; it is not passed on to the server's processes), POSTGRES_DB
(default madlib_mop), MADLIB_MOP_PGPORT (default 5432), MADLIB_MOP_LISTEN_ADDRESSES (default
`*`), MADLIB_MOP_EMBEDDED_DIR (the data volume).

Standard library only, as `madlib_mop.tools.embedded`.
"""

from __future__ import annotations

import argparse
import os
import pwd
import subprocess
import sys
from pathlib import Path

from madlib_mop.tools.embedded import (SERVER_OS_USER, SUPERUSER, ClusterError, EmbeddedCluster,
                                       command_failed, server_environment, sql_literal)

# Written once the set-up is done and `postgres` is about to start: what `ready` (the image's
# HEALTHCHECK) waits for, so the set-up's own short-lived server never counts as ready.
READY_MARK = "ready"


# The extension in its default schema, at the image's version.
EXTENSION_SQL = ("CREATE SCHEMA IF NOT EXISTS madlib_mop; "
                 "CREATE EXTENSION IF NOT EXISTS madlib_mop SCHEMA madlib_mop CASCADE; "
                 "ALTER EXTENSION madlib_mop UPDATE")


# The official image's last pg_hba.conf line: passwords on TCP from any address.
NETWORK_HBA_LINE = "host    all             all             all                     scram-sha-256"


def open_to_network(hba: Path) -> bool:
    """pg_hba.conf ends with NETWORK_HBA_LINE (added once); True when it was added."""
    text = hba.read_text(encoding="utf-8")
    if any(line.split() == NETWORK_HBA_LINE.split() for line in text.splitlines()):
        return False
    hba.write_text(text.rstrip("\n") + "\n\n# madlib_mop's image: passwords on TCP from any address, "
                   "as the official image\n" + NETWORK_HBA_LINE + "\n", encoding="utf-8")
    return True


def serve() -> None:
    server = EmbeddedCluster()
    mark = server.base / READY_MARK
    mark.unlink(missing_ok=True)
    password = os.environ.get("POSTGRES_PASSWORD")
    if not server.is_initialized() and not password:
        raise ClusterError("POSTGRES_PASSWORD is not set: the superuser needs a password "
                           "(docker run -e POSTGRES_PASSWORD=...)")
    database = os.environ.get("POSTGRES_DB") or "madlib_mop"
    server.initialize(password=password)
    open_to_network(server.data / "pg_hba.conf")
    listen = os.environ.get("MADLIB_MOP_LISTEN_ADDRESSES") or "*"
    server.ensure_setting("listen_addresses", sql_literal(listen))
    server.start(database, options="-c listen_addresses=''")
    server.psql(EXTENSION_SQL, dbname=database)
    server.stop()
    mark.touch()
    owner = pwd.getpwnam(SERVER_OS_USER)
    if os.geteuid() == 0:
        os.initgroups(SERVER_OS_USER, owner.pw_gid)
        os.setgid(owner.pw_gid)
        os.setuid(owner.pw_uid)
    # Analysts' PL/Python code runs in these processes: no superuser password in their environment.
    environment = {key: value for key, value in server_environment().items() if key != "POSTGRES_PASSWORD"}
    environment.update(HOME=owner.pw_dir, USER=SERVER_OS_USER)
    print(f"madlib_mop: PostgreSQL starting on port {server.port}, database {database}",
          file=sys.stderr, flush=True)
    postgres = server.tool("postgres")
    os.execve(postgres, [postgres, "-D", str(server.data), "-p", str(server.port)], environment)


def ready() -> bool:
    """The set-up is done and the server accepts connections (the HEALTHCHECK)."""
    server = EmbeddedCluster()
    if not (server.base / READY_MARK).exists():
        return False
    # As the server's OS user: peer authentication lets it in, so no failed login is logged.
    probe = server.run_command([server.tool("pg_isready"), "-q", "-h", str(server.socket_dir),
                                "-p", str(server.port), "-U", SUPERUSER], check=False)
    return probe.returncode == 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m madlib_mop.tools.container_server",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("command", choices=["serve", "ready"])
    args = parser.parse_args(argv)
    try:
        if args.command == "ready":
            return 0 if ready() else 1
        serve()
    except (ClusterError, subprocess.CalledProcessError) as error:
        return command_failed("madlib_mop.tools.container_server", error)
    return 0


if __name__ == "__main__":
    sys.exit(main())
