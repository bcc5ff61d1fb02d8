"""The text cross-attentions' keys and values kept for one generation (apply_kernels' first rule, ltx2/__init__.py).

attn2 / audio_attn2 keys and values depend only on the prompt (the connectors' output, built once per generation) and
the weights, yet every transformer call recomputes them: to_k, to_v and norm_k over the text tokens, in each of the 48
blocks, three calls per step with the pipeline's default guidance. TextKVCache keeps them for the generation: the same
ops on the same inputs, so the result is bit for bit the model's; what goes is their time.

An entry is reused only inside a generation and only for the same input view (address, shape, strides, dtype, version
counter) and the same to_k / to_v / norm_k parameters (the same objects, at the same address and version), while those
layers are plain nn.Linear / nn.RMSNorm; the entry keeps its input and its layers alive, so no other tensor can take
the input's address and no other parameter a parameter's identity. An address alone never names weights: blocks
streamed through one slot (ltxbench.memory.stream) share their weights' addresses, and each keeps its own entries.
"""

from __future__ import annotations

import torch

from ltxbench.inject import InjectionReport, original_class, patch_forward
from ltxbench.inject.patching import source_digest

TEXT_KV_RULE = "attn2/audio_attn2: text keys/values once per generation (exact: the same ops on the same prompt)"
# sha256 (first 16 hex digits) of LTX2AudioVideoAttnProcessor.__call__'s source in diffusers 0.42.1: the code
# TextKVProcessor.__call__ (and the fused block's attentions, block.py) reproduce. Another source is left alone.
PROCESSOR_SOURCE = "0391667b7f0a45ae"
# ... and of PixArtAlphaTextProjection.forward (caption_projection, audio_caption_projection)
PROJECTION_SOURCE = "767653bc523ffe7f"
PROJECTION_RULE = ("caption_projection/audio_caption_projection: the projected prompt once per generation (the text "
                   "keys/values' input: the same tensor for every call)")
CACHE_ATTR = "_ltxbench_text_kv_cache"  # on the patched transformer: its TextKVCache
ENTRIES_PER_LAYER = 4  # the CFG pair's prompt and the positive half (STG and modality passes): 2 in use
TEXT_MASK_RULE = ("pipeline: text masks of all ones (what LTX-2's connectors return) left out, so attn2/audio_attn2 "
                  "attend unmasked (exact: the additive bias they stand for is zero)")
MASK_ARGS = ("encoder_attention_mask", "audio_encoder_attention_mask")  # the transformer's (B, L) 0/1 text masks


class TextKVCache:
    """(key, value) of each text cross-attention per input view, kept while a generation is open."""

    def __init__(self):
        self.generations = 0  # open generation scopes: the cache answers only inside one
        self.builds = self.hits = 0
        self.entries: dict[int, list] = {}
        self.masks: dict[tuple, tuple] = {}  # a text mask view's stamp -> (all ones, the mask kept alive)
        self.mask_checks = 0

    def clear(self) -> None:
        self.entries, self.masks = {}, {}

    def without_ones_masks(self, kwargs: dict) -> dict:
        """A transformer call's kwargs with each text mask (MASK_ARGS) that is all ones left out (None): the model then
        adds no bias, where the mask would add zeros, and the attention backends take their unmasked path (faster on
        cuDNN; FlashAttention-3 takes no mask). Inside a generation only, each mask view read once there (one
        synchronization); a view written in place is read again. Anything else keeps its mask."""
        if not self.generations:
            return kwargs
        out = kwargs
        for name in MASK_ARGS:
            mask = kwargs.get(name)
            if torch.is_tensor(mask) and mask.dim() == 2 and self._all_ones(mask):
                out = dict(out) if out is kwargs else out
                out[name] = None
        return out

    def _all_ones(self, mask) -> bool:
        stamp = _stamp(mask, ())
        if stamp is None:  # under autograd, or an inference tensor (no version counter): keep the mask
            return False
        if stamp not in self.masks:
            self.mask_checks += 1
            self.masks[stamp] = (bool((mask == 1).all()), mask)  # kept alive: no other tensor takes its address
        return self.masks[stamp][0]

    def key_value(self, attn, source):
        """The layer's (key, value) of `source`: from the cache when it holds this input and these weights."""
        plain = type(attn.to_k) is type(attn.to_v) is torch.nn.Linear and type(attn.norm_k) is torch.nn.RMSNorm
        return self._kept(attn, source, (attn.to_k, attn.to_v, attn.norm_k) if plain else None,
                          lambda: text_key_value(attn, source))

    def projected(self, projection, caption):
        """caption_projection(caption), kept so that every call of the generation hands attn2 the same tensor."""
        layers = (projection.linear_1, projection.linear_2)
        plain = all(type(layer) is torch.nn.Linear for layer in layers) and type(projection.act_1).__module__ in (
            "torch.nn.modules.activation", "diffusers.models.activations")
        return self._kept(projection, caption, layers if plain else None,
                          lambda: original_class(projection).forward(projection, caption))

    def _kept(self, module, source, layers, compute):
        """compute() for (module, source), kept inside a generation while the source view and the layers' parameters
        are unchanged; computed every time where layers is None (not plain layers), under autograd or compile."""
        stamp = _stamp(source, layers) if self.generations and layers is not None else None
        if stamp is None or torch.compiler.is_compiling():
            return compute()
        kept = self.entries.setdefault(id(module), [])
        for entry_stamp, _alive, result in kept:
            if entry_stamp == stamp:
                self.hits += 1
                return result
        result = compute()
        # the source and the layers stay alive: no other tensor takes the source's address or a parameter's id
        kept.append((stamp, (source, layers), result))
        del kept[:-ENTRIES_PER_LAYER]
        self.builds += 1
        return result


