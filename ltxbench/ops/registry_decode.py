"""KernelSpecs of the LLM decode step's fused norm + projection ops (ltxbench.ops.norm_linear), beside registry.py's."""

from __future__ import annotations

import math

from ltxbench.ops import eager
from ltxbench.ops.inputs_matmul import inputs_add_norm_linear, inputs_norm_linear
from ltxbench.ops.shapes import GEMV_TEST_SHAPES, LLM_NORM_LINEAR_SHAPES, TEST_SHAPES
from ltxbench.ops.spec import KernelSpec, nbytes


def _written(inputs: dict) -> int:
    """The projection's output, (..., N) in x's dtype."""
    return math.prod(inputs["x"].shape[:-1]) * inputs["weight"].shape[0] * inputs["x"].element_size()


DECODE_SPECS = (
    KernelSpec(
        name="rms_norm_linear", summary="rms_norm(x) * (offset + norm_weight) @ weight.T: <= 4 rows on gemv.cu",
        make_inputs=inputs_norm_linear, variants=("llama", "gemma"), n_outputs=1, home="ltxbench.ops.norm_linear",
        baselines={"eager": eager.llm_rms_norm_linear, "ltxbench-unfused": eager.ltxbench_rms_norm_linear},
        aliases=("rmsnorm_linear", "norm_gemv"), test_shapes=TEST_SHAPES + GEMV_TEST_SHAPES,
        bench_shapes=LLM_NORM_LINEAR_SHAPES,
        inject_targets=("an LLM decode step's input_layernorm + q/k/v projection",),
        written=_written,
    ),
    KernelSpec(
        name="add_rms_norm_linear",
        summary="h = residual + x; (rms_norm(h) * (offset + norm_weight) @ weight.T [-> swiglu], h): <= 4 rows on "
                "gemv.cu",
        make_inputs=inputs_add_norm_linear, variants=("llama", "gemma", "llama-swiglu"), n_outputs=2,
        home="ltxbench.ops.norm_linear",
        baselines={"eager": eager.llm_add_rms_norm_linear, "ltxbench-unfused": eager.ltxbench_add_rms_norm_linear},
        aliases=("add_rmsnorm_linear",), test_shapes=TEST_SHAPES + GEMV_TEST_SHAPES,
        bench_shapes=LLM_NORM_LINEAR_SHAPES,
        inject_targets=("an LLM decode step's residual add + post_attention_layernorm + gate/up projection + SwiGLU",),
        written=lambda inputs: _written(inputs) // (2 if inputs["activation"] == "swiglu" else 1) + nbytes(inputs["x"]),
    ),
)
