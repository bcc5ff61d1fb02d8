"""FP8 (e4m3) projections for any family's injection: weights quantized once per output channel, activations per
token, GEMMs on FP8 tensor cores with both scales in the epilogue and bf16 out (ops.linear_fp8).

- `Quantized(data, scale)`: an activation in FP8 with its per-token scale, as the fused norm and GELU kernels
  write it (ops.*_fp8): the projection reading it needs no quantize pass of its own.
- `store_weights` quantizes a group of nn.Linear layers (q/k/v concatenated: one GEMM) and frees their bf16
  weights (and a concatenation's biases, copied into it) on the device (a host copy restores them on revert): the
  transformer's weight memory halves. The FP8
  weights are buffers of the module that runs their GEMM (not persistent: no state_dict entry), so `.to(device)`,
  and with it diffusers' / accelerate's model CPU offload, moves them with the model; the forwards read them at
  every call (`stored_weight`), and a layer of a concatenation reads its rows of it.
- `linear_forward` / `feed_forward_forward`: nn.Linear's and diffusers FeedForward's forwards on the stored FP8
  weights; the feed-forward's GELU writes FP8 for the down-projection (ops.gelu_tanh_fp8).
- `Fp8Norms(ops)`: the provider the fused block code calls, whose modulated norms return `Quantized`.

A layer changed after the injection fails loudly: a LoRA fused later finds a zero-size weight, and new values given
through `weight.data` or `set_`, or written in place (a scalar `weight *= 2` included), are refused
(fp8_held.Fp8Placeholder), as are a new weight Parameter and a held module replaced in its parent (a LoRA wrapped
later; fp8_held.hold_modules). The FP8 copy is never silently stale. Inference only.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import torch

from ltxbench.configurations import FP8_ACCUMULATIONS
from ltxbench.errors import EnvironmentProblem, UsageError
from ltxbench.inject.fp8_held import free_on_device
from ltxbench.inject.fuse import unobserved

WEIGHT_ATTR = "_ltxbench_fp8_weight"  # in a module's __dict__: its Fp8Stored (a FeedForward: (up, down) layers)
DATA, SCALE, BIAS = "_ltxbench_fp8_data", "_ltxbench_fp8_scale", "_ltxbench_fp8_bias"  # buffers of the GEMM's owner
PRECISIONS = ("bf16", "fp8")
ACCUMULATIONS = FP8_ACCUMULATIONS  # the FP8 GEMMs' accumulation (ops.linear_fp8's fast_accumulation): fast by default
STORE_RULE = "fp8: weights stored per output channel (their bf16 copy off the device until revert)"


class Quantized(NamedTuple):
    """x ≈ data * scale: data float8_e4m3fn (..., K), scale float32 (..., 1)."""

    data: torch.Tensor
    scale: torch.Tensor

    @property
    def shape(self) -> torch.Size:
        return self.data.shape


class Fp8Weight(NamedTuple):
    """weight ≈ data * scale: data float8_e4m3fn (N, K), scale float32 (N, 1); bias and the output dtype as the
    layer had them. Built at each call from the owner's buffers (stored_weight)."""

    data: torch.Tensor
    scale: torch.Tensor
    bias: torch.Tensor | None
    out_dtype: torch.dtype
    splits: tuple[int, ...]  # the output widths of the layers it concatenates (q, k, v), one entry for one layer
    fast_accumulation: bool = True  # the GEMM accumulates on the tensor cores only (ops.linear_fp8)


class Fp8Stored(NamedTuple):
    """What a module's FP8 projection is, its tensors aside: `owner` holds the buffers (None: the module itself),
    `rows` its output channels there (None: all); `names`: the layers a concatenation stands for, on the owner."""

    out_dtype: torch.dtype
    splits: tuple[int, ...]
    names: tuple[str, ...] = ()
    owner: torch.nn.Module | None = None
    rows: tuple[int, int] | None = None
    fast_accumulation: bool = True


