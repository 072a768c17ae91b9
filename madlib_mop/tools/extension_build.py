"""Builds the PostgreSQL extension's SQL scripts from `sql/` and `udf/`.

`sql/*.sql` hold the extension's SQL in the order of their names.  A PL/Python function
there gives its body as one line `#include "name.py"`; the build puts `udf/name.py` in
its place, behind a short preamble that makes the in-database runtime (this package and
TensorFlow, installed in a virtual environment made from the server's Python) importable
by the server's embedded interpreter.  The runtime's location is fixed when the extension
is built, so the server needs no environment variable.

Upgrade scripts (`sql/upgrades/madlib_mop--OLD--NEW.sql`) hold what an update must change
by hand (dropped functions, catalog data); a line `-- @routines` in them becomes every
routine of this version as `CREATE OR REPLACE` (with its comment), so that the routines
of an updated extension are those of a fresh install, from one declaration.  A line
`-- @object NAME` becomes that table's or view's statements from this version's install
script; once a later version exists, an earlier update must hold the object as its own
version had it, written out (the build refuses the marker there).

The control file is `madlib_mop.control` at the top of the repository (checked in); its
default_version must be the version built.

Output (in --out):
  madlib_mop--VERSION.sql            the install script of this version
  madlib_mop--OLD--VERSION.sql       upgrade scripts

    python -m madlib_mop.tools.extension_build --version 0.3.0 --out build
"""

from __future__ import annotations

import argparse
import hashlib
import re
import sysconfig
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
EXTENSION = "madlib_mop"
INCLUDE = re.compile(r'^#include "(?P<name>[A-Za-z0-9_]+\.py)"(?P<procedure> as procedure)?\s*$',
                     re.MULTILINE)
# `#plpython "x.py"`: the usual end of a function declaration, its body udf/x.py.
PLPYTHON = re.compile(r'^#plpython "(?P<name>[A-Za-z0-9_]+\.py)"[ \t]*$', re.MULTILINE)
PLPYTHON_STANZA = ('LANGUAGE plpython3u VOLATILE\nSET jit = off  -- TensorFlow\'s LLVM and the JIT\'s '
                   'cannot share a backend\nAS $python$\n#include "{name}"\n$python$;')
# `#procedure NAME FROM FUNCTION`: NAME is a procedure with the function's parameters and
# body, run with CAN_COMMIT = True (it commits as it goes).
PROCEDURE = re.compile(r"^#procedure (?P<name>\w+) FROM (?P<function>\w+)\s*$", re.MULTILINE)
# `#overload PARAM TYPE [WITHOUT P1, P2]`: the function declared just before, again with
# PARAM of another TYPE (no DEFAULT: the call's argument chooses the overload) and without
# the parameters named after WITHOUT; the same body.
OVERLOAD = re.compile(r"^#overload (?P<param>\w+) (?P<type>[\w ]+?)(?: WITHOUT (?P<without>[\w, ]+))?[ \t]*$",
                      re.MULTILINE)
UPGRADE_NAME = re.compile(rf"^{EXTENSION}--(?P<old>[0-9][0-9.]*)--(?P<new>[0-9][0-9.]*)\.sql$")

CONTROL_FILE = REPO_ROOT / f"{EXTENSION}.control"
ROUTINES_MARK = "-- @routines"
# `-- @object NAME` in an upgrade script: the install script's statements of that table or view.
OBJECT_MARK = re.compile(r"^-- @object (?P<name>\w+)[ \t]*$", re.MULTILINE)
# A routine (or its comment) starts a statement; it ends at a line ending in ";" outside
# dollar quotes.
_ROUTINE_START = re.compile(
    r"^(CREATE (FUNCTION|PROCEDURE|AGGREGATE)|COMMENT ON (FUNCTION|PROCEDURE|AGGREGATE)) |^DO \$routines\$")
_DOLLAR_TAG = re.compile(r"\$[A-Za-z_]*\$")

