"""A several-servers cluster on this machine: a coordinator and segment servers, each an
embedded PostgreSQL (`madlib_mop.tools.embedded`) with its own folder and port under
`.cluster/`, and the set-up that makes them one cluster (`setup`, also run by
docker/docker-compose.yml's `setup` service against its containers).

    python -m madlib_mop.tools.local_cluster start|stop|status|dsn|kill-segment|destroy
    python -m madlib_mop.tools.local_cluster setup --coordinator DSN --segment NAME=DSN ...

With MADLIB_MOP_CLUSTER_NET=lan or wan (`make cluster CLUSTER_NET=lan`), each segment
server runs in a network namespace of its own, behind a link of that rate and delay
(`madlib_mop.tools.cluster_net`); `stop` removes the network.

The set-up, on every server: the extension in schema madlib_mop of the database, usable by
every role; on the
coordinator: postgres_fdw, each segment server registered with add_segment_server (as a
foreign server, the address the coordinator reaches it at), and a user mapping for the
coordinator's role with that role's password on the segment server.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path
from urllib.parse import quote

from madlib_mop.tools import cluster_net
from madlib_mop.tools.embedded import (DEFAULT_DATABASE, REPO_ROOT, SUPERUSER, ClusterError, command_failed,
                                       EmbeddedCluster)

BASE = Path(os.environ.get("MADLIB_MOP_CLUSTER_DIR") or REPO_ROOT / ".cluster")
FIRST_PORT = int(os.environ.get("MADLIB_MOP_CLUSTER_PORT") or 54340)
SEGMENT_SERVERS = 2


def servers(first_port: int | None = None, base: Path | None = None, networked: bool | None = None
            ) -> dict[str, EmbeddedCluster]:
    """coordinator, seg0, seg1: their folders (under `base`, by default BASE) and ports
    (`first_port`, by default FIRST_PORT, +1, +2).  Each segment server runs on cores of its
    own, as on a machine of its own (the coordinator on all), unless
    MADLIB_MOP_CLUSTER_CPUS=shared or the machine has fewer cores than segment servers; and
    in a network namespace of its own when `networked` (by default: MADLIB_MOP_CLUSTER_NET
    names a network)."""
    names = ["coordinator"] + [f"seg{i}" for i in range(SEGMENT_SERVERS)]
    first = FIRST_PORT if first_port is None else first_port
    base = base or BASE
    networked = cluster_net.profile() is not None if networked is None else networked
    found: dict[str, EmbeddedCluster] = {"coordinator": EmbeddedCluster(base / "coordinator", first)}
    for i, name in enumerate(names[1:]):
        if networked:
            found[name] = cluster_net.NamespacedServer(base / name, first + 1 + i, cpus=segment_cpus(i),
                                                       space=cluster_net.namespace(name),
                                                       at=cluster_net.address(i))
        else:
            found[name] = EmbeddedCluster(base / name, first + 1 + i, cpus=segment_cpus(i))
            found[name].listen = "127.0.0.1"  # (back from a network namespace, if it was in one)
    return found


def segment_cpus(index: int) -> list[int] | None:
    """The cores of segment server `index`: an equal share of this process's."""
    cores = sorted(os.sched_getaffinity(0))
    share = len(cores) // SEGMENT_SERVERS
    if os.environ.get("MADLIB_MOP_CLUSTER_CPUS") == "shared" or share == 0:
        return None
    return cores[index * share:(index + 1) * share]


def _dsn_with_password(server: EmbeddedCluster) -> str:
    return (f"postgresql://{SUPERUSER}:{quote(server.password, safe='')}@{_address(server)}:"
            f"{server.port}/{DEFAULT_DATABASE}")


def _address(server: EmbeddedCluster) -> str:
    return getattr(server, "address", "127.0.0.1")  # (a container's: 127.0.0.1, its port published)


def setup(coordinator: str, segments: list[tuple[str, str]]) -> None:
    """Make the servers one cluster (idempotent).  `segments`: (name, DSN as the coordinator
    reaches the segment server, with the coordinator role's password there)."""
    import psycopg
    from psycopg import sql
    from psycopg.conninfo import conninfo_to_dict

    for dsn in [coordinator] + [dsn for _, dsn in segments]:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("CREATE SCHEMA IF NOT EXISTS madlib_mop")
            conn.execute("CREATE EXTENSION IF NOT EXISTS madlib_mop SCHEMA madlib_mop CASCADE")
            conn.execute("ALTER EXTENSION madlib_mop UPDATE")  # every server at this version
            # Every role may call the functions (they run as the caller): a job of any role
            # calls them on every server.
            conn.execute("GRANT USAGE ON SCHEMA madlib_mop TO PUBLIC")
    with psycopg.connect(coordinator, autocommit=True) as conn:
        conn.execute("CREATE EXTENSION IF NOT EXISTS postgres_fdw")
        role = conn.execute("SELECT current_user").fetchone()[0]
        for name, dsn in segments:
            where = conninfo_to_dict(dsn)
            registered = conn.execute("SELECT 1 FROM madlib_mop.segment_servers "
                                      "WHERE server_name = %s", (name,)).fetchone()
            exists = conn.execute("SELECT 1 FROM pg_foreign_server WHERE srvname = %s",
                                  (name,)).fetchone()
            if exists:  # at the address it has now (`make cluster` with another CLUSTER_NET)
                conn.execute(sql.SQL("ALTER SERVER {} OPTIONS (SET host {}, SET port {})").format(
                    sql.Identifier(name), sql.Literal(where.get("host", "localhost")),
                    sql.Literal(str(where.get("port", 5432)))))
            if not registered and exists:  # e.g. the extension was dropped and made again
                conn.execute("SELECT madlib_mop.add_segment_server(%s)", (name,))
            elif not registered:
                conn.execute("SELECT madlib_mop.add_segment_server(%s, %s, %s, %s)",
                             (name, where.get("host", "localhost"), int(where.get("port", 5432)),
                              where.get("dbname", DEFAULT_DATABASE)))
            # The mapping as it should be now (an earlier set-up's may have other options).
            conn.execute(sql.SQL("DROP USER MAPPING IF EXISTS FOR {} SERVER {}").format(
                sql.Identifier(role), sql.Identifier(name)))
            conn.execute(sql.SQL("CREATE USER MAPPING FOR {} SERVER {} "
                                 "OPTIONS (user {}, password {})").format(
                sql.Identifier(role), sql.Identifier(name), sql.Literal(role),
                sql.Literal(where["password"])))
    for name, dsn in segments:
        _peers(dsn, [(other, other_dsn) for other, other_dsn in segments if other != name])
    with psycopg.connect(coordinator, autocommit=True) as conn:
        for row in conn.execute("SELECT server_name, address, reachable, message "
                                "FROM madlib_mop.check_segment_servers()"):
            if not row[2] or row[3] != "ok":
                raise ClusterError(f"segment server {row[0]} ({row[1]}): {row[3]}")


