"""`make test-gpu` (pytest --require-gpu, tests/conftest.py) fails on a machine without a GPU instead of skipping
every test and exiting 0. The GPU is hidden from the subprocesses (CUDA_VISIBLE_DEVICES=""), so these tests check
the failure on a GPU machine too."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import REQUIRE_GPU_MESSAGE

ROOT = Path(__file__).resolve().parents[2]
NO_GPU = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "PYTHONPATH": str(ROOT)}
TRIVIAL = f"{Path(__file__).relative_to(ROOT)}::test_trivial_gpu_test"


@pytest.mark.gpu
def test_trivial_gpu_test():
    """The gpu-marked test the runs below select."""


def _pytest(*args):
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args], cwd=ROOT,
                          env=NO_GPU, capture_output=True, text=True, timeout=300)


def test_require_gpu_without_a_gpu_fails_with_one_line():
    done = _pytest("--require-gpu", "-m", "gpu", TRIVIAL)
    assert done.returncode == pytest.ExitCode.USAGE_ERROR, done.stdout + done.stderr
    assert f"ERROR: {REQUIRE_GPU_MESSAGE}" in done.stderr.splitlines(), done.stderr
    assert "skipped" not in done.stdout and "passed" not in done.stdout, done.stdout


def test_without_the_flag_the_gpu_test_is_skipped():
    done = _pytest("-m", "gpu", TRIVIAL)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "1 skipped" in done.stdout, done.stdout


@pytest.mark.skipif(not shutil.which("make"), reason="needs make")
def test_make_test_gpu_without_a_gpu_fails():
    # The option fails before collection, so this costs one interpreter start, not the suite's import.
    done = subprocess.run(["make", "-s", "-C", str(ROOT), "test-gpu", f"PYTHON={sys.executable}"], env=NO_GPU,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode != 0, done.stdout + done.stderr
    assert f"ERROR: {REQUIRE_GPU_MESSAGE}" in done.stderr.splitlines(), done.stderr
