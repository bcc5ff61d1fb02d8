"""Fake (meta) implementations: output shapes and dtypes, so torch.compile keeps our ops in its graphs.

Imported by `build.load()` right after the library registers; TORCH_LIBRARY names this module too
(`set_python_module`), so torch points here if the fakes are ever missing.
"""

from __future__ import annotations

import torch
from torch.library import register_fake


def _like(x: torch.Tensor) -> torch.Tensor:
    # The kernels always allocate contiguous outputs of x's shape.
    return torch.empty(x.shape, dtype=x.dtype, device=x.device)


@register_fake("ltxbench::rms_norm")
def _rms_norm(x, weight, eps, cast_before_weight=False, weight_offset=0.0):
    return _like(x)


@register_fake("ltxbench::fused_add_rms_norm")
def _fused_add_rms_norm(x, residual, weight, eps, cast_before_weight=False, weight_offset=0.0):
    torch._check(residual.shape == x.shape, lambda: "fused_add_rms_norm: residual must have x's shape")
    return _like(x), _like(x)


@register_fake("ltxbench::rms_norm_modulate")
def _rms_norm_modulate(x, weight, scale, shift, eps):
    torch._check(x.dim() == 3, lambda: "rms_norm_modulate: x must be (B, S, D)")
    return _like(x)


@register_fake("ltxbench::layer_norm_modulate")
def _layer_norm_modulate(x, scale, shift, eps):
    torch._check(x.dim() == 3, lambda: "layer_norm_modulate: x must be (B, S, D)")
    return _like(x)


@register_fake("ltxbench::gated_residual")
def _gated_residual(h, a, gate):
    torch._check(h.dim() == 3, lambda: "gated_residual: h must be (B, S, D)")
    return _like(h)


@register_fake("ltxbench::add_rms_norm_modulate")
def _add_rms_norm_modulate(h, a, gate, scale, shift, eps):
    torch._check(h.dim() == 3, lambda: "add_rms_norm_modulate: h must be (B, S, D)")
    return _like(h), _like(h)


@register_fake("ltxbench::rope_3d")
def _rope_3d(q, k, cos, sin, grid, freqs):
    torch._check(q.dim() == 3 and k.shape == q.shape, lambda: "rope_3d: q and k must be (B, S, D)")
    return _like(q), _like(q)


@register_fake("ltxbench::qk_rms_norm_rope")
def _qk_rms_norm_rope(q, k, wq, wk, eps, cos, sin, grid, freqs):
    torch._check(q.dim() == 3 and k.shape == q.shape, lambda: "qk_rms_norm_rope: q and k must be (B, S, D)")
    return _like(q), _like(q)



