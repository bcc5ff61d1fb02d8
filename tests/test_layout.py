"""The test suite's own layout: test modules live in area packages and share code through tests/helpers.py (fixtures
through conftest.py), never by importing one another, so that moving or renaming one breaks no other. A test that
needs a GPU says so with the gpu marker alone: conftest.py skips it without CUDA, and --require-gpu (make test-gpu)
fails the run instead."""

from __future__ import annotations

import ast
import re
from pathlib import Path

TESTS = Path(__file__).resolve().parent
SOURCES = sorted(p for p in TESTS.rglob("*.py") if "fixtures" not in p.relative_to(TESTS).parts)


def _is_test_module(dotted: str) -> bool:
    last = dotted.rsplit(".", 1)[-1]
    return last.startswith("test_") or last == "conftest"


def _imported_test_modules(source: str) -> list[str]:
    """The test modules (and conftest) an import statement of `source` names, by their dotted name."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [alias.name for alias in node.names if _is_test_module(alias.name)]
        elif isinstance(node, ast.ImportFrom) and node.module:
            if _is_test_module(node.module):
                found.append(node.module)
            found += [f"{node.module}.{alias.name}" for alias in node.names if _is_test_module(alias.name)]
    return found


def test_no_module_imports_a_test_module():
    offenders = {str(p.relative_to(TESTS)): names for p in SOURCES
                 if (names := _imported_test_modules(p.read_text(encoding="utf-8")))}
    assert not offenders, f"move what these share into tests/helpers.py: {offenders}"


def test_the_import_check_sees_each_form():
    for line in ("import test_bench_e2e", "from test_parallel_split import run_ranks", "from conftest import x",
                 "from tests.inject.test_inject_ltx import _inputs", "from tests.bench import test_bench_e2e",
                 "from tests.conftest import x", "    from tests.test_inject_llm import build"):
        assert _imported_test_modules(line.strip()), line
    assert not _imported_test_modules("from tests.helpers import max_abs_error\nimport torch.testing")


def test_each_area_is_a_package():
    """pytest imports tests/<area>/test_x.py as tests.<area>.test_x only where every folder has an __init__.py
    (otherwise as a top-level test_x, which two areas may not share, and tests.helpers is then found only through
    PYTHONPATH)."""
    areas = {p.parent for p in TESTS.rglob("test_*.py")}
    assert {area for area in areas if not (area / "__init__.py").is_file()} == set()
    assert (TESTS / "__init__.py").is_file()


# A test's own "no CUDA: skip" would also skip under make test-gpu on a machine whose GPU is not visible: a green run
# that tested nothing. Skips for what the gpu marker does not cover (compute capability, GPU count) stay in the tests.
OWN_CUDA_SKIP = re.compile(r"not\s+(torch|__import__\([\"']torch[\"']\))\.cuda\.is_available\(\)")


def test_a_test_that_needs_a_gpu_has_the_gpu_marker_and_no_skip_of_its_own():
    own = {str(p.relative_to(TESTS)) for p in SOURCES
           if p.name not in ("conftest.py", "test_layout.py") and OWN_CUDA_SKIP.search(p.read_text(encoding="utf-8"))}
    assert not own, f"mark these tests @pytest.mark.gpu instead of skipping them on torch.cuda.is_available(): {own}"


def test_the_cuda_skip_check_sees_each_form():
    for line in ("if not torch.cuda.is_available():", "if not torch.cuda.is_available() or capability < (9, 0):",
                 '@pytest.mark.skipif(not __import__("torch").cuda.is_available(), reason="needs a GPU")'):
        assert OWN_CUDA_SKIP.search(line), line
    assert not OWN_CUDA_SKIP.search('@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU path")')


# The docs stay short enough to read: the README is the front page, each docs/ page one topic, decisions and numbers.
README_MAX_LINES, DOC_MAX_LINES = 150, 250


def test_the_readme_and_each_docs_page_keep_to_their_length():
    root = TESTS.parent
    pages = {root / "README.md": README_MAX_LINES, **{p: DOC_MAX_LINES for p in sorted((root / "docs").glob("*.md"))}}
    for page, limit in pages.items():
        lines = len(page.read_text(encoding="utf-8").splitlines())
        assert lines <= limit, f"{page.relative_to(root)}: {lines} lines, more than {limit}"
