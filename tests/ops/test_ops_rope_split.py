"""LTX-2's q/k RMSNorm across the heads + split RoPE (rms_norm_rope_split, qk_rms_norm_rope_split) beyond what the
SPECS-parametrized tests check: on the CPU, the tables, the reference and the eager formula against diffusers' own
LTX2AudioVideoRotaryPosEmbed, LTX2Attention and apply_split_rotary_emb; on the GPU, the kernels against them, the
table layouts diffusers passes, q and k of different lengths, and the argument errors."""

import re

import pytest
import torch

from ltxbench.ops import eager, reference
from ltxbench.ops.inputs import split_rope_heads

BF16_TOL = {"atol": 2e-2, "rtol": 1.6e-2}


def _gen(seed=0):
    return torch.Generator().manual_seed(seed)


def _diffusers_tables(dim, heads, modality, batch=2):
    """diffusers' split cos/sin for a 3 x 4 x 5 latent video or 60 audio frames (S = 60 either way), and the
    fractional grid its forward computes them from."""
    from diffusers.models.transformers.transformer_ltx2 import LTX2AudioVideoRotaryPosEmbed

    rope = LTX2AudioVideoRotaryPosEmbed(dim, modality=modality, rope_type="split", num_attention_heads=heads)
    if modality == "video":
        coords = rope.prepare_video_coords(batch, 3, 4, 5, "cpu")
    else:
        coords = rope.prepare_audio_coords(batch, 60, "cpu")
    cos, sin = rope(coords)
    start, end = coords.chunk(2, dim=-1)
    middle = ((start + end) / 2).squeeze(-1)  # (B, axes, S)
    bases = (rope.base_num_frames, rope.base_height, rope.base_width)
    grid = torch.stack([middle[:, i] / bases[i] for i in range(middle.shape[1])], dim=-1)
    return cos, sin, grid


