"""The Debian package (`make deb`): its contents, then, in a fresh Debian 12 container, as a
DBA meets it:
PostgreSQL 15 from Debian's packages, the previous version's package, MADlib's iris
walkthrough as an analyst over TCP, this version's package over it and `ALTER EXTENSION
... UPDATE` (the old model predicts as before), the README's block (install, the
authentication command, a fresh CREATE EXTENSION and a walkthrough), then `apt remove`: the
server keeps running and the extension's files and runtime are gone.

A container of the base image (`make images`), host networking, its cluster on a free
port of the loopback; part of `make test-containers`.  The packages' install times are
printed (pytest -s).
"""

from __future__ import annotations

import secrets
import subprocess
import time
import uuid

import psycopg
import pytest
from psycopg.conninfo import make_conninfo

from madlib_mop.tools import containers
from madlib_mop.tools.debian_package import (PACKAGE, PackageError, changelog_up_to, previous_release,
                                             project_version)
from tests import docs
from tests.conftest import REPO_ROOT, _free_port, _uses_containers, iris_table, mlp_json

VERSION = project_version(REPO_ROOT / "pyproject.toml")
ANALYST = "alice"
EXTENSION_FILES = ("/usr/share/postgresql/15/extension/madlib_mop.control",
                   "/usr/lib/postgresql/15/lib/madlib_mop.so", "/usr/lib/madlib_mop", "/usr/bin/madlib-mop-server-auth")


def _make_deb(*variables: str) -> str:
    built = subprocess.run(["make", "-s", "deb", *variables], cwd=REPO_ROOT, capture_output=True, text=True)
    assert built.returncode == 0, built.stdout + built.stderr
    return built.stdout.strip().splitlines()[-1]


class Debian:
    """A fresh Debian 12 container (host networking) where the test runs commands as root."""

    def __init__(self, name: str, port: int):
        self.name, self.port = name, port

    def sh(self, script: str, check: bool = True, timeout: float = 1800, **environment: str
           ) -> subprocess.CompletedProcess:
        flags = [arg for key, value in environment.items() for arg in ("-e", f"{key}={value}")]
        done = subprocess.run(["docker", "exec", "-w", "/src", "-e", f"PGPORT={self.port}",
                               "-e", "DEBIAN_FRONTEND=noninteractive", *flags, self.name,
                               "bash", "-c", "set -euo pipefail\n" + script],
                              capture_output=True, text=True, timeout=timeout)
        if check:
            assert done.returncode == 0, f"{script}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
        return done

    def psql(self, sql: str, dbname: str = "postgres") -> str:
        """As the superuser, over the socket (Debian's `local all postgres peer`)."""
        return self.sh(f"runuser -u postgres -- psql -X -A -t -v ON_ERROR_STOP=1 -d {dbname} <<'SQL'\n{sql}\nSQL"
                       ).stdout.strip()

    def pip_environment(self) -> dict[str, str]:
        """The build machine's pip index settings and CAs (docker/host/, as image builds use)."""
        environment = {"PIP_CONFIG_FILE": "/etc/madlib_mop-build/pip.conf"}
        if (containers.HOST_FOLDER / "ca-certificates.crt").stat().st_size:
            environment["PIP_CERT"] = "/etc/madlib_mop-build/ca-certificates.crt"
        return environment

    def apt_install(self, what: str) -> float:
        """`apt install` (the postinst's pip install included); its seconds."""
        started = time.monotonic()
        self.sh(f"apt-get install -y -q {what}", **self.pip_environment())
        return time.monotonic() - started

    def dsn(self, dbname: str, password: str) -> str:
        return make_conninfo(host="127.0.0.1", port=self.port, user=ANALYST, password=password, dbname=dbname)


def test_make_deb_builds_the_package_of_this_version(tmp_path):
    """Without Docker: the package's files, the runtime's place the extension names, and
    maintainer scripts that leave the server's configuration alone."""
    deb = _make_deb()
    assert deb.endswith(f"/{PACKAGE}_{VERSION}-1_amd64.deb")
    listed = subprocess.run(["dpkg-deb", "-c", deb], check=True, capture_output=True, text=True).stdout
    for path in ("/usr/share/postgresql/15/extension/madlib_mop.control",
                 f"/usr/share/postgresql/15/extension/madlib_mop--{VERSION}.sql",
                 "/usr/lib/postgresql/15/lib/madlib_mop.so", "/usr/bin/madlib-mop-server-auth",
                 "/usr/share/madlib_mop/runtime-requirements.txt",
                 "/usr/lib/madlib_mop/python/madlib_mop/runtime/training.py"):
        assert f".{path}\n" in listed, path
    assert "__pycache__" not in listed and "/tests/" not in listed
    subprocess.run(["dpkg-deb", "-x", deb, str(tmp_path)], check=True)
    script = (tmp_path / f"usr/share/postgresql/15/extension/madlib_mop--{VERSION}.sql").read_text()
    assert "site.addsitedir('/usr/lib/madlib_mop/runtime/lib/python3.11/site-packages')" in script
    assert str(REPO_ROOT) not in script  # nothing of the checkout the package was built in
    pins = (tmp_path / "usr/share/madlib_mop/runtime-requirements.txt").read_text().split()
    assert "tensorflow==2.21.0" in pins and not [p for p in pins if "==" not in p]
    assert not [p for p in pins if p.lower().startswith(("sqlalchemy", "flask", "pytest"))]
    subprocess.run(["dpkg-deb", "-e", deb, str(tmp_path / "control")], check=True)
    for name in ("postinst", "prerm", "postrm"):
        text = (tmp_path / "control" / name).read_text()
        assert "pg_hba" not in text.replace("pg_hba.conf or pg_ident.conf", "") and "ALTER SYSTEM" not in text


