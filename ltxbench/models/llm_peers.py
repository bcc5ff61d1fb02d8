"""Peer libraries as benchmark configurations for LLMs: Liger-Kernel's instance patch, applied to a loaded model and
undone exactly, so that `bench e2e` times our kernels and Liger's in one run on one model.

Liger patches by assignment: globals of the family's modeling module (apply_rotary_pos_emb, the RMSNorm and MLP
classes) and, given the model, attributes of its submodules (a forward bound on the instance, extra_repr, _get_name,
offset, casting_mode...). Rather than mirror that list, which grows with each Liger release, apply_liger snapshots
every namespace such a patch can reach and diffs it afterwards; revert() puts back each entry that changed.
"""

from __future__ import annotations

import sys
from collections import Counter
from dataclasses import dataclass, field
from typing import NamedTuple

from ltxbench.errors import EnvironmentProblem

PROVIDER = "liger"
_MISSING = object()  # marks an entry the patch added: revert deletes it
# Liger's loss kernels, off: inference computes no loss. fused_linear_cross_entropy (on by default for most families)
# would also swap the causal-LM forward for Liger's copy of it, which without labels computes the same plain logits.
_LOSS_OFF = {"cross_entropy": False, "fused_linear_cross_entropy": False}
_SWIGLU_ACTIVATIONS = ("silu", "swish")  # the only activation Liger's SwiGLU computes


@dataclass
class PeerReport:
    """What a peer library patched, with the InjectionReport interface that bench e2e uses: as_dict(), revert(),
    active, and `with apply_liger(model):` reverting on exit."""

    provider: str
    library: str
    rules: Counter = field(default_factory=Counter)
    skipped: list[tuple[str, str]] = field(default_factory=list)
    _changes: list[tuple[_Space, str, object]] = field(default_factory=list, repr=False)  # (namespace, key, before)

    @property
    def active(self) -> bool:
        return bool(self._changes)

    def skip(self, target: str, reason: str) -> None:
        self.skipped.append((target, reason))

    def revert(self) -> None:
        """Put back every entry the patch changed or added, newest first; a second call does nothing."""
        while self._changes:
            _restore(*self._changes.pop())

    def __enter__(self) -> PeerReport:
        return self

    def __exit__(self, *exc) -> None:
        self.revert()

    def as_dict(self) -> dict:
        return {"applied": bool(self.rules), "provider": self.provider, "rules": dict(self.rules),
                "skipped": [{"target": t, "reason": r} for t, r in self.skipped], "library": self.library}


def apply_liger(model) -> PeerReport:
    """Liger-Kernel's instance patch for `model.config.model_type`, reversible. A family Liger has no patch for gives
    a report with applied False (the other configurations of a run still measure); a model off the GPU is refused."""
    devices = sorted({str(t.device) for t in (*model.parameters(), *model.buffers()) if t.device.type != "cuda"})
    if devices:
        raise EnvironmentProblem(f"the liger configurations need the model on a CUDA device, and it is on "
                                 f"{', '.join(devices)}: Liger's kernels are Triton GPU kernels",
                                 hint="run the liger configurations on a GPU (--device cuda)")
    return _apply(model)


def _apply(model) -> PeerReport:
    """apply_liger without the device check (the CPU tests check the patch and its revert, not Liger's kernels)."""
    import inspect

    monkey_patch, library = _liger()
    report = PeerReport(PROVIDER, library)
    model_type = getattr(getattr(model, "config", None), "model_type", None)
    apply_fn = monkey_patch.MODEL_TYPE_TO_APPLY_LIGER_FN.get(model_type)
    if apply_fn is None:
        report.skip(str(model_type), f"{library} has no patch for model type {model_type!r}; nothing patched")
        return report
    accepted = inspect.signature(apply_fn).parameters
    has_kwargs = any(p.kind is p.VAR_KEYWORD for p in accepted.values())
    # The kernel flags keep Liger's per-family defaults (it turns off a kernel that does not fit the family).
    kwargs = {k: v for k, v in _LOSS_OFF.items() if k in accepted or has_kwargs}
    activation = getattr(model.config, "hidden_act", "silu")
    if "swiglu" in accepted and activation not in _SWIGLU_ACTIVATIONS:
        # Liger's instance patch binds its SwiGLU forward whatever the activation: it would compute silu instead
        kwargs["swiglu"] = False
        report.skip("swiglu", f"the model's activation is {activation!r}, and Liger's SwiGLU computes silu")

    before = _snapshot(model)
    try:
        apply_fn(model=model, **kwargs)
    except Exception as exc:  # noqa: BLE001 - the model is restored and the run goes on without this configuration
        report._changes = _diff(before)
        report.revert()
        report.skip(str(model_type), f"{library} failed to patch it ({type(exc).__name__}: {exc}); nothing patched")
        return report
    report._changes = _diff(before)
    overwritten = [s.label for s, key, old in report._changes if s.kind == "module" and key == "forward"
                   and old is not _MISSING]
    if overwritten:
        report.revert()
        report.skip(overwritten[0], "its forward was already replaced on the instance (an accelerate hook, another "
                    "injection): Liger's patch would discard that forward; nothing patched")
        return report
    report.rules.update(_rules(report._changes))
    return report


