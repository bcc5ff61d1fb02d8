"""The projections' GEMMs: cuBLASLt through our binding (`linear`, with a per-problem algorithm search), torch's
cuBLASLt GEMM with a GELU epilogue as an opaque op (`linear_gelu_tanh`), and torch's row-wise FP8 GEMM with its
requirements checked (`linear_fp8`). Public through `ltxbench.ops`.
"""

from __future__ import annotations

import torch

from ltxbench.ops import build

Tensor = torch.Tensor
_lib = build.ops


def linear(x: Tensor, weight: Tensor, bias: Tensor | None = None, activation: str = "none",
           residual: Tensor | None = None) -> Tensor:
    """`act(x @ weight.T + bias) + residual` for x (..., K), weight (N, K), bias (N,) or None; activation "none" or
    "gelu_tanh" (cuBLASLt's epilogue: bias and GELU applied to the fp32 accumulator, rounded once); residual
    (..., N) or None, added to the fp32 accumulator by the GEMM (beta = 1: a residual connection without its own
    pass over memory), activation "none" only. cuBLASLt,
    with the algorithm of each problem (shape, dtype, leading dims, alignment) chosen by timing on its first call:
    the heuristic's list and the tile / cluster / option variants of its first choice, kept only if > 1% faster
    than that choice (what torch runs). The search takes ~1-15 s per problem of >= 1 GFLOP and >= 20 us, once per
    process, or once per GPU model with `load_gemm_choices()`; `gemm_tuning(False)` turns it off, `gemm_choices()`
    lists what was chosen, with both timings."""
    return _lib().linear(x, weight, bias, activation, residual)


def gemm_tuning(enabled: bool) -> bool:
    """Turn `linear`'s algorithm search on or off for later problems (on by default); returns the old setting.
    Off, a new problem runs cuBLASLt's heuristic first choice, as torch does."""
    return _lib().gemm_tuning(enabled)


def gemm_choices() -> list[str]:
    """One line per `linear` problem seen in this process: shape, dtype, heuristic and chosen times."""
    return list(_lib().gemm_choices())


def load_gemm_choices(device=None) -> int:
    """Load `linear`'s GEMM choices stored by earlier processes on this GPU model (ops.gemm_cache); returns how
    many were kept. From then on, this process's new choices are saved at exit."""
    from ltxbench.ops import gemm_cache

    return gemm_cache.load(device)


def save_gemm_choices(device=None):
    """Merge this process's searched GEMM choices into the GPU model's file now; returns its path or None."""
    from ltxbench.ops import gemm_cache

    return gemm_cache.save(device)


def _addmm_gelu_tanh(x: Tensor, weight: Tensor, bias: Tensor) -> Tensor:
    out = torch._addmm_activation(bias, x.reshape(-1, x.shape[-1]), weight.t(), use_gelu=True)
    return out.view(*x.shape[:-1], weight.shape[0])


@torch.library.custom_op("ltxbench::linear_gelu_tanh", mutates_args=(), device_types="cuda")
def _linear_gelu_tanh(x: Tensor, weight: Tensor, bias: Tensor) -> Tensor:
    return _addmm_gelu_tanh(x, weight, bias)


@_linear_gelu_tanh.register_fake
def _(x: Tensor, weight: Tensor, bias: Tensor) -> Tensor:
    return x.new_empty((*x.shape[:-1], weight.shape[0]))


def linear_gelu_tanh(x: Tensor, weight: Tensor, bias: Tensor) -> Tensor:
    """`gelu_tanh(x @ weight.T + bias)` as ONE cuBLASLt GEMM whose epilogue adds the bias and applies the GELU
    (torch._addmm_activation: the tanh approximation on CUDA, checked against F.gelu in the GPU tests): the
    (tokens, 4D) pre-activation is never written and re-read. Not our kernel: torch's cuBLASLt binding, wrapped
    as the op ltxbench::linear_gelu_tanh so that inductor keeps it opaque (as an aten fallback inside the
    28-block LTX graph it stalled inductor's compile on the H100, torch 2.11)."""
    for name, t in (("x", x), ("weight", weight), ("bias", bias)):
        if not isinstance(t, Tensor) or not t.is_cuda:
            raise ValueError(f"linear_gelu_tanh: {name} must be a CUDA tensor")
    if bias.dim() != 1 or bias.shape[0] != weight.shape[0] or x.shape[-1] != weight.shape[1]:
        raise ValueError(f"linear_gelu_tanh: x {tuple(x.shape)}, weight {tuple(weight.shape)} and bias "
                         f"{tuple(bias.shape)} do not form x @ weight.T + bias")
    if torch.compiler.is_compiling():
        return _linear_gelu_tanh(x, weight, bias)
    # Eager: torch's binding directly. The custom op's Python dispatch costs host time on every call, and on slow
    # hosts the patched eager LTX step is host-bound (docs/tuning.md, step-level work).
    return _addmm_gelu_tanh(x, weight, bias)


