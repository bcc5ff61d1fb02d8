"""Wan's self-attention with its q/k norms and rotary embedding in one kernel.

WanAttnProcessor (diffusers 0.42.1) normalizes q and k across all heads (torch.nn.RMSNorm, width D: fp32 statistics
and weight, one rounding), splits the heads, and rotates interleaved pairs by tables one head wide, (1, S, 1,
head_dim) fp32, the same for every head: `x1 cos - x2 sin`, `x1 sin + x2 cos` in fp32, one rounding. The patched
`__call__` of attn1's processor gives both to `qk_rms_norm_rope` with those tables as they are ((1, S, head_dim):
the kernel repeats them across the heads), then runs the attention and the output projection as the processor does
(its attention backend and parallel config). Calls it was not written for (cross-attention, no rotary embedding)
run the processor's own code.
"""

from __future__ import annotations

from ltxbench.inject import fp8_attention as fp8
from ltxbench.inject import original_class
from ltxbench.inject.fuse import unobserved
from ltxbench.inject.layers import eps_of
from ltxbench.inject.patching import source_digest

QK_ROPE_RULE = "attn1: norm_q/norm_k across heads + the rotary embedding in one kernel (tables one head wide)"
ATTN1_FP8_RULE = "attn1: FP8 attention ({}) on qk_rms_norm_rope_fp8's q/k and v"  # the backend's name
# sha256 (first 16 hex digits) of WanAttnProcessor.__call__ in diffusers 0.42.1: the code `self_attention_call` keeps
PROCESSOR_SOURCE = "13c09feedcfe814a"


def refusal(attn) -> str | None:
    """Why attn1's processor cannot take the fused call (None: it can)."""
    import torch
    from diffusers.models.transformers.transformer_wan import WanAttnProcessor

    processor = attn.processor
    if not isinstance(processor, WanAttnProcessor):
        return f"processor {type(processor).__name__}, not WanAttnProcessor"
    if source_digest(original_class(processor).__call__) != PROCESSOR_SOURCE:
        return "WanAttnProcessor.__call__ is not the code the fused call reproduces (diffusers 0.42.1)"
    for name in ("norm_q", "norm_k"):
        norm = getattr(attn, name)
        if type(norm) is not torch.nn.RMSNorm or norm.weight is None:
            return f"{name} is not an affine torch.nn.RMSNorm"
    if eps_of(attn.norm_q) != eps_of(attn.norm_k):  # the kernel takes one eps
        return "norm_q and norm_k differ in eps"
    if attn.add_k_proj is not None:
        return "an image cross-attention (add_k_proj)"
    return None


def self_attention_call(ops, fp8_attention=None):
    """WanAttnProcessor.__call__ with norm_q/norm_k and the rotation as `ops.qk_rms_norm_rope`; with an FP8
    attention backend (ltxbench.inject.fp8_attention), the norms, rotation and attention in FP8 where the call runs
    on one GPU's tokens, unmasked, on the default attention backend."""

    def call(self, attn, hidden_states, encoder_hidden_states=None, attention_mask=None, rotary_emb=None):
        from diffusers.models.attention_dispatch import dispatch_attention_fn
        from diffusers.models.transformers.transformer_wan import _get_qkv_projections

        # the norms' weights read here, not through the modules: offloaded since the injection (on meta, each module's
        # hook brings its own) or hooked since, the norms must run themselves
        norms = (attn.norm_q, attn.norm_k)
        if (rotary_emb is None or encoder_hidden_states is not None or attn.add_k_proj is not None
                or any(n.weight.is_meta or not unobserved(n) for n in norms)):
            return original_class(self).__call__(self, attn, hidden_states, encoder_hidden_states, attention_mask,
                                                 rotary_emb)
        query, key, value = _get_qkv_projections(attn, hidden_states, None)
        cos, sin = (t.squeeze(2) for t in rotary_emb)  # (1, S, 1, head_dim) -> (1, S, head_dim)
        if fp8.runs_fp8_attention(fp8_attention, self, attention_mask):
            hidden_states = fp8.attention(ops, fp8_attention, attn, query, key, value, eps_of(attn.norm_q),
                                          {"cos": cos, "sin": sin})
            return attn.to_out[1](attn.to_out[0](hidden_states))
        query, key = ops.qk_rms_norm_rope(query, key, attn.norm_q.weight, attn.norm_k.weight, eps_of(attn.norm_q),
                                          cos=cos, sin=sin)
        query, key, value = (t.unflatten(2, (attn.heads, -1)) for t in (query, key, value))
        hidden_states = dispatch_attention_fn(query, key, value, attn_mask=attention_mask, dropout_p=0.0,
                                              is_causal=False, backend=self._attention_backend,
                                              parallel_config=self._parallel_config)
        hidden_states = hidden_states.flatten(2, 3).type_as(query)
        hidden_states = attn.to_out[0](hidden_states)
        return attn.to_out[1](hidden_states)

    return call
