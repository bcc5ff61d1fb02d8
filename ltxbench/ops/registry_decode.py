"""KernelSpecs of the LLM decode step's fused ops, beside registry.py's: norm + projection (ltxbench.ops.norm_linear)
and the RoPE + static KV cache writes (rope_1d_cache, and rms_norm_qkv_rope_cache: norm, q/k/v, RoPE and cache in one),
with their baselines: the layers as transformers runs them, and our own unfused kernels."""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor

from ltxbench.ops import eager
from ltxbench.ops.inputs_cache import (
    QKV_CACHE_VARIANTS,
    ROPE_CACHE_VARIANTS,
    inputs_rms_norm_qkv_rope_cache,
    inputs_rope_1d_cache,
)
from ltxbench.ops.inputs_matmul import inputs_add_norm_linear, inputs_norm_linear
from ltxbench.ops.shapes import (
    GEMV_TEST_SHAPES,
    LLM_NORM_LINEAR_SHAPES,
    QKV_CACHE_TEST_SHAPES,
    ROPE_TEST_SHAPES,
    TEST_SHAPES,
)
from ltxbench.ops.spec import KernelSpec, nbytes, projection_bytes


def llm_rms_norm_linear(x: Tensor, norm_weight: Tensor, eps: float, weight: Tensor,
                        weight_offset: float = 0.0) -> Tensor:
    """A decoder layer's norm, then the projection after it: LlamaRMSNorm (Gemma3RMSNorm with its offset), nn.Linear."""
    normed = eager.llama_rms_norm(x, norm_weight, eps) if weight_offset == 0 else \
        eager.gemma_rms_norm(x, norm_weight, eps, weight_offset)
    return F.linear(normed, weight)


def llm_add_rms_norm_linear(x: Tensor, residual: Tensor, norm_weight: Tensor, eps: float, weight: Tensor,
                            weight_offset: float = 0.0, activation: str = "none") -> tuple[Tensor, Tensor]:
    """LlamaDecoderLayer's `residual + hidden`, post_attention_layernorm, then the gate/up projection (and with
    "swiglu" LlamaMLP's `act_fn(gate) * up`)."""
    h = residual + x
    out = llm_rms_norm_linear(h, norm_weight, eps, weight, weight_offset)
    if activation == "swiglu":
        gate, up = out.chunk(2, dim=-1)
        out = F.silu(gate) * up
    return out, h


def ltxbench_rms_norm_linear(x: Tensor, norm_weight: Tensor, eps: float, weight: Tensor,
                             weight_offset: float = 0.0) -> Tensor:
    """The same with our own unfused kernels (rms_norm, then linear): what the fused op saves over them."""
    from ltxbench import ops

    return ops.linear(ops.rms_norm(x, norm_weight, eps, cast_before_weight=weight_offset == 0,
                                   weight_offset=weight_offset), weight)


def ltxbench_add_rms_norm_linear(x: Tensor, residual: Tensor, norm_weight: Tensor, eps: float, weight: Tensor,
                                 weight_offset: float = 0.0, activation: str = "none") -> tuple[Tensor, Tensor]:
    from ltxbench import ops

    normed, h = ops.fused_add_rms_norm(x, residual, norm_weight, eps, cast_before_weight=weight_offset == 0,
                                       weight_offset=weight_offset)
    out = ops.linear(normed, weight)
    return (ops.swiglu(out, 0) if activation == "swiglu" else out), h


