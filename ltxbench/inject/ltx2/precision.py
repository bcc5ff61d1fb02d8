"""LTX-2's blocks under `precision="fp8"` (ltxbench.inject.fp8): every projection of both streams' attentions (self,
text, audio<->video) and feed-forwards stored and run in FP8. Each modulated norm of the fused block feeds only
projections, so it writes FP8 per token (fp8.Fp8Norms); the feed-forwards' GELU writes the down-projection's input
in FP8; the out-projections and the text keys/values quantize their inputs first. The projections that read one
input (self-attention's q/k/v, the audio<->video attentions' k/v) stay one GEMM. Embeddings, modulation, the final
norms and proj_out stay in the model's dtype.
"""

from __future__ import annotations

import torch

from ltxbench.inject.fp8 import plain_block, store_feed_forward, store_weights

ATTENTIONS = ("attn1", "audio_attn1", "attn2", "audio_attn2", "audio_to_video_attn", "video_to_audio_attn")
GROUPS = {"attn1": ("to_q", "to_k", "to_v"), "audio_attn1": ("to_q", "to_k", "to_v"),
          "audio_to_video_attn": ("to_k", "to_v"), "video_to_audio_attn": ("to_k", "to_v")}
RULE = "fp8: attention projections on FP8 (norm outputs written in FP8, one GEMM per shared input)"
FF_RULE = "ff / audio_ff: FP8 up-projection on the norm's FP8 output, GELU writing FP8, FP8 down-projection"


def _layers(attn) -> list:
    return [attn.to_q, attn.to_k, attn.to_v, attn.to_out[0]]


def unquantizable(blocks, fused_processors: tuple) -> str | None:
    """Why these blocks cannot all run in FP8 (None: they can): every projection a plain nn.Linear, every attention
    on a processor the fused block runs itself (diffusers' would meet the norms' FP8 outputs), plain feed-forwards."""
    for index, block in enumerate(blocks):
        for name in ATTENTIONS:
            attn, where = getattr(block, name), f"transformer_blocks.{index}.{name}"
            if not all(type(layer) is torch.nn.Linear for layer in _layers(attn)):
                return f"{where}: a projection is not a plain nn.Linear (quantized or wrapped)"
            if type(attn.processor) not in fused_processors:
                return f"{where}: processor {type(attn.processor).__name__} is not one the fused block runs"
        reason = plain_block(f"transformer_blocks.{index}", (), {"ff": block.ff, "audio_ff": block.audio_ff})
        if reason is not None:
            return reason
    return None


def quantize_block(report, ops, block, classes: dict, accumulation: str = "fast") -> None:
    """Store `block`'s projections in FP8 (their bf16 weights freed until revert) and route them through it, their GEMMs
    accumulating as `accumulation` says (fp8.ACCUMULATIONS)."""
    for name in ATTENTIONS:
        attn = getattr(block, name)
        group = GROUPS.get(name, ())
        if group:
            store_weights(report, ops, attn, [getattr(attn, layer) for layer in group], RULE, classes, names=group,
                          accumulation=accumulation)
        for layer in _layers(attn):
            if not any(layer is getattr(attn, member) for member in group):
                store_weights(report, ops, layer, [layer], RULE, classes, accumulation=accumulation)
    for name in ("ff", "audio_ff"):
        store_feed_forward(report, ops, getattr(block, name), FF_RULE, classes, accumulation)
