"""A MemoryPlan applied to a pipeline built on the host (docs/memory.md): `place()` once (VAE tiling; a static plan:
the components held whole and the layer stacks' components outside their stacks to the GPU, the unused parts left on
the host), then `install()`: the streamers on the stacks and, for a phased plan, a Mover (phases.py) per component
with the weights it holds on the GPU in its phase, switched by forward pre-hooks on the components as the pipeline
calls them (the text encoder and connectors: encode; the transformer: denoise; the VAEs' encoder and decoder and the
vocoder: decode). A phase change first sends the components not in the new phase to their pinned host copies (the
transformer stays through the phases the plan lets it), then brings the new phase's ones. An injection changes the
blocks' tensors (fused projections, FP8 copies), so it runs with all this uninstalled (`around`): the weights back in
storage of their own on the host, patched there, and laid out again.
"""

from __future__ import annotations

import contextlib
import time

from ltxbench.inject import PLACES_WEIGHTS
from ltxbench.memory.plan import ENCODE_PARTS, EXPERTS, MemoryPlan
from ltxbench.memory.sizes import at

PLACEMENT_ATTR = "_ltxbench_memory_placement"  # in a placed pipeline's __dict__: its Placement


def placement_of(pipe):
    """The Placement applied to `pipe`, or None (also for objects without instance attributes)."""
    return getattr(pipe, "__dict__", {}).get(PLACEMENT_ATTR)


def placed(pipe, patch):
    """patch() (an injection: its report, or None) under `pipe`'s placement (Placement.around), or as it is where
    there is none."""
    placement = placement_of(pipe)
    return patch() if placement is None else placement.around(patch)


def budget_enforcer(pipe, log):
    """Under --memory-budget on a GPU: what bench e2e calls after its untimed first iteration, capping the caching
    allocator so that the budget holds (memory.budget.enforce; recorded as the placement's `enforced`); else None."""
    placement = placement_of(pipe)
    if placement is None or placement.device.type != "cuda":
        return None

    def cap() -> None:
        from ltxbench.memory.budget import enforce

        placement.enforced = enforce(placement.device, placement.plan.budget_bytes)
        log(f"memory budget enforced: {placement.enforced['describe']}")

    return cap


def _move_outside(module, skip: list, device) -> None:
    """Every parameter and buffer of `module` but those of the modules in `skip` to `device` (the Parameters kept:
    references to them, tied weights included, stay valid)."""
    skipped = {id(m) for part in skip for m in part.modules()}
    for sub in module.modules():
        if id(sub) in skipped:
            continue
        for param in sub._parameters.values():
            if param is not None and param.device != device:
                param.data = param.data.to(device)
        for name, buffer in sub._buffers.items():
            if buffer is not None and buffer.device != device:
                sub._buffers[name] = buffer.to(device)


