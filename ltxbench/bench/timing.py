"""Timing primitives shared by every benchmark: CUDA-event timing with the L2 flushed, and the copy
bandwidth ceiling measured in the same process (the 100% line of `bench micro`)."""

from __future__ import annotations

from collections.abc import Callable

from ltxbench.results.schema import stats_from_samples


def time_cuda(fn: Callable[[], object], *, warmup_ms: float = 25, rep_ms: float = 100,
              timer: str = "do_bench") -> dict:
    """Milliseconds per call as stats {median, p20, p80, min, max, n}, warmup excluded.

    do_bench: triton.testing.do_bench (CUDA events around each call, L2 flushed before each, all samples
    returned). cudagraph: triton's do_bench_cudagraph, which removes launch overhead (L2 not flushed).
    """
    from triton.testing import do_bench, do_bench_cudagraph

    if timer == "do_bench":
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
