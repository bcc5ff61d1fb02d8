"""Kernel / op families for `ltxbench profile`: a small ordered rule table over lower-cased event names.

The first rule that matches wins, so the specific rules come first:

    0. communication            NCCL kernels and torch's collectives (several GPUs: all-to-all, all-gather, ...)
    1. ltxbench                 our kernels and custom ops (ltxbench::, row_op_cached, rope3d_kernel, ...)
    2. normalization/reduction  inductor's fused reductions (triton_red_*, triton_per_*)
    3. elementwise/copy         inductor's fused pointwise kernels (triton_poi_*)
    4. attention                flash, fmha, sdpa, *attention*, fa3_fwd's op, cuDNN attention (cudnn +
                                sdpa/fmha/flash/mha)
    5. GEMM                     gemm/gemv, cutlass, cublas, xmma, nvjet, matmul, conv (implicit GEMM), mm, bmm,
                                addmm, baddbmm, linear
    6. normalization/reduction  *norm* (not "normal"), rms*, reduce, softmax, sum, mean, var
    7. elementwise/copy         elementwise, vectorized, copy, memcpy, memset, contiguous, cat, add, mul, fill,
                                to, clone, activations (gelu, silu, tanh, ...), any other triton_* kernel
    8. other                    everything else

Substrings match anywhere; short words (mm, add, to, ...) only as a whole token, bounded by anything that is
not a letter or digit ("aten::_to_copy", "aten::add_" match; "tanh" does not match "to"). Standard library only.
"""

from __future__ import annotations

import re

FAMILIES = ("GEMM", "attention", "ltxbench", "normalization/reduction", "elementwise/copy", "communication", "other")


def _word(*words: str) -> str:
    return r"(?<![a-z0-9])(?:" + "|".join(words) + r")(?![a-z0-9])"


def _sub(*parts: str) -> str:
    return "|".join(re.escape(p) for p in parts)


# (family, regex) in priority order; see the module docstring.
RULES: tuple[tuple[str, str], ...] = (
    ("communication", _sub("nccl", "c10d", "all_to_all", "alltoall", "all_gather", "allgather", "all_reduce",
                           "allreduce", "reduce_scatter", "wait_tensor")),
    ("ltxbench", _sub("ltxbench::", "ltxbench_", "row_op_cached", "row_op_streamed", "rope3d_kernel",
                      "qk_norm_rope_kernel", "rope1d_kernel") + r"|(?<![a-z0-9])act_kernel"),
    ("normalization/reduction", _sub("triton_red_", "triton_per_")),
    ("elementwise/copy", _sub("triton_poi_")),
    ("attention", _sub("flash", "fmha", "sdpa", "attention", "_efficient_attention", "fa3_fwd::")
     + r"|cudnn.*(?:mha|attn)"),
    ("GEMM", _sub("gemm", "gemv", "cutlass", "cublas", "xmma", "nvjet", "matmul")
     + r"|conv(?!ert)|" + _word("mm", "bmm", "addmm", "baddbmm", "linear", "_addmm_activation")),
    ("normalization/reduction", r"norm(?!al)|(?<![a-z0-9])rms|" + _sub("reduce", "softmax")
     + "|" + _word("sum", "mean", "var", "var_mean", "amax")),
    ("elementwise/copy", _sub("elementwise", "vectorized", "copy", "memcpy", "memset", "contiguous", "triton_")
     + "|" + _word("cat", "add", "add_", "sub", "mul", "div", "fill", "fill_", "to", "clone", "gelu", "silu",
                   "tanh", "sigmoid", "pow", "rsqrt", "exp", "neg", "where", "expand", "zero_", "zeros",
                   "empty", "empty_like", "ones", "arange", "index", "slice", "view", "reshape", "transpose",
                   "permute", "unsqueeze", "split", "chunk", "stack", "repeat", "flatten", "masked_fill")),
)
_COMPILED = tuple((family, re.compile(pattern)) for family, pattern in RULES)


def classify(name: str) -> str:
    """The family of one kernel or op name (one of FAMILIES)."""
    low = name.lower()
    for family, pattern in _COMPILED:
        if pattern.search(low):
            return family
    return "other"
