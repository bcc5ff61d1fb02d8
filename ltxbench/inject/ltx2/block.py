"""The fused forward of LTX-2's transformer block (LTX2VideoTransformerBlock, diffusers 0.42.1; the math is in
docs/models.md). Per stream (video x, audio a), with the modulation tables added to the timestep embeddings as the
block adds them:

  RMS(x) * (1 + scale_msa) + shift_msa                        → rms_norm_modulate
  attn1: q/k/v one GEMM; norm_q/norm_k + RoPE (split/interl.) → qk_rms_norm_rope_split (rms_norm_rope_split for the
                                                                 a2v/v2a q and k, which differ in length and angles)
  x + attn1 * gate_msa, and RMS(x) for the text attention     → add_rms_norm_modulate (scale = shift = 0)
  x + attn2(RMS(x), text)                                     → the out-projection's GEMM adds x (ops.linear, beta 1);
                                                                 text keys/values from the generation's cache
  RMS(x)*(1+sc)+sh for a2v's queries and v2a's keys/values    → rms_norm_modulate each (x before the a2v update)
  x + a2v * a2v_gate, then RMS(x) * (1 + scale_mlp) + shift   → add_rms_norm_modulate
  ff: Linear + GELU-tanh, Linear                              → ops.linear with a GELU epilogue, ops.linear
  x + ff * gate_mlp                                           → gated_residual

Each fused op rounds once where the block rounds after every elementwise op: the error against float32 is the parity
tests' measure (tests/inject/test_inject_ltx2_block.py). Calls the fused path does not reproduce take the original
forward: gradients enabled, attention masks on the self- or modality attentions, modulation in another dtype than the
activations, weights offloaded after the injection. An attention whose processor was replaced after the injection runs
as a module (its own processor).
"""

from __future__ import annotations

import torch

from ltxbench.inject import observed_inside, original_class
from ltxbench.inject.ltx2.attention import (
    feed_forward,
    modality_attention,
    self_attention,
    text_attention,
)
from ltxbench.inject.ltx2.text_kv import text_key_value

FUSED_PROCESSORS_ATTR = "_ltxbench_processor_types"  # on the patched block: the processor types its path reproduces


def _zeros(like, cache: dict = {}):  # noqa: B006 (one (1, 1, D) zero tensor per device, dtype and width)
    """Scale and shift of a plain RMSNorm through add_rms_norm_modulate: `n * (1 + 0) + 0` is n exactly."""
    key = (like.device, like.dtype, like.size(-1))
    if key not in cache:
        cache[key] = torch.zeros(1, 1, like.size(-1), device=like.device, dtype=like.dtype)
    return cache[key]


def _text_kvs(block, cache, video_text, audio_text) -> tuple:
    """The (key, value) of attn2 and audio_attn2 from the generation's cache, None for one the fused path does not
    run or without a cache (text_attention then computes them)."""
    return tuple(cache.key_value(getattr(block, name), text)
                 if cache is not None and _runs_fused(block, getattr(block, name)) else None
                 for name, text in (("attn2", video_text), ("audio_attn2", audio_text)))


def _kept_inputs(block, cache, video_text, audio_text, x, a) -> tuple:
    """What the block reads that outlives its call: the text attentions' keys/values (_text_kvs) and each stream's zero
    modulation (_zeros)."""
    return (*_text_kvs(block, cache, video_text, audio_text), _zeros(x), _zeros(a))


# Regional compile traces the block forward, inside which the text cache would step aside, and a tensor the graph made
# and a dict kept would live in the CUDA-graph pool, where the next replay overwrites it: the lookups run outside the
# graph instead, first thing in the block (one graph break, after which dynamo compiles the rest as one graph).
_kept_inputs_eagerly = torch.compiler.disable(_kept_inputs)


def _runs_fused(block, attn) -> bool:
    return type(attn.processor) in vars(block)[FUSED_PROCESSORS_ATTR]


def _attention_call(ops, block, name, fused, original):
    attn = getattr(block, name)
    return fused(ops, attn) if _runs_fused(block, attn) else original(attn)


