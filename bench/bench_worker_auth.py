"""How long opening a worker session takes, by the way it authenticates, measured where
workers are opened: inside the server, in a PL/Python backend, with psycopg.

- peer + map: the Unix socket, peer authentication, the madlib_mop user name map
  (what madlib_mop uses: no password anywhere);
- scram over TCP: 127.0.0.1 with the role's password, as a postgres_fdw/dblink-style user
  mapping holding a password would connect.

Each connection is opened, runs `SELECT 1` and is closed; the table gives the mean and the
95th percentile over --count connections of each kind, measured side by side in one run on
the embedded cluster.

    .venv/bin/python bench/bench_worker_auth.py [--count 50]
"""

from __future__ import annotations

import argparse
import json
import secrets
import sysconfig

import psycopg
from psycopg import sql

from madlib_mop.tools.embedded import EmbeddedCluster, configured_dsn

ROLE = "madlib_mop_bench_analyst"

TIMER = """
import sys, time, json
sys.path.insert(0, {site!r})
import psycopg
def measure(info):
    times = []
    for _ in range({count}):
        start = time.perf_counter()
        with psycopg.connect(info) as c:
            c.execute("SELECT 1").fetchone()
        times.append(time.perf_counter() - start)
    return times
plpy.notice(json.dumps({{name: measure(info) for name, info in {kinds!r}.items()}}))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--count", type=int, default=50)
    args = parser.parse_args()
    cluster = EmbeddedCluster()
    cluster.start()
    cluster.allow_role(ROLE)
    password = secrets.token_urlsafe(16)
    notices: list[str] = []
    with psycopg.connect(configured_dsn(), autocommit=True) as conn:
        conn.add_notice_handler(lambda diag: notices.append(diag.message_primary))
        conn.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier(ROLE)))
        conn.execute(sql.SQL("CREATE ROLE {} LOGIN PASSWORD {}").format(
            sql.Identifier(ROLE), sql.Literal(password)))
        try:
            socket = conn.execute("SELECT trim(split_part(current_setting('unix_socket_directories'), "
                                  "',', 1))").fetchone()[0]
            port, db = conn.execute("SELECT current_setting('port'), current_database()").fetchone()
            kinds = {
                "peer + madlib_mop map (Unix socket)":
                    f"host={socket} port={port} dbname={db} user={ROLE}",
                "scram-sha-256 with a password (TCP 127.0.0.1)":
                    f"host=127.0.0.1 port={port} dbname={db} user={ROLE} password={password}",
            }
            conn.execute("CREATE EXTENSION IF NOT EXISTS plpython3u")
            code = TIMER.format(site=sysconfig.get_paths()["purelib"], count=args.count, kinds=kinds)
            conn.execute(sql.SQL("DO {} LANGUAGE plpython3u").format(sql.Literal(code)))
        finally:
            conn.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier(ROLE)))
    results = json.loads(notices[-1])
    print(f"\nOpening a worker session inside the server ({args.count} connections each, "
          "connect + SELECT 1 + close)\n")
    print("| authentication | mean ms | p95 ms |")
    print("|---|---:|---:|")
    for name, times in results.items():
        ordered = sorted(t * 1000 for t in times)
        print(f"| {name} | {sum(ordered) / len(ordered):.2f} | "
              f"{ordered[int(0.95 * (len(ordered) - 1))]:.2f} |")


if __name__ == "__main__":
    main()
