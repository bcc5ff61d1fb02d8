"""One KernelSpec per op: the single description read by the tests, `bench micro`, `kernels` and injection.

A spec names the op, how to build its inputs for a shape and variant (inputs.py), which shapes to test and to
benchmark (named after the models that produce them), its tolerances, the minimum bytes it must move,
and the host-library formulas it replaces (its baselines).
"""

from __future__ import annotations

from ltxbench.ops import eager
from ltxbench.ops.inputs import (
    KV_VARIANTS,
    PACK_VARIANTS,
    SPLIT_ROPE_VARIANTS,
    inputs_add_rms_mod,
    inputs_fused_add,
    inputs_gated_residual,
    inputs_geglu,
    inputs_gelu,
    inputs_layer_mod,
    inputs_qk_norm_rope,
    inputs_qk_norm_rope_kv,
    inputs_qk_norm_rope_pack,
    inputs_qk_rms_norm_rope_split,
    inputs_qk_rms_norm_rope_split_pack,
    inputs_rms_mod,
    inputs_rms_norm,
    inputs_rms_norm_rope_split,
    inputs_rope_1d,
    inputs_rope_3d,
    inputs_swiglu,
)
from ltxbench.ops.inputs_matmul import (
    DECODE_VARIANTS,
    LINEAR_OUT,
    XATTN_VARIANTS,
    inputs_cross_attention,
    inputs_decode_attention,
    inputs_linear,
)
from ltxbench.ops.registry_decode import DECODE_SPECS
from ltxbench.ops.registry_fp8 import FP8_ATTENTION_SPECS, FP8_SPECS
from ltxbench.ops.shapes import (
    DECODE_ATTENTION_SHAPES,
    DECODE_TEST_SHAPES,
    GEMV_TEST_SHAPES,
    LLM_DECODE_LINEAR_SHAPES,
    LLM_MLP_SHAPES,
    LLM_SHAPES,
    LTX2_CROSS_SHAPES,
    LTX2_SELF_SHAPES,
    LTX2_STREAM_SHAPES,
    LTX2_ULYSSES_SHAPES,
    LTX_FFN_SHAPES,
    LTX_LINEAR_SHAPES,
    LTX_RING_SHAPES,
    LTX_SHAPES,
    LTX_ULYSSES_SHAPES,
    ROPE_TEST_SHAPES,
    SEED_SHAPES,
    SPLIT_ROPE_TEST_SHAPES,
    TEST_SHAPES,
    WAN_SHAPES,
    XATTN_TEST_SHAPES,
)
from ltxbench.ops.spec import DTYPES, KernelSpec, nbytes, projection_bytes  # noqa: F401  (DTYPES: public here, beside SPECS)

# float32 scale/shift/gate over 16-bit rows: one row a block, two pairs a thread (cuda/norm_f32_modulation.cu)
F32_MODULATION_WIDTH = {"wan-f32": 8192, "wan-f32-per-token": 8192}


def _drop(*names):
    """Adapt a baseline to the op's kwargs by dropping the ones the library formula doesn't take."""
    def wrap(fn):
        return lambda **kw: fn(**{k: v for k, v in kw.items() if k not in names})
    return wrap


def _or_gemma(gemma, fn):
    """A norm baseline: Gemma's own formula for the "gemma" variant's inputs (weight_offset), else `fn` on the rest."""
    plain = _drop("cast_before_weight", "weight_offset")(fn)
    return lambda **kw: gemma(**kw) if kw.get("weight_offset") else plain(**kw)


def _torch_with_offset(fn):
    """F.rms_norm given the offset weight in fp32 (1 + weight, unrounded; torch's unfused path then)."""
    def run(**kw):
        offset = kw.pop("weight_offset", 0.0)
        if offset:
            kw["weight"] = offset + kw["weight"].float()
        return _drop("cast_before_weight")(fn)(**kw)
    return run


