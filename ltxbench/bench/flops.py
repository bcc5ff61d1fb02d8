"""Model FLOPs of a timed unit (a denoising step, a prefill, a decode step), the TFLOP/s a run achieved and its MFU:
the share of the GPU's dense peak for the precision the projections ran in.

How the FLOPs are counted: torch's own `torch.utils.flop_counter.FlopCounterMode` around every call of the
unpatched model during `bench e2e`'s untimed first iteration (the run's own inputs, on its own device: the
classifier-free-guidance batch, the token counts, the text masks and the LLM's static KV cache exactly as the
pipeline builds them, with no second model to build on the meta device). torch counts the matrix products
(mm, addmm, bmm, baddbmm, _scaled_mm, convolutions) at 2 FLOPs per multiply-add and every SDPA backend at
4·B·H·Sq·Sk·D for the forward (QKᵀ and PV); element-wise work, norms and softmax are not counted, as is usual for
MFU. Attention is counted over every key, as torch does (a causal mask is not discounted: the convention of
published MFU figures). `ltxbench profile` counts its whole profiled run once, split by kind (`by_kind`: GEMM,
attention), for its kernel families' TFLOP/s (ltxbench.bench.profile_flops). The rates are of the work a configuration
did: a transformer call its injection answered without running it (LTX-2's STG pass from the guidance pair) is left
out of its FLOPs and reported apart (answered_tflop). Only the standard library at top level.
"""

from __future__ import annotations

import re
import statistics

# Dense (no 2:4 sparsity) tensor-core peaks in TFLOP/s with fp32 accumulation, from NVIDIA's datasheets: H100 / H200
# (H100 SXM5 and H200 SXM: bf16 989.4, fp8 1978.9; H100 PCIe 756.5 / 1513), A100 (bf16 312; no fp8), L40S (362.05
# / 733, the Ada datasheet) and the GeForce RTX 4090 (Ada whitepaper, fp32 accumulate: 165.2 / 330.3). Keyed by a
# pattern of torch.cuda.get_device_name(); the first that matches wins, so the PCIe H100 comes before the SXM one.
PEAK_TFLOPS: tuple[tuple[str, dict], ...] = (
    (r"H100.*PCIe", {"bf16": 756.5, "fp8": 1513.0}),
    (r"H100 (80GB HBM3|SXM)", {"bf16": 989.4, "fp8": 1978.9}),
    (r"H200", {"bf16": 989.4, "fp8": 1978.9}),
    (r"A100", {"bf16": 312.0}),
    (r"L40S", {"bf16": 362.0, "fp8": 733.0}),
    (r"RTX 4090", {"bf16": 165.2, "fp8": 330.3}),
)


# HBM bandwidth in TB/s from the same datasheets (H100 SXM5 3.35, PCIe 2.0; H200 4.8; A100 80GB 2.039, 40GB 1.555;
# L40S 0.864; RTX 4090 1.008): a batch-1 decode step reads every weight once, so weight bytes / this is its floor.
PEAK_HBM_TBPS: tuple[tuple[str, float], ...] = (
    (r"H100.*PCIe", 2.0),
    (r"H100 (80GB HBM3|SXM)", 3.35),
    (r"H200", 4.8),
    (r"A100.*80GB", 2.039),
    (r"A100", 1.555),
    (r"L40S", 0.864),
    (r"RTX 4090", 1.008),
)


def peak_class(precision: str) -> str | None:
    """The peak a record's precision is held against: bf16 (and fp16, the same rate), fp8 where the projections
    ran in FP8 (fp8, fp8-attention); None for fp32 and anything else (no MFU)."""
    if precision in ("bf16", "fp16"):
        return "bf16"
    return "fp8" if precision.startswith("fp8") else None


def peak_tflops(gpu: str | None, precision: str) -> float | None:
    """The dense peak of GPU `gpu` (its device name) for `precision`, or None (a GPU not in the table, the CPU)."""
    kind = peak_class(precision)
    if not gpu or kind is None:
        return None
    for pattern, peaks in PEAK_TFLOPS:
        if re.search(pattern, gpu):
            return peaks.get(kind)
    return None


