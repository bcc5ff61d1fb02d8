"""Weights held by the FP8 injection: a layer whose GEMM runs on its FP8 copy keeps an empty placeholder as its
bf16 weight, and every way of giving that placeholder new values is refused with one line (the FP8 copy would not
see them, and the layer would be silently stale). `free_on_device` puts the placeholder in and keeps a host copy
for the report's revert. Replacing the placeholder by a new Parameter (`layer.weight = nn.Parameter(w)`), or a held
module by another in its parent (`hold_modules`: peft's LoRA wrapping), is refused as it happens, by torch's
registration hooks: nothing is checked per call."""

from __future__ import annotations

import weakref

import torch

HELD_MESSAGE = ("this layer's weights are held by ltxbench's FP8 injection (--precision fp8): revert the injection "
                "before giving them new values")
# in-place methods that change a tensor's metadata, not its values
_NOT_VALUE_WRITES = frozenset({"requires_grad_", "share_memory_", "retain_grad"})


def _held(value) -> bool:
    """A held tensor, or a list of tensors holding one (the foreach ops': `torch._foreach_mul_([w, ...], 2)`)."""
    if isinstance(value, (list, tuple)):
        return any(isinstance(v, (Fp8Placeholder, HeldData)) for v in value)
    return isinstance(value, (Fp8Placeholder, HeldData))


def _refuse_value_writes(func, args) -> None:
    """Raise where `func` writes values into a held tensor (args[0]): an in-place op (`weight *= 2`, `zero_()`,
    `torch.nn.init.*_`, `w[i] = x`, a foreach op over a list holding one). On the empty placeholder it would do
    nothing, silently."""
    name = getattr(func, "__name__", "")
    if not args or not _held(args[0]):
        return
    in_place = name.endswith("_") and (not name.startswith("_") or name.startswith("_foreach_"))
    if name == "__setitem__" or (in_place and name not in _NOT_VALUE_WRITES):
        raise RuntimeError(HELD_MESSAGE)


def _guarded_torch_function(cls, func, types, args=(), kwargs=None):
    _refuse_value_writes(func, args)
    with torch._C.DisableTorchFunctionSubclass():  # results are plain tensors, as a Parameter's are
        out = func(*args, **(kwargs or {}))
    if getattr(func, "__name__", "") in ("detach", "detach_") and isinstance(out, torch.Tensor):
        return out.as_subclass(HeldData)  # shares the held storage: `w.detach().mul_(2)` is refused as `w.mul_(2)`
    return out


class HeldData(torch.Tensor):
    """What `.data` of an Fp8Placeholder returns: its empty storage, refusing in-place writes as the placeholder
    does (`weight.data.mul_(2)` would otherwise be a silent no-op); moves (`.data.to(device)`) pass."""

    __torch_function__ = classmethod(_guarded_torch_function)


class Fp8Placeholder(torch.nn.Parameter):
    """The weight of a layer whose GEMM runs on its FP8 copy (and the bias of one whose bias was copied into a
    concatenation): empty, so it holds no memory. Moves keep it empty (`.to()`, diffusers' group offloading); values
    given to it would never reach the copy, so every way of giving them is refused with one line instead of leaving
    the layer silently stale: `weight.data = w`, `weight.set_(w)`, an in-place edit of the weight or of its `.data`
    (a scalar one included). A full-size edit (a LoRA merge's delta) would also fail on the empty tensor's shape."""

    __torch_function__ = classmethod(_guarded_torch_function)

    @property
    def data(self):
        with torch._C.DisableTorchFunctionSubclass():
            return torch.Tensor.data.__get__(self).as_subclass(HeldData)

    @data.setter
    def data(self, value):
        # a move (`.to()`, group offloading) gives an empty tensor of its own; values (vector_to_parameters' empty
        # slice of a real vector among them) come in a storage that holds bytes
        with torch._C.DisableTorchFunctionSubclass():
            values = value.numel() or value.untyped_storage().nbytes()
        if values:
            raise RuntimeError(HELD_MESSAGE)
        torch.Tensor.data.__set__(self, value)

    def set_(self, source=None, *args, **kwargs):  # torch does not route set_ through __torch_function__
        if isinstance(source, torch.Tensor) and source.numel():
            raise RuntimeError(HELD_MESSAGE)
        return super().set_(source, *args, **kwargs)


def free_on_device(report, layer, name: str) -> None:
    """The storage of layer's parameter `name` on the device released (an Fp8Placeholder of zero size in its place),
    a host copy kept for revert."""
    _install_hooks()
    parameter = getattr(layer, name)
    # a parameter on the host keeps its own storage for revert (a copy would double the host's share of the model)
    host = parameter.detach() if parameter.device.type == "cpu" else parameter.detach().to("cpu", copy=True)
    kind = type(parameter)
    torch.Tensor.data.__set__(parameter, parameter.data.new_empty(0))
    parameter.__class__ = Fp8Placeholder

    def undo():
        parameter.__class__ = kind
        torch.Tensor.data.__set__(parameter, host.to(parameter.device))

    report.on_revert(undo)


REPLACED_HINT = "revert() the injection before replacing weights or layers, then apply it again"
# module -> its name in the model: the modules hold_modules refuses to see replaced (process-wide, as the hooks are)
_HELD: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_hooks: list = []


def _on_parameter_registered(module, name, param):
    """`module.<name> = nn.Parameter(w)` (setattr, load_state_dict(assign=True)) where the old one is a placeholder:
    the GEMM would go on reading the FP8 copy of the old weight. Raised before the assignment: nothing changes."""
    old = module._parameters.get(name)
    if isinstance(old, Fp8Placeholder) and param is not old:
        where = _HELD.get(module) or type(module).__name__
        raise RuntimeError(f"{where}.{name} is held by ltxbench's FP8 injection (--precision fp8), whose GEMM reads "
                           f"an FP8 copy of the old weight, never a new Parameter: {REPLACED_HINT}")


def _on_module_registered(parent, name, module):
    """A held module replaced in its parent (setattr, peft wrapping a projection): the fused FP8 path reads the old
    one's FP8 copy, or hands the new one an FP8 input it cannot read. Raised before the assignment."""
    if not _HELD:
        return
    old = parent._modules.get(name)
    if old is not None and old is not module and old in _HELD:
        raise RuntimeError(f"{_HELD[old]} runs in FP8 under ltxbench's injection (--precision fp8), which would not "
                           f"run a module put in its place: {REPLACED_HINT}")


def _install_hooks() -> None:
    if not _hooks:
        registration = torch.nn.modules.module
        _hooks.append(registration.register_module_parameter_registration_hook(_on_parameter_registered))
        _hooks.append(registration.register_module_module_registration_hook(_on_module_registered))


def hold_modules(report, root) -> None:
    """Until the report's revert, refuse replacing a parameter emptied by free_on_device, and replacing in its parent
    any module of `root` that holds one or leads to one (the blocks, attentions, feed-forwards: the fused FP8 path
    reads their FP8 copies through its own records, and their norms write FP8 inputs). Named in the refusal."""
    names = [name for name, m in root.named_modules()
             if any(isinstance(p, Fp8Placeholder) for p in m._parameters.values())]
    on_the_way = {".".join(parts[:end]) for parts in (n.split(".") for n in names) for end in range(len(parts) + 1)}
    held = []
    for name, module in root.named_modules():
        if names and name in on_the_way:  # the root itself ("") too, where it holds any
            _HELD[module] = name or type(root).__name__
            held.append(module)
    _install_hooks()
    report.on_revert(lambda: [_HELD.pop(module, None) for module in held])