def _ltx2_attention(dim, heads, dtype):
    """LTX-2's attention module (random init) with non-trivial norm_q / norm_k weights."""
    from diffusers.models.transformers.transformer_ltx2 import LTX2Attention

    attn = LTX2Attention(query_dim=dim, heads=heads, kv_heads=heads, dim_head=dim // heads, rope_type="split")
    with torch.no_grad():
        for norm in (attn.norm_q, attn.norm_k):
            norm.weight.copy_(1 + 0.1 * torch.randn(dim, generator=_gen(3)))
    return attn.to(dtype)


def _model_q_k(attn, h, cos, sin):
    """What LTX2AudioVideoAttnProcessor computes for the self-attention's q and k (to_q / to_k, norms, rope)."""
    from diffusers.models.transformers.transformer_ltx2 import apply_split_rotary_emb

    q, k = attn.to_q(h), attn.to_k(h)
    return q, k, apply_split_rotary_emb(attn.norm_q(q), (cos, sin)), apply_split_rotary_emb(attn.norm_k(k), (cos, sin))


@pytest.mark.parametrize("modality", ["video", "audio"])
@pytest.mark.parametrize("dim,heads", [(4096, 32), (2048, 32), (96, 3)])
def test_tables_are_diffusers_split_tables_and_their_view(dim, heads, modality):
    """Same values (the padded slots at head 0's start for video included) and the same (B, H, S, r) swapaxes view
    of (B, S, H, r) memory."""
    cos, sin, grid = _diffusers_tables(dim, heads, modality)
    own_cos, own_sin = reference.ltx2_split_cos_sin(grid, dim, heads)
    assert torch.equal(own_cos, cos) and torch.equal(own_sin, sin)
    assert own_cos.stride() == cos.stride() == (60 * dim // 2, dim // heads // 2, dim // 2, 1)
    if modality == "video" and dim % 6:
        assert (cos[:, 0, :, : (dim // 2) % 3] == 1).all() and (sin[:, 0, :, : (dim // 2) % 3] == 0).all()


@pytest.mark.parametrize("dim,heads", [(4096, 32), (2048, 32), (96, 3)])
def test_reference_and_eager_match_ltx2_attention(dim, heads):
    """fp32: the reference is the model's math. bf16: eager is the model bit for bit; the reference, rounded once
    where the model rounds after the norm and after the rotation, is within bf16 tolerance and no further from
    float64 than the model."""
    cos, sin, _ = _diffusers_tables(dim, heads, "video")
    h = torch.randn(2, 60, dim, generator=_gen())
    for dtype in (torch.float32, torch.bfloat16):
        attn = _ltx2_attention(dim, heads, dtype)
        with torch.no_grad():
            q, k, want_q, want_k = _model_q_k(attn, h.to(dtype), cos, sin)
            wq, wk, eps = attn.norm_q.weight, attn.norm_k.weight, attn.norm_q.eps
            got_q, got_k = reference.qk_rms_norm_rope_split(q, k, wq, wk, eps, cos, sin)
            lib_q, lib_k = eager.ltx2_qk_rms_norm_rope_split(q, k, wq, wk, eps, cos, sin)
            exact_q, _ = reference.qk_rms_norm_rope_split(q.double(), k.double(), wq.double(), wk.double(), eps,
                                                          cos.double(), sin.double())
        assert torch.equal(lib_q, want_q) and torch.equal(lib_k, want_k)
        if dtype == torch.float32:
            torch.testing.assert_close(got_q, want_q)
            torch.testing.assert_close(got_k, want_k)
        else:
            torch.testing.assert_close(got_q, want_q, **BF16_TOL)
            torch.testing.assert_close(got_k, want_k, **BF16_TOL)
            err, err_model = ((t.double() - exact_q).abs().max() for t in (got_q, want_q))
            assert err <= err_model


def test_audio_tables_and_a_batch_one_table_broadcast():
    """Audio tables (no padded slots) shared by the batch: a (1, H, S, r) table gives what its expanded (B, H, S, r)
    copy gives, in the reference and in eager (diffusers' own function reads B off the table and needs it expanded)."""
    from diffusers.models.transformers.transformer_ltx2 import apply_split_rotary_emb

    cos, sin, _ = _diffusers_tables(2048, 32, "audio", batch=1)
    x = torch.randn(3, 60, 2048, generator=_gen())
    w = 1 + 0.1 * torch.randn(2048, generator=_gen(1))
    wide = [t.expand(3, -1, -1, -1).contiguous() for t in (cos, sin)]
    got = reference.rms_norm_rope_split(x, w, 1e-6, cos, sin)
    assert torch.equal(got, reference.rms_norm_rope_split(x, w, 1e-6, *wide))
    assert torch.equal(eager.ltx2_rms_norm_rope_split(x, w, 1e-6, cos, sin),
                       apply_split_rotary_emb(torch.nn.functional.rms_norm(x, (2048,), w, 1e-6), tuple(wide)))
    torch.testing.assert_close(got, eager.ltx2_rms_norm_rope_split(x, w, 1e-6, cos, sin))


def test_reference_reads_column_slices_of_a_fused_projection():
    cos, sin, _ = _diffusers_tables(96, 3, "video")
    qkv = torch.randn(2, 60, 3 * 96, generator=_gen())
    q, k = qkv[..., :96], qkv[..., 96:192]
    w = 1 + 0.1 * torch.randn(96, generator=_gen(1))
    got = reference.qk_rms_norm_rope_split(q, k, w, w, 1e-6, cos, sin)
    want = reference.qk_rms_norm_rope_split(q.contiguous(), k.contiguous(), w, w, 1e-6, cos, sin)
    assert all(torch.equal(g, e) for g, e in zip(got, want, strict=True))
    assert got[0].is_contiguous() and got[1].is_contiguous()


def test_reference_refuses_a_table_that_does_not_split_the_inner_dim():
    x = torch.randn(1, 4, 64)
    for bad in (torch.ones(1, 3, 4, 16), torch.ones(1, 2, 4, 8), torch.ones(4, 16)):
        with pytest.raises(ValueError, match="split RoPE: cos must be"):
            reference.rms_norm_rope_split(x, torch.ones(64), 1e-6, bad, bad)


def test_input_heads_follow_ltx2():
    assert [split_rope_heads(d) for d in (4096, 2048, 8192, 1536, 192, 86, 72, 8, 0)] == [32, 32, 32, 24, 3, 1, 1, 1, 1]


# ---- GPU ------------------------------------------------------------------------------------------------------

def _cuda_tables(dim, heads, modality, batch=2):
    cos, sin, _ = _diffusers_tables(dim, heads, modality, batch)
    return cos.cuda(), sin.cuda()


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32], ids=str)
@pytest.mark.parametrize("dim,heads", [(4096, 32), (2048, 32), (96, 3)])
def test_kernels_match_ltx2_attention(dim, heads, dtype):
    """The fused kernels on the model's own q/k and tables: within tolerance of the reference and of the model, and
    no further from float64 than twice the model's error (the model rounds after the norm too)."""
    from ltxbench import ops

    cos, sin = _cuda_tables(dim, heads, "video")
    attn = _ltx2_attention(dim, heads, dtype).cuda()
    h = torch.randn(2, 60, dim, generator=_gen()).to("cuda", dtype)
    with torch.no_grad():
        q, k, want_q, want_k = _model_q_k(attn, h, cos, sin)
        wq, wk = attn.norm_q.weight, attn.norm_k.weight
        got = ops.qk_rms_norm_rope_split(q, k, wq, wk, 1e-6, cos, sin)
        ref = reference.qk_rms_norm_rope_split(q, k, wq, wk, 1e-6, cos, sin)
        exact = reference.qk_rms_norm_rope_split(q.double(), k.double(), wq.double(), wk.double(), 1e-6,
                                                 cos.double(), sin.double())
    tol = {"atol": 1e-4, "rtol": 1e-4} if dtype == torch.float32 else BF16_TOL
    for g, r, m, e in zip(got, ref, (want_q, want_k), exact, strict=True):
        torch.testing.assert_close(g, r, **tol)
        torch.testing.assert_close(g, m, **tol)
        err, err_model = ((t.double() - e).abs().max().item() for t in (g, m))
        assert err <= 2 * err_model + torch.finfo(dtype).eps * max(1.0, e.abs().max().item())


@pytest.mark.gpu
@pytest.mark.parametrize("dim,heads", [(4096, 32), (2048, 32), (86, 1)])
def test_qk_op_is_the_single_op_twice(dim, heads):
    """q and k reduced together give what each alone gives (vector and scalar paths): the same sums, so at most the
    last bit apart where the compiler contracts them otherwise; a q normalized by k's statistics would be far off."""
    from ltxbench import ops

    cos, sin = (t.cuda() for t in reference.ltx2_split_cos_sin(torch.rand(2, 33, 3, generator=_gen()), dim, heads))
    q, k = torch.randn(2, 2, 33, dim, generator=_gen(1)).to("cuda", torch.bfloat16).unbind(0)
    wq, wk = (1 + 0.1 * torch.randn(2, dim, generator=_gen(2))).to("cuda", torch.bfloat16).unbind(0)
    got_q, got_k = ops.qk_rms_norm_rope_split(q, k, wq, wk, 1e-6, cos, sin)
    one_ulp = {"atol": 0, "rtol": 2**-7}
    torch.testing.assert_close(got_q, ops.rms_norm_rope_split(q, wq, 1e-6, cos, sin), **one_ulp)
    torch.testing.assert_close(got_k, ops.rms_norm_rope_split(k, wk, 1e-6, cos, sin), **one_ulp)


@pytest.mark.gpu
def test_table_layouts_give_the_same_bits():
    """diffusers' swapaxes view, a contiguous (B, H, S, r) copy, a batch-1 table expanded (stride 0) and cos / sin in
    different layouts (copied to one) all run the vector path on the same values."""
    from ltxbench import ops

    cos, sin = _cuda_tables(4096, 32, "video", batch=1)
    x = torch.randn(2, 60, 4096, generator=_gen()).to("cuda", torch.bfloat16)
    w = (1 + 0.1 * torch.randn(4096, generator=_gen(1))).to("cuda", torch.bfloat16)
    want = ops.rms_norm_rope_split(x, w, 1e-6, cos, sin)
    torch.testing.assert_close(want, reference.rms_norm_rope_split(x, w, 1e-6, cos, sin), **BF16_TOL)
    layouts = [(cos.contiguous(), sin.contiguous()), (cos.expand(2, -1, -1, -1), sin.expand(2, -1, -1, -1)),
               (cos.expand(2, -1, -1, -1).contiguous(), sin.expand(2, -1, -1, -1).contiguous()),
               (cos, sin.contiguous())]
    for c, s in layouts:
        assert torch.equal(ops.rms_norm_rope_split(x, w, 1e-6, c, s), want)


@pytest.mark.gpu
def test_cross_attention_q_and_k_with_their_own_tables():
    """a2v / v2a: the video side (S = 60 here) and the audio side (60 audio frames, then 7) each with its own table,
    q and k from column slices of fused projections."""
    from ltxbench import ops

    video = _cuda_tables(2048, 32, "video")
    audio = [t[:, :, :7] for t in _cuda_tables(2048, 32, "audio")]
    w = (1 + 0.1 * torch.randn(2048, generator=_gen(1))).to("cuda", torch.bfloat16)
    for (cos, sin), s in ((video, 60), (audio, 7)):
        kv = torch.randn(2, s, 2 * 2048, generator=_gen(s)).to("cuda", torch.bfloat16)
        x = kv[..., :2048]
        torch.testing.assert_close(ops.rms_norm_rope_split(x, w, 1e-6, cos, sin),
                                   reference.rms_norm_rope_split(x, w, 1e-6, cos, sin), **BF16_TOL)


@pytest.mark.gpu
def test_bad_arguments_name_the_argument():
    from ltxbench import ops

    x = torch.randn(2, 4, 64, device="cuda", dtype=torch.bfloat16)
    w = torch.ones(64, device="cuda", dtype=torch.bfloat16)
    t = torch.ones(2, 2, 4, 16, device="cuda")
    op, qk = ops.rms_norm_rope_split, ops.qk_rms_norm_rope_split
    head = r"^ltxbench\.rms_norm_rope_split: "
    cases = [
        (lambda: op(x[0], w, 1e-6, t, t), head + r"x must be 3-D \(B, S, D\)"),
        (lambda: op(torch.ones(1, 1, 8194, device="cuda"), w.float(), 1e-6, t, t), head + r"the inner dim D must be"),
        (lambda: op(x, w[:63], 1e-6, t, t), head + r"weight must have shape \(64,\), got \(63,\)"),
        (lambda: op(x, w, 1e-6, t.cpu(), t), head + r"cos is on cpu but x is on cuda"),
        (lambda: op(x, w, 1e-6, t, t.bfloat16()), head + r"sin must be float32, got BFloat16"),
        (lambda: op(x, w, 1e-6, t[0], t[0]), head + r"cos must be 4-D \(B\|1, heads, S, head_dim / 2\)"),
        (lambda: op(x, w, 1e-6, t, t[:, :, :3]), head + r"sin has shape \(2, 2, 3, 16\) but cos has"),
        (lambda: op(x, w, 1e-6, t[:, :1].expand(2, 3, 4, 16), t[:, :1].expand(2, 3, 4, 16)),
         head + r"the inner dim D = 64 of x is not a multiple of the heads of cos \(dim 1\) = 3"),
        (lambda: op(x, w, 1e-6, t[..., :8], t[..., :8]), head + r"cos must have head_dim / 2 = 16 in its last dim"),
        (lambda: op(x[..., :62], w[:62], 1e-6, t, t), head + r"the head dim D / heads = 62 / 2 = 31 must be even"),
        (lambda: op(x, w, 1e-6, t.repeat(2, 1, 1, 1), t.repeat(2, 1, 1, 1)),
         head + r"cos must have shape \(B\|1, heads, S, head_dim / 2\) = \(2\|1, 2, 4, 16\), got \(4, 2, 4, 16\)"),
        (lambda: op(x, w, 1e-6, t[:, :, :3], t[:, :, :3]), head + r"cos must have shape \(B\|1, heads, S"),
        (lambda: qk(x, x[:, :3], w, w, 1e-6, t, t), r"^ltxbench\.qk_rms_norm_rope_split: k has shape"),
        (lambda: qk(x, x, w.float(), w, 1e-6, t, t),
         r"^ltxbench\.qk_rms_norm_rope_split: wq has dtype Float but q has BFloat16"),
        (lambda: qk(x, x, w, w[:32], 1e-6, t, t), r"^ltxbench\.qk_rms_norm_rope_split: wk must have shape \(64,\)"),
        (lambda: qk(x, x, w, w, 1e-6, t, t.cpu()), r"^ltxbench\.qk_rms_norm_rope_split: sin is on cpu but q is on"),
    ]
    for call, pattern in cases:
        with pytest.raises(RuntimeError) as info:
            call()
        message = str(info.value).strip().splitlines()
        assert len(message) == 1 and re.match(pattern, message[0]), str(info.value)
