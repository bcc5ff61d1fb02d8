"""--memory-budget in the commands: the plan made and printed before anything is built, then the pipeline built in
host memory and placed by it (ltxbench.memory). Only the standard library at top level."""

from __future__ import annotations

import dataclasses


def planned(family, settings, log):
    """The run's MemoryPlan (its lines given to `log`), or None without --memory-budget. Exit 4 where the budget or
    the host cannot hold the run."""
    if settings.memory_budget_gib is None:
        return None
    plan = plan_for(family, settings)
    for line in plan.lines():
        log(line)
    return plan


def plan_for(family, settings):
    """The plan of `settings.memory_budget_gib` for this run (the components built on the meta device from the model's
    configs; the host's available memory read now, before the pipeline is built there). EnvironmentProblem (exit 4)
    where it cannot be met."""
    from ltxbench.memory.fit import available
    from ltxbench.memory.plan import plan_memory
    from ltxbench.memory.sizes import footprint
    from ltxbench.models.family import torch_dtype

    configs = family.builder.component_configs(settings.model)
    parts = family.builder.build_components(configs, "meta", torch_dtype(settings.dtype))
    host_free, _ = available("cpu")
    return plan_memory(settings.memory_budget_gib, footprint(family, settings, parts), host_free)


def build(family, settings, plan):
    """family.build(settings); with a plan, built on the host, then placed: what the plan holds on the GPU moved
    there, the streamers installed."""
    if plan is None:
        return family.build(settings)
    from ltxbench.memory.apply import Placement

    if _random_on_the_gpu(settings, plan):
        pipe = family.build(settings)
        pipe.to("cpu")
        _release_cached(settings.device)
    else:
        pipe = family.build(dataclasses.replace(settings, device="cpu"))
    placement = Placement(pipe, plan, family, settings.device)
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
