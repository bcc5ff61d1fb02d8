"""The unfused formulas exactly as the host libraries write them (diffusers, transformers, torch.nn).

These are the `eager` baselines of `bench micro` (and, under torch.compile, the `compile` baseline), and
the yardstick for numerics: a kernel's error may not exceed ~2x the error of these in the same dtype.
Intermediates are stored in the input dtype wherever the library code does so.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

Tensor = torch.Tensor


def diffusers_rms_norm(x: Tensor, weight: Tensor | None = None, eps: float = 1e-6) -> Tensor:
    """diffusers.models.normalization.RMSNorm.forward (LTX norm1/norm2 have no weight)."""
    dtype = x.dtype
    h = x.to(torch.float32)
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    if weight is None:
        return h.to(dtype)
    if weight.dtype in (torch.float16, torch.bfloat16):
        return h.to(weight.dtype) * weight
    return (h * weight).to(dtype)


def llama_rms_norm(x: Tensor, weight: Tensor, eps: float = 1e-6) -> Tensor:
    """transformers LlamaRMSNorm.forward (also Mistral, Qwen2, Qwen3)."""
    dtype = x.dtype
    h = x.to(torch.float32)
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(dtype)


def gemma_rms_norm(x: Tensor, weight: Tensor, eps: float = 1e-6, weight_offset: float = 1.0) -> Tensor:
    """transformers' Gemma3RMSNorm.forward: `(x.float() * rsqrt(mean(x²) + eps)) * (1.0 + weight.float())`, rounded
    once to x's dtype (weight_offset: the 1.0)."""
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return (h * (weight_offset + weight.float())).type_as(x)


def gemma_add_rms_norm(x: Tensor, residual: Tensor, weight: Tensor, eps: float = 1e-6,
                       weight_offset: float = 1.0) -> tuple[Tensor, Tensor]:
    """Gemma3DecoderLayer's `residual + post_attention_layernorm(...)`, then pre_feedforward_layernorm."""
    h = residual + x
    return gemma_rms_norm(h, weight, eps, weight_offset), h


def torch_rms_norm(x: Tensor, weight: Tensor | None = None, eps: float = 1e-6) -> Tensor:
    """The fused torch op (F.rms_norm), the strongest eager baseline for RMSNorm."""
    return F.rms_norm(x, (x.shape[-1],), weight, eps)


def llama_add_rms_norm(x: Tensor, residual: Tensor, weight: Tensor, eps: float = 1e-6) -> tuple[Tensor, Tensor]:
    """LlamaDecoderLayer: `hidden = residual + hidden; normed = post_attention_layernorm(hidden)`."""
    h = residual + x
    return llama_rms_norm(h, weight, eps), h


def torch_add_rms_norm(x: Tensor, residual: Tensor, weight: Tensor, eps: float = 1e-6) -> tuple[Tensor, Tensor]:
    h = residual + x
    return F.rms_norm(h, (h.shape[-1],), weight, eps), h


def ltx_rms_norm_modulate(x: Tensor, scale: Tensor, shift: Tensor, eps: float = 1e-6,
                          weight: Tensor | None = None) -> Tensor:
    """LTXVideoTransformerBlock: `norm1(h) * (1 + scale_msa) + shift_msa`, all in the model dtype (LTX's norm
    has no weight; with one, diffusers' affine RMSNorm)."""
    return diffusers_rms_norm(x, weight, eps) * (1 + scale) + shift


def _wan_float32(x: Tensor, modulation: Tensor) -> bool:
    return modulation.dtype == torch.float32 and x.dtype != torch.float32


def ltx_layer_norm_modulate(x: Tensor, scale: Tensor, shift: Tensor, eps: float = 1e-6) -> Tensor:
    """LTX final layer: no-affine LayerNorm, then `* (1 + scale) + shift`. With float32 modulation over 16-bit x,
    Wan's block: `(norm1(x.float()) * (1 + scale) + shift).type_as(x)`, one rounding."""
    if _wan_float32(x, scale):
        return (F.layer_norm(x.float(), (x.shape[-1],), eps=eps) * (1 + scale) + shift).type_as(x)
    return F.layer_norm(x, (x.shape[-1],), eps=eps) * (1 + scale) + shift


