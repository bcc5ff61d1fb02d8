"""What the rules of every family ask of a layer before our kernels stand for it: its norm's eps, whether a
gradient is wanted through it (ops.linear has none), whether a GEMM on its weights may replace its call."""

from __future__ import annotations

import torch

from ltxbench.inject.fuse import unobserved
from ltxbench.inject.patching import original_class


def needs_autograd(*tensors) -> bool:
    """ops.linear has no backward: with gradients wanted, torch's own linear runs (inference is what we speed up)."""
    return torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)


def eps_of(norm) -> float:
    """A norm's eps as torch applies it (None: its weight dtype's machine epsilon)."""
    return norm.eps if norm.eps is not None else torch.finfo(norm.weight.dtype).eps


def gemm_can_stand_for(proj, x) -> bool:
    """May a GEMM on proj's weight and bias replace `proj(x)`? Only for a plain nn.Linear as injected: no hook or
    wrapper put on it since (a LoRA adapter added after the injection replaces it by its own module, whose `weight`
    is the base layer's), its weights on the device (not offloaded to meta), and no gradient wanted."""
    return (original_class(proj) is torch.nn.Linear and not proj.weight.is_meta and unobserved(proj)
            and not needs_autograd(x, proj.weight, proj.bias))
