"""CPU: the pure-torch references against float64 math and against the libraries' own modules."""

import pytest
import torch

from ltxbench.ops import eager, reference
from ltxbench.ops.accuracy import fp8_mismatch, fp8_pairs
from ltxbench.ops.registry import DTYPES, SPECS

GEN_SEED = 1234


def gen():
    return torch.Generator().manual_seed(GEN_SEED)


def f64_rms(x, eps):
    x = x.double()
    return x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps)


def test_rms_norm_matches_float64_math():
    x = torch.randn(3, 5, 83, dtype=torch.float64, generator=gen())
    w = torch.randn(83, dtype=torch.float64, generator=gen())
    torch.testing.assert_close(reference.rms_norm(x, w, 1e-6), f64_rms(x, 1e-6) * w, rtol=1e-12, atol=1e-12)


def test_layer_norm_modulate_matches_float64_math():
    x = torch.randn(2, 4, 769, dtype=torch.float64, generator=gen()) + 5
    scale, shift = torch.randn(2, 2, 1, 769, dtype=torch.float64, generator=gen()).unbind(0)
    mean = x.mean(-1, keepdim=True)
    var = ((x - mean) ** 2).mean(-1, keepdim=True)
    expected = (x - mean) / torch.sqrt(var + 1e-6) * (1 + scale) + shift
    torch.testing.assert_close(reference.layer_norm_modulate(x, scale, shift, 1e-6), expected, rtol=1e-12,
                               atol=1e-12)


def test_rms_norm_matches_torch_nn_rmsnorm():
    x = torch.randn(4, 7, 64, generator=gen())
    mod = torch.nn.RMSNorm(64, eps=1e-5)
    with torch.no_grad():
        mod.weight.copy_(torch.randn(64, generator=gen()))
    torch.testing.assert_close(reference.rms_norm(x, mod.weight, 1e-5), mod(x))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_rms_norm_cast_order_matches_llama_rmsnorm_exactly(dtype):
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    mod = LlamaRMSNorm(128, eps=1e-5).to(dtype)
    with torch.no_grad():
        mod.weight.copy_(1 + 0.1 * torch.randn(128, generator=gen()))
    x = torch.randn(3, 9, 128, generator=gen()).to(dtype)
    ours = reference.rms_norm(x, mod.weight, 1e-5, cast_before_weight=True)
    assert ours.dtype == dtype
    assert torch.equal(ours, mod(x))
    # the other casting order really is different in half precision: the flag matters
    assert not torch.equal(reference.rms_norm(x, mod.weight, 1e-5, cast_before_weight=False), mod(x))


def test_rms_norm_matches_diffusers_rmsnorm_without_and_with_half_weight():
    from diffusers.models.normalization import RMSNorm

    x = torch.randn(2, 11, 96, generator=gen()).to(torch.bfloat16)
    plain = RMSNorm(96, eps=1e-6, elementwise_affine=False)
    assert torch.equal(reference.rms_norm(x, None, 1e-6), plain(x))
    affine = RMSNorm(96, eps=1e-6, elementwise_affine=True).to(torch.bfloat16)
    with torch.no_grad():
        affine.weight.copy_(1 + 0.1 * torch.randn(96, generator=gen()))
    assert torch.equal(reference.rms_norm(x, affine.weight, 1e-6, cast_before_weight=True), affine(x))


def _tiny_ltx_block():
    from diffusers.models.transformers.transformer_ltx import LTXVideoTransformerBlock

    block = LTXVideoTransformerBlock(dim=64, num_attention_heads=2, attention_head_dim=32,
                                     cross_attention_dim=64).eval()
    with torch.no_grad():
        block.scale_shift_table.copy_(0.1 * torch.randn(6, 64, generator=gen()))
    return block


def test_rms_norm_modulate_matches_ltx_block_norm1_modulation():
    block = _tiny_ltx_block()
    h = torch.randn(2, 10, 64, generator=gen())
    temb = 0.1 * torch.randn(2, 1, 6 * 64, generator=gen())
    ada = block.scale_shift_table[None, None] + temb.reshape(2, 1, 6, 64)
    shift_msa, scale_msa = ada[:, :, 0], ada[:, :, 1]
    expected = block.norm1(h) * (1 + scale_msa) + shift_msa
    torch.testing.assert_close(reference.rms_norm_modulate(h, None, scale_msa, shift_msa, block.norm1.eps),
                               expected)


