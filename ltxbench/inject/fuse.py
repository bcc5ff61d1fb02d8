"""Several nn.Linear layers that read the same input, run as ONE GEMM (LLM gate/up, LTX q/k/v and k/v).

`fuse_linears` concatenates the weights (and biases) once and makes each layer's Parameters views of the
concatenation, so the model keeps one copy of the weights and `state_dict`/`load_state_dict` (in-place
copies into the views) behave as before. `fused_linear` returns the fused projection, or None when the
layers no longer share it (moved to another device/dtype, parameters replaced): the caller then runs the
original layers. Inference only: callers run the original path when gradients are needed.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


class FusedWeights:
    """The concatenated weight (sum(out), in) and bias, plus the Parameters made views of them."""

    def __init__(self, weight, bias, params):
        self.weight, self.bias, self.params = weight, bias, params


def fuse_linears(linears) -> FusedWeights | str:
    """Fuse `linears` (same input width, dtype, device, all with or all without bias); a reason string if not."""
    if not all(type(lin) is torch.nn.Linear for lin in linears):
        return "not plain nn.Linear layers (quantized or wrapped)"
    first = linears[0]
    if any((lin.bias is None) != (first.bias is None) for lin in linears):
        return "only some of the projections have a bias"
    if any(lin.in_features != first.in_features or lin.weight.dtype != first.weight.dtype
           or lin.weight.device != first.weight.device for lin in linears):
        return "the projections differ in input width, dtype or device"
    fused, views = [], []
    with torch.no_grad():
        for name in ("weight", "bias"):
            if getattr(first, name) is None:
                fused.append(None)
                continue
            parts = [getattr(lin, name) for lin in linears]
            cat = torch.cat([p.detach() for p in parts], dim=0)
            start, made = 0, []
            for lin, old in zip(linears, parts, strict=True):
                made.append(torch.nn.Parameter(cat[start:start + old.shape[0]], requires_grad=old.requires_grad))
                setattr(lin, name, made[-1])
                start += old.shape[0]
            fused.append(cat)
            views.append(made)
    params = [p for per_layer in zip(*views, strict=True) for p in per_layer]  # w1, b1, w2, b2, ...
    return FusedWeights(fused[0], fused[1], params)


def _intact(linears, fused: FusedWeights) -> bool:
    params = [p for lin in linears for p in (lin.weight, lin.bias) if p is not None]
    if len(params) != len(fused.params) or any(p is not q for p, q in zip(params, fused.params, strict=True)):
        return False  # parameters replaced (load_state_dict(assign=True), a user's setattr)
    if torch.compiler.is_compiling():
        # dynamo cannot compare data pointers; identity + device/dtype catch `.to()`, the usual way views break
        return all(p.device == fused.weight.device and p.dtype == fused.weight.dtype for p in params)
    weight_at, bias_at = fused.weight.data_ptr(), fused.bias.data_ptr() if fused.bias is not None else 0
    rows_w = fused.weight.stride(0) * fused.weight.element_size()
    rows_b = fused.bias.element_size() if fused.bias is not None else 0
    for lin in linears:
        if lin.weight.data_ptr() != weight_at or (lin.bias is not None and lin.bias.data_ptr() != bias_at):
            return False
        weight_at += lin.weight.shape[0] * rows_w
        bias_at += lin.weight.shape[0] * rows_b
    return True


def fused_linear(x, linears, fused: FusedWeights | None):
    """x @ [W_1 | W_2 | ...]^T + [b_1 | ...] as one GEMM, or None when it cannot stand for the layers."""
    if fused is None or not _intact(linears, fused):
        return None
    if torch.is_grad_enabled() and any(p.requires_grad for p in fused.params):
        return None
    return F.linear(x, fused.weight, fused.bias)
