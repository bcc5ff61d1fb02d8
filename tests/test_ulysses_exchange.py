"""Our Ulysses attention (ltxbench.parallel.ulysses) on 2 gloo processes, with several heads a rank (the tiny
pipelines of tests/test_parallel_split.py have one): each rank's output equals one process's attention over all
tokens; the output's head groups handed back in the wrong order fail the check."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

TESTS = Path(__file__).parent


def _run(tmp_path, mutation: str = "") -> dict:
    out = tmp_path / "errors.json"
    path = [str(TESTS.parent), *filter(None, [os.environ.get("PYTHONPATH")])]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(path), "OMP_NUM_THREADS": "1"}
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
               str(TESTS / "ulysses_worker.py"), str(out), mutation]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(out.read_text())


def test_exchange_equals_one_process(tmp_path):
    errors = _run(tmp_path)
    assert set(errors) == {"heads8", "heads6"}
    for key, value in errors.items():
        assert value["shape"] == [1, 7, int(key[5]), 16], key
        assert value["error"] < 1e-5, (key, value)


def test_swapped_heads_fail(tmp_path):
    errors = _run(tmp_path, "swapped-heads")
    assert all(value["error"] > 0.1 for value in errors.values()), errors
