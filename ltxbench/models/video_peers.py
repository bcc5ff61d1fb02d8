"""diffusers' own ways of running a video pipeline in less GPU memory, as peer configurations of `bench e2e`: what a
user would pick instead of `--memory-budget`, measured in the same run at the same budget.

- group-offload: `enable_group_offload(onload_device=<GPU>, offload_device=cpu, offload_type="block_level",
  num_blocks_per_group=1, use_stream=True)` on every component, as diffusers documents it for low memory (each
  block copied from pinned host memory on a side stream, the next one prefetched while one computes);
- model-offload: `enable_model_cpu_offload`: each component moved to the GPU whole when it is called.

diffusers expects the components on the host and moves them itself, so applying a peer first takes our placement off
(`--memory-budget`: streamers, movers, phase hooks) and sends every weight still on the GPU to the host; revert()
takes diffusers' hooks off (its group offloading has no public removal: the registry's hooks are removed by name, as
diffusers does before it re-applies them), puts back every module attribute the hooks added or replaced, gives each
parameter and buffer (the same objects) storage of its own on the device it was on, and installs our placement again.
"""

from __future__ import annotations

from dataclasses import dataclass, field

GROUP_OFFLOAD = "group-offload"
MODEL_OFFLOAD = "model-offload"
OFFLOADS = (GROUP_OFFLOAD, MODEL_OFFLOAD)
# diffusers' hook names in a module's HookRegistry (diffusers.hooks.group_offloading)
_GROUP_HOOKS = ("group_offloading", "layer_execution_tracker", "lazy_prefetch_group_offloading")
_MISSING = object()


@dataclass
class OffloadReport:
    """A diffusers offload applied to a pipeline, with the InjectionReport interface bench e2e uses."""

    name: str
    library: str
    settings: dict
    _undo: list = field(default_factory=list, repr=False)  # callables, newest last

    @property
    def active(self) -> bool:
        return bool(self._undo)

    def revert(self) -> None:
        """Undo everything, newest first; a second call does nothing."""
        while self._undo:
            self._undo.pop()()

    def __enter__(self) -> OffloadReport:
        return self

    def __exit__(self, *exc) -> None:
        self.revert()

    def as_dict(self) -> dict:
        return {"applied": True, "provider": "diffusers", "library": self.library, "rules": {self.name: 1},
                "skipped": [], "settings": self.settings}


def components(pipe) -> dict:
    """The pipeline's torch modules by name."""
    import torch

    return {name: c for name, c in pipe.components.items() if isinstance(c, torch.nn.Module)}


def onload_device(pipe):
    """The GPU the pipeline runs on (its placement's under --memory-budget)."""
    from ltxbench.memory.apply import placement_of

    placement = placement_of(pipe)
    import torch

    return placement.device if placement is not None else torch.device(pipe._execution_device)


def apply_group_offload(pipe) -> OffloadReport:
    """Group offloading as diffusers documents it for low memory; on the CPU (tests) without a stream, which needs
    CUDA."""
    device = onload_device(pipe)
    settings = {"onload_device": str(device), "offload_device": "cpu", "offload_type": "block_level",
                "num_blocks_per_group": 1, "use_stream": device.type == "cuda"}

    def enable():
        import torch

        pipe.enable_group_offload(**{**settings, "onload_device": device, "offload_device": torch.device("cpu")})

    return _apply(pipe, GROUP_OFFLOAD, settings, enable, _remove_group_offload)


def apply_model_offload(pipe) -> OffloadReport:
    """enable_model_cpu_offload on the pipeline's GPU (on the CPU in tests, where the hooks move nothing)."""
    device = onload_device(pipe)
    return _apply(pipe, MODEL_OFFLOAD, {"device": str(device)}, lambda: pipe.enable_model_cpu_offload(device=device),
                  lambda p: p.remove_all_hooks())


def _remove_group_offload(pipe) -> None:
    for component in components(pipe).values():
        for module in component.modules():
            registry = vars(module).get("_diffusers_hook")
            for name in _GROUP_HOOKS if registry is not None else ():
                registry.remove_hook(name, recurse=False)


def _apply(pipe, name: str, settings: dict, enable, remove) -> OffloadReport:
    from importlib import metadata

    from ltxbench.memory.apply import placement_of

    report = OffloadReport(name, f"diffusers {metadata.version('diffusers')}", settings)
    placement = placement_of(pipe)
    if placement is not None and placement.installed:  # reinstalled at revert only where it was installed
        placement.uninstall()
        report._undo.append(placement.install)
    try:
        tensors = _tensors(pipe)
        _to_host(tensors)
        report._undo.append(lambda: _restore_tensors(tensors))
        state = [(vars(m), dict(vars(m))) for c in components(pipe).values() for m in c.modules()]
        state.append((vars(pipe), dict(vars(pipe))))
        report._undo.append(lambda: _restore_attributes(state))
        report._undo.append(lambda: remove(pipe))
        enable()
    except BaseException:
        report.revert()
        raise
    return report


def _tensors(pipe) -> list[tuple[dict, str, object, object]]:
    """(table, key, tensor, device) of every parameter and buffer of the pipeline's components."""
    found = []
    for component in components(pipe).values():
        for module in component.modules():
            for table in (module._parameters, module._buffers):
                found += [(table, key, t, t.device) for key, t in table.items() if t is not None]
    return found


def _to_host(tensors) -> None:
    import torch

    cpu = torch.device("cpu")
    for _, _, tensor, device in tensors:
        if device != cpu:
            tensor.data = tensor.data.to(cpu)


def _restore_tensors(tensors) -> None:
    """Each tensor back in its table, on the device it was on, in storage of its own (diffusers' pinned copies and
    accelerate's moved ones dropped); the host's pinned memory cache emptied."""
    import torch

    for table, key, tensor, device in tensors:
        table[key] = tensor
        data = tensor.data
        if data.device != device or data.is_pinned():
            tensor.data = data.to(device, copy=True)
    torch._C._host_emptyCache()


def _restore_attributes(state) -> None:
    """Each module's (and the pipeline's) instance attributes as they were: hook registries, forwards bound on the
    instance, accelerate's and diffusers' markers removed or put back."""
    for now, before in state:
        for key in [k for k in now if k not in before]:
            del now[key]
        for key, value in before.items():
            if now.get(key, _MISSING) is not value:
                now[key] = value