def stored_weight(module) -> Fp8Weight:
    """`module`'s FP8 weight as its owner's buffers hold it now (after any `.to(device)`)."""
    stored = vars(module)[WEIGHT_ATTR]
    owner = module if stored.owner is None else stored.owner
    data, scale = getattr(owner, DATA), getattr(owner, SCALE)
    if data.dtype != torch.float8_e4m3fn:
        raise RuntimeError(f"the FP8 weights of {type(module).__name__} were cast to {data.dtype} (a .to(dtype) "
                           "after the injection): revert the injection and inject again")
    bias = getattr(owner, BIAS, None) if len(stored.splits) > 1 or stored.owner is not None else module.bias
    if stored.rows is not None:
        start, stop = stored.rows
        data, scale = data[start:stop], scale[start:stop]
        bias = None if bias is None else bias[start:stop]
    return Fp8Weight(data, scale, bias, stored.out_dtype, stored.splits, stored.fast_accumulation)


def require_fp8(device) -> None:
    """Exit 4 where the GPU has no FP8 tensor cores with row-wise scaled GEMMs (before Hopper)."""
    device = torch.device(device)
    if device.type != "cuda":
        return
    major, minor = torch.cuda.get_device_capability(device)
    if (major, minor) < (9, 0):
        raise EnvironmentProblem(
            f"--precision fp8 needs FP8 tensor cores with row-wise scaled GEMMs (compute capability 9.0, Hopper, "
            f"or newer); {torch.cuda.get_device_name(device)} is {major}.{minor}",
            hint="run the bf16 configurations on this GPU (--precision bf16)")


def quantize(ops, x) -> Quantized:
    """x as FP8 per token (a Quantized passes through)."""
    return x if isinstance(x, Quantized) else Quantized(*ops.quantize_fp8(x))


def project(ops, x, weight: Fp8Weight) -> torch.Tensor:
    """x @ weightᵀ + bias in out_dtype, from FP8 x (quantized here where it is not already) and FP8 weight."""
    x = quantize(ops, x)
    return ops.linear_fp8(x.data, x.scale, weight.data, weight.scale, weight.bias, weight.out_dtype,
                          weight.fast_accumulation)


def project_split(ops, x, weight: Fp8Weight) -> tuple:
    """project() of a concatenated weight, split back per layer (q, k, v)."""
    return project(ops, x, weight).split(list(weight.splits), dim=-1)


def store_weights(report, ops, owner, linears, what: str, classes: dict, names: tuple[str, ...] = (),
                  accumulation: str = "fast") -> bool:
    """Quantize `linears` (plain nn.Linear, same input width; biased all or none), free their weights on the device
    until the report's revert, and run each through its FP8 rows (linear_forward). One layer holds its own FP8
    buffers; several (`names` on `owner`, e.g. q/k/v) are stored once, concatenated, as buffers of `owner`, for one
    GEMM (fused_projection), each layer reading its rows of them. accumulation: of their GEMMs (ACCUMULATIONS).
    False (and a skip naming `what`) where they cannot."""
    from ltxbench.inject import patch_forward, set_attr

    if not all(type(layer) is torch.nn.Linear for layer in linears):
        report.skip(what, "not plain nn.Linear layers (quantized or wrapped): left in their own precision")
        return False
    if len({layer.in_features for layer in linears}) != 1 or len({layer.bias is None for layer in linears}) != 1:
        report.skip(what, "the layers differ in input width or in having a bias")
        return False
    joined = len(linears) > 1
    holder = owner if joined else linears[0]
    weight = torch.cat([layer.weight.detach() for layer in linears]) if joined else linears[0].weight.detach()
    data, scale = _quantize(ops, weight)
    _add_buffer(report, holder, DATA, data)
    _add_buffer(report, holder, SCALE, scale)
    splits = tuple(layer.out_features for layer in linears)
    fast = is_fast_accumulation(accumulation)
    if joined:
        if linears[0].bias is not None:
            _add_buffer(report, holder, BIAS, torch.cat([layer.bias.detach() for layer in linears]))
        set_attr(report, STORE_RULE, owner, WEIGHT_ATTR, Fp8Stored(weight.dtype, splits, names,
                                                                   fast_accumulation=fast))
    start, forward = 0, linear_forward(ops)
    for layer in linears:
        rows = (start, start + layer.out_features)
        own = Fp8Stored(weight.dtype, (layer.out_features,), owner=owner, rows=rows, fast_accumulation=fast) \
            if joined else Fp8Stored(weight.dtype, splits, fast_accumulation=fast)
        set_attr(report, STORE_RULE, layer, WEIGHT_ATTR, own)
        patch_forward(report, what, layer, forward, classes)
        start += layer.out_features
        free_on_device(report, layer, "weight")
        if joined and layer.bias is not None:  # its rows of the owner's bias buffer are what the GEMM reads
            free_on_device(report, layer, "bias")
    return True


