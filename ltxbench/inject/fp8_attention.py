"""FP8 self-attention (`precision="fp8-attention"`, LTX-Video): FlashAttention-3's FP8 forward on Hopper, on top of
the FP8 projections (ltxbench.inject.fp8).

- q and k come out of the q/k RMSNorm + RoPE kernel already in FP8 (ops.qk_rms_norm_rope_fp8): each head's scale
  is a power of two bounded from the norm weights, so there is no amax pass and nothing can saturate.
- v is quantized per (batch, head) from its amax (ops.quantize_fp8_heads, two passes).
- FlashAttention-3 applies the three descales and writes bf16 (docs/precision.md#fp8-attention).

FlashAttention-3 is a peer library, not a dependency: its Hopper build (`flash_attn_interface`) is imported at
injection, and its absence is an environment problem (exit 4) with the way to install it.
"""

from __future__ import annotations

from ltxbench.errors import EnvironmentProblem

FP8_ATTENTION = "fp8-attention"
INSTALL_HINT = ("install FlashAttention-3's Hopper build: git clone https://github.com/Dao-AILab/flash-attention && "
                "cd flash-attention/hopper && pip install --no-build-isolation . (or run --precision fp8)")


def flash_attention_3():
    """FlashAttention-3's `flash_attn_func`, or EnvironmentProblem (exit 4) saying how to install it."""
    try:
        from flash_attn_interface import flash_attn_func
    except ImportError as exc:  # also a build for another torch: its extension fails to load
        raise EnvironmentProblem(f"--precision {FP8_ATTENTION} needs FlashAttention-3 (flash_attn_interface, "
                                 f"the hopper/ build of flash-attention): {exc}", hint=INSTALL_HINT) from exc
    return flash_attn_func


def runs_fp8_attention(processor, attention_mask) -> bool:
    """Does this self-attention call run in FP8? Only one GPU's whole attention, unmasked, on the default backend:
    context parallelism and other backends keep their bf16 path (the CLI refuses those combinations)."""
    return (processor.flash_attention is not None and attention_mask is None
            and processor._parallel_config is None and processor._attention_backend is None)


def attention(ops, flash_attn_func, attn, query, key, value, eps: float, rope: dict):
    """softmax(norm_q(q)ᵣ · norm_k(k)ᵣᵀ / √hd) · v in FP8 for (B, S, D) projections: (B, S, D) in query's dtype."""
    batch, tokens, _ = query.shape
    heads = attn.heads
    q8, q_descale, k8, k_descale = ops.qk_rms_norm_rope_fp8(query, key, attn.norm_q.weight, attn.norm_k.weight, eps,
                                                            heads, **rope)
    v8, v_descale = ops.quantize_fp8_heads(value, heads)
    per_head = (batch, tokens, heads, -1)
    out = flash_attn_func(q8.view(per_head), k8.view(per_head), v8.view(per_head),
                          q_descale=q_descale, k_descale=k_descale, v_descale=v_descale)
    out = out[0] if isinstance(out, tuple) else out  # older builds return (out, lse)
    return out.flatten(2, 3).to(query.dtype)
