"""Several nn.Linear layers that read the same input, run as ONE GEMM (LLM gate/up, LTX q/k/v and k/v).

`fuse_linears` concatenates the weights (and biases) once and makes each layer's Parameters views of the
concatenation (the same Parameter objects, given the view's storage), so the model keeps one copy of the weights,
references taken before (an optimizer's, a user's) still reach the model, and `state_dict`/`load_state_dict`
(in-place copies into the views) behave as before; `release` (on revert) gives each its own storage back.
`fused_linear` returns the fused projection, or None when the layers no longer share it (moved to another
device/dtype, parameters replaced): the caller then runs the original layers. `follow_moves` concatenates them again
when the module holding them is moved or cast (`.to()`, model CPU offload), so that a move neither keeps the old
concatenation alive nor ends the fusion. A view given other storage any other way (`param.data = ...`: a user's
weight swap, PEFT's safe merge, diffusers' group offloading) ends its set's fusion at once (FusedView), which a
compiled graph could not see by itself; ltxbench.memory.stream moves a set's tensors together, layout kept, and
records it (`relocated`). Inference only: callers run the original path when gradients are needed.
"""

from __future__ import annotations

import types
import weakref

import torch
import torch.nn.functional as F


class FusedWeights:
    """The concatenated weight (sum(out), in) and bias, the layers, and the Parameters made views of them.
    `intact` turns False when one of the layers is given a new weight or bias (setattr, load_state_dict(assign=
    True)) or is itself replaced in its parent module (setattr, peft's LoRA wrapping), seen by torch's global
    registration hooks."""

    def __init__(self, weight, bias, linears, params):
        self.weight, self.bias, self.linears, self.params = weight, bias, tuple(linears), params
        self.ptrs = tuple(p.data_ptr() for p in params)  # where each view starts inside weight / bias
        self.intact = True
        self.moving = False  # inside its owner's _apply (follow_moves): the views' new storage is concatenated again
        for param in params:
            _SET_OF_VIEW[id(param)] = self


class FusedView(torch.nn.Parameter):
    """A fused layer's weight or bias: a view of its set's concatenation. `.data = other` (other storage) ends the
    set's fusion and drops the set's hold on the concatenation (freed once no view uses it), except during a move of
    the set's owner, which concatenates again (follow_moves). Why here: a compiled graph cannot compare data pointers,
    so it would otherwise keep reading the old concatenation, stale after a weight swap and left on the GPU by
    diffusers' group offloading."""

    @property
    def data(self):
        return torch.Tensor.data.__get__(self)

    @data.setter
    def data(self, value):
        same = (value.data_ptr() == self.data_ptr() and value.shape == self.shape and value.dtype == self.dtype
                and value.device == self.device and value.stride() == self.stride())
        torch.Tensor.data.__set__(self, value)
        if not same:
            self._leaves_its_set()

    def set_(self, *args, **kwargs):
        """`weight.set_(other)`: the same object, other storage, which a compiled graph's guards would not see."""
        out = torch.Tensor.set_(self, *args, **kwargs)
        self._leaves_its_set()
        return out

    def _leaves_its_set(self) -> None:
        """Given other storage (not by a move of the set's owner): the set's fusion ends and its concatenation goes."""
        fused = _set_of(self)
        if fused is not None and fused.intact and not fused.moving:
            _broken(fused)
            fused.weight = fused.bias = None  # every reader checks intact first


# id(view) -> its FusedWeights, which holds the view (so the id stays its own while the entry lives); tensors
# compare elementwise, so they cannot be keys of a WeakKeyDictionary
_SET_OF_VIEW: weakref.WeakValueDictionary = weakref.WeakValueDictionary()


def _set_of(param) -> FusedWeights | None:
    fused = _SET_OF_VIEW.get(id(param))
    return fused if fused is not None and any(p is param for p in fused.params) else None


