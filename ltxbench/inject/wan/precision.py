"""Wan's blocks under `precision="fp8"` (ltxbench.inject.fp8): every projection of a block stored and run in FP8 —
attn1's and attn2's q/k/v/out (and Wan 2.1 I2V's image keys/values, add_k_proj / add_v_proj), each quantizing its
input per token, as diffusers' attention processor calls them one by one; the feed-forward's up-projection, its GELU
writing FP8 for the down-projection. The modulated norms keep their float32 modulation and write the model's dtype
(no FP8-writing variant of them yet: each projection quantizes). Embeddings, the time projection, the final norm and
proj_out stay in the model's dtype.
"""

from __future__ import annotations

from ltxbench.inject.fp8 import plain_block, store_feed_forward, store_weights

RULE = "fp8: attention projections on FP8 weights, each input quantized per token"
FF_RULE = "ffn: FP8 up-projection, GELU writing FP8, FP8 down-projection"


def projections(block) -> list:
    """The block's attention projections: attn1's and attn2's q/k/v/out, and I2V's image keys/values."""
    layers = []
    for attn in (block.attn1, block.attn2):
        layers += [attn.to_q, attn.to_k, attn.to_v, attn.to_out[0]]
        layers += [layer for layer in (getattr(attn, "add_k_proj", None), getattr(attn, "add_v_proj", None))
                   if layer is not None]
    return layers


def unquantizable(blocks) -> str | None:
    """Why these blocks cannot all run in FP8 (None: they can): every projection a plain nn.Linear, the attentions
    unfused (diffusers' fused to_qkv would bypass the stored layers), a plain GELU-tanh feed-forward."""
    for index, block in enumerate(blocks):
        if any(getattr(attn, "fused_projections", False) for attn in (block.attn1, block.attn2)):
            return f"blocks.{index}: its projections are fused (fuse_projections): unfuse them first"
        reason = plain_block(f"blocks.{index}", projections(block), {"ffn": block.ffn})
        if reason is not None:
            return reason
    return None


def quantize_block(report, ops, block, classes: dict, accumulation: str = "fast") -> None:
    """Store `block`'s projections in FP8 (their bf16 weights freed on the device until revert) and route them through
    it (after `unquantizable` said they all can), their GEMMs accumulating as `accumulation` says."""
    for layer in projections(block):
        store_weights(report, ops, layer, [layer], RULE, classes, accumulation=accumulation)
    store_feed_forward(report, ops, block.ffn, FF_RULE, classes, accumulation)
