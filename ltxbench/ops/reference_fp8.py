"""Pure-torch twins of the FP8 (e4m3) ops: per-row and per-head scales, the scaled GEMM. Same conventions as
`reference` (math in fp32, or float64 for float64 inputs), whose helpers they use; `reference` imports them, so the
`reference` provider holds them too."""

from __future__ import annotations

import torch
import torch.nn.functional as F

Tensor = torch.Tensor

__all__ = ["quantize_fp8", "rms_norm_modulate_fp8", "add_rms_norm_modulate_fp8", "gelu_tanh_fp8", "fp8_pow2_scale",
           "fp8_weight_bound", "qk_rms_norm_rope_fp8", "qk_rms_norm_rope_split_fp8", "quantize_fp8_heads",
           "linear_fp8"]

FP8_MAX = 448.0      # largest finite float8_e4m3fn
FP8_MIN_AMAX = 1e-12  # an all-zero row gets this amax: its scale stays finite and its values 0


def _to_fp8_rows(y: Tensor) -> tuple[Tensor, Tensor]:
    """y (fp32/fp64, last dim = a row) -> (q float8_e4m3fn, scale float32 (..., 1)) with y ≈ q * scale: scale =
    max|row| / 448, q = y * (1 / scale) (both fp32, as the kernels compute it) rounded to nearest (even),
    saturated at ±448."""
    amax = y.abs().amax(dim=-1, keepdim=True) if y.shape[-1] else y.new_zeros((*y.shape[:-1], 1))
    amax = amax.float().clamp_min(FP8_MIN_AMAX)
    scale = amax / torch.full_like(amax, FP8_MAX)  # a true division: torch divides by a scalar as * (1 / 448) on CUDA
    q = (y.float() * (1.0 / scale)).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    return q, scale


def quantize_fp8(x: Tensor) -> tuple[Tensor, Tensor]:
    """Per-row (last dim) FP8 quantization: weights at injection (a row = an output channel), activations."""
    return _to_fp8_rows(x.to(_ref._acc(x)))


def rms_norm_modulate_fp8(x: Tensor, weight: Tensor | None, scale: Tensor, shift: Tensor,
                          eps: float = 1e-6) -> tuple[Tensor, Tensor]:
    """rms_norm_modulate quantized to FP8 per token from its fp32 value (never rounded to x.dtype first)."""
    n = _ref._apply_weight(_ref._rms(x.to(_ref._acc(x)), eps), weight, x.dtype, False)
    return _to_fp8_rows(_ref._modulate(n, scale, shift))


def add_rms_norm_modulate_fp8(h: Tensor, a: Tensor, gate: Tensor | None, scale: Tensor, shift: Tensor,
                              eps: float = 1e-6) -> tuple[Tensor, Tensor, Tensor]:
    """h' = h + a [* gate] (rounded to h.dtype, as the model stores it); (rms_norm_modulate_fp8(h'), h')."""
    h_new = _ref._residual(h, a, gate)
    return (*rms_norm_modulate_fp8(h_new, None, scale, shift, eps), h_new)


def gelu_tanh_fp8(x: Tensor) -> tuple[Tensor, Tensor]:
    """GELU(tanh) of x in fp32, quantized to FP8 per row: the feed-forward's down-projection input."""
    return _to_fp8_rows(F.gelu(x.to(_ref._acc(x)), approximate="tanh"))


def fp8_pow2_scale(bound: Tensor) -> Tensor:
    """The power of two s (float32) with bound · s in (224, 448]; 1 where bound is 0, NaN or infinite."""
    bound = bound.float()
    ratio = torch.full_like(bound, FP8_MAX) / bound
    exponent = torch.frexp(ratio).exponent  # ratio = m · 2^e, m in [0.5, 1)
    scale = torch.ldexp(torch.ones_like(ratio), (exponent - 1).clamp(-126, 126).float())
    scale = torch.where(ratio.isfinite(), scale, torch.full_like(scale, 2.0 ** 126))
    return torch.where((bound > 0) & bound.isfinite(), scale, torch.ones_like(scale))


