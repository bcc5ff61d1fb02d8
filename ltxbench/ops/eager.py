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


def ltx_rms_norm_modulate(x: Tensor, scale: Tensor, shift: Tensor, eps: float = 1e-6) -> Tensor:
    """LTXVideoTransformerBlock: `norm1(h) * (1 + scale_msa) + shift_msa`, all in the model dtype."""
    return diffusers_rms_norm(x, None, eps) * (1 + scale) + shift


def ltx_layer_norm_modulate(x: Tensor, scale: Tensor, shift: Tensor, eps: float = 1e-6) -> Tensor:
    """LTX final layer: no-affine LayerNorm, then `* (1 + scale) + shift`."""
    return F.layer_norm(x, (x.shape[-1],), eps=eps) * (1 + scale) + shift


def ltx_gated_residual(h: Tensor, a: Tensor, gate: Tensor) -> Tensor:
    """LTXVideoTransformerBlock: `hidden_states = hidden_states + attn_hidden_states * gate_msa`."""
    return h + a * gate


def ltx_add_rms_norm_modulate(h: Tensor, a: Tensor, gate: Tensor | None, scale: Tensor, shift: Tensor,
                              eps: float = 1e-6) -> tuple[Tensor, Tensor]:
    """`h = h + a (* gate)` then `norm2(h) * (1 + scale_mlp) + shift_mlp`."""
    h_new = h + (a if gate is None else a * gate)
    return ltx_rms_norm_modulate(h_new, scale, shift, eps), h_new