_SCALED_MM_OUT = (torch.bfloat16, torch.float16, torch.float32)


def _check_linear_fp8(x, x_scale, weight, weight_scale, bias, out_dtype) -> None:
    """torch._scaled_mm's row-wise requirements, as one-line errors naming the argument."""
    fp8 = torch.float8_e4m3fn
    for name, t in (("x", x), ("weight", weight)):
        if t.dtype != fp8:
            raise ValueError(f"linear_fp8: {name} must be float8_e4m3fn, got {t.dtype}")
    k = x.shape[-1] if x.dim() else 0
    if weight.dim() != 2 or weight.shape[1] != k:
        raise ValueError(f"linear_fp8: weight must be (N, K) = (N, {k}), got {tuple(weight.shape)}")
    if k % 16 or weight.shape[0] % 16:
        raise ValueError(f"linear_fp8: K = {k} and N = {weight.shape[0]} must be multiples of 16 (torch._scaled_mm)")
    if not weight.is_contiguous():
        raise ValueError("linear_fp8: weight must be contiguous (row-major (N, K), read as its transpose)")
    if x_scale.dtype != torch.float32 or tuple(x_scale.shape) != (*x.shape[:-1], 1):
        raise ValueError(f"linear_fp8: x_scale must be float32 {(*x.shape[:-1], 1)}, got {x_scale.dtype} "
                         f"{tuple(x_scale.shape)}")
    n = weight.shape[0]
    if weight_scale.dtype != torch.float32 or tuple(weight_scale.shape) not in ((n, 1), (n,)):
        raise ValueError(f"linear_fp8: weight_scale must be float32 ({n}, 1) or ({n},), got {weight_scale.dtype} "
                         f"{tuple(weight_scale.shape)}")
    if out_dtype not in _SCALED_MM_OUT:
        raise ValueError(f"linear_fp8: out_dtype must be bfloat16, float16 or float32, got {out_dtype}")
    if bias is not None and (bias.dtype != out_dtype or out_dtype == torch.float32 or tuple(bias.shape) != (n,)):
        raise ValueError(f"linear_fp8: bias must be ({n},) of out_dtype, bfloat16 or float16 (torch._scaled_mm), "
                         f"got {bias.dtype} {tuple(bias.shape)} with out_dtype {out_dtype}")


def linear_fp8(x: Tensor, x_scale: Tensor, weight: Tensor, weight_scale: Tensor, bias: Tensor | None = None,
               out_dtype: torch.dtype = torch.bfloat16, fast_accumulation: bool = False) -> Tensor:
    """`(x · x_scale) @ (weight · weight_scale)ᵀ + bias` on the FP8 tensor cores, rounded once to out_dtype:
    torch._scaled_mm with row-wise scales (cuBLASLt, not our kernel). x (..., K) float8_e4m3fn with x_scale float32
    (..., 1) (what the *_fp8 ops return); weight (N, K) float8_e4m3fn, contiguous, with weight_scale float32 (N, 1) or
    (N,) (`quantize_fp8(weight)`); bias (N,) in out_dtype (bf16 or fp16) or None. K and N multiples of 16.
    fast_accumulation: the tensor cores' own accumulator over all of K (about 18% faster on the H100 at LTX-2B's
    shapes, relative error ~1e-3: docs/precision.md#accumulation); False: partial sums promoted to fp32 registers."""
    _check_linear_fp8(x, x_scale, weight, weight_scale, bias, out_dtype)
    k, n = weight.shape[1], weight.shape[0]
    rows = x.reshape(-1, k).contiguous()
    if rows.shape[0] == 0:
        return torch.empty((*x.shape[:-1], n), dtype=out_dtype, device=x.device)
    out = torch._scaled_mm(rows, weight.t(), scale_a=x_scale.reshape(-1, 1).contiguous(),
                           scale_b=weight_scale.reshape(1, n).contiguous(), bias=bias, out_dtype=out_dtype,
                           use_fast_accum=fast_accumulation)
    return out.reshape(*x.shape[:-1], n)
