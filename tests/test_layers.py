"""The package's rooms, as docs/architecture.md draws them: imports run one way (a room
imports only rooms below it, so there are no cycles), and no module reaches for another
module's private names (a package exports what others may use).  Read from the source, no
database needed."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "madlib_mop"

# Top to bottom; a room imports only rooms of a lower rank (and itself).
RANKS = {
    "tools": 8, "client": 8,
    "api": 7,
    "segment": 6,
    "job": 5,
    "engine": 4, "search": 4, "preprocess": 4,
    "db": 3,
    "runtime": 2,
    "grammar": 1, "plpy_bridge": 1,
    "errors": 0, "json_values": 0,
    "__init__": 9,  # the package re-exports what users import
}


def _modules():
    for path in sorted(PACKAGE.rglob("*.py")):
        yield path, ast.parse(path.read_text(), filename=str(path))


def _room(module: str) -> str:
    """madlib_mop.job.store -> job; madlib_mop.errors -> errors."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def _imports(tree: ast.AST):
    """(module imported, names imported from it) of every import of the package."""
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("madlib_mop"):
            yield node.module, [alias.name for alias in node.names]
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("madlib_mop"):
                    yield alias.name, []


def test_every_room_has_a_rank():
    rooms = {path.relative_to(PACKAGE).parts[0].removesuffix(".py") for path, _ in _modules()}
    assert rooms <= set(RANKS), rooms - set(RANKS)


@pytest.mark.parametrize("path,tree", list(_modules()), ids=lambda v: str(v.relative_to(PACKAGE)) if isinstance(v, Path) else "")
def test_imports_run_downwards(path, tree):
    room = path.relative_to(PACKAGE).parts[0].removesuffix(".py")
    upward = []
    for module, names in _imports(tree):
        targets = [module] if module != "madlib_mop" else [f"madlib_mop.{n}" for n in names]
        for target in targets:
            other = _room(target)
            if other != room and other in RANKS and RANKS[other] >= RANKS[room]:
                upward.append(target)
    assert not upward, f"{room}/ (rank {RANKS[room]}) imports {upward}"


def _imported_modules(tree: ast.AST) -> set[str]:
    """The names a module binds to the package's modules (`from madlib_mop.runtime import
    training`, `import madlib_mop.job.store as store`)."""
    bound = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("madlib_mop"):
            for alias in node.names:
                path = PACKAGE.parent.joinpath(*node.module.split("."), alias.name)
                if path.with_suffix(".py").exists() or (path / "__init__.py").exists():
                    bound.add(alias.asname or alias.name)
        elif isinstance(node, ast.Import):
            bound.update(alias.asname for alias in node.names
                         if alias.name.startswith("madlib_mop") and alias.asname)
    return bound


@pytest.mark.parametrize("path,tree", list(_modules()), ids=lambda v: str(v.relative_to(PACKAGE)) if isinstance(v, Path) else "")
def test_no_private_names_of_other_modules(path, tree):
    reached = [f"{module}.{name}" for module, names in _imports(tree) for name in names
               if name.startswith("_") and not name.startswith("__")]
    modules = _imported_modules(tree)
    reached += [f"{node.value.id}.{node.attr}" for node in ast.walk(tree)
                if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                and node.value.id in modules and node.attr.startswith("_") and not node.attr.startswith("__")]
    assert not reached, f"{path.relative_to(PACKAGE)} reaches private names: {reached}"


@pytest.mark.parametrize("room", ["db", "client", "grammar"])
def test_rooms_that_need_no_tensorflow_import_no_runtime(room):
    """The calling session's catalog code, the client and the grammar parse configurations
    without TensorFlow: they import the grammar, never the TensorFlow runtime."""
    found = [(str(path.relative_to(PACKAGE)), module) for path, tree in _modules()
             if path.relative_to(PACKAGE).parts[0] == room
             for module, _ in _imports(tree) if _room(module) == "runtime"]
    assert not found, found


def test_the_grammar_parses_without_tensorflow():
    script = ("import sys; from madlib_mop.grammar import model_config as mc; "
              "mc.parse_compile_params(\"optimizer='Adam(lr=0.01, decay=1e-4)', "
              "loss='categorical_crossentropy', metrics=['accuracy']\"); "
              "mc.parse_fit_params('batch_size=32, epochs=2'); "
              "print(sorted(m for m in sys.modules if m.split('.')[0] in ('tensorflow', 'keras')))")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


LIMITS = {"module": 600, "class": 200, "function": 80}  # lines


@pytest.mark.parametrize("path,tree", list(_modules()), ids=lambda v: str(v.relative_to(PACKAGE)) if isinstance(v, Path) else "")
def test_rooms_stay_small(path, tree):
    """A module, class or function past these sizes does more than one job."""
    too_big = []
    lines = len(path.read_text().splitlines())
    if lines > LIMITS["module"]:
        too_big.append(f"module: {lines} lines")
    for node in ast.walk(tree):
        kind = ("class" if isinstance(node, ast.ClassDef) else
                "function" if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) else None)
        if kind and node.end_lineno - node.lineno + 1 > LIMITS[kind]:
            too_big.append(f"{kind} {node.name}: {node.end_lineno - node.lineno + 1} lines")
    assert not too_big, f"{path.relative_to(PACKAGE)}: {too_big}"
