"""What an LTX transformer step computes before its blocks, computed before the (compiled) forward runs.

StepInputs is everything the patched model forward needs ahead of its block loop: RoPE, attn2's mask, proj_in, the
timestep embedding, every block's modulation (scale_shift_table + temb, one stack for all blocks), the final
modulation, attn2's prompt side, and whether the batch is classifier-free guidance's two identical halves (cfg.py).
The patched model's `__call__` (step_call) builds it eagerly and passes it to the
forward as `step`; under nn.Module.compile() it arrives as graph inputs. Why: built inside the graph, inductor
recomputed the small pointwise ones (modulation slices, the mask, the RoPE freqs) in a kernel of their own at their
uses (~60 kernels of ~1 us per 49-frame step, each with its launch gap; H100 optimized+compile 40.62 / 40.51 ->
40.11 ms, docs/tuning.md#step-level-work); graph inputs are realized once. The prompt side comes from the
CrossKVCache (cross_kv.py, once per generation) when it applies. Traced from `__call__` (torch.compile(model),
dynamo.explain) the forward builds StepInputs itself.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from ltxbench.inject import PLACES_WEIGHTS
from ltxbench.inject.ltx.attention import attn2_mask
from ltxbench.inject.ltx.cfg import PAIRED_ATTR, Answer, compare_halves
from ltxbench.inject.ltx.cross_kv import CACHE_ATTR

FORWARD_ARGS = ("hidden_states", "encoder_hidden_states", "timestep", "encoder_attention_mask", "num_frames", "height",
                "width", "rope_interpolation_scale", "video_coords")  # LTXVideoTransformer3DModel.forward's, in order


class StepInputs(NamedTuple):
    hidden_states: torch.Tensor   # after proj_in
    rope: tuple                   # (grid, freqs) from our rope, or diffusers' (cos, sin)
    mask: torch.Tensor | None     # attn2's additive mask as the processors take it
    adas: torch.Tensor | None     # (blocks, B, 1, 6, D): every block's modulation; None when temb is per token
    temb: torch.Tensor            # (B, 1|S, 6D)
    final: torch.Tensor           # (B, 1|S, 2, D): norm_out's shift and scale
    prompt: torch.Tensor          # the caption-projected prompt
    block_kv: list                # per block: attn2's (key, value) from the cache, or None
    paired: bool = False          # the batch is two identical halves: block 0's attn1 runs on one (cfg.py)


def block_modulation(block, temb, batch_size):
    """(shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp), each (B, 1|S, D), as the block computes."""
    table = block.scale_shift_table
    return (table[None, None].to(temb.device) + temb.reshape(batch_size, temb.size(1), table.shape[0], -1)).unbind(2)


def projected_prompt(model, encoder_hidden_states, batch_size):
    """caption_projection of the prompt, shaped (B, L, D) as the original forward shapes it."""
    prompt = model.caption_projection(encoder_hidden_states)
    return prompt.view(batch_size, -1, prompt.size(-1))


def modulation_of(step: StepInputs, blocks, index: int):
    """Block `index`'s six modulation tensors: views of the stacked ones, or computed from temb (per token)."""
    if step.adas is not None:
        return step.adas[index].unbind(2)
    return block_modulation(blocks[index], step.temb, step.hidden_states.size(0))


