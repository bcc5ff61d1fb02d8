"""Timing primitives shared by every benchmark: CUDA-event timing with the L2 flushed, the copy bandwidth ceiling
measured in the same process (the 100% line of `bench micro`), and the phase clock of whole-model runs."""

from __future__ import annotations

import contextlib
import functools
import time
from collections.abc import Callable

from ltxbench.results.schema import stats_from_samples

# GPU sleep after each L2 flush of do_bench: ~200 us at 2 GHz, on top of the flush's own ~70 us. With 50 us the
# compiled fused add + RMSNorm was still partly host-bound at 1x1024x2048 (results/h200/micro-norms-headroom-50us).
HOST_HEADROOM_CYCLES = 400_000


@functools.cache
def _libcuda():
    import ctypes

    return ctypes.CDLL("libcuda.so.1")


def reset_persisting_l2() -> None:
    """Demote every L2 line held under the evict_last (persisting) policy to normal (cuCtxResetPersistingL2Cache,
    effective when it returns: call it with the GPU idle). A memset cannot evict such lines: loads with
    `createpolicy ... evict_last` (ours, Triton's eviction_policy='evict_last', inductor's reductions) leave
    their input in L2 across do_bench's flush. H100, ncu after a 256 MB memset: our RMSNorm re-read its
    1x1024x2048 input entirely from L2 (0 DRAM bytes, 4.7 us against 5.9 after a reset), and a plain-load
    kernel after it found 22% of a 2x2688x2048 input there (docs/tuning.md#measuring-method)."""
    status = _libcuda().cuCtxResetPersistingL2Cache()
    if status != 0:
        raise RuntimeError(f"cuCtxResetPersistingL2Cache failed with CUresult {status}")


@contextlib.contextmanager
def host_headroom(cycles: int = HOST_HEADROOM_CYCLES):
    """Within it, triton's L2 flush before each timed call (1) starts from an idle GPU with no persisting L2
    lines (reset_persisting_l2), so every call and every provider reads its inputs from DRAM, and (2) is
    followed by a GPU sleep of `cycles`, so the host has enqueued the call before the GPU reaches the call's
    start event. Without (1) a provider timed after an evict_last kernel on the same input read part of it
    from L2: F.rms_norm 1x1024x2048 6.88 us against 8.99 on an input that kernel never read
    (docs/tuning.md#measuring-method). Without (2) a provider's host overhead (Python, dispatch, dynamo guards)
    counted as GPU time at small shapes: bimodal samples, H100 RMSNorm 1x1024x2048 under torch.compile p20
    5.3 us, p80 41.4 (docs/tuning.md#measuring-method)."""
    import torch
    from triton import runtime

    driver = runtime.driver.active
    own = vars(driver).get("clear_cache")
    flush = driver.clear_cache

    def flush_then_sleep(cache):
        torch.cuda.synchronize()
        reset_persisting_l2()
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
    returned), with host_headroom (persisting L2 lines reset before each flush, a GPU sleep after it).
    cudagraph: triton's do_bench_cudagraph, which removes launch overhead (L2 not flushed).
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


class PhaseClock:
    """Marks between the phases of one iteration (text encode, each step, decode; prefill, decode): CUDA events on
    CUDA, recorded on the stream without a sync per mark; time.perf_counter after a device sync elsewhere.
    `generate`, `bench e2e` and `profile` all time their phases with it."""

    def __init__(self, device):
        import torch

        self.torch, self.device = torch, torch.device(device)
        self.cuda = self.device.type == "cuda"

    def mark(self):
        if self.cuda:
            event = self.torch.cuda.Event(enable_timing=True)
            event.record()
            return event
        backend = getattr(self.torch, self.device.type, None)
        if self.device.type != "cpu" and hasattr(backend, "synchronize"):
            backend.synchronize()
        return time.perf_counter()

    def ms(self, start, end) -> float:
        """Milliseconds between two marks (valid after finish())."""
        return start.elapsed_time(end) if self.cuda else (end - start) * 1e3

    def intervals(self, marks: list) -> list[float]:
        """Milliseconds between consecutive marks."""
        return [self.ms(a, b) for a, b in zip(marks[:-1], marks[1:], strict=True)]

    def finish(self) -> None:
        """Wait for the marks recorded so far (CUDA)."""
        if self.cuda:
            self.torch.cuda.synchronize(self.device)
