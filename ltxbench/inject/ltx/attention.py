"""LTX-Video's attention under injection: the replacement processor (fused projections, the q/k RMSNorm + RoPE
kernel, our cross-attention kernel) and the attention forward that calls it without diffusers' per-call signature
check. The processor keeps `_attention_backend`/`_parallel_config` and attends through ltxbench.parallel.attend
(diffusers' dispatch_attention_fn, or our exchanges under context parallelism), so attention backends and context
parallelism behave as before; our cross-attention kernel runs only where diffusers would run its default backend.
Rules and the rest of the block: ltx/__init__.py.
"""

from __future__ import annotations

import torch

from ltxbench.inject import forward_source, fp8_attention, observed, original_class
from ltxbench.inject.fp8 import fused_projection
from ltxbench.inject.fuse import fused_outputs, unobserved
from ltxbench.inject.layers import eps_of, needs_autograd
from ltxbench.ops.reference import ltx_cos_sin
from ltxbench.parallel.attend import attend, rope_attention


def _rope_kwargs(image_rotary_emb) -> dict:
    first, second = image_rotary_emb
    if second.dim() == 1:  # (grid, freqs) from _rope_from_coords; cos/sin tables are (B, S, D)
        return {"grid": first, "freqs": second}
    return {"cos": first, "sin": second}


def tuned_linear(ops):
    """linear(x, weight, bias): ops.linear (cuBLASLt, algorithm chosen by timing), or torch's when a gradient is
    wanted through any of the three."""

    def linear(x, weight, bias=None):
        if needs_autograd(x, weight, bias):
            return torch.nn.functional.linear(x, weight, bias)
        return ops.linear(x, weight, bias)

    return linear


def _projections(ops, attn, hidden_states, encoder_hidden_states, linear):
    """query, key, value: one GEMM (`linear`) for to_q/to_k/to_v (self-attention) or to_k/to_v (cross-attention)
    when the weights were fused at injection, else the three Linear layers."""
    if encoder_hidden_states is None:
        qkv = fused_projection(ops, attn, ("to_q", "to_k", "to_v"), hidden_states)  # FP8 (precision.py)
        if qkv is not None:
            return qkv
        qkv = fused_outputs(attn, ("to_q", "to_k", "to_v"), hidden_states, linear)
        if qkv is not None:
            return qkv
    source = hidden_states if encoder_hidden_states is None else encoder_hidden_states
    return (attn.to_q(hidden_states), *_key_value(attn, source))


def _key_value(attn, source):
    """key, value of `source`: one GEMM when to_k/to_v were fused (alone) at injection, else the two layers."""
    return fused_outputs(attn, ("to_k", "to_v"), source) or (attn.to_k(source), attn.to_v(source))


def cross_key_value(ops, attn, encoder_hidden_states):
    """attn2's key (after norm_k) and value: what a cross_kv entry holds per block."""
    key, value = _key_value(attn, encoder_hidden_states)
    return ops.rms_norm(key, attn.norm_k.weight, eps_of(attn.norm_k)), value