def rates(model_flop: float | None, median_ms: float, gpu: str | None, precision: str, gpus: int = 1) -> dict:
    """The derived fields of a timing record: model_tflop (per timed unit), tflops (achieved at the median) and, on
    a GPU of the table, mfu (a fraction of `gpus` × the peak: a run over several GPUs shares the unit's work).
    {} when the FLOPs were not counted."""
    if not model_flop or median_ms is None or median_ms <= 0:
        return {}
    out = {"model_tflop": model_flop / 1e12, "tflops": model_flop / (median_ms * 1e-3) / 1e12}
    peak = peak_tflops(gpu, precision)
    if peak is not None:
        out["mfu"] = out["tflops"] / (peak * gpus)
    return out


def decode_weight_bytes(model) -> int:
    """The weight bytes a batch-1 decode step of a transformers causal LM reads: every parameter once (a head tied to
    the embedding counted once, as the head reads it whole), but an untied input embedding, of which a step reads one
    row."""
    total = sum(p.numel() * p.element_size() for p in model.parameters())  # parameters() yields a shared one once
    embedding, head = model.get_input_embeddings(), model.get_output_embeddings()
    if head is None or head.weight is not embedding.weight:
        total -= embedding.weight.numel() * embedding.weight.element_size()
    return total


def hbm_floor(weight_bytes: int | None, median_ms: float | None, gpu: str | None) -> dict:
    """The decode step against its memory floor: weight_gb, and on a GPU of PEAK_HBM_TBPS hbm_floor_ms (the bytes at
    the datasheet bandwidth) and pct_of_hbm_floor (that floor over the median step: 100 reads at the peak). {} when
    the bytes or the time are unknown."""
    if not weight_bytes or not median_ms or median_ms <= 0:
        return {}
    out = {"weight_gb": weight_bytes / 1e9}
    for pattern, tbps in PEAK_HBM_TBPS:
        if gpu and re.search(pattern, gpu):
            out["hbm_floor_ms"] = weight_bytes / (tbps * 1e12) * 1e3
            out["pct_of_hbm_floor"] = 100 * out["hbm_floor_ms"] / median_ms
            break
    return out


def attention_flops(batch: int, heads: int, queries: int, keys: int, head_dim: int) -> int:
    """Forward FLOPs of attention: two GEMMs (QKᵀ: Sq×D by D×Sk; PV: Sq×Sk by Sk×D), 2 FLOPs per multiply-add."""
    return 4 * batch * heads * queries * keys * head_dim


def with_kv_heads_broadcast(count):
    """torch's `sdpa_flop_count(q, k, v)` made to take grouped-query shapes (k/v with fewer heads than q, SDPA's
    `enable_gqa`, which transformers uses on CUDA): counted as the kernel computes it, every query head against its
    shared key/value head. torch 2.11's own raises on them; later releases count them the same way."""
    def sdpa_flop_count(query_shape, key_shape, value_shape):
        heads, kv_heads = query_shape[1], key_shape[1]
        if kv_heads != heads and kv_heads > 0 and heads % kv_heads == 0:
            key_shape = (key_shape[0], heads, *key_shape[2:])
            value_shape = (value_shape[0], heads, *value_shape[2:])
        return count(query_shape, key_shape, value_shape)

    sdpa_flop_count.broadcasts_kv_heads = True
    return sdpa_flop_count


def _count_attention() -> None:
    """Two gaps of torch's counter filled once: grouped-query SDPA shapes (with_kv_heads_broadcast: the formulas of
    torch's SDPA ops look `sdpa_flop_count` up in their module when they run), and the CPU SDPA kernel, which it does
    not know: the same formula for it, so that a CPU run counts its attention too (left alone where torch has one)."""
    import torch
    from torch.utils import flop_counter

    if not getattr(flop_counter.sdpa_flop_count, "broadcasts_kv_heads", False):
        flop_counter.sdpa_flop_count = with_kv_heads_broadcast(flop_counter.sdpa_flop_count)
    op = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
    if op in flop_counter.flop_registry or op.default in flop_counter.flop_registry:
        return

    @flop_counter.register_flop_formula(op)
    def _cpu_sdpa(query_shape, key_shape, value_shape, *args, out_shape=None, **kwargs) -> int:
        return flop_counter.sdpa_flop_count(query_shape, key_shape, value_shape)


