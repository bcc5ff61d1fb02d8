"""Pure-torch twins of every ltxbench op: the test oracle and the `reference` kernel provider.

Same signatures and fused semantics as the CUDA ops in `ltxbench.ops`: math in fp32 (or float64 when the
inputs are float64, which makes this the float64 oracle too), rounded once to the input dtype — except
where the unfused model stores an intermediate in the input dtype (the residual sum h), which is rounded
the same way here and in the kernels.
"""

from __future__ import annotations

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


def rms_norm(x: Tensor, weight: Tensor | None = None, eps: float = 1e-6, cast_before_weight: bool = False) -> Tensor:
    n = _rms(x.to(_acc(x)), eps)
    return _apply_weight(n, weight, x.dtype, cast_before_weight).to(x.dtype)


def fused_add_rms_norm(x: Tensor, residual: Tensor, weight: Tensor | None = None, eps: float = 1e-6,
                       cast_before_weight: bool = False) -> tuple[Tensor, Tensor]:
    h = _residual(residual, x, None)
    return rms_norm(h, weight, eps, cast_before_weight), h


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