def _peers(dsn: str, others: list[tuple[str, str]]) -> None:
    """On the segment server of `dsn`: the other segment servers as foreign servers of the
    names the coordinator gives them, and the role's user mappings there, so that its workers
    fetch states from them directly (`segment.kept_states`): what a DBA sets on each
    segment server (docs/cluster.md)."""
    import psycopg
    from psycopg import sql
    from psycopg.conninfo import conninfo_to_dict

    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE EXTENSION IF NOT EXISTS postgres_fdw")
        role = conn.execute("SELECT current_user").fetchone()[0]
        for name, other in others:
            where = conninfo_to_dict(other)
            conn.execute(sql.SQL("DROP SERVER IF EXISTS {} CASCADE").format(sql.Identifier(name)))
            conn.execute(sql.SQL("CREATE SERVER {} FOREIGN DATA WRAPPER postgres_fdw "
                                 "OPTIONS (host {}, port {}, dbname {})").format(
                sql.Identifier(name), sql.Literal(where.get("host", "localhost")),
                sql.Literal(str(where.get("port", 5432))), sql.Literal(where.get("dbname", DEFAULT_DATABASE))))
            conn.execute(sql.SQL("CREATE USER MAPPING FOR {} SERVER {} OPTIONS (user {}, password {})").format(
                sql.Identifier(role), sql.Identifier(name), sql.Literal(role), sql.Literal(where["password"])))


def start(found: dict[str, EmbeddedCluster] | None = None) -> str:
    """Start every server (idempotent), in the network MADLIB_MOP_CLUSTER_NET names, and set
    the cluster up; the coordinator's DSN.  A server last started in another network (or
    none) is started again in this one."""
    found = found or servers()
    net = cluster_net.profile()
    segments = [name for name in found if name != "coordinator"]
    if net is not None:
        if any(server.is_running() for name, server in found.items() if name != "coordinator"):
            for name in segments:
                found[name].stop()
        print(cluster_net.up(segments, *net))
    else:
        cluster_net.down(segments)
    for server in found.values():
        server.start()
    setup(_dsn_with_password(found["coordinator"]),
          [(name, _dsn_with_password(server)) for name, server in found.items()
           if name != "coordinator"])
    return found["coordinator"].dsn()


def stop(found: dict[str, EmbeddedCluster] | None = None) -> None:
    """Stop every server, then remove the network (its namespaces and links), if one."""
    found = found or servers()
    for server in found.values():
        server.stop()
    cluster_net.down([name for name in found if name != "coordinator"])


def kill_segment(name: str = "seg0") -> None:
    """Stop a segment server as a crash would (`pg_ctl stop -m immediate`)."""
    servers()[name].crash()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m madlib_mop.tools.local_cluster",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("command", choices=["start", "stop", "status", "dsn", "kill-segment",
                                            "destroy", "setup"])
    parser.add_argument("--coordinator", help="setup: the coordinator's DSN")
    parser.add_argument("--segment", action="append", default=[], metavar="NAME=DSN",
                        help="setup: a segment server as the coordinator reaches it")
    args = parser.parse_args(argv)
    try:
        if args.command == "start":
            dsn = start()
            print(f"cluster running: coordinator {dsn}; segment servers "
                  + ", ".join(f"{n} ({_address(s)}:{s.port})" for n, s in servers().items()
                              if n != "coordinator"))
        elif args.command == "dsn":
            print(servers()["coordinator"].dsn())
        elif args.command == "stop":
            stop()
            print("cluster stopped")
        elif args.command == "status":
            for name, server in servers().items():
                state = "running" if server.is_running() else (
                    "stopped" if server.is_initialized() else "not created")
                print(f"{name}: {state} ({_address(server)}:{server.port}, data in {server.data})")
        elif args.command == "kill-segment":
            kill_segment()
            print("seg0 stopped (immediate); `make cluster` starts it again")
        elif args.command == "destroy":
            stop()
            for server in servers().values():
                server.destroy()
            print(f"cluster removed ({BASE})")
        elif args.command == "setup":
            if not args.coordinator or not args.segment:
                parser.error("setup needs --coordinator and at least one --segment")
            setup(args.coordinator, [tuple(s.split("=", 1)) for s in args.segment])
            print(f"cluster set up: {len(args.segment)} segment servers registered")
    except (ClusterError, subprocess.CalledProcessError) as error:
        return command_failed("madlib_mop.tools.local_cluster", error)
    return 0


if __name__ == "__main__":
    sys.exit(main())
