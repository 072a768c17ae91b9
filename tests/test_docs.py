"""The documentation: a site MkDocs builds with no broken link or anchor, a README that
stays short and whose links resolve, and reference pages that name every object the
extension creates and every setting its library declares."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys

import pytest

from madlib_mop.tools import reference_docs
from madlib_mop.tools.embedded import REPO_ROOT
from tests.conftest import connect
from tests.docs import DOCS, page


def _build(config: str, out) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-f", config, "-d", str(out)],
                          cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)


def test_the_site_builds_with_every_link_and_anchor_resolved(tmp_path):
    built = _build(str(REPO_ROOT / "mkdocs.yml"), tmp_path / "site")
    assert built.returncode == 0, built.stderr
    functions = (tmp_path / "site" / "reference" / "functions.html").read_text()
    assert 'id="madlib_keras_fit_multiple_model"' in functions and "if_output_exists" in functions
    assert "madlib_mop.worker_memory_mb" in (tmp_path / "site" / "reference" / "settings.html").read_text()
    # Every page of docs/ is in the site's navigation (mkdocs.yml), none left out.
    nav = (REPO_ROOT / "mkdocs.yml").read_text()
    assert [p.name for p in DOCS.glob("*.md") if f": {p.name}" not in nav] == []


def test_a_broken_link_or_anchor_fails_the_build(tmp_path):
    """The check can fail: the same site with one link to a missing page, then one to a
    missing heading."""
    config = (REPO_ROOT / "mkdocs.yml").read_text()
    config = config.replace("docs_dir: docs", f"docs_dir: {tmp_path / 'docs'}").replace(
        "  - madlib_mop/tools/reference_docs.py", f"  - {REPO_ROOT / 'madlib_mop/tools/reference_docs.py'}")
    (tmp_path / "mkdocs.yml").write_text(config)
    for link, complaint in [("[gone](nowhere.md)", "nowhere.md"),
                            ("[gone](deploy.md#no-such-heading)", "no-such-heading")]:
        shutil.rmtree(tmp_path / "docs", ignore_errors=True)
        shutil.copytree(DOCS, tmp_path / "docs")
        index = tmp_path / "docs" / "index.md"
        index.write_text(index.read_text() + f"\n{link}\n")
        built = _build(str(tmp_path / "mkdocs.yml"), tmp_path / "site")
        assert built.returncode != 0 and complaint in built.stderr, built.stderr


def test_the_readme_is_short_and_its_links_resolve():
    readme = page("README.md")
    assert len(readme.splitlines()) < 400
    links = re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", readme)
    assert len(links) >= 15
    assert [link for link in links if not link.startswith("http") and not (REPO_ROOT / link).exists()] == []


def test_the_sql_reference_names_every_object_of_the_extension(extension_dsn):
    """What the installed extension has (pg_depend), against what the reference documents:
    routines, views and tables of its schema, other than its own (`_`-prefixed) ones."""
    with connect(extension_dsn) as conn:
        installed = {name for (name,) in conn.execute(
            "SELECT p.proname FROM pg_depend d JOIN pg_proc p ON d.classid = 'pg_proc'::regclass "
            "AND d.objid = p.oid WHERE d.refclassid = 'pg_extension'::regclass AND d.deptype = 'e' "
            "AND d.refobjid = (SELECT oid FROM pg_extension WHERE extname = 'madlib_mop') "
            "UNION SELECT c.relname FROM pg_depend d JOIN pg_class c ON d.classid = 'pg_class'::regclass "
            "AND d.objid = c.oid WHERE d.refclassid = 'pg_extension'::regclass AND d.deptype = 'e' "
            "AND c.relkind IN ('r', 'v', 'p') "
            "AND d.refobjid = (SELECT oid FROM pg_extension WHERE extname = 'madlib_mop')")}
    public = {name for name in installed if not name.startswith("_")}
    assert len(public) >= 50
    assert set(reference_docs.documented_objects()) == public


def test_every_object_of_the_reference_is_described():
    """A COMMENT (what psql's \\d+ shows too) or a usage text for each."""
    usage = set(reference_docs.usage_functions())
    undescribed = [entry["name"] for path in sorted((REPO_ROOT / "sql").glob("*.sql"))
                   for entry in reference_docs._objects(path)
                   if not entry["comments"] and entry["name"] not in usage]
    assert undescribed == []


def test_every_usage_text_is_in_the_reference():
    functions = reference_docs.functions_page()
    names = reference_docs.usage_functions()
    assert set(names) == set(reference_docs.USAGE_TEXTS)
    for name in names:
        assert f"madlib_mop.{name}('help')` answers:" in functions


@pytest.mark.parametrize("setting", reference_docs.declared_settings(), ids=lambda s: s["name"])
def test_the_settings_page_describes_every_declared_setting(setting):
    assert setting["description"] and setting["context"].startswith("PGC_")
    assert f"| `{setting['name']}` |" in reference_docs.settings_page()
