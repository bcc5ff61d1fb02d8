"""The KernelSpecs of the FP8 ops: per-token FP8 outputs of the norms, the GELU and the quantizer
(`--precision fp8`), and per-head FP8 for FlashAttention-3's FP8 attention (`--precision fp8-attention`).
registry.SPECS holds them with the others."""

from __future__ import annotations

import math

import torch

from ltxbench.ops import eager
from ltxbench.ops.inputs import SPLIT_ROPE_VARIANTS, inputs_add_rms_mod, inputs_gelu, inputs_rms_mod
from ltxbench.ops.inputs_fp8 import (
    inputs_qk_norm_rope_fp8,
    inputs_qk_norm_rope_split_fp8,
    inputs_quantize,
    inputs_quantize_heads,
)
from ltxbench.ops.shapes import (
    FP8_TEST_SHAPES,
    LTX2_FFN_SHAPES,
    LTX2_SELF_SHAPES,
    LTX2_STREAM_SHAPES,
    LTX_FFN_SHAPES,
    LTX_SHAPES,
    ROPE_TEST_SHAPES,
    SPLIT_ROPE_TEST_SHAPES,
)
from ltxbench.ops.spec import KernelSpec, nbytes


def _fp8_written(inputs: dict, with_h: bool = False) -> int:
    """q (1 byte an element) and x_scale (4 bytes a row) of the first input's shape, and h' where the op returns it."""
    first = next(v for v in inputs.values() if isinstance(v, torch.Tensor))
    return first.numel() + 4 * math.prod(first.shape[:-1]) + (nbytes(first) if with_h else 0)


FP8_SPECS = (
    KernelSpec(
        name="rms_norm_modulate_fp8", summary="fp8 per token of rms_norm(x) [* weight] * (1 + scale) + shift",
        make_inputs=inputs_rms_mod, variants=("per-batch", "per-token", "ltx-unbind", "weight"), n_outputs=2,
        baselines={"eager": eager.ltx_rms_norm_modulate_fp8}, kind="fp8",
        aliases=("rmsnorm_modulate_fp8",), test_shapes=FP8_TEST_SHAPES,
        bench_shapes={**LTX_SHAPES, **LTX2_STREAM_SHAPES},
        inject_targets=("LTX norm1 + modulation feeding an FP8 attention projection",),
        written=_fp8_written,
    ),
    KernelSpec(
        name="add_rms_norm_modulate_fp8",
        summary="h' = h + a [* gate]; (fp8 per token of rms_norm(h') * (1 + scale) + shift, h')",
        make_inputs=inputs_add_rms_mod, variants=("gate", "no-gate"), n_outputs=3,
        baselines={"eager": eager.ltx_add_rms_norm_modulate_fp8}, kind="fp8",
        aliases=("add_rmsnorm_modulate_fp8",), test_shapes=FP8_TEST_SHAPES,
        bench_shapes={**LTX_SHAPES, **LTX2_STREAM_SHAPES},
        inject_targets=("LTX residual + norm2 feeding an FP8 feed-forward",),
        written=lambda inp: _fp8_written(inp, with_h=True),
    ),
    KernelSpec(
        name="gelu_tanh_fp8", summary="fp8 per row of 0.5 x (1 + tanh(√(2/π) (x + 0.044715 x³)))",
        make_inputs=inputs_gelu, variants=("plain",), n_outputs=2,
        baselines={"eager": eager.diffusers_gelu_tanh_fp8}, kind="fp8",
        aliases=("gelu_fp8",), test_shapes=FP8_TEST_SHAPES,
        bench_shapes={**LTX_FFN_SHAPES, **LTX2_FFN_SHAPES},
        inject_targets=("LTX FeedForward GELU(tanh) feeding an FP8 down projection",),
        written=_fp8_written,
    ),
    KernelSpec(
        name="quantize_fp8", summary="fp8 per row: x_scale = max(max|x|, 1e-12) / 448, q = x · (1 / x_scale)",
        make_inputs=inputs_quantize, variants=("plain", "outliers"), n_outputs=2,
        baselines={"eager": eager.fp8_rows}, kind="fp8",
        aliases=("fp8_quantize",), test_shapes=FP8_TEST_SHAPES,
        bench_shapes={**LTX_SHAPES, **LTX_FFN_SHAPES},
        inject_targets=("activations and weights of FP8 projections",),
        written=_fp8_written,
    ),
)


def _fp8_heads_written(inputs: dict, tensors: int = 1) -> int:
    """Per FP8 output: 1 byte an element of the first input's shape and a 4-byte descale per (batch, head)."""
    first = next(v for v in inputs.values() if isinstance(v, torch.Tensor))
    return tensors * (first.numel() + 4 * first.shape[0] * inputs["heads"])


# FP8 with one descale per (batch, head): the inputs of FlashAttention-3's FP8 attention (--precision fp8-attention)
FP8_ATTENTION_SPECS = (
    KernelSpec(
        name="qk_rms_norm_rope_fp8",
        summary="fp8 per head of qk_rms_norm_rope, each head's scale the power of two under 448 / (√D · max|w|)",
        make_inputs=inputs_qk_norm_rope_fp8, variants=("tables", "coords", "wan"), n_outputs=4,
        baselines={"eager": eager.ltx_qk_rms_norm_rope_fp8}, kind="fp8",
        aliases=("qk_norm_rope_fp8",), test_shapes=ROPE_TEST_SHAPES,
        bench_shapes={**LTX_SHAPES},
        inject_targets=("LTXAttention norm_q/norm_k + apply_rotary_emb feeding FP8 attention",
                        "WanAttnProcessor (attn1) norm_q/norm_k + rotary embedding feeding FP8 attention"),
        written=lambda inp: _fp8_heads_written(inp, 2),
    ),
    KernelSpec(
        name="qk_rms_norm_rope_split_fp8",
        summary="fp8 per group of heads of qk_rms_norm_rope_split, scale the power of two under 448 / (√D · max|w|)",
        make_inputs=inputs_qk_norm_rope_split_fp8, variants=SPLIT_ROPE_VARIANTS, n_outputs=4,
        baselines={"eager": eager.ltx2_qk_rms_norm_rope_split_fp8}, kind="fp8",
        aliases=("qk_norm_rope_split_fp8",), test_shapes=SPLIT_ROPE_TEST_SHAPES,
        bench_shapes={**LTX2_SELF_SHAPES},
        inject_targets=("LTX2Attention norm_q/norm_k + apply_split_rotary_emb feeding FP8 attention (video self)",),
        written=lambda inp: 2 * (inp["q"].numel() + 4 * inp["q"].shape[0] * inp["groups"]),
    ),
    KernelSpec(
        name="quantize_fp8_heads",
        summary="fp8 per (batch, head): scale the power of two under 448 / amax over the head's tokens",
        make_inputs=inputs_quantize_heads, variants=("plain", "slices", "outliers"), n_outputs=2,
        baselines={"eager": eager.fp8_heads}, kind="fp8",
        aliases=("fp8_quantize_heads",), test_shapes=FP8_TEST_SHAPES,
        bench_shapes={**LTX_SHAPES},
        inject_targets=("LTXAttention's value feeding FP8 attention",),
        written=_fp8_heads_written,
    ),
)
