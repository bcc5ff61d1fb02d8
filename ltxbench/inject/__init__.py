"""Kernel injection into model families (one module each: ltx.py, ...). Every injection is reversible and
returns an InjectionReport: what was patched, per rule, and what was left alone and why."""

from __future__ import annotations

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