def _quantize(ops, weight) -> tuple:
    """ops.quantize_fp8(weight); our kernels quantize a weight held on the host (blocks kept there to stream them,
    --memory-budget) on the current GPU, and the FP8 copy stays where the weight is."""
    import ltxbench.ops as cuda_ops

    if ops is cuda_ops and weight.device.type == "cpu":
        data, scale = ops.quantize_fp8(weight.to(torch.device("cuda", torch.cuda.current_device())))
        return data.cpu(), scale.cpu()
    return ops.quantize_fp8(weight)


def is_fast_accumulation(accumulation: str) -> bool:
    """Whether FP8 GEMMs accumulating as `accumulation` (ACCUMULATIONS) use the fast path; UsageError for a value
    that is not one of them."""
    if accumulation not in ACCUMULATIONS:
        raise UsageError(f"fp8_accumulation {accumulation!r} is not one of {', '.join(ACCUMULATIONS)}")
    return accumulation == "fast"


def _add_buffer(report, module, name: str, tensor) -> None:
    """A non-persistent buffer of `module` until the report's revert (it moves with the module, and is not saved)."""
    module.register_buffer(name, tensor, persistent=False)
    report.on_revert(lambda: module._buffers.pop(name, None))


def fused_projection(ops, module, names: tuple[str, ...], x) -> tuple | None:
    """The outputs of `module`'s layers `names` on x from their one FP8 GEMM, where store_weights stored exactly
    these together; else None (also where a hook was put on one of them since: each then runs on its own rows)."""
    stored = vars(module).get(WEIGHT_ATTR)
    if not isinstance(stored, Fp8Stored) or stored.names != names:
        return None
    if not all(unobserved(getattr(module, name)) for name in names):
        return None
    return project_split(ops, x, stored_weight(module))


# One function per provider: patch_forward makes one subclass per forward function, and regional compile guards on
# each layer's class (a class per layer recompiled the block for every layer).
@functools.cache
def linear_forward(ops):
    """nn.Linear.forward on the layer's stored Fp8Weight."""

    def forward(self, input):
        return project(ops, input, stored_weight(self))

    return forward


@functools.cache  # one function per provider (see linear_forward)
def feed_forward_forward(ops):
    """diffusers FeedForward (GELU-tanh up-projection, dropout, down-projection) on its stored (up, down) FP8
    weights: the GELU pass writes FP8 for the down-projection (ops.gelu_tanh_fp8), no quantize pass of its own.
    Where a hook was put on one of its modules since the injection, diffusers' forward: each layer on its FP8 weight."""

    def forward(self, hidden_states, *args, **kwargs):
        up, down = vars(self)[WEIGHT_ATTR]
        if not all(map(unobserved, (self.net[0], up, down))):
            from ltxbench.inject import original_class

            return original_class(self).forward(self, hidden_states, *args, **kwargs)
        hidden = project(ops, hidden_states, stored_weight(up))
        return project(ops, Quantized(*ops.gelu_tanh_fp8(hidden)), stored_weight(down))

    return forward


