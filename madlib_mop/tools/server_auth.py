"""How worker sessions authenticate: peer authentication over the Unix socket, with a
pg_ident.conf map.

A fit's segment workers are sessions opened by the server itself (the caller's backend,
running as the server's OS user, usually `postgres`) over the server's own Unix socket, as
the role that called the fit, on the same database.  No password is typed or stored: the
DBA lets the server's OS user connect as the analyst roles with PostgreSQL's own user name
maps, once per server and once per analyst:

pg_hba.conf (the socket line of Debian's default, with a map added):

    local   all   all   peer map=madlib_mop

pg_ident.conf:

    madlib_mop   /^(.*)$    \\1        # every OS user keeps peer's meaning (same name)
    madlib_mop   postgres   alice     # the server may open alice's workers

This grants no one anything new: a process running as the server's OS user can already
connect as the superuser (Debian's `local all postgres peer`).  Sessions of other OS users
still reach only the role of their own name, and PostgreSQL's dblink and postgres_fdw refuse
a non-superuser's connection that used no password, so a role cannot borrow the map.
PostgreSQL 15 needs one pg_ident.conf line per analyst role (16 and later accept
`+group` there).

Standard library only: `madlib_mop.tools.embedded` uses it before the virtual environment exists.

    python -m madlib_mop.tools.server_auth configure PG_HBA PG_IDENT [--server-user postgres]
    python -m madlib_mop.tools.server_auth allow PG_IDENT ROLE [--server-user postgres]
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

MAP_NAME = "madlib_mop"
SOCKET_LINE = f"local   all             all                                     peer map={MAP_NAME}"
IDENTITY_LINE = f"{MAP_NAME}      /^(.*)$                 \\1"
_MARK = "# madlib_mop"
# Debian's socket line (pg_createcluster): the one the map is added to.
_PLAIN_SOCKET_LINE = re.compile(r"^local\s+all\s+all\s+peer\s*$")


class AuthConfigError(ValueError):
    """The configuration files are not in a form this module can change safely."""


def _role_token(role: str) -> str:
    """A role name as pg_ident.conf reads it: double-quoted when it needs quoting."""
    if not role or "\n" in role or "\r" in role:
        raise AuthConfigError(f"{role!r} is not a role name")
    if re.fullmatch(r"[a-z_][a-z0-9_$]*", role) and role not in ("all",):
        return role
    return '"' + role.replace('"', '""') + '"'


def hba_text(text: str) -> str:
    """pg_hba.conf with the socket's peer line given the madlib_mop map (idempotent)."""
    lines = text.splitlines()
    if any(line.strip() == SOCKET_LINE.strip() or
           re.match(rf"^local\s+all\s+all\s+peer\s+map={MAP_NAME}\s*$", line) for line in lines):
        return text
    for index, line in enumerate(lines):
        if _PLAIN_SOCKET_LINE.match(line):
            lines[index:index + 1] = [f"{_MARK}: worker sessions (peer, with the {MAP_NAME} map)",
                                      SOCKET_LINE]
            return "\n".join(lines) + "\n"
    raise AuthConfigError(
        "pg_hba.conf has no line 'local all all peer' to add the madlib_mop map to; add "
        f"'{SOCKET_LINE}' before the first line that matches local connections of analyst roles")


def ident_text(text: str, server_user: str, roles: list[str] = ()) -> str:
    """pg_ident.conf with the madlib_mop map: the identity line, and one line per role the
    server's OS user may open workers for (idempotent)."""
    lines = text.splitlines()
    present = {tuple(line.split()) for line in lines if line.strip() and not line.lstrip().startswith("#")}
    if tuple(IDENTITY_LINE.split()) not in present:
        lines += [f"{_MARK}: every OS user keeps peer's meaning (its own role name)", IDENTITY_LINE]
    for role in roles:
        entry = (MAP_NAME, server_user, _role_token(role))
        if entry not in present:
            lines.append(f"{MAP_NAME}      {server_user:<22}  {_role_token(role)}")
            present.add(entry)
    return "\n".join(lines) + "\n"


def configure(hba: Path, ident: Path, server_user: str) -> bool:
    """Rewrite both files in place; True when something changed (the server must reload)."""
    old_hba, old_ident = hba.read_text(encoding="utf-8"), ident.read_text(encoding="utf-8")
    new_hba, new_ident = hba_text(old_hba), ident_text(old_ident, server_user)
    if new_hba != old_hba:
        hba.write_text(new_hba, encoding="utf-8")
    if new_ident != old_ident:
        ident.write_text(new_ident, encoding="utf-8")
    return new_hba != old_hba or new_ident != old_ident


def allow(ident: Path, server_user: str, role: str) -> bool:
    """Let the server open worker sessions as `role`; True when the file changed."""
    old = ident.read_text(encoding="utf-8")
    new = ident_text(old, server_user, [role])
    if new != old:
        ident.write_text(new, encoding="utf-8")
    return new != old


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m madlib_mop.tools.server_auth",
                                     description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    conf = sub.add_parser("configure", help="add the madlib_mop map to pg_hba.conf and pg_ident.conf")
    conf.add_argument("hba", type=Path)
    conf.add_argument("ident", type=Path)
    conf.add_argument("--server-user", default="postgres")
    grant = sub.add_parser("allow", help="let the server open worker sessions as ROLE")
    grant.add_argument("ident", type=Path)
    grant.add_argument("role")
    grant.add_argument("--server-user", default="postgres")
    args = parser.parse_args(argv)
    try:
        if args.command == "configure":
            changed = configure(args.hba, args.ident, args.server_user)
        else:
            changed = allow(args.ident, args.server_user, args.role)
    except (AuthConfigError, OSError) as error:
        print(f"madlib_mop.tools.server_auth: {error}", file=sys.stderr)
        return 1
    print("changed: reload the server (SELECT pg_reload_conf();)" if changed else "unchanged")
    return 0


if __name__ == "__main__":
    sys.exit(main())
