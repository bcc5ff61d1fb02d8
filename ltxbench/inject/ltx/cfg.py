"""Classifier-free guidance's two identical halves: block 0's attn1 computed once for both.

diffusers' LTX pipelines (text-, image-to-video, condition) call the transformer with `torch.cat([latents] * 2)` and
`t.expand(B)`: the unconditional and the conditional half are the same sample at the same timestep, and they differ
only through the prompt, which enters at attn2. So up to block 0's attn1 and its gated residual both halves compute
the same numbers: proj_in, norm1 + modulation, the q/k/v GEMM, q/k norm + RoPE, the attention and the out-projection.
Computing them on one half and repeating the result is the same math; what goes is half of that work (LTX-2B, 161
frames: ~1.7 ms of a ~158 ms H100 step by the profile's per-block kernel times, most of it attention; an estimate).

Nothing structural tells a model forward that its batch is two copies, so the patched model's `__call__`
(step.step_call) compares the halves of its inputs (hidden states, timestep, video coordinates) on the device.
Waiting for that answer before the step would drain the GPU once per step while the host then enqueues the step
(H200, 49 frames: 0.4 ms idle eager, 1.3 ms compiled, where dynamo's guards run first; docs/tuning.md#step-level-work).
So the answer is read one step late: a step runs as the previous step's answer says (the first step waits for its
own), and once it is enqueued the host reads its own answer, long since computed; where a step ran paired on halves
that turn out to differ, it runs again on the whole batch. The compiled forward specializes on the answer;
only the chained model forward applies it.
"""

from __future__ import annotations

import torch

PAIRED_ATTR = "_ltxbench_pair_cfg_halves"  # on the patched LTX model: its HalvesCheck


def _halves_equal(tensor, batch: int):
    """True / False where the structure answers, else a 0-dim bool tensor on the tensor's device."""
    if tensor is None or (isinstance(tensor, torch.Tensor) and (tensor.ndim == 0 or tensor.size(0) == 1)):
        return True  # absent, or one value for the whole batch
    if not isinstance(tensor, torch.Tensor) or tensor.size(0) != batch:
        return False
    if tensor.stride(0) == 0:  # an expanded tensor (the pipeline's t.expand(B)): equal without reading it
        return True
    half = batch // 2
    return (tensor[:half] == tensor[half:]).all()  # NaN != NaN, as torch.equal


def compare_halves(hidden_states, timestep, video_coords=None):
    """Whether the batch is two copies of the same samples (the first half of each input equals the second): a bool,
    or a 0-dim bool tensor on the inputs' device computed without waiting for it."""
    if not isinstance(hidden_states, torch.Tensor) or hidden_states.ndim == 0:
        return False
    batch = hidden_states.size(0)
    if batch < 2 or batch % 2:
        return False
    answers = [_halves_equal(t, batch) for t in (hidden_states, timestep, video_coords)]
    # an input on another device than the hidden states (a CPU timestep) answers on the host now: no copy to wait for
    answers = [bool(a) if isinstance(a, torch.Tensor) and a.device != hidden_states.device else a for a in answers]
    if any(a is False for a in answers):
        return False
    pending = [a for a in answers if a is not True]
    return True if not pending else torch.stack(pending).all()


class Answer:
    """compare_halves' answer on its way to the host: copied to pinned memory behind the comparison, so that
    asking for it later waits for the comparison only, not for the work enqueued after it."""

    def __init__(self, answer):
        self.known = not isinstance(answer, torch.Tensor)  # the inputs' structure answered: nothing to wait for
        self._value, self._event = answer, None
        if isinstance(answer, torch.Tensor) and answer.is_cuda:
            self._value = torch.empty((), dtype=torch.bool, pin_memory=True)
            self._value.copy_(answer, non_blocking=True)
            self._event = torch.cuda.Event()
            self._event.record(torch.cuda.current_stream(answer.device))  # the copy's stream: the answer's device

    def get(self) -> bool:
        if self._event is not None:
            self._event.synchronize()
        return bool(self._value)


class HalvesCheck:
    """Per patched model: the last step's answer, which the next step runs by (None before the first step)."""

    def __init__(self):
        self.last: bool | None = None

    def guess(self, answer: Answer) -> bool:
        """How to run this step: as its own answer where the structure gave it or at the first step (waited for),
        else as the last step's."""
        return answer.get() if answer.known or self.last is None else self.last

    def settle(self, answer: Answer, ran_paired: bool) -> bool:
        """This step's answer, remembered for the next one; True where the step must run again on the whole batch
        (it ran paired on halves that differ)."""
        self.last = answer.get()
        return ran_paired and not self.last


def first_half(values, batch: int):
    """The first half along the batch of every tensor in `values` that has the batch as its leading dim (RoPE's
    grid or cos/sin; a modulation tensor); the rest (RoPE's 1-D frequencies) as it is."""
    half = batch // 2
    return tuple(v[:half] if isinstance(v, torch.Tensor) and v.ndim >= 2 and v.size(0) == batch else v
                 for v in values)
