"""FP8 self-attention (`precision="fp8-attention"`): an FP8 attention forward on Hopper on top of the FP8
projections (ltxbench.inject.fp8), through FlashAttention-3 where it is installed (a source build, or pip's fa3-fwd:
ltxbench.inject.attention_backend), else cuDNN's frontend.

- q and k come out of the q/k RMSNorm + RoPE kernel already in FP8 (ops.qk_rms_norm_rope_fp8, LTX-2's split RoPE
  ops.qk_rms_norm_rope_split_fp8): the scales are powers of two bounded from the norm weights, so there is no amax
  pass and nothing can saturate.
- v is quantized from its amax (ops.quantize_fp8_heads, two passes).
- FlashAttention-3 takes a scale per (batch, head) and writes bf16; cuDNN (pip `nvidia-cudnn-frontend`) takes one
  per tensor and writes FP8, which ltxbench.ops.cudnn_fp8_attention dequantizes (docs/precision.md#fp8-attention).

Neither is a dependency: the first that imports is used, and with neither the run is an environment problem
(exit 4) saying how to install one.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ltxbench.errors import EnvironmentProblem, UsageError

FP8_ATTENTION = "fp8-attention"
INSTALL_HINT = ("pip install fa3-fwd (FlashAttention-3's forward kernels, bf16 and FP8), or pip install --no-deps "
                "nvidia-cudnn-frontend (cuDNN's FP8 attention, on torch's cuDNN; not at head dim 64), or build "
                "flash-attention's hopper/ tree (or run --precision fp8)")


@dataclass(frozen=True)
class Fp8Attention:
    """An FP8 attention forward: run(q8, k8, v8, q_descale, k_descale, v_descale) -> bf16, all (B, S, H, hd)."""

    name: str
    per_tensor: bool  # one scale per tensor (cuDNN) instead of one per (batch, head) (FlashAttention-3)
    run: Callable
    refuses: Callable[[int], str | None] = lambda _head_dim: None  # why a head dim cannot run (None: it can)

    def require(self, head_dim: int) -> None:
        """UsageError (exit 2) where this backend cannot take the model's head dim."""
        reason = self.refuses(head_dim)
        if reason is not None:
            raise UsageError(f"--precision {FP8_ATTENTION} through {self.name}: {reason}",
                             hint="run --precision fp8, or install FlashAttention-3 (pip install fa3-fwd)")


def _flash_attention_3(flash_attn_func) -> Fp8Attention:
    def run(q, k, v, q_descale, k_descale, v_descale):
        out = flash_attn_func(q, k, v, q_descale=q_descale, k_descale=k_descale, v_descale=v_descale)
        return out[0] if isinstance(out, tuple) else out  # older builds return (out, lse)

    return Fp8Attention("FlashAttention-3", False, run)


# Head dims where cuDNN's FP8 attention is slower than its bf16 attention (H200, bench micro attention: LTX-Video 2B
# at 161 frames 2.30 vs 2.21 ms, at 49 frames 0.35 vs 0.27 ms): refused rather than run slower and less exact
CUDNN_SLOWER_HEAD_DIMS = (64,)


def _cudnn(provider: str) -> Fp8Attention:
    from ltxbench.ops import cudnn_fp8_attention as cudnn_op

    def refuses(head_dim: int) -> str | None:
        if head_dim in CUDNN_SLOWER_HEAD_DIMS and provider != "reference":
            return (f"at head dim {head_dim} cuDNN's FP8 attention is slower than bf16 attention on Hopper "
                    "(docs/kernels.md#attention-backends)")
        return cudnn_op.supports(head_dim)

    # the reference provider runs anywhere: the op's emulation stands for it (the mechanics, on the CPU)
    run = cudnn_op.emulated if provider == "reference" else cudnn_op.cudnn_fp8_attention
    return Fp8Attention("cuDNN", True, run, refuses)


CHOICE_VARIABLE = "LTXBENCH_FP8_ATTENTION"  # fa3 or cudnn: one of them only (A/B; unset: the first that imports)