def _stream(ops, block, prefix, x, temb, rope, text, text_mask, text_kv, zeros, fp8_attention=None):
    """Self-attention and text cross-attention of one stream (prefix "" video, "audio_"; text_kv: the text attention's
    kept keys/values or None; zeros: _zeros(x); fp8_attention: the self-attention's FP8 backend, or None): returns
    (x, the FF's modulation (shift, scale, gate))."""
    table = getattr(block, f"{prefix}scale_shift_table")
    shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp = block.get_mod_params(table, temb, x.size(0))[:6]
    norm1, norm2 = getattr(block, f"{prefix}norm1"), getattr(block, f"{prefix}norm2")
    normed = ops.rms_norm_modulate(x, None, scale_msa, shift_msa, norm1.eps)
    attn = _attention_call(ops, block, f"{prefix}attn1",
                           lambda ops, attn: self_attention(ops, attn, normed, rope, fp8_attention),
                           lambda attn: attn(normed, encoder_hidden_states=None, query_rotary_emb=rope))
    normed, x = ops.add_rms_norm_modulate(x, attn, gate_msa, zeros, zeros, norm2.eps)
    name = f"{prefix}attn2"
    x = _attention_call(ops, block, name,
                        lambda ops, attn: text_attention(ops, attn, normed, text_kv or text_key_value(attn, text),
                                                         text_mask, x),
                        lambda attn: x + attn(normed, encoder_hidden_states=text, query_rotary_emb=None,
                                              attention_mask=text_mask))
    return x, (shift_mlp, scale_mlp, gate_mlp)


def _modality(block, batch, temb_scale_shift, temb_gate, table_name):
    table = getattr(block, table_name)
    a2v_scale, a2v_shift, v2a_scale, v2a_shift = block.get_mod_params(table[:4, :], temb_scale_shift, batch)
    gate = block.get_mod_params(table[4:, :], temb_gate, batch)[0].squeeze(2)
    return a2v_scale.squeeze(2), a2v_shift.squeeze(2), v2a_scale.squeeze(2), v2a_shift.squeeze(2), gate


def _feed_forward(ops, block, prefix, x, mlp, update=None, gate=None):
    """`x + ff(RMS(x + update * gate) * (1 + scale) + shift) * gate_mlp` with the pending a2v/v2a update folded into
    the norm's pass."""
    shift_mlp, scale_mlp, gate_mlp = mlp
    eps = getattr(block, f"{prefix}norm3").eps
    if update is None:
        normed = ops.rms_norm_modulate(x, None, scale_mlp, shift_mlp, eps)
    else:
        normed, x = ops.add_rms_norm_modulate(x, update, gate, scale_mlp, shift_mlp, eps)
    return ops.gated_residual(x, feed_forward(ops, getattr(block, f"{prefix}ff"), normed), gate_mlp)


def _modality_pass(ops, block, name, query_side, source_side, query_rope, key_rope):
    """One audio<->video attention (`name`) on modulated norms: query_side / source_side are (stream, scale, shift,
    eps) of the stream giving the queries and of the one giving keys and values."""
    query, source = (ops.rms_norm_modulate(stream, None, scale, shift, eps)
                     for stream, scale, shift, eps in (query_side, source_side))
    return _attention_call(ops, block, name,
                           lambda ops, attn: modality_attention(ops, attn, query, source, query_rope, key_rope),
                           lambda attn: attn(query, encoder_hidden_states=source, query_rotary_emb=query_rope,
                                             key_rotary_emb=key_rope))


def _cross_modal(ops, block, x, a, temb_ca_scale_shift, temb_ca_audio_scale_shift, temb_ca_gate, temb_ca_audio_gate,
                 ca_video_rope, ca_audio_rope, use_a2v, use_v2a):
    """Section 3: the audio-to-video and video-to-audio attentions on modulated norms of the streams as they are
    before either update. Returns (a2v output, a2v gate, v2a output, v2a gate), None where skipped."""
    v_a2v_scale, v_a2v_shift, v_v2a_scale, v_v2a_shift, a2v_gate = _modality(
        block, x.size(0), temb_ca_scale_shift, temb_ca_gate, "video_a2v_cross_attn_scale_shift_table")
    a_a2v_scale, a_a2v_shift, a_v2a_scale, a_v2a_shift, v2a_gate = _modality(
        block, x.size(0), temb_ca_audio_scale_shift, temb_ca_audio_gate, "audio_a2v_cross_attn_scale_shift_table")
    eps_v, eps_a = block.audio_to_video_norm.eps, block.video_to_audio_norm.eps
    a2v = v2a = None
    if use_a2v:
        a2v = _modality_pass(ops, block, "audio_to_video_attn", (x, v_a2v_scale, v_a2v_shift, eps_v),
                             (a, a_a2v_scale, a_a2v_shift, eps_a), ca_video_rope, ca_audio_rope)
    if use_v2a:
        v2a = _modality_pass(ops, block, "video_to_audio_attn", (a, a_v2a_scale, a_v2a_shift, eps_a),
                             (x, v_v2a_scale, v_v2a_shift, eps_v), ca_audio_rope, ca_video_rope)
    return a2v, a2v_gate, v2a, v2a_gate


