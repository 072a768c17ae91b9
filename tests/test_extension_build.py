"""The extension build (no database): includes, preamble, consistency checks."""

from __future__ import annotations

import re

import pytest

import madlib_mop

from madlib_mop.tools.extension_build import PREAMBLE, REPO_ROOT, BuildError, build


def _write(path, text):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


BODY = "from madlib_mop.plpy_bridge import run\nreturn run(plpy, lambda plpy: 41 + 1)\n"


def _build(version, out, site, sources):
    """Build the sources with a control file of that version."""
    _write(sources / "madlib_mop.control", f"default_version = '{version}'\n")
    return build(version, out, site, sources / "sql", sources / "udf", sources / "madlib_mop.control")


@pytest.fixture
def sources(tmp_path):
    _write(tmp_path / "sql" / "10_f.sql",
           'CREATE FUNCTION @extschema@.f() RETURNS int LANGUAGE plpython3u AS $python$\n'
           '#include "f.py"\n$python$;\n')
    _write(tmp_path / "udf" / "f.py", BODY)
    return tmp_path


def test_include_becomes_preamble_and_body(sources, tmp_path):
    written = _build("1.2.0", tmp_path / "out", "/opt/runtime/site-packages", sources)
    script = (tmp_path / "out" / "madlib_mop--1.2.0.sql").read_text()
    assert '#include' not in script
    assert PREAMBLE.format(site="/opt/runtime/site-packages", can_commit=False) + BODY + "$python$;" in script
    assert script.startswith("-- madlib_mop 1.2.0")
    assert "\\quit" in script.splitlines()[1]
    assert {p.name for p in written} == {"madlib_mop--1.2.0.sql"}


def test_the_control_file_is_of_the_version_built(sources, tmp_path):
    control = (REPO_ROOT / "madlib_mop.control").read_text()
    assert "relocatable = false" in control and "\nschema" not in control
    assert f"default_version = '{madlib_mop.__version__}'" in control
    _write(sources / "madlib_mop.control", "default_version = '1.0.0'\n")
    with pytest.raises(BuildError, match="default_version is 1.0.0, the version built is 1.1.0"):
        build("1.1.0", tmp_path / "out", "/x", sources / "sql", sources / "udf",
              sources / "madlib_mop.control")


def test_missing_body_is_an_error(sources, tmp_path):
    (sources / "udf" / "f.py").unlink()
    with pytest.raises(BuildError, match=r'#include "f.py".*does not exist'):
        _build("1.0.0", tmp_path / "out", "/x", sources)


def test_body_that_bypasses_the_bridge_is_an_error(sources, tmp_path):
    """Every body goes through plpy_bridge.run, which pins the search_path."""
    _write(sources / "udf" / "f.py", "return plpy.execute('SELECT 1')\n")
    with pytest.raises(BuildError, match="does not call madlib_mop.plpy_bridge.run"):
        _build("1.0.0", tmp_path / "out", "/x", sources)


def test_unused_body_is_an_error(sources, tmp_path):
    _write(sources / "udf" / "orphan.py", BODY)
    with pytest.raises(BuildError, match="orphan.py"):
        _build("1.0.0", tmp_path / "out", "/x", sources)


def test_upgrade_scripts_follow_the_naming_convention(sources, tmp_path):
    _write(sources / "sql" / "upgrades" / "madlib_mop--1.0.0--1.1.0.sql",
           "DROP FUNCTION @extschema@.g();\n-- @routines\n")
    written = _build("1.1.0", tmp_path / "out", "/x", sources)
    assert "madlib_mop--1.0.0--1.1.0.sql" in {p.name for p in written}
    upgrade = (tmp_path / "out" / "madlib_mop--1.0.0--1.1.0.sql").read_text()
    # the hand-written part, then every routine of the new version, replaced
    assert upgrade.index("DROP FUNCTION @extschema@.g()") < upgrade.index(
        "CREATE OR REPLACE FUNCTION @extschema@.f() RETURNS int")
    assert "41 + 1" in upgrade and "CREATE OR REPLACE FUNCTION @extschema@.build_id()" in upgrade
    assert "-- @routines" not in upgrade
    # An upgrade to a version after the one being built is a mistake.
    with pytest.raises(BuildError, match="at most 1.0.0"):
        _build("1.0.0", tmp_path / "out2", "/x", sources)
    _write(sources / "sql" / "upgrades" / "upgrade.sql", "")
    with pytest.raises(BuildError, match="named madlib_mop--OLD--NEW.sql"):
        _build("1.1.0", tmp_path / "out3", "/x", sources)


