"""A decode step's RMSNorms folded into the GEMV after them (ltxbench.ops.norm_linear): a decoder layer's
input_layernorm into its fused q/k/v projection, and its `residual + attn` add and post_attention_layernorm into its
fused gate/up projection, whose epilogue also applies the SwiGLU. Each of those norms (and the SwiGLU) was a kernel of
its own that wrote a row for the next kernel to read back; the GEMV reads the whole row anyway, so it sums the squares
and applies the weight as it loads it. The normed row is then not rounded to the model's dtype before the product (an
unfused norm stores it so): the result is the fp32 product rounded once. Only where the norm is the patched one,
unhooked, and the fused weights still stand for their layers; a prompt's rows, a bias (Qwen2's q/k/v) or gradients
keep the unfused path. `LTXBENCH_NORM_GEMV=0` keeps the norms (and the SwiGLU) as kernels of their own (A/B).

With `LTXBENCH_QKV_ROPE_CACHE=1` (opt-in until timed) a decode step into a static cache layer also ends its q/k/v GEMV
in the RoPE and the cache's writes (rms_norm_qkv_rope_cache): rope_1d_cache's launch, and its read of q/k/v, go.
"""
from __future__ import annotations

import os

import torch

from ltxbench.inject import ORIGINAL_CLASS, observed
from ltxbench.inject.fuse import fused_linear, unobserved
from ltxbench.inject.llm.attention import decode_rows

KNOB = "LTXBENCH_NORM_GEMV"
ROPE_CACHE_KNOB = "LTXBENCH_QKV_ROPE_CACHE"
INPUT_NORM_KWARG = "ltxbench_input_norm"  # the layer's input_layernorm, handed to our attention forward to apply
NORM_ROWS = (torch.float32, torch.float16, torch.bfloat16)


def enabled() -> bool:
    return os.environ.get(KNOB, "1") != "0"


def rope_cache_enabled() -> bool:
    return enabled() and os.environ.get(ROPE_CACHE_KNOB, "0") == "1"


def norm_ops(ops):
    """The fused norm + projection ops of the provider `ops`: its own where it has them, else ltxbench.ops.norm_linear's
    (the CUDA ops for ltxbench.ops, the reference twins for any other provider)."""
    if hasattr(ops, "add_rms_norm_linear"):
        return ops
    import ltxbench.ops as cuda_ops
    from ltxbench.ops import norm_linear

    return norm_linear if ops is cuda_ops else norm_linear.reference


def eps_of(norm) -> float:
    return norm.variance_epsilon if hasattr(norm, "variance_epsilon") else norm.eps


def takes(x, norm, weight, bias) -> bool:
    """The norm `norm` and the projection (weight, bias) after it may run as one op on x: a decode step's rows, no bias,
    one dtype, the norm unhooked and resident, no autocast and no gradient wanted."""
    wants_grad = torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad or norm.weight.requires_grad)
    return (decode_rows(x) and bias is None and x.dtype == weight.dtype == norm.weight.dtype and x.dtype in NORM_ROWS
            and not norm.weight.is_meta and not observed(norm) and not torch.is_autocast_enabled(x.device.type)
            and not wants_grad)


def attention_takes_input_norm(attn, norm, hidden_states) -> bool:
    """The layer may hand its input_layernorm to the attention (INPUT_NORM_KWARG) instead of applying it: the attention
    runs our forward (which applies it, folded or not), unhooked, on a decode step's rows, and nobody observes the
    norm's call."""
    return ORIGINAL_CLASS in vars(type(attn)) and unobserved(attn) and decode_rows(hidden_states) and \
        not observed(norm)


def qkv_with_input_norm(ops, linear, hidden_states, projections, fused, norm):
    """The q/k/v projection of norm(hidden_states): one op where `takes`, else the norm, then `linear`; None where the
    fused weights no longer stand for the layers (the caller then applies the norm and runs the layers)."""
    fused_ops = norm_ops(ops)

    def norm_then_linear(x, weight, bias=None):
        if takes(x, norm, weight, bias):
            return fused_ops.rms_norm_linear(x, norm.weight, eps_of(norm), weight)
        return linear(norm(x), weight, bias)

    return fused_linear(hidden_states, projections, fused, norm_then_linear)


def swiglu_with_post_norm(ops, mlp, fused, attn_out, residual, norm):
    """(act, h): h = residual + attn_out, and `silu(gate) * up` of post_attention_layernorm(h)'s gate/up projection, as
    one op (the SwiGLU in the GEMV's epilogue), or None where it cannot stand for the unfused path (the caller then runs
    that). Only for an MLP the MLP rule fused, which checked that its activation is SiLU."""
    fused_ops = norm_ops(ops)
    layers = (mlp.gate_proj, mlp.up_proj)

    def add_norm_linear_swiglu(x, weight, bias=None):
        if not (takes(x, norm, weight, bias) and residual.dtype == x.dtype and residual.shape == x.shape):
            return None
        return fused_ops.add_rms_norm_linear(x, residual, norm.weight, eps_of(norm), weight, activation="swiglu")

    return fused_linear(attn_out, layers, fused, add_norm_linear_swiglu)


def qkv_rope_cache(ops, hidden_states, projections, fused, norm, layer, cos_table, sin_table):
    """q rotated, (B, Hq, S, head_dim), with k and v rotated and written into the static cache layer `layer` (rows
    cumulative_length + s; the caller advances the length), from norm(hidden_states) @ [q | k | v]ᵀ as one op; or None,
    with nothing done: no such layer (static_layer_for), a partial rotary dim (the tables narrower than half a head)
    or inputs `takes` refuses. rope_1d_cache's own math, on the q/k/v GEMV's rounded outputs. The caller asks only
    with the knob on (rope_cache_enabled)."""
    if layer is None or hidden_states.dim() != 3:
        return None
    if 2 * cos_table.shape[-1] != layer.keys.shape[-1]:
        return None
    op = getattr(norm_ops(ops), "rms_norm_qkv_rope_cache", None)  # a provider of its own may lack it
    if op is None:
        return None

    def norm_qkv_rope_cache(x, weight, bias=None):
        if not takes(x, norm, weight, bias):
            return None
        return op(x, norm.weight, eps_of(norm), weight, cos_table, sin_table, layer.keys, layer.values,
                  layer.cumulative_length)

    return fused_linear(hidden_states, projections, fused, norm_qkv_rope_cache)