def text_key_value(attn, text):
    """The text cross-attention's key (after norm_k) and value, as LTX2AudioVideoAttnProcessor computes them."""
    return attn.norm_k(attn.to_k(text)), attn.to_v(text)


def _stamp(source, layers) -> tuple | None:
    """What an entry must match: the input view (address, shape, strides, dtype, version) and every parameter
    (identity, address, version); None under autograd or for inference tensors (no version counter)."""
    if not isinstance(source, torch.Tensor) or source.is_inference() or torch.is_grad_enabled():
        return None
    params = [p for layer in layers for p in layer._parameters.values() if p is not None]
    return (source.data_ptr(), tuple(source.shape), source.stride(), source.dtype, source._version,
            *((id(p), p.data_ptr(), p._version) for p in params))


def _projection_forward(self, caption):
    """PixArtAlphaTextProjection.forward through the text cache of the model it belongs to."""
    return self._ltxbench_text_cache.projected(self, caption)


class TextKVProcessor:
    """LTX2AudioVideoAttnProcessor for a text cross-attention, its keys and values from the cache. Keeps the
    original's attention backend and parallel config (dispatch_attention_fn reads them)."""

    def __init__(self, original, cache: TextKVCache):
        self.original, self.cache = original, cache
        self._attention_backend = getattr(original, "_attention_backend", None)
        self._parallel_config = getattr(original, "_parallel_config", None)

    def __call__(self, attn, hidden_states, encoder_hidden_states=None, attention_mask=None, query_rotary_emb=None,
                 key_rotary_emb=None):
        from diffusers.models.attention_dispatch import dispatch_attention_fn

        if encoder_hidden_states is None or query_rotary_emb is not None or attn.to_gate_logits is not None:
            return self.original(attn, hidden_states, encoder_hidden_states, attention_mask, query_rotary_emb,
                                 key_rotary_emb)  # not a text cross-attention as the released model runs it
        batch_size, sequence_length, _ = encoder_hidden_states.shape
        if attention_mask is not None:
            attention_mask = attn.prepare_attention_mask(attention_mask, sequence_length, batch_size)
            attention_mask = attention_mask.view(batch_size, attn.heads, -1, attention_mask.shape[-1])
        query = attn.norm_q(attn.to_q(hidden_states))
        key, value = self.cache.key_value(attn, encoder_hidden_states)
        out = dispatch_attention_fn(query.unflatten(2, (attn.heads, -1)), key.unflatten(2, (attn.heads, -1)),
                                    value.unflatten(2, (attn.heads, -1)), attn_mask=attention_mask, dropout_p=0.0,
                                    is_causal=False, backend=self._attention_backend,
                                    parallel_config=self._parallel_config)
        out = out.flatten(2, 3).to(query.dtype)
        return attn.to_out[1](attn.to_out[0](out))


def processor_class():
    from diffusers.models.transformers.transformer_ltx2 import LTX2AudioVideoAttnProcessor

    return LTX2AudioVideoAttnProcessor


def keep_projections(report: InjectionReport, transformer, cache: TextKVCache) -> None:
    """The model projects the prompt anew in every call, so attn2 would see a new tensor each time: keep the
    projection for the generation too (the same output tensor, hence the same keys/values entry)."""
    for name in ("caption_projection", "audio_caption_projection"):
        projection = getattr(transformer, name, None)
        if projection is None:
            continue
        if source_digest(type(projection).forward) != PROJECTION_SOURCE:
            report.skip(name, f"{type(projection).__name__}.forward is not the code this rule reproduces: every call "
                        "projects the prompt, so the text keys/values are computed every call")
            continue
        vars(projection)["_ltxbench_text_cache"] = cache
        patch_forward(report, PROJECTION_RULE, projection, _projection_forward, {})
        report.on_revert(lambda projection=projection: vars(projection).pop("_ltxbench_text_cache", None))