def ltx_gated_residual(h: Tensor, a: Tensor, gate: Tensor) -> Tensor:
    """LTXVideoTransformerBlock: `hidden_states = hidden_states + attn_hidden_states * gate_msa`. With a float32
    gate over 16-bit h, Wan's block: `(h.float() + a * gate).type_as(h)`, one rounding."""
    if _wan_float32(h, gate):
        return (h.float() + a * gate).type_as(h)
    return h + a * gate


def ltx_add_rms_norm_modulate(h: Tensor, a: Tensor, gate: Tensor | None, scale: Tensor, shift: Tensor,
                              eps: float = 1e-6) -> tuple[Tensor, Tensor]:
    """`h = h + a (* gate)` then `norm2(h) * (1 + scale_mlp) + shift_mlp`."""
    h_new = h + (a if gate is None else a * gate)
    return ltx_rms_norm_modulate(h_new, scale, shift, eps), h_new


def diffusers_apply_rotary_emb(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """diffusers.models.transformers.transformer_ltx.apply_rotary_emb."""
    real, imag = x.unflatten(2, (-1, 2)).unbind(-1)
    rotated = torch.stack([-imag, real], dim=-1).flatten(2)
    return (x.float() * cos + rotated.float() * sin).to(x.dtype)


def _ltx_tables(q, cos, sin, grid, freqs):
    if cos is None:  # the model computes these once per forward, outside the attention layers
        from ltxbench.ops.reference import ltx_cos_sin

        cos, sin = ltx_cos_sin(grid, freqs, q.shape[-1])
    return cos, sin


def ltx_rope_3d(q, k, cos=None, sin=None, grid=None, freqs=None):
    cos, sin = _ltx_tables(q, cos, sin, grid, freqs)
    return diffusers_apply_rotary_emb(q, cos, sin), diffusers_apply_rotary_emb(k, cos, sin)


def wan_apply_rotary_emb(x: Tensor, freqs_cos: Tensor, freqs_sin: Tensor) -> Tensor:
    """The rotation inside diffusers' WanAttnProcessor: x (B, S, heads, head_dim), tables (B|1, S, 1, head_dim)."""
    x1, x2 = x.unflatten(-1, (-1, 2)).unbind(-1)
    cos, sin = freqs_cos[..., 0::2], freqs_sin[..., 1::2]
    out = torch.empty_like(x)
    out[..., 0::2] = x1 * cos - x2 * sin
    out[..., 1::2] = x1 * sin + x2 * cos
    return out.type_as(x)


def ltx_qk_rms_norm_rope(q, k, wq, wk, eps=1e-5, cos=None, sin=None, grid=None, freqs=None):
    """LTXAttention: `norm_q(to_q(h))` (torch.nn.RMSNorm over the inner dim), then apply_rotary_emb. With tables one
    head wide (B|1, S, head_dim), WanAttnProcessor's: the same norms, then the heads rotated by those tables."""
    qn = F.rms_norm(q, (q.shape[-1],), wq, eps)
    kn = F.rms_norm(k, (k.shape[-1],), wk, eps)
    if cos is not None and cos.shape[-1] != q.shape[-1]:
        head_dim = cos.shape[-1]
        return tuple(wan_apply_rotary_emb(t.unflatten(2, (-1, head_dim)), cos.unsqueeze(2), sin.unsqueeze(2))
                     .flatten(2) for t in (qn, kn))
    cos, sin = _ltx_tables(q, cos, sin, grid, freqs)
    return diffusers_apply_rotary_emb(qn, cos, sin), diffusers_apply_rotary_emb(kn, cos, sin)



def ltx_qk_rms_norm_rope_pack(q, k, v, wq, wk, eps=1e-5, cos=None, sin=None, grid=None, freqs=None, parts=1):
    """ltx_qk_rms_norm_rope, then q, k and v copied into a Ulysses send buffer (reference.pack_qkv's layout)."""
    from ltxbench.ops.reference import pack_qkv

    return pack_qkv(*ltx_qk_rms_norm_rope(q, k, wq, wk, eps, cos, sin, grid, freqs), v, parts)

def ltx_qk_rms_norm_rope_kv(q, k, v, wq, wk, eps=1e-5, cos=None, sin=None, grid=None, freqs=None):
    """ltx_qk_rms_norm_rope, then k and v stacked per token (the send buffer of diffusers' ring attention's all-gather
    is a torch.cat of k and v: a copy of both)."""
    q, k = ltx_qk_rms_norm_rope(q, k, wq, wk, eps, cos, sin, grid, freqs)
    return q, torch.stack((k, v), dim=2)


def ltx2_apply_split_rotary_emb(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """diffusers.models.transformers.transformer_ltx2.apply_split_rotary_emb for x (B, S, D) and cos/sin
    (B|1, H, S, r); x's batch and head dim are taken from x itself (diffusers reads them off cos, which leaves out
    a batch-1 table and an empty x)."""
    b, t, d = x.shape
    h = cos.shape[1]
    x = x.reshape(b, t, h, d // h).swapaxes(1, 2)
    r = d // h // 2
    split_x = x.reshape(*x.shape[:-1], 2, r).float()
    first_x, second_x = split_x[..., :1, :], split_x[..., 1:, :]
    cos_u, sin_u = cos.unsqueeze(-2), sin.unsqueeze(-2)
    out = split_x * cos_u
    out[..., :1, :].addcmul_(-sin_u, second_x)
    out[..., 1:, :].addcmul_(sin_u, first_x)
    out = out.reshape(*out.shape[:-2], 2 * r).swapaxes(1, 2).reshape(b, t, d)
    return out.to(dtype=x.dtype)


def ltx2_rms_norm_rope_split(x, weight, eps, cos, sin):
    """LTX2AudioVideoAttnProcessor: `norm_q(to_q(h))` (torch.nn.RMSNorm over all heads, in the model dtype), then
    apply_split_rotary_emb."""
    return ltx2_apply_split_rotary_emb(F.rms_norm(x, (x.shape[-1],), weight, eps), cos, sin)


def ltx2_qk_rms_norm_rope_split(q, k, wq, wk, eps, cos, sin):
    return ltx2_rms_norm_rope_split(q, wq, eps, cos, sin), ltx2_rms_norm_rope_split(k, wk, eps, cos, sin)


def ltx2_qk_rms_norm_rope_split_pack(q, k, v, wq, wk, eps, cos, sin, parts=1):
    """ltx2_qk_rms_norm_rope_split, then q, k and v copied into a Ulysses send buffer (reference.pack_qkv)."""
    from ltxbench.ops.reference import pack_qkv

    return pack_qkv(*ltx2_qk_rms_norm_rope_split(q, k, wq, wk, eps, cos, sin), v, parts)


def hf_rope_1d(q, k, cos, sin, positions=None, interleaved=False):
    """transformers' apply_rotary_pos_emb (rotate-half); cos/sin built per token as LlamaRotaryEmbedding
    does, in the model dtype. Only the neox layout exists there: interleaved falls back to the reference."""
    if interleaved:
        from ltxbench.ops.reference import rope_1d

        return rope_1d(q, k, cos, sin, positions, True)
    if positions is None:
        from ltxbench.ops.reference import token_positions

        positions = token_positions(cos, q.shape[0], q.shape[2])
    half = cos.shape[-1]
    c = torch.cat([cos, cos], dim=-1)[positions].unsqueeze(1).to(q.dtype)
    s = torch.cat([sin, sin], dim=-1)[positions].unsqueeze(1).to(q.dtype)

    def rotate_half(x):
        return torch.cat((-x[..., half:], x[..., :half]), dim=-1)

    def apply(x):
        rot, rest = x[..., : 2 * half], x[..., 2 * half:]
        return torch.cat([rot * c + rotate_half(rot) * s, rest], dim=-1)

    return apply(q), apply(k)


def hf_rope_1d_cache(q, k, v, cos, sin, k_cache, v_cache, offset, interleaved=False):
    """A decode step as transformers runs it: apply_rotary_pos_emb (hf_rope_1d on per-token tables), then the static
    cache layer's update, rows offset + s of both caches written with index_copy_; returns q rotated."""
    qr, kr = hf_rope_1d(q, k, cos, sin, None, interleaved)
    rows = offset.reshape(()).to(torch.long) + torch.arange(q.shape[2], device=q.device)
    k_cache.index_copy_(2, rows, kr)
    v_cache.index_copy_(2, rows, v)
    return qr


def diffusers_gelu_tanh(x: Tensor) -> Tensor:
    """LTX FeedForward activation: GELU(approximate="tanh")."""
    return F.gelu(x, approximate="tanh")


def diffusers_geglu(x: Tensor, gate_half: int = 1, approximate: bool = False) -> Tensor:
    """diffusers GEGLU: `hidden, gate = x.chunk(2, -1); hidden * gelu(gate)` (gate = second half)."""
    first, second = x.chunk(2, dim=-1)
    value, gate = (second, first) if gate_half == 0 else (first, second)
    return value * F.gelu(gate, approximate="tanh" if approximate else "none")


def llama_swiglu(x: Tensor, gate_half: int = 0) -> Tensor:
    """LlamaMLP's `act_fn(gate_proj(x)) * up_proj(x)` on a fused [gate | up] projection."""
    first, second = x.chunk(2, dim=-1)
    value, gate = (second, first) if gate_half == 0 else (first, second)
    return F.silu(gate) * value


def _aligned_for_sdpa(*tensors):
    """The tensors (None kept), each not 16-byte aligned copied: SDPA's memory-efficient kernel faulted (misaligned
    address) on fp32 views 8 bytes past a 16-byte boundary (torch 2.11, H200,
    tests/ops/test_ops_gpu.py::test_strided_inputs[misaligned-fp32])."""
    return tuple(t if t is None or t.data_ptr() % 16 == 0 else t.clone() for t in tensors)


def sdpa_cross_attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None,
                         scale: float | None = None) -> Tensor:
    """diffusers' native attention backend (what LTXVideoAttnProcessor's attn2 runs): SDPA on (B, H, S, hd)
    views with the additive mask, torch's own backend choice (cuDNN on Hopper for 16-bit inputs)."""
    if mask is not None:
        mask = mask.to(q.dtype)  # SDPA takes a float mask in the query's dtype only
    q, k, v, mask = _aligned_for_sdpa(q, k, v, mask)
    out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), attn_mask=mask,
                                         scale=scale)
    return out.transpose(1, 2)


