"""Fake (meta) implementations: output shapes and dtypes, so torch.compile keeps our ops in its graphs.

Imported by `_build.load()` right after the library registers; TORCH_LIBRARY names this module too
(`set_python_module`), so torch points here if the fakes are ever missing.
"""

from __future__ import annotations

import torch
from torch.library import register_fake


def _like(x: torch.Tensor) -> torch.Tensor:
    # The kernels always allocate contiguous outputs of x's shape.
    return torch.empty(x.shape, dtype=x.dtype, device=x.device)


@register_fake("ltxbench::rms_norm")
def _rms_norm(x, weight, eps, cast_before_weight=False):
    return _like(x)


@register_fake("ltxbench::fused_add_rms_norm")
def _fused_add_rms_norm(x, residual, weight, eps, cast_before_weight=False):
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