_FUSED_OF: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # nn.Linear -> the FusedWeights it is part of
_hooks: list = []
# Process-wide: has any fused set lost a layer or a parameter? While none has, a compiled graph guards on this one
# flag instead of one per fused set (each guard runs on every call: host time of a CUDA-graph decode step).
_any_broken = False


def _broken(fused: FusedWeights) -> None:
    global _any_broken
    fused.intact = False
    _any_broken = True


def _on_parameter_registered(module, name, param):
    fused = _FUSED_OF.get(module)
    if fused is not None and name in ("weight", "bias") and not fused.moving:
        _broken(fused)


def _on_module_registered(parent, name, module):
    old = parent._modules.get(name)  # the hook runs before the assignment
    fused = _FUSED_OF.get(old) if old is not None else None
    if fused is not None and module is not old:
        _broken(fused)
    fused = _FUSED_OF.get(parent)  # a module put in a fused layer (parametrize's `parametrizations`)
    if fused is not None:
        _broken(fused)


class _WatchedParameters(dict):
    """A fused layer's parameter dict for as long as its set stands: a weight or bias put in or deleted directly
    (accelerate's set_module_tensor_to_device writes `_parameters[name]`, parametrize deletes it), outside torch's
    registration hooks, ends the set's fusion as `layer.weight = ...` does. A compiled graph, which cannot compare
    data pointers, relies on this."""

    def __init__(self, owner, entries):
        super().__init__(entries)
        self.owner = weakref.ref(owner)

    def __setitem__(self, name, value):
        super().__setitem__(name, value)
        owner = self.owner()
        if owner is not None:
            _on_parameter_registered(owner, name, value)

    def __delitem__(self, name):
        super().__delitem__(name)
        owner = self.owner()
        if owner is not None:
            _on_parameter_registered(owner, name, None)


def _watch(lin) -> None:
    if type(lin._parameters) is not _WatchedParameters:
        vars(lin)["_parameters"] = _WatchedParameters(lin, lin._parameters)


def _unwatch(lin) -> None:
    if type(lin._parameters) is _WatchedParameters:
        vars(lin)["_parameters"] = dict(lin._parameters)


def fused_set(param) -> FusedWeights | None:
    """The fused set whose concatenation `param` is a view of (None: not fused)."""
    return _set_of(param)


def relocated(sets) -> None:
    """After the tensors of each set in `sets` (concatenations and views together) were given other storage with their
    layout kept (ltxbench.memory.stream): record where the views start now, so that the fused GEMM stands for them."""
    for fused in sets:
        fused.ptrs = tuple(p.data_ptr() for p in fused.params)


def release(fused: FusedWeights) -> None:
    """Stop watching the layers of `fused` (on revert): replacing their parameters later is none of our business.
    Each Parameter fused is a plain one again, the very object it was before fusing; one still a view of the
    concatenation gets its own copy of its rows (a model whose weights share storage is not the model given: e.g.
    safetensors refuses to save it), and the concatenation is freed with the set."""
    for lin in fused.linears:
        if _FUSED_OF.get(lin) is fused:
            del _FUSED_OF[lin]
            _unwatch(lin)
    with torch.no_grad():
        for param, ptr in zip(fused.params, fused.ptrs, strict=True):
            if _SET_OF_VIEW.get(id(param)) is not fused:
                continue  # fused again since, by another set: that set's now
            del _SET_OF_VIEW[id(param)]
            if type(param) is FusedView:
                param.__class__ = torch.nn.Parameter
            if param.data_ptr() == ptr:  # still its rows of the concatenation (not given other storage since)
                torch.Tensor.data.__set__(param, param.detach().clone())


