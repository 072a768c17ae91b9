"""docs/architecture.md describes the code as it is: every module, file and function it
names in code spans exists (`job/repository`, `runtime/model_state.py`,
`store.job_models`, `src/worker_pool.c`, ...)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "madlib_mop"
DOC = (ROOT / "docs" / "architecture.md").read_text()
ROOMS = sorted(p.name for p in PACKAGE.iterdir() if p.is_dir() and (p / "__init__.py").exists())
SPANS = sorted(set(re.findall(r"`([^`\s]+)`", DOC)))


def _module(room: str, name: str) -> Path:
    return PACKAGE / room / f"{name}.py"


def _defines(path: Path, name: str) -> bool:
    return re.search(rf"^\s*(def|class)\s+{re.escape(name)}\b|^\s*{re.escape(name)}\s*[:=]",
                     path.read_text(), re.MULTILINE) is not None


def _named_things() -> list[tuple[str, Path, str | None]]:
    """(span, file it names, attribute it names in it or None)."""
    found = []
    for span in SPANS:
        span = span.rstrip(",.;:")
        if re.fullmatch(r"(tests|src|bench|sql|udf|docker|docs)/[\w./-]*", span):
            found.append((span, ROOT / span, None))
        elif span.startswith("madlib_mop/"):
            found.append((span, ROOT / span, None))
        else:
            match = re.fullmatch(rf"({'|'.join(ROOMS)})/(\w+)(?:\.py|\.(\w+))?", span)
            if match:
                found.append((span, _module(match[1], match[2]), match[3]))
    return found


def test_the_doc_names_many_things():
    assert len(_named_things()) >= 40


@pytest.mark.parametrize("span,path,attribute", _named_things(), ids=lambda v: v if isinstance(v, str) else "")
def test_what_the_doc_names_exists(span, path, attribute):
    assert path.exists(), f"docs/architecture.md names {span}: {path.relative_to(ROOT)} does not exist"
    if attribute is not None:
        assert _defines(path, attribute), f"docs/architecture.md names {span}: no {attribute} in {path.name}"
