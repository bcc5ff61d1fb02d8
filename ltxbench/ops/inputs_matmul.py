"""Random inputs (inputs.py's contract) for the ops built on matrix products: the cross-attention, the decode
attention over a key/value cache, and linear (GEMM / GEMV)."""

from __future__ import annotations

import math

import torch

from ltxbench.ops.inputs import _randn

XATTN_VARIANTS = {"ltx": (64, 128, "text", None), "no-mask": (64, 77, None, None),
                  "hd128": (128, 83, "text-f32-shared", None), "odd-head-dim": (33, 19, "bias", None),
                  "hd80-scaled": (80, 9, "text", 0.1), "hd200": (200, 21, None, None)}
def inputs_cross_attention(shape, dtype, device, gen, variant):
    """(B, S, D) → q (B, S, H, hd) with H = ⌈D / hd⌉ over k, v (B, L, H, hd), and the variant's mask and scale."""
    b, s, d = shape
    hd, length, kind, scale = XATTN_VARIANTS[variant]
    h = -(-d // hd)
    q, k, v = (_randn((b, n, h, hd), dtype, device, gen) for n in (s, length, length))
    mask = None
    if kind in ("text", "text-f32-shared"):
        valid = torch.arange(length)[None, :] < torch.randint(1, length + 1, (b, 1), generator=gen)
        mask = ((~valid).float() * -10000.0)[:, None, None, :]
        mask = mask.expand(b, h, 1, length).contiguous().to(dtype) if kind == "text" else mask
        mask = mask.to(device)
    elif kind == "bias":  # any additive bias, one per (head, key), shared by the batch
        mask = _randn((1, h, 1, length), dtype, device, gen)
    return {"q": q, "k": k, "v": v, "mask": mask, "scale": scale}


# decode_attention, per variant: (head_dim, query heads per key/value head, mask, scale). "llama" is Llama-3's decode
# step over a static cache (head dim 128, 4 query heads per key/value head, a bool mask: batch element 1 has one slot
# left unwritten); "window" a sliding-window layer's keys (Gemma 3: head dim 256, 2 per group); the others cover
# additive masks with -inf (fp32, q's dtype), no mask, one query head per group and the scalar path's head dims.
DECODE_VARIANTS = {"llama": (128, 4, "cache", None), "window": (256, 2, "window", None),
                   "mha-f32-mask": (64, 1, "additive-f32", None), "odd-head-dim": (33, 3, "random", 0.1),
                   "no-mask": (80, 5, None, None), "q-dtype-mask": (128, 2, "additive", None)}
def inputs_decode_attention(shape, dtype, device, gen, variant):
    """(B, L, D) → q (B, H, G, hd) with H = ⌈D / (G·hd)⌉ key/value heads of G query heads, over a key/value cache
    k, v (B, H, L, hd), and the variant's mask (every query keeps at least one key) and scale. q at twice the keys'
    scale, so that the softmax is peaked as trained attention often is."""
    b, length, d = shape
    hd, groups, kind, scale = DECODE_VARIANTS[variant]
    h = -(-d // (hd * groups))
    q = 2 * _randn((b, h, groups, hd), dtype, device, gen)
    k, v = (_randn((b, h, length, hd), dtype, device, gen) for _ in range(2))
    keys = torch.arange(length)
    keep = None
    if kind == "cache":  # the static cache's unwritten tail
        keep = keys[None, :] < (length - torch.arange(b) % 2).clamp(min=1)[:, None]
    elif kind == "window":
        keep = (keys >= length - max(1, length // 3))[None, :].expand(b, length)
    elif kind in ("random", "additive-f32", "additive"):
        keep = torch.rand((b, length), generator=gen) < 0.7
        keep[:, -1:] = True
    mask = None if keep is None else keep[:, None, None, :].clone()
    if kind == "additive-f32":  # a bias per key, -inf where excluded
        mask = torch.randn((b, 1, 1, length), generator=gen).masked_fill(~mask, -math.inf)
    elif kind == "additive":  # transformers' float masks: 0 or the dtype's lowest value
        mask = torch.zeros((b, 1, 1, length), dtype=dtype).masked_fill(~mask, torch.finfo(dtype).min)
    return {"q": q, "k": k, "v": v, "mask": None if mask is None else mask.to(device), "scale": scale}


# linear: (B, S, K) tokens of width K, or (B, S, K, N); without N, an odd-ish out width per variant.
LINEAR_OUT = {"bias": 97, "gelu-tanh": 136, "no-bias": 83, "residual": 104}
def inputs_linear(shape, dtype, device, gen, variant):
    """x (B, S, K) and an nn.Linear's weight (N, K) / bias (N) at its default init scale (uniform ±1/√K);
    variant "residual" adds a residual stream (B, S, N) of unit scale, as the LTX block's hidden states."""
    b, s, k, *rest = shape
    n = rest[0] if rest else LINEAR_OUT[variant]
    bound = max(k, 1) ** -0.5
    weight = (2 * torch.rand((n, k), generator=gen) - 1) * bound
    bias = None if variant == "no-bias" else (2 * torch.rand((n,), generator=gen) - 1) * bound
    inputs = {"x": _randn((b, s, k), dtype, device, gen), "weight": weight.to(device=device, dtype=dtype),
              "bias": None if bias is None else bias.to(device=device, dtype=dtype),
              "activation": "gelu_tanh" if variant == "gelu-tanh" else "none"}
    if variant == "residual":
        inputs["residual"] = _randn((b, s, n), dtype, device, gen)
    return inputs


NORM_LINEAR_OUT = 91  # an odd N where the shape does not name one (a SwiGLU's: 2 x 91)
# variant: the norm's weight_offset (Gemma 3 scales by 1 + weight) and the activation after the projection
NORM_LINEAR_VARIANTS = {"llama": (0.0, "none"), "gemma": (1.0, "none"), "llama-swiglu": (0.0, "swiglu")}


def inputs_norm_linear(shape, dtype, device, gen, variant, residual: bool = False):
    """x (B, S, K) as a decoder layer's hidden states (unit scale, a few channels 10x larger, as trained LLMs have),
    the norm's weight near 1 (Llama) or near 0 around the offset 1 (Gemma), an nn.Linear weight (N, K) at its init
    scale, and with `residual` the residual stream (B, S, K)."""
    b, s, k, *rest = shape
    offset, activation = NORM_LINEAR_VARIANTS[variant]
    n = rest[0] if rest else NORM_LINEAR_OUT * (2 if activation == "swiglu" else 1)
    x = torch.randn((b, s, k), generator=gen)
    x[..., ::37] *= 10.0
    norm_weight = (1.0 - offset) + 0.2 * torch.randn((k,), generator=gen)
    weight = (2 * torch.rand((n, k), generator=gen) - 1) * max(k, 1) ** -0.5
    inputs = {"x": x.to(device=device, dtype=dtype)}
    if residual:
        inputs["residual"] = _randn((b, s, k), dtype, device, gen)
    inputs = {**inputs, "norm_weight": norm_weight.to(device=device, dtype=dtype), "eps": 1e-5,
              "weight": weight.to(device=device, dtype=dtype), "weight_offset": offset}
    return {**inputs, "activation": activation} if residual else inputs


def inputs_add_norm_linear(shape, dtype, device, gen, variant):
    """inputs_norm_linear's with the residual stream, and the variant's activation ("llama-swiglu": the weight
    [gate | up])."""
    return inputs_norm_linear(shape, dtype, device, gen, variant, residual=True)
