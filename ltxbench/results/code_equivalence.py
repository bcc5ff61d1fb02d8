"""Whether two versions of a source file are the same code, for a stored result's currency
(provenance.changed_since): Python by its syntax tree without docstrings; CUDA/C++ without comments, the entry markers
of common/source_use.h (and their include) and indentation, string literals and the line breaks that end preprocessor
directives kept; pyproject.toml by what a run from the tree reads of it (dependencies, entry points, package
data), not its metadata or build requirements. Anything else: only identical text."""

from __future__ import annotations

import ast
import re
import tomllib


def same_code(name: str, before: str, after: str) -> bool:
    """`before` and `after` (two versions of the file `name`) differ only in comments, docstrings, layout or (C++) entry
    markers, which record a run's files and compute nothing."""
    code_of = _python_code if name.endswith(".py") else _cxx_code if name.endswith(CXX) else \
        _project_code if name == "pyproject.toml" else None
    if code_of is None:
        return before == after
    code = code_of(before)
    return code is not None and code == code_of(after)


CXX = (".cu", ".cuh", ".cpp", ".h")
# A C++ token stream's pieces: string and character literals (kept whole), comments, the entry marker, whitespace.
_CXX_PIECES = re.compile(
    r'"(?:\\.|[^"\\\n])*"' r"|'(?:\\.|[^'\\\n])*'"  # literals
    r"|//[^\n]*|/\*.*?\*/|NOTE_SOURCE_USED\(\);|\s+" r"""|[^"'/\sN]+|.""",
    re.S)


RECORDER_INCLUDE = '#include "common/source_use.h"'


def _cxx_code(source: str) -> str:
    """A C++ source without its comments, entry markers (and the recorder's include) and layout: string literals
    kept as written, and the line breaks that end preprocessor directives."""
    kept, gap = [], ""
    for piece in _CXX_PIECES.findall(source):
        if piece.isspace() or piece.startswith(("//", "/*")) or piece == "NOTE_SOURCE_USED();":
            gap = "\n" if "\n" in piece or gap == "\n" else " "
        else:
            kept.append((gap if kept else "") + piece)
            gap = ""
    text, directive = "", False
    for line in "".join(kept).split("\n"):  # ordinary lines joined; a directive (and its continuations) on its own
        if line == RECORDER_INCLUDE:
            continue
        directive = line.startswith("#") or (directive and text.endswith("\\\n"))
        text += f"\n{line}\n" if directive else line if not text or text.endswith("\n") else " " + line
    return text


def _python_code(source: str) -> str | None:
    """The syntax tree of a Python source without its docstrings (None where it does not parse)."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return None
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and body and \
                isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) and \
                isinstance(body[0].value.value, str):
            node.body = body[1:] or [ast.Pass()]
    return ast.dump(tree)


# What a run from the source tree takes from pyproject.toml. The rest (license, description, classifiers, the build
# backend's own requirements, linters' and pytest's settings) changes no measured figure.
PROJECT_CODE = ("dependencies", "optional-dependencies", "scripts", "gui-scripts", "entry-points", "requires-python")


def _project_code(source: str) -> str | None:
    """The run-relevant tables of a pyproject.toml (None where it does not parse)."""
    try:
        data = tomllib.loads(source)
    except tomllib.TOMLDecodeError:
        return None
    project = data.get("project", {})
    return repr(({key: project.get(key) for key in PROJECT_CODE}, data.get("tool", {}).get("setuptools")))