def _fusable(block, hidden_states, audio_hidden_states, temb, temb_audio, masks) -> bool:
    """Is this call one the fused path reproduces? (See the module docstring.)"""
    if torch.is_grad_enabled() or any(m is not None for m in masks):
        return False
    dtype = hidden_states.dtype
    if not (temb.dtype == temb_audio.dtype == audio_hidden_states.dtype == block.scale_shift_table.dtype == dtype):
        return False
    # the device from a weight of the block's own: under FP8 a projection's weight is an empty placeholder, left on
    # the host when the injection ran there (--memory-budget), while its FP8 copy streams to the GPU
    # hooks put on the block's layers since the injection (a probe, pyramid attention broadcast) must see them run
    return (not block.attn1.to_q.weight.is_meta and block.scale_shift_table.device == hidden_states.device
            and not observed_inside(block))


def fused_block_forward(ops, cache, fp8_attention=None):
    """LTX2VideoTransformerBlock.forward through `ops` (the module docstring); cache: the text keys/values kept for
    the generation (text_kv.TextKVCache), or None; fp8_attention: the video self-attention's FP8 backend
    (ltxbench.inject.fp8_attention), or None (the audio stream's 126 tokens stay in bf16)."""

    def forward(self, hidden_states, audio_hidden_states, encoder_hidden_states, audio_encoder_hidden_states, temb,
                temb_audio, temb_ca_scale_shift, temb_ca_audio_scale_shift, temb_ca_gate, temb_ca_audio_gate,
                temb_prompt=None, temb_prompt_audio=None, video_rotary_emb=None, audio_rotary_emb=None,
                ca_video_rotary_emb=None, ca_audio_rotary_emb=None, encoder_attention_mask=None,
                audio_encoder_attention_mask=None, self_attention_mask=None, audio_self_attention_mask=None,
                a2v_cross_attention_mask=None, v2a_cross_attention_mask=None, use_a2v_cross_attention=True,
                use_v2a_cross_attention=True, perturbation_mask=None, all_perturbed=None):
        masks = (self_attention_mask, audio_self_attention_mask, a2v_cross_attention_mask, v2a_cross_attention_mask)
        if not _fusable(self, hidden_states, audio_hidden_states, temb, temb_audio, masks):
            return original_class(self).forward(
                self, hidden_states, audio_hidden_states, encoder_hidden_states, audio_encoder_hidden_states, temb,
                temb_audio, temb_ca_scale_shift, temb_ca_audio_scale_shift, temb_ca_gate, temb_ca_audio_gate,
                temb_prompt, temb_prompt_audio, video_rotary_emb, audio_rotary_emb, ca_video_rotary_emb,
                ca_audio_rotary_emb, encoder_attention_mask, audio_encoder_attention_mask, self_attention_mask,
                audio_self_attention_mask, a2v_cross_attention_mask, v2a_cross_attention_mask,
                use_a2v_cross_attention, use_v2a_cross_attention, perturbation_mask, all_perturbed)
        # perturbation_mask / all_perturbed: read only by perturbed attention (LTX-2.3), which apply_kernels refuses
        lookup = _kept_inputs_eagerly if torch.compiler.is_compiling() else _kept_inputs
        video_kv, audio_kv, video_zeros, audio_zeros = lookup(
            self, cache, encoder_hidden_states, audio_encoder_hidden_states, hidden_states, audio_hidden_states)
        x, video_mlp = _stream(ops, self, "", hidden_states, temb, video_rotary_emb, encoder_hidden_states,
                               encoder_attention_mask, video_kv, video_zeros, fp8_attention)
        a, audio_mlp = _stream(ops, self, "audio_", audio_hidden_states, temb_audio, audio_rotary_emb,
                               audio_encoder_hidden_states, audio_encoder_attention_mask, audio_kv, audio_zeros)
        a2v = v2a = a2v_gate = v2a_gate = None
        if use_a2v_cross_attention or use_v2a_cross_attention:
            a2v, a2v_gate, v2a, v2a_gate = _cross_modal(
                ops, self, x, a, temb_ca_scale_shift, temb_ca_audio_scale_shift, temb_ca_gate, temb_ca_audio_gate,
                ca_video_rotary_emb, ca_audio_rotary_emb, use_a2v_cross_attention, use_v2a_cross_attention)
        x = _feed_forward(ops, self, "", x, video_mlp, a2v, a2v_gate)
        a = _feed_forward(ops, self, "audio_", a, audio_mlp, v2a, v2a_gate)
        return x, a

    return forward
