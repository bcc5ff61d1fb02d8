"""--memory-budget in the commands: the plan made and printed before anything is built, then the pipeline built in
host memory and placed by it (ltxbench.memory). Only the standard library at top level."""

from __future__ import annotations

import dataclasses
import functools


def planned(family, settings, log, fit_free: bool = False):
    """The run's MemoryPlan (its lines given to `log`), or None without --memory-budget. Exit 4 where the budget or
    the host cannot hold the run. fit_free (generate): without --memory-budget, where the whole pipeline would not
    fit in what the GPU has free, the plan of that free memory (fitted_budget), said in one line, instead of an
    out-of-memory error; settings.memory_budget_gib is then set to it."""
    footprint = functools.cache(lambda: _footprint(family, settings))  # the meta build, once for both plans
    if settings.memory_budget_gib is None:
        fitted = fitted_budget(family, settings, footprint) if fit_free else None
        if fitted is None:
            return None
        budget, needed, where = fitted
        log(f"the whole pipeline needs about {needed:.1f} GiB of GPU memory at once and {where}: planned to "
            f"{budget:g} GiB (--memory-budget chooses)")
        settings.memory_budget_gib = budget
    plan = plan_for(settings, footprint)
    for line in plan.lines():
        log(line)
    return plan


def _footprint(family, settings):
    """The run's Footprint (ltxbench.memory.sizes), the components built on the meta device from the model's configs."""
    from ltxbench.memory.sizes import footprint
    from ltxbench.models.family import torch_dtype

    configs = family.builder.component_configs(settings.model)
    parts = family.builder.build_components(configs, "meta", torch_dtype(settings.dtype))
    return footprint(family, settings, parts)


def plan_for(settings, footprint):
    """The plan of `settings.memory_budget_gib` for this run (the host's available memory read now, before the
    pipeline is built there). EnvironmentProblem (exit 4) where it cannot be met. footprint: a call giving the run's
    Footprint."""
    from ltxbench.errors import EnvironmentProblem
    from ltxbench.memory.fit import available, gpu_memory
    from ltxbench.memory.plan import plan_memory

    total = gpu_memory(settings.device)
    if total is not None and settings.memory_budget_gib * 2**30 > total:
        raise EnvironmentProblem(f"--memory-budget {settings.memory_budget_gib:g} is more than this GPU's "
                                 f"{total / 2**30:.1f} GiB", hint=f"choose at most {int(total / 2**30)}, or leave "
                                 "--memory-budget out to run resident")
    host_free, _ = available("cpu")
    return plan_memory(settings.memory_budget_gib, footprint(), host_free)


RESIDENT_BUDGET_GIB = 1 << 20  # a budget no run reaches: the plan with every component on the GPU at once
MIN_BUDGET_GIB = 2.0  # --memory-budget's minimum


def fitted_budget(family, settings, footprint=None) -> tuple[float, float, str] | None:
    """(budget GiB, GiB the whole pipeline needs at once, where the free memory was read) where a family that plans
    budgets runs on one CUDA GPU, outside CUDA graphs, and its pipeline held whole would not fit in what the GPU has
    free now; the budget is that free memory, in quarters of a GiB. None otherwise: the run places nothing."""
    from ltxbench.configurations import CUDA_GRAPH_MODES
    from ltxbench.memory.fit import available
    from ltxbench.memory.plan import GIB, plan_memory

    if (not getattr(family, "memory_stacks", None) or not str(settings.device).startswith("cuda")
            or settings.gpus > 1 or settings.compile_mode in CUDA_GRAPH_MODES):
        return None
    free, where = available(settings.device)
    if free is None:
        return None
    needed = plan_memory(RESIDENT_BUDGET_GIB, (footprint or (lambda: _footprint(family, settings)))()).gpu_bytes
    if needed <= free:
        return None
    budget = int(4 * free / GIB) / 4
    if budget < MIN_BUDGET_GIB:
        from ltxbench.errors import EnvironmentProblem

        raise EnvironmentProblem(f"{settings.model} needs about {needed / GIB:.1f} GiB of GPU memory at once and "
                                 f"{where}, under the {MIN_BUDGET_GIB:g} GiB a planned run needs",
                                 hint="free the GPU (other processes), or use a GPU with more memory")
    return budget, needed / GIB, where


def build(family, settings, plan):
    """family.build(settings); with a plan, built on the host, then placed: what the plan holds on the GPU moved
    there, the streamers installed."""
    if plan is None:
        return family.build(settings)
    from ltxbench.memory.apply import Placement

    on_the_gpu = _random_on_the_gpu(settings, plan)
    if on_the_gpu:
        pipe = family.build(settings)
        pipe.to("cpu")
        _release_cached(settings.device)
    else:
        pipe = family.build(dataclasses.replace(settings, device="cpu"))
    placement = Placement(pipe, plan, family, settings.device)
    if settings.weights == "random":
        placement.random_weights_drawn_on = "gpu" if on_the_gpu else "host"
    placement.place()
    placement.install()
    return pipe


BUILD_MARGIN = 2 * 2**30  # beside the weights: the CUDA context and the allocator's rounding


def _random_on_the_gpu(settings, plan) -> bool:
    """Random weights are made on the GPU, then moved to the host, where the whole pipeline fits in the GPU's free
    memory now (the budget is the run's, not the build's): torch draws random numbers on the host from one
    generator, on one core (minutes for LTX-2's 31 B parameters), on the GPU in seconds, and from the same seed
    they are the weights of the run without a budget. Real weights load on the host."""
    from ltxbench.memory.fit import available

    if settings.weights != "random" or not str(settings.device).startswith("cuda"):
        return False
    free, _ = available(settings.device)
    return free is not None and plan.built_bytes + BUILD_MARGIN <= free


def _release_cached(device) -> None:
    """What the build left in the allocator's cache given back; the build's peak is not the run's."""
    import torch

    from ltxbench.bench.out_of_memory import release

    device = torch.device(device)
    release(device)
    torch.cuda.reset_peak_memory_stats(device)