def test_add_rms_norm_modulate_matches_ltx_attn2_residual_then_norm2():
    block = _tiny_ltx_block()
    h, attn2_out = torch.randn(2, 2, 10, 64, generator=gen()).unbind(0)
    shift_mlp, scale_mlp = (0.1 * torch.randn(2, 2, 1, 64, generator=gen())).unbind(0)
    h_new = h + attn2_out
    expected = block.norm2(h_new) * (1 + scale_mlp) + shift_mlp
    out, h_out = reference.add_rms_norm_modulate(h, attn2_out, None, scale_mlp, shift_mlp, 1e-6)
    torch.testing.assert_close(h_out, h_new)
    torch.testing.assert_close(out, expected)


def test_layer_norm_modulate_matches_ltx_final_layer_norm():
    norm_out = torch.nn.LayerNorm(64, eps=1e-6, elementwise_affine=False)
    x = torch.randn(2, 10, 64, generator=gen()) * 3 + 2
    shift, scale = (0.1 * torch.randn(2, 2, 1, 64, generator=gen())).unbind(0)
    torch.testing.assert_close(reference.layer_norm_modulate(x, scale, shift, 1e-6),
                               norm_out(x) * (1 + scale) + shift)


def test_fused_add_rms_norm_matches_llama_decoder_pattern():
    x, res = torch.randn(2, 3, 16, 256, generator=gen()).to(torch.bfloat16).unbind(0)
    w = (1 + 0.1 * torch.randn(256, generator=gen())).to(torch.bfloat16)
    out, h = reference.fused_add_rms_norm(x, res, w, 1e-5, cast_before_weight=True)
    e_out, e_h = eager.llama_add_rms_norm(x, res, w, 1e-5)
    assert torch.equal(h, e_h)
    assert torch.equal(out, e_out)


@pytest.mark.parametrize("name", sorted(SPECS))
@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_reference_within_tolerance_of_float64_for_every_spec_and_variant(name, dtype):
    """The reference in a low dtype stays within the spec's tolerance of its own float64 evaluation."""
    spec = SPECS[name]
    for variant in spec.variants:
        inputs = spec.make_inputs(spec.test_shapes[1], DTYPES[dtype], "cpu", gen(), variant)
        outs = spec.outputs(spec.reference, inputs)  # the outputs, then the inputs written in place (a KV cache)
        outs64 = spec.outputs(spec.reference, _as_f64(inputs))
        assert len(outs) == spec.n_outputs + len(spec.writes)
        atol, rtol = spec.tolerance(DTYPES[dtype])
        for o, o64 in fp8_pairs(outs, outs64):
            if isinstance(o64, tuple):  # an FP8 output and its scale; float64 keeps h' unrounded
                why = fp8_mismatch(*o, *o64, (atol, rtol))[1]
                assert why is None, f"{variant}: {why}"
                continue
            assert o.dtype == DTYPES[dtype] and o64.shape == o.shape
            torch.testing.assert_close(o.double(), o64, atol=atol, rtol=rtol)


@pytest.mark.parametrize("dim", [2048, 4096])
def test_rope_3d_reference_matches_diffusers_ltx_rotary_embedding(dim):
    """2B (D % 6 = 2) and 13B (D % 6 = 4) inner dims; T2V grid and condition-pipeline video_coords."""
    from diffusers.models.transformers.transformer_ltx import LTXVideoRotaryPosEmbed, apply_rotary_emb

    rope = LTXVideoRotaryPosEmbed(dim, 20, 2048, 2048, 1, 1, 10000.0)
    h = torch.empty(2, 3 * 4 * 6, dim)
    coords = torch.rand(2, 3, 72, generator=gen()) * torch.tensor([[[20.0], [2048.0], [2048.0]]])
    for kwargs in ({"rope_interpolation_scale": (8 / 25, 32, 32)}, {"video_coords": coords}):
        cos, sin = rope(h, 3, 4, 6, **kwargs)
        grid = reference.ltx_rope_grid(rope, 2, 3, 4, 6, **kwargs)
        own_cos, own_sin = reference.ltx_cos_sin(grid, reference.ltx_rope_freqs(dim), dim)
        assert torch.equal(own_cos, cos) and torch.equal(own_sin, sin)
        q, k = torch.randn(2, 2, 72, dim, generator=gen()).unbind(0)
        for got in (reference.rope_3d(q, k, cos, sin),
                    reference.rope_3d(q, k, grid=grid, freqs=reference.ltx_rope_freqs(dim))):
            torch.testing.assert_close(got[0], apply_rotary_emb(q, (cos, sin)))
            torch.testing.assert_close(got[1], apply_rotary_emb(k, (cos, sin)))