def test_the_changelog_names_this_version_first():
    changelog = (REPO_ROOT / "debian" / "changelog").read_text()
    assert changelog.startswith(f"madlib-mop ({VERSION}-1) ")
    previous = previous_release()
    if previous is not None:
        assert changelog_up_to(changelog, previous[0]).startswith(f"madlib-mop ({previous[0]}-")
    with pytest.raises(PackageError, match="no entry for version 9.9.9"):
        changelog_up_to(changelog, "9.9.9")


@pytest.fixture(scope="module")
def packages() -> dict[str, str]:
    """This version's package and the previous version's, built by `make deb`."""
    if not _uses_containers():
        pytest.skip("Docker: run by make test-containers")
    previous = previous_release()
    if previous is None:
        pytest.skip("the git history holds no earlier version (a shallow clone)")
    return {"current": _make_deb(), "previous": _make_deb(f"DEB_REF={previous[1]}"),
            "previous_version": previous[0]}


@pytest.fixture(scope="module")
def debian(packages) -> Debian:
    containers.start_engine()
    containers.build_base_image()
    containers.write_host_settings()
    server = Debian(f"mop-deb-{uuid.uuid4().hex[:8]}", _free_port())
    subprocess.run(["docker", "run", "-d", "--network", "host", "--name", server.name,
                    "-v", f"{REPO_ROOT / 'build' / 'deb'}:/src/build/deb:ro",
                    "-v", f"{containers.HOST_FOLDER}:/etc/madlib_mop-build:ro",
                    containers.BASE_IMAGE, "sleep", "infinity"], check=True, capture_output=True)
    try:
        # PostgreSQL 15 from Debian, its cluster made by pg_createcluster on the free port (UTF-8:
        # a container has no locale of its own, and the cluster would take SQL_ASCII).
        server.sh("mkdir -p /etc/postgresql-common/createcluster.d\n"
                  "echo 'create_main_cluster = false' > /etc/postgresql-common/createcluster.d/test.conf\n"
                  "apt-get update -q\n"
                  "apt-get install -y -q --no-install-recommends postgresql-15 postgresql-plpython3-15 sudo\n"
                  f"pg_createcluster 15 main --port {server.port} --locale C.UTF-8 --start")
        yield server
    finally:
        subprocess.run(["docker", "rm", "-f", "-v", server.name], capture_output=True)


@pytest.fixture(scope="module")
def analyst(debian) -> str:
    """alice, an analyst who logs in over TCP with her password (README step 5)."""
    password = secrets.token_urlsafe(16)
    debian.psql(f"CREATE ROLE {ANALYST} LOGIN PASSWORD '{password}'")
    return password


