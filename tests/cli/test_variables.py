"""The LTXBENCH_* variables (ltxbench.variables): every one the sources read is in the table, the docs list them all,
`ltxbench env` shows them and each result records the ones set."""

from __future__ import annotations

import re
from pathlib import Path

from typer.testing import CliRunner

from ltxbench.cli import app
from ltxbench.results.env import capture_env
from ltxbench.variables import NAMES, set_variables

ROOT = Path(__file__).resolve().parents[2]


def _read_by_the_sources() -> set[str]:
    found = set()
    for folder in ("ltxbench", "cuda", ".ci"):
        for path in (ROOT / folder).rglob("*"):
            source = path.suffix in {".py", ".cu", ".cpp", ".h", ".cuh", ""} and path.name != "variables.py"
            if path.is_file() and source:
                found |= set(re.findall(r"LTXBENCH_[A-Z0-9_]*[A-Z0-9]", path.read_text(errors="ignore")))
    found |= set(re.findall(r"LTXBENCH_[A-Z0-9_]*[A-Z0-9]", (ROOT / "Makefile").read_text()))
    return found


def test_every_variable_the_sources_read_is_in_the_table():
    read = _read_by_the_sources()
    assert read - NAMES == set()
    assert NAMES - read == set()  # and none listed that nothing reads


def test_the_docs_list_every_variable():
    text = (ROOT / "docs" / "architecture.md").read_text()
    assert {name for name in NAMES if f"| `{name}` |" in text} == NAMES


def test_results_record_the_variables_set(monkeypatch):
    monkeypatch.setenv("LTXBENCH_QK_VPT", "2")
    monkeypatch.setenv("LTXBENCH_TYPO", "1")
    assert set_variables({"LTXBENCH_QK_VPT": "2", "PATH": "/bin"}) == {"LTXBENCH_QK_VPT": "2"}
    env = capture_env()
    assert env["variables"]["LTXBENCH_QK_VPT"] == "2" and env["variables"]["LTXBENCH_TYPO"] == "1"


def test_env_shows_the_variables(monkeypatch):
    monkeypatch.setenv("LTXBENCH_ACT_FAST", "0")
    monkeypatch.setenv("LTXBENCH_TYPO", "1")
    result = CliRunner().invoke(app, ["env", "--variables"], env={"COLUMNS": "250"})
    assert result.exit_code == 0, result.output
    assert all(name in result.output for name in NAMES)
    assert re.search(r"LTXBENCH_TYPO .*unknown", result.output)
    result = CliRunner().invoke(app, ["env"], env={"COLUMNS": "250"})
    assert result.exit_code == 0 and "LTXBENCH_ACT_FAST=0" in result.output
