"""Kernel injection into model families (one module each: ltx.py, ...). Every injection is reversible and
returns an InjectionReport: what was patched, per rule, and what was left alone and why."""

from __future__ import annotations

import functools
import inspect
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass
class InjectionReport:
    provider: str
    rules: Counter = field(default_factory=Counter)        # rule name -> modules patched
    skipped: list[tuple[str, str]] = field(default_factory=list)  # (target, reason)
    _undo: list[Callable[[], None]] = field(default_factory=list, repr=False)

    def patched(self, rule: str, undo: Callable[[], None]) -> None:
        self.rules[rule] += 1
        self._undo.append(undo)

    def note(self, rule: str) -> None:
        """Count `rule` for a module whose patch (already counted under another rule) carries it out."""
        self.rules[rule] += 1

    def on_revert(self, undo: Callable[[], None]) -> None:
        """Run `undo` on revert without counting a patch (state that belongs to a patch already counted)."""
        self._undo.append(undo)

    def skip(self, target: str, reason: str) -> None:
        self.skipped.append((target, reason))

    @property
    def active(self) -> bool:
        return bool(self._undo)

    def revert(self) -> None:
        """Undo every patch, newest first; the model is exactly as before `apply_kernels`."""
        while self._undo:
            self._undo.pop()()

    def __enter__(self) -> InjectionReport:
        return self

    def __exit__(self, *exc) -> None:
        self.revert()

    def as_dict(self) -> dict:
        return {"applied": bool(self.rules), "provider": self.provider, "rules": dict(self.rules),
                "skipped": [{"target": t, "reason": r} for t, r in self.skipped]}


def forward_source(cls) -> str:
    """The source of `cls.forward` ("" when it cannot be read), which the rules compare with the code they reproduce.
    Read once per function: every layer of a model shares its class's."""
    return _source_of(cls.forward)


@functools.cache
def _source_of(function) -> str:
    try:
        return inspect.getsource(function)
    except (OSError, TypeError):
        return ""


ORIGINAL_CLASS = "_ltxbench_original_class"  # on a patched subclass: the class it stands in for


def original_class(module) -> type:
    """The class `module` had before patch_forward (its own class when unpatched)."""
    return getattr(type(module), ORIGINAL_CLASS, type(module))


def patch_forward(report: InjectionReport, rule: str, module, forward, classes: dict, call=None) -> None:
    """Run `forward` as `module`'s forward through a subclass of its class that defines it (same name; one
    subclass per (class, forward, call), kept in `classes`), until revert. Not an instance attribute: dynamo inlines
    a module whose forward lives on its class as it does the original, while an instance-level forward cost every
    call of a compiled model about 100 more guards per patched module (its hook dicts, `__call__` lookups; a
    32-layer llama-tiny on a CPU: 716 instead of 446 us of host time per call, notes/kernel-tuning.md).
    call: also the subclass's `__call__`, which runs before nn.Module.compile()'s compiled forward (eager work
    whose result the forward takes as an argument)."""
    cls = type(module)
    patched = classes.get((cls, forward, call))
    if patched is None:
        members = {"forward": forward, ORIGINAL_CLASS: cls, "__module__": cls.__module__,
                   "__qualname__": cls.__qualname__}
        if call is not None:
            members["__call__"] = call
        patched = type(cls.__name__, (cls,), members)
        classes[(cls, forward, call)] = patched
    module.__class__ = patched

    def undo():
        module.__class__ = cls
        # a hook removed after injection (accelerate's remove_hook_from_module) leaves our forward bound on the instance
        if getattr(vars(module).get("forward"), "__func__", None) is forward:
            del module.forward

    report.patched(rule, undo)


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
