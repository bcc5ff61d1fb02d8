"""LTX-Video's blocks under `precision="fp8"` (ltxbench.inject.fp8): every projection of a block stored and run in
FP8 — attn1's q/k/v as one GEMM whose input the modulated norm1 writes in FP8, the feed-forward whose input norm2
writes in FP8 and whose GELU writes the down-projection's; the out-projections and attn2's q/k/v quantize their
inputs per token first. attn2's keys and values still come once per generation from the cache. The final
norm and proj_out, the embeddings and the modulation stay in the model's dtype (a fraction of a percent of the
FLOPs and of the weights).
"""

from __future__ import annotations

from ltxbench.inject.fp8 import plain_block, store_feed_forward, store_weights

QKV_RULE = "attn1: q/k/v as one FP8 GEMM on norm1's FP8 output"
LINEAR_RULE = "linear: FP8 weights, input quantized per token (out-projections, attn2's q/k/v)"
FF_RULE = "ff: FP8 up-projection on norm2's FP8 output, GELU writing FP8, FP8 down-projection"


def _projections(block) -> list:
    attn1, attn2 = block.attn1, block.attn2
    return [attn1.to_q, attn1.to_k, attn1.to_v, attn1.to_out[0], attn2.to_q, attn2.to_k, attn2.to_v, attn2.to_out[0]]


def unquantizable(blocks) -> str | None:
    """Why these blocks cannot all run in FP8 (None: they can). All or none: the chained forward hands each norm's
    FP8 output to the next block's projections."""
    return next(filter(None, (plain_block(f"transformer_blocks.{index}", _projections(block), {"ff": block.ff})
                              for index, block in enumerate(blocks))), None)


def quantize_block(report, ops, block, classes: dict, accumulation: str = "fast") -> None:
    """Store `block`'s projections in FP8 (their bf16 weights freed until revert) and route them through it
    (after `unquantizable` said they all can), their GEMMs accumulating as `accumulation` says (fp8.ACCUMULATIONS)."""
    attn1, attn2 = block.attn1, block.attn2
    qkv = ("to_q", "to_k", "to_v")
    store_weights(report, ops, attn1, [getattr(attn1, name) for name in qkv], QKV_RULE, classes, names=qkv,
                  accumulation=accumulation)
    for layer in (attn1.to_out[0], attn2.to_q, attn2.to_k, attn2.to_v, attn2.to_out[0]):
        store_weights(report, ops, layer, [layer], LINEAR_RULE, classes, accumulation=accumulation)
    store_feed_forward(report, ops, block.ff, FF_RULE, classes, accumulation)
