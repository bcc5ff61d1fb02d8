"""CPU: the pure-torch references against float64 math and against the libraries' own modules."""

import pytest
import torch

from ltxbench.ops import eager, reference
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
        inputs = spec.make_inputs((2, 5, 83), DTYPES[dtype], "cpu", gen(), variant)
        out = spec.reference(**inputs)
        out64 = spec.reference(**{k: v.double() if isinstance(v, torch.Tensor) else v for k, v in inputs.items()})
        outs, outs64 = (out, out64) if isinstance(out, tuple) else ((out,), (out64,))
        assert len(outs) == spec.n_outputs
        atol, rtol = spec.tolerance(DTYPES[dtype])
        for o, o64 in zip(outs, outs64, strict=True):
            assert o.dtype == DTYPES[dtype] and o.shape == (2, 5, 83)
            torch.testing.assert_close(o.double(), o64, atol=atol, rtol=rtol)
