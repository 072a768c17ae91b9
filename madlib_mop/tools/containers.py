"""Docker: the engine, the images, and the compose cluster of docker/docker-compose.yml.

    python -m madlib_mop.tools.containers engine          a Docker engine that answers, and compose
    python -m madlib_mop.tools.containers images          the base and project images, when absent
    python -m madlib_mop.tools.containers compose-up      the cluster (coordinator, seg0, seg1), set up
    python -m madlib_mop.tools.containers compose-dsn     the coordinator's libpq string
    python -m madlib_mop.tools.containers compose-kill-segment [NAME]
    python -m madlib_mop.tools.containers compose-down    containers and volumes removed

The base image is made from Debian's packages (debootstrap, then `docker import`), so a
machine that reaches no image registry builds the project's image all the same; the
project's image is rebuilt when its sources changed (a label holds their digest).  Builds
use the build machine's trusted CAs and pip index settings (docker/host/, never in the final
image) and host networking, as the machine's own package installs do.

Standard library only: the Makefile runs it with the server's Python.
"""

from __future__ import annotations

import argparse
import ast
import configparser
import hashlib
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from urllib.parse import quote

from madlib_mop.tools.embedded import REPO_ROOT, ClusterError, command_failed

OWN_BASE_IMAGE = "madlib_mop/debian:bookworm"
BASE_IMAGE = os.environ.get("MADLIB_MOP_BASE_IMAGE") or OWN_BASE_IMAGE
DEBIAN_MIRROR = os.environ.get("MADLIB_MOP_DEBIAN_MIRROR") or "http://deb.debian.org/debian"
COMPOSE_FILE = REPO_ROOT / "docker" / "docker-compose.yml"
COMPOSE_PROJECT = "madlib_mop"
COMPOSE_PORTS = {"coordinator": 54350, "seg0": 54351, "seg1": 54352}
COMPOSE_DATABASE = "madlib"
SOURCE_LABEL = "org.madlib-mop.source-digest"
# What the image is built from (docker/Dockerfile copies the rest of the context too, but
# these decide what is installed).
IMAGE_SOURCES = ("pyproject.toml", "Makefile", "extension.mk", "madlib_mop.control", "docker/Dockerfile",
                 "madlib_mop", "sql", "udf", "src")
HOST_FOLDER = REPO_ROOT / "docker" / "host"
COMPOSE_PASSWORD_FILE = REPO_ROOT / ".compose" / "password"
# Debian's packages: the engine, compose (where Docker's plugin is missing), and debootstrap
# for the base image.
ENGINE_PACKAGE, COMPOSE_PACKAGE, DEBOOTSTRAP_PACKAGE = "docker.io", "docker-compose", "debootstrap"
DEBIAN_SOURCES = f"""Types: deb
URIs: {DEBIAN_MIRROR}
Suites: bookworm bookworm-updates
Components: main

Types: deb
URIs: http://deb.debian.org/debian-security
Suites: bookworm-security
Components: main
"""


def version() -> str:
    for line in (REPO_ROOT / "pyproject.toml").read_text(encoding="utf-8").splitlines():
        if line.startswith("version = "):
            return line.split('"')[1]
    raise ClusterError("pyproject.toml has no version")


def project_image() -> str:
    return os.environ.get("MADLIB_MOP_IMAGE") or f"madlib_mop:{version()}"


def _run(argv: list[str], check: bool = True, **options) -> subprocess.CompletedProcess:
    return subprocess.run(argv, check=check, text=True, **options)


def _docker(*argv: str, check: bool = True, capture: bool = True, input: str | None = None
            ) -> subprocess.CompletedProcess:
    # The classic builder: it needs no buildx plugin, and the Dockerfile uses nothing newer.
    environment = {**os.environ, "DOCKER_BUILDKIT": "0"}
    return _run(["docker", *argv], check=check, capture_output=capture, env=environment, input=input)


