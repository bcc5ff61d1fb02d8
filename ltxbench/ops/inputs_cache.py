"""Inputs of the ops that write a static KV cache (rope_1d_cache, rms_norm_qkv_rope_cache), as their KernelSpecs
(registry_decode.py) name them: a decode step's q/k/v (or the hidden states and the fused projection that make them),
per-token RoPE tables at the step's positions, caches of noise a few rows longer than the step writes (rows the op must
leave alone), and the cache's length before the step as one int64 on the device."""

from __future__ import annotations

import torch

from ltxbench.ops.inputs import _randn
from ltxbench.ops.inputs_matmul import inputs_norm_linear

OFFSET = 7  # tokens cached before the step: the step writes rows OFFSET .. OFFSET + S - 1
SPARE_ROWS = 3  # cache rows after the step's
ROPE_CACHE_VARIANTS = ("neox", "interleaved", "partial-rot", "shared-tables")
# variant -> (the norm's variant in inputs_norm_linear, tables shared by the batch)
QKV_CACHE_VARIANTS = {"llama": ("llama", False), "gemma-norm": ("gemma", False), "shared-tables": ("llama", True)}


def rope_heads(width: int) -> tuple[int, int, int]:
    """(Hq, Hk, head_dim) of a q width Hq * head_dim: heads of 128 (else 64, else one head of the whole width), four
    query heads per key/value head as Llama 3's."""
    hd = 128 if width % 128 == 0 else (64 if width % 64 == 0 else width)
    hq = width // hd
    return hq, (max(1, hq // 4) if hq else 0), hd


def qkv_heads(hidden: int) -> tuple[int, int, int]:
    """(Hq, Hk, head_dim) of a model of width `hidden`: rope_heads(hidden) where it is a multiple of 1024 (Llama-3-8B's
    32 / 8 heads of 128 at 4096), else 4 query and 2 key/value heads of 64."""
    return rope_heads(hidden) if hidden and hidden % 1024 == 0 else (4, 2, 64)


def _tables(batch: int, seq: int, rot: int, shared: bool, device) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin (B*S, rot/2) in fp32 at positions OFFSET + s (θ = 500000, Llama 3's), or (S, rot/2) shared."""
    inv_freq = 500000.0 ** (-torch.arange(0, rot, 2, dtype=torch.float32) / max(rot, 1))
    angles = (OFFSET + torch.arange(seq, dtype=torch.float32))[:, None] * inv_freq[None, :]
    angles = angles if shared else angles.repeat(batch, 1)
    return angles.cos().to(device), angles.sin().to(device)


def _caches(batch: int, heads: int, seq: int, hd: int, dtype, device, gen) -> dict:
    rows = OFFSET + seq + SPARE_ROWS
    return {"k_cache": _randn((batch, heads, rows, hd), dtype, device, gen),
            "v_cache": _randn((batch, heads, rows, hd), dtype, device, gen),
            "offset": torch.tensor(OFFSET, device=device)}


def inputs_rope_1d_cache(shape, dtype, device, gen, variant):
    """(B, S, Hq * head_dim) → q (B, Hq, S, hd), k and v (B, Hk, S, hd) as transposed views of token-major
    projections, as transformers makes them; tables over the whole head (half of it for "partial-rot"; one set of S rows
    for the batch for "shared-tables"), the caches and the offset."""
    b, s, d = shape
    hq, hk, hd = rope_heads(d)
    rot = hd // 2 if variant == "partial-rot" else hd
    rot -= rot % 2
    q, k, v = (_randn((b, s, h, hd), dtype, device, gen).transpose(1, 2) for h in (hq, hk, hk))
    cos, sin = _tables(b, s, rot, variant == "shared-tables", device)
    return {"q": q, "k": k, "v": v, "cos": cos, "sin": sin, **_caches(b, hk, s, hd, dtype, device, gen),
            "interleaved": variant == "interleaved"}


def inputs_rms_norm_qkv_rope_cache(shape, dtype, device, gen, variant):
    """(B, S, K) → inputs_norm_linear's hidden states, norm weight (Gemma's around the offset 1 for "gemma-norm") and
    projection [q | k | v] ((Hq + 2 Hk) * head_dim, K) with qkv_heads(K)'s heads, neox tables over whole heads, the
    caches and the offset."""
    b, s, k = shape
    norm, shared = QKV_CACHE_VARIANTS[variant]
    hq, hk, hd = qkv_heads(k)
    inputs = inputs_norm_linear((b, s, k, (hq + 2 * hk) * hd), dtype, device, gen, norm)
    cos, sin = _tables(b, s, hd, shared, device)
    return {**{n: inputs[n] for n in ("x", "norm_weight", "eps", "weight")}, "cos": cos, "sin": sin,
            **_caches(b, hk, s, hd, dtype, device, gen), "weight_offset": inputs["weight_offset"]}