def _qkv_split(qkv: Tensor, k_cache: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """A [q | k | v] projection's output (B, S, (Hq + 2 Hk) hd) as q (B, Hq, S, hd), k and v (B, Hk, S, hd): transposed
    views, as the attention makes them."""
    b, s, _ = qkv.shape
    hk, hd = k_cache.shape[1], k_cache.shape[3]
    heads = qkv.view(b, s, qkv.shape[-1] // hd, hd)
    return tuple(t.transpose(1, 2) for t in heads.split([heads.shape[2] - 2 * hk, hk, hk], dim=2))


def llm_rms_norm_qkv_rope_cache(x: Tensor, norm_weight: Tensor, eps: float, weight: Tensor, cos: Tensor, sin: Tensor,
                                k_cache: Tensor, v_cache: Tensor, offset: Tensor, weight_offset: float = 0.0) -> Tensor:
    """A decode step's attention input as transformers runs it: input_layernorm, the q/k/v projections (one [q | k | v]
    weight here), apply_rotary_pos_emb, then the static cache layer's update; returns q rotated."""
    q, k, v = _qkv_split(llm_rms_norm_linear(x, norm_weight, eps, weight, weight_offset), k_cache)
    return eager.hf_rope_1d_cache(q, k, v, cos, sin, k_cache, v_cache, offset)


def ltxbench_rms_norm_qkv_rope_cache(x: Tensor, norm_weight: Tensor, eps: float, weight: Tensor, cos: Tensor,
                                     sin: Tensor, k_cache: Tensor, v_cache: Tensor, offset: Tensor,
                                     weight_offset: float = 0.0) -> Tensor:
    """What the fused op stands for, on our kernels: rms_norm_linear, then rope_1d_cache of its q, k and v."""
    from ltxbench import ops
    from ltxbench.ops import norm_linear

    q, k, v = _qkv_split(norm_linear.rms_norm_linear(x, norm_weight, eps, weight, weight_offset), k_cache)
    return ops.rope_1d_cache(q, k, v, cos, sin, k_cache, v_cache, offset)


def _cache_rows_bytes(inputs: dict) -> int:
    """rope_1d_cache's writes: q rotated, and the step's rows of both caches (k's and v's size)."""
    return nbytes(inputs["q"]) + nbytes(inputs["k"]) + nbytes(inputs["v"])


def _add_norm_linear_bytes(inputs: dict) -> int:
    """The projection's output (a SwiGLU's: half of it) and h."""
    return projection_bytes(inputs) // (2 if inputs["activation"] == "swiglu" else 1) + nbytes(inputs["x"])


DECODE_SPECS = (
    KernelSpec(
        name="rms_norm_linear", summary="rms_norm(x) * (offset + norm_weight) @ weight.T: <= 4 rows on gemv.cu",
        make_inputs=inputs_norm_linear, variants=("llama", "gemma"), n_outputs=1, home="ltxbench.ops.norm_linear",
        baselines={"eager": llm_rms_norm_linear, "ltxbench-unfused": ltxbench_rms_norm_linear},
        aliases=("rmsnorm_linear", "norm_gemv"), test_shapes=TEST_SHAPES + GEMV_TEST_SHAPES,
        bench_shapes=LLM_NORM_LINEAR_SHAPES,
        inject_targets=("an LLM decode step's input_layernorm + q/k/v projection",),
        written=projection_bytes,
    ),
    KernelSpec(
        name="add_rms_norm_linear",
        summary="h = residual + x; (rms_norm(h) * (offset + norm_weight) @ weight.T [-> swiglu], h): <= 4 rows on "
                "gemv.cu",
        make_inputs=inputs_add_norm_linear, variants=("llama", "gemma", "llama-swiglu"), n_outputs=2,
        home="ltxbench.ops.norm_linear",
        baselines={"eager": llm_add_rms_norm_linear, "ltxbench-unfused": ltxbench_add_rms_norm_linear},
        aliases=("add_rmsnorm_linear",), test_shapes=TEST_SHAPES + GEMV_TEST_SHAPES,
        bench_shapes=LLM_NORM_LINEAR_SHAPES,
        inject_targets=("an LLM decode step's residual add + post_attention_layernorm + gate/up projection + SwiGLU",),
        written=_add_norm_linear_bytes,
    ),
    KernelSpec(
        name="rope_1d_cache",
        summary="rope_1d of q, k from per-token tables; k rotated and v written into a static KV cache at rows "
                "offset + s; returns q rotated",
        make_inputs=inputs_rope_1d_cache, variants=ROPE_CACHE_VARIANTS, n_outputs=1,
        baselines={"eager": eager.hf_rope_1d_cache}, kind="elementwise", aliases=("rope_cache", "rope_kv_cache"),
        test_shapes=ROPE_TEST_SHAPES, bench_shapes={"llama3-8b-decode": (1, 1, 4096)},
        inject_targets=("an LLM decode step's apply_rotary_pos_emb + StaticLayer.update",),
        written=_cache_rows_bytes, writes=("k_cache", "v_cache"),
    ),
    KernelSpec(
        name="rms_norm_qkv_rope_cache",
        summary="rms_norm(x) * (offset + norm_weight) @ [q | k | v].T, then rope_1d_cache of its q, k, v: <= 4 rows "
                "on gemv.cu",
        make_inputs=inputs_rms_norm_qkv_rope_cache, variants=tuple(QKV_CACHE_VARIANTS), n_outputs=1,
        home="ltxbench.ops.norm_linear",
        baselines={"eager": llm_rms_norm_qkv_rope_cache, "ltxbench-unfused": ltxbench_rms_norm_qkv_rope_cache},
        aliases=("norm_qkv_rope_cache",), test_shapes=QKV_CACHE_TEST_SHAPES,
        bench_shapes={"llama3-8b-decode": (1, 1, 4096)},
        inject_targets=("an LLM decode step's input_layernorm + q/k/v projection + RoPE + StaticLayer.update",),
        written=projection_bytes, writes=("k_cache", "v_cache"),
    ),
)
