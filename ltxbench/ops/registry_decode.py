"""KernelSpecs of the LLM decode step's fused norm + projection ops (ltxbench.ops.norm_linear), beside registry.py's,
and their baselines: the layers as transformers runs them, and our own unfused kernels."""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor

from ltxbench.ops import eager
from ltxbench.ops.inputs_matmul import inputs_add_norm_linear, inputs_norm_linear
from ltxbench.ops.shapes import GEMV_TEST_SHAPES, LLM_NORM_LINEAR_SHAPES, TEST_SHAPES
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
)