def test_qk_rms_norm_rope_reference_matches_ltx_attention_norms():
    from diffusers.models.transformers.transformer_ltx import LTXAttention, apply_rotary_emb

    attn = LTXAttention(query_dim=96, heads=2, kv_heads=2, dim_head=48)
    with torch.no_grad():
        attn.norm_q.weight.copy_(1 + 0.1 * torch.randn(96, generator=gen()))
        attn.norm_k.weight.copy_(1 + 0.1 * torch.randn(96, generator=gen()))
    q, k = torch.randn(2, 2, 10, 96, generator=gen()).unbind(0)
    grid = torch.rand(2, 10, 3, generator=gen())
    cos, sin = reference.ltx_cos_sin(grid, reference.ltx_rope_freqs(96), 96)
    expected_q = apply_rotary_emb(attn.norm_q(q), (cos, sin))
    expected_k = apply_rotary_emb(attn.norm_k(k), (cos, sin))
    got_q, got_k = reference.qk_rms_norm_rope(q, k, attn.norm_q.weight, attn.norm_k.weight, attn.norm_q.eps,
                                              grid=grid, freqs=reference.ltx_rope_freqs(96))
    torch.testing.assert_close(got_q, expected_q)
    torch.testing.assert_close(got_k, expected_k)


def test_rope_1d_reference_matches_transformers_llama_rotary():
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb

    cfg = LlamaConfig(hidden_size=256, num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    rotary = LlamaRotaryEmbedding(cfg)
    positions = torch.arange(5, 12)[None]  # a KV-cache offset of 5
    cos, sin = rotary(torch.empty(1, dtype=torch.float32), positions)
    q, k = torch.randn(1, 4, 7, 64, generator=gen()), torch.randn(1, 2, 7, 64, generator=gen())
    e_q, e_k = apply_rotary_pos_emb(q, k, cos, sin)
    angles = torch.arange(64, dtype=torch.float32)[:, None] * rotary.inv_freq[None, :]
    got_q, got_k = reference.rope_1d(q, k, angles.cos(), angles.sin(), positions)
    torch.testing.assert_close(got_q, e_q)
    torch.testing.assert_close(got_k, e_k)


def test_activations_match_library_modules():
    from diffusers.models.activations import GEGLU

    x = torch.randn(3, 7, 64, generator=gen())
    geglu = GEGLU(64, 32)
    with torch.no_grad():  # identity projection: the module's output is its gating of x itself
        geglu.proj.weight.copy_(torch.eye(64))
        geglu.proj.bias.zero_()
    torch.testing.assert_close(reference.geglu(x, gate_half=1), geglu(x))
    torch.testing.assert_close(reference.gelu_tanh(x), torch.nn.GELU(approximate="tanh")(x))
    from transformers.activations import ACT2FN

    gate, up = x.chunk(2, dim=-1)
    torch.testing.assert_close(reference.swiglu(x, gate_half=0), ACT2FN["silu"](gate) * up)
    assert not torch.allclose(reference.swiglu(x, gate_half=1), reference.swiglu(x, gate_half=0))


def _as_f64(inputs):
    return {k: v.double() if isinstance(v, torch.Tensor) and v.is_floating_point() else v for k, v in inputs.items()}


@pytest.mark.parametrize("name", sorted(SPECS))
def test_reference_equals_the_host_library_formula_in_float64_for_every_variant(name):
    """The GPU tests hold every kernel to the reference; eager (the host library's formula: diffusers, transformers,
    torch) only sizes their error budget. So the reference itself must be the library's math, for every variant: in
    float64 both are exact up to rounding (largest difference seen 5e-7), while a wrong formula, a swapped gate half
    or a dropped scale differs by O(0.01-1). (eager.hf_rope_1d's interleaved layout is built from the reference and
    is checked against transformers separately, test_rope_1d_reference_matches_transformers_llama_rotary.)"""
    spec = SPECS[name]
    shapes = (spec.test_shapes[0], spec.test_shapes[len(spec.test_shapes) // 2], spec.test_shapes[-1])
    for i, variant in enumerate(spec.variants):
        for shape in shapes:
            inputs = _as_f64(spec.make_inputs(shape, torch.float32, "cpu", torch.Generator().manual_seed(i), variant))
            refs, libs = spec.outputs(spec.reference, inputs), spec.outputs(spec.baselines["eager"], inputs)
            assert len(refs) == len(libs)
            for e, r in fp8_pairs(libs, refs):
                if isinstance(r, tuple):  # an FP8 output and its scale: the same values, but for fp32 ties
                    why = fp8_mismatch(*e, *r)[1]
                    assert why is None, f"{variant} {shape}: {why}"
                    continue
                torch.testing.assert_close(r, e, atol=1e-6, rtol=1e-6,
                                           msg=lambda m, v=variant, s=shape: f"{v} {s}: {m}")
