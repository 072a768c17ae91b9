"""The project's own PostgreSQL cluster, kept under the repository.

`make demo` and `make test` use it unless MADLIB_MOP_DSN names another server.  It is an
`initdb` cluster of Debian's PostgreSQL 15 listening on 127.0.0.1 only, authenticated as
Debian sets a server up (peer on the Unix socket, scram-sha-256 on TCP) plus the
madlib_mop map that lets the server open worker sessions as the calling role
(`madlib_mop.tools.server_auth`, the DBA's set-up of docs/deploy.md).  The superuser `postgres` has a
generated password, kept in a libpq password file `.pg/passfile` that the connection string
names.

PostgreSQL refuses to run as root, so when this runs as root the cluster belongs to the
`postgres` OS user (created by Debian's postgresql package) and every server command runs
through `runuser`.

Standard library only: the Makefile calls this before the virtual environment exists.

    python -m madlib_mop.tools.embedded start|stop|status|dsn|destroy
"""

from __future__ import annotations

import argparse
import contextlib
import os
import pwd
import secrets
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import parse_qsl, quote, unquote, urlsplit

from madlib_mop.tools import server_auth

REPO_ROOT = Path(__file__).resolve().parents[2]
DSN_VARIABLE = "MADLIB_MOP_DSN"
DEFAULT_PORT = 54329
DEFAULT_DATABASE = "madlib_mop"
SUPERUSER = "postgres"
SERVER_OS_USER = "postgres"


class ClusterError(RuntimeError):
    """The embedded cluster could not be set up; the message says what to do."""


def _pg_bindir() -> Path:
    configured = os.environ.get("MADLIB_MOP_PG_BINDIR")
    if configured:
        return Path(configured)
    return Path("/usr/lib/postgresql/15/bin")


