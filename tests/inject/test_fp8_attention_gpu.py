"""--precision fp8-attention on the GPU (Hopper with FlashAttention-3 or cuDNN's frontend installed; each skipped
where it is not): FP8 attention on our FP8 inputs against float64 attention at LTX-2B's and Wan's head dims and
realistic logits, eager and compiled; cuDNN's op against float64 with its fp32 emulation as the yardstick; and
LTX-2B's blocks with FP8 attention within the FP8 gate of bf16, equal to the reference provider's FP8 path with the
same backend (our kernels, and for cuDNN the op against its emulation, are what differs)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from tests.helpers import ltx_2b_two_blocks, without_flash_attention_3

pytestmark = pytest.mark.gpu


def _hopper():
    if torch.cuda.get_device_capability() < (9, 0):  # the gpu marker skips where no GPU is visible
        pytest.skip("needs a GPU with FP8 tensor cores (compute capability 9.0+)")


def _flash_attention_3():
    _hopper()
    from ltxbench.inject.attention_backend import find_flash_attention_3

    fa3, _ = find_flash_attention_3()  # a hopper/ build, else pip's fa3-fwd
    if fa3 is None:
        pytest.skip("FlashAttention-3 not installed (pip install fa3-fwd)")
    return fa3


def _backend(name):
    from ltxbench.inject import fp8_attention

    if name == "FlashAttention-3":
        return fp8_attention._flash_attention_3(_flash_attention_3().flash_attn_func)
    _hopper()
    pytest.importorskip("cudnn", reason="cuDNN's frontend (nvidia-cudnn-frontend) not installed")
    return fp8_attention._cudnn("cuda")


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


@pytest.mark.parametrize("backend", ["FlashAttention-3", "cuDNN"])
@pytest.mark.parametrize(("tokens", "head_dim"), [(2688, 64), (771, 64), (1560, 128)])
def test_fp8_attention_against_float64_eager_and_compiled(backend, tokens, head_dim):
    backend = _backend(backend)
    from ltxbench import ops
    from ltxbench.inject import fp8_attention
    from ltxbench.ops import reference
    from ltxbench.ops.reference import ltx_cos_sin, ltx_rope_freqs

    gen = torch.Generator("cuda").manual_seed(0)
    heads = 32 if head_dim == 64 else 12  # LTX-2B, Wan 2.1 1.3B
    d = heads * head_dim
    q, k, v = _projections(2, tokens, heads, head_dim, gen)
    attn = _Attn(heads, d, gen)
    grid = torch.rand(2, tokens, 3, device="cuda", generator=gen) * torch.tensor([20.0, 16.0, 24.0], device="cuda")
    rope = {"grid": grid, "freqs": ltx_rope_freqs(d, device="cuda")}
    with torch.no_grad():
        out = fp8_attention.attention(ops, backend, attn, q, k, v, 1e-6, rope)
        compiled = torch.compile(fp8_attention.attention, fullgraph=True)(ops, backend, attn, q, k, v, 1e-6, rope)
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


@pytest.mark.parametrize("heads", [1, 12])
@pytest.mark.parametrize("tokens", [1, 771, 4096])
def test_cudnn_op_against_float64_with_its_emulation_as_the_yardstick(tokens, heads):
    """The op cuDNN runs on our quantizers' FP8 inputs (B = 2, head dim 128, a strided v), eager and compiled,
    against float64 attention of the same FP8 values: no scale slip (the least-squares scale of the output onto the
    exact one within 0.3% of 1; a 1% slip fails), and an error at most a little above its fp32 emulation's (which
    rounds the probabilities at the final row max, cuDNN at the running one: they differ by ~3% rel L2 at 4096 keys,
    both dominated by the e4m3 output). A shape cuDNN declines (one token) runs the emulation, with a warning;
    empty inputs give an empty output."""
    _backend("cuDNN")
    import warnings

    from ltxbench import ops
    from ltxbench.ops import cudnn_fp8_attention as op

    gen = torch.Generator("cuda").manual_seed(1)
    x = torch.randn(2, tokens, 3, heads * 128, device="cuda", generator=gen).bfloat16()
    q8, qd = ops.quantize_fp8_heads(x[:, :, 0].reshape(1, -1, heads * 128), 1)
    k8, kd = ops.quantize_fp8_heads(x[:, :, 1].reshape(1, -1, heads * 128), 1)
    v8, vd = ops.quantize_fp8_heads(x[:, :, 2].reshape(1, -1, heads * 128), 1)
    q8, k8, v8 = (t.view(2, tokens, heads, 128) for t in (q8, k8, v8))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = op.cudnn_fp8_attention(q8, k8, v8, qd, kd, vd)
    compiled = torch.compile(lambda *args: op.cudnn_fp8_attention(*args), fullgraph=True)(q8, k8, v8, qd, kd, vd)
    emulation = op.emulated(q8, k8, v8, qd, kd, vd)
    assert got.dtype == torch.bfloat16 and got.shape == q8.shape and torch.equal(got, compiled)
    declined = [w for w in caught if "no FP8 engine" in str(w.message)]
    if declined:
        assert torch.equal(got, emulation), "a declined shape runs the emulation"
    per_head = lambda t, d: (t.double() * d.reshape(-1)[0].double()).transpose(1, 2)  # noqa: E731
    exact = F.scaled_dot_product_attention(per_head(q8, qd), per_head(k8, kd), per_head(v8, vd)).transpose(1, 2)
    cosine, rel_l2 = _cosine_rel_l2(got, exact)
    _, rel_emulation = _cosine_rel_l2(emulation, exact)
    a, b = got.flatten().double(), exact.flatten()
    scale = (a @ b / (b @ b)).item()
    print(f"cuDNN FP8 vs float64: cosine {cosine:.6f}, rel L2 {rel_l2:.4f}, scale {scale:.5f}; "
          f"emulation rel L2 {rel_emulation:.4f}; declined: {bool(declined)}")
    assert abs(scale - 1) <= 3e-3, scale
    assert cosine >= 0.998 and rel_l2 <= 1.5 * rel_emulation + 5e-3, (cosine, rel_l2, rel_emulation)
    empty = q8[:, :0]
    assert op.cudnn_fp8_attention(empty, empty, empty, qd, kd, vd).shape == empty.shape


@pytest.mark.parametrize("backend", ["FlashAttention-3", "cuDNN"])
def test_ltx_2b_blocks_with_fp8_attention_within_the_gate_and_equal_to_the_reference_path(backend, monkeypatch):
    _backend(backend)
    from ltxbench.inject import fp8_attention
    from ltxbench.inject.ltx import apply_kernels, generation

    if backend == "cuDNN":  # chosen only where FlashAttention-3 is not there; refused at head dim 64 for its speed
        without_flash_attention_3(monkeypatch)
        monkeypatch.setattr(fp8_attention, "CUDNN_SLOWER_HEAD_DIMS", ())

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
