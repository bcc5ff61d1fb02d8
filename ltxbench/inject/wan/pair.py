"""Wan's guidance pair as one transformer call of batch 2.

WanPipeline runs classifier-free guidance as two batch-1 calls per step on the same latents and timestep: the
conditional one (the prompt, under `cache_context("cond")`), then the unconditional one (the negative prompt). The
pair rule makes the first of them one call of batch 2, prompt and negative prompt stacked, returns its first half
and keeps the second for the call that follows; that call, when it is the unconditional one of the same step, is
answered from it without running the model. Two batch-1 calls become one of batch 2: the same work, fewer and larger
kernels. Every op computes a sample on its own, but a library GEMM may pick another algorithm for twice the rows, so
the unconditional half may round differently from a batch-1 call (docs/injection.md#wan-ltxbenchinjectwan).

The negative prompt's embeddings come from the pipeline's own `encode_prompt` inside the same generation (a call of
the patched pipeline). The pair runs only where all of this holds, else each call runs as it is: no autograd; the
pipeline's negative embeddings are a tensor of the conditional call's shape, dtype and device (the pipeline's cast
to the transformer's dtype then leaves the very tensor it passes); no diffusers hook on the transformer or its blocks
but our guidance split (the split gives each of 2 GPUs one sample of the pair) and those blind to the batch (offload,
casting, context parallelism): a cache's would see one call of batch 2;
the call passes keyword arguments only. Wan 2.1 I2V's CLIP image features, the same for both calls, are stacked
with the pair. The second call is answered only when it comes right after the pair, from the same expert, with the
pair's latents and timestep (the same tensors, at the same versions), the negative embeddings themselves, the same
other arguments (the same image features, at the same version), and no parameter of the transformer changed since.
"""

from __future__ import annotations

import torch

from ltxbench.inject import decides_per_call, original_class, parameter_versions

PAIR_ATTR = "_ltxbench_wan_pair"  # on each patched expert (and the pipeline): the generation's GuidancePair
PAIRED_ARGS = ("hidden_states", "timestep", "encoder_hidden_states")  # stacked in the pair; the others the same
PAIR_RULE = ("pipeline: the guidance pair's two batch-1 calls as one call of batch 2 (the unconditional half kept "
             "for the call after)")



class GuidancePair:
    """The generation's negative prompt embeddings and the last pair's unconditional half, kept until the next
    call."""

    def __init__(self):
        self.generations = 0  # open generation scopes: the pair runs only inside one
        self.negative = None
        self.last = None
        self.missed = False  # a kept half the next call did not take: no more pairs in this generation
        self.pairs = self.served = 0

    def forget(self) -> None:
        self.negative = self.last = None
        self.missed = False

    def run_pair(self, module, kwargs: dict):
        """The conditional call's output from one call of batch 2, the unconditional half kept; None: run it."""
        self.last = None
        if self.missed:
            return None
        negative, prompt, hidden = self.negative, kwargs.get("encoder_hidden_states"), kwargs.get("hidden_states")
        timestep = kwargs.get("timestep")
        if not (torch.is_tensor(negative) and torch.is_tensor(prompt) and torch.is_tensor(hidden)
                and torch.is_tensor(timestep)) or prompt is negative:
            return None
        image = kwargs.get("encoder_hidden_states_image")
        if (negative.shape != prompt.shape or negative.dtype != prompt.dtype or negative.device != prompt.device
                or not (image is None or torch.is_tensor(image)) or kwargs.get("return_dict", True)
                or decides_per_call(module)):
            return None
        kept = (hidden, timestep, negative)
        if any(t.is_inference() for t in (*kept, *_tensors(image))):  # no version counter to see an in-place write
            return None
        batch = hidden.size(0)
        if prompt.size(0) != batch or (timestep.dim() and timestep.size(0) != batch) or (
                image is not None and image.size(0) != batch):
            return None
        paired = dict(kwargs, hidden_states=torch.cat([hidden, hidden]),
                      encoder_hidden_states=torch.cat([prompt, negative]),
                      timestep=torch.cat([timestep, timestep]) if timestep.dim() else timestep)
        if image is not None:
            paired["encoder_hidden_states_image"] = torch.cat([image, image])
        output = original_class(module).__call__(module, **paired)
        conditional, unconditional = zip(*(o.chunk(2) for o in output), strict=True)
        others = {k: v for k, v in kwargs.items() if k not in PAIRED_ARGS}
        self.last = (module, kept, _versions(*kept, *_tensors(image)), others, parameter_versions(module),
                     tuple(unconditional))
        self.pairs += 1
        return tuple(conditional)

    def answer(self, module, kwargs: dict):
        """The kept unconditional half as this call's output, or None (run it). A kept half this call cannot take
        means the pipeline's calls are not the pairs predicted (a step callback gave new negative embeddings): the
        calls left in the generation run as they come, none paired for nothing again."""
        kept = self.last is not None
        output = self._answer(module, kwargs)
        self.missed = self.missed or (kept and output is None)
        return output

    def _answer(self, module, kwargs: dict):
        last, self.last = self.last, None
        if last is None:
            return None
        pair_module, (hidden, timestep, negative), versions, others, parameters, unconditional = last
        if not (module is pair_module and kwargs.get("hidden_states") is hidden and kwargs.get("timestep") is timestep
                and kwargs.get("encoder_hidden_states") is negative):
            return None
        rest = {k: v for k, v in kwargs.items() if k not in PAIRED_ARGS}
        if rest.keys() != others.keys() or any(
                rest[k] is not others[k] and (torch.is_tensor(rest[k]) or rest[k] != others[k]) for k in rest):
            return None
        image = rest.get("encoder_hidden_states_image")
        if _versions(hidden, timestep, negative, *_tensors(image)) != versions or \
                parameter_versions(module) != parameters:
            return None
        self.served += 1
        return unconditional


def _tensors(value) -> tuple:
    return (value,) if torch.is_tensor(value) else ()


def _versions(*tensors) -> list[int]:
    return [t._version for t in tensors]


def pair_call(self, *args, **kwargs):
    """An expert's `__call__` through the generation's GuidancePair (keyword-only calls under no_grad)."""
    pair = vars(self).get(PAIR_ATTR)
    if pair is None or args or torch.is_grad_enabled() or not pair.generations:
        return original_class(self).__call__(self, *args, **kwargs)
    output = pair.answer(self, kwargs)
    if output is None:
        output = pair.run_pair(self, kwargs)
    return output if output is not None else original_class(self).__call__(self, **kwargs)


def encode_and_keep(pair: GuidancePair, encode):
    """The pipeline's encode_prompt, its negative embeddings kept for the generation's pairs."""

    def encode_prompt(*args, **kwargs):
        prompt_embeds, negative_prompt_embeds = encode(*args, **kwargs)
        # kept only where the pipeline guides (it passes do_classifier_free_guidance): else no unconditional call
        pair.negative = negative_prompt_embeds if kwargs.get("do_classifier_free_guidance") else None
        return prompt_embeds, negative_prompt_embeds

    return encode_prompt