def refuse(fused: FusedWeights) -> None:
    """After the layers' tensors were moved or cast one by one (nn.Module._apply): concatenate them again where they
    now are and make the parameters views of the new concatenation. The old one is no longer referenced (its memory,
    on the device the model left, is freed) and the fused GEMM reads the new one. A set whose layers were replaced,
    or whose tensors now differ in device or dtype, is left to run unfused (fused_linear)."""
    current = [p.data_ptr() for p in fused.params]
    if not fused.intact or (tuple(current) == fused.ptrs and fused.weight.device == fused.params[0].device
                            and fused.weight.dtype == fused.params[0].dtype):
        return  # not ours any more, or not moved (.to() of where it already is)
    made = {}
    for name in ("weight", "bias"):
        if getattr(fused, name) is None:
            continue
        params = [lin._parameters.get(name) for lin in fused.linears]
        if any(p is None for p in params) or len({(p.device, p.dtype) for p in params}) != 1:
            return
        made[name] = params
    with torch.no_grad():
        for name, params in made.items():
            cat = torch.cat([p.detach() for p in params], dim=0)
            start = 0
            for p in params:
                torch.Tensor.data.__set__(p, cat[start:start + p.shape[0]])  # not FusedView's setter: a re-fuse
                start += p.shape[0]
            setattr(fused, name, cat)
    fused.ptrs = tuple(p.data_ptr() for p in fused.params)


MOVES_RULE = "fused projections: concatenated again where .to() moves or casts the model (model CPU offload)"


def follow_moves(report, owner, fused: FusedWeights) -> None:
    """`owner` (the module holding the fused layers) re-fuses them after each move or cast of its tensors, until the
    report's revert: an instance-level `_apply`, which nn.Module.to() and .half() etc. recurse through (the class is
    left alone: a patched class's fallback to its original would reach a second patch of it)."""
    from ltxbench.inject import set_attr

    def _apply(self, fn, recurse=True):
        fused.moving = True
        try:
            result = type(self)._apply(self, fn, recurse)
        finally:
            fused.moving = False
        refuse(fused)
        return result

    set_attr(report, MOVES_RULE, owner, "_apply", types.MethodType(_apply, owner))


def _track(linears, fused: FusedWeights) -> None:
    """Watch `linears` for replaced parameters or replacement in their parent (process-wide hooks, installed on
    first use)."""
    if not _hooks:
        registration = torch.nn.modules.module
        _hooks.append(registration.register_module_parameter_registration_hook(_on_parameter_registered))
        _hooks.append(registration.register_module_module_registration_hook(_on_module_registered))
    for lin in linears:
        _FUSED_OF[lin] = fused
        _watch(lin)


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
    if any(type(p) not in (torch.nn.Parameter, FusedView) for lin in linears for p in lin.parameters(recurse=False)):
        return "a weight or bias is not a plain nn.Parameter (a subclass: held, quantized or distributed)"
    own = [p for lin in linears for p in lin.parameters(recurse=False)]
    if len({id(p) for p in own}) != len(own):
        return "the projections share a weight or bias (tied)"
    fused, views = [], []
    with torch.no_grad():
        for name in ("weight", "bias"):
            if getattr(first, name) is None:
                fused.append(None)
                continue
            parts = [getattr(lin, name) for lin in linears]
            cat = torch.cat([p.detach() for p in parts], dim=0)
            start = 0
            for param in parts:
                earlier = _set_of(param)
                if earlier is not None:  # fused again while another set stands for it: that one no longer does
                    _broken(earlier)
                # the layer's own Parameter made the view, not a new one: a reference taken before fusing (an
                # optimizer's, `w = layer.weight`) still reaches the model, and revert has nothing to put back
                torch.Tensor.data.__set__(param, cat[start:start + param.shape[0]])
                param.__class__ = FusedView
                start += param.shape[0]
            fused.append(cat)
            views.append(parts)
    params = [p for per_layer in zip(*views, strict=True) for p in per_layer]  # w1, b1, w2, b2, ...
    result = FusedWeights(fused[0], fused[1], linears, params)
    _track(linears, result)
    return result