SPECS: dict[str, KernelSpec] = {s.name: s for s in (
    KernelSpec(
        name="rms_norm", summary="x * rsqrt(mean(x²) + eps) [* (weight_offset + weight)]",
        make_inputs=inputs_rms_norm, variants=("no-weight", "weight", "weight-llama-cast", "gemma"), n_outputs=1,
        baselines={"eager": _or_gemma(eager.gemma_rms_norm, eager.diffusers_rms_norm),
                   "F.rms_norm": _torch_with_offset(eager.torch_rms_norm)},
        aliases=("rmsnorm", "rms", "rmsnorm_noweight"),
        bench_shapes={**SEED_SHAPES, **LTX_SHAPES, **LLM_SHAPES},
        inject_targets=("diffusers RMSNorm", "torch.nn.RMSNorm", "LlamaRMSNorm", "Qwen3 q_norm/k_norm",
                        "Gemma3RMSNorm (1 + weight)"),
    ),
    KernelSpec(
        name="fused_add_rms_norm", summary="h = residual + x; (rms_norm(h) * weight, h)",
        make_inputs=inputs_fused_add, variants=("torch-order", "llama-cast", "gemma"), n_outputs=2,
        baselines={"eager": _or_gemma(eager.gemma_add_rms_norm, eager.llama_add_rms_norm),
                   "F.rms_norm": _torch_with_offset(eager.torch_add_rms_norm)},
        aliases=("rmsnorm_residual", "add_rmsnorm", "fused_add_rmsnorm"),
        bench_shapes={**LLM_SHAPES, **SEED_SHAPES},
        inject_targets=("LlamaDecoderLayer post_attention_layernorm",
                        "Gemma3DecoderLayer residual + pre_feedforward_layernorm"),
    ),
    KernelSpec(
        name="rms_norm_modulate", summary="rms_norm(x) [* weight] * (1 + scale) + shift",
        make_inputs=inputs_rms_mod, variants=("per-batch", "per-token", "ltx-unbind", "weight"), n_outputs=1,
        baselines={"eager": eager.ltx_rms_norm_modulate},
        aliases=("adaln_rmsnorm", "rmsnorm_modulate"),
        bench_shapes={**SEED_SHAPES, **LTX_SHAPES, **LTX2_STREAM_SHAPES},
        inject_targets=("LTXVideoTransformerBlock norm1 + modulation",),
    ),
    KernelSpec(
        name="layer_norm_modulate", summary="layer_norm(x, no affine) * (1 + scale) + shift",
        make_inputs=inputs_layer_mod, variants=("per-batch", "per-token", "ltx-unbind", "wan-f32", "wan-f32-per-token"),
        n_outputs=1,
        baselines={"eager": eager.ltx_layer_norm_modulate},
        aliases=("adaln_layernorm", "layernorm_modulate"),
        bench_shapes={**SEED_SHAPES, **LTX_SHAPES, **LTX2_STREAM_SHAPES, **WAN_SHAPES},
        inject_targets=("LTXVideoTransformer3DModel norm_out + modulation",),
        max_width=F32_MODULATION_WIDTH,
    ),
    KernelSpec(
        name="gated_residual", summary="h + a * gate",
        make_inputs=inputs_gated_residual, variants=("per-batch", "per-token", "wan-f32", "wan-f32-per-token"),
        n_outputs=1,
        baselines={"eager": eager.ltx_gated_residual}, kind="elementwise",
        aliases=("adaln_zero", "gated_add"),
        bench_shapes={**SEED_SHAPES, **LTX_SHAPES, **LTX2_STREAM_SHAPES, **WAN_SHAPES},
        inject_targets=("LTXVideoTransformerBlock attn1 residual",),
        max_width=F32_MODULATION_WIDTH,
    ),
    KernelSpec(
        name="add_rms_norm_modulate", summary="h' = h + a [* gate]; (rms_norm(h') * (1 + scale) + shift, h')",
        make_inputs=inputs_add_rms_mod, variants=("gate", "no-gate"), n_outputs=2,
        baselines={"eager": eager.ltx_add_rms_norm_modulate},
        aliases=("add_adaln_rmsnorm",),
        bench_shapes={**SEED_SHAPES, **LTX_SHAPES, **LTX2_STREAM_SHAPES},
        inject_targets=("LTXVideoTransformerBlock attn2 residual + norm2", "ff residual + next norm1"),
    ),
    KernelSpec(
        name="rope_3d", summary="LTX 3-D RoPE of q, k over the inner dim (cos/sin tables or grid + freqs)",
        make_inputs=inputs_rope_3d, variants=("tables", "coords"), n_outputs=2,
        baselines={"eager": eager.ltx_rope_3d}, kind="elementwise",
        aliases=("rope3d", "ltx_rope"), test_shapes=ROPE_TEST_SHAPES,
        bench_shapes={**LTX_SHAPES},
        inject_targets=("LTXAttention apply_rotary_emb (q, k)",),
    ),
    KernelSpec(
        name="qk_rms_norm_rope", summary="rope_3d(rms_norm(q) * wq, rms_norm(k) * wk)",
        make_inputs=inputs_qk_norm_rope, variants=("tables", "coords", "wan"), n_outputs=2,
        baselines={"eager": eager.ltx_qk_rms_norm_rope},
        aliases=("qk_norm_rope", "ltx_qk_norm_rope"), test_shapes=ROPE_TEST_SHAPES,
        bench_shapes={**LTX_SHAPES, **WAN_SHAPES},
        inject_targets=("LTXAttention norm_q/norm_k + apply_rotary_emb",
                        "WanAttnProcessor (attn1) norm_q/norm_k + its rotary embedding, tables one head wide"),
    ),
    KernelSpec(
        name="qk_rms_norm_rope_pack",
        summary="qk_rms_norm_rope, q/k/v written as a Ulysses send buffer (parts, B, S, 3, D / parts)",
        make_inputs=inputs_qk_norm_rope_pack, variants=PACK_VARIANTS, n_outputs=1,
        baselines={"eager": eager.ltx_qk_rms_norm_rope_pack},
        aliases=("qkv_pack", "ulysses_pack"), test_shapes=ROPE_TEST_SHAPES,
        bench_shapes={**LTX_ULYSSES_SHAPES},
        inject_targets=("LTXAttention norm_q/norm_k + apply_rotary_emb + the Ulysses all-to-all's q/k/v copy",),
        written=lambda inp: 3 * nbytes(inp["q"]),
    ),
    KernelSpec(
        name="qk_rms_norm_rope_kv",
        summary="qk_rms_norm_rope, k and v written together per token (B, S, 2, D): a ring all-gather's send buffer",
        make_inputs=inputs_qk_norm_rope_kv, variants=KV_VARIANTS, n_outputs=2,
        baselines={"eager": eager.ltx_qk_rms_norm_rope_kv},
        aliases=("kv_pack", "ring_pack"), test_shapes=ROPE_TEST_SHAPES,
        bench_shapes={**LTX_RING_SHAPES},
        inject_targets=("LTXAttention norm_q/norm_k + apply_rotary_emb + the ring all-gather's k/v copy",),
        written=lambda inp: 3 * nbytes(inp["q"]),
    ),
    KernelSpec(
        name="rms_norm_rope_split",
        summary="split RoPE per head (cos/sin (B|1, H, S, hd/2)) of rms_norm(x) * weight over all heads",
        make_inputs=inputs_rms_norm_rope_split, variants=SPLIT_ROPE_VARIANTS, n_outputs=1,
        baselines={"eager": eager.ltx2_rms_norm_rope_split},
        aliases=("ltx2_norm_rope", "norm_rope_split"), test_shapes=SPLIT_ROPE_TEST_SHAPES,
        bench_shapes={**LTX2_CROSS_SHAPES},
        inject_targets=("LTX2Attention norm_q/norm_k + apply_split_rotary_emb (audio/video cross-attentions)",),
    ),
    KernelSpec(
        name="qk_rms_norm_rope_split", summary="rms_norm_rope_split of q and k, one shared table",
        make_inputs=inputs_qk_rms_norm_rope_split, variants=SPLIT_ROPE_VARIANTS, n_outputs=2,
        baselines={"eager": eager.ltx2_qk_rms_norm_rope_split},
        aliases=("ltx2_qk_norm_rope", "qk_norm_rope_split"), test_shapes=SPLIT_ROPE_TEST_SHAPES,
        bench_shapes={**LTX2_SELF_SHAPES},
        inject_targets=("LTX2Attention norm_q/norm_k + apply_split_rotary_emb (self-attentions)",),
    ),
    KernelSpec(
        name="qk_rms_norm_rope_split_pack",
        summary="qk_rms_norm_rope_split, q/k/v written as a Ulysses send buffer (parts, B, S, 3, D / parts)",
        make_inputs=inputs_qk_rms_norm_rope_split_pack, variants=SPLIT_ROPE_VARIANTS, n_outputs=1,
        baselines={"eager": eager.ltx2_qk_rms_norm_rope_split_pack},
        aliases=("ltx2_qkv_pack",), test_shapes=SPLIT_ROPE_TEST_SHAPES,
        bench_shapes={**LTX2_ULYSSES_SHAPES},
        inject_targets=("LTX2Attention norm_q/norm_k + apply_split_rotary_emb + the Ulysses all-to-all's q/k/v copy",),
        written=lambda inp: 3 * nbytes(inp["q"]),
    ),
    KernelSpec(
        name="rope_1d", summary="LLM RoPE of q, k (neox or interleaved) from cos/sin tables at positions",
        make_inputs=inputs_rope_1d, variants=("neox", "interleaved", "partial-rot", "per-token"), n_outputs=2,
        baselines={"eager": eager.hf_rope_1d}, kind="elementwise",
        aliases=("rope", "rope1d", "rotary"), test_shapes=ROPE_TEST_SHAPES,
        # + the large RoPE shape: LTX-2B 161 frames with CFG (2 x 8064 tokens, 2048 wide; here 16 x 128 heads)
        bench_shapes={"llama3-8b-prefill": (1, 4096, 4096), "llama3-8b-decode": (1, 1, 4096),
                      "ltx-size-2x8064x2048": (2, 8064, 2048)},
        inject_targets=("LlamaAttention apply_rotary_pos_emb",),
        written=lambda inp: nbytes(inp["q"]) + nbytes(inp["k"]),
    ),
    KernelSpec(
        name="gelu_tanh", summary="0.5 x (1 + tanh(√(2/π) (x + 0.044715 x³)))",
        make_inputs=inputs_gelu, variants=("plain",), n_outputs=1,
        baselines={"eager": eager.diffusers_gelu_tanh}, kind="elementwise",
        aliases=("gelu", "gelu_approx"), bench_shapes={**LTX_FFN_SHAPES},
        inject_targets=("LTX FeedForward GELU(tanh)",),
    ),
    KernelSpec(
        name="geglu", summary="value * gelu(gate), [value | gate] halves (gate_half selects)",
        make_inputs=inputs_geglu, variants=("diffusers", "tanh", "gate-first"), n_outputs=1,
        baselines={"eager": eager.diffusers_geglu}, kind="elementwise",
        aliases=("gelu_and_mul",), bench_shapes={**LTX_FFN_SHAPES},
        inject_targets=("diffusers GEGLU (SD 1.x/2.x/SDXL)",),
        written=lambda inp: nbytes(inp["x"]) // 2,
    ),
    KernelSpec(
        name="swiglu", summary="value * silu(gate), [gate | up] halves (gate_half selects)",
        make_inputs=inputs_swiglu, variants=("gate-first", "gate-second"), n_outputs=1,
        baselines={"eager": eager.llama_swiglu}, kind="elementwise",
        aliases=("silu_and_mul", "swiglu_fused"), bench_shapes={**LLM_MLP_SHAPES},
        inject_targets=("LlamaMLP act(gate) * up",),
        written=lambda inp: nbytes(inp["x"]) // 2,
    ),
    KernelSpec(
        name="cross_attention", summary="softmax(q kᵀ / √hd + mask) v, q (B, S, H, hd) over a short k, v",
        make_inputs=inputs_cross_attention, variants=tuple(XATTN_VARIANTS), n_outputs=1,
        baselines={"eager": eager.sdpa_cross_attention},
        aliases=("xattn", "attn2"), test_shapes=XATTN_TEST_SHAPES,
        bench_shapes={**LTX_SHAPES},
        inject_targets=("LTXAttention attn2 (text cross-attention)",),
        written=lambda inp: nbytes(inp["q"]),
    ),
    KernelSpec(
        name="decode_attention",
        summary="softmax(q kᵀ / √hd + mask) v: a decode step's grouped query heads over the key/value cache",
        make_inputs=inputs_decode_attention, variants=tuple(DECODE_VARIANTS), n_outputs=1,
        baselines={"eager": eager.sdpa_decode_attention},
        aliases=("decode_attn", "gqa_decode"), test_shapes=DECODE_TEST_SHAPES,
        bench_shapes={**DECODE_ATTENTION_SHAPES},
        inject_targets=("an LLM decode step's attention over its cache (Llama, Mistral, Qwen, Gemma 3)",),
        written=lambda inp: nbytes(inp["q"]),
    ),
    KernelSpec(
        name="linear",
        summary="act(x @ weight.T + bias) [+ residual]: cuBLASLt, algorithm chosen by timing; <= 4 rows: gemv.cu",
        make_inputs=inputs_linear, variants=tuple(LINEAR_OUT), n_outputs=1,
        baselines={"eager": eager.torch_linear},
        aliases=("gemm", "matmul_bias", "linear_gelu"),
        test_shapes=TEST_SHAPES + GEMV_TEST_SHAPES,
        bench_shapes={**LTX_LINEAR_SHAPES, **LLM_DECODE_LINEAR_SHAPES},
        inject_targets=("LTX attention projections (qkv, q, out)", "LTX FeedForward up + GELU-tanh, down",
                        "an LLM decode step's projections (up to 4 rows: gemv.cu)"),
        written=projection_bytes,
    ),
)}

SPECS.update({s.name: s for s in FP8_SPECS + FP8_ATTENTION_SPECS + DECODE_SPECS})

ALIASES = {alias: spec.name for spec in SPECS.values() for alias in spec.aliases}


def get_spec(name: str) -> KernelSpec:
    """Look a kernel up by its name or one of the seed's names (`rmsnorm`, `rmsnorm_residual`, ...)."""
    key = ALIASES.get(name, name)
    if key not in SPECS:
        known = ", ".join(sorted([*SPECS, *ALIASES]))
        raise KeyError(f"unknown kernel {name!r}; known: {known}")
    return SPECS[key]
