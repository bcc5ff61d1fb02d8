"""A MemoryPlan applied to a pipeline built on the host (docs/memory.md): `place()` once (the components held whole
and the layer stacks' components outside their stacks to the GPU, the unused parts left on the host, VAE tiling),
then the streamers `install()`ed on the stacks. An injection changes the blocks' tensors (fused projections, FP8
copies), so it runs with the streamers uninstalled (`around`): the blocks are back in storage of their own on the
host, the injection patches them there, and the streamers lay them out again.
"""

from __future__ import annotations

from ltxbench.memory.plan import MemoryPlan
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
        self.enforced: dict | None = None  # bench e2e: how the budget was held to (budget_enforcer)

    def place(self) -> None:
        for name, _ in self.plan.resident:
            getattr(self.pipe, name).to(self.device)
        for name, path in self.family.memory_stacks.items():
            component = getattr(self.pipe, name)
            host_only = [at(self.pipe, p) for p in self.family.memory_host_only if p.startswith(f"{name}.")]
            _move_outside(component, [at(component, path), *host_only], self.device)
        if self.plan.vae_tiling:  # in space and time: a decode's activations are one tile's
            self.pipe.vae.enable_tiling()
            self.pipe.vae.use_framewise_decoding = True
        vars(self.pipe)[PLACEMENT_ATTR] = self

    def install(self) -> None:
        from ltxbench.memory.stream import BlockStreamer

        for name, path in self.family.memory_stacks.items():
            stack = getattr(self.plan, name)
            blocks = at(getattr(self.pipe, name), path)
            self.streamers.append(BlockStreamer(blocks, stack.streamed, stack.slots, self.device))

    def uninstall(self) -> None:
        while self.streamers:
            self.streamers.pop().revert()

    def around(self, patch):
        """patch() (an injection: its report, or None) applied with the streamers uninstalled, then installed again;
        the report returned reverts the same way."""
        self.uninstall()
        try:
            report = patch()
        finally:
            self.install()
        return report if report is None else _Placed(report, self)

    def as_dict(self) -> dict:
        return {**self.plan.as_dict(), "streamers": [s.as_dict() for s in self.streamers]}


class _Placed:
    """An injection's report under a placement: its revert() uninstalls the streamers, reverts, installs them."""

    def __init__(self, report, placement: Placement):
        self.report, self.placement = report, placement

    def revert(self) -> None:
        self.placement.uninstall()
        try:
            self.report.revert()
        finally:
            self.placement.install()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.revert()

    def as_dict(self) -> dict:
        return self.report.as_dict()
