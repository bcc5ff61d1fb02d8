"""The stored results are what `ltxbench report` makes of them: each folder's README regenerates byte for byte, and
each folder holds only result documents, their CSV and PNG, and that README."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from ltxbench.results.remeasure import recorded_git
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


# A result file named in the README or docs/ (not a historical `<commit>:results/...` reference), and the commit a
# doc writes right after it ("`results/h200/x.json`, 4669bcc, clean", "..., measured at 4669bcc"): the file exists and
# records that commit. Re-measuring a file without updating the doc that quotes it fails here.
CITED = re.compile(r"(?<![0-9a-f]{7}:)results/([a-z0-9]+)/([A-Za-z0-9._-]+\.json)")
COMMIT_AFTER = re.compile(r"^`?[^`]{0,40}?\b([0-9a-f]{7})\b")
DOCS = sorted([ROOT / "README.md", *(ROOT / "docs").glob("*.md")])


def citations(text: str):
    """(line, path, commit written right after it or None) for each result file the text names."""
    for match in CITED.finditer(text):
        after = text[match.end():match.end() + 60].split("results/")[0]
        commit = COMMIT_AFTER.match(after)
        yield text.count("\n", 0, match.start()) + 1, match.group(0), commit.group(1) if commit else None


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_a_doc_names_existing_results_and_the_commit_they_record(doc):
    for line, path, commit in citations(doc.read_text(encoding="utf-8")):
        assert (ROOT / path).is_file(), f"{doc.name}:{line} names {path}, which is not stored"
        if commit is not None:
            recorded = (recorded_git(ROOT / path) or {}).get("sha", "")
            assert recorded.startswith(commit), f"{doc.name}:{line}: {path} records {recorded[:7]}, the doc {commit}"


def test_the_citation_check_sees_a_wrong_commit():
    text = "(`results/h200/e2e-ltx-2b-49f.json`, measured at 0000000, clean) and `d9e3fd0:results/h100/x.json`"
    assert list(citations(text)) == [(1, "results/h200/e2e-ltx-2b-49f.json", "0000000")]
