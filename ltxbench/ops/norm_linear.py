"""An RMSNorm and the projection after it as one op, for an LLM's decode step: `rms_norm_linear` (a decoder layer's
input norm and its q/k/v projection), `add_rms_norm_linear` (the residual add, the post-attention norm and the
gate/up projection) and `rms_norm_qkv_rope_cache` (the input norm, q/k/v, their RoPE and the static KV cache's
writes). Up to 4 rows run on gemv.cu's GEMV with the norm folded into its loads: the normed rows are never written,
and the norm has no launch of its own; other inputs take the same math through ATen in fp32.

Their fakes (for torch.compile) and pure-torch twins (`reference`, the `reference` provider's) live here too.
"""

from __future__ import annotations

import types

import torch

from ltxbench.ops import build
from ltxbench.ops import reference as _reference  # the twins' shared math: reference.py's

Tensor = torch.Tensor
_fakes_registered = False


def _lib():
    """torch.ops.ltxbench, loaded, with these ops' fakes registered (they need the ops to exist)."""
    ops = build.ops()
    if not _fakes_registered:
        _register_fakes()
    return ops


def rms_norm_linear(x: Tensor, norm_weight: Tensor, eps: float, weight: Tensor, weight_offset: float = 0.0) -> Tensor:
    """`rms_norm(x) * (weight_offset + norm_weight) @ weight.T` for x (..., K), norm_weight (K,), weight (N, K):
    fp32 math, rounded once (the normed row is not rounded to x's dtype first, as an unfused norm stores it)."""
    return _lib().rms_norm_linear(x, norm_weight, eps, weight, weight_offset)


def add_rms_norm_linear(x: Tensor, residual: Tensor, norm_weight: Tensor, eps: float, weight: Tensor,
                        weight_offset: float = 0.0, activation: str = "none") -> tuple[Tensor, Tensor]:
    """`h = residual + x` (stored in x's dtype), then `rms_norm_linear(h, ...)`: returns (out, h); nothing in place.
    activation "swiglu": weight is [gate | up] (2I, K) and out `silu(gate) * up` (..., I), each half rounded to x's
    dtype first, as `ops.swiglu` of the projection's output computes it."""
    return _lib().add_rms_norm_linear(x, residual, norm_weight, eps, weight, weight_offset, activation)


def rms_norm_qkv_rope_cache(x: Tensor, norm_weight: Tensor, eps: float, weight: Tensor, cos: Tensor, sin: Tensor,
                            k_cache: Tensor, v_cache: Tensor, offset: Tensor, weight_offset: float = 0.0) -> Tensor:
    """`rms_norm_linear(x, ...)` with weight [q | k | v] ((Hq + 2 Hk) head_dim, K) for x (B, S, K), then what
    `ops.rope_1d_cache` does with its q, k and v (neox RoPE over whole heads from per-token fp32 tables (B*S or S,
    head_dim / 2); k and v written into the (B, Hk, length, head_dim) caches at rows offset + s): returns q rotated,
    (B, Hq, S, head_dim). Each projection is rounded to x's dtype before the rotation, as the two ops store it."""
    return _lib().rms_norm_qkv_rope_cache(x, norm_weight, eps, weight, cos, sin, k_cache, v_cache, offset,
                                          weight_offset)


def _check(x, norm_weight, weight, residual=None, op="rms_norm_linear", activation="none"):
    torch._check(norm_weight.shape == (x.shape[-1],), lambda: f"{op}: norm_weight must be (in_features,)")
    torch._check(weight.dim() == 2 and weight.shape[1] == x.shape[-1],
                 lambda: f"{op}: weight must be (out_features, in_features)")
    torch._check(residual is None or residual.shape == x.shape, lambda: f"{op}: residual must have x's shape")
    torch._check(activation in ("none", "swiglu"), lambda: f"{op}: activation must be 'none' or 'swiglu'")
    width = weight.shape[0] // 2 if activation == "swiglu" else weight.shape[0]
    return torch.empty((*x.shape[:-1], width), dtype=x.dtype, device=x.device)


