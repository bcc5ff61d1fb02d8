"""Pure-torch twins of every ltxbench op: the test oracle and the `reference` kernel provider.

Same signatures and fused semantics as the CUDA ops in `ltxbench.ops`: math in fp32 (or float64 when the
inputs are float64, which makes this the float64 oracle too), rounded once to the input dtype — except
where the unfused model stores an intermediate in the input dtype (the residual sum h), which is rounded
the same way here and in the kernels.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

Tensor = torch.Tensor


def _acc(x: Tensor) -> torch.dtype:
    return torch.promote_types(x.dtype, torch.float32)


def _rms(h: Tensor, eps: float) -> Tensor:
    return h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)


def _apply_weight(n: Tensor, weight: Tensor | None, dtype: torch.dtype, cast_before_weight: bool) -> Tensor:
    if weight is None:
        return n
    if cast_before_weight:  # transformers' LlamaRMSNorm: cast the normalized row, then scale in that dtype
        return (n.to(dtype).to(n.dtype) * weight.to(n.dtype)).to(dtype).to(n.dtype)
    return n * weight.to(n.dtype)


def _modulate(n: Tensor, scale: Tensor, shift: Tensor) -> Tensor:
    return n * (1 + scale.to(n.dtype)) + shift.to(n.dtype)


def _residual(h: Tensor, a: Tensor, gate: Tensor | None) -> Tensor:
    acc = _acc(h)
    s = h.to(acc) + (a.to(acc) if gate is None else a.to(acc) * gate.to(acc))
    return s.to(h.dtype)


def rms_norm(x: Tensor, weight: Tensor | None = None, eps: float = 1e-6, cast_before_weight: bool = False,
             weight_offset: float = 0.0) -> Tensor:
    n = _rms(x.to(_acc(x)), eps)
    if weight is not None and weight_offset:
        weight = weight_offset + weight.to(n.dtype)
    return _apply_weight(n, weight, x.dtype, cast_before_weight).to(x.dtype)


def fused_add_rms_norm(x: Tensor, residual: Tensor, weight: Tensor | None = None, eps: float = 1e-6,
                       cast_before_weight: bool = False, weight_offset: float = 0.0) -> tuple[Tensor, Tensor]:
    h = _residual(residual, x, None)
    return rms_norm(h, weight, eps, cast_before_weight, weight_offset), h


def rms_norm_modulate(x: Tensor, weight: Tensor | None, scale: Tensor, shift: Tensor, eps: float = 1e-6) -> Tensor:
    n = _apply_weight(_rms(x.to(_acc(x)), eps), weight, x.dtype, False)
    return _modulate(n, scale, shift).to(x.dtype)


def layer_norm_modulate(x: Tensor, scale: Tensor, shift: Tensor, eps: float = 1e-6) -> Tensor:
    n = F.layer_norm(x.to(_acc(x)), (x.shape[-1],), eps=eps)
    return _modulate(n, scale, shift).to(x.dtype)


def gated_residual(h: Tensor, a: Tensor, gate: Tensor) -> Tensor:
    return _residual(h, a, gate)


def add_rms_norm_modulate(h: Tensor, a: Tensor, gate: Tensor | None, scale: Tensor, shift: Tensor,
                          eps: float = 1e-6) -> tuple[Tensor, Tensor]:
    h_new = _residual(h, a, gate)
    return rms_norm_modulate(h_new, None, scale, shift, eps), h_new


# ---- RoPE ---------------------------------------------------------------------------------------------

def ltx_rope_freqs(dim: int, theta: float = 10000.0, device=None) -> Tensor:
    """LTXVideoRotaryPosEmbed's base frequencies, computed exactly as diffusers does (fp32), times π/2."""
    import math

    freqs = theta ** torch.linspace(math.log(1.0, theta), math.log(theta, theta), dim // 6, device=device,
                                    dtype=torch.float32)
    return freqs * math.pi / 2.0


def ltx_rope_grid(rope, batch_size: int, num_frames: int, height: int, width: int,
                  rope_interpolation_scale=None, video_coords: Tensor | None = None, device=None) -> Tensor:
    """The fractional (t, h, w) grid (B, S, 3) that diffusers' LTXVideoRotaryPosEmbed `rope` builds: from the
    latent sizes and the pipeline's rope_interpolation_scale, or from explicit video_coords (B, 3, S)."""
    if video_coords is None:
        return rope._prepare_video_coords(batch_size, num_frames, height, width, rope_interpolation_scale, device)
    return torch.stack([video_coords[:, 0] / rope.base_num_frames, video_coords[:, 1] / rope.base_height,
                        video_coords[:, 2] / rope.base_width], dim=-1)


