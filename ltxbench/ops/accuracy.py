"""How an op's output is judged against its fp32-math reference: the (atol, rtol) of each tolerance class, and the
contract of the FP8 outputs (a q tensor and its per-row scale judged together). Read by the tests and `bench micro`
through each KernelSpec (registry.py)."""

from __future__ import annotations

import math

import torch

# (atol, rtol) against an fp32-math reference (docs/kernels.md#accuracy).
TOLERANCES = {
    "elementwise": {torch.float32: (1e-5, 1.3e-6), torch.float16: (1e-3, 1e-3), torch.bfloat16: (1e-2, 1.6e-2)},
    "reduction": {torch.float32: (1e-4, 1e-4), torch.float16: (1e-3, 1e-3), torch.bfloat16: (2e-2, 1.6e-2)},
}
# The FP8 ops: their q, x_scale pairs are judged by fp8_mismatch, any other output (h') as a reduction's.
TOLERANCES["fp8"] = TOLERANCES["reduction"]

FP8_SCALE_RTOL = 1e-5           # x_scale is amax / 448 in fp32: the kernel's amax differs by fp32 ulps only
FP8_MISMATCH_FRACTION = 1e-3    # of the q values, that may differ from the reference's at all


def fp8_mismatch(q, x_scale, q_ref, x_scale_ref, tolerance: tuple[float, float] | None = None):
    """(max |q·x_scale − q_ref·x_scale_ref|, why an FP8 output and its per-row scale (or per-(batch, head) descale:
    x_scale (B, heads) for q (B, S, D)) disagree with the reference's, or None). The kernel's contract (tolerance
    None): (1) every scale within FP8_SCALE_RTOL of the reference's; (2) every dequantized value within one e4m3
    step of the reference's (|q_ref| / 8, 2^-9 in the subnormal range, times the scale: where the kernel's fp32 y
    differs from the reference's by an ulp, it may round across an e4m3 rounding boundary); (3) at most
    FP8_MISMATCH_FRACTION of the values different at all. fp32 noise moves ~1e-6 of the values; y rounded to bf16
    before the quantization ~2% of them (fp16: ~0.3%), a 1% different scale ~11%: (3) fails them where (2) cannot.
    With tolerance (atol, rtol), for what computes y another way (the unfused baselines, which round y to the model
    dtype; float64, which keeps h' unrounded): scales within rtol, values within one step plus atol + rtol·|value|,
    any number of them moved."""
    if q.dtype != torch.float8_e4m3fn or x_scale.dtype != torch.float32:
        return math.nan, f"q must be float8_e4m3fn and x_scale float32, got {q.dtype} and {x_scale.dtype}"
    if q.shape != q_ref.shape or x_scale.shape != x_scale_ref.shape:
        return math.nan, (f"shapes {tuple(q.shape)}, {tuple(x_scale.shape)}, expected {tuple(q_ref.shape)}, "
                          f"{tuple(x_scale_ref.shape)}")
    atol, rtol = tolerance or (0.0, 0.0)
    scale_rtol = rtol if tolerance else FP8_SCALE_RTOL
    s, s_ref = x_scale.float(), x_scale_ref.float()
    v, v_ref = q.float(), q_ref.float()
    if q.dim() == 3 and x_scale.dim() == 2:  # one scale per (batch, head): q (B, S, heads · hd)
        b, t, d = q.shape
        heads = x_scale.shape[1]
        v, v_ref = v.reshape(b, t, heads, d // heads), v_ref.reshape(b, t, heads, d // heads)
        s, s_ref = s[:, None, :, None], s_ref[:, None, :, None]
    deq, deq_ref = v * s, v_ref * s_ref
    diff = (deq - deq_ref).abs()
    err = diff.max().item() if diff.numel() else 0.0
    scale_off = ((s - s_ref).abs() > scale_rtol * s_ref.abs()) | s.isnan()
    if scale_off.any():
        worst = ((s - s_ref).abs() / s_ref.abs()).nan_to_num(math.inf).max().item()
        return err, f"{int(scale_off.sum())} x_scale values off by up to {worst:.2g} (rtol {scale_rtol:g})"
    step = v_ref.abs().mul(2.0 ** -3).clamp(min=2.0 ** -9) * s_ref
    far = (diff > step * (1 + 1e-3) + atol + (rtol + 2 * scale_rtol) * deq_ref.abs()) | deq.isnan()
    if far.any():
        return err, f"{int(far.sum())} of {q.numel()} values more than one e4m3 step from the reference"
    moved = int((v != v_ref).sum())
    if not tolerance and moved > FP8_MISMATCH_FRACTION * q.numel():
        return err, f"{moved} of {q.numel()} values differ from the reference (at most {FP8_MISMATCH_FRACTION:g} may)"
    return err, None


def fp8_pairs(outs, refs):
    """outs zipped with refs, an FP8 output and the scale after it taken together: yields (out, ref), or
    ((q, x_scale), (q_ref, x_scale_ref)) where refs has an FP8 tensor."""
    i = 0
    while i < len(refs):
        if refs[i].dtype == torch.float8_e4m3fn and i + 1 < len(refs) and i + 1 < len(outs):
            yield (outs[i], outs[i + 1]), (refs[i], refs[i + 1])
            i += 2
        else:
            yield outs[i], refs[i]
            i += 1