class Placement:
    """`plan` applied to `pipe` on `device` for `family` (its memory_stacks and memory_host_only)."""

    def __init__(self, pipe, plan: MemoryPlan, family, device):
        import torch

        self.pipe, self.plan, self.family = pipe, plan, family
        self.device = torch.device(device)
        if self.device.type == "cuda" and self.device.index is None:
            self.device = torch.device("cuda", torch.cuda.current_device())
        self.streamers: list = []
        self.movers: dict = {}   # component -> its phases.Mover (a phased plan)
        self._hooks: list = []
        self.phase: str | None = None  # the phase whose components are on the GPU
        self.installed = False  # streamers and phase hooks in place (install(); a peer or a user may uninstall())
        self.enforced: dict | None = None  # bench e2e: how the budget was held to (budget_enforcer)
        # where random weights were drawn (cli._memory): from one seed, the GPU's generator and the host's give
        # other numbers, so a budgeted run's random weights are the resident run's only where drawn on the GPU
        self.random_weights_drawn_on: str | None = None
        # wall seconds of each install() / uninstall(): the pinned copies laid out (again, around each injection)
        self.layout_seconds: dict[str, list[float]] = {"install": [], "uninstall": []}

    def phase_of(self, name: str) -> str:
        """The phase in which component `name` is on the GPU: a later expert's steps are a denoise phase of its own."""
        if name in EXPERTS:
            return "denoise" if name == EXPERTS[0] else f"denoise ({name})"
        return "encode" if name == "text_encoder" or name in ENCODE_PARTS else "decode"

    def stacks(self) -> dict[str, str]:
        """Component -> the path of its stack of layers: the family's, and the transformer's for each further expert
        the pipeline has (Wan 2.2 A14B's transformer_2)."""
        path = self.family.memory_stacks["transformer"]
        return {**self.family.memory_stacks,
                **{name: path for name in EXPERTS[1:] if getattr(self.pipe, name, None) is not None}}

    def place(self) -> None:
        if self.plan.vae_tiling:  # in space and time: a decode's activations are one tile's
            self.pipe.vae.enable_tiling()
            self.pipe.vae.use_framewise_decoding = True
        vars(self.pipe)[PLACEMENT_ATTR] = self
        if self.plan.phased:  # the pipeline's tensors are made on the device the phases run on
            cls, device = type(self.pipe), self.device
            self.pipe.__class__ = type(cls.__name__, (cls,), {"_execution_device": property(lambda _: device)})
            return
        for name, _ in self.plan.resident:
            getattr(self.pipe, name).to(self.device)
        for name, path in self.stacks().items():
            component = getattr(self.pipe, name)
            host_only = [at(self.pipe, p) for p in self.family.memory_host_only if p.startswith(f"{name}.")]
            _move_outside(component, [at(component, path), *host_only], self.device)

    def install(self) -> None:
        """The streamers; for a phased plan, each component's Mover made (one at a time: its weights leave the GPU
        before the next component's come) and the phase hooks."""
        with self._timed("install"):
            self._install()
        self.installed = True

    def _install(self) -> None:
        from ltxbench.memory.phases import Mover, tensors_of
        from ltxbench.memory.stream import BlockStreamer

        for name, path in self.stacks().items():
            stack = self.plan.stack(name)
            component = getattr(self.pipe, name)
            streamer = BlockStreamer(at(component, path), stack.streamed, stack.slots, self.device)
            self.streamers.append(streamer)
            if self.plan.phased:
                streamed = {id(t) for spans in streamer._spans.values() for span in spans for t in span.tensors}
                host_only = [at(self.pipe, p) for p in self.family.memory_host_only if p.startswith(f"{name}.")]
                self.movers[name] = Mover(tensors_of(component, host_only, streamed), self.device,
                                          self.device.type == "cuda")
                streamer.release()
        if not self.plan.phased:
            return
        for name, _ in self.plan.resident:
            self.movers[name] = Mover(tensors_of(getattr(self.pipe, name)), self.device, self.device.type == "cuda")
        self.phase = None
        for name in self.movers:
            component = getattr(self.pipe, name)
            for module in (component, *(getattr(component, part, None) for part in ("encoder", "decoder"))):
                if module is not None and hasattr(module, "register_forward_pre_hook"):
                    self._hooks.append(module.register_forward_pre_hook(_entering(self, name)))

    def enter(self, phase: str, component: str | None = None) -> None:
        """`phase` begins: the other phases' components (the transformer but where the plan keeps it) go to the
        host; then `component` comes to the GPU (every component of the phase when None). Components come as the
        pipeline first calls them, so one a run does not call (the text encoder when the prompt embeddings are
        given) never takes the phase's memory or a copy."""
        streamers = {s.blocks: s for s in self.streamers}
        if phase != self.phase:
            for name, mover in self.movers.items():
                keep = name in EXPERTS and phase in self.plan.transformer_stays
                if self.phase_of(name) != phase and not keep:
                    mover.to_host()
                    self._stack_streamer(name, streamers, "release")
            self.phase = phase
        for name, mover in self.movers.items():
            if self.phase_of(name) == phase and component in (None, name) and not mover.on_device:
                mover.to_device()
                self._stack_streamer(name, streamers, "acquire")

    def _stack_streamer(self, name: str, streamers: dict, step: str) -> None:
        path = self.stacks().get(name)
        if path is not None:
            streamer = next(s for blocks, s in streamers.items() if blocks is at(getattr(self.pipe, name), path))
            getattr(streamer, step)()

    def uninstall(self) -> None:
        """The hooks off, every component's weights back where place() left them, the streamers reverted."""
        with self._timed("uninstall"):
            self._uninstall()
        self.installed = False

    def _uninstall(self) -> None:
        for hook in self._hooks:
            hook.remove()
        self._hooks, self.phase = [], None
        for mover in self.movers.values():  # the resident blocks go back to the GPU a component at a time ...
            mover.to_host()
        stacks = self.stacks()
        for name in list(self.movers):
            self.movers.pop(name).revert()
            stack = [s for s in self.streamers if s.blocks is at(getattr(self.pipe, name), stacks[name])] \
                if name in stacks else []
            for streamer in stack:  # ... and to the host with their streamer
                self.streamers.remove(streamer)
                streamer.revert()
        while self.streamers:
            self.streamers.pop().revert()

    @contextlib.contextmanager
    def _timed(self, step: str):
        started = time.perf_counter()
        try:
            yield
        finally:
            self.layout_seconds[step].append(round(time.perf_counter() - started, 3))

    def around(self, patch):
        """patch() (an injection: its report, or None) applied with the streamers uninstalled, then installed again
        where they were (a placement someone uninstalled stays so); the report returned reverts the same way."""
        from ltxbench.inject import runs_on

        with self.lifted():
            with runs_on(self.device):
                report = patch()
        return report if report is None else _Placed(report, self)

    @contextlib.contextmanager
    def lifted(self):
        """The streamers and hooks off inside, back on after (an exception included) only where they were on."""
        was_installed = self.installed
        if was_installed:
            self.uninstall()
        try:
            yield
        finally:
            if was_installed:
                self.install()

    def as_dict(self) -> dict:
        return {**self.plan.as_dict(), "streamers": [s.as_dict() for s in self.streamers],
                "moved_bytes": {name: m.nbytes for name, m in self.movers.items()},
                "random_weights_drawn_on": self.random_weights_drawn_on,
                "layout_seconds": {step: list(seconds) for step, seconds in self.layout_seconds.items()}}


def _entering(placement: Placement, name: str):
    """A forward pre-hook bringing component `name` to the GPU, in its phase (outside any compiled graph)."""
    import torch

    phase = placement.phase_of(name)

    @torch.compiler.disable
    def hook(_module, _args):
        placement.enter(phase, name)

    setattr(hook, PLACES_WEIGHTS, True)  # idempotent, the call's arguments left alone (ltx.step may run it first)
    return hook


class _Placed:
    """An injection's report under a placement: its revert() uninstalls the streamers, reverts, installs them."""

    def __init__(self, report, placement: Placement):
        self.report, self.placement = report, placement

    def revert(self) -> None:
        with self.placement.lifted():
            self.report.revert()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.revert()

    def as_dict(self) -> dict:
        return self.report.as_dict()

    def outcomes(self) -> dict:
        from ltxbench.inject import outcomes_of

        return outcomes_of(self.report)
