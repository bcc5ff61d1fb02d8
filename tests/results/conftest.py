"""What the manifest's tests share: the checkout they run at (a clean commit `HEAD`) with every need met."""

from __future__ import annotations

import pytest

from ltxbench.results import manifest, remeasure

HEAD = {"sha": "a" * 40, "dirty": False, "diff_sha256": None, "code": "c" * 64, "source": "git"}


@pytest.fixture
def head(monkeypatch):
    """The checkout's provenance, as a dict a test may change (dirty it, move its commit)."""
    state = dict(HEAD)
    monkeypatch.setattr(manifest, "provenance_and_files", lambda: (state, None))
    monkeypatch.setattr(remeasure, "missing_needs", lambda bench: [])
    return state