def plain_feed_forward(ff) -> str | None:
    """Why diffusers FeedForward `ff` is not GELU(tanh, biased proj) -> inactive dropout -> Linear (None: it is)."""
    from diffusers.models.activations import GELU

    net = list(ff.net)
    if not net or not isinstance(net[0], GELU) or net[0].approximate != "tanh":
        return "not a GELU(approximate='tanh') feed-forward"
    if len(net) not in (3, 4) or type(net[2]) is not torch.nn.Linear:
        return "not GELU, dropout, Linear[, dropout]"
    if any(not isinstance(m, torch.nn.Dropout) or (m.training and m.p > 0) for m in net[1::2]):
        return "a dropout is active"
    return None


def plain_block(where: str, projections, feed_forwards: dict) -> str | None:
    """Why the block at `where` cannot run in FP8 (None: it can): its `projections` plain nn.Linear layers, each of
    its `feed_forwards` ({name: diffusers FeedForward}) plain (plain_feed_forward)."""
    if not all(type(layer) is torch.nn.Linear for layer in projections):
        return f"{where}: a projection is not a plain nn.Linear (quantized or wrapped)"
    for name, ff in feed_forwards.items():
        reason = plain_feed_forward(ff)
        if reason is not None:
            return f"{where}.{name}: {reason}"
    return None


def store_feed_forward(report, ops, ff, what: str, classes: dict, accumulation: str = "fast") -> bool:
    """The feed-forward's two projections stored in FP8 ((up, down) on `ff` under WEIGHT_ATTR) and `ff` run as
    feed_forward_forward; False if not."""
    from ltxbench.inject import patch_forward

    reason = plain_feed_forward(ff)
    if reason is not None:
        report.skip(what, reason)
        return False
    up, down = ff.net[0].proj, ff.net[2]
    if not all(store_weights(report, ops, layer, [layer], what, classes, accumulation=accumulation)
               for layer in (up, down)):
        return False
    ff.__dict__[WEIGHT_ATTR] = (up, down)
    report.on_revert(lambda: ff.__dict__.pop(WEIGHT_ATTR, None))
    patch_forward(report, what, ff, feed_forward_forward(ops), classes)
    return True


class Fp8Norms:
    """A kernel provider whose modulated norms return their output as `Quantized`, for block code where every norm
    feeds projections only; everything else is `ops`'s own (copied once: plain attributes, which dynamo reads as
    it reads a module's)."""

    def __init__(self, ops):
        own = {"rms_norm_modulate", "add_rms_norm_modulate"}  # the methods below (an instance entry would hide them)
        self.__dict__.update({name: getattr(ops, name) for name in dir(ops) if not name.startswith("_")
                              and name not in own})
        self.ops = ops

    def rms_norm_modulate(self, x, weight, scale, shift, eps):
        return Quantized(*self.ops.rms_norm_modulate_fp8(x, weight, scale, shift, eps))

    def add_rms_norm_modulate(self, h, a, gate, scale, shift, eps):
        data, scale_, h_new = self.ops.add_rms_norm_modulate_fp8(h, a, gate, scale, shift, eps)
        return Quantized(data, scale_), h_new


def weight_bytes(module) -> dict:
    """Bytes of `module`'s parameters and buffers (memory.module_bytes), and of those the FP8 buffers (weights,
    scales, concatenated biases): the transformer's weight memory as the injection leaves it."""
    tensors = {id(t): t for t in (*module.parameters(), *module.buffers())}  # each shared tensor once
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    fp8 = sum(t.numel() * t.element_size() for sub in module.modules() for name, t in sub._buffers.items()
              if name in (DATA, SCALE, BIAS) and t is not None)
    return {"parameters": total - fp8, "fp8_weights": fp8, "total": total}
