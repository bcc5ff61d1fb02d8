"""LTX-2's attentions inside the fused block (block.py), as LTX2AudioVideoAttnProcessor computes them: the projections
that read one input as one GEMM, the q/k RMSNorm across heads and the RoPE as one kernel, the attention through
ltxbench.parallel.attend (the processor's backend and parallel config, so attention backends and context parallelism
behave as before), the out-projection with the residual added in its GEMM where one follows.
"""

from __future__ import annotations

import torch

from ltxbench.inject.fp8 import WEIGHT_ATTR, fused_projection
from ltxbench.inject.fp8_attention import attend_normed, attention, runs_fp8_attention
from ltxbench.inject.fuse import fused_outputs, unobserved
from ltxbench.inject.layers import eps_of
from ltxbench.parallel.attend import attend, rope_attention


def plain_attention(attn) -> str | None:
    """Why the fused path cannot stand for this attention's math (None: it can). Checked once, at injection."""
    if getattr(attn, "to_gate_logits", None) is not None:
        return "per-head gated attention (LTX-2.3): not the math the fused path reproduces"
    norms = (attn.norm_q, attn.norm_k)
    if not all(type(n) is torch.nn.RMSNorm and n.weight is not None for n in norms):
        return "norm_q/norm_k are not affine torch.nn.RMSNorm layers"
    if eps_of(attn.norm_q) != eps_of(attn.norm_k):
        return "norm_q and norm_k differ in eps"
    dropout = attn.to_out[1]
    if not isinstance(dropout, torch.nn.Dropout) or dropout.p != 0:
        return "the out-projection's dropout is active"
    if attn.rope_type not in ("split", "interleaved"):
        return f"rope_type {attn.rope_type!r}"
    return None


def linear(ops, x, layer, residual=None, activation: str = "none"):
    """`activation(layer(x)) [+ residual]`: ops.linear (one GEMM with its epilogue) for a plain nn.Linear, else the
    layer itself (a LoRA or quantized wrapper keeps its own forward, a hook put on the layer runs)."""
    if type(layer) is torch.nn.Linear and unobserved(layer):
        return ops.linear(x, layer.weight, layer.bias, activation, residual)
    out = layer(x)
    if activation == "gelu_tanh":
        out = torch.nn.functional.gelu(out, approximate="tanh")
    return out if residual is None else residual + out


def _project(ops, attn, names: tuple, x) -> tuple:
    """The outputs of attn's layers `names`, all reading x: one GEMM when they were fused at injection and still
    are (fuse.fused_outputs), else each layer."""
    fused = fused_projection(ops, attn, names, x) or fused_outputs(  # FP8 (precision.py), else bf16
        attn, names, x, lambda x, weight, bias: ops.linear(x, weight, bias))
    return fused or tuple(linear(ops, x, getattr(attn, name)) for name in names)


def _norm_rope(ops, attn, query, key, query_rope, key_rope):
    """norm_q / norm_k (RMSNorm across heads, with weight) and the RoPE as the processor applies it; key_rope None
    means the key takes the query's angles (self-attention: one kernel for both, the tables read once)."""
    wq, wk, eps = attn.norm_q.weight, attn.norm_k.weight, eps_of(attn.norm_q)
    if query_rope is None:
        return ops.rms_norm(query, wq, eps), ops.rms_norm(key, wk, eps)
    if attn.rope_type == "split":
        if key_rope is None:
            return ops.qk_rms_norm_rope_split(query, key, wq, wk, eps, *query_rope)
        return (ops.rms_norm_rope_split(query, wq, eps, *query_rope),
                ops.rms_norm_rope_split(key, wk, eps, *key_rope))
    if key_rope is None:  # interleaved, (B|1, S, D) tables shared by q and k: LTX-Video's kernel
        return ops.qk_rms_norm_rope(query, key, wq, wk, eps, *query_rope)
    from diffusers.models.transformers.transformer_ltx2 import apply_interleaved_rotary_emb

    return (apply_interleaved_rotary_emb(ops.rms_norm(query, wq, eps), query_rope),
            apply_interleaved_rotary_emb(ops.rms_norm(key, wk, eps), key_rope))


def _attend(attn, query, key, value, mask=None):
    processor = attn.processor
    query, key, value = (t.unflatten(2, (attn.heads, -1)) for t in (query, key, value))
    out = attend(query, key, value, mask, getattr(processor, "_attention_backend", None),
                 getattr(processor, "_parallel_config", None))
    return out.flatten(2, 3).to(query.dtype)


