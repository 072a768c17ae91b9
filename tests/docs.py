"""The documentation's pages and their fenced blocks, for the tests that run them as written."""

from __future__ import annotations

import re

from madlib_mop.tools.embedded import REPO_ROOT

DOCS = REPO_ROOT / "docs"


def page(name: str) -> str:
    """A page of the documentation site (`docs/<name>`), or the README (`README.md`)."""
    return (REPO_ROOT / name if name == "README.md" else DOCS / name).read_text(encoding="utf-8")


def block(text: str, after: str, info: str = "sql") -> str:
    """The first fenced block of that info string after the text `after`."""
    return re.search(rf"```{re.escape(info)}\n(.*?)```", text[text.index(after):], re.S).group(1)
