"""The package's rooms, as docs/architecture.md draws them: imports run one way (a room
imports only rooms below it, so there are no cycles), and no module reaches for another
module's private names (a package exports what others may use).  Read from the source, no
database needed."""

from __future__ import annotations

import ast
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
    "errors": 0,
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


@pytest.mark.parametrize("path,tree", list(_modules()), ids=lambda v: str(v.relative_to(PACKAGE)) if isinstance(v, Path) else "")
def test_no_private_names_of_other_modules(path, tree):
    reached = [f"{module}.{name}" for module, names in _imports(tree) for name in names
               if name.startswith("_") and not name.startswith("__")]
    assert not reached, f"{path.relative_to(PACKAGE)} imports private names: {reached}"
