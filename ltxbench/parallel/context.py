"""The process mesh of a parallel run and diffusers' context parallelism on it, removable.

Mesh: (cfg, ring, ulysses), one process per GPU. The guidance ranks of one token shard form the `cfg` groups; the
ranks that share one guidance half form the context-parallel group (ring or ulysses). Built once per process (its
groups are collective calls of every rank) and kept for every configuration of a run.

Context parallelism is diffusers': its ContextParallelConfig on that mesh, `enable_parallelism` with the family's
plan below the root (RoPE's output split, proj_out's gather; the root's inputs are split.SplitHook's), which routes
every attention that keeps its processor's `_parallel_config` through Ulysses or ring attention. Attentions whose
keys and values every rank holds whole (the prompt: it is not split) run locally instead: their processors get no
parallel config, so they need no communication, and with it our cross-attention kernel stays in use.
"""

from __future__ import annotations

import functools

import torch

MESH_DIMS = ("cfg", "ring", "ulysses")


@functools.cache
def mesh(device_type: str, cfg_degree: int, ring_degree: int, ulysses_degree: int):
    """The run's device mesh (one per process and shape)."""
    from torch.distributed.device_mesh import init_device_mesh

    return init_device_mesh(device_type, (cfg_degree, ring_degree, ulysses_degree), mesh_dim_names=MESH_DIMS)


def degrees(split: str, cfg_degree: int, cp_degree: int) -> tuple[int, int, int]:
    """(cfg, ring, ulysses) degrees of a split."""
    ring = cp_degree if split in ("ring", "cfg+ring") else 1
    return cfg_degree, ring, cp_degree // ring


def context_config(device_mesh, ring_degree: int, ulysses_degree: int, uneven: bool):
    """diffusers' ContextParallelConfig on our mesh; uneven: the token count does not divide by the degree, so the
    "anything" variant of the split (balanced shards, sizes exchanged) instead of refusing the shape."""
    from diffusers import ContextParallelConfig

    ring, ulysses = ring_degree > 1, ulysses_degree > 1
    return ContextParallelConfig(ring_degree=ring_degree, ulysses_degree=ulysses_degree, mesh=device_mesh,
                                 ulysses_anything=uneven and ulysses, ring_anything=uneven and ring)


def enable(transformer, config, plan: dict, local_attentions) -> None:
    """Context parallelism on `transformer` with `plan` (diffusers' format, no root entry); the attentions in
    `local_attentions` (modules) run without it."""
    if config.ring_degree > 1:
        _ring_backend(transformer, local_attentions)
    if torch.accelerator.device_count():
        transformer.enable_parallelism(config=config, cp_plan=plan)
    else:
        _enable_on_cpu(transformer, config, plan)
    for attention in local_attentions:
        if hasattr(attention.processor, "_parallel_config"):
            attention.processor._parallel_config = None


RING_BACKEND = "_native_cudnn"  # ring attention merges partial results by their log-sum-exp, which SDPA's
# default (native) dispatch does not return; torch's cuDNN attention does (bf16 / fp16, on a GPU)
RING_BACKEND_SET = "_ltxbench_ring_backend"  # marks a processor whose RING_BACKEND `enable` set (disable undoes it)


def chosen_backend(processor):
    """The processor's attention backend, except RING_BACKEND where `enable` set it for diffusers' ring attention:
    None then (our ring attention runs one attention over all keys, which needs no log-sum-exp)."""
    return None if getattr(processor, RING_BACKEND_SET, False) else getattr(processor, "_attention_backend", None)


def _ring_backend(transformer, local_attentions) -> None:
    """The attentions that ring attention serves get RING_BACKEND where none is chosen (undone by disable)."""
    from ltxbench.errors import UsageError

    if not torch.cuda.is_available():
        raise UsageError("--parallel ring / cfg+ring need torch's cuDNN attention (it returns the log-sum-exp that "
                         "diffusers' ring attention merges by), which runs on a GPU",
                         hint="use --parallel ulysses / cfg+ulysses")
    local = {id(a) for a in local_attentions}
    for module in _attentions(transformer):
        if id(module) not in local and getattr(module.processor, "_attention_backend", "") is None:
            module.processor._attention_backend = RING_BACKEND
            setattr(module.processor, RING_BACKEND_SET, True)


