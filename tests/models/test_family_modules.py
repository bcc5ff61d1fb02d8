"""A run's stored result names the modules it imported (its code digest, ltxbench.results.provenance): editing a
module a run never imported leaves that run's result current. Every run reads every family's declarations (the
command line's options and presets), so a family's run code lives in `models/<family>_run.py` and its builder loads
when its own run first needs it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
RUN_MODULES = {"ltx": "ltx_run", "ltx2": "ltx2_run", "wan": "wan_run", "llm": "llm_run"}
OWN_BUILDERS = {"ltx2": "ltx2_build", "wan": "wan_build"}  # ltx_build, llm_build: every family's presets read them


@pytest.mark.parametrize("preset", ["ltx-tiny", "ltx2-tiny", "wan-tiny", "llama-tiny"])
def test_a_run_loads_only_its_own_familys_run_and_build_code(preset):
    code = ("import sys\nfrom ltxbench.cli.options import declared\nfrom ltxbench.models import family_of, presets\n"
            "[declared(c) for c in ('generate', 'bench e2e', 'profile')]\npresets()\n"
            f"family = family_of({preset!r})\n"
            "if family.makes_video:\n    family.builder\n    family.parallel_plan()\n"
            "else:\n    family.records({}, {}, family.settings('bench e2e', model='llama-tiny', weights='random'))\n"
            "print(family.name)\n"
            "print(' '.join(sorted(m.rsplit('.', 1)[1] for m in sys.modules if m.startswith('ltxbench.models.') "
            "and m.endswith(('_run', '_build')))))\n")
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)},
                          capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr
    family, loaded = proc.stdout.splitlines()[:2]
    expected = {"ltx_build", "llm_build", RUN_MODULES[family], *([OWN_BUILDERS[family]] if family in OWN_BUILDERS
                                                                 else [])}
    assert set(loaded.split()) == expected, proc.stdout


@pytest.mark.parametrize(("package", "foreign"), [("wan", ("ltx", "ltx2", "llm")), ("ltx2", ("ltx", "wan", "llm")),
                                                 ("ltx", ("ltx2", "wan", "llm")), ("llm", ("ltx", "ltx2", "wan"))])
def test_a_familys_injection_loads_no_other_familys(package, foreign):
    """The helpers every family's rules use live in the shared inject modules (patching, fuse, layers)."""
    code = (f"import sys\nimport ltxbench.inject.{package}\n"
            "print(' '.join(sorted({m.split('.')[2] for m in sys.modules if m.startswith('ltxbench.inject.')})))\n")
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)},
                          capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr
    assert not set(proc.stdout.split()) & set(foreign), proc.stdout
