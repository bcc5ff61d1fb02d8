"""Patching a model in place, reversibly: a module's forward (or an object's __call__) through a subclass of its
class, an instance attribute, and what revert needs to find a patched forward that a later hook captured."""

from __future__ import annotations

import functools
import inspect
import types
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ltxbench.inject import InjectionReport


def forward_source(cls) -> str:
    """The source of `cls.forward` ("" when it cannot be read), which the rules compare with the code they reproduce.
    Read once per function: every layer of a model shares its class's."""
    return source_of(cls.forward)


@functools.cache
def source_of(function) -> str:
    try:
        return inspect.getsource(function)
    except (OSError, TypeError):
        return ""


def source_digest(function) -> str:
    """sha256 (first 16 hex digits) of `function`'s source ("" when it cannot be read): what a rule compares with
    the digest of the code it reproduces."""
    import hashlib

    source = source_of(function)
    return hashlib.sha256(source.encode()).hexdigest()[:16] if source else ""


ORIGINAL_CLASS = "_ltxbench_original_class"  # on a patched subclass: the class it stands in for


def original_class(module) -> type:
    """The class `module` had before patch_forward (its own class when unpatched)."""
    return getattr(type(module), ORIGINAL_CLASS, type(module))


def _subclass(cls, members: dict, classes: dict) -> type:
    """The subclass of `cls` that defines `members` (same name and module as `cls`), made once per (cls, members).
    A member an earlier patch of the same object defines is refused: each patched member calls
    `original_class(self).<member>`, which from a second layer would be the first layer's, calling itself forever."""
    stacked = [name for name in members for base in cls.__mro__
               if ORIGINAL_CLASS in vars(base) and name in vars(base)]
    if stacked:
        raise ValueError(f"{cls.__name__}.{stacked[0]} is patched by ltxbench already: revert that patch first")
    key = (cls, *members.values())
    patched = classes.get(key)
    if patched is None:
        patched = type(cls.__name__, (cls,), {**members, ORIGINAL_CLASS: cls, "__module__": cls.__module__,
                                              "__qualname__": cls.__qualname__})
        classes[key] = patched
    return patched


def patch_forward(report: InjectionReport, rule: str, module, forward, classes: dict, call=None) -> None:
    """Run `forward` as `module`'s forward through a subclass of its class that defines it (same name; one
    subclass per (class, forward, call), kept in `classes`), until revert. Not an instance attribute: dynamo inlines
    a module whose forward lives on its class as it does the original, while an instance-level forward cost every
    call of a compiled model about 100 more guards per patched module (its hook dicts, `__call__` lookups; a
    32-layer llama-tiny on a CPU: 716 instead of 446 us of host time per call).
    call: also the subclass's `__call__`, which runs before nn.Module.compile()'s compiled forward (eager work
    whose result the forward takes as an argument)."""
    cls = type(module)
    module.__class__ = _subclass(cls, {"forward": forward} if call is None else {"forward": forward, "__call__": call},
                                 classes)
    installed = vars(type(module))["forward"]  # what a hook binds: a class hook (transformers' layers) may wrap it

    def undo():
        module.__class__ = cls
        _rebind_hook_holders(module, installed, cls)

    report.patched(rule, undo)
    report.blocked_by(lambda: _unknown_holder(module, installed))


def patch_call(report: InjectionReport, rule: str, obj, call, classes: dict) -> None:
    """Run `call` as `obj`'s `__call__` (a subclass of its class, as patch_forward does) until revert."""
    cls = type(obj)
    obj.__class__ = _subclass(cls, {"__call__": call}, classes)

    def undo():
        obj.__class__ = cls

    report.patched(rule, undo)


def _runs(function, forward) -> bool:
    """`function` is `forward` bound to a module (what a hook captures as the module's forward)."""
    return getattr(function, "__func__", None) is forward


def _rebind_hook_holders(module, forward, cls) -> None:
    """A hook installed after the injection captured the patched forward bound to `module`; point the holders we know
    at the original forward (`cls.forward`): accelerate's `_old_forward` (CPU offload, device maps), diffusers'
    HookRegistry function references (group offload, context parallelism, its caches), and the bound forward a hook
    removed after the injection leaves on the instance."""
    original = types.MethodType(cls.forward, module)
    if _runs(vars(module).get("_old_forward"), forward):
        module._old_forward = original
    for ref in getattr(vars(module).get("_diffusers_hook"), "_fn_refs", ()):
        for name in ("forward", "original_forward"):
            if _runs(getattr(ref, name, None), forward):
                setattr(ref, name, original)
    if _runs(vars(module).get("forward"), forward):
        del module.forward


def _unknown_holder(module, forward) -> str | None:
    """What would still run the patched forward after _rebind_hook_holders: a forward wrapper on the instance that
    reaches it (through functools' __wrapped__, a partial's arguments or a closure cell) where no known holder is.
    None where nothing does, as far as references can be followed."""
    own = vars(module)
    wrapper = own.get("forward")
    if wrapper is None or _runs(wrapper, forward) or "_old_forward" in own or "_diffusers_hook" in own:
        return None
    seen, todo = set(), [wrapper]
    while todo and len(seen) < 64:
        item = todo.pop()
        if id(item) in seen:
            continue
        seen.add(id(item))
        if _runs(item, forward):
            name = getattr(wrapper, "__qualname__", None) or type(wrapper).__name__
            return (f"a {type(module).__name__}'s forward is wrapped by {name} (installed after the injection), "
                    "which holds the patched forward")
        if isinstance(item, functools.partial):
            todo += [item.func, *item.args, *item.keywords.values()]
        todo += [c.cell_contents for c in getattr(item, "__closure__", None) or () if _filled(c)]
        if hasattr(item, "__wrapped__"):
            todo.append(item.__wrapped__)
    return None


def _filled(cell) -> bool:
    try:
        cell.cell_contents  # noqa: B018 (an empty cell raises)
    except ValueError:
        return False
    return True


def set_attr(report: InjectionReport, rule: str, obj, name: str, value) -> None:
    """Set obj.name = value as an instance attribute, recording how to put back what was there."""
    had_own = name in vars(obj)
    old = vars(obj).get(name)

    def undo():
        if had_own:
            setattr(obj, name, old)
        else:
            delattr(obj, name)

    setattr(obj, name, value)
    report.patched(rule, undo)
