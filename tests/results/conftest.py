"""What the manifest's tests share: the checkout they run at (a clean commit, `CLEAN_HEAD`) with every need met."""

from __future__ import annotations

import pytest

from ltxbench.results import manifest, remeasure
from tests.helpers import CLEAN_HEAD


@pytest.fixture
def head(monkeypatch):
    """The checkout's provenance, as a dict a test may change (dirty it, move its commit)."""
    state = dict(CLEAN_HEAD)
    monkeypatch.setattr(manifest, "provenance_and_files", lambda: (state, None))
    monkeypatch.setattr(remeasure, "missing_needs", lambda bench: [])
    return state