@register_fake("ltxbench::qk_rms_norm_rope_pack")
def _qk_rms_norm_rope_pack(q, k, v, wq, wk, eps, cos, sin, grid, freqs, parts):
    torch._check(q.dim() == 3 and k.shape == q.shape and v.shape == q.shape,
                 lambda: "qk_rms_norm_rope_pack: q, k and v must be (B, S, D)")
    torch._check(parts >= 1 and q.shape[2] % parts == 0,
                 lambda: "qk_rms_norm_rope_pack: parts must be >= 1 and divide the inner dim D")
    b, s, d = q.shape
    return q.new_empty((parts, b, s, 3, d // parts))

@register_fake("ltxbench::qk_rms_norm_rope_pack_into")
def _qk_rms_norm_rope_pack_into(q, k, v, wq, wk, eps, cos, sin, grid, freqs, outs):
    _check_parts_into(q, k, v, outs, q.shape[-1] if q.dim() == 3 else 0, "qk_rms_norm_rope_pack_into")


def _check_parts_into(q, k, v, outs, total, op):
    torch._check(q.dim() == 3 and k.shape == q.shape and v.shape == q.shape,
                 lambda: f"{op}: q, k and v must be (B, S, D)")
    torch._check(1 <= len(outs) <= 8 and total % len(outs) == 0, lambda: f"{op}: outs must hold 1 to 8 tensors")
    b, s, d = q.shape
    for out in outs:
        torch._check(tuple(out.shape) == (b, s, 3, d // len(outs)),
                     lambda: f"{op}: each of outs must be (B, S, 3, D / parts)")


@register_fake("ltxbench::qk_rms_norm_rope_kv")
def _qk_rms_norm_rope_kv(q, k, v, wq, wk, eps, cos, sin, grid, freqs):
    torch._check(q.dim() == 3 and k.shape == q.shape and v.shape == q.shape,
                 lambda: "qk_rms_norm_rope_kv: q, k and v must be (B, S, D)")
    b, s, d = q.shape
    return q.new_empty((b, s, d)), q.new_empty((b, s, 2, d))


@register_fake("ltxbench::rms_norm_rope_split")
def _rms_norm_rope_split(x, weight, eps, cos, sin):
    torch._check(x.dim() == 3, lambda: "rms_norm_rope_split: x must be (B, S, D)")
    return _like(x)


@register_fake("ltxbench::qk_rms_norm_rope_split")
def _qk_rms_norm_rope_split(q, k, wq, wk, eps, cos, sin):
    torch._check(q.dim() == 3 and k.shape == q.shape, lambda: "qk_rms_norm_rope_split: q and k must be (B, S, D)")
    return _like(q), _like(q)


@register_fake("ltxbench::qk_rms_norm_rope_split_pack")
def _qk_rms_norm_rope_split_pack(q, k, v, wq, wk, eps, cos, sin, parts):
    torch._check(q.dim() == 3 and k.shape == q.shape and v.shape == q.shape,
                 lambda: "qk_rms_norm_rope_split_pack: q, k and v must be (B, S, D)")
    torch._check(cos.dim() == 4 and parts >= 1 and cos.shape[1] % parts == 0,
                 lambda: "qk_rms_norm_rope_split_pack: parts must be >= 1 and divide the heads")
    b, s, d = q.shape
    return q.new_empty((parts, b, s, 3, d // parts))


@register_fake("ltxbench::qk_rms_norm_rope_split_pack_into")
def _qk_rms_norm_rope_split_pack_into(q, k, v, wq, wk, eps, cos, sin, outs):
    _check_parts_into(q, k, v, outs, cos.shape[1] if cos.dim() == 4 else 0, "qk_rms_norm_rope_split_pack_into")


def _token_major(x: torch.Tensor) -> torch.Tensor:
    """(B, H, S, hd) viewing a dense (B, S, H, hd) buffer, as rope_1d allocates its outputs."""
    b, h, s, d = x.shape
    return torch.empty((b, s, h, d), dtype=x.dtype, device=x.device).transpose(1, 2)


@register_fake("ltxbench::rope_1d")
def _rope_1d(q, k, cos, sin, positions=None, interleaved=False):
    torch._check(q.dim() == 4 and k.dim() == 4, lambda: "rope_1d: q and k must be (B, heads, S, head_dim)")
    return _token_major(q), _token_major(k)


@register_fake("ltxbench::rope_1d_cache")
def _rope_1d_cache(q, k, v, cos, sin, k_cache, v_cache, offset, interleaved=False):
    torch._check(q.dim() == 4 and k.dim() == 4 and v.shape == k.shape,
                 lambda: "rope_1d_cache: q (B, Hq, S, hd), k and v (B, Hk, S, hd)")
    return _token_major(q)


@register_fake("ltxbench::gelu_tanh")
def _gelu_tanh(x):
    return _like(x)


def _half_width(x):
    torch._check(x.shape[-1] % 2 == 0, lambda: "the last dim of x must be even (value and gate halves)")
    return torch.empty((*x.shape[:-1], x.shape[-1] // 2), dtype=x.dtype, device=x.device)


@register_fake("ltxbench::geglu")
def _geglu(x, gate_half=1, approximate=False):
    return _half_width(x)


@register_fake("ltxbench::swiglu")
def _swiglu(x, gate_half=0):
    return _half_width(x)


@register_fake("ltxbench::cross_attention")
def _cross_attention(q, k, v, mask=None, scale=None):
    torch._check(q.dim() == 4 and k.dim() == 4 and v.shape == k.shape,
                 lambda: "cross_attention: q (B, S, H, hd), k and v (B, L, H, hd)")
    return _like(q)


@register_fake("ltxbench::decode_attention")
def _decode_attention(q, k, v, mask=None, scale=None):
    torch._check(q.dim() == 4 and k.dim() == 4 and v.shape == k.shape,
                 lambda: "decode_attention: q (B, kv_heads, groups, hd), k and v (B, kv_heads, L, hd)")
    return q.new_empty(q.shape)


@register_fake("ltxbench::linear")
def _linear(x, weight, bias=None, activation="none", residual=None):
    torch._check(weight.dim() == 2 and weight.shape[1] == x.shape[-1],
                 lambda: "linear: weight must be (out_features, in_features)")
    torch._check(residual is None or residual.shape == (*x.shape[:-1], weight.shape[0]),
                 lambda: "linear: residual must have the output's shape")
    return torch.empty((*x.shape[:-1], weight.shape[0]), dtype=x.dtype, device=x.device)


def _fp8_rows(x):
    """(q, x_scale): a contiguous float8_e4m3fn tensor of x's shape and one float32 scale per row, (..., 1)."""
    return (torch.empty(x.shape, dtype=torch.float8_e4m3fn, device=x.device),
            torch.empty((*x.shape[:-1], 1), dtype=torch.float32, device=x.device))


@register_fake("ltxbench::rms_norm_modulate_fp8")
def _rms_norm_modulate_fp8(x, weight, scale, shift, eps):
    torch._check(x.dim() == 3, lambda: "rms_norm_modulate_fp8: x must be (B, S, D)")
    return _fp8_rows(x)


@register_fake("ltxbench::add_rms_norm_modulate_fp8")
def _add_rms_norm_modulate_fp8(h, a, gate, scale, shift, eps):
    torch._check(h.dim() == 3 and a.shape == h.shape, lambda: "add_rms_norm_modulate_fp8: h and a must be (B, S, D)")
    return (*_fp8_rows(h), _like(h))


@register_fake("ltxbench::gelu_tanh_fp8")
def _gelu_tanh_fp8(x):
    torch._check(x.dim() >= 1, lambda: "gelu_tanh_fp8: x must have at least one dimension")
    return _fp8_rows(x)


@register_fake("ltxbench::quantize_fp8")
def _quantize_fp8(x):
    torch._check(x.dim() >= 1, lambda: "quantize_fp8: x must have at least one dimension")
    return _fp8_rows(x)


def _fp8_heads(x, heads):
    """(q, descale): a contiguous float8_e4m3fn tensor of x's shape and one float32 descale per (batch, head)."""
    return (torch.empty(x.shape, dtype=torch.float8_e4m3fn, device=x.device),
            torch.empty((x.shape[0], heads), dtype=torch.float32, device=x.device))


@register_fake("ltxbench::qk_rms_norm_rope_fp8")
def _qk_rms_norm_rope_fp8(q, k, wq, wk, eps, heads, cos, sin, grid, freqs):
    torch._check(q.dim() == 3 and k.shape == q.shape, lambda: "qk_rms_norm_rope_fp8: q and k must be (B, S, D)")
    return (*_fp8_heads(q, heads), *_fp8_heads(k, heads))


@register_fake("ltxbench::qk_rms_norm_rope_split_fp8")
def _qk_rms_norm_rope_split_fp8(q, k, wq, wk, eps, cos, sin, groups):
    torch._check(q.dim() == 3 and k.shape == q.shape, lambda: "qk_rms_norm_rope_split_fp8: q and k must be (B, S, D)")
    return (*_fp8_heads(q, groups), *_fp8_heads(k, groups))


@register_fake("ltxbench::quantize_fp8_heads")
def _quantize_fp8_heads(x, heads):
    torch._check(x.dim() == 3, lambda: "quantize_fp8_heads: x must be (B, S, D)")
    return _fp8_heads(x, heads)
