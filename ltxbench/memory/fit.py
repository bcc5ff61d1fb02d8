"""Will a model fit? Its weights are counted on the meta device (no memory, no init) and compared with what the
target device has free, so that a model too large is refused in one line (exit 4) before it is built, instead of
the CPU's OOM killer ending the process with "Killed" after a minute of allocation.

The estimate is the weights alone: activations come on top, so a model that passes can still run out of memory
later (on CUDA that is reported as exit 4 too); one that fails cannot be built at all.
"""

from __future__ import annotations

from pathlib import Path

from ltxbench.errors import EnvironmentProblem

_CGROUP = Path("/sys/fs/cgroup")
_DTYPE_NAMES = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16"}  # as --dtype spells them


def module_bytes(*modules) -> int:
    """Bytes of the parameters and buffers of `modules` (each tensor once, as shared weights are stored once)."""
    seen: dict[int, int] = {}
    for module in modules:
        for tensor in (*module.parameters(), *module.buffers()):
            seen[id(tensor)] = tensor.numel() * tensor.element_size()
    return sum(seen.values())


def _cgroup_room() -> int | None:
    """What the cgroup (v2) still lets this process allocate, where it sets a limit (containers)."""
    try:
        limit = (_CGROUP / "memory.max").read_text().strip()
        used = int((_CGROUP / "memory.current").read_text())
    except (OSError, ValueError):
        return None
    return None if limit == "max" else max(int(limit) - used, 0)


def available(device) -> tuple[int | None, str]:
    """(bytes free for new tensors on `device`, where that was read); None where it cannot be told."""
    import torch

    device = torch.device(device)
    if device.type == "cpu":
        import psutil

        free, where = psutil.virtual_memory().available, "the host has"
        room = _cgroup_room()
        if room is not None and room < free:
            free, where = room, "this container's memory limit leaves"
        return free, f"{where} {free / 2**30:.1f} GiB of RAM available"
    if device.type == "cuda" and torch.cuda.is_available():
        index = torch.cuda.current_device() if device.index is None else device.index
        free, _total = torch.cuda.mem_get_info(index)
        return free, f"{torch.cuda.get_device_name(index)} has {free / 2**30:.1f} GiB free"
    return None, ""


def gpu_memory(device) -> int | None:
    """The total memory of CUDA `device` in bytes, None for another device or without CUDA."""
    import torch

    device = torch.device(device)
    if device.type != "cuda" or not torch.cuda.is_available():
        return None
    return torch.cuda.get_device_properties(device.index or 0).total_memory


def ensure_fits(nbytes: int, device, what: str, dtype, budgeted: bool = False) -> None:
    """EnvironmentProblem (exit 4) when `nbytes` of weights (of torch dtype `dtype`) cannot fit in what `device` has
    free; `budgeted`: the model takes --memory-budget, which the hint then offers at what the GPU has free."""
    free, where = available(device)
    if free is None or nbytes <= free:
        return
    dtype_name = _DTYPE_NAMES.get(str(dtype).removeprefix("torch."), str(dtype))
    smaller = "--dtype bf16 (half the bytes of fp32), " if dtype_name == "fp32" else ""
    gpu = str(device).startswith("cuda")
    from ltxbench.configurations import MIN_MEMORY_BUDGET_GIB

    offered = int(free / 2**30) - 1  # a GiB below what is free: the context and other processes' growth
    budget = f"--memory-budget {offered} (weights streamed from host memory), " \
        if gpu and budgeted and offered >= MIN_MEMORY_BUDGET_GIB else ""
    other = "free the GPU (other processes), " if gpu else ""
    raise EnvironmentProblem(f"{what} in {dtype_name} needs about {nbytes / 2**30:.1f} GiB for its weights alone, "
                             f"and {where}",
                             hint=f"use {budget}{smaller}{other}a smaller --model, or a machine with more memory")
