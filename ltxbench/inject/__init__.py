"""Kernel injection into model families (one sub-package each: ltx/, llm/). Every injection is reversible and
returns an InjectionReport: what was patched, per rule, and what was left alone and why."""

from __future__ import annotations

import contextlib
import contextvars
import functools
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

from ltxbench.errors import EnvironmentProblem, UsageError
from ltxbench.inject.hooks import (  # noqa: F401  (the package's import surface)
    PLACES_WEIGHTS,
    decides_per_call,
    observed,
    observed_inside,
)
from ltxbench.inject.patching import (  # noqa: F401  (the package's import surface)
    ORIGINAL_CLASS,
    forward_source,
    original_class,
    patch_call,
    patch_forward,
    set_attr,
    source_of,
)

# InjectionReport.outcomes() key: the indices, among one generation's transformer calls, of the calls a memo answered
# without running them (their work skipped: bench e2e counts their FLOPs apart)
CALLS_ANSWERED = "calls_answered"


class RevertRefused(UsageError):
    """revert() cannot restore the model: something installed after the injection still runs a patched forward.
    Nothing was undone (the model stays patched and consistent)."""


@dataclass
class InjectionReport:
    provider: str
    rules: Counter = field(default_factory=Counter)        # rule name -> modules patched
    skipped: list[tuple[str, str]] = field(default_factory=list)  # (target, reason)
    _undo: list[Callable[[], None]] = field(default_factory=list, repr=False)
    _blockers: list[Callable[[], str | None]] = field(default_factory=list, repr=False)
    _outcomes: dict[str, Callable[[], object]] = field(default_factory=dict, repr=False)

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

    def outcome(self, name: str, read: Callable[[], object]) -> None:
        """read() says what a patch did while it ran (the calls a memo answered): outcomes() after the work."""
        self._outcomes[name] = read

    def outcomes(self) -> dict:
        return {name: read() for name, read in self._outcomes.items()}

    def include(self, other: InjectionReport, prefix: str) -> None:
        """Another injection (a pipeline component's) as part of this one: its rules and skips named under `prefix`,
        its revert run with this report's (newest first), its blockers checked before anything is undone."""
        for rule, count in other.rules.items():
            self.rules[f"{prefix}: {rule}"] += count
        self.skipped.extend((f"{prefix}: {target}", reason) for target, reason in other.skipped)
        self._outcomes.update({f"{prefix}: {name}": read for name, read in other._outcomes.items()})
        self._blockers.extend(other._blockers)
        self._undo.append(other.revert)

    @property
    def active(self) -> bool:
        return bool(self._undo)

    def blocked_by(self, check: Callable[[], str | None]) -> None:
        """check() names what would keep a patch running after revert (None: nothing); revert refuses then."""
        self._blockers.append(check)

    def revert(self) -> None:
        """Undo every patch, newest first; the model is exactly as before `apply_kernels`, hooks installed since
        (accelerate's offload, diffusers' hook registry) included. Raises RevertRefused, undoing nothing, where a
        wrapper of unknown kind installed after the injection holds a patched forward."""
        reasons = [reason for check in self._blockers if (reason := check())]
        if reasons:
            raise RevertRefused(f"cannot revert the kernel injection: {reasons[0]}"
                                + (f" (and {len(reasons) - 1} more)" if len(reasons) > 1 else ""),
                                hint="remove that wrapper (or hook) first, then revert")
        while self._undo:
            self._undo.pop()()
        self._blockers.clear()

    def __post_init__(self) -> None:
        opened = _OPEN_INJECTIONS.get()
        if opened is not None:
            opened.append(self)

    def __enter__(self) -> InjectionReport:
        return self

    def __exit__(self, *exc) -> None:
        self.revert()

    def as_dict(self) -> dict:
        return {"applied": bool(self.rules), "provider": self.provider, "rules": dict(self.rules),
                "skipped": [{"target": t, "reason": r} for t, r in self.skipped]}


# The reports made inside the outermost all_or_nothing call still running (None: no such call)
_OPEN_INJECTIONS: contextvars.ContextVar = contextvars.ContextVar("ltxbench_open_injections", default=None)


def all_or_nothing(apply: Callable) -> Callable:
    """An apply_kernels that raises part way (a component on the wrong device, a refusal found late) leaves nothing
    patched: every report made during its call (its own and those of the components it includes) is reverted,
    newest first, before the error goes on."""

    @functools.wraps(apply)
    def applied(*args, **kwargs):
        if _OPEN_INJECTIONS.get() is not None:  # inside another's call: that one undoes everything
            return apply(*args, **kwargs)
        token = _OPEN_INJECTIONS.set([])
        try:
            return apply(*args, **kwargs)
        except BaseException:
            for report in reversed(_OPEN_INJECTIONS.get()):
                while report._undo:
                    report._undo.pop()()
            raise
        finally:
            _OPEN_INJECTIONS.reset(token)

    return applied