def step_inputs(model, hidden_states, encoder_hidden_states, timestep, encoder_attention_mask, num_frames=None,
                height=None, width=None, rope_interpolation_scale=None, video_coords=None,
                prompt_entry=None, paired: bool = False) -> StepInputs:
    """The original forward's code up to its block loop, with the modulation of every block stacked (per-sample
    temb: N x B x 6D values, 1.4 MB for LTX-2B with CFG; per token it would be N times (B, S, 6D), so not then).
    prompt_entry: (projected prompt, per-block (key, value)) from the cache, else computed here. paired: the caller
    runs the step on the batch's identical halves (cfg.HalvesCheck)."""
    rope = model.rope(hidden_states, num_frames, height, width, rope_interpolation_scale, video_coords)
    if encoder_attention_mask is not None and encoder_attention_mask.ndim == 2:
        encoder_attention_mask = ((1 - encoder_attention_mask.to(hidden_states.dtype)) * -10000.0).unsqueeze(1)
    batch_size = hidden_states.size(0)
    hidden_states = model.proj_in(hidden_states)
    temb, embedded_timestep = model.time_embed(timestep.flatten(), batch_size=batch_size,
                                               hidden_dtype=hidden_states.dtype)
    temb = temb.view(batch_size, -1, temb.size(-1))
    embedded_timestep = embedded_timestep.view(batch_size, -1, embedded_timestep.size(-1))
    blocks = model.transformer_blocks
    if prompt_entry is None:
        prompt = projected_prompt(model, encoder_hidden_states, batch_size)
        block_kv = [None] * len(blocks)
    else:
        prompt, block_kv = prompt_entry
    adas = None
    if temb.size(1) == 1:
        tables = torch.stack([block.scale_shift_table for block in blocks]).to(temb.device)  # (N, 6, D)
        adas = tables[:, None, None] + temb.reshape(1, batch_size, 1, tables.shape[1], -1)
    final = model.scale_shift_table[None, None] + embedded_timestep[:, :, None]
    return StepInputs(hidden_states, rope, attn2_mask(blocks, encoder_attention_mask, prompt), adas, temb, final,
                      prompt, block_kv, paired)


def step_call(self, *args, **kwargs):
    """`__call__` of the patched LTX model: StepInputs built here, eagerly, and passed to forward as `step`. Not inside
    a trace, not with autograd, and not where a forward pre-hook (but a placement's), a hook's forward wrapper
    (accelerate's offload moves the weights to the GPU inside it; a parallel run's split hook is taken over: the call
    is split here) or a LoRA scale (attention_kwargs["scale"], applied by the forward's decorator) could change what
    the step computes: there the forward builds it."""
    from torch.nn.modules import module as nn_module

    from ltxbench.parallel.split import split_hook_of

    parallel = split_hook_of(self)  # a parallel run's split of the call (the one wrapper taken over here)
    # a --memory-budget placement's pre-hook brings the weights to the GPU and leaves the arguments alone: it runs
    # here first, before the step reads the weights (attn2's keys and values), and again, a no-op, in the call
    placing = all(getattr(hook, PLACES_WEIGHTS, False) for hook in self._forward_pre_hooks.values())
    if (torch.compiler.is_compiling() or "step" in kwargs or len(args) > len(FORWARD_ARGS)
            or torch.is_grad_enabled() or not placing or nn_module._global_forward_pre_hooks
            or ("forward" in vars(self) and parallel is None) or "scale" in (kwargs.get("attention_kwargs") or {})):
        return torch.nn.Module.__call__(self, *args, **kwargs)
    for hook in self._forward_pre_hooks.values():
        hook(self, args)
    bound = dict(zip(FORWARD_ARGS, args, strict=False))  # len(args) <= len(FORWARD_ARGS), checked above
    bound.update((name, kwargs.pop(name)) for name in FORWARD_ARGS if name in kwargs)
    gather = False
    if parallel is not None:  # this rank's part of the batch / tokens; the hook lets the call with `step` through
        bound, gather = parallel.split(bound)
    cache = vars(self).get(CACHE_ATTR)
    entry = cache.get(self, bound.get("encoder_hidden_states")) if cache is not None else None
    check = vars(self).get(PAIRED_ATTR)  # cfg.HalvesCheck: the step runs by the last step's answer
    answer = check and Answer(compare_halves(bound.get("hidden_states"), bound.get("timestep"),
                                             bound.get("video_coords")))
    step = step_inputs(self, **bound, prompt_entry=entry, paired=bool(check) and check.guess(answer))
    output = torch.nn.Module.__call__(self, **bound, **kwargs, step=step)
    if check and check.settle(answer, step.paired):  # ran paired on halves that differ: again, on the whole batch
        output = torch.nn.Module.__call__(self, **bound, **kwargs, step=step._replace(paired=False))
    return parallel.gather(output) if gather else output
