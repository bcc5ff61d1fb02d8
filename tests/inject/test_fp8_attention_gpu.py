"""--precision fp8-attention on the GPU (Hopper with FlashAttention-3 installed; skipped otherwise): FP8 attention on
our per-head FP8 inputs against float64 attention at LTX-2B's head dim and realistic logits, eager and compiled;
and LTX-2B's blocks with FP8 attention within the FP8 gate of bf16, equal to the reference provider's FP8 path with
FlashAttention-3 in both (our kernels are what differs)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from tests.helpers import ltx_2b_two_blocks

pytestmark = pytest.mark.gpu


def _flash_attention_3():
    if torch.cuda.get_device_capability() < (9, 0):  # the gpu marker skips where no GPU is visible
        pytest.skip("needs a GPU with FP8 tensor cores (compute capability 9.0+)")
    return pytest.importorskip("flash_attn_interface", reason="FlashAttention-3 (hopper/ build) not installed")


def _cosine_rel_l2(a, b):
    a, b = a.flatten().double(), b.flatten().double()
    return F.cosine_similarity(a, b, dim=0).item(), ((a - b).norm() / b.norm()).item()


def _projections(batch, tokens, heads, head_dim, gen):
    """q/k/v as the fused projection leaves them (column slices of one (B, S, 3D) tensor) with a direction shared by
    the tokens of each head, so that (with _Attn's norm weights) logits reach 10-20, as in trained attention."""
    d = heads * head_dim
    shared = torch.randn(1, 1, 3 * d, device="cuda", generator=gen)
    qkv = (torch.randn(batch, tokens, 3 * d, device="cuda", generator=gen) + 2 * shared).bfloat16()
    return qkv[..., :d], qkv[..., d:2 * d], 4 * qkv[..., 2 * d:]


class _Attn:  # what fp8_attention.attention reads of a diffusers LTXAttention
    def __init__(self, heads, d, gen):
        self.heads = heads
        self.norm_q = torch.nn.RMSNorm(d, eps=1e-6, device="cuda", dtype=torch.bfloat16)
        self.norm_k = torch.nn.RMSNorm(d, eps=1e-6, device="cuda", dtype=torch.bfloat16)
        with torch.no_grad():
            self.norm_q.weight.copy_(2.0 + 0.3 * torch.randn(d, device="cuda", generator=gen))
            self.norm_k.weight.copy_(1.5 + 0.2 * torch.randn(d, device="cuda", generator=gen))  # unlike wq's


@pytest.mark.parametrize("tokens", [2688, 771])
def test_fp8_attention_against_float64_eager_and_compiled(tokens):
    flash = _flash_attention_3()
    from ltxbench import ops
    from ltxbench.inject import fp8_attention
    from ltxbench.ops import reference
    from ltxbench.ops.reference import ltx_cos_sin, ltx_rope_freqs

    gen = torch.Generator("cuda").manual_seed(0)
    heads, head_dim = 32, 64  # LTX-2B
    d = heads * head_dim
    q, k, v = _projections(2, tokens, heads, head_dim, gen)
    attn = _Attn(heads, d, gen)
    grid = torch.rand(2, tokens, 3, device="cuda", generator=gen) * torch.tensor([20.0, 16.0, 24.0], device="cuda")
    rope = {"grid": grid, "freqs": ltx_rope_freqs(d, device="cuda")}
    with torch.no_grad():
        out = fp8_attention.attention(ops, flash.flash_attn_func, attn, q, k, v, 1e-6, rope)
        compiled = torch.compile(fp8_attention.attention, fullgraph=True)(ops, flash.flash_attn_func, attn, q, k, v,
                                                                          1e-6, rope)
        qn, kn = reference.qk_rms_norm_rope(q.double(), k.double(), attn.norm_q.weight.double(),
                                                attn.norm_k.weight.double(), 1e-6,
                                                *ltx_cos_sin(grid.double(), rope["freqs"].double(), d))
        per_head = lambda t: t.unflatten(2, (heads, head_dim)).transpose(1, 2)  # noqa: E731
        want = F.scaled_dot_product_attention(per_head(qn), per_head(kn), per_head(v.double()))
        want = want.transpose(1, 2).flatten(2, 3)
        logits = (per_head(qn)[:, :, :256] @ per_head(kn)[:, :, :256].transpose(-1, -2)) / head_dim ** 0.5
        bf16 = F.scaled_dot_product_attention(*(per_head(t.bfloat16()) for t in (qn, kn, v))).transpose(1, 2)
    assert logits.abs().max() > 10  # the realistic regime, not near-uniform attention
    assert out.dtype == torch.bfloat16 and out.shape == (2, tokens, d)
    assert torch.equal(out, compiled)
    cosine, rel_l2 = _cosine_rel_l2(out, want)
    cosine16, rel16 = _cosine_rel_l2(bf16.flatten(2, 3), want)
    print(f"FP8 attention vs float64: cosine {cosine:.6f}, rel L2 {rel_l2:.4f}; bf16 SDPA: {cosine16:.6f}, {rel16:.4f}")
    assert cosine >= 0.998 and rel_l2 <= 0.06, (cosine, rel_l2)


def test_ltx_2b_blocks_with_fp8_attention_within_the_gate_and_equal_to_the_reference_path():
    _flash_attention_3()
    from ltxbench.inject.ltx import apply_kernels, generation

    model, inputs = ltx_2b_two_blocks()

    def run(provider, precision, compiled=False):
        with apply_kernels(model, provider, precision=precision), generation(model), torch.no_grad():
            forward = torch.compile(model, fullgraph=False) if compiled else model
            return forward(**inputs)[0].float()

    bf16, fp8 = run("cuda", "bf16"), run("cuda", "fp8")
    attention, reference = run("cuda", "fp8-attention"), run("reference", "fp8-attention")
    compiled = run("cuda", "fp8-attention", compiled=True)
    print(f"LTX-2B blocks, cosine to bf16: fp8 {_cosine_rel_l2(fp8, bf16)[0]:.6f}, "
          f"fp8-attention {_cosine_rel_l2(attention, bf16)[0]:.6f}")
    assert _cosine_rel_l2(attention, reference)[0] >= 0.9999
    assert _cosine_rel_l2(compiled, attention)[0] >= 0.9999
    assert _cosine_rel_l2(attention, bf16)[0] >= 0.995