def _walkthrough(dsn: str) -> list[tuple]:
    """MADlib's iris walkthrough (pack, fit, predict); the predictions."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SET search_path = public, madlib_mop")
        iris_table(conn)
        conn.execute("SELECT training_preprocessor_dl('iris', 'iris_packed', 'class_text', 'attributes')")
        conn.execute("SELECT load_keras_model('model_arch_library', %s::json)", (mlp_json(4, 8, 3),))
        conn.execute("SELECT madlib_keras_fit('iris_packed', 'iris_model', 'model_arch_library', 1, "
                     "$$loss='categorical_crossentropy', optimizer='Adam(learning_rate=0.01)', "
                     "metrics=['accuracy']$$, $$batch_size=16, epochs=1$$, 2)")
        return _predictions(conn)


def _predictions(conn: psycopg.Connection) -> list[tuple]:
    conn.execute("SET search_path = public, madlib_mop")
    conn.execute("DROP TABLE IF EXISTS iris_predict")
    conn.execute("SELECT madlib_keras_predict('iris_model', 'iris', 'id', 'attributes', 'iris_predict', 'prob')")
    return conn.execute("SELECT id, class_value, prob FROM iris_predict ORDER BY id, class_value").fetchall()


def _database_for(debian: Debian, name: str) -> None:
    debian.psql(f"CREATE DATABASE {name}")
    debian.psql(f"GRANT CREATE ON SCHEMA public TO {ANALYST}", dbname=name)


def test_the_previous_package_installs_and_trains(debian, packages, analyst):
    seconds = debian.apt_install(f"./build/deb/{packages['previous'].rsplit('/', 1)[1]}")
    print(f"\napt install of {packages['previous'].rsplit('/', 1)[1]} (its runtime with pip): {seconds:.0f} s")
    debian.sh(f"madlib-mop-server-auth configure 15 main && madlib-mop-server-auth allow 15 main {ANALYST}")
    debian.psql("ALTER SYSTEM SET jit = off; SELECT pg_reload_conf()")
    _database_for(debian, "before")
    debian.psql("CREATE SCHEMA madlib_mop; CREATE EXTENSION madlib_mop SCHEMA madlib_mop CASCADE; "
                f"GRANT USAGE ON SCHEMA madlib_mop TO {ANALYST}", dbname="before")
    assert debian.psql("SELECT extversion FROM pg_extension WHERE extname = 'madlib_mop'",
                       dbname="before") == packages["previous_version"]
    predictions = _walkthrough(debian.dsn("before", analyst))
    assert len(predictions) == 150 * 3
    packages["predictions"] = predictions


def test_this_package_upgrades_it_and_the_readme_block_runs(debian, packages, analyst):
    block = docs.block(docs.page("install.md"), "## From the Debian package", "sh")
    name = packages["current"].rsplit("/", 1)[1]
    assert f"./build/deb/{name}" in block  # the README names this version's package
    _database_for(debian, "analytics")
    started = time.monotonic()
    debian.sh(block, **debian.pip_environment())  # apt install over the previous version: an upgrade
    print(f"\nthe README's block (apt install of {name} over {packages['previous_version']}): "
          f"{time.monotonic() - started:.0f} s")
    # The hba and ident lines the command wrote, once each, and nothing else changed.
    hba = debian.sh("grep -v '^#' /etc/postgresql/15/main/pg_hba.conf | grep -c 'peer map=madlib_mop'").stdout
    assert hba.strip() == "1"
    ident = debian.sh("grep -c '^madlib_mop' /etc/postgresql/15/main/pg_ident.conf").stdout
    assert ident.strip() == "2"  # the identity line, and postgres as alice (once, though run twice)

    # The library preloaded: one cap for every database of the server.
    assert debian.psql("SELECT madlib_mop._mop_pool_shared()", dbname="analytics") == "t"

    debian.psql("ALTER EXTENSION madlib_mop UPDATE", dbname="before")
    assert debian.psql("SELECT extversion FROM pg_extension WHERE extname = 'madlib_mop'",
                       dbname="before") == VERSION
    with psycopg.connect(debian.dsn("before", analyst), autocommit=True) as conn:
        assert _predictions(conn) == packages["predictions"]  # the model trained before the update

    debian.psql(f"GRANT USAGE ON SCHEMA madlib_mop TO {ANALYST}", dbname="analytics")
    assert debian.psql("SELECT extversion FROM pg_extension WHERE extname = 'madlib_mop'",
                       dbname="analytics") == VERSION
    assert len(_walkthrough(debian.dsn("analytics", analyst))) == 150 * 3


def test_apt_remove_leaves_the_server_running(debian, analyst):
    debian.sh(f"apt-get remove -y -q {PACKAGE}")
    for path in EXTENSION_FILES:
        assert debian.sh(f"test -e {path}", check=False).returncode != 0, f"{path} is still there"
    assert debian.sh("ls /usr/share/postgresql/15/extension/ | grep -c madlib_mop", check=False
                     ).stdout.strip() == "0"
    assert debian.sh("pg_lsclusters -h").stdout.split()[3] == "online"
    with psycopg.connect(debian.dsn("analytics", analyst)) as conn:
        assert conn.execute("SELECT count(*) FROM iris").fetchone()[0] == 150  # the data stays
    # A call of the extension now says the runtime is gone, rather than crashing the server.
    with psycopg.connect(debian.dsn("analytics", analyst)) as conn, pytest.raises(psycopg.Error):
        conn.execute("SELECT madlib_mop.madlib_keras_fit('iris_packed', 'gone', 'madlib_mop.model_arch_library', "
                     "1, $$loss='categorical_crossentropy', optimizer='Adam'$$, $$batch_size=16$$, 1)")
    assert debian.sh("pg_lsclusters -h").stdout.split()[3] == "online"