PREAMBLE = """\
# ---- madlib_mop: make the in-database runtime importable (generated) ----
import sys
if {site!r} not in sys.path:
    import site
    _path_before = list(sys.path)
    site.addsitedir({site!r})
    # The runtime's packages come first, ahead of any the system Python may carry.
    sys.path[:] = [p for p in sys.path if p not in _path_before] + _path_before
    del _path_before
CAN_COMMIT = {can_commit}  # a procedure (CALL): it may commit as it goes
# ---- end of preamble ----
"""


class BuildError(ValueError):
    """The SQL sources are inconsistent (missing or unused function body, bad name)."""


def _version_key(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version.split("."))


def expand_includes(sql: str, udf_dir: Path, site_packages: str, used: set[str]) -> str:
    """Replace each `#include "x.py"` line by the preamble and the body of udf/x.py."""

    def body(match: re.Match) -> str:
        name = match.group("name")
        path = udf_dir / name
        if not path.exists():
            raise BuildError(f'#include "{name}": {path} does not exist')
        used.add(name)
        text = path.read_text(encoding="utf-8")
        if "$python$" in text:
            raise BuildError(f"{path} contains the dollar-quote tag $python$")
        # run pins the search_path and reports errors; run_pure (no SQL) reports errors
        if "run(plpy, " not in text and "run_pure(plpy, " not in text:
            raise BuildError(f"{path} does not call madlib_mop.plpy_bridge.run(plpy, ...)")
        return PREAMBLE.format(site=site_packages, can_commit=bool(match.group("procedure"))) \
            + text.rstrip("\n")

    return INCLUDE.sub(body, expand_declarations(sql))


def build_id_statements(version: str, fingerprint: str) -> str:
    """build_id(), which the install script ends with: which build of its version it is."""
    return (f"CREATE FUNCTION @extschema@.build_id()\nRETURNS text\n"
            f"LANGUAGE sql IMMUTABLE SET search_path = pg_catalog, pg_temp "
            f"AS $$ SELECT '{version}+{fingerprint}'::text $$;\n"
            "COMMENT ON FUNCTION @extschema@.build_id() IS\n"
            "    'Which build of its version the installed extension is: the version and a digest of its script';\n")


def expand_declarations(sql: str) -> str:
    """A source file's declarations as PostgreSQL reads them, bodies still `#include` lines:
    `#overload`, `#plpython` and `#procedure` lines replaced by what they stand for."""
    return expand_procedures(PLPYTHON.sub(lambda m: PLPYTHON_STANZA.format(name=m.group("name")),
                                          expand_overloads(sql)))


def _parameter_list(sql: str, open_paren: int) -> tuple[str, int]:
    """The text between the parenthesis at `open_paren` and its match, and the index after."""
    depth, end = 1, open_paren + 1
    while depth:
        depth += {"(": 1, ")": -1}.get(sql[end], 0)
        end += 1
    return sql[open_paren + 1:end - 1], end


def _split_parameters(text: str) -> list[str]:
    """A parameter list's items (comments dropped), split at the top level's commas (not
    those of a quoted default or of an ARRAY[...])."""
    items, depth, item, quoted, k = [], 0, "", False, 0
    text += ","
    while k < len(text):
        char = text[k]
        if not quoted and text.startswith("--", k):  # a comment, to the end of its line
            k = text.find("\n", k) if "\n" in text[k:] else len(text) - 1
            continue
        if char == "'":
            quoted = not quoted
        if char == "," and depth == 0 and not quoted:
            if item.strip():
                items.append(" ".join(item.split()))
            item = ""
        else:
            if not quoted:
                depth += {"(": 1, ")": -1, "[": 1, "]": -1}.get(char, 0)
            item += char
        k += 1
    return items