def fp8_weight_bound(w: Tensor, heads: int) -> Tensor:
    """√D · max|w| over each head's channels of an RMSNorm weight w (D,): what bounds the normalized, rotated values
    of that head (qk_rms_norm_rope_fp8), float32 (heads,)."""
    d = w.shape[0]
    w_max = w.float().abs().reshape(heads, d // heads).amax(1) if d else w.new_zeros(heads, dtype=torch.float32)
    return torch.tensor(float(d), device=w.device).sqrt() * w_max


def _to_fp8_heads(y: Tensor, scale: Tensor) -> tuple[Tensor, Tensor]:
    """y (B, S, D) times scale (B, H) per head, rounded to e4m3: (q, descale = 1 / scale)."""
    b, s, d = y.shape
    heads = y.float().reshape(b, s, scale.shape[1], d // scale.shape[1]) * scale[:, None, :, None]
    return heads.clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn).reshape(b, s, d), 1.0 / scale


def qk_rms_norm_rope_fp8(q: Tensor, k: Tensor, wq: Tensor, wk: Tensor, eps: float, heads: int,
                         cos: Tensor | None = None, sin: Tensor | None = None, grid: Tensor | None = None,
                         freqs: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """qk_rms_norm_rope in fp32 (never rounded to q.dtype), to FP8 per head with scales from the weight bound
    √D · max|w| (the op's docstring)."""
    cos, sin = _ref._ltx_tables(q, cos, sin, grid, freqs)
    out = []
    for t, w in ((q, wq), (k, wk)):
        y = _ref._rotate_interleaved(_ref._rms(t.to(cos.dtype), eps) * w.to(cos.dtype), cos, sin)
        out += _to_fp8_heads(y, fp8_pow2_scale(fp8_weight_bound(w, heads)).expand(q.shape[0], heads))
    return tuple(out)


def qk_rms_norm_rope_split_fp8(q: Tensor, k: Tensor, wq: Tensor, wk: Tensor, eps: float, cos: Tensor, sin: Tensor,
                               groups: int) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """qk_rms_norm_rope_split in fp32 (never rounded to q.dtype), to FP8 per group of heads with scales from the
    weight bound √D · max|w| over the group's channels."""
    acc = _ref._acc(q)
    out = []
    for t, w in ((q, wq), (k, wk)):
        y = _ref._split_rotate(_ref._rms(t.to(acc), eps) * w.to(acc), cos, sin)
        out += _to_fp8_heads(y, fp8_pow2_scale(fp8_weight_bound(w, groups)).expand(q.shape[0], groups))
    return tuple(out)


def quantize_fp8_heads(x: Tensor, heads: int) -> tuple[Tensor, Tensor]:
    """x (B, S, D) to FP8 with one power-of-two scale per (batch, head), from the head's amax over all tokens."""
    b, s, d = x.shape
    y = x.to(_ref._acc(x))
    amax = y.abs().reshape(b, s, heads, d // heads).amax(dim=(1, 3)) if x.numel() else y.new_zeros(b, heads)
    return _to_fp8_heads(y, fp8_pow2_scale(amax))


def linear_fp8(x: Tensor, x_scale: Tensor, weight: Tensor, weight_scale: Tensor, bias: Tensor | None = None,
               out_dtype: torch.dtype = torch.bfloat16, fast_accumulation: bool = False) -> Tensor:
    """(x * x_scale) @ (weight * weight_scale)ᵀ + bias in fp32, rounded once to out_dtype. x (..., K) FP8 with
    x_scale (..., 1); weight (N, K) FP8 with weight_scale (N, 1) or (N,). fast_accumulation: the tensor cores'
    approximation of this sum; the oracle is the sum itself."""
    dequantized = x.float() * x_scale.float()
    w = weight.float() * weight_scale.float().reshape(-1, 1)
    return F.linear(dequantized, w, None if bias is None else bias.float()).to(out_dtype)


# Last: `reference` imports the names above at its own end, so this import finds them whichever module came first.
from ltxbench.ops import reference as _ref  # noqa: E402