def _exchanged_attention(ops, attn, query, key, value, rope):
    """A self-attention under context parallelism with q and k normalized and rotated by the kernel that writes the
    exchange's send buffer (rope_attention); (1, S_local, heads, head_dim), else None. Not our ring attention: LTX-2
    under `ring` keeps diffusers' (its streams were not validated with ours)."""
    if rope is None:
        return None
    tables = dict(zip(("cos", "sin"), rope, strict=True))
    return rope_attention(ops, query, key, value, attn.norm_q.weight, attn.norm_k.weight, eps_of(attn.norm_q), tables,
                          attn.rope_type == "split", attn.heads, attn.processor, skip=("ring",))


def self_attention(ops, attn, hidden_states, rope, fp8_attention=None):
    """attn(hidden_states, query_rotary_emb=rope) without its residual (the caller gates it). fp8_attention: an FP8
    attention backend (ltxbench.inject.fp8_attention) for one GPU's call on the default attention backend."""
    query, key, value = _project(ops, attn, ("to_q", "to_k", "to_v"), hidden_states)
    out = _exchanged_attention(ops, attn, query, key, value, rope)
    if out is not None:  # q and k (and v) written by one kernel as the exchange sends them
        return linear(ops, out.flatten(2, 3).to(query.dtype), attn.to_out[0])
    if rope is not None and runs_fp8_attention(fp8_attention, attn.processor):
        if attn.rope_type == "split":  # q and k written in FP8 by the split-RoPE kernel, v quantized
            tables = dict(zip(("cos", "sin"), rope, strict=True))
            out = attention(ops, fp8_attention, attn, query, key, value, eps_of(attn.norm_q), tables, split=True)
        else:  # interleaved: normalized and rotated in bf16, then q, k and v quantized
            out = attend_normed(ops, fp8_attention, attn.heads, *_norm_rope(ops, attn, query, key, rope, None), value)
        return linear(ops, out, attn.to_out[0])
    query, key = _norm_rope(ops, attn, query, key, rope, None)
    return linear(ops, _attend(attn, query, key, value), attn.to_out[0])


def modality_attention(ops, attn, hidden_states, source, query_rope, key_rope):
    """The audio-to-video or video-to-audio attention: queries from one stream, keys/values from the other, each with
    its own RoPE; without its gated residual."""
    query = linear(ops, hidden_states, attn.to_q)
    key, value = _project(ops, attn, ("to_k", "to_v"), source)
    query, key = _norm_rope(ops, attn, query, key, query_rope, key_rope)
    return linear(ops, _attend(attn, query, key, value), attn.to_out[0])


def text_attention(ops, attn, hidden_states, key_value, mask, residual):
    """`residual + attn(hidden_states, text)` with the text keys/values given (the generation's cache or computed by
    the caller): the residual added in the out-projection's GEMM."""
    if mask is not None:
        batch_size, length = key_value[0].shape[:2]
        mask = attn.prepare_attention_mask(mask, length, batch_size)
        mask = mask.view(batch_size, attn.heads, -1, mask.shape[-1])
    query = ops.rms_norm(linear(ops, hidden_states, attn.to_q), attn.norm_q.weight, eps_of(attn.norm_q))
    return linear(ops, _attend(attn, query, *key_value, mask), attn.to_out[0], residual)


def feed_forward(ops, ff, hidden_states):
    """FeedForward(gelu-approximate): the up-projection with its GELU-tanh as one GEMM epilogue, then the down one."""
    if WEIGHT_ATTR in vars(ff):  # FP8 (precision.py): its own forward, the GELU writing FP8
        return ff(hidden_states)
    up, down = ff.net[0].proj, ff.net[2]
    return linear(ops, linear(ops, hidden_states, up, activation="gelu_tanh"), down)


def plain_feed_forward(ff) -> str | None:
    """Why feed_forward cannot stand for `ff` (None: it can)."""
    net = getattr(ff, "net", ())
    if len(net) != 3 or type(net[0]).__name__ != "GELU" or getattr(net[0], "approximate", None) != "tanh":
        return "the feed-forward is not Linear + GELU(tanh) + Linear"
    if not isinstance(net[1], torch.nn.Dropout) or net[1].p != 0:
        return "the feed-forward's dropout is active"
    return None