def fp8_attention(provider: str = "cuda") -> Fp8Attention:
    """FlashAttention-3 where one of its packages imports (ltxbench.inject.attention_backend), else cuDNN where
    `cudnn` (nvidia-cudnn-frontend) does, else EnvironmentProblem (exit 4) saying how to install one.
    LTXBENCH_FP8_ATTENTION=fa3 or cudnn takes that one alone."""
    import os

    from ltxbench.inject.attention_backend import find_flash_attention_3

    only = os.environ.get(CHOICE_VARIABLE, "")
    if only not in ("", "fa3", "cudnn"):
        raise UsageError(f"{CHOICE_VARIABLE}={only!r}: fa3 or cudnn (or unset: the first that imports)")
    fa3, reasons = find_flash_attention_3() if only != "cudnn" else (None, [f"not chosen ({CHOICE_VARIABLE}=cudnn)"])
    if fa3 is not None:
        return _flash_attention_3(fa3.flash_attn_func)
    if only == "fa3":
        raise EnvironmentProblem(f"{CHOICE_VARIABLE}=fa3: FlashAttention-3 does not import ({'; '.join(reasons)})",
                                 hint=INSTALL_HINT)
    try:
        import cudnn  # noqa: F401
    except ImportError as exc:
        raise EnvironmentProblem(f"--precision {FP8_ATTENTION} needs FlashAttention-3 ({'; '.join(reasons)}) or "
                                 f"cuDNN's frontend (cudnn: {exc})", hint=INSTALL_HINT) from exc
    return _cudnn(provider)


def require_precision(precision: str) -> None:
    """UsageError unless the injections take `precision` (configurations.PRECISIONS: bf16, fp8, fp8-attention)."""
    from ltxbench.configurations import PRECISIONS

    if precision not in PRECISIONS:
        raise UsageError(f"precision {precision!r} is not one of {', '.join(PRECISIONS)}")


def fp8_attention_for(attn, provider: str = "cuda") -> Fp8Attention:
    """fp8_attention(provider), held to the head dim of `attn` (a diffusers attention; UsageError where the backend
    cannot take it)."""
    backend = fp8_attention(provider)
    backend.require(attn.to_q.out_features // attn.heads)
    return backend


def runs_fp8_attention(backend: Fp8Attention | None, processor, attention_mask=None) -> bool:
    """Does this self-attention call run in FP8 (`backend` None: never)? Only one GPU's whole attention, unmasked,
    on the default backend: context parallelism and other backends keep their bf16 path (the CLI refuses those
    combinations)."""
    return (backend is not None and attention_mask is None and getattr(processor, "_parallel_config", None) is None
            and getattr(processor, "_attention_backend", None) is None)


def quantized(ops, per_tensor: bool, x, heads: int):
    """x (B, S, D) in e4m3 from its amax, viewed (B, S, heads, hd), and its descale: one over every batch element
    (per_tensor, as cuDNN takes them) or one per (batch, head) (as FlashAttention-3 does)."""
    batch, tokens, dim = x.shape
    if per_tensor:
        x8, descale = ops.quantize_fp8_heads(x.reshape(1, batch * tokens, dim), 1)
    else:
        x8, descale = ops.quantize_fp8_heads(x, heads)
    return x8.view(batch, tokens, heads, -1), descale


def attention(ops, backend: Fp8Attention, attn, query, key, value, eps: float, rope: dict, split: bool = False):
    """softmax(norm_q(q)ᵣ · norm_k(k)ᵣᵀ / √hd) · v in FP8 for (B, S, D) projections: (B, S, D) in query's dtype.
    `rope`: the angles as qk_rms_norm_rope_fp8 takes them (cos/sin tables, or grid and freqs), or with `split`
    LTX-2's split-RoPE tables (cos, sin) as qk_rms_norm_rope_split_fp8 takes them."""
    batch, tokens, _ = query.shape
    heads = attn.heads
    groups = 1 if backend.per_tensor else heads  # the scales' granularity: one per tensor, or per head
    wq, wk = attn.norm_q.weight, attn.norm_k.weight
    if split:
        q8, q_descale, k8, k_descale = ops.qk_rms_norm_rope_split_fp8(query, key, wq, wk, eps, rope["cos"],
                                                                      rope["sin"], groups)
    else:
        q8, q_descale, k8, k_descale = ops.qk_rms_norm_rope_fp8(query, key, wq, wk, eps, groups, **rope)
    v8, v_descale = quantized(ops, backend.per_tensor, value, heads)
    per_head = (batch, tokens, heads, -1)
    out = backend.run(q8.view(per_head), k8.view(per_head), v8, q_descale, k_descale, v_descale)
    return out.flatten(2, 3).to(query.dtype)


def attend_normed(ops, backend: Fp8Attention, heads: int, query, key, value):
    """Attention in FP8 over q and k already normalized and rotated (B, S, D) (LTX-2's split RoPE, written by its
    own kernel): q, k and v quantized from their amaxes (`quantized`); (B, S, D) in query's dtype."""
    (q8, q_descale), (k8, k_descale), (v8, v_descale) = (quantized(ops, backend.per_tensor, t, heads)
                                                         for t in (query, key, value))
    return backend.run(q8, k8, v8, q_descale, k_descale, v_descale).flatten(2, 3).to(query.dtype)
