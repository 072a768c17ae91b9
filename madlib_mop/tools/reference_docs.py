"""The documentation site's reference pages, generated from the sources so that they cannot
drift from them: every function, procedure, aggregate, view and table the extension creates
(the declarations of `sql/*.sql`, their COMMENTs and usage texts), and every setting its
library declares (`src/*.c`).

`make docs` builds the site with MkDocs, which loads this module as a hook (`mkdocs.yml`):
the pages are added to the site as it is built, never written into `docs/`.
`python -m madlib_mop.tools.reference_docs functions|settings` prints one of them.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

from madlib_mop.api.usage import TEXTS as USAGE_TEXTS
from madlib_mop.tools.extension_build import (REPO_ROOT, build_id_statements, expand_declarations,
                                               statements_starting)

FUNCTIONS_PAGE = "reference/functions.md"
SETTINGS_PAGE = "reference/settings.md"

# Each source file's part of the reference, in file order, and the guide page that explains it.
SECTIONS = {
    "00_runtime": ("Installation check", "install.md"),
    "05_packing": ("Packing buffers", "model-selection.md#data-preparation"),
    "10_preprocessor": ("Data preparation", "model-selection.md#data-preparation"),
    "20_model_catalogs": ("Model catalogs", "model-selection.md#model-catalogs"),
    "20_model_catalog": ("Model catalogs", "model-selection.md#model-catalogs"),
    "30_fit": ("Training by model hopping", "model-selection.md#training-by-model-hopping"),
    "35_cluster": ("Segment servers", "several-servers.md"),
    "40_inference": ("Evaluate and predict", "model-selection.md#evaluate-and-predict"),
    "45_automl": ("AutoML", "model-selection.md#automl-and-pruning"),
    "50_madlib_compat": ("MADlib's other functions", "madlib.md"),
    "55_custom_functions": ("Custom losses and metrics", "custom-functions.md"),
    "60_after_search": ("After the search", "after-search.md"),
    "65_steering": ("Steering a running job", "steering.md"),
    "67_transfer": ("Transfer learning", "transfer-learning.md"),
    "68_cycles": ("Data that grows: cycles", "growing-data.md#cycles"),
    "90_usage": ("Usage texts", "#usage-texts"),
}

_OBJECT = r"(FUNCTION|PROCEDURE|AGGREGATE|VIEW|TABLE)"
_CREATE = rf"CREATE (?:UNLOGGED )?{_OBJECT}"  # (an unlogged table is a table)
_STATEMENT = re.compile(rf"^({_CREATE}|COMMENT ON {_OBJECT}) @extschema@\.\w+")
_NAME = re.compile(r"@extschema@\.(\w+)")
# Where a routine's declaration ends and its attributes and body begin.
_DECLARATION_END = re.compile(r"^\s*(LANGUAGE|AS|SET|IMMUTABLE|STABLE|VOLATILE|STRICT|PARALLEL|SECURITY|#)\b",
                              re.MULTILINE)
_COMMENT_TEXT = re.compile(r"\bIS\s*\n?\s*'((?:[^']|'')*)'", re.S)
# MADlib's functions declared in a DO block to refuse them: ('name', 'parameters') rows.
_REFUSED = re.compile(r"^\s*\('(\w+)', '([^']*)'\)[,)]", re.MULTILINE)
# The usage functions `f(message)` that 90_usage.sql's DO block creates.
_USAGE_NAMES = re.compile(r"FOREACH function_name IN ARRAY ARRAY\[(.*?)\]", re.S)


def _declaration(statement: str, kind: str) -> str:
    """What a reader needs of a CREATE statement: a routine's name, parameters (with their
    comments) and result; a table's columns; an aggregate's or a view's name."""
    text = re.sub(r"^CREATE ", "", statement.replace("@extschema@.", "madlib_mop."))
    if kind in {"FUNCTION", "PROCEDURE"}:
        end = _DECLARATION_END.search(text)
        text = text[:end.start()] if end else text
    elif kind in {"AGGREGATE", "VIEW"}:
        text = re.sub(r"\s*(\(\s*|WITH .*|AS\s*)$", "", text.splitlines()[0])
    return text.strip().rstrip(";")


