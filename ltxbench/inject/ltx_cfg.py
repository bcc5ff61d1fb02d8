"""Classifier-free guidance's two identical halves: block 0's attn1 computed once for both.

diffusers' LTX pipelines (text-, image-to-video, condition) call the transformer with `torch.cat([latents] * 2)` and
`t.expand(B)`: the unconditional and the conditional half are the same sample at the same timestep, and they differ
only through the prompt, which enters at attn2. So up to block 0's attn1 and its gated residual both halves compute
the same numbers: proj_in, norm1 + modulation, the q/k/v GEMM, q/k norm + RoPE, the attention and the out-projection.
Computing them on one half and repeating the result is the same math; what goes is half of that work (LTX-2B, 161
frames: ~1.7 ms of a ~158 ms H100 step by the profile's per-block kernel times, most of it attention; an estimate).

Nothing structural tells a model forward that its batch is two copies, so the patched model's `__call__`
(ltx_step.step_call) compares the halves of its inputs (hidden states, timestep, video coordinates) on the device
before each step. The comparison returns to the host (one synchronization per step, on ~4 MB at 161 frames), outside
any compiled graph; the compiled forward specializes on the answer. Only the chained model forward applies it.
"""

from __future__ import annotations

import torch

PAIRED_ATTR = "_ltxbench_pair_cfg_halves"  # on the patched LTX model: True where step_call checks for the halves


def _halves_equal(tensor, batch: int) -> bool:
    if tensor is None or (isinstance(tensor, torch.Tensor) and (tensor.ndim == 0 or tensor.size(0) == 1)):
        return True  # absent, or one value for the whole batch
    if not isinstance(tensor, torch.Tensor) or tensor.size(0) != batch:
        return False
    if tensor.stride(0) == 0:  # an expanded tensor (the pipeline's t.expand(B)): equal without reading it
        return True
    half = batch // 2
    return torch.equal(tensor[:half], tensor[half:])


def identical_halves(hidden_states, timestep, video_coords=None) -> bool:
    """True when the batch is two copies of the same samples: the first half of each input equals the second."""
    if not isinstance(hidden_states, torch.Tensor) or hidden_states.ndim == 0:
        return False
    batch = hidden_states.size(0)
    if batch < 2 or batch % 2:
        return False
    return all(_halves_equal(t, batch) for t in (hidden_states, timestep, video_coords))


def first_half(values, batch: int):
    """The first half along the batch of every tensor in `values` that has the batch as its leading dim (RoPE's
    grid or cos/sin; a modulation tensor); the rest (RoPE's 1-D frequencies) as it is."""
    half = batch // 2
    return tuple(v[:half] if isinstance(v, torch.Tensor) and v.ndim >= 2 and v.size(0) == batch else v
                 for v in values)