def expand_overloads(sql: str) -> str:
    """Replace each `#overload` line by the overload it describes (see OVERLOAD)."""

    def overload(match: re.Match) -> str:
        start = sql.rfind("CREATE FUNCTION @extschema@.", 0, match.start())
        body = PLPYTHON.search(sql, start)
        if start < 0 or body is None or body.start() > match.start():
            raise BuildError(f"{match.group(0)!r}: no PL/Python function declared before it")
        head = sql.index("(", start)
        parameters, after = _parameter_list(sql, head)
        param, kind = match.group("param"), match.group("type").strip()
        without = {w.strip() for w in (match.group("without") or "").split(",") if w.strip()}
        items, found = [], False
        for item in _split_parameters(parameters):
            name = item.split()[0]
            if name in without:
                without.discard(name)
                continue
            if name == param:
                item, found = f"{name} {kind}", True
            items.append(item)
        if not found or without:
            raise BuildError(f"{match.group(0)!r}: {sql[start:head]} has no parameter "
                             f"{param if not found else ', '.join(sorted(without))}")
        return (sql[start:head] + "(\n    " + ",\n    ".join(items) + "\n)"
                + sql[after:body.end()])

    return OVERLOAD.sub(overload, sql)


def expand_procedures(sql: str) -> str:
    """Replace each `#procedure NAME FROM FUNCTION` line by that procedure, declared from the
    function's own parameters and body (one declaration for both call forms)."""

    def procedure(match: re.Match) -> str:
        function, name = match.group("function"), match.group("name")
        head = f"CREATE FUNCTION @extschema@.{function}("
        start = sql.find(head)
        if start < 0:
            raise BuildError(f"#procedure {name}: no function {function} in the same file")
        depth, end = 1, start + len(head)
        while depth:  # the parameter list's closing parenthesis
            depth += {"(": 1, ")": -1}.get(sql[end], 0)
            end += 1
        body = INCLUDE.search(sql, end)
        if body is None:
            raise BuildError(f"#procedure {name}: function {function} has no #include body")
        return (f"CREATE PROCEDURE @extschema@.{name}({sql[start + len(head):end - 1]})\n"
                f"LANGUAGE plpython3u\nAS $python$\n#include \"{body.group('name')}\" as procedure\n"
                "$python$;")

    return PROCEDURE.sub(procedure, sql)


def statements_starting(script: str, start: re.Pattern) -> list[str]:
    """The statements of a script whose first line matches `start`, in order: each ends at
    a line ending in ";" outside dollar quotes."""
    statements, current, quote = [], None, None
    for line in script.splitlines(keepends=True):
        if current is None:
            if not start.match(line):
                continue
            current = []
        current.append(line)
        for tag in _DOLLAR_TAG.findall(line):
            quote = None if quote == tag else (quote or tag)
        if quote is None and line.rstrip().endswith(";"):
            statements.append("".join(current))
            current = None
    return statements


def routine_statements(script: str) -> list[str]:
    """The CREATE FUNCTION / PROCEDURE / AGGREGATE statements of a script (and COMMENT ON
    them, and `DO $routines$` blocks that create routines), in order, as CREATE OR REPLACE."""
    return [re.sub(r"^CREATE ", "CREATE OR REPLACE ", statement)
            for statement in statements_starting(script, _ROUTINE_START)]


def object_statements(script: str, name: str) -> str:
    """The statements of a script that create, alter, comment on or grant the table or view
    `name` of the extension's schema, or create its policies: an upgrade that adds the
    object, or drops a view to change its columns, puts these (`-- @object NAME`), so that
    an updated extension has the object of a fresh one."""
    target = re.compile(rf"^(CREATE|COMMENT|GRANT|ALTER)\b.* @extschema@\.{re.escape(name)}\b")
    statements = statements_starting(script, target)
    if not statements:
        raise BuildError(f"-- @object {name}: no statement of @extschema@.{name} in the install script")
    return "".join(statements)


def check_control(version: str, control: Path = CONTROL_FILE) -> None:
    found = re.search(r"^default_version\s*=\s*'([^']+)'", control.read_text(encoding="utf-8"), re.M)
    if found is None or found.group(1) != version:
        raise BuildError(f"{control.name}: default_version is "
                         f"{found.group(1) if found else 'missing'}, the version built is {version}")