def _liger():
    """Liger's monkey_patch module and 'liger-kernel <version>'; importing it is slow (it imports torch._dynamo)."""
    from importlib import metadata

    try:
        from liger_kernel.transformers import monkey_patch
    except ModuleNotFoundError as exc:
        missing = (exc.name or "").split(".")[0]
        if missing != "liger_kernel":  # one of Liger's own dependencies (triton, say)
            raise EnvironmentProblem(f"Liger-Kernel cannot be imported: it needs {missing}, which is not installed",
                                     hint=f"pip install {missing}") from exc
        raise EnvironmentProblem("the liger configurations need Liger-Kernel, which is not installed",
                                 hint="pip install liger-kernel") from exc
    except ImportError as exc:  # e.g. a transformers older than this Liger supports
        raise EnvironmentProblem(f"Liger-Kernel cannot be imported: {exc}",
                                 hint="install a liger-kernel release that supports this transformers") from exc
    return monkey_patch, f"liger-kernel {metadata.version('liger-kernel')}"


class _Space(NamedTuple):
    """A namespace a patch can write to. kind: "module" (a submodule's __dict__), "table" (its parameter, buffer or
    child table), "class" (read and written through the class: its __dict__ is read-only) or "globals"."""

    kind: str
    label: str
    owner: object

    def entries(self):
        return vars(self.owner) if self.kind == "class" else self.owner


def _snapshot(model) -> list[tuple[_Space, dict]]:
    """Each namespace a patch of `model` can reach, with a shallow copy of its entries: the submodules' __dict__ and
    tables, their classes, and the globals of every loaded transformers module (and torch.nn.functional, where
    Liger's cross-entropy patch writes)."""
    import torch

    spaces: dict[int, _Space] = {}
    for name, module in model.named_modules():
        state = vars(module)
        spaces[id(state)] = _Space("module", name or type(module).__name__, state)
        for table in ("_parameters", "_buffers", "_modules"):
            if table in state:
                spaces[id(state[table])] = _Space("table", f"{name}.{table}", state[table])
        for cls in type(module).__mro__[:-1]:  # all but object
            spaces[id(cls)] = _Space("class", cls.__qualname__, cls)
    for name, loaded in list(sys.modules.items()):
        if name.startswith("transformers.") and loaded is not None:
            spaces[id(loaded)] = _Space("globals", name, vars(loaded))
    spaces[id(torch.nn.functional)] = _Space("globals", "torch.nn.functional", vars(torch.nn.functional))
    return [(space, dict(space.entries())) for space in spaces.values()]


def _diff(before: list[tuple[_Space, dict]]) -> list[tuple[_Space, str, object]]:
    """(namespace, key, value before) for each entry whose value is no longer the same object, or that is new."""
    changes = []
    for space, old in before:
        now = space.entries()
        for key in (*old, *(k for k in now if k not in old)):
            if now.get(key, _MISSING) is not old.get(key, _MISSING):
                changes.append((space, key, old.get(key, _MISSING)))
    return changes


def _restore(space: _Space, key: str, value) -> None:
    if space.kind == "class":
        if value is _MISSING:
            delattr(space.owner, key)
        else:
            setattr(space.owner, key, value)
    elif value is _MISSING:
        space.owner.pop(key, None)
    else:
        space.owner[key] = value


def _rules(changes) -> Counter:
    """Per Liger module (rms_norm, swiglu, rope...): the submodules given its forward, and the functions put in a
    module's globals or a class. Classes put in globals are not counted: they only shape modules built later."""
    rules: Counter = Counter()
    for space, key, _ in changes:
        value = space.entries().get(key)
        function = getattr(value, "__func__", value)
        source = getattr(function, "__module__", None) or ""
        if space.kind == "module":
            counted = key == "forward"
        else:
            counted = space.kind in ("globals", "class") and callable(function) and not isinstance(function, type)
        if counted and source.startswith("liger_kernel."):
            rules[source.rsplit(".", 1)[-1]] += 1
    return rules