class FusedLTXAttnProcessor:
    """LTXVideoAttnProcessor with fused projections (one GEMM) and the q/k RMSNorm (+ RoPE) as one kernel.
    Self-attention: left to diffusers/torch (torch's default order picks cuDNN, the fastest measured; forcing it
    with sdpa_kernel cost CPU time). Cross-attention (cross_attention=True): our
    short-key kernel `ops.cross_attention` when diffusers would run its default backend, else diffusers'.
    cross_kv: attn2's (key after norm_k, value) computed earlier from the same prompt (cross_kv.py).
    tuned_gemm: the fused q/k/v GEMM through ops.linear (cuBLASLt, algorithm chosen by timing; torch's when a
    gradient is wanted), else torch's; and `residual` (the block's hidden states) taken into the out-projection's
    GEMM (see fuses_residual), which returns `residual + to_out(attention)`. fp8_attention: an FP8 attention
    forward, for self-attention in FP8 (fp8_attention.py)."""

    def __init__(self, ops, original, cross_attention: bool = False, tuned_gemm: bool = False,
                 fp8_attention=None):
        self.ops = ops
        self.cross_attention = cross_attention
        self.fp8_attention = fp8_attention  # self-attention in FP8 (ltxbench.inject.fp8_attention)
        self.tuned_gemm = tuned_gemm
        self.linear = tuned_linear(ops) if tuned_gemm else torch.nn.functional.linear
        self.original = original
        self._attention_backend = getattr(original, "_attention_backend", None)
        self._parallel_config = getattr(original, "_parallel_config", None)

    def _runs_own_cross_attention(self) -> bool:
        """ops.cross_attention replaces diffusers' attention only where diffusers would run its default (native
        SDPA) backend: no backend chosen for this processor or globally, no context parallelism."""
        if not self.cross_attention or self._attention_backend is not None or self._parallel_config is not None:
            return False
        from diffusers.models.attention_dispatch import AttentionBackendName, _AttentionBackendRegistry

        return _AttentionBackendRegistry._active_backend == AttentionBackendName.NATIVE

    def fuses_residual(self, attn) -> bool:
        """Can the out-projection add a residual in its GEMM (ops.linear with beta = 1)? With tuned GEMMs, a plain
        nn.Linear, unhooked, and its dropout inactive: the add then costs no pass over memory of its own."""
        project, dropout = attn.to_out[0], attn.to_out[1]
        return (self.tuned_gemm and original_class(project) is torch.nn.Linear and unobserved(project)
                and isinstance(dropout, torch.nn.Dropout) and not (dropout.training and dropout.p > 0))

    def _output(self, attn, hidden_states, residual):
        project = attn.to_out[0]
        if residual is None:
            return attn.to_out[1](project(hidden_states))
        if self.fuses_residual(attn) and not needs_autograd(hidden_states, project.weight, project.bias, residual):
            return self.ops.linear(hidden_states, project.weight, project.bias, "none", residual)
        return residual + attn.to_out[1](project(hidden_states))

    def _exchanged_attention(self, attn, query, key, value, attention_mask, image_rotary_emb):
        """Self-attention under context parallelism with q and k normalized and rotated by the kernel that writes
        the exchange's send buffer (rope_attention): (1, S_local, heads, head_dim), else None."""
        if image_rotary_emb is None:
            return None
        return rope_attention(self.ops, query, key, value, attn.norm_q.weight, attn.norm_k.weight, eps_of(attn.norm_q),
                              _rope_kwargs(image_rotary_emb), False, attn.heads, self, attention_mask)

    def __call__(self, attn, hidden_states, encoder_hidden_states=None, attention_mask=None, image_rotary_emb=None,
                 cross_kv=None, residual=None):
        # offloaded after the injection (the layers' hooks bring their own weights) or hooked since: the norms run
        if attn.norm_q.weight.is_meta or observed(attn.norm_q) or observed(attn.norm_k):
            if image_rotary_emb is not None and "grid" in _rope_kwargs(image_rotary_emb):  # our rope's coordinates
                image_rotary_emb = ltx_cos_sin(*image_rotary_emb, attn.to_q.out_features)
            out = self.original(attn, hidden_states, encoder_hidden_states, attention_mask, image_rotary_emb)
            return out if residual is None else residual + out
        batch_size, sequence_length, _ = (
            hidden_states.shape if encoder_hidden_states is None else encoder_hidden_states.shape
        )
        if attention_mask is not None and attention_mask.ndim != 4:  # 4-D: prepared once per forward (attn2_mask)
            attention_mask = attn.prepare_attention_mask(attention_mask, sequence_length, batch_size)
            attention_mask = attention_mask.view(batch_size, attn.heads, -1, attention_mask.shape[-1])
        if encoder_hidden_states is not None and image_rotary_emb is None:  # cross-attention
            query = self.ops.rms_norm(attn.to_q(hidden_states), attn.norm_q.weight, eps_of(attn.norm_q))
            key, value = cross_kv if cross_kv is not None else cross_key_value(self.ops, attn, encoder_hidden_states)
        else:
            query, key, value = _projections(self.ops, attn, hidden_states, encoder_hidden_states, self.linear)
            hidden_states = self._exchanged_attention(attn, query, key, value, attention_mask, image_rotary_emb)
            if hidden_states is not None:  # q and k (and v) written by one kernel as the exchange sends them
                return self._output(attn, hidden_states.flatten(2, 3).to(query.dtype), residual)
            if image_rotary_emb is not None and fp8_attention.runs_fp8_attention(self.fp8_attention, self,
                                                                                  attention_mask):
                hidden_states = fp8_attention.attention(self.ops, self.fp8_attention, attn, query, key, value,
                                                        eps_of(attn.norm_q), _rope_kwargs(image_rotary_emb))
                return self._output(attn, hidden_states, residual)
            if image_rotary_emb is not None:  # self-attention: q and k have the same shape
                query, key = self.ops.qk_rms_norm_rope(query, key, attn.norm_q.weight, attn.norm_k.weight,
                                                       eps_of(attn.norm_q), **_rope_kwargs(image_rotary_emb))
            else:
                query = self.ops.rms_norm(query, attn.norm_q.weight, eps_of(attn.norm_q))
                key = self.ops.rms_norm(key, attn.norm_k.weight, eps_of(attn.norm_k))
        query, key, value = (t.unflatten(2, (attn.heads, -1)) for t in (query, key, value))
        per_key_mask = attention_mask is None or attention_mask.size(2) == 1  # (B, heads, 1, L): one value per key
        if encoder_hidden_states is not None and per_key_mask and self._runs_own_cross_attention():
            hidden_states = self.ops.cross_attention(query, key, value, attention_mask)
            return self._output(attn, hidden_states.flatten(2, 3), residual)
        hidden_states = attend(query, key, value, attention_mask, self._attention_backend, self._parallel_config)
        hidden_states = hidden_states.flatten(2, 3).to(query.dtype)
        return self._output(attn, hidden_states, residual)


