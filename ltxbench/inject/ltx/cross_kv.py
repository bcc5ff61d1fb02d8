"""LTX-Video's cross-attention keys and values, computed once per generation instead of once per step.

attn2 attends to the prompt: its keys and values (caption_projection, then every block's to_k/to_v GEMM and
norm_k) depend only on the prompt embeddings and the weights, and diffusers' LTX pipelines pass the same
prompt_embeds tensor to every step (built once, before the loop). The patched model's `__call__` (step.step_call)
takes them from here into the step's inputs; the forward then skips caption_projection and, per block, the k/v GEMM
and norm_k. The same ops on the same inputs, so the step's result does not change; what goes is their time.

An entry lives for one generation at most: the cache answers only inside `ltx.generation(model)`, which a patched
pipeline's call enters (apply_kernels given the pipeline) and which clears the cache on entry and on exit, exceptions
included. Outside one (the transformer called on its own) every step computes its keys and values, as the model does.
So weights changed between generations in a way no check can see (PEFT's `fuse_lora` writes `weight.data`, which
bumps no version counter) always meet a fresh entry. Within a generation an entry is also dropped when a tensor it
came from is no longer the same object at the same address and version: the prompt embeddings, caption_projection's
parameters, each attn2's to_k/to_v/norm_k parameters; and while those layers are not plain nn.Linear / nn.RMSNorm (a
LoRA wrapper changes the function, not the weights) or an attn2 does not run our processor, nothing is cached; nor
while the blocks stream through shared slots (ltxbench.memory.stream): the build reads every block's weights before
the blocks run, when most are not loaded. The entry keeps the embeddings alive, so a new tensor cannot take over
their identity. It holds the projected prompt and every block's k/v (2B, CFG, 128 tokens: 3 MB per block).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from ltxbench.inject import streamer_of

CACHE_ATTR = "_ltxbench_cross_kv_cache"  # on the patched LTX model: its CrossKVCache


class CrossKVCache:
    """build(model, encoder_hidden_states) -> (projected prompt, [(key, value) per block]), kept while its sources
    last; sources(model, encoder_hidden_states) -> the tensors an entry depends on, or None (do not cache)."""

    def __init__(self, build: Callable, sources: Callable):
        self.build, self.sources = build, sources
        self.builds = self.hits = 0
        self.generations = 0  # open ltx.generation scopes: the cache answers only inside one
        self.clear()

    def clear(self) -> None:
        self.entry, self._from, self._stamp = None, (), ()

    def get(self, model, encoder_hidden_states):
        """The entry for this call (built if its sources changed), or None when this call must compute."""
        sources = self.sources(model, encoder_hidden_states) if self.generations else None
        if sources is None:
            self.clear()
            return None
        stamp = tuple((t.data_ptr(), t._version) for t in sources)
        same = len(sources) == len(self._from) and all(a is b for a, b in zip(sources, self._from, strict=True))
        if self.entry is not None and same and stamp == self._stamp:
            self.hits += 1
            return self.entry
        self.clear()  # the old entry goes before the new one is built
        self.entry, self._from, self._stamp = self.build(model, encoder_hidden_states), tuple(sources), stamp
        self.builds += 1
        return self.entry


def cache_sources(model, encoder_hidden_states, processor_type) -> list | None:
    """The tensors attn2's keys and values are computed from, or None when they must not be cached (see above;
    the caller, step.step_call, has already ruled out autograd, pre-hooks and hook wrappers)."""
    if not isinstance(encoder_hidden_states, torch.Tensor) or encoder_hidden_states.is_inference():
        return None  # inference tensors have no version counter: an in-place change would go unseen
    if streamer_of(model.transformer_blocks) is not None:
        return None  # blocks streamed (--memory-budget): the build would read weights not loaded yet
    projection = model.caption_projection
    linears = [getattr(projection, "linear_1", None), getattr(projection, "linear_2", None)]
    norms = []
    for block in model.transformer_blocks:
        attn = block.attn2
        if not isinstance(attn.processor, processor_type):
            return None
        linears += [attn.to_k, attn.to_v]
        norms.append(attn.norm_k)
    if any(type(m) is not torch.nn.Linear for m in linears) or any(type(m) is not torch.nn.RMSNorm for m in norms):
        return None
    return [encoder_hidden_states, *(p for m in (*linears, *norms) for p in m._parameters.values() if p is not None)]