def outcomes_of(report) -> dict:
    """report.outcomes() where the report (ours, or a wrapper of ours) has them; {} for None and peers' reports."""
    read = getattr(report, "outcomes", None)
    return read() if read is not None else {}


def parameter_versions(module) -> int:
    """The sum of `module`'s parameters' version counters: it moves with any in-place write to one of them (a memo
    of the model's output compares it; `.data` writes, which bump nothing, are the generation scopes' to catch)."""
    return sum(p._version for p in module.parameters())


_RUNS_ON: contextvars.ContextVar = contextvars.ContextVar("ltxbench_runs_on", default=None)


@contextlib.contextmanager
def runs_on(device):
    """Injections inside take `device` as the one the model runs on, though its weights may be on the host now (a
    --memory-budget placement keeps them there outside their phase, or streams them)."""
    import torch

    token = _RUNS_ON.set(torch.device(device))
    try:
        yield
    finally:
        _RUNS_ON.reset(token)


def run_device(module):
    """The device `module` computes on: its placement's (runs_on), else its first parameter's."""
    placed = _RUNS_ON.get()
    return placed if placed is not None else next(module.parameters()).device


def require_provider(provider: str, ops, module, what: str, *, move: str | None = None) -> None:
    """Where `provider` is "cuda" (`ops` its provider): `module` (the `what`) is on a CUDA device, the extension
    builds and loads, and its inductor fallbacks are registered; `move` names what the user moves to cuda (the
    `what` unless given). Nothing for the reference provider."""
    if provider != "cuda":
        return
    device = run_device(module)
    if device.type != "cuda":
        raise EnvironmentProblem(f"the cuda kernel provider needs the {what} on a CUDA device, it is on {device}",
                                 hint=f"move the {move or what} to cuda first, or use --kernel-provider reference")
    from ltxbench.ops import build

    build.load()  # build failures surface here (exit 4), not in the middle of a forward
    ops.register_inductor_fallbacks()  # so that torch.compile of the patched model finishes (see there)


OFFLOADED = ("parameters offloaded (on the meta device: sequential CPU offload or a device map with offload): they "
             "reach the GPU one module at a time inside that module's own forward, and the fused paths read them "
             "across modules; nothing patched (apply the kernels before offloading, or offload the whole model with "
             "enable_model_cpu_offload)")


def offloaded(module) -> bool:
    """Some parameters of `module` live on the meta device and others do not (accelerate's offload keeps the real ones
    elsewhere), or an accelerate hook offloads one of its modules. A model wholly on the meta device (built to read
    its structure) is not offloaded."""
    on_meta = {p.is_meta for p in module.parameters()}
    return len(on_meta) == 2 or any(getattr(vars(m).get("_hf_hook"), "offload", False) for m in module.modules())


STREAMER_ATTR = "_ltxbench_block_streamer"  # in a streamed ModuleList's __dict__: its ltxbench.memory BlockStreamer


def streamer_of(blocks):
    """The BlockStreamer serving `blocks` (a ModuleList; --memory-budget, ltxbench.memory.stream), or None. Code that
    reads a block's weights other than through the block's own call (LTX-Video's chained model forward) asks it to
    load the block first."""
    return vars(blocks).get(STREAMER_ATTR)


@contextlib.contextmanager
def generation_scope(target, cache_attr: str, forget: Callable[[object], None]):
    """One generation of a patched model (`target`: the transformer or its pipeline): the cache the transformer holds
    at `cache_attr` (with a `generations` count) answers only inside, and forget(target) runs on entry and on exit,
    an exception included, so no weight change between generations meets an old entry."""
    cache = vars(getattr(target, "transformer", target)).get(cache_attr)
    forget(target)
    if cache is not None:
        cache.generations += 1
    try:
        yield
    finally:
        if cache is not None:
            cache.generations -= 1
        forget(target)


def generation_call(scope: Callable) -> Callable:
    """A pipeline `__call__` (for patch_call) that runs the pipeline's own call as one generation, `scope(pipeline)`."""

    def call(self, *args, **kwargs):
        with scope(self):
            return original_class(self).__call__(self, *args, **kwargs)

    return call