ATTN_FORWARD_RULE = "attn1/attn2: forward calls the processor without inspecting its signature"
_PROCESSOR_CALL = "self.processor(self, hidden_states, encoder_hidden_states, attention_mask, image_rotary_emb"


def attention_forward(self, hidden_states, encoder_hidden_states=None, attention_mask=None, image_rotary_emb=None,
                       cross_kv=None, **kwargs):
    """LTXAttention.forward without its per-call `inspect.signature(self.processor.__call__)`, which only filters
    extra kwargs: host time that, with 56 attention calls per step, left the patched eager model host-bound on an
    H100 (docs/tuning.md#step-level-work). Extra kwargs still take the original path (its filter and warning).
    cross_kv comes only from our model forward, which passes it only while every attn2 runs our processor;
    residual only from our block code, after takes_residual."""
    if cross_kv is not None:
        kwargs["cross_kv"] = cross_kv
    if kwargs.keys() - {"cross_kv", "residual"}:
        return original_class(self).forward(self, hidden_states, encoder_hidden_states, attention_mask,
                                            image_rotary_emb, **kwargs)
    return self.processor(self, hidden_states, encoder_hidden_states, attention_mask, image_rotary_emb, **kwargs)


def takes_residual(attn) -> bool:
    """Does `attn(..., residual=h)` return `h + attn(...)` with the add inside the out-projection's GEMM? Only our
    processor, reached through attention_forward, knows the kwarg (diffusers' forward would drop it, with a warning)."""
    processor = getattr(attn, "processor", None)
    return (isinstance(processor, FusedLTXAttnProcessor) and processor.fuses_residual(attn)
            and type(attn).forward is attention_forward and "forward" not in vars(attn))


def forward_only_calls_processor(cls) -> bool:
    """Is `cls.forward` diffusers' shim (filter kwargs, call the processor) that attention_forward reproduces?"""
    source = forward_source(cls)
    return _PROCESSOR_CALL in source and source.count("self.processor(") == 1


def attn2_mask(blocks, mask, encoder_hidden_states):
    """attn2's additive mask prepared once for all blocks, (B, heads, 1, L) as each processor would make it, when every
    attn2 runs our processor (which takes a 4-D mask as prepared) with one head count; else the mask as given.
    Per block it was diffusers' prepare_attention_mask and a repeat_interleave kernel, 28 times the same."""
    attns = [block.attn2 for block in blocks]
    if mask is None or mask.ndim != 3 or not all(
            isinstance(a.processor, FusedLTXAttnProcessor) and a.heads == attns[0].heads for a in attns):
        return mask
    batch_size, length = encoder_hidden_states.shape[:2]
    prepared = attns[0].prepare_attention_mask(mask, length, batch_size)
    return prepared.view(batch_size, attns[0].heads, -1, prepared.shape[-1])