def _attentions(transformer):
    from diffusers.models.attention import AttentionModuleMixin
    from diffusers.models.attention_processor import Attention

    return [m for m in transformer.modules() if isinstance(m, Attention | AttentionModuleMixin)
            and hasattr(m.processor, "_parallel_config")]


def _enable_on_cpu(transformer, config, plan) -> None:
    """enable_parallelism's steps without its device choice: diffusers 0.42.1 takes the device as rank modulo the
    accelerator count, which is zero on a host without GPUs (the gloo tests)."""
    from diffusers.hooks.context_parallel import apply_context_parallel
    from diffusers.models._modeling_parallel import ParallelConfig

    parallel = ParallelConfig(context_parallel_config=config)
    parallel.setup(torch.distributed.get_rank(), torch.distributed.get_world_size(), torch.device("cpu"),
                   mesh=config.mesh)
    transformer._parallel_config = parallel
    for module in _attentions(transformer):
        module.processor._parallel_config = parallel
    apply_context_parallel(transformer, config, plan)


def disable(transformer, plan: dict) -> None:
    """Undo `enable`: the hooks removed (and what they leave on the instances), every processor without a parallel
    config (as enable_parallelism, which refuses a model that has one, found them), the model's parallel config
    cleared so that it can be enabled again."""
    from diffusers.hooks.context_parallel import remove_context_parallel

    remove_context_parallel(transformer, plan)
    for name in plan:
        unwrap(transformer.get_submodule(name) if name else transformer)
    for module in _attentions(transformer):
        module.processor._parallel_config = None
        if vars(module.processor).pop(RING_BACKEND_SET, False):
            module.processor._attention_backend = None
    transformer._parallel_config = None


class ContextSwitch:
    """Context parallelism turned off and on again between transformer calls (the `hybrid` split: a guidance pair
    split by batch runs whole-sequence on each rank, a batch-1 pass through Ulysses). Off: every attention's processor
    without its parallel config, and diffusers' split and gather hooks below the root passing their values through;
    on: as `enable` left them. Set before each call, never in the middle of one."""

    def __init__(self, transformer):
        from diffusers.hooks.context_parallel import ContextParallelGatherHook, ContextParallelSplitHook

        self.processors = [(m.processor, m.processor._parallel_config) for m in _attentions(transformer)
                           if m.processor._parallel_config is not None]
        self.hooks = [hook for m in transformer.modules()
                      for hook in getattr(vars(m).get("_diffusers_hook"), "hooks", {}).values()
                      if isinstance(hook, ContextParallelSplitHook | ContextParallelGatherHook)]
        self.active = True

    def set(self, active: bool) -> None:
        if active == self.active:
            return
        for processor, config in self.processors:
            processor._parallel_config = config if active else None
        for hook in self.hooks:  # the registry calls the bound methods it keeps in fn_ref
            hook.fn_ref.pre_forward = hook.pre_forward if active else _through
            hook.fn_ref.post_forward = hook.post_forward if active else _output_through
        self.active = active


def _through(module, *args, **kwargs):
    return args, kwargs


def _output_through(module, output):
    return output


def unwrap(module) -> None:
    """What diffusers' hook registry leaves on a module once its last hook is removed: the registry, and the bound
    forward it put back on the instance (which would hide a forward patched on the class later)."""
    own = vars(module)
    registry = own.get("_diffusers_hook")
    if registry is None or registry.hooks:
        return
    forward = own.get("forward")
    if forward is None or getattr(forward, "__self__", None) is module:
        own.pop("forward", None)
    own.pop("_diffusers_hook", None)

