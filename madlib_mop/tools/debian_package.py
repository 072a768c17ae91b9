"""`make deb`: the Debian package of the server side, postgresql-15-madlib-mop_<version>_amd64.deb,
built with Debian's own tooling for PostgreSQL extensions (debhelper, pg_buildext; see
debian/rules) from a copy of the sources, so that the checkout gets no build output.

    python -m madlib_mop.tools.debian_package build [--ref GIT_REF] [--out build/deb]
    python -m madlib_mop.tools.debian_package requirements [PYPROJECT]

`build` copies the checkout's files (tracked and not ignored, as they are now), or those of
a git commit (`--ref`: an earlier version's package, for upgrade tests), adds this
version's debian/ folder, trims debian/changelog to the versions up to the copy's own, writes
the runtime's pinned requirements (debian/runtime-requirements.txt, installed by the
package and read by its postinst), and runs `dpkg-buildpackage -b`.  It prints the .deb's
path.

Standard library only: it runs before any virtual environment exists.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_OUT = REPO_ROOT / "build" / "deb"
PACKAGE = "postgresql-15-madlib-mop"
# A changelog entry's first line: "madlib-mop (0.11.0-1) bookworm; urgency=medium".
ENTRY = re.compile(r"^madlib-mop \((?P<upstream>[^-()]+)-(?P<revision>[^()]+)\)", re.M)


class PackageError(Exception):
    """What stops a build, said for the person who ran it."""


def runtime_requirements(pyproject: Path) -> list[str]:
    """The in-database runtime's pinned packages: the project's dependencies and its
    `server` extra (versions before the extra existed kept them all in the dependencies)."""
    project = tomllib.loads(pyproject.read_text(encoding="utf-8"))["project"]
    return list(project["dependencies"]) + list(project.get("optional-dependencies", {}).get("server", []))


def project_version(pyproject: Path) -> str:
    return tomllib.loads(pyproject.read_text(encoding="utf-8"))["project"]["version"]


def _git(*argv: str) -> str:
    return subprocess.run(["git", "-C", str(REPO_ROOT), *argv], check=True, capture_output=True,
                          text=True).stdout


def previous_release() -> tuple[str, str] | None:
    """(version, commit): the previous version's last state, the parent of the commit that
    set the checkout's version in pyproject.toml; None when the history holds no earlier
    version (a shallow clone)."""
    current = project_version(REPO_ROOT / "pyproject.toml")
    bump = None
    for commit in _git("log", "--format=%H", "--", "pyproject.toml").split():
        version = tomllib.loads(_git("show", f"{commit}:pyproject.toml"))["project"]["version"]
        if version != current:
            return (version, _git("rev-parse", f"{bump}^").strip()) if bump else None
        bump = commit
    return None


def changelog_up_to(changelog: str, version: str) -> str:
    """The changelog's entries from `version`'s on (the newest first, as Debian's are)."""
    starts = [(m.start(), m.group("upstream")) for m in ENTRY.finditer(changelog)]
    for start, upstream in starts:
        if upstream == version:
            return changelog[start:]
    listed = ", ".join(upstream for _, upstream in starts)
    raise PackageError(f"debian/changelog has no entry for version {version} (it lists {listed}); "
                       "add one at the top")


def _copy_sources(ref: str | None, into: Path) -> None:
    if ref is None:
        listed = subprocess.run(["git", "-C", str(REPO_ROOT), "ls-files", "-z", "--cached", "--others",
                                 "--exclude-standard"], check=True, capture_output=True).stdout
        for name in filter(None, listed.decode().split("\0")):
            source = REPO_ROOT / name
            if source.is_file():  # a tracked file deleted in the checkout is not copied
                (into / name).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(source, into / name)
        return
    archive = subprocess.Popen(["git", "-C", str(REPO_ROOT), "archive", "--format=tar", ref],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    unpacked = subprocess.run(["tar", "-x", "-C", str(into)], stdin=archive.stdout, capture_output=True)
    error = archive.stderr.read().decode().strip()
    if archive.wait() != 0 or unpacked.returncode != 0:
        raise PackageError(f"git cannot read {ref!r}: {error or unpacked.stderr.decode().strip()}")


def build(ref: str | None = None, out: Path = DEFAULT_OUT) -> Path:
    """The package of the checkout (or of git commit `ref`), in `out`; its path."""
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out, prefix="source-") as work:
        source = Path(work) / "madlib-mop"
        source.mkdir()
        _copy_sources(ref, source)
        version = project_version(source / "pyproject.toml")
        shutil.rmtree(source / "debian", ignore_errors=True)
        shutil.copytree(REPO_ROOT / "debian", source / "debian")
        changelog = source / "debian" / "changelog"
        changelog.write_text(changelog_up_to(changelog.read_text(encoding="utf-8"), version),
                             encoding="utf-8")
        (source / "debian" / "runtime-requirements.txt").write_text(
            "\n".join(runtime_requirements(source / "pyproject.toml")) + "\n", encoding="utf-8")
        revision = ENTRY.search(changelog.read_text(encoding="utf-8")).group("revision")
        built = subprocess.run(["dpkg-buildpackage", "-us", "-uc", "-b"], cwd=source,
                               capture_output=True, text=True)
        if built.returncode != 0:
            raise PackageError("dpkg-buildpackage failed:\n" + "\n".join(
                (built.stdout + built.stderr).splitlines()[-40:]))
        deb = Path(work) / f"{PACKAGE}_{version}-{revision}_amd64.deb"
        if not deb.exists():
            raise PackageError(f"dpkg-buildpackage made no {deb.name}")
        target = out / deb.name
        shutil.move(deb, target)
        return target


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m madlib_mop.tools.debian_package",
                                     description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    make = commands.add_parser("build", help="build the .deb and print its path")
    make.add_argument("--ref", help="a git commit to package instead of the checkout (an earlier version)")
    make.add_argument("--out", type=Path, default=DEFAULT_OUT, help="where the .deb goes (build/deb)")
    needs = commands.add_parser("requirements", help="print the runtime's pinned packages")
    needs.add_argument("pyproject", type=Path, nargs="?", default=REPO_ROOT / "pyproject.toml")
    args = parser.parse_args(argv)
    try:
        if args.command == "requirements":
            print("\n".join(runtime_requirements(args.pyproject)))
        else:
            print(build(args.ref, args.out.resolve()))
    except (PackageError, subprocess.CalledProcessError) as error:
        print(f"madlib_mop.tools.debian_package: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