def build(version: str, out: Path, site_packages: str,
          sql_dir: Path = REPO_ROOT / "sql", udf_dir: Path = REPO_ROOT / "udf",
          control: Path = CONTROL_FILE) -> list[Path]:
    if not re.fullmatch(r"[0-9]+(\.[0-9]+)*", version):
        raise BuildError(f"version {version!r} is not of the form 1.2.3")
    check_control(version, control)
    sources = sorted(sql_dir.glob("*.sql"))
    if not sources:
        raise BuildError(f"no SQL sources in {sql_dir}")
    used: set[str] = set()
    out.mkdir(parents=True, exist_ok=True)
    for stale in out.glob(f"{EXTENSION}--*.sql"):
        stale.unlink()

    parts = [
        f"-- {EXTENSION} {version}: generated from sql/ and udf/ by madlib_mop.tools.extension_build\n",
        "\\echo Use \"CREATE EXTENSION madlib_mop\" to load this file. \\quit\n",
    ]
    for source in sources:
        parts.append(f"\n-- ==== {source.name} ====\n")
        parts.append(expand_includes(source.read_text(encoding="utf-8"), udf_dir, site_packages, used))
    body = "".join(parts)
    # Which build this is: lets a development database notice that its extension is stale
    # although the version number is the same.
    fingerprint = hashlib.sha256(body.encode()).hexdigest()[:16]
    body += "\n-- ==== build ====\n" + build_id_statements(version, fingerprint)
    routines = "".join(statement + "\n" for statement in routine_statements(body))
    written = [out / f"{EXTENSION}--{version}.sql"]
    written[0].write_text(body, encoding="utf-8")

    for upgrade in sorted((sql_dir / "upgrades").glob("*.sql")):
        match = UPGRADE_NAME.match(upgrade.name)
        if not match or _version_key(match.group("new")) > _version_key(version):
            raise BuildError(
                f"{upgrade.name}: upgrade scripts are named {EXTENSION}--OLD--NEW.sql "
                f"with NEW at most {version}"
            )
        text = expand_includes(upgrade.read_text(encoding="utf-8"), udf_dir, site_packages, used)
        if match.group("new") == version:
            if ROUTINES_MARK not in text:
                raise BuildError(f"{upgrade.name}: no line {ROUTINES_MARK!r} (where this "
                                 "version's routines go)")
            text = text.replace(ROUTINES_MARK, f"-- this version's routines (generated)\n{routines}")
            text = OBJECT_MARK.sub(lambda m: f"-- {m.group('name')} (generated)\n"
                                   + object_statements(body, m.group("name")), text)
        elif OBJECT_MARK.search(text):
            # Expanded from this version's install script, the object would be this
            # version's (or missing); an update through OLD--NEW needs NEW's, written out.
            raise BuildError(f"{upgrade.name}: '-- @object' in a script to an earlier version than "
                             f"{version}: write the object's statements of that version in its place")
        target = out / upgrade.name
        target.write_text(text, encoding="utf-8")
        written.append(target)

    unused = sorted({p.name for p in udf_dir.glob("*.py")} - used)
    if unused:
        raise BuildError(f"udf bodies included by no SQL source: {', '.join(unused)}")

    return written


def built_id(out: Path = REPO_ROOT / "build", version: str | None = None) -> str | None:
    """The build_id() of the install script in `out` (None if there is none)."""
    scripts = sorted(out.glob(f"{EXTENSION}--{version or '*'}.sql"))
    scripts = [p for p in scripts if UPGRADE_NAME.match(p.name) is None]
    if not scripts:
        return None
    found = re.search(r"AS \$\$ SELECT '([^']+)'::text \$\$;", scripts[-1].read_text(encoding="utf-8"))
    return found.group(1) if found else None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Build the madlib_mop extension files.")
    parser.add_argument("--version", required=True)
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "build")
    parser.add_argument(
        "--site-packages",
        default=sysconfig.get_paths()["purelib"],
        help="site-packages of the in-database runtime (default: this interpreter's)",
    )
    args = parser.parse_args(argv)
    for path in build(args.version, args.out, str(Path(args.site_packages).resolve())):
        print(f"built {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