def install_packages(*packages: str) -> None:
    """Debian packages, as root, when missing (`make images` installs what it needs)."""
    missing = [p for p in packages if "install ok installed" not in _run(
        ["dpkg-query", "-W", "-f=${Status}", p], check=False, capture_output=True).stdout]
    if not missing:
        return
    if os.geteuid() != 0:
        raise ClusterError(f"missing Debian packages: {' '.join(missing)}; run 'sudo make images'")
    print(f"installing Debian packages: {' '.join(missing)}", flush=True)
    _run(["apt-get", "update", "-q"], capture_output=True)
    _run(["apt-get", "install", "-y", "-q", *missing], env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"})


def engine_answers() -> bool:
    if shutil.which("docker") is None:
        return False
    try:
        return _docker("info", "--format", "{{.ServerVersion}}", check=False).returncode == 0
    except OSError:
        return False


def start_engine(timeout: float = 60.0) -> None:
    """A Docker engine that answers: dockerd started in the background when none does (as
    root; on a machine with systemd, `systemctl start docker` is the usual way)."""
    if engine_answers():
        return
    if shutil.which("dockerd") is None:
        install_packages(ENGINE_PACKAGE)
    if os.geteuid() != 0:
        raise ClusterError("no Docker engine answers: start it (sudo systemctl start docker)")
    log = Path(tempfile.gettempdir()) / "madlib_mop-dockerd.log"
    # overlay2 first; vfs (copies every layer, slow but works on any file system) if not.
    for driver in ("overlay2", "vfs"):
        with open(log, "a", encoding="utf-8") as out:
            daemon = subprocess.Popen(["dockerd", f"--storage-driver={driver}"], stdout=out,
                                      stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and daemon.poll() is None:
            if engine_answers():
                print(f"dockerd started (storage driver {driver}; log {log})")
                return
            time.sleep(0.5)
        if daemon.poll() is None:
            daemon.kill()
            daemon.wait()
    raise ClusterError(f"dockerd did not start: see {log}")


def _image_label(image: str, label: str) -> str | None:
    found = _docker("image", "inspect", "--format", f'{{{{index .Config.Labels "{label}"}}}}', image,
                    check=False)
    return found.stdout.strip() if found.returncode == 0 else None


def build_base_image() -> None:
    """Debian bookworm from Debian's packages, imported as BASE_IMAGE (when absent); another
    base named by MADLIB_MOP_BASE_IMAGE is pulled from its registry."""
    if _image_label(BASE_IMAGE, SOURCE_LABEL) is not None:
        return
    if BASE_IMAGE != OWN_BASE_IMAGE:
        _docker("pull", BASE_IMAGE, capture=False)
        return
    install_packages(DEBOOTSTRAP_PACKAGE)
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="madlib_mop-base-") as folder:
        root = Path(folder) / "rootfs"
        _run(["debootstrap", "--variant=minbase", "bookworm", str(root), DEBIAN_MIRROR],
             capture_output=True)
        (root / "etc/apt/sources.list").unlink(missing_ok=True)
        (root / "etc/apt/sources.list.d/debian.sources").write_text(DEBIAN_SOURCES, encoding="utf-8")
        for name in ("etc/resolv.conf", "etc/hostname"):  # the build machine's, not the image's
            (root / name).write_text("", encoding="utf-8")
        shutil.rmtree(root / "var/cache/apt/archives", ignore_errors=True)
        (root / "var/cache/apt/archives/partial").mkdir(parents=True)
        tar = subprocess.Popen(["tar", "-C", str(root), "-c", "."], stdout=subprocess.PIPE)
        _run(["docker", "import", "--change", 'CMD ["bash"]', "--change", f"LABEL {SOURCE_LABEL}=debootstrap",
              "-", BASE_IMAGE], stdin=tar.stdout, capture_output=True)
        if tar.wait() != 0:
            raise ClusterError("tar of the base image's root failed")
    print(f"base image {BASE_IMAGE}: made from Debian's packages in {time.monotonic() - started:.0f}s")


def source_digest() -> str:
    """A digest of what the project's image is built from."""
    digest = hashlib.sha256()
    files = []
    for name in IMAGE_SOURCES:
        path = REPO_ROOT / name
        # What the build context holds (.dockerignore leaves build output out).
        files += sorted(p for p in path.rglob("*") if p.is_file() and "__pycache__" not in p.parts
                        and p.suffix not in (".o", ".bc", ".so", ".pyc")) if path.is_dir() else [path]
    for path in files:
        digest.update(str(path.relative_to(REPO_ROOT)).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


PIP_INDEX_OPTIONS = ("index-url", "extra-index-url", "trusted-host", "timeout", "default-timeout")


def pip_index_settings(config_lines: list[str]) -> dict[str, str]:
    """From `pip config list`'s lines (`global.index-url='https://...'`, `:env:.timeout='60'`):
    the settings that say where pip downloads from, keeping URLs and dropping this
    machine's paths (file:// indexes, find-links, constraint files), which mean nothing in a
    build."""
    kept: dict[str, str] = {}
    for line in config_lines:
        key, _, value = line.partition("=")
        option = key.rpartition(".")[2]
        if option not in PIP_INDEX_OPTIONS:
            continue
        try:  # pip prints each value as a Python literal
            values = str(ast.literal_eval(value.strip())).split()
        except (ValueError, SyntaxError):
            values = value.strip().split()
        if option.endswith("index-url"):
            values = [v for v in values if v.startswith(("http://", "https://"))]
        if values:
            kept[option] = " ".join(values)
    return kept


def write_host_settings() -> None:
    """docker/host/: the build machine's trusted CAs and pip's index settings."""
    HOST_FOLDER.mkdir(exist_ok=True)
    for name in ("ca-certificates.crt", "pip.conf"):  # index URLs may hold credentials
        (HOST_FOLDER / name).touch(mode=0o600)
        os.chmod(HOST_FOLDER / name, 0o600)
    bundle = next((Path(p) for p in (os.environ.get("PIP_CERT"), os.environ.get("SSL_CERT_FILE"),
                                    os.environ.get("REQUESTS_CA_BUNDLE"),
                                    "/etc/ssl/certs/ca-certificates.crt") if p and Path(p).is_file()), None)
    (HOST_FOLDER / "ca-certificates.crt").write_bytes(bundle.read_bytes() if bundle else b"")
    pip_command = shutil.which("pip3") or shutil.which("pip")
    listed = _run([pip_command, "config", "list"], check=False, capture_output=True) if pip_command else None
    pip = configparser.RawConfigParser()
    pip["global"] = pip_index_settings(listed.stdout.splitlines() if listed and listed.returncode == 0 else [])
    with open(HOST_FOLDER / "pip.conf", "w", encoding="utf-8") as out:
        pip.write(out)


def build_images(force: bool = False) -> str:
    """The base image when absent, then the project's image when absent or built from other
    sources; its tag."""
    start_engine()
    build_base_image()
    image, digest = project_image(), source_digest()
    if not force and _image_label(image, SOURCE_LABEL) == digest:
        return image
    write_host_settings()
    started = time.monotonic()
    proxies = [arg for name in ("http_proxy", "https_proxy", "no_proxy", "HTTP_PROXY", "HTTPS_PROXY",
                                "NO_PROXY") if os.environ.get(name)
               for arg in ("--build-arg", f"{name}={os.environ[name]}")]
    _docker("build", "--network", "host", "-f", str(REPO_ROOT / "docker" / "Dockerfile"),
            "--build-arg", f"BASE_IMAGE={BASE_IMAGE}", *proxies, "--label", f"{SOURCE_LABEL}={digest}",
            "-t", image, "-t", "madlib_mop:latest", str(REPO_ROOT), capture=False)
    # Earlier builds of the image, and their build stages, untagged now: their space back.
    for label in (SOURCE_LABEL, "org.madlib-mop.stage"):
        _docker("image", "prune", "-f", "--filter", f"label={label}", check=False)
    print(f"image {image}: built in {time.monotonic() - started:.0f}s")
    return image


def compose_command() -> list[str]:
    """`docker compose` (the plugin) where it exists, else Debian's docker-compose."""
    if _docker("compose", "version", check=False).returncode == 0:
        return ["docker", "compose"]
    install_packages(COMPOSE_PACKAGE)
    return ["docker-compose"]


def compose_password() -> str:
    """The compose cluster's superuser password: MADLIB_MOP_COMPOSE_PASSWORD, else one
    generated on the first `make compose-up` and kept in .compose/password (mode 600).  The
    servers read it when their volumes are made."""
    if os.environ.get("MADLIB_MOP_COMPOSE_PASSWORD"):
        return os.environ["MADLIB_MOP_COMPOSE_PASSWORD"]
    if not COMPOSE_PASSWORD_FILE.exists():
        COMPOSE_PASSWORD_FILE.parent.mkdir(exist_ok=True)
        COMPOSE_PASSWORD_FILE.touch(mode=0o600)
        COMPOSE_PASSWORD_FILE.write_text(secrets.token_urlsafe(24), encoding="utf-8")
    return COMPOSE_PASSWORD_FILE.read_text(encoding="utf-8").strip()


def compose(*argv: str, check: bool = True, capture: bool = False) -> subprocess.CompletedProcess:
    password = compose_password()
    environment = {**os.environ, "MADLIB_MOP_IMAGE": project_image(), "MADLIB_MOP_COMPOSE_PASSWORD": password,
                   "MADLIB_MOP_COMPOSE_PASSWORD_URL": quote(password, safe="")}
    return _run([*compose_command(), "-p", COMPOSE_PROJECT, "-f", str(COMPOSE_FILE), *argv],
                check=check, capture_output=capture, env=environment)


def server_dsn(name: str = "coordinator", dbname: str = COMPOSE_DATABASE) -> str:
    return compose_servers()[name].dsn(dbname)


def wait_healthy(container: str, timeout: float = 300.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        state = _docker("inspect", "--format", "{{.State.Status}} {{.State.Health.Status}}", container,
                        check=False).stdout.split()
        if state == ["running", "healthy"]:
            return
        if time.monotonic() > deadline or (state and state[0] in ("exited", "dead")) or state[1:] == ["unhealthy"]:
            logs = _docker("logs", "--tail", "30", container, check=False)
            raise ClusterError(f"container {container} is {' '.join(state) or 'missing'}:\n"
                               f"{logs.stdout}{logs.stderr}")
        time.sleep(0.5)


def compose_up() -> str:
    """The cluster running and set up (idempotent); the coordinator's DSN."""
    build_images()
    compose("up", "-d", "coordinator", "seg0", "seg1")
    for name in COMPOSE_PORTS:
        wait_healthy(f"mop-{name}")
    compose("rm", "-f", "-s", "setup", capture=True)
    compose("up", "-d", "setup")
    status = _run(["docker", "wait", "mop-setup"], capture_output=True, timeout=600).stdout.strip()
    if status != "0":
        logs = _docker("logs", "mop-setup", check=False)
        raise ClusterError(f"the cluster's set-up failed ({status}):\n{logs.stdout}{logs.stderr}")
    return server_dsn()


class ContainerServer:
    """A server in a container of the project's image, seen from the Docker host: what the
    tests and tools do to a server (start it, crash it, run its tools, let a role open worker
    sessions), done in the container, to the container's own files."""

    data = "/var/lib/madlib_mop/data"
    python = "/opt/madlib_mop/.venv/bin/python"
    bindir = "/usr/lib/postgresql/15/bin"

    def __init__(self, container: str, port: int, password: str):
        self.container, self.port, self.password = container, port, password

    def dsn(self, dbname: str = COMPOSE_DATABASE) -> str:
        return f"postgresql://postgres:{quote(self.password, safe='')}@127.0.0.1:{self.port}/{quote(dbname)}"

    def tool(self, name: str) -> str:
        return f"{self.bindir}/{name}"

    def exec(self, argv: list[str], user: str = "postgres", check: bool = True,
             stdin: str | None = None) -> subprocess.CompletedProcess:
        return _docker("exec", *(["-i"] if stdin is not None else []), "-u", user, self.container, *argv,
                       check=check, input=stdin)

    def run_command(self, argv: list[str], check: bool = True) -> subprocess.CompletedProcess:
        return self.exec(argv, check=check)

    def is_running(self) -> bool:
        state = _docker("inspect", "--format", "{{.State.Running}}", self.container, check=False)
        return state.stdout.strip() == "true"

    def start(self) -> None:
        if not self.is_running():
            _docker("start", self.container)
        wait_healthy(self.container)

    def stop(self) -> None:
        _docker("stop", "-t", "60", self.container)

    def crash(self) -> None:
        """Killed as a crash would kill it: SIGKILL to the postmaster, the container's main
        process (no shutdown checkpoint; the next start recovers from the WAL)."""
        _docker("kill", self.container)
        _run(["docker", "wait", self.container], capture_output=True, timeout=60)

    def allow_role(self, role: str) -> None:
        """The DBA's step for a role that runs jobs (its pg_ident.conf line), and a reload."""
        self.exec([self.python, "-m", "madlib_mop.tools.server_auth", "allow", f"{self.data}/pg_ident.conf",
                   role, "--server-user", "postgres"])
        self.exec([self.tool("pg_ctl"), "reload", "-D", self.data])

    def write_file(self, path: str, text: str) -> None:
        self.exec(["sh", "-c", 'cat > "$1"', "sh", path], user="root", stdin=text)

    def remove_file(self, path: str) -> None:
        self.exec(["rm", "-f", path], user="root")

    def output(self, argv: list[str]) -> str:
        return self.exec(argv).stdout.strip()


def compose_servers() -> dict[str, ContainerServer]:
    """coordinator, seg0, seg1 of the compose cluster."""
    return {name: ContainerServer(f"mop-{name}", port, compose_password())
            for name, port in COMPOSE_PORTS.items()}


def kill_segment(name: str = "seg0") -> None:
    """A segment server's container killed as a crash would (SIGKILL to the postmaster)."""
    servers = compose_servers()
    if name == "coordinator" or name not in servers:
        raise ClusterError(f"{name!r} is no segment server of the compose cluster: seg0 or seg1")
    servers[name].crash()


def compose_down() -> None:
    compose("down", "-v", "--remove-orphans")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m madlib_mop.tools.containers",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("command", choices=["engine", "images", "compose-up", "compose-dsn",
                                            "compose-kill-segment", "compose-down"])
    parser.add_argument("name", nargs="?", default="seg0", help="compose-kill-segment: seg0 or seg1")
    parser.add_argument("--force", action="store_true", help="images: rebuild the project's image")
    args = parser.parse_args(argv)
    try:
        if args.command == "engine":
            start_engine()
            compose_command()
        elif args.command == "images":
            print(build_images(force=args.force))
        elif args.command == "compose-up":
            print(compose_up())
        elif args.command == "compose-dsn":
            print(server_dsn())
        elif args.command == "compose-kill-segment":
            kill_segment(args.name)
        elif args.command == "compose-down":
            compose_down()
    except (ClusterError, subprocess.CalledProcessError, OSError) as error:
        return command_failed("madlib_mop.tools.containers", error)
    return 0


if __name__ == "__main__":
    sys.exit(main())