def _objects(path: Path) -> list[dict]:
    """The extension's objects that `path` creates, in order, each with its declarations
    (overloads) and comments; names starting with `_` are the extension's own."""
    text = path.read_text(encoding="utf-8")
    objects = _script_objects(expand_declarations(text)) + _refusing_overloads(text)
    if path.stem == "00_runtime":  # build_id(), which the build adds to every install script
        objects += _script_objects(build_id_statements("<version>", "<digest>"))
    return objects


def _script_objects(script: str) -> list[dict]:
    objects: dict[str, dict] = {}
    for statement in statements_starting(script, _STATEMENT):
        name = _NAME.search(statement).group(1)
        if name.startswith("_"):
            continue
        create = re.match(_CREATE, statement)
        if create:
            kind = create.group(1)
            entry = objects.setdefault(name, {"name": name, "kind": kind, "declarations": [], "comments": []})
            entry["declarations"].append(_declaration(statement, kind))
        elif name in objects:
            comment = _COMMENT_TEXT.search(statement)
            text = " ".join(comment.group(1).replace("''", "'").split()) if comment else ""
            if text and text not in objects[name]["comments"]:
                objects[name]["comments"].append(text)
    return list(objects.values())


def _refusing_overloads(text: str) -> list[dict]:
    """MADlib's functions that a DO block declares only to refuse them (their parameters in
    VALUES rows), with the refusal's message."""
    objects: dict[str, dict] = {}
    for name, parameters in _REFUSED.findall(text):
        message = re.search(rf"WHEN '{name}' THEN\s*'((?:[^']|'')*)'", text)
        entry = objects.setdefault(name, {"name": name, "kind": "FUNCTION", "declarations": [], "comments": [
            f"Refused (SQLSTATE 0A000): {message.group(1)}" if message else "Refused (SQLSTATE 0A000)"]})
        entry["declarations"].append(f"FUNCTION madlib_mop.{name}({parameters})")
    return list(objects.values())


def usage_functions(root: Path = REPO_ROOT) -> list[str]:
    """The functions that answer `f('help')` with their usage text."""
    names = _USAGE_NAMES.search((root / "sql" / "90_usage.sql").read_text(encoding="utf-8")).group(1)
    return re.findall(r"'(\w+)'", names)


def documented_objects(root: Path = REPO_ROOT) -> dict[str, str]:
    """Each object of the functions page: its name and kind."""
    return {entry["name"]: entry["kind"] for path in sorted((root / "sql").glob("*.sql"))
            for entry in _objects(path)}


_KIND_WORD = {"FUNCTION": "function", "PROCEDURE": "procedure (`CALL`)", "AGGREGATE": "aggregate",
              "VIEW": "view", "TABLE": "table"}


def functions_page(root: Path = REPO_ROOT) -> str:
    with_usage = set(usage_functions(root))
    lines = [
        "# SQL reference",
        "",
        "Every function, procedure, aggregate, view and table the extension creates, as the",
        "extension's SQL declares it (this page is generated from `sql/*.sql` when the site is",
        "built). They live in the schema the extension was installed in: `madlib_mop` here. A",
        "parameter with a DEFAULT may be left out; PostgreSQL's named notation",
        "(`warm_start => TRUE`) passes any of them by name.",
        "",
    ]
    for path in sorted((root / "sql").glob("*.sql")):
        objects = _objects(path)
        if path.stem == "90_usage":
            objects = [entry for entry in objects if entry["name"] != "usage"] or objects
        title, guide = SECTIONS[path.stem]
        lines += [f"## {title}", ""]
        if not guide.startswith("#"):
            lines += [f"How to use them: [the guide](../{guide}).", ""]
        if path.stem == "90_usage":
            lines += ["Each of these functions, called with no argument or with `'help'`, `'usage'` "
                      "or `'?'`, returns its usage text, as in MADlib: "
                      + ", ".join(f"[`{name}`](#{name})" for name in usage_functions(root)) + ".", ""]
        for entry in objects:
            lines += [f"### {entry['name']}", "", f"*{_KIND_WORD[entry['kind']]}*", ""]
            for declaration in entry["declarations"]:
                lines += ["```sql", declaration, "```", ""]
            for text in entry["comments"]:  # COMMENT ON it: what psql's \df+ and \d+ show
                lines += [text + ("" if text.endswith((".", "?")) else "."), ""]
            if entry["name"] in with_usage:
                lines += [f"`SELECT madlib_mop.{entry['name']}('help')` answers:", "", "```text",
                          USAGE_TEXTS[entry["name"]].strip("\n"), "```", ""]
    return "\n".join(lines)


