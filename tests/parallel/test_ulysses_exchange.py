"""Our Ulysses attention (ltxbench.parallel.ulysses) on 2 gloo processes, with several heads a rank (the tiny
pipelines of tests/parallel/test_parallel_split.py have one): each rank's output equals one process's attention over all
tokens; the output's head groups handed back in the wrong order fail the check. On 2 GPUs: the exchange through
symmetric memory (ltxbench.parallel.symmetric) gives NCCL's bits, and fails when its buffers go stale."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.helpers import REPO, WORKERS


def _run(tmp_path, mutation: str = "", worker: str = "ulysses_worker.py", timeout: int = 300) -> dict:
    """`worker` on 2 processes (torch's launcher); its JSON."""
    out = tmp_path / "result.json"
    path = [str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(path), "OMP_NUM_THREADS": "1", "PYTHONFAULTHANDLER": "1"}
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
               str(WORKERS / worker), str(out), mutation]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(out.read_text())


@pytest.mark.slow  # 2 processes
def test_exchange_equals_one_process(tmp_path):
    errors = _run(tmp_path)
    assert set(errors) == {"heads8", "heads6"}
    for key, value in errors.items():
        assert value["shape"] == [1, 7, int(key[5]), 16], key
        assert value["error"] < 1e-5, (key, value)


@pytest.mark.slow  # 2 processes
def test_swapped_heads_fail(tmp_path):
    errors = _run(tmp_path, "swapped-heads")
    assert all(value["error"] > 0.1 for value in errors.values()), errors


def _run_gpu(tmp_path, mutation: str = "") -> dict:
    return _run(tmp_path, mutation, "ulysses_symmetric_worker.py", timeout=600)


def _two_gpus():
    import torch

    if torch.cuda.device_count() < 2:
        pytest.skip("needs 2 GPUs")


@pytest.mark.gpu
def test_symmetric_exchange_equals_nccl(tmp_path):
    """Pushed through symmetric memory, the attention gets NCCL's bits: 3 shapes (odd token counts, head sizes 64
    and 128, bf16 and fp16), 3 calls each with new values, eager and compiled under CUDA graphs (two chained calls
    per graph)."""
    _two_gpus()
    result = _run_gpu(tmp_path)
    assert result["usable"], result
    assert len(result["cases"]) == 9
    for case in result["cases"]:
        assert case["eager_equal"] and case["graphed_equal"] and case["differs_from_input"], case
    assert len(result["written"]) == 9
    for case in result["written"]:  # written by the q/k kernel into the peers' buffers: the packed path's bits
        assert case["eager_equal"] and case["graphed_equal"], case


@pytest.mark.gpu
def test_symmetric_exchange_with_stale_buffers_fails(tmp_path):
    """The pushes stopped after the first call: the peers' slots keep the first call's values, and the check sees it."""
    _two_gpus()
    cases = _run_gpu(tmp_path, "stale-push")["cases"]
    assert cases[0]["eager_equal"], cases[0]
    assert not any(case["eager_equal"] or case["graphed_equal"] for case in cases[1:]), cases


@pytest.mark.gpu
def test_kernel_writing_into_stale_slots_fails(tmp_path):
    """From the second call on, the q/k kernel writes every rank's part into its own slot: the peers keep the first
    call's values, and the check sees it."""
    _two_gpus()
    cases = _run_gpu(tmp_path, "stale-written")["written"]
    assert all(case["eager_equal"] for case in cases[:1]), cases[0]
    assert not any(case["eager_equal"] or case["graphed_equal"] for case in cases[1:]), cases


def test_symmetric_op_traces_with_its_fake():
    """The op's fake gives the caller's layout, so torch.compile keeps it in the graph without running it."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    from ltxbench.parallel import symmetric  # noqa: F401 (registers the op)

    with FakeTensorMode():
        packed = torch.empty(2, 83, 3, 16, 64, dtype=torch.bfloat16, device="cuda")
        out = torch.ops.ltxbench_parallel.ulysses_attention(packed, "group", "")
    assert (tuple(out.shape), out.dtype, out.device.type) == ((1, 83, 32, 64), torch.bfloat16, "cuda")


def test_symmetric_exchange_can_be_switched_off(monkeypatch):
    """LTXBENCH_ULYSSES_EXCHANGE=nccl: NCCL's all-to-all, decided before any GPU or collective is touched."""
    from types import SimpleNamespace

    from ltxbench.parallel import symmetric

    monkeypatch.setenv(symmetric.ENV, "nccl")
    monkeypatch.setattr(symmetric, "_usable", {})
    group = SimpleNamespace(group_name="pair")
    assert not symmetric.prepare(group) and not symmetric.usable(group)
    assert symmetric.describe(group) == "all-to-all"