class _ServerFiles:
    """The embedded server's configuration files: settings, and authentication (the
    superuser by password (passfile), worker sessions by peer with the madlib_mop map, as
    the DBA's set-up of docs/deploy.md does); and what is done to a running server beside its start
    and stop (a role's line, a crash), as `tools/containers.ContainerServer` does them to a
    container."""

    base: Path
    port: int
    data: Path
    passfile: Path
    worker_auth: bool

    @property
    def server_os_user(self) -> str:
        """The OS user the server runs as: the one its worker sessions come from."""
        return SERVER_OS_USER if os.geteuid() == 0 else pwd.getpwuid(os.geteuid()).pw_name

    @property
    def password(self) -> str:
        """The superuser's password, from the server's libpq password file."""
        return self.passfile.read_text(encoding="utf-8").strip().rsplit(":", 1)[1]

    def allow_role(self, role: str) -> None:
        """The DBA's step for a role that runs jobs: its pg_ident.conf line, and a reload."""
        if server_auth.allow(self.data / "pg_ident.conf", self.server_os_user, role) and self.is_running():
            self.run_command([self.tool("pg_ctl"), "reload", "-D", str(self.data)])

    def crash(self) -> None:
        """Stopped as a crash would stop it (`pg_ctl stop -m immediate`: no shutdown checkpoint)."""
        if self.is_running():
            self.run_command([self.tool("pg_ctl"), "stop", "-m", "immediate", "-w", "-D", str(self.data)])

    def _write_passfile(self, password: str) -> None:
        """The superuser's password, for clients of the invoking OS user (libpq's format)."""
        self.passfile.write_text(f"127.0.0.1:{self.port}:*:{SUPERUSER}:{password}\n",
                                 encoding="utf-8")
        os.chmod(self.passfile, 0o600)

    def _passfile_on_this_port(self) -> None:
        """A cluster started on another port than before (MADLIB_MOP_PGPORT changed, or a
        test process's free port): its password file names the port it is on now."""
        if self.passfile.exists() and not self.passfile.read_text(encoding="utf-8").startswith(
                f"127.0.0.1:{self.port}:"):
            self._write_passfile(self.password)

    def _configure_workers(self) -> bool:
        """The DBA's set-up of docs/deploy.md: the madlib_mop map on the socket's peer line."""
        if not self.worker_auth:
            return False
        hba, ident = self.data / "pg_hba.conf", self.data / "pg_ident.conf"
        changed = server_auth.configure(hba, ident, self.server_os_user)
        if self.server_os_user != SUPERUSER:  # the superuser's own fits, and our tools
            changed |= server_auth.allow(ident, self.server_os_user, SUPERUSER)
        return changed

    def _secure_trust_cluster(self) -> None:
        """A cluster made by an earlier version trusted every local connection: give the
        superuser a password and Debian's authentication with the madlib_mop map."""
        self._passfile_on_this_port()
        hba = self.data / "pg_hba.conf"
        rules = [line.split() for line in hba.read_text(encoding="utf-8").splitlines()
                 if line.strip() and not line.lstrip().startswith("#")]
        if self.passfile.exists() and not any("trust" in rule for rule in rules):
            return
        password = secrets.token_urlsafe(24)
        self.psql(f"ALTER ROLE {SUPERUSER} PASSWORD " + sql_literal(password))
        self._write_passfile(password)
        hba.write_text(DEBIAN_SUPERUSER_LINE + DEBIAN_HBA, encoding="utf-8")
        self._configure_workers()
        self.run_command([self.tool("pg_ctl"), "reload", "-D", str(self.data)])

    def ensure_setting(self, name: str, value: str) -> bool:
        """`name = value` in postgresql.auto.conf (read at start), added or replacing another
        value: clusters made by an earlier version get settings added since, the image its
        listen addresses; True when the setting was added or changed."""
        conf = self.data / "postgresql.auto.conf"
        lines = conf.read_text(encoding="utf-8").splitlines()
        wanted = f"{name} = {value}"
        if wanted in lines:
            return False
        lines = [line for line in lines if not line.startswith(f"{name} = ")] + [wanted]
        conf.write_text("\n".join(lines) + "\n", encoding="utf-8")
        if self.is_running():
            self.run_command([self.tool("pg_ctl"), "reload", "-D", str(self.data)])
        return True

    def preload_settings(self) -> dict[str, str]:
        """The extension's library, preloaded once it is installed, so that a misspelt
        madlib_mop.* setting is an error when it is set (the library reserves the prefix).
        pg_cron (Debian's postgresql-15-cron) for scheduled model selection: its scheduler
        runs in the default database and opens each job's session over the Unix socket, so
        a job authenticates as worker sessions do (peer, with the madlib_mop map)."""
        installed = (self.bindir.parent / "lib" / "madlib_mop.so").exists()
        return {"shared_preload_libraries": "'pg_cron,madlib_mop'" if installed else "'pg_cron'",
                "cron.database_name": f"'{DEFAULT_DATABASE}'",
                "cron.host": f"'{self.socket_dir}'"}


def server_environment() -> dict[str, str]:
    """The environment the server's commands run in: this one without PYTHONPATH.  The
    server's PL/Python finds the runtime through the installed extension's preamble; a
    PYTHONPATH of whoever started it (the Makefile sets one for its tools) would put that
    checkout's package ahead of the one the extension names."""
    return {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}


def installed_after_start(bindir: Path, data: Path) -> bool:
    """Was the extension's library installed after the running server started?  A preloaded
    library is read at start: a new one (or a new preload line) needs a restart."""
    library, started = bindir.parent / "lib" / "madlib_mop.so", data / "postmaster.pid"
    try:
        return library.stat().st_mtime > started.stat().st_mtime
    except FileNotFoundError:
        return False


