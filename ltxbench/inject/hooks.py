"""Hooks on a model that a patch must honour: diffusers hooks that decide per call (a cache: calls must run one by one,
as the pipeline makes them), and any hook on a module that a fused path reads instead of calling (it must see the module
run). ltxbench's own weight placement hooks are marked and exempt."""

from __future__ import annotations

# diffusers hooks that move, cast or split the weights and tokens of a call, whatever its batch and whether it runs:
# a call may be batched with another or answered from one under them. Any other (First Block Cache, MagCache,
# FasterCache, TaylorSeer, ...: caches deciding per call from its values, in a context per guidance branch) must see
# every call the pipeline makes, as it makes it.
BATCH_BLIND_HOOKS = ("group_offloading", "layer_execution_tracker", "lazy_prefetch_group_offloading",
                     "layerwise_casting", "peft_autocast_disable")
BATCH_BLIND_PREFIXES = ("cp_input---", "cp_output---")  # diffusers' context parallelism


def decides_per_call(module) -> bool:
    """A diffusers hook on `module` or any of its submodules (a cache's are on the blocks) other than our guidance
    split (parallel/split.py, which divides a batch over the guidance ranks and gathers it back) and those blind to
    the batch (BATCH_BLIND_HOOKS): calls must then run one by one, as the pipeline makes them."""
    from ltxbench.parallel.split import HOOK_NAME

    for sub in module.modules():
        registry = vars(sub).get("_diffusers_hook")
        for name in getattr(registry, "hooks", None) or {}:
            if name != HOOK_NAME and name not in BATCH_BLIND_HOOKS and not name.startswith(BATCH_BLIND_PREFIXES):
                return True
    return False


# Set (True) on the forward hooks of ltxbench's own weight placement (--memory-budget: a component brought to its
# phase's device, a streamed block loaded): they move weights and change no argument or output, so a patched forward
# that calls a block's layers itself may run their work itself (or the placement's, idempotent, first).
PLACES_WEIGHTS = "ltxbench_places_weights"


def observed(module) -> bool:
    """A hook on `module` that must see it run: any forward (pre-)hook but our placement's, or a forward set on the
    instance (an offload's or diffusers' hook registry's wrapper)."""
    hooks = (*module._forward_pre_hooks.values(), *module._forward_hooks.values())
    return "forward" in vars(module) or not all(getattr(h, PLACES_WEIGHTS, False) for h in hooks)


def observed_inside(module) -> bool:
    """A hook that must see its module run (observed) on any submodule of `module`: a fused block that reads its
    layers' weights without calling them runs its original forward then (a probe; diffusers' pyramid attention
    broadcast or FasterCache on the attention modules)."""
    return any(observed(sub) for sub in module.modules() if sub is not module)
