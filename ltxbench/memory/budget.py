"""The budget held to in `bench e2e --memory-budget`: the caching allocator capped so that the process, CUDA
context included, stays within the budget, and an over-budget plan fails with torch's out-of-memory error (exit 4)
instead of running on memory it was not given."""

from __future__ import annotations

from ltxbench.errors import EnvironmentProblem
from ltxbench.memory.plan import GIB


def enforce(device, budget_bytes: int) -> dict:
    """Cap the allocator on `device` at budget - outside, where outside is the memory the process uses beyond the
    allocator, measured now: total - free (cudaMemGetInfo) - reserved (the allocator's, its cache emptied first).
    Called after a warm-up iteration, so the CUDA context, the cuBLAS / cuDNN handles and the kernels loaded are in
    it. Other processes' memory on the GPU counts as outside too: measure on a GPU the run has to itself."""
    import torch

    torch.cuda.synchronize(device)
    torch.cuda.empty_cache()
    free, total = torch.cuda.mem_get_info(device)
    outside = total - free - torch.cuda.memory_reserved(device)
    limit = budget_bytes - outside
    held = torch.cuda.memory_allocated(device)
    if limit <= held:
        raise EnvironmentProblem(f"--memory-budget {budget_bytes / GIB:g} GiB: the weights placed on the GPU "
                                 f"({held / GIB:.2f} GiB) and the memory outside the allocator ({outside / GIB:.2f} "
                                 "GiB: CUDA context, other processes) already exceed it",
                                 hint="raise --memory-budget, or free the GPU of other processes")
    torch.cuda.set_per_process_memory_fraction(min(1.0, limit / total), device)
    return {"budget_bytes": budget_bytes, "outside_allocator_bytes": outside, "allocator_limit_bytes": limit,
            "fraction": min(1.0, limit / total),
            "describe": f"the allocator may hold {limit / GIB:.2f} GiB ({outside / GIB:.2f} GiB outside it)"}
