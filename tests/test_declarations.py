"""Each SQL function is written in four places: its declaration in sql/, its body in udf/
(which passes the arguments on), the Python function the body calls, and its usage text.
These tests hold them equal: the same parameter names, in the same order, everywhere.
Read from the sources, no database needed."""

from __future__ import annotations

import ast
import importlib
import inspect
import re
from pathlib import Path

import pytest

from madlib_mop.api.usage import TEXTS
from madlib_mop.tools.extension_build import expand_overloads

ROOT = Path(__file__).resolve().parents[1]
DECLARATION = re.compile(r"CREATE FUNCTION @extschema@\.(?P<name>\w+)\(")
BODY = re.compile(r'^#plpython "(?P<file>[\w.]+)"', re.MULTILINE)


def _parameters(text: str) -> list[str]:
    """The parameter names of a declaration's parameter list."""
    text = re.sub(r"--[^\n]*", "", text)
    names, depth, item = [], 0, ""
    for char in text + ",":
        if char == "," and depth == 0:
            words = item.split()
            if words and words[0].upper() != "OUT":  # input parameters only
                names.append(words[1] if words[0].upper() in ("IN", "INOUT") else words[0])
            item = ""
            continue
        depth += {"(": 1, ")": -1, "[": 1, "]": -1}.get(char, 0)
        item += char
    return names


def _declarations() -> list[tuple[str, list[str], str]]:
    """(function, parameter names, udf body file) of every PL/Python function in sql/."""
    found = []
    for path in sorted((ROOT / "sql").glob("*.sql")):
        text = expand_overloads(path.read_text())  # overloads as the build declares them
        for match in DECLARATION.finditer(text):
            depth, end = 1, match.end()
            while depth:
                depth += {"(": 1, ")": -1}.get(text[end], 0)
                end += 1
            body = BODY.search(text, end)
            following = DECLARATION.search(text, end)
            if body is None or (following is not None and following.start() < body.start()):
                continue  # a C function, or a body written in place
            found.append((match.group("name"), _parameters(text[match.end():end - 1]),
                          body.group("file")))
    return found


def _body(file: str) -> tuple[object, list[str], set[str]]:
    """The Python function a udf body calls, the names it passes (in order), those it
    passes only when the overload has them (globals().get), and those it converts first."""
    tree = ast.parse((ROOT / "udf" / file).read_text())
    imported = {alias.asname or alias.name: node.module for node in ast.walk(tree)
                if isinstance(node, ast.ImportFrom) for alias in node.names}
    call = next(node for node in ast.walk(tree) if isinstance(node, ast.Call)
                and getattr(node.func, "id", None) in ("run", "run_pure"))
    target = call.args[1].id
    names, optional, converted = [], set(), set()
    for arg in call.args[2:]:
        if isinstance(arg, ast.Name):
            names.append(arg.id)
        elif isinstance(arg, ast.Call) and ast.unparse(arg.func) == "globals().get":
            names.append(arg.args[0].value)
            optional.add(arg.args[0].value)
        elif isinstance(arg, ast.Call) and len(arg.args) == 1 and isinstance(arg.args[0], ast.Name):
            names.append(arg.args[0].id)  # passed converted, e.g. json.loads(job)
            converted.add(arg.args[0].id)
        else:
            names.append(ast.unparse(arg))
    return (getattr(importlib.import_module(imported[target]), target), names, optional,
            converted)


DECLARED = _declarations()


def test_the_declarations_are_found():
    assert len(DECLARED) >= 30 and {"madlib_keras_fit_multiple_model", "madlib_keras_predict",
                                    "training_preprocessor_dl"} <= {d[0] for d in DECLARED}


@pytest.mark.parametrize("name,parameters,file", DECLARED, ids=[f"{d[0]}({len(d[1])})" for d in DECLARED])
def test_the_body_passes_the_declared_parameters_in_order(name, parameters, file):
    _, passed, optional, _ = _body(file)
    assert [p for p in passed if p in parameters or p not in optional] == parameters


@pytest.mark.parametrize("name,parameters,file", DECLARED, ids=[f"{d[0]}({len(d[1])})" for d in DECLARED])
def test_the_python_function_takes_them_by_the_same_names(name, parameters, file):
    function, passed, _, converted = _body(file)
    accepted = [p.name for p in inspect.signature(function).parameters.values()
                if p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD][1:]  # after plpy
    assert len(accepted) >= len(passed)
    # SQL folds unquoted names to lower case (MADlib's R is r): compared as SQL reads them.
    assert [a.lower() for a, p in zip(accepted, passed) if p not in converted] == \
        [p for p in passed if p not in converted]


def _usage_parameters(text: str, name: str) -> list[str]:
    """The parameter names listed in a usage text's call of `name`."""
    start = re.search(rf"(SELECT|CALL)[^\n(]*\b{name}\(\n", text)
    assert start, f"the usage text of {name} shows no call of it"
    block = text[start.end(): text.index(");", start.end())]
    return [line.split()[0] for line in block.splitlines()
            if line.strip() and not line.strip().startswith("--")]


USAGE = sorted({d[0] for d in DECLARED} & set(TEXTS))


def test_usage_texts_are_found():
    assert len(USAGE) >= 13


@pytest.mark.parametrize("name", USAGE)
def test_the_usage_text_lists_the_declared_parameters(name):
    longest = max((d[1] for d in DECLARED if d[0] == name), key=len)
    assert _usage_parameters(TEXTS[name], name) == longest