def sdpa_decode_attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None,
                          scale: float | None = None) -> Tensor:
    """transformers' decode step with its query heads packed onto their key/value head (what the LLM rules ran before
    ops.decode_attention): SDPA on (B, H_kv, G, hd) over the cache's (B, H_kv, L, hd), the bool or additive mask,
    torch's own backend choice (cuDNN on Hopper for 16-bit inputs)."""
    if mask is not None and mask.dtype != torch.bool:
        mask = mask.to(q.dtype)  # SDPA takes a float mask in the query's dtype only
    q, k, v, mask = _aligned_for_sdpa(q, k, v, mask)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)


def torch_linear(x: Tensor, weight: Tensor, bias: Tensor | None = None, activation: str = "none",
                 residual: Tensor | None = None) -> Tensor:
    """nn.Linear (torch's addmm: cuBLASLt's heuristic algorithm), then diffusers' GELU(approximate="tanh"), then
    the residual add as the LTX block writes it (`hidden_states + attn_output`)."""
    out = F.linear(x, weight, bias)
    out = F.gelu(out, approximate="tanh") if activation == "gelu_tanh" else out
    return out if residual is None else residual + out


# ---- FP8 (e4m3) per row: the model-dtype op, then a separate quantize pass as user code writes it ----------------

def fp8_rows(x: Tensor) -> tuple[Tensor, Tensor]:
    """Per-row FP8 quantization in plain torch (torchao's row-wise recipe): amax, scale = amax / 448, divide, cast."""
    if x.shape[-1] == 0:
        amax = torch.zeros((*x.shape[:-1], 1), dtype=torch.float32, device=x.device)
    else:
        amax = x.abs().amax(dim=-1, keepdim=True).float()
    scale = amax.clamp(min=1e-12) / 448.0
    return (x.float() / scale).clamp(-448.0, 448.0).to(torch.float8_e4m3fn), scale