def _rms_norm_linear_fake(x, norm_weight, eps, weight, weight_offset=0.0):
    return _check(x, norm_weight, weight)


def _add_rms_norm_linear_fake(x, residual, norm_weight, eps, weight, weight_offset=0.0, activation="none"):
    out = _check(x, norm_weight, weight, residual, "add_rms_norm_linear", activation)
    return out, torch.empty(x.shape, dtype=x.dtype, device=x.device)


def _qkv_heads(x, weight, k_cache):
    """(B, S, Hq, Hk, head_dim) of rms_norm_qkv_rope_cache's operands."""
    torch._check(x.dim() == 3 and k_cache.dim() == 4, lambda: "rms_norm_qkv_rope_cache: x (B, S, K), caches 4-D")
    hk, hd = k_cache.shape[1], k_cache.shape[3]
    torch._check(weight.shape[0] % hd == 0 and weight.shape[0] // hd > 2 * hk,
                 lambda: "rms_norm_qkv_rope_cache: weight must be [q | k | v] in heads of head_dim rows")
    return x.shape[0], x.shape[1], weight.shape[0] // hd - 2 * hk, hk, hd


def _rms_norm_qkv_rope_cache_fake(x, norm_weight, eps, weight, cos, sin, k_cache, v_cache, offset,
                                  weight_offset=0.0):
    _check(x, norm_weight, weight, op="rms_norm_qkv_rope_cache")
    b, s, hq, _, hd = _qkv_heads(x, weight, k_cache)
    return torch.empty((b, s, hq, hd), dtype=x.dtype, device=x.device).transpose(1, 2)


def _register_fakes() -> None:
    global _fakes_registered
    torch.library.register_fake("ltxbench::rms_norm_linear", _rms_norm_linear_fake)
    torch.library.register_fake("ltxbench::add_rms_norm_linear", _add_rms_norm_linear_fake)
    torch.library.register_fake("ltxbench::rms_norm_qkv_rope_cache", _rms_norm_qkv_rope_cache_fake)
    _fakes_registered = True


def _reference_rms_norm_linear(x: Tensor, norm_weight: Tensor, eps: float, weight: Tensor,
                               weight_offset: float = 0.0) -> Tensor:
    acc = _reference._acc(x)
    normed = _reference._rms(x.to(acc), eps) * (norm_weight.to(acc) + weight_offset)
    return _reference.linear(normed, weight).to(x.dtype)


def _reference_add_rms_norm_linear(x: Tensor, residual: Tensor, norm_weight: Tensor, eps: float, weight: Tensor,
                                   weight_offset: float = 0.0, activation: str = "none") -> tuple[Tensor, Tensor]:
    h = _reference._residual(residual, x, None)
    out = _reference_rms_norm_linear(h, norm_weight, eps, weight, weight_offset)
    return (_reference.swiglu(out, 0) if activation == "swiglu" else out), h


def _reference_rms_norm_qkv_rope_cache(x: Tensor, norm_weight: Tensor, eps: float, weight: Tensor, cos: Tensor,
                                       sin: Tensor, k_cache: Tensor, v_cache: Tensor, offset: Tensor,
                                       weight_offset: float = 0.0) -> Tensor:
    b, s, hq, hk, hd = _qkv_heads(x, weight, k_cache)
    qkv = _reference_rms_norm_linear(x, norm_weight, eps, weight, weight_offset).view(b, s, hq + 2 * hk, hd)
    q, k, v = (t.transpose(1, 2) for t in qkv.split([hq, hk, hk], dim=2))
    return _reference.rope_1d_cache(q, k, v, cos, sin, k_cache, v_cache, offset)


# The pure-torch twins, by the ops' names (KernelSpec.reference, the `reference` provider).
reference = types.SimpleNamespace(rms_norm_linear=_reference_rms_norm_linear,
                                  add_rms_norm_linear=_reference_add_rms_norm_linear,
                                  rms_norm_qkv_rope_cache=_reference_rms_norm_qkv_rope_cache)

if build.is_loaded():  # imported by torch for a missing fake (the binding names this module): the ops exist
    _register_fakes()
