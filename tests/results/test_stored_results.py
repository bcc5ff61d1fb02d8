"""The stored results are what `ltxbench report` makes of them: each folder's README regenerates byte for byte, and
each folder holds only result documents, their CSV and PNG, and that README."""

from __future__ import annotations

from pathlib import Path

import pytest

from ltxbench.results.report import README, load_folder, render_readme

ROOT = Path(__file__).resolve().parents[2]
FOLDERS = sorted(p.relative_to(ROOT) for p in (ROOT / "results").iterdir() if p.is_dir() and p.name != "runs")


@pytest.mark.parametrize("folder", FOLDERS, ids=str)
def test_the_readme_is_the_report_of_the_folder(folder, monkeypatch):
    monkeypatch.chdir(ROOT)
    documents = load_folder(folder)
    figures = {d.stem: f"{d.stem}.png" for d in documents if (folder / f"{d.stem}.png").is_file()}
    assert render_readme(folder, documents, figures) == (folder / README).read_text(encoding="utf-8")


@pytest.mark.parametrize("folder", FOLDERS, ids=str)
def test_a_folder_holds_results_only(folder):
    stems = {p.stem for p in (ROOT / folder).glob("*.json")}
    for path in (ROOT / folder).iterdir():
        assert path.name == README or (path.suffix in (".json", ".csv", ".png") and path.stem in stems), path