def ltx_cos_sin(grid: Tensor, freqs: Tensor, dim: int, dtype: torch.dtype = torch.float32) -> tuple[Tensor, Tensor]:
    """diffusers' LTX cos/sin (B, S, dim) from the fractional grid (B, S, 3): axes interleaved per
    frequency, each angle repeated for its pair, `dim % 6` leading channels padded with cos 1 / sin 0.
    The angles are fp32 as the model defines them; `dtype` only sets the precision of cos/sin."""
    angles = (freqs.float() * (grid.float().unsqueeze(-1) * 2 - 1)).transpose(-1, -2).flatten(2).to(dtype)
    cos, sin = angles.cos().repeat_interleave(2, dim=-1), angles.sin().repeat_interleave(2, dim=-1)
    pad = dim % 6
    if pad:
        cos = torch.cat([torch.ones_like(cos[:, :, :pad]), cos], dim=-1)
        sin = torch.cat([torch.zeros_like(sin[:, :, :pad]), sin], dim=-1)
    return cos, sin


def _rotate_interleaved(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    real, imag = x.unflatten(-1, (-1, 2)).unbind(-1)
    return x * cos + torch.stack([-imag, real], dim=-1).flatten(-2) * sin


def wan_cos_sin(tokens: int, head_dim: int, frames_hw: tuple[int, int, int] | None = None,
                theta: float = 10000.0, device=None) -> tuple[Tensor, Tensor]:
    """diffusers' WanRotaryPosEmbed cos/sin, (1, tokens, head_dim) fp32: the head dim split into frame, height and
    width parts (2·(head_dim // 6) each for height and width, the rest for frames), each part's angles position ·
    theta^(-2j / part) repeated for its pair, tokens in (frame, height, width) order. frames_hw: the latent grid
    after patchify (default: the smallest cube that holds `tokens`, cut to them)."""
    h_dim = w_dim = 2 * (head_dim // 6)
    t_dim = head_dim - h_dim - w_dim
    if frames_hw is None:
        side = max(1, round(tokens ** (1 / 3)))
        while side ** 3 < tokens:
            side += 1
        frames_hw = (side, side, side)
    parts = []
    for axis, dim in enumerate((t_dim, h_dim, w_dim)):
        inv = 1.0 / theta ** (torch.arange(0, dim, 2, dtype=torch.float64, device=device)[: dim // 2] / dim)
        pos = torch.arange(frames_hw[axis], dtype=torch.float64, device=device)
        shape = [1, 1, 1, dim // 2]
        shape[axis] = frames_hw[axis]
        parts.append(torch.outer(pos, inv).view(shape).expand(*frames_hw, dim // 2))
    angles = torch.cat(parts, dim=-1).reshape(1, -1, head_dim // 2)[:, :tokens]
    return (angles.cos().repeat_interleave(2, dim=-1).float(), angles.sin().repeat_interleave(2, dim=-1).float())


def _ltx_tables(q: Tensor, cos, sin, grid, freqs) -> tuple[Tensor, Tensor]:
    """cos/sin over the whole inner dim: LTX's (B|1, S, D), from its grid, or tables one head wide (Wan's
    (B|1, S, P), P dividing D) repeated across the heads."""
    if (cos is None) == (grid is None):
        raise ValueError("pass either cos and sin, or grid and freqs (exactly one pair)")
    acc = _acc(q)
    if cos is None:
        cos, sin = ltx_cos_sin(grid, freqs, q.shape[-1], acc)
    repeat = q.shape[-1] // cos.shape[-1] if cos.shape[-1] else 1  # D = 0: nothing to repeat
    return cos.to(acc).repeat(1, 1, repeat), sin.to(acc).repeat(1, 1, repeat)


def rope_3d(q: Tensor, k: Tensor, cos: Tensor | None = None, sin: Tensor | None = None,
            grid: Tensor | None = None, freqs: Tensor | None = None) -> tuple[Tensor, Tensor]:
    cos, sin = _ltx_tables(q, cos, sin, grid, freqs)
    return tuple(_rotate_interleaved(t.to(cos.dtype), cos, sin).to(t.dtype) for t in (q, k))


def qk_rms_norm_rope(q: Tensor, k: Tensor, wq: Tensor, wk: Tensor, eps: float = 1e-5, cos: Tensor | None = None,
                     sin: Tensor | None = None, grid: Tensor | None = None,
                     freqs: Tensor | None = None) -> tuple[Tensor, Tensor]:
    cos, sin = _ltx_tables(q, cos, sin, grid, freqs)
    acc = cos.dtype
    return tuple(_rotate_interleaved(_rms(t.to(acc), eps) * w.to(acc), cos, sin).to(t.dtype)
                 for t, w in ((q, wq), (k, wk)))



def pack_qkv(q: Tensor, k: Tensor, v: Tensor, parts: int) -> Tensor:
    """q, k, v (B, S, D) as (parts, B, S, 3, D / parts): part r holds channels [r·D/parts, (r+1)·D/parts) of each."""
    b, s, d = q.shape
    out = q.new_empty((parts, b, s, 3, d // parts))  # contiguous even when empty (.contiguous() keeps those strides)
    return out.copy_(torch.stack((q, k, v), dim=2).unflatten(3, (parts, d // parts)).permute(3, 0, 1, 2, 4))


def qk_rms_norm_rope_pack(q: Tensor, k: Tensor, v: Tensor, wq: Tensor, wk: Tensor, eps: float = 1e-5,
                          cos: Tensor | None = None, sin: Tensor | None = None, grid: Tensor | None = None,
                          freqs: Tensor | None = None, parts: int = 1) -> Tensor:
    return pack_qkv(*qk_rms_norm_rope(q, k, wq, wk, eps, cos, sin, grid, freqs), v, parts)

def qk_rms_norm_rope_kv(q: Tensor, k: Tensor, v: Tensor, wq: Tensor, wk: Tensor, eps: float = 1e-5,
                        cos: Tensor | None = None, sin: Tensor | None = None, grid: Tensor | None = None,
                        freqs: Tensor | None = None) -> tuple[Tensor, Tensor]:
    q, k = qk_rms_norm_rope(q, k, wq, wk, eps, cos, sin, grid, freqs)
    return q, torch.stack((k, v.to(k.dtype)), dim=2)


def ltx2_split_cos_sin(grid: Tensor, dim: int, heads: int, theta: float = 10000.0) -> tuple[Tensor, Tensor]:
    """diffusers' LTX2AudioVideoRotaryPosEmbed tables for rope_type "split", from the fractional coordinates grid
    (B, S, n) (n = 3 for video, 1 for audio): fp32 cos, sin as the (B, heads, S, dim / (2 heads)) swapaxes view of
    (B, S, heads, r) memory, the dim/2 - n (dim // 2n) leading slots (head 0's start) padded with cos 1 / sin 0."""
    import math

    n = grid.shape[-1]
    steps = dim // (2 * n)
    freqs = (theta ** torch.linspace(0.0, 1.0, steps, dtype=torch.float64, device=grid.device) * math.pi / 2.0)
    angles = ((grid.float().unsqueeze(-1) * 2 - 1) * freqs.float()).transpose(-1, -2).flatten(2)
    cos, sin = angles.cos(), angles.sin()
    pad = dim // 2 - angles.shape[-1]
    if pad:
        cos = torch.cat([cos.new_ones((*cos.shape[:2], pad)), cos], dim=-1)
        sin = torch.cat([sin.new_zeros((*sin.shape[:2], pad)), sin], dim=-1)
    b, s = grid.shape[:2]
    r = dim // (2 * heads)
    return cos.reshape(b, s, heads, r).swapaxes(1, 2), sin.reshape(b, s, heads, r).swapaxes(1, 2)


def _split_rotate(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """x (B, S, D) seen as (B, S, H, 2, r), its halves rotated per head by cos/sin (B|1, H, S, r) in x's dtype."""
    b, s, d = x.shape
    if cos.dim() != 4 or cos.shape[1] == 0 or d != cos.shape[1] * 2 * cos.shape[3]:
        raise ValueError(f"split RoPE: cos must be (B|1, heads, S, head_dim / 2) with heads * head_dim = D = {d}, "
                         f"got {tuple(cos.shape)}")
    h, r = cos.shape[1], cos.shape[3]
    c, sn = (t.to(x.dtype).transpose(1, 2).unsqueeze(-2) for t in (cos, sin))  # (B|1, S, H, 1, r)
    x1, x2 = x.reshape(b, s, h, 2, r).split(1, dim=-2)
    return torch.cat([x1 * c - x2 * sn, x2 * c + x1 * sn], dim=-2).reshape(b, s, d)


def _norm_rope_split(x: Tensor, weight: Tensor, eps: float, cos: Tensor, sin: Tensor) -> Tensor:
    acc = _acc(x)
    return _split_rotate(_rms(x.to(acc), eps) * weight.to(acc), cos, sin).to(x.dtype)


def rms_norm_rope_split(x: Tensor, weight: Tensor, eps: float, cos: Tensor, sin: Tensor) -> Tensor:
    """LTX-2's norm_q / norm_k (RMSNorm over the whole inner dim D, times weight) then the split (per-head neox)
    RoPE of diffusers' apply_split_rotary_emb with cos/sin (B|1, H, S, D / 2H); fp32 math, one rounding."""
    return _norm_rope_split(x, weight, eps, cos, sin)


def qk_rms_norm_rope_split(q: Tensor, k: Tensor, wq: Tensor, wk: Tensor, eps: float, cos: Tensor,
                           sin: Tensor) -> tuple[Tensor, Tensor]:
    """rms_norm_rope_split of q and of k (same shape) with one shared cos/sin table: LTX-2's self-attention. (Not
    through the public twin: patched code must show up as the one op it calls.)"""
    return _norm_rope_split(q, wq, eps, cos, sin), _norm_rope_split(k, wk, eps, cos, sin)


def token_positions(cos: Tensor, batch: int, seq: int) -> Tensor:
    """The rows of per-token tables, for rope_1d without positions: (B*S, rot/2) tables are row b*S + s,
    (S, rot/2) tables (shared by the batch) row s."""
    rows = cos.shape[0]
    if rows == batch * seq:
        return torch.arange(rows, device=cos.device).view(batch, seq)
    if rows == seq:
        return torch.arange(seq, device=cos.device)[None]
    raise ValueError(f"rope_1d without positions: cos/sin must have B*S = {batch * seq} or S = {seq} rows, got {rows}")


def rope_1d(q: Tensor, k: Tensor, cos: Tensor, sin: Tensor, positions: Tensor | None = None,
            interleaved: bool = False) -> tuple[Tensor, Tensor]:
    """q (B, Hq, S, hd), k (B, Hk, S, hd); cos/sin tables (P, rot/2) gathered at positions (B|1, S), or per-token
    tables (B*S or S rows) when positions is None."""
    if positions is None:
        positions = token_positions(cos, q.shape[0], q.shape[2])
    acc = _acc(q)
    c, s = cos.to(acc)[positions].unsqueeze(1), sin.to(acc)[positions].unsqueeze(1)  # (B|1, 1, S, rot/2)
    half = cos.shape[-1]

    def apply(x: Tensor) -> Tensor:
        xf, rest = x.to(acc)[..., : 2 * half], x.to(acc)[..., 2 * half:]
        if interleaved:
            even, odd = xf[..., 0::2], xf[..., 1::2]
            rotated = torch.stack([even * c - odd * s, odd * c + even * s], dim=-1).flatten(-2)
        else:
            x1, x2 = xf[..., :half], xf[..., half:]
            rotated = torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], dim=-1)
        out = torch.cat([rotated, rest], dim=-1).to(x.dtype)
        return out.transpose(1, 2).contiguous().transpose(1, 2)  # token-major, as the kernel lays it out

    return apply(q), apply(k)


def rope_1d_cache(q: Tensor, k: Tensor, v: Tensor, cos: Tensor, sin: Tensor, k_cache: Tensor, v_cache: Tensor,
                  offset: Tensor, interleaved: bool = False) -> Tensor:
    """rope_1d (per-token tables), then k and v written into the caches at rows offset + s as a static cache layer
    writes them (index_copy_ along the length); q rotated."""
    qr, kr = rope_1d(q, k, cos, sin, None, interleaved)
    rows = offset.reshape(()).to(torch.long) + torch.arange(q.shape[2], device=q.device)
    k_cache.index_copy_(2, rows, kr)
    v_cache.index_copy_(2, rows, v)
    return qr


# ---- activations --------------------------------------------------------------------------------------

def gelu_tanh(x: Tensor) -> Tensor:
    return F.gelu(x.to(_acc(x)), approximate="tanh").to(x.dtype)


def _halves(x: Tensor, gate_half: int) -> tuple[Tensor, Tensor]:
    first, second = x.to(_acc(x)).chunk(2, dim=-1)
    return (second, first) if gate_half == 0 else (first, second)  # (value, gate)


def geglu(x: Tensor, gate_half: int = 1, approximate: bool = False) -> Tensor:
    value, gate = _halves(x, gate_half)
    return (value * F.gelu(gate, approximate="tanh" if approximate else "none")).to(x.dtype)


def swiglu(x: Tensor, gate_half: int = 0) -> Tensor:
    value, gate = _halves(x, gate_half)
    return (value * F.silu(gate)).to(x.dtype)


def cross_attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None, scale: float | None = None) -> Tensor:
    """softmax(q kᵀ · scale + mask) v in fp32 (float64 for float64 inputs); q (B, S, H, hd), k/v (B, L, H, hd)."""
    acc = _acc(q)
    qh, kh, vh = (t.to(acc).transpose(1, 2) for t in (q, k, v))
    scores = qh @ kh.transpose(-1, -2) * (q.shape[-1] ** -0.5 if scale is None else scale)
    if mask is not None:
        scores = scores + mask.to(acc)
    return (scores.softmax(-1) @ vh).transpose(1, 2).to(q.dtype).clone(memory_format=torch.contiguous_format)


def decode_attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None,
                     scale: float | None = None) -> Tensor:
    """softmax(q kᵀ · scale + mask) v in fp32 (float64 for float64 inputs) for q (B, H, G, hd) over k, v (B, H, L,
    hd); a bool mask excludes keys, an additive one is added; a query with no key left gets zeros."""
    acc = _acc(q)
    if q.shape[-1] == 0 or k.shape[-2] == 0 or q.numel() == 0:
        return torch.zeros(q.shape, dtype=q.dtype, device=q.device)
    scores = q.to(acc) @ k.to(acc).transpose(-1, -2) * (q.shape[-1] ** -0.5 if scale is None else scale)
    if mask is not None:
        scores = scores.masked_fill(~mask, -math.inf) if mask.dtype == torch.bool else scores + mask.to(acc)
    weights = torch.where(scores == -math.inf, 0.0, (scores - scores.amax(-1, keepdim=True)).exp())
    total = weights.sum(-1, keepdim=True)
    out = (weights @ v.to(acc)) / torch.where(total > 0, total, 1.0)
    return out.to(q.dtype).contiguous()


def linear_gelu_tanh(x: Tensor, weight: Tensor, bias: Tensor) -> Tensor:
    """The unfused `gelu_tanh(x @ weight.T + bias)` (the projection in x's dtype, as nn.Linear computes it)."""
    return F.gelu(F.linear(x, weight, bias), approximate="tanh")


def linear(x: Tensor, weight: Tensor, bias: Tensor | None = None, activation: str = "none",
           residual: Tensor | None = None) -> Tensor:
    """act(x @ weight.T + bias) + residual with the products, the bias, the activation and the residual in fp32
    (float64 for float64 inputs), rounded once: what cuBLASLt's fp32-accumulating GEMM with an epilogue (and
    beta = 1 for the residual) computes."""
    acc = _acc(x)
    out = F.linear(x.to(acc), weight.to(acc), None if bias is None else bias.to(acc))
    if activation == "gelu_tanh":
        out = F.gelu(out, approximate="tanh")
    if residual is not None:
        out = out + residual.to(acc)
    return out.to(x.dtype)


def qk_rms_norm_rope_split_pack(q: Tensor, k: Tensor, v: Tensor, wq: Tensor, wk: Tensor, eps: float, cos: Tensor,
                                sin: Tensor, parts: int = 1) -> Tensor:
    return pack_qkv(*qk_rms_norm_rope_split(q, k, wq, wk, eps, cos, sin), v, parts)


# The FP8 twins, reference_fp8's __all__ (it uses the helpers above and imports this module at its own end, so
# either module may be imported first): the provider holds every op.
from ltxbench.ops.reference_fp8 import *  # noqa: E402, F403
