"""Random inputs of the FP8 ops (registry_fp8.py), built on the 16-bit ops' inputs (inputs.py)."""

from __future__ import annotations

from ltxbench.ops.inputs import _randn, inputs_qk_norm_rope, inputs_qk_rms_norm_rope_split, split_rope_heads


def fp8_attention_heads(d: int) -> int:
    """Heads for the per-head FP8 ops' test inputs: head dim 64 where it divides D (FlashAttention-3's), else 14, 22,
    4 or 2 (heads that 16-bit vectors do not divide: the pair / scalar paths), else one head."""
    return next((d // hd for hd in (64, 14, 22, 4, 2) if d % hd == 0), 1) if d else 1


def inputs_qk_norm_rope_fp8(shape, dtype, device, gen, variant):
    """qk_rms_norm_rope's inputs, heads after eps (the op's argument order); "wan": Wan's tables one head wide with
    one scale per tensor (heads 1), as cuDNN's FP8 attention takes them."""
    base = inputs_qk_norm_rope(shape, dtype, device, gen, variant)
    first = {k: base.pop(k) for k in ("q", "k", "wq", "wk", "eps")}
    return {**first, "heads": 1 if variant == "wan" else fp8_attention_heads(shape[2]), **base}


def inputs_qk_norm_rope_split_fp8(shape, dtype, device, gen, variant):
    """qk_rms_norm_rope_split's inputs and the scales' groups: one (per tensor, cuDNN's) for "video", else one per
    head."""
    return {**inputs_qk_rms_norm_rope_split(shape, dtype, device, gen, variant),
            "groups": 1 if variant == "video" else split_rope_heads(shape[2])}


def inputs_quantize_heads(shape, dtype, device, gen, variant):
    """The value input of FP8 attention: "slices", v as a column slice of the fused q/k/v projection's output (its
    rows strided); "outliers", one head in eight eight times larger (its scale apart from the others')."""
    b, s, d = shape
    heads = fp8_attention_heads(d)
    if variant == "slices":
        x = _randn((b, s, 3 * d), dtype, device, gen)[..., 2 * d:]
    else:
        x = _randn(shape, dtype, device, gen)
        if variant == "outliers" and d:
            x.view(b, s, heads, d // heads)[:, :, ::8] *= 8
    return {"x": x, "heads": heads}


def inputs_quantize(shape, dtype, device, gen, variant):
    """Unit activations; "outliers": one channel in 64 fifty times larger (LLM and DiT activations have such
    channels), which leaves most values of a row in e4m3's subnormal range."""
    b, s, d = shape
    x = _randn(shape, dtype, device, gen)
    if variant == "outliers":
        x[..., ::64] *= 50
    return {"x": x}