def _intact(x, linears, fused: FusedWeights) -> bool:
    if torch.compiler.is_compiling():
        # Dynamo cannot compare data pointers, and every object it reads costs a guard per call (a parameter: a
        # tensor guard). So: no layer or parameter replaced since fusing (the registration hooks and the layers'
        # watched parameter dicts; checked per set only once some set has lost one), and the fused weight where the
        # input is (`.to()` moves the layers' parameters one by one, and follow_moves makes a new concatenation where
        # its owner is moved; free: the graph guards on the fused weight's device and dtype anyway).
        same = not _any_broken or (fused.intact and all(a is b for a, b in zip(linears, fused.linears, strict=True)))
        return same and fused.weight.device == x.device and fused.weight.dtype == x.dtype
    # Eager, on every call (56 per LTX step, whose host time is close to its GPU time): read the layers' parameter
    # dicts, not `lin.weight` (nn.Module.__getattr__; a parametrization's property would not be in the dict, so it
    # counts as replaced), and compare data pointers with those recorded when fusing (`.to()` and `param.data =`
    # move a parameter without replacing it): 16.6 -> 2.6 us per call on a CPU).
    params = [p for lin in linears for name in ("weight", "bias") if (p := lin._parameters.get(name)) is not None]
    return (fused.intact and len(params) == len(fused.params)
            and all(p is q for p, q in zip(params, fused.params, strict=True))
            and tuple(p.data_ptr() for p in params) == fused.ptrs)


def unobserved(layer) -> bool:
    """No forward hook on `layer` and no forward set on the instance (a probe, an adapter's or an offload hook): a
    GEMM on its weights may stand for its call. A hook put on after the injection must see its layer run.
    Traced as plain Python under torch.compile (assume_constant_result cannot take a module on torch 2.11): hooks
    count as dynamo counts its own module hooks, as at trace time (torch 2.14 also guards on them)."""
    return not (layer._forward_hooks or layer._forward_pre_hooks or "forward" in vars(layer))


def fused_linear(x, linears, fused: FusedWeights | None, linear=F.linear):
    """x @ [W_1 | W_2 | ...]^T + [b_1 | ...] as one GEMM (`linear(x, weight, bias)`: torch's, or ops.linear), or None
    when it cannot stand for the layers: one replaced or moved since fusing, or a forward hook put on one (a probe
    or an adapter's hook must see its layer run)."""
    if fused is None or not _intact(x, linears, fused) or not all(map(unobserved, linears)):
        return None
    if torch.is_grad_enabled() and any(p.requires_grad for p in fused.params):
        return None
    return linear(x, fused.weight, fused.bias)


FUSED_ATTR = "_ltxbench_fused_projections"  # on an attention module: (layer names, FusedWeights) of its fused layers


def fuse_layers(report, module, names: tuple, rule: str, skip_as: str | None = None) -> None:
    """Fuse `module`'s Linear layers `names` (fuse_linears) and record them on it as FUSED_ATTR until the report's
    revert; where they cannot be fused, a skip in the report (target `skip_as`, else the rule) naming why."""
    from ltxbench.inject import set_attr

    fused = fuse_linears([getattr(module, name) for name in names])
    if isinstance(fused, str):
        report.skip(skip_as or rule, fused)
        return
    set_attr(report, rule, module, FUSED_ATTR, (names, fused))
    follow_moves(report, module, fused)
    report.on_revert(lambda: release(fused))


def fused_outputs(module, names: tuple, x, linear=F.linear) -> tuple | None:
    """The outputs of `module`'s layers `names` on x from their one fused GEMM (`linear`), split per layer; None where
    fuse_layers did not fuse exactly these layers or the fusion no longer stands for them (fused_linear)."""
    fused_names, fused = getattr(module, FUSED_ATTR, ((), None))
    if fused_names != names:
        return None
    layers = [getattr(module, name) for name in names]
    out = fused_linear(x, layers, fused, linear)
    return None if out is None else out.split([layer.out_features for layer in layers], dim=-1)