# The kinds `ltxbench profile` divides by its GEMM and attention kernel families' time: torch's counted ops by name
# (the op packet's, e.g. "addmm"); any other op torch may count is "other".
GEMM_OPS = frozenset({"mm", "addmm", "bmm", "baddbmm", "_scaled_mm"})
KINDS = ("GEMM", "attention", "other")


def kind_of(op) -> str:
    """GEMM (the matrix products and every convolution), attention (every SDPA / flash / efficient / cuDNN / flex
    attention op) or other, of an op torch's counter reports."""
    name = getattr(op, "__name__", str(op)).split(".")[0]
    if "attention" in name:
        return "attention"
    return "GEMM" if name in GEMM_OPS or "conv" in name else "other"


def by_kind(fn) -> tuple[object, dict]:
    """(fn(), {kind: FLOPs} over KINDS): every op torch counts during fn(), wherever it runs (text encoder and VAE
    included: a profile's kernel families cover all of the profiled work)."""
    from torch.utils.flop_counter import FlopCounterMode

    _count_attention()
    with FlopCounterMode(display=False) as counter:
        result = fn()
    return result, _kinds(counter)


def _kinds(counter) -> dict:
    counts = dict.fromkeys(KINDS, 0)
    for op, flop in counter.get_flop_counts().get("Global", {}).items():
        counts[kind_of(op)] += flop
    return counts


def modules_of(module) -> list:
    """A module, or a list / tuple of them (a pipeline's denoisers: Wan 2.2 A14B's two experts), as a list."""
    return list(module) if isinstance(module, (list, tuple)) else [module]


def per_call(module, fn, kinds: list | None = None) -> tuple[object, list[int]]:
    """(fn(), [FLOPs of each call of `module` during it]): torch's FLOP counter around each forward, so that work
    outside the module (text encoder, VAE, sampling) is not counted. `module` may be a list of modules (each
    expert of a pipeline): their calls, in the order they ran. `kinds`, a list, gets each call's {kind: FLOPs}."""
    from torch.utils.flop_counter import FlopCounterMode

    _count_attention()
    calls: list[int] = []
    active: list = []

    def enter(_module, _args, _kwargs=None):
        mode = FlopCounterMode(display=False)
        mode.__enter__()
        active.append(mode)

    def leave(_module, _args, _output):
        mode = active.pop()
        mode.__exit__(None, None, None)
        calls.append(mode.get_total_flops())
        if kinds is not None:
            kinds.append(_kinds(mode))

    handles = [handle for part in modules_of(module)
               for handle in (part.register_forward_pre_hook(enter), part.register_forward_hook(leave))]
    try:
        result = fn()
    finally:
        for handle in handles:
            handle.remove()
        while active:  # a call that raised: leave its counter
            active.pop().__exit__(None, None, None)
    return result, calls


def answered_calls(calls: list, injection: dict | None) -> list:
    """The entries of `calls` (one per call of the counted iteration, in order) that the configuration's injection
    answered without running them (its CALLS_ANSWERED indices)."""
    from ltxbench.inject import CALLS_ANSWERED

    return [calls[i] for i in (injection or {}).get(CALLS_ANSWERED) or () if i < len(calls)]


def video_step(timings: dict, calls: list[int]) -> dict:
    """{summary key: FLOPs} of a video generation: the transformer's calls over its denoising steps (a step with
    classifier-free guidance is one call of the doubled batch, or one per branch where the pipeline splits them)."""
    steps = len(timings.get("step_ms") or ())
    return {"step_ms": sum(calls) / steps} if steps and calls else {}


def llm_units(prompt_lengths: list[int], calls: list[int]) -> dict:
    """{summary key: FLOPs} of one LLM iteration (llm_run.run_once): a prefill per length, then generate()'s own
    prefill and its decode steps. A decode step's FLOPs are the mean over them (its attention reads the static
    cache, whose length does not change; the step_ms samples are the intervals between those calls)."""
    n = len(prompt_lengths)
    out = {f"prefill_{length}_ms": calls[i] for i, length in enumerate(prompt_lengths) if i < len(calls)}
    decode = calls[n + 1:]
    if decode:
        out["step_ms"] = statistics.fmean(decode)
    return out