# ---- settings: the library's declarations ---------------------------------------------------
_LITERALS = r'(?P<description>(?:\s*"(?:[^"\\]|\\.)*")+)'
_DEFINED = re.compile(
    rf'DefineCustom(?P<type>Int|String|Bool|Real)Variable\(\s*"(?P<name>madlib_mop\.\w+)",{_LITERALS},'
    r'\s*NULL,\s*&\w+,\s*(?P<default>"[^"]*"|[^,]+),(?:[^,]+,[^,]+,)?\s*(?P<context>PGC_\w+)', re.S)
_TABLED = re.compile(rf'\{{\s*"(?P<name>madlib_mop\.\w+)",{_LITERALS},\s*NULL\s*\}}', re.S)
_TABLE_LOOP = re.compile(r'DefineCustomStringVariable\(\s*text_settings\[i\]\.name,.*?(PGC_\w+)', re.S)
_CONTEXT = {
    "PGC_USERSET": "any role (`SET`, or per role or database)",
    "PGC_SUSET": "superusers only (`ALTER SYSTEM`, `ALTER DATABASE ... SET`, `ALTER ROLE ... SET`)",
    "PGC_SIGHUP": "the DBA: `postgresql.conf` or `ALTER SYSTEM`, then a reload",
    "PGC_POSTMASTER": "the DBA: `postgresql.conf`, then a restart",
}


def _literal(text: str) -> str:
    return "".join(re.findall(r'"((?:[^"\\]|\\.)*)"', text))


def declared_settings(root: Path = REPO_ROOT) -> list[dict]:
    """Every `madlib_mop.*` setting of the library, with its type, default, who sets it and
    its description, in name order."""
    settings = []
    for path in sorted((root / "src").glob("*.c")):
        source = path.read_text(encoding="utf-8")
        for match in _DEFINED.finditer(source):
            default = match.group("default").strip()
            settings.append({"name": match.group("name"), "type": match.group("type").lower(),
                             "default": _literal(default) if default.startswith('"') else default,
                             "context": match.group("context"), "description": _literal(match.group("description"))})
        loop = _TABLE_LOOP.search(source)
        for match in _TABLED.finditer(source) if loop else ():
            settings.append({"name": match.group("name"), "type": "string", "default": "",
                             "context": loop.group(1), "description": _literal(match.group("description"))})
    return sorted(settings, key=lambda setting: setting["name"])


def settings_page(root: Path = REPO_ROOT) -> str:
    lines = [
        "# Settings",
        "",
        "Every `madlib_mop.*` setting, as the extension's library declares it (this page is",
        "generated from `src/*.c` when the site is built). The library reserves the prefix: a",
        "misspelt name is an error (SQLSTATE 42602) where the library is preloaded. Most are",
        "declared as text, numbers included, so that an empty value means the extension's",
        "default, which the description gives (`SHOW` then shows it empty). How to size the",
        "worker pool with them: [Deploying on your server](../deploy.md#sizing-worker-sessions-for-dbas).",
        "",
        "| setting | type | default | who sets it | what it does |",
        "|---|---|---|---|---|",
    ]
    for setting in declared_settings(root):
        default = f"`{setting['default']}`" if setting["default"] else "empty"
        lines.append(f"| `{setting['name']}` | {setting['type']} | {default} | "
                     f"{_CONTEXT.get(setting['context'], setting['context'])} | {setting['description']} |")
    return "\n".join(lines) + "\n"


def on_files(files, config):
    """MkDocs' hook: add the generated pages to the site's files."""
    from mkdocs.structure.files import File

    for page, text in ((FUNCTIONS_PAGE, functions_page()), (SETTINGS_PAGE, settings_page())):
        files.append(File.generated(config, page, content=text))
    return files


if __name__ == "__main__":
    pages = {"functions": functions_page, "settings": settings_page}
    if len(sys.argv) != 2 or sys.argv[1] not in pages:
        sys.exit("usage: python -m madlib_mop.tools.reference_docs functions|settings")
    print(pages[sys.argv[1]]())