class EmbeddedCluster(_ServerFiles):
    """One initdb cluster: its folder, its port, and how to start and stop it."""
    listen: str | None = None  # made its listen_addresses at every start (`make cluster`'s servers)

    def __init__(self, base: Path | None = None, port: int | None = None,
                 worker_auth: bool = True, cpus: list[int] | None = None):
        self.base = Path(base or os.environ.get("MADLIB_MOP_EMBEDDED_DIR") or REPO_ROOT / ".pg").resolve()
        self.port = int(port or os.environ.get("MADLIB_MOP_PGPORT") or DEFAULT_PORT)
        self.data = self.base / "data"
        self.socket_dir = self.base / "run"
        self.log = self.base / "server.log"
        self.passfile = self.base / "passfile"
        self.worker_auth = worker_auth  # False: Debian's authentication alone (a DBA's server before set-up)
        self.cpus = cpus  # the cores it runs on (taskset; None: all), as `make cluster` sets
        self.bindir = _pg_bindir()

    def dsn(self, dbname: str = DEFAULT_DATABASE) -> str:
        return (f"postgresql://{SUPERUSER}@127.0.0.1:{self.port}/{quote(dbname)}"
                f"?passfile={quote(str(self.passfile))}")

    # -- running server commands as the right OS user -------------------------
    def _as_server_user(self, argv: list[str]) -> list[str]:
        argv = ["taskset", "--cpu-list", ",".join(map(str, self.cpus)), *argv] if self.cpus else argv
        if os.geteuid() == 0:
            return ["runuser", "-u", SERVER_OS_USER, "--", *argv]
        return argv

    def run_command(self, argv: list[str], check: bool = True) -> subprocess.CompletedProcess:
        return subprocess.run(self._as_server_user(argv), check=check, capture_output=True,
                              text=True, env=server_environment())

    def tool(self, name: str) -> str:
        path = self.bindir / name
        if not path.exists():
            raise ClusterError(
                f"{path} not found: PostgreSQL 15 server binaries are missing. "
                "Run `make deps` (as root) to install Debian's postgresql-15."
            )
        return str(path)

    # -- lifecycle ------------------------------------------------------------
    def is_initialized(self) -> bool:
        return (self.data / "PG_VERSION").exists()

    def is_running(self) -> bool:
        if not self.is_initialized():
            return False
        result = self.run_command([self.tool("pg_ctl"), "status", "-D", str(self.data)], check=False)
        return result.returncode == 0

    def _prepare_folders(self) -> None:
        self.base.mkdir(parents=True, exist_ok=True)
        self.socket_dir.mkdir(exist_ok=True)
        if os.geteuid() == 0:
            owner = pwd.getpwnam(SERVER_OS_USER)
            for path in (self.base, self.socket_dir):
                os.chown(path, owner.pw_uid, owner.pw_gid)
            if self.data.exists():
                for path in [self.data, *self.data.rglob("*")]:  # WAL files may go meanwhile
                    with contextlib.suppress(FileNotFoundError):
                        os.lchown(path, owner.pw_uid, owner.pw_gid)
            # The server imports the project's virtual environment (PL/Python), so the
            # server's OS user must be able to reach the repository.
            probe = self.run_command(["test", "-r", str(REPO_ROOT / "pyproject.toml")], check=False)
            if probe.returncode != 0:
                raise ClusterError(
                    f"the OS user {SERVER_OS_USER!r} cannot read {REPO_ROOT}. "
                    "Clone the repository where that user can read it (e.g. under /work "
                    "or /opt), or give other users read and search permission on its "
                    "parent folders."
                )

    def initialize(self, password: str | None = None) -> None:
        """initdb as Debian sets a server up; the superuser's password (or a generated one)."""
        self._prepare_folders()
        if self.is_initialized():
            return
        password = password or secrets.token_urlsafe(24)
        pwfile = self.base / "initdb-password"
        pwfile.write_text(password + "\n", encoding="utf-8")
        os.chmod(pwfile, 0o600)
        if os.geteuid() == 0:
            owner = pwd.getpwnam(SERVER_OS_USER)
            os.chown(pwfile, owner.pw_uid, owner.pw_gid)
        try:
            # What Debian's pg_createcluster does: peer on the socket, scram-sha-256 on TCP.
            self.run_command(
                [
                    self.tool("initdb"),
                    "-D", str(self.data),
                    "-U", SUPERUSER,
                    "--auth-local=peer", "--auth-host=scram-sha-256",
                    f"--pwfile={pwfile}",
                    "-E", "UTF8",
                    "--locale=C.UTF-8",
                ]
            )
        finally:
            pwfile.unlink()
        self._write_passfile(password)
        hba = self.data / "pg_hba.conf"
        # ... and its first line: the DBA's login as the superuser, by the server's OS user.
        hba.write_text(DEBIAN_SUPERUSER_LINE + hba.read_text(encoding="utf-8"), encoding="utf-8")
        settings = {
            "port": str(self.port),
            "listen_addresses": "'127.0.0.1'",
            "unix_socket_directories": f"'{self.socket_dir}'",
            "max_connections": "100",
            "shared_buffers": "256MB",
            "logging_collector": "off",
            "log_min_messages": "warning",
            # PostgreSQL's JIT and TensorFlow each load their own LLVM: not in one process.
            "jit": "off",
            **self.preload_settings(),
        }
        with open(self.data / "postgresql.auto.conf", "a", encoding="utf-8") as conf:
            conf.write("# written by madlib_mop.tools.embedded\n")
            for key, value in settings.items():
                conf.write(f"{key} = {value}\n")

    def start(self, database: str = DEFAULT_DATABASE, options: str = "") -> str:
        """Start the cluster if it is not running (with postgres `options`), make sure
        `database` exists; return its DSN."""
        self.initialize()
        self.ensure_setting("jit", "off")
        # (listen: a segment server of `make cluster` may have been in another network)
        added = [self.ensure_setting(name, value) for name, value in {**self.preload_settings(), **(
            {"listen_addresses": f"'{self.listen}'"} if self.listen else {})}.items()]
        if (any(added) or installed_after_start(self.bindir, self.data)) and self.is_running():
            self.run_command([self.tool("pg_ctl"), "restart", "-w", "-t", "60", "-m", "fast",
                       "-D", str(self.data), "-l", str(self.log), "-o", f"-p {self.port}"])
        if not self.is_running():
            self._prepare_folders()
            result = self.run_command(
                [
                    self.tool("pg_ctl"), "start", "-w", "-t", "60",
                    "-D", str(self.data), "-l", str(self.log), "-o", f"-p {self.port} {options}",
                ],
                check=False,
            )
            if result.returncode != 0:
                tail = self.log.read_text(errors="replace").splitlines()[-15:] if self.log.exists() else []
                raise ClusterError(
                    "the embedded PostgreSQL did not start:\n"
                    + result.stdout + result.stderr + "\n".join(tail)
                    + f"\nIf port {self.port} is taken, set MADLIB_MOP_PGPORT to a free port."
                )
        self._wait_ready()
        self._secure_trust_cluster()
        if self._configure_workers():
            self.run_command([self.tool("pg_ctl"), "reload", "-D", str(self.data)])
        self.create_database(DEFAULT_DATABASE)
        self.psql("CREATE EXTENSION IF NOT EXISTS pg_cron", dbname=DEFAULT_DATABASE)
        self.create_database(database)
        return self.dsn(database)

    def _wait_ready(self, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while True:
            ready = self.run_command(
                [self.tool("pg_isready"), "-h", str(self.socket_dir), "-p", str(self.port), "-U", SUPERUSER],
                check=False,
            )
            if ready.returncode == 0:
                return
            if time.monotonic() > deadline:
                raise ClusterError(f"the embedded PostgreSQL is not ready after {timeout}s")
            time.sleep(0.2)

    def psql(self, sql: str, dbname: str = "postgres") -> str:
        """Run `sql` as the superuser over the Unix socket; what it printed."""
        result = self.run_command(
            [
                self.tool("psql"), "-X", "-q", "-A", "-t", "-v", "ON_ERROR_STOP=1",
                "-h", str(self.socket_dir), "-p", str(self.port), "-U", SUPERUSER, "-d", dbname,
                "-c", sql,
            ]
        )
        return result.stdout.strip()

    def create_database(self, database: str) -> None:
        exists = self.psql(
            "SELECT 1 FROM pg_database WHERE datname = " + sql_literal(database)
        )
        if not exists:
            self.run_command(
                [
                    self.tool("createdb"), "-h", str(self.socket_dir), "-p", str(self.port),
                    "-U", SUPERUSER, database,
                ]
            )

    def stop(self) -> None:
        if self.is_running():
            self.run_command([self.tool("pg_ctl"), "stop", "-w", "-m", "fast", "-D", str(self.data)])

    def destroy(self) -> None:
        self.stop()
        if self.base.exists():
            shutil.rmtree(self.base)


# The first line pg_createcluster writes; then initdb's own lines for peer / scram-sha-256.
DEBIAN_SUPERUSER_LINE = f"""# Database administrative login by Unix domain socket
local   all             {SUPERUSER}                                peer

"""
DEBIAN_HBA = """# TYPE  DATABASE        USER            ADDRESS                 METHOD
local   all             all                                     peer
host    all             all             127.0.0.1/32            scram-sha-256
host    all             all             ::1/128                 scram-sha-256
local   replication     all                                     peer
host    replication     all             127.0.0.1/32            scram-sha-256
host    replication     all             ::1/128                 scram-sha-256
"""


def sql_literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def configured_dsn(database: str = DEFAULT_DATABASE) -> str:
    """The server in use: MADLIB_MOP_DSN when set, else the embedded cluster."""
    return os.environ.get(DSN_VARIABLE) or EmbeddedCluster().dsn(database)


# libpq connection parameters and the environment variables that set them.
LIBPQ_ENVIRONMENT = {"host": "PGHOST", "port": "PGPORT", "user": "PGUSER",
                     "password": "PGPASSWORD", "passfile": "PGPASSFILE", "sslmode": "PGSSLMODE"}


def libpq_environment(dsn: str) -> dict[str, str]:
    """PG* variables for the server a DSN names (URL or key=value form), for tools that take
    no connection string (pg_regress)."""
    if "://" in dsn:
        url = urlsplit(dsn)
        parameters = {"host": url.hostname, "port": url.port and str(url.port),
                      "user": url.username and unquote(url.username),
                      "password": url.password and unquote(url.password)}
        parameters.update(parse_qsl(url.query))
    else:
        parameters = dict(item.split("=", 1) for item in shlex.split(dsn) if "=" in item)
    return {LIBPQ_ENVIRONMENT[k]: v for k, v in parameters.items() if k in LIBPQ_ENVIRONMENT and v}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m madlib_mop.tools.embedded", description=__doc__.split("\n\n")[0])
    parser.add_argument("command", choices=["start", "stop", "status", "dsn", "env", "destroy"])
    args = parser.parse_args(argv)
    cluster = EmbeddedCluster()
    try:
        if args.command == "dsn":
            print(configured_dsn())
        elif args.command == "env":  # eval "$(python -m madlib_mop.tools.embedded env)"
            for name, value in libpq_environment(configured_dsn()).items():
                print(f"export {name}={shlex.quote(value)}")
        elif args.command == "start":
            dsn = cluster.start()
            print(f"embedded PostgreSQL running: {dsn} (data in {cluster.data})")
        elif args.command == "stop":
            cluster.stop()
            print("embedded PostgreSQL stopped")
        elif args.command == "status":
            state = "running" if cluster.is_running() else (
                "stopped" if cluster.is_initialized() else "not created")
            print(f"embedded PostgreSQL {state}: {cluster.dsn()} (data in {cluster.data})")
        elif args.command == "destroy":
            cluster.destroy()
            print(f"embedded PostgreSQL removed ({cluster.base})")
    except (ClusterError, subprocess.CalledProcessError) as error:
        return command_failed("madlib_mop.tools.embedded", error)
    return 0


def command_failed(tool: str, error: Exception) -> int:
    """A tool's command failed: what it said (a server command's stderr too); exit code 1."""
    detail = getattr(error, "stderr", "") or ""
    print(f"{tool}: {error}\n{detail}", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
