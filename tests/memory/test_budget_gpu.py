"""The budget held to on the GPU (GPU only): enforce() caps the caching allocator at the budget less what the process
uses outside it, so an allocation past the budget fails with torch's out-of-memory error; bench e2e with a budget
records it with the peak allocated and reserved memory, and the plan it ran."""

from __future__ import annotations

import json
import math

import pytest
import torch
from typer.testing import CliRunner

from ltxbench.cli import app
from ltxbench.configurations import MEMORY_BUDGET
from ltxbench.memory.budget import enforce

pytestmark = pytest.mark.gpu
MIB = 2**20


def test_an_allocation_past_the_budget_runs_out_of_memory():
    device = torch.device("cuda", torch.cuda.current_device())
    held = torch.empty(256 * MIB, dtype=torch.uint8, device=device)
    torch.cuda.synchronize()
    torch.cuda.empty_cache()  # blocks cached by earlier tests would count as used here and then be freed by enforce()
    free, total = torch.cuda.mem_get_info(device)
    budget = total - free + 512 * MIB  # what the process uses now, and 512 MiB more
    try:
        enforced = enforce(device, budget)
        assert enforced["allocator_limit_bytes"] + enforced["outside_allocator_bytes"] == budget
        room = torch.empty(256 * MIB, dtype=torch.uint8, device=device)  # within the budget
        # Past it: more than the allocator may hold in all. (Not "another 512 MiB": a segment an earlier test left
        # partly in use keeps free space inside the budget that empty_cache cannot return, and serves such a request.)
        past = enforced["allocator_limit_bytes"] - torch.cuda.memory_allocated(device) + 2 * MIB
        with pytest.raises(torch.OutOfMemoryError):
            torch.empty(past, dtype=torch.uint8, device=device)
        assert torch.cuda.memory_reserved(device) <= enforced["allocator_limit_bytes"]
        del room
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0, device)
        del held
        torch.cuda.empty_cache()


def test_bench_e2e_records_the_budget_and_both_peaks(tmp_path):
    out = tmp_path / "e2e.json"
    # 90% of the GPU: what other processes hold counts against a budget (past it: refused, exit 4), and under
    # `make test-gpu GPU_WORKERS=N` the other workers' use grows while this runs (a snapshot + 4 GiB was refused)
    budget = math.floor(0.9 * torch.cuda.mem_get_info()[1] / 2**30)
    result = CliRunner().invoke(app, ["bench", "e2e", "--model", "ltx2-tiny", "--weights", "random", "--num-frames",
                                      "9", "--height", "64", "--width", "64", "--steps", "2", "--warmup-iterations",
                                      "1", "--repeats", "1", "--configs", "baseline,optimized", "--memory-budget",
                                      str(budget), "--output", str(out)])
    torch.cuda.set_per_process_memory_fraction(1.0)
    assert result.exit_code == 0, result.output
    doc = json.loads(out.read_text())
    enforced = doc["run"]["config"]["memory"]["enforced"]
    assert enforced["budget_bytes"] == budget * 2**30 and enforced["allocator_limit_bytes"] < budget * 2**30
    for record in doc["records"]:
        assert record["params"][MEMORY_BUDGET] == budget
        if record["name"] == "total":
            derived = record["derived"]
            assert 0 < derived["peak_memory_bytes"] <= derived["peak_reserved_bytes"]
            assert derived["peak_reserved_bytes"] <= enforced["allocator_limit_bytes"]