def test_an_object_marker_is_expanded_only_in_the_latest_upgrade(sources, tmp_path):
    """`-- @object` takes the object as this version's install script has it: right for the
    update to this version, wrong in an earlier update of a chain, which must be written out."""
    _write(sources / "sql" / "10_f.sql", (sources / "sql" / "10_f.sql").read_text()
           + "CREATE VIEW @extschema@.v AS SELECT 1 AS one;\n")
    _write(sources / "sql" / "upgrades" / "madlib_mop--1.0.0--1.1.0.sql", "-- @object v\n-- @routines\n")
    _build("1.1.0", tmp_path / "out", "/x", sources)
    assert "CREATE VIEW @extschema@.v AS SELECT 1" in (tmp_path / "out" / "madlib_mop--1.0.0--1.1.0.sql").read_text()
    _write(sources / "sql" / "upgrades" / "madlib_mop--1.1.0--1.2.0.sql", "-- @routines\n")
    with pytest.raises(BuildError, match="1.0.0--1.1.0.sql: '-- @object' in a script to an earlier version"):
        _build("1.2.0", tmp_path / "out2", "/x", sources)


def test_version_must_look_like_a_version(sources, tmp_path):
    with pytest.raises(BuildError, match="not of the form"):
        _build("1.0; DROP", tmp_path / "out", "/x", sources)


def test_the_project_sources_build(tmp_path):
    build(madlib_mop.__version__, tmp_path, "/opt/site-packages")
    script = (tmp_path / f"madlib_mop--{madlib_mop.__version__}.sql").read_text()
    functions = re.findall(r"CREATE FUNCTION @extschema@\.(\w+)\(", script)
    bodies = script.count(PREAMBLE.format(site="/opt/site-packages", can_commit=False))
    assert "version" in functions and "runtime_check" in functions
    # One body per PL/Python declaration (overloads such as madlib_keras_predict's share a
    # file), and every file of udf/ is some function's body.
    sources = "".join(path.read_text() for path in (REPO_ROOT / "sql").glob("*.sql"))
    used = set(re.findall(r'^#(?:plpython|include) "(\w+\.py)"', sources, re.MULTILINE))
    assert bodies == len(re.findall(r'^#(?:plpython|include) "|^#overload ', sources, re.MULTILINE))
    assert used == {path.name for path in (REPO_ROOT / "udf").glob("*.py")}


def _built(sources, tmp_path, sql: str) -> str:
    """The install script built from `sql` as the one SQL source."""
    _write(sources / "sql" / "10_f.sql", sql)
    _build("1.0.0", tmp_path / "out", "/x", sources)
    return (tmp_path / "out" / "madlib_mop--1.0.0.sql").read_text()


def test_a_procedure_is_declared_from_its_function(sources, tmp_path):
    script = _built(sources, tmp_path,
                    "CREATE FUNCTION @extschema@.f(a integer, b text DEFAULT 'x(y)')\nRETURNS int\n"
                    "LANGUAGE plpython3u VOLATILE\nAS $python$\n#include \"f.py\"\n$python$;\n\n"
                    "#procedure p FROM f\n")
    procedure = script[script.index("CREATE PROCEDURE"):]
    assert procedure.startswith("CREATE PROCEDURE @extschema@.p(a integer, b text DEFAULT 'x(y)')\n"
                                "LANGUAGE plpython3u\nAS $python$\n")
    assert "CAN_COMMIT = True" in procedure and "41 + 1" in procedure
    assert "CAN_COMMIT = False" in script[:script.index("CREATE PROCEDURE")]
    _write(sources / "sql" / "10_f.sql", "#procedure p FROM missing\n")
    with pytest.raises(BuildError, match="no function missing"):
        _build("1.0.0", tmp_path / "out", "/x", sources)


def test_an_overload_is_declared_from_the_function_before_it(sources, tmp_path):
    script = _built(sources, tmp_path,
                    "CREATE FUNCTION @extschema@.f(\n    a integer,\n    kind varchar DEFAULT 'x, y',  -- a, b\n"
                    "    extra integer[] DEFAULT ARRAY[1, 2]\n)\nRETURNS void\n#plpython \"f.py\"\n\n"
                    "#overload kind double precision\n#overload kind integer WITHOUT extra\n")
    heads = re.findall(r"CREATE FUNCTION @extschema@\.f\((.*?)\n\)", script, re.DOTALL)
    assert [" ".join(h.split()) for h in heads[1:]] == [
        "a integer, kind double precision, extra integer[] DEFAULT ARRAY[1, 2]",
        "a integer, kind integer"]
    assert script.count("41 + 1") == 3  # each overload has the body
    declared = (sources / "sql" / "10_f.sql").read_text()
    for bad, message in (("#overload nothing integer", "has no parameter nothing"),
                         ("#overload kind integer WITHOUT nothing", "has no parameter nothing")):
        _write(sources / "sql" / "10_f.sql", declared + bad + "\n")
        with pytest.raises(BuildError, match=message):
            _build("1.0.0", tmp_path / "out", "/x", sources)
    _write(sources / "sql" / "10_f.sql", "#overload kind integer\n" + declared)
    with pytest.raises(BuildError, match="no PL/Python function declared before it"):
        _build("1.0.0", tmp_path / "out", "/x", sources)