def fp8_heads(x: Tensor, heads: int, bound: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """Per-(batch, head) FP8 quantization in plain torch ops: the head's amax over its tokens (or a given bound,
    (B, heads)), the power-of-two scale under 448 / bound, multiply, cast; (q, descale (B, heads))."""
    from ltxbench.ops.reference import fp8_pow2_scale

    b, s, d = x.shape
    xs = x.float().reshape(b, s, heads, d // heads)
    if bound is None:
        bound = xs.abs().amax(dim=(1, 3)) if x.numel() else xs.new_zeros(b, heads)
    scale = fp8_pow2_scale(bound)
    q = (xs * scale[:, None, :, None]).clamp(-448.0, 448.0).to(torch.float8_e4m3fn)
    return q.reshape(b, s, d), 1.0 / scale


def ltx_qk_rms_norm_rope_fp8(q, k, wq, wk, eps, heads, cos=None, sin=None, grid=None, freqs=None):
    """LTXAttention's q/k norm + RoPE (ltx_qk_rms_norm_rope, rounded to q's dtype), then each quantized per head
    with the weight-bound scales (fp8_heads)."""
    from ltxbench.ops.reference import fp8_weight_bound

    qr, kr = ltx_qk_rms_norm_rope(q, k, wq, wk, eps, cos, sin, grid, freqs)
    return tuple(out for x, w in ((qr, wq), (kr, wk))
                 for out in fp8_heads(x, heads, fp8_weight_bound(w, heads).expand(q.shape[0], heads)))


def ltx2_qk_rms_norm_rope_split_fp8(q, k, wq, wk, eps, cos, sin, groups):
    """LTX2Attention's q/k norm + split RoPE (ltx2_qk_rms_norm_rope_split, rounded to q's dtype), then each quantized
    per group of heads with the weight-bound scales (fp8_heads)."""
    from ltxbench.ops.reference import fp8_weight_bound

    qr, kr = ltx2_qk_rms_norm_rope_split(q, k, wq, wk, eps, cos, sin)
    return tuple(out for x, w in ((qr, wq), (kr, wk))
                 for out in fp8_heads(x, groups, fp8_weight_bound(w, groups).expand(q.shape[0], groups)))


def ltx_rms_norm_modulate_fp8(x: Tensor, scale: Tensor, shift: Tensor, eps: float = 1e-6,
                              weight: Tensor | None = None) -> tuple[Tensor, Tensor]:
    return fp8_rows(ltx_rms_norm_modulate(x, scale, shift, eps, weight))


def ltx_add_rms_norm_modulate_fp8(h: Tensor, a: Tensor, gate: Tensor | None, scale: Tensor, shift: Tensor,
                                  eps: float = 1e-6) -> tuple[Tensor, Tensor, Tensor]:
    out, h_new = ltx_add_rms_norm_modulate(h, a, gate, scale, shift, eps)
    return (*fp8_rows(out), h_new)


def diffusers_gelu_tanh_fp8(x: Tensor) -> tuple[Tensor, Tensor]:
    return fp8_rows(diffusers_gelu_tanh(x))
