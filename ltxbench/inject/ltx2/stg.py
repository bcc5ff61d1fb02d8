"""The spatio-temporal-guidance pass answered from the guidance pair's positive half, where it cannot differ from it.

LTX2Pipeline's default guidance runs three transformer calls per step: the classifier-free-guidance pair (batch 2:
negative, positive), the STG pass (the positive half again, with `spatio_temporal_guidance_blocks`) and the
modality-isolated pass. STG changes a block only through perturbed attention (`perturbed_attn`, LTX-2.3's blocks);
the released LTX-2.0 has none, so its STG pass recomputes the positive half of the pair: a quarter of the step's
work, whose only difference from that half is the rounding of a batch of 1 instead of 2 (which the guidance then
multiplies by stg_scale). PairMemo keeps the pair's inputs and outputs until the next call and, when that call is
the STG pass of the same inputs, returns the pair's positive half instead of computing it again.

Served only when all of this holds, else the call runs: the call comes right after the pair, inside one generation
(nothing kept across generations), without autograd; no diffusers cache hook (inject.decides_per_call) on the
transformer, which must see the STG pass in its own context; every block the call lists for STG (and so every block)
has no perturbed attention; the arguments are the pair's but for the STG ones, every tensor equal in value to the pair's
positive half (one device comparison, read once: a synchronization per step); no parameter of the transformer, and
none of the pair's input and output tensors, changed version since the pair (inference tensors, which have no version,
are never kept).
"""

from __future__ import annotations

import torch

from ltxbench.inject import decides_per_call, original_class, parameter_versions
from ltxbench.inject.ltx2.text_kv import CACHE_ATTR as TEXT_CACHE_ATTR

MEMO_ATTR = "_ltxbench_stg_memo"  # on the patched transformer: its PairMemo
STG_RULE = ("pipeline: the STG pass answered from the guidance pair's positive half where no block has perturbed "
            "attention (LTX-2.0: the same inputs, the same math)")
STG_ARGS = ("spatio_temporal_guidance_blocks", "perturbation_mask")



def _tensors(kwargs: dict, output) -> list:
    outputs = output if isinstance(output, tuple) else tuple(output.values())
    return [t for t in (*kwargs.values(), *outputs) if torch.is_tensor(t)]


def _positive_half(value):
    return value.chunk(2)[1] if torch.is_tensor(value) and value.dim() else value


class PairMemo:
    """The last guidance pair's (kwargs, output, parameter versions), kept until the next transformer call."""

    def __init__(self):
        self.generations = 0  # open generation scopes: the memo answers only inside one
        self.pairs = self.served = 0
        self.last = None
        # the transformer calls of the open generation, and the indices of those answered from a pair; at its end
        # `answered` keeps them (the calls whose work was not done: bench e2e leaves their FLOPs out of the rates)
        self.calls, self.answering, self.answered = 0, [], ()

    def clear(self) -> None:
        self.last = None
        if self.calls:
            self.answered = tuple(self.answering)
        self.calls, self.answering = 0, []

    def remember(self, module, kwargs: dict, output) -> None:
        """Keep a guidance pair's call (even batch, no STG, both modalities); forget anything else."""
        self.last = None
        hidden = kwargs.get("hidden_states")
        if (self.generations and torch.is_tensor(hidden) and hidden.size(0) % 2 == 0
                and not kwargs.get("spatio_temporal_guidance_blocks") and kwargs.get("perturbation_mask") is None
                and not kwargs.get("isolate_modalities", False)):
            tensors = _tensors(kwargs, output)
            if any(t.is_inference() for t in tensors):  # no version counter to see an in-place write with
                return
            # the versions of the pair's inputs and outputs: written in place before the STG pass, they no longer
            # hold what the answer was computed from, or is
            self.last = (kwargs, output, parameter_versions(module), [t._version for t in tensors])
            self.pairs += 1

    def answer(self, module, kwargs: dict):
        """The pair's positive half as this call's output, or None (run it)."""
        last, self.last = self.last, None
        if last is None or not self.generations or not kwargs.get("spatio_temporal_guidance_blocks"):
            return None
        pair_kwargs, output, versions, tensor_versions = last
        if [t._version for t in _tensors(pair_kwargs, output)] != tensor_versions:
            return None
        if any(getattr(b, "perturbed_attn", False) for b in module.transformer_blocks) or decides_per_call(module):
            return None
        if set(kwargs) - set(STG_ARGS) != set(pair_kwargs) - set(STG_ARGS):
            return None
        checks = []
        for name, value in kwargs.items():
            if name in STG_ARGS:
                continue
            expected = _positive_half(pair_kwargs[name])
            if torch.is_tensor(value) != torch.is_tensor(expected):
                return None
            if not torch.is_tensor(value):
                if value != expected:
                    return None
                continue
            if value.shape != expected.shape or value.dtype != expected.dtype or value.device != expected.device:
                return None
            checks.append((value == expected).all())
        if parameter_versions(module) != versions:
            return None
        if checks and not torch.stack([c.to(checks[0].device) for c in checks]).all().item():  # one synchronization
            return None
        self.served += 1
        return _half_output(output)


def _half_output(output):
    if isinstance(output, tuple):
        return tuple(_positive_half(o) for o in output)
    return type(output)(**{k: _positive_half(v) for k, v in output.items()})


def transformer_call(self, *args, **kwargs):
    """The transformer's `__call__`: its all-ones text masks left out by the generation's text cache (text_kv.py,
    where there is one), then through its PairMemo (kwargs-only calls under no_grad; others run as they are)."""
    cache = vars(self).get(TEXT_CACHE_ATTR)
    if cache is not None and not args and not torch.is_grad_enabled():
        kwargs = cache.without_ones_masks(kwargs)
    memo = vars(self).get(MEMO_ATTR)
    if memo is None or args or torch.is_grad_enabled() or not memo.generations:
        return original_class(self).__call__(self, *args, **kwargs)
    index, memo.calls = memo.calls, memo.calls + 1
    output = memo.answer(self, kwargs)
    if output is not None:
        memo.answering.append(index)
        return output
    output = original_class(self).__call__(self, **kwargs)
    memo.remember(self, kwargs, output)
    return output
