"""A configuration of `bench e2e --memory-budget` that runs out of memory under the budget's allocator cap: recorded
as not fitting (its summary, then its record), what it held freed, and the run goes on. Only the standard library at
top level."""

from __future__ import annotations

from ltxbench.results.schema import OUT_OF_MEMORY  # also the summary key of a configuration that did not fit


def out_of_memory(exc: BaseException, budget_gib: float, injection: dict) -> dict:
    """The summary of a configuration that ran out of memory under the budget's allocator cap: the budget and the
    error's first line. The frames of the failed iteration are cleared, so that its activations can be freed."""
    import traceback

    traceback.clear_frames(exc.__traceback__)
    first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return {OUT_OF_MEMORY: {"budget_gib": budget_gib, "error": first}, "injection": injection}


def did_not_fit(summary: dict | None) -> bool:
    return summary is not None and OUT_OF_MEMORY in summary


def release(device) -> None:
    """Give back what a configuration that ran out of memory still held (its reverted patch has let go of it)."""
    import gc

    import torch

    gc.collect()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()
