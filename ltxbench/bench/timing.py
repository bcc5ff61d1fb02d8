"""Timing primitives shared by every benchmark: CUDA-event timing with the L2 flushed, and the copy
bandwidth ceiling measured in the same process (the 100% line of `bench micro`)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable

from ltxbench.results.schema import stats_from_samples

# GPU sleep after each L2 flush of do_bench: ~200 us at 2 GHz, on top of the flush's own ~70 us. With 50 us the
# compiled fused add + RMSNorm was still partly host-bound at 1x1024x2048 (results/h200/micro-norms-headroom-50us).
HOST_HEADROOM_CYCLES = 400_000


@contextlib.contextmanager
def host_headroom(cycles: int = HOST_HEADROOM_CYCLES):
    """Within it, triton's L2 flush before each timed call is followed by a GPU sleep of `cycles`, so the host
    has enqueued the call before the GPU reaches the call's start event. A provider's host overhead (Python,
    dispatch, dynamo guards) then never counts as GPU time; without it, calls whose host path outlasts the flush
    (a torch.compile'd function, or any call when the host stalls) time host overhead at small shapes: bimodal
    samples, H100 RMSNorm 1x1024x2048 under torch.compile p20 5.3 us, p80 41.4 (results/h100/micro-2026-11-23g)."""
    import torch
    from triton import runtime

    driver = runtime.driver.active
    own = vars(driver).get("clear_cache")
    flush = driver.clear_cache

    def flush_then_sleep(cache):
        flush(cache)
        torch.cuda._sleep(cycles)

    driver.clear_cache = flush_then_sleep
    try:
        yield
    finally:
        if own is None:
            del driver.clear_cache
        else:
            driver.clear_cache = own


def time_cuda(fn: Callable[[], object], *, warmup_ms: float = 25, rep_ms: float = 100,
              timer: str = "do_bench") -> dict:
    """Milliseconds per call as stats {median, p20, p80, min, max, n}, warmup excluded.

    do_bench: triton.testing.do_bench (CUDA events around each call, L2 flushed before each, all samples
    returned), with host_headroom. cudagraph: triton's do_bench_cudagraph, which removes launch overhead (L2
    not flushed).
    """
    from triton.testing import do_bench, do_bench_cudagraph

    if timer == "do_bench":
        with host_headroom():
            samples = do_bench(fn, warmup=warmup_ms, rep=rep_ms, return_mode="all")
    elif timer == "cudagraph":
        samples = do_bench_cudagraph(fn, rep=rep_ms, return_mode="all")
    else:
        raise ValueError(f"unknown timer {timer!r}: do_bench or cudagraph")
    samples = samples if isinstance(samples, list) else [samples]
    return stats_from_samples([float(s) for s in samples])


def device_copy(nbytes: int, device: str = "cuda") -> Callable[[], object]:
    """A copy of `nbytes` (random bytes) between two fresh buffers on `device`, ready to time."""
    import torch

    src = torch.empty(nbytes, dtype=torch.uint8, device=device).random_()
    dst = torch.empty_like(src)
    return lambda: dst.copy_(src)


def copy_bandwidth_gbps(nbytes: int = 1 << 30, timer: str = "do_bench") -> dict:
    """Device-to-device copy of `nbytes`, counting bytes read + written: the practical memory ceiling."""
    stats = time_cuda(device_copy(nbytes), timer=timer)
    return {"bytes": 2 * nbytes, "ms": stats, "gbps": 2 * nbytes / (stats["median"] * 1e-3) / 1e9}
