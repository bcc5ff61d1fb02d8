"""GPU: every op × dtype × shape × variant against the reference, plus opcheck and fullgraph compile.

Run on an H100/H200 with `make test-gpu`; skipped without CUDA. Outputs are checked (a) against the
fp32-math reference with the tolerances of docs/kernels.md#accuracy and (b) against float64: the kernel's error may not
exceed twice the error of the host library's own eager formula in the same dtype.
"""

import math
import re

import pytest
import torch

from ltxbench.ops import reference
from ltxbench.ops.accuracy import fp8_mismatch, fp8_pairs
from ltxbench.ops.inputs import LAYOUTS, relayout, restride
from ltxbench.ops.registry import DTYPES, SPECS

pytestmark = pytest.mark.gpu
NAMES = sorted(SPECS)


def _gen(seed=0):
    return torch.Generator().manual_seed(seed)


def _tuple(out):
    return out if isinstance(out, tuple) else (out,)


def _poison_allocator(refs):
    """Leave NaN-filled blocks of each output's size and dtype in the caching allocator, so an element the kernel
    forgets to write shows up as NaN instead of a plausible stale value."""
    blocks = [torch.full(r.shape, float("nan"), dtype=r.dtype, device="cuda") for r in refs]
    del blocks


def _same(a, b):
    """Bitwise equality, FP8 included (torch.equal has no float8 kernel)."""
    if a.dtype == torch.float8_e4m3fn:
        return b.dtype == a.dtype and torch.equal(a.view(torch.uint8), b.view(torch.uint8))
    return torch.equal(a, b)


def _check_fp8(got, ref, ref64, atol, rtol, fp32_tolerance):
    """An FP8 output and its scale: against the fp32-math reference by the FP8 contract (accuracy.fp8_mismatch), and
    against float64 within the dtype's tolerance and one e4m3 step (float64 keeps h' unrounded)."""
    q, scale = got
    assert q.dtype == torch.float8_e4m3fn and scale.dtype == torch.float32 and q.is_contiguous()
    if fp32_tolerance:
        err, why = fp8_mismatch(*got, *ref)
        assert why is None, f"{why} (max error of the dequantized values {err:.3g})"
    err, why = fp8_mismatch(*got, *ref64, (atol, rtol))
    assert why is None, f"against float64: {why} (max error {err:.3g})"


def _f64(inputs):
    return {k: v.double() if isinstance(v, torch.Tensor) and v.is_floating_point() else v for k, v in inputs.items()}


def _check(spec, inputs, dtype, fp32_tolerance=True):
    """fp32_tolerance=False keeps only the float64 comparison, for inputs whose answer fp32 itself cannot hold
    to the tolerance of docs/kernels.md#accuracy (the fp32 reference is then as far off as the kernel may be)."""
    ref = spec.outputs(spec.reference, inputs)  # outputs, then the inputs written in place (a KV cache)
    _poison_allocator(ref)
    got = spec.outputs(spec.fn, inputs)
    ref64 = spec.outputs(spec.reference, _f64(inputs))
    eager = spec.outputs(spec.baselines["eager"], inputs)
    atol, rtol = spec.tolerance(dtype)
    # one ulp of the output, and the fp32 accumulator's summation order over the row (log2(width) fp32 ulps: a
    # K = 14336 projection landed at 3.6 ulps from float64 where cuBLAS happened to land at 0.9)
    width = next(v for v in inputs.values() if isinstance(v, torch.Tensor)).shape[-1]
    floor = torch.finfo(dtype).eps + torch.finfo(torch.float32).eps * math.log2(max(width, 2))
    assert len(got) == len(ref) == len(ref64) == len(eager)
    for (g, r), (_, r64), (e, _) in zip(fp8_pairs(got, ref), fp8_pairs(got, ref64), fp8_pairs(eager, ref64),
                                        strict=True):
        if isinstance(r, tuple):
            _check_fp8(g, r, r64, atol, rtol, fp32_tolerance)
            continue
        assert g.dtype == dtype and g.shape == r.shape
        assert not g.isnan().any(), "unwritten (NaN-poisoned) or NaN output"
        if fp32_tolerance:
            torch.testing.assert_close(g, r, atol=atol, rtol=rtol)
        if g.numel():
            err = (g.double() - r64).abs().max().item()
            err_eager = (e.double() - r64).abs().max().item()
            scale = max(1.0, r64.abs().max().item())
            assert err <= 2 * err_eager + floor * scale, f"kernel error {err:.3g} vs eager {err_eager:.3g}"


CASES = [(name, shape) for name in NAMES for shape in SPECS[name].test_shapes]


@pytest.mark.parametrize("dtype", sorted(DTYPES))
@pytest.mark.parametrize("name,shape", CASES, ids=lambda v: "x".join(map(str, v)) if isinstance(v, tuple) else v)
def test_matches_reference(name, dtype, shape):
    spec = SPECS[name]
    for i, variant in enumerate(spec.variants):
        inputs = spec.make_inputs(shape, DTYPES[dtype], "cuda", _gen(i), variant)
        if spec.takes(variant, shape, DTYPES[dtype]):
            _check(spec, inputs, DTYPES[dtype])
        else:  # beyond the variant's widest row: refused, by name, not computed wrong
            with pytest.raises(RuntimeError, match=rf"at most {spec.max_width[variant]} values, got {shape[-1]}"):
                spec.fn(**inputs)


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("dtype", sorted(DTYPES))
@pytest.mark.parametrize("how", LAYOUTS)
def test_strided_inputs(name, dtype, how):
    """Every tensor argument of every variant (weights, tables, grids, positions, masks included) in the layout."""
    spec = SPECS[name]
    for i, variant in enumerate(spec.variants):
        for shape in ((2, 7, 256), (3, 5, 86)):
            inputs = spec.make_inputs(shape, DTYPES[dtype], "cuda", _gen(i), variant)
            inputs = relayout(inputs, how, keep=spec.writes)
            first = next(iter(inputs.values()))
            assert not first.is_contiguous() or first.data_ptr() % 16 != 0
            _check(spec, inputs, DTYPES[dtype])


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("dtype", sorted(DTYPES))
@pytest.mark.parametrize("shape", [(0, 4, 64), (2, 0, 64), (2, 3, 0)], ids=str)
def test_empty(name, dtype, shape):
    spec = SPECS[name]
    for i, variant in enumerate(spec.variants):
        inputs = spec.make_inputs(shape, DTYPES[dtype], "cuda", _gen(i), variant)
        for g, r in zip(spec.outputs(spec.fn, inputs), spec.outputs(spec.reference, inputs), strict=True):
            assert g.shape == r.shape and g.dtype == r.dtype
            if r.numel():  # linear over K = 0 features: the bias alone, not an empty output
                torch.testing.assert_close(g, r)
            else:
                assert g.numel() == 0


def _takes_eps(name):
    spec = SPECS[name]
    return "eps" in spec.make_inputs((1, 2, 64), torch.float32, "cpu", _gen(), spec.variants[0])


@pytest.mark.parametrize("name", [n for n in NAMES if _takes_eps(n)])
def test_eps_is_the_callers(name):
    """eps = 0.5 moves every normalized value by a few % against the usual 1e-6: a kernel that ignored the
    argument (or hard-coded its default) would fail even in bf16."""
    spec = SPECS[name]
    for i, variant in enumerate(spec.variants):
        inputs = {**spec.make_inputs((2, 7, 256), torch.float32, "cuda", _gen(i), variant), "eps": 0.5}
        _check(spec, inputs, torch.float32)


@pytest.mark.parametrize("name", NAMES)
def test_opcheck(name):
    spec = SPECS[name]
    op = getattr(torch.ops.ltxbench, name).default
    for variant in spec.variants:
        inputs = spec.make_inputs((2, 9, 256), torch.bfloat16, "cuda", _gen(), variant)
        torch.library.opcheck(op, tuple(inputs.values()))


@pytest.mark.parametrize("name", NAMES)
def test_compile_fullgraph(name):
    spec = SPECS[name]
    fn = spec.fn  # resolved outside the graph, as a caller holds the function (a spec may import its home module)
    torch._dynamo.reset()
    for variant in spec.variants:
        inputs = spec.make_inputs((2, 9, 256), torch.bfloat16, "cuda", _gen(), variant)
        compiled = torch.compile(lambda kw: fn(**kw), fullgraph=True)
        got = spec.outputs(lambda c=compiled, **kw: c(kw), inputs)  # each on its own copy of a cache the op writes
        for g, e in zip(got, spec.outputs(fn, inputs), strict=True):
            assert _same(g, e)


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
@pytest.mark.parametrize("shape", [(2, 5, 2048), (2, 3, 2400), (1, 2, 8192)], ids=str)
def test_layer_norm_rows_far_from_zero_or_with_an_outlier(dtype, shape):
    """LayerNorm statistics where E[x²] - E[x]² or a plain sum would lose digits: rows with |mean| >> std (an
    fp32 mean of 1000 is itself rounded by 3e-5, so only the error against float64, at most twice eager's,
    is asserted), and rows whose first element is a 500-sigma outlier (a shift by x[0] would cancel there)."""
    spec = SPECS["layer_norm_modulate"]
    inputs = spec.make_inputs(shape, DTYPES[dtype], "cuda", _gen(), "per-batch")
    noise = torch.randn(shape, generator=_gen(1)).to("cuda")
    far = (1000.0 if dtype == "fp32" else 100.0) + noise
    outlier = noise.clone()
    outlier[..., 0] = 500.0
    _check(spec, {**inputs, "x": far.to(DTYPES[dtype])}, DTYPES[dtype], fp32_tolerance=False)
    _check(spec, {**inputs, "x": outlier.to(DTYPES[dtype])}, DTYPES[dtype])


def test_bad_arguments_name_the_argument():
    from ltxbench import ops

    x = torch.randn(2, 4, 64, device="cuda", dtype=torch.bfloat16)
    s = torch.randn(2, 1, 64, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(8, 64, device="cuda", dtype=torch.bfloat16)
    cases = [
        (lambda: ops.rms_norm(x, torch.ones(64, dtype=torch.bfloat16)), r"weight is on cpu"),
        (lambda: ops.rms_norm(x, torch.ones(64, device="cuda")), r"weight has dtype Float"),
        (lambda: ops.rms_norm(x, torch.ones(65, device="cuda", dtype=torch.bfloat16)), r"weight must have shape"),
        (lambda: ops.rms_norm(x.int()), r"x must be float32, float16 or bfloat16"),
        (lambda: ops.rms_norm_modulate(x, None, s[:, :, :32], s, 1e-6), r"scale must have shape"),
        (lambda: ops.rms_norm_modulate(x[0], None, s, s, 1e-6), r"x must be 3-D"),
        (lambda: ops.gated_residual(x, x[:, :2], s), r"a has shape"),
        (lambda: ops.layer_norm_modulate(x, s.float(), s, 1e-6),
         r"the modulation is float32 or BFloat16 throughout, got Float and BFloat16"),
        (lambda: ops.gated_residual(*[torch.zeros(1, 2, 8200, device="cuda", dtype=torch.bfloat16)] * 2,
                                    torch.zeros(1, 1, 8200, device="cuda")),
         r"float32 modulation takes rows of at most 8192 values, got 8200"),
        (lambda: ops.add_rms_norm_modulate(x, x, s.repeat(1, 3, 1), s, s, 1e-6), r"gate must have shape"),
        (lambda: ops.fused_add_rms_norm(x, x[:1], None), r"residual has shape"),
        (lambda: ops.rope_3d(x, x), r"pass either cos and sin, or grid and freqs"),
        (lambda: ops.rope_3d(x, x, x.float(), x.float()[:, :2]), r"sin must have shape"),
        (lambda: ops.rope_3d(x, x, grid=x.float()[..., :3], freqs=torch.ones(5, device="cuda")), r"freqs must"),
        (lambda: ops.rope_3d(x, x, x, x), r"cos must be float32"),
        (lambda: ops.qk_rms_norm_rope(x, x, s[0, 0], s[0, 0, :8], 1e-5, grid=x.float()[..., :3],
                                      freqs=torch.ones(10, device="cuda")), r"wk must have shape"),
        (lambda: ops.rope_1d(x, x, x[0].float(), x[0].float(), torch.zeros(2, 4, dtype=torch.long, device="cuda")),
         r"q and k must be 4-D"),
        (lambda: ops.geglu(x[..., :63]), r"last dim of x must be even"),
        (lambda: ops.swiglu(x, 2), r"gate_half must be 0 or 1"),
        (lambda: ops.linear(x, w.T), r"linear: weight must be \(out_features, in_features\)"),
        (lambda: ops.linear(x, w, s[0, 0]), r"linear: bias must be \(out_features,\)"),
        (lambda: ops.linear(x, w.float()), r"linear: weight has dtype Float"),
        (lambda: ops.linear(x, w.cpu()), r"linear: weight is on cpu"),
        (lambda: ops.linear(x, w, None, "relu"), r"linear: activation must be"),
        (lambda: ops.linear(x, w, None, "none", x), r"linear: residual must have the output's shape \(2, 4, 8\)"),
        (lambda: ops.linear(x, w, w[:, 0], "gelu_tanh", x[..., :8]), r"linear: residual takes activation 'none'"),
        (lambda: ops.linear(x, w, None, "none", x[..., :8].float()), r"linear: residual has dtype Float"),
    ]
    for call, pattern in cases:
        with pytest.raises(RuntimeError, match=pattern):
            call()


@pytest.mark.parametrize("name", NAMES)
def test_bad_dtype_and_mismatch_name_the_ops_own_arguments(name):
    """Each op names its own first argument (h, q, x) in the dtype error, and both arguments of a dtype mismatch,
    in one line."""
    spec = SPECS[name]
    # The first variant with a second 16-bit tensor argument (the activations have none: one dtype case only).
    for variant in spec.variants:
        inputs = spec.make_inputs((2, 9, 256), torch.bfloat16, "cuda", _gen(), variant)
        tensors = [k for k, v in inputs.items() if isinstance(v, torch.Tensor) and v.dtype == torch.bfloat16]
        if len(tensors) > 1:
            break
    first, *others = tensors
    head = rf"^ltxbench\.{name}: "
    cases = [({first: inputs[first].int()}, head + rf"{first} must be float32, float16 or bfloat16, got Int$")]
    if others:
        cases.append(({others[0]: inputs[others[0]].half()},
                      head + rf"{others[0]} has dtype Half but {first} has BFloat16 \(they must match\)$"))
    assert len(cases) == 2 or name in ("gelu_tanh", "geglu", "swiglu", "gelu_tanh_fp8", "quantize_fp8",
                                       "quantize_fp8_heads"), tensors
    for change, pattern in cases:
        with pytest.raises(RuntimeError) as info:
            spec.fn(**{**inputs, **change})
        message = str(info.value).strip().splitlines()
        assert len(message) == 1 and re.match(pattern, message[0]), str(info.value)


def test_rope_1d_out_of_range_positions_poison_instead_of_reading_out_of_bounds():
    from ltxbench import ops

    q = torch.randn(1, 2, 3, 64, device="cuda", dtype=torch.bfloat16)
    table = torch.randn(4, 32, device="cuda")
    q_out, _ = ops.rope_1d(q, q, table, table, torch.tensor([[0, 4, 1]], device="cuda"))
    assert q_out[:, :, 1].isnan().all() and not q_out[:, :, [0, 2]].isnan().any()


def test_rope_1d_per_token_tables_without_positions():
    """No positions: (B*S, rot/2) tables are read at the token's own row, (S, rot/2) tables shared by the batch;
    any other row count is refused with a message naming the rule."""
    from ltxbench import ops

    q = torch.randn(2, 4, 5, 64, device="cuda", dtype=torch.bfloat16)
    per_token, shared = torch.randn(10, 32, device="cuda"), torch.randn(5, 32, device="cuda")
    for table, positions in ((per_token, torch.arange(10, device="cuda").view(2, 5)),
                             (shared, torch.arange(5, device="cuda")[None])):
        got = ops.rope_1d(q, q, table, table)
        want = ops.rope_1d(q, q, table, table, positions)
        torch.testing.assert_close(got[0], want[0], atol=0, rtol=0)
        torch.testing.assert_close(got[0], reference.rope_1d(q, q, table, table)[0], atol=1e-2, rtol=1.6e-2)
    with pytest.raises(RuntimeError, match="without positions"):
        ops.rope_1d(q, q, per_token[:7], per_token[:7])


@pytest.mark.parametrize("hd,rot", [(7, 6), (87, 86), (87, 42), (66, 64), (130, 128)])
@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("dtype", sorted(DTYPES))
def test_rope_1d_odd_head_dims_and_pass_through_tails(hd, rot, interleaved, dtype):
    """Head dims off the vector width (odd, or an odd pass-through tail after the rotary part) take the narrow
    paths; every channel, the last one included, must match the reference."""
    from ltxbench import ops

    gen = torch.Generator("cuda").manual_seed(hd + rot)
    q = torch.randn(2, 3, 5, hd, device="cuda", generator=gen).to(DTYPES[dtype])
    k = torch.randn(2, 1, 5, hd, device="cuda", generator=gen).to(DTYPES[dtype])
    cos, sin = (torch.randn(9, rot // 2, device="cuda", generator=gen) for _ in range(2))
    positions = torch.arange(5, device="cuda").expand(2, 5) + 2
    got = ops.rope_1d(q, k, cos, sin, positions, interleaved)
    want = reference.rope_1d(q, k, cos, sin, positions, interleaved)
    atol, rtol = SPECS["rope_1d"].tolerance(DTYPES[dtype])
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, atol=atol, rtol=rtol)
        torch.testing.assert_close(g[..., rot:], w[..., rot:], atol=0, rtol=0)  # pass-through is a copy


def test_rope_1d_outputs_are_token_major_like_the_projections():
    """q/k come back as (B, H, S, hd) views of dense (B, S, H, hd) memory, the layout the fake promises."""
    from ltxbench import ops

    q = torch.randn(2, 5, 4, 64, device="cuda", dtype=torch.bfloat16).transpose(1, 2)  # (B, H=4, S=5, hd)
    k = torch.randn(2, 5, 2, 64, device="cuda", dtype=torch.bfloat16).transpose(1, 2)
    table = torch.randn(8, 32, device="cuda")
    positions = torch.arange(5, device="cuda").expand(2, 5)
    q_out, k_out = ops.rope_1d(q, k, table, table, positions)
    assert q_out.stride() == (5 * 4 * 64, 64, 4 * 64, 1) and k_out.stride() == (5 * 2 * 64, 64, 2 * 64, 1)
    q_ref, k_ref = reference.rope_1d(q, k, table, table, positions)
    assert q_out.stride() == q_ref.stride() and k_out.stride() == k_ref.stride()
    torch.testing.assert_close(q_out, q_ref, atol=1e-2, rtol=1.6e-2)


def test_rope_3d_matches_diffusers_ltx_on_2b_and_13b_dims():
    """The fused kernels against diffusers' own LTX rotary module + apply_rotary_emb (T2V and condition)."""
    from diffusers.models.transformers.transformer_ltx import LTXVideoRotaryPosEmbed, apply_rotary_emb

    from ltxbench import ops
    from ltxbench.ops.reference import ltx_rope_freqs, ltx_rope_grid

    for dim in (2048, 4096):
        rope = LTXVideoRotaryPosEmbed(dim, 20, 2048, 2048, 1, 1, 10000.0)
        h = torch.empty(2, 3 * 4 * 6, dim, device="cuda", dtype=torch.bfloat16)
        coords = torch.rand(2, 3, 72, device="cuda") * torch.tensor([[[20.0], [2048.0], [2048.0]]], device="cuda")
        for kwargs in ({"rope_interpolation_scale": (8 / 25, 32, 32)}, {"video_coords": coords}):
            cos, sin = rope(h, 3, 4, 6, **kwargs)
            grid = ltx_rope_grid(rope, 2, 3, 4, 6, device="cuda", **kwargs)
            q, k = torch.randn(2, 2, 72, dim, device="cuda", dtype=torch.bfloat16).unbind(0)
            expected = (apply_rotary_emb(q, (cos, sin)), apply_rotary_emb(k, (cos, sin)))
            freqs = ltx_rope_freqs(dim, device="cuda")
            for got in (ops.rope_3d(q, k, cos, sin), ops.rope_3d(q, k, grid=grid, freqs=freqs)):
                for g, e in zip(got, expected, strict=True):
                    torch.testing.assert_close(g, e, atol=1e-2, rtol=1.6e-2)


@pytest.mark.parametrize("dtype", ["bf16", "fp16", "fp32"])
@pytest.mark.parametrize("hd", [64, 128, 40])
def test_cross_attention_keys_masked_out_chunk_by_chunk(dtype, hd):
    """-inf keys: a whole first 64-key chunk masked for some rows (the running max starts at -inf), 200 keys
    over four chunks with a ragged tail, and a row whose every key is masked (NaN, as softmax over -inf gives)."""
    from ltxbench import ops

    gen = torch.Generator("cuda").manual_seed(hd)
    b, s, h, keys = 2, 37, 3, 200
    dt = DTYPES[dtype]
    q, k, v = (torch.randn(b, n, h, hd, device="cuda", generator=gen).to(dt) for n in (s, keys, keys))
    mask = torch.zeros(b, h, 1, keys, device="cuda")
    mask[0, :, :, :130] = float("-inf")   # batch 0: only keys 130.. count
    mask[1, 1, :, 5:] = float("-inf")      # batch 1, head 1: keys 0-4 only
    mask[1, 2] = float("-inf")             # batch 1, head 2: nothing left
    got = ops.cross_attention(q, k, v, mask)
    want = reference.cross_attention(q, k, v, mask)
    assert got[1, :, 2].isnan().all() and want[1, :, 2].isnan().all()
    atol, rtol = SPECS["cross_attention"].tolerance(dt)
    keep = torch.ones(h, dtype=torch.bool)
    keep[2] = False
    torch.testing.assert_close(got[0], want[0], atol=atol, rtol=rtol)
    torch.testing.assert_close(got[1][:, keep], want[1][:, keep], atol=atol, rtol=rtol)


@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
@pytest.mark.parametrize("hd, heads", [(64, 128), (128, 64)])
@pytest.mark.parametrize("keys", [77, 200])
def test_cross_attention_warps_that_take_many_query_tiles(dtype, hd, heads, keys):
    """More (batch, head) pairs than resident blocks: each warp loops over several 16-query tiles (the next tile's Q
    prefetched while one computes), warps of one block run different tile counts (63 tiles over 8 warps), the last
    tile is ragged (1000 = 62 x 16 + 8); keys resident (77) or staged in two passes (200)."""
    from ltxbench import ops

    gen = torch.Generator("cuda").manual_seed(keys + hd)
    b, s, dt = 3, 1000, DTYPES[dtype]
    q, k, v = (torch.randn(b, n, heads, hd, device="cuda", generator=gen).to(dt) for n in (s, keys, keys))
    mask = torch.zeros(b, 1, 1, keys, device="cuda")
    mask[1, :, :, keys // 3:] = -10000.0
    got = ops.cross_attention(q, k, v, mask)
    atol, rtol = SPECS["cross_attention"].tolerance(dt)
    torch.testing.assert_close(got, reference.cross_attention(q, k, v, mask), atol=atol, rtol=rtol)


def test_cross_attention_bad_arguments_name_the_argument():
    from ltxbench import ops

    q = torch.randn(2, 5, 4, 64, device="cuda", dtype=torch.bfloat16)
    kv = torch.randn(2, 7, 4, 64, device="cuda", dtype=torch.bfloat16)
    cases = [
        (lambda: ops.cross_attention(q[0], kv, kv), r"q, k and v must be 4-D"),
        (lambda: ops.cross_attention(q, kv[:, :, :2], kv), r"k has shape"),
        (lambda: ops.cross_attention(q, kv, kv[:, :3]), r"v has shape"),
        (lambda: ops.cross_attention(q, kv, kv.half()), r"v has dtype"),
        (lambda: ops.cross_attention(q, kv, kv, torch.zeros(2, 4, 5, 7, device="cuda")), r"mask must be additive"),
        (lambda: ops.cross_attention(q, kv, kv, torch.zeros(2, 1, 1, 7, device="cuda").half()), r"mask must be"),
        (lambda: ops.cross_attention(q, kv[:, :0], kv[:, :0]), r"at least one key"),
        (lambda: ops.cross_attention(torch.randn(1, 2, 1, 300, device="cuda"), torch.randn(1, 3, 1, 300, device="cuda"),
                                     torch.randn(1, 3, 1, 300, device="cuda")), r"head_dim must be <= 256"),
    ]
    for call, pattern in cases:
        with pytest.raises(RuntimeError, match=pattern):
            call()


def test_decode_attention_bad_arguments_name_the_argument():
    from ltxbench import ops

    q = torch.randn(1, 2, 4, 64, device="cuda", dtype=torch.bfloat16)
    kv = torch.randn(1, 2, 9, 64, device="cuda", dtype=torch.bfloat16)
    keep = torch.ones(1, 1, 1, 9, device="cuda", dtype=torch.bool)
    cases = [
        (lambda: ops.decode_attention(q[0], kv, kv), r"q must be \(B, kv_heads, groups, head_dim\)"),
        (lambda: ops.decode_attention(q, kv[:, :1], kv), r"k has shape"),
        (lambda: ops.decode_attention(q, kv, kv[:, :, :3]), r"v has shape"),
        (lambda: ops.decode_attention(q, kv, kv.half()), r"v has dtype"),
        (lambda: ops.decode_attention(q, kv, kv, keep.expand(1, 2, 1, 9)), r"mask must be per key"),
        (lambda: ops.decode_attention(q, kv, kv, keep[..., :5]), r"mask must be per key"),
        (lambda: ops.decode_attention(q, kv, kv, keep.half()), r"mask must be bool"),
        (lambda: ops.decode_attention(q, kv, kv, keep.cpu()), r"mask is on cpu"),
        (lambda: ops.decode_attention(*(torch.randn(1, 1, n, 300, device="cuda") for n in (1, 3, 3))),
         r"head_dim must be <= 256"),
    ]
    for call, pattern in cases:
        with pytest.raises(RuntimeError, match=pattern):
            call()


# LTX-2B-sized problems (>= 20 us: the algorithm search runs), as the injected model calls them, at token counts no
# other test runs: the search happens once per problem and process, and the 2B pipeline test before this file runs
# 2688-token GEMMs (block 0's attn1 on one CFG half).
TUNED_PROBLEMS = [((2, 1340, 2048), 2048, "bias", torch.bfloat16), ((2, 1340, 2048), 8192, "gelu-tanh", torch.bfloat16),
                  ((1, 3000, 1024), 3000, "no-bias", torch.float16), ((1, 1000, 1536), 1024, "bias", torch.float32),
                  ((2, 1340, 2048), 2048, "residual", torch.bfloat16)]


@pytest.mark.parametrize("shape,n,variant,dtype", TUNED_PROBLEMS, ids=lambda v: str(v))
def test_linear_after_the_algorithm_search_matches_the_reference(shape, n, variant, dtype):
    """Whatever the search keeps (a variant of cuBLASLt's first choice, or that choice) computes the same GEMM: checked
    against fp32/fp64 as every op; later calls reuse the kept algorithm (bitwise the same result); the choice is
    listed with both timings."""
    from ltxbench import ops

    spec = SPECS["linear"]
    inputs = spec.make_inputs((*shape, n), dtype, "cuda", _gen(3), variant)
    before = set(ops.gemm_choices())
    _check(spec, inputs, dtype)
    new = [line for line in ops.gemm_choices() if line not in before]
    print(*new, sep="\n")
    assert len(new) == 1 and f"tokens {shape[0] * shape[1]} n {n} k {shape[2]}" in new[0]
    if dtype == torch.float32:  # no tensor cores: not searched
        assert "kept it (fp32: not searched)" in new[0]
    else:
        assert "heuristic" in new[0] and ("tuned" in new[0] or "kept it" in new[0]) and "sampled" in new[0]
    assert torch.equal(spec.fn(**inputs), spec.fn(**inputs))


@pytest.mark.parametrize("how", LAYOUTS)
@pytest.mark.parametrize("dtype", ["bf16", "fp16", "fp32"])
def test_linear_residual_in_any_layout_and_as_a_problem_of_its_own(how, dtype):
    """The residual is added by the GEMM (beta = 1) whatever its strides or alignment (copied to the output's
    layout when they differ), and a GEMM with a residual is chosen apart from the same GEMM without one (its
    epilogue reads another 2 bytes per output)."""
    from ltxbench import ops

    spec = SPECS["linear"]
    for shape in ((2, 7, 256, 40), (3, 5, 86, 83), (1, 1, 1, 1)):
        inputs = spec.make_inputs(shape, DTYPES[dtype], "cuda", _gen(11), "residual")
        _check(spec, {**inputs, "residual": restride(inputs["residual"], how)}, DTYPES[dtype])
    inputs = spec.make_inputs((2, 1500, 1024, 1536), torch.bfloat16, "cuda", _gen(12), "residual")
    _check(spec, inputs, torch.bfloat16)
    _check(spec, {**inputs, "residual": None}, torch.bfloat16)
    lines = [c for c in ops.gemm_choices() if "tokens 3000 n 1536 k 1024" in c]
    assert sorted(line.split(" tokens")[0] for line in lines) == ["bf16 x@w.T+b", "bf16 x@w.T+b+residual"]


def test_linear_inside_a_cuda_graph_runs_the_kept_algorithm_or_the_heuristic():
    """Capture cannot time anything: a problem first seen under capture runs the heuristic's choice (listed as such)
    and is searched at its next eager call; a searched problem replays its kept algorithm."""
    from ltxbench import ops

    spec = SPECS["linear"]
    inputs = spec.make_inputs((2, 700, 2048, 2304), torch.bfloat16, "cuda", _gen(5), "bias")
    eager_first = spec.fn(**inputs)  # searched here
    fresh = spec.make_inputs((2, 700, 2048, 2560), torch.bfloat16, "cuda", _gen(6), "bias")
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(stream), torch.cuda.graph(graph, stream=stream):
        out_known = spec.fn(**inputs)
        out_fresh = spec.fn(**fresh)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out_known, eager_first)
    torch.testing.assert_close(out_fresh, spec.reference(**fresh), atol=2e-2, rtol=1.6e-2)
    line = [c for c in ops.gemm_choices() if "n 2560 k 2048" in c]
    assert len(line) == 1 and "captured before tuning" in line[0]
    spec.fn(**fresh)  # eager now: searched
    line = [c for c in ops.gemm_choices() if "n 2560 k 2048" in c]
    assert len(line) == 1 and "sampled" in line[0]


def test_linear_choices_travel_between_processes_as_checked_records():
    """gemm_export writes the searched choices as text; gemm_import keeps a record only if it is well formed, of this
    cuBLASLt version, for a problem not yet searched, and accepted by cublasLtMatmulAlgoCheck; a kept record then
    runs that problem (correct result, listed as from the cache) and is not exported again."""
    from ltxbench import ops

    lib = torch.ops.ltxbench
    device = torch.cuda.current_device()
    spec = SPECS["linear"]
    inputs = spec.make_inputs((1, 3072, 2048, 2048), torch.bfloat16, "cuda", _gen(7), "bias")
    spec.fn(**inputs)  # searched here
    mine = [r for r in lib.gemm_export(device) if " 3072 2048 2048 " in r.split("\t")[0]]
    assert len(mine) == 1 and mine[0].startswith("ltxgemm2 ")
    fields, summary = mine[0].split("\t")[0].split(), mine[0].split("\t")[1]
    assert len(fields) == 13 + 8 and fields[6] == "0" and "heuristic" in summary  # field 6: with a residual

    def record(**changes):
        out = list(fields)
        for index, value in changes.items():
            out[int(index[1:])] = str(value)
        return " ".join(out) + "\t" + summary

    moved = record(f7=3000)  # the same algorithm for 3000 tokens: a problem this process has not seen
    rejected = [record(f1=1, f7=3001), record(f0="ltxgemm1", f7=3002), "ltxgemm2 12", record(f7=-5),
                record(f20="x", f7=3003), record(f3=1, f6=1, f7=3004)]  # the last: GELU with a residual
    assert lib.gemm_import(device, rejected) == 0
    assert lib.gemm_import(device, [mine[0]]) == 0  # searched in this process already
    assert lib.gemm_import(device, [moved]) == 1
    fresh = spec.make_inputs((1, 3000, 2048, 2048), torch.bfloat16, "cuda", _gen(8), "bias")
    _check(spec, fresh, torch.bfloat16)
    line = [c for c in ops.gemm_choices() if "tokens 3000 n 2048 k 2048" in c]
    assert len(line) == 1 and line[0].endswith("[from cache]")
    assert not [r for r in lib.gemm_export(device) if " 3000 2048 2048 " in r.split("\t")[0]]


def test_linear_does_not_search_problems_under_a_gflop():
    """A tiny GEMM is neither searched nor timed: timing one launch on an idle stream measures host latency, which
    had sent 1-token problems into 15-second searches. 7 tokens: at most 4 take the GEMV path, not cuBLASLt."""
    from ltxbench import ops

    spec = SPECS["linear"]
    inputs = spec.make_inputs((1, 7, 1000), torch.bfloat16, "cuda", _gen(9), "no-bias")
    _check(spec, inputs, torch.bfloat16)
    line = [c for c in ops.gemm_choices() if "tokens 7 n 83 k 1000" in c]
    assert len(line) == 1 and line[0].endswith("heuristic's choice (under 1 GFLOP: not searched)")


@pytest.mark.parametrize("dtype", sorted(DTYPES))
@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5])
@pytest.mark.parametrize("variant", ["bias", "no-bias", "residual"])
def test_linear_few_rows_in_any_row_pitch(rows, variant, dtype):
    """linear's GEMV path (at most 4 rows; 5 is cuBLASLt's again) on x and weight rows of a wider buffer (a row pitch
    past K, as a fused projection's column slice has) and at Llama's K, N not a multiple of the kernel's 4 rows a
    block, bias and residual; a misaligned x falls back whole."""
    spec = SPECS["linear"]
    for k, n in ((4096, 1027), (14336, 61), (8, 3)):
        inputs = spec.make_inputs((1, rows, k, n), DTYPES[dtype], "cuda", _gen(rows), variant)
        _check(spec, inputs, DTYPES[dtype])
        padded = {**inputs, **{name: restride(inputs[name], "row-padded") for name in ("x", "weight")}}
        assert padded["x"].stride(-2) > k and padded["weight"].stride(0) > k
        _check(spec, padded, DTYPES[dtype])
        _check(spec, {**inputs, "x": restride(inputs["x"], "misaligned")}, DTYPES[dtype])


@pytest.mark.parametrize("dtype", sorted(DTYPES))
@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5])
@pytest.mark.parametrize("name,variant", [("rms_norm_linear", "llama"), ("rms_norm_linear", "gemma"),
                                          ("add_rms_norm_linear", "llama"), ("add_rms_norm_linear", "gemma"),
                                          ("add_rms_norm_linear", "llama-swiglu")])
def test_norm_linear_few_rows_in_any_row_pitch(name, variant, rows, dtype):
    """The GEMV with the norm folded in (at most 4 rows; 5 go through ATen) at Llama's K and odd N (a SwiGLU: an odd
    number of gate/up pairs, so that a block holds one), on a weight of a wider buffer's rows (a fused projection's
    rows), and a misaligned x (the ATen path): h written by block 0 only, every output row scaled by its own row's
    1/rms. The SwiGLU epilogue gives bit for bit the unfused op followed by ops.swiglu."""
    from ltxbench import ops

    spec = SPECS[name]
    swiglu = variant.endswith("swiglu")
    for k, n in ((4096, 1026 if swiglu else 1027), (14336, 62 if swiglu else 61), (8, 6 if swiglu else 3)):
        inputs = spec.make_inputs((1, rows, k, n), DTYPES[dtype], "cuda", _gen(rows), variant)
        _check(spec, inputs, DTYPES[dtype])
        _check(spec, {**inputs, "weight": restride(inputs["weight"], "row-padded")}, DTYPES[dtype])
        _check(spec, {**inputs, "x": restride(inputs["x"], "misaligned")}, DTYPES[dtype])
        if swiglu and rows <= 4:  # the epilogue's SiLU is act.cu's (fast for 16-bit, libm for fp32)
            out, h = spec.fn(**inputs)
            plain, h2 = spec.fn(**{**inputs, "activation": "none"})
            assert torch.equal(out, ops.swiglu(plain, 0)) and torch.equal(h, h2)


@pytest.mark.parametrize("name", ["rms_norm_linear", "add_rms_norm_linear"])
def test_norm_linear_checks_would_catch_a_one_percent_error(name):
    """The fp32 comparison the tests above make is tight enough to fail a kernel 1% off in its norm (a 1% larger
    weight, or an eps 1% of the mean square larger), so passing it means the formula is right."""
    spec = SPECS[name]
    inputs = spec.make_inputs((1, 2, 4096, 1027), torch.float32, "cuda", _gen(), "llama")
    got = _tuple(spec.fn(**inputs))
    atol, rtol = spec.tolerance(torch.float32)
    torch.testing.assert_close(got, _tuple(spec.reference(**inputs)), atol=atol, rtol=rtol)
    mean_square = inputs["x"].pow(2).mean().item()
    for mutant in ({**inputs, "norm_weight": inputs["norm_weight"] * 1.01},
                   {**inputs, "eps": inputs["eps"] + 0.01 * mean_square}):
        with pytest.raises(AssertionError):
            torch.testing.assert_close(got[0], _tuple(spec.reference(**mutant))[0], atol=atol, rtol=rtol)


@pytest.mark.parametrize("dtype", sorted(DTYPES))
@pytest.mark.parametrize(("heads", "hd", "rot"), [((32, 8), 128, 128), ((4, 2), 86, 64), ((3, 1), 64, 32)])
@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize(("tokens", "offset"), [(1, 0), (1, 11), (5, 3)])
def test_rope_1d_cache_writes_the_rows_a_static_cache_would(dtype, heads, hd, rot, interleaved, tokens, offset):
    """rope_1d_cache against the reference (rope_1d, then index_copy_ into the caches): q rotated, k rotated and v
    copied at rows offset + s of each cache, every other row left as it was (guard values); q/k/v as column slices
    of one fused projection (transposed views, as the attention makes them); eager, compiled and opcheck'd."""
    from ltxbench import ops

    hq, hk = heads
    if interleaved and hd % 2:
        pytest.skip("interleaved pairs need an even head dim")
    gen = torch.Generator("cuda").manual_seed(hq + hd + tokens + offset)
    b, length = 2, 16
    qkv = torch.randn(b, tokens, (hq + 2 * hk) * hd, device="cuda", generator=gen).to(DTYPES[dtype])
    q, k, v = (t.unflatten(-1, (-1, hd)).transpose(1, 2) for t in qkv.split([hq * hd, hk * hd, hk * hd], -1))
    cos, sin = (torch.randn(b * tokens, rot // 2, device="cuda", generator=gen) for _ in range(2))
    at = torch.tensor(offset, device="cuda")
    guard = torch.full((b, hk, length, hd), 7.0, device="cuda", dtype=DTYPES[dtype])
    caches = [guard.clone() for _ in range(4)]
    want = reference.rope_1d_cache(q, k, v, cos, sin, caches[0], caches[1], at, interleaved)
    got = ops.rope_1d_cache(q, k, v, cos, sin, caches[2], caches[3], at, interleaved)
    atol, rtol = SPECS["rope_1d"].tolerance(DTYPES[dtype])
    torch.testing.assert_close(got, want, atol=atol, rtol=rtol)
    torch.testing.assert_close(caches[2], caches[0], atol=atol, rtol=rtol)
    assert torch.equal(caches[3], caches[1])  # v: a copy
    rows = torch.ones(length, dtype=torch.bool)
    rows[offset:offset + tokens] = False
    assert (caches[2][:, :, rows] == 7).all() and (caches[3][:, :, rows] == 7).all()
    compiled_caches = [guard.clone() for _ in range(2)]
    torch._dynamo.reset()  # one code object compiled per parametrization: no recompile limit across them
    compiled = torch.compile(lambda *a: ops.rope_1d_cache(*a, interleaved), fullgraph=True)(
        q, k, v, cos, sin, *compiled_caches, at)
    assert torch.equal(compiled, got) and torch.equal(compiled_caches[0], caches[2])
    torch.library.opcheck(torch.ops.ltxbench.rope_1d_cache.default,
                          (q, k, v, cos, sin, guard.clone(), guard.clone(), at, interleaved))


_CLUSTER_SCRIPT = """
import sys, torch
from ltxbench import ops
from ltxbench.ops.inputs_matmul import inputs_decode_attention
length, dtype, variant, path = int(sys.argv[1]), getattr(torch, sys.argv[2]), sys.argv[3], sys.argv[4]
inp = inputs_decode_attention((1, length, 512), dtype, 'cuda', torch.Generator().manual_seed(length), variant)
ops.decode_attention(inp['q'], inp['k'], inp['v'], inp['mask'], inp['scale'])
with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
    out = ops.decode_attention(inp['q'], inp['k'], inp['v'], inp['mask'], inp['scale'])
    torch.cuda.synchronize()
names = [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
torch.save({'out': out.cpu(), 'merge_kernel': any('merge_kernel' in n for n in names)}, path)
"""


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("variant", ["llama", "odd-head-dim"])
@pytest.mark.parametrize("length", [83, 400, 700])
def test_decode_attention_merged_in_a_cluster_gives_the_merge_kernels_bits(tmp_path, length, variant, dtype):
    """On Hopper (the default; LTXBENCH_DECODE_CLUSTER=1 here) the key splits (one group: 3, 13 and, natural 22,
    16 of 32 keys) merge inside a thread block cluster: no merge kernel runs, and where the splits are the same as
    the merge kernel's (3, 13) the bits are too; at 700 keys both are within the op's tolerance of the reference.
    The merge kernel runs in a process with LTXBENCH_DECODE_CLUSTER=0."""
    import os
    import subprocess
    import sys

    from ltxbench.ops.inputs_matmul import inputs_decode_attention

    if torch.cuda.get_device_capability() < (9, 0):
        pytest.skip("thread block clusters need compute capability 9.0")
    runs = {}
    for cluster in ("1", "0"):
        path = tmp_path / f"cluster{cluster}.pt"
        env = {**os.environ, "LTXBENCH_DECODE_CLUSTER": cluster}
        subprocess.run([sys.executable, "-c", _CLUSTER_SCRIPT, str(length), dtype, variant, str(path)], env=env,
                       check=True, timeout=600)
        runs[cluster] = torch.load(path)
    assert not runs["1"]["merge_kernel"] and runs["0"]["merge_kernel"]
    if length < 700:
        assert torch.equal(runs["1"]["out"], runs["0"]["out"])
    inp = inputs_decode_attention((1, length, 512), getattr(torch, dtype), "cpu", torch.Generator().manual_seed(length),
                                  variant)
    want = reference.decode_attention(inp["q"].float(), inp["k"].float(), inp["v"].float(), inp["mask"], inp["scale"])
    atol, rtol = SPECS["decode_attention"].tolerance(getattr(torch, dtype))
    for cluster, run in runs.items():
        torch.testing.assert_close(run["out"].float(), want, atol=atol, rtol=rtol, msg=f"cluster={cluster}")


def _decode_layers(x, layers, cos, sin, offset, keep, sync=False):
    """Llama-like decode layers on the ops a decode step runs (GEMVs with and without the norm, RoPE with the cache
    write, split decode attention and its merge, SwiGLU in the GEMV), each reading what the one before wrote; every
    intermediate is returned. sync=True waits for each op before the next is launched."""
    from ltxbench import ops
    from ltxbench.ops import norm_linear

    def step(t):
        if sync:
            torch.cuda.synchronize()
        made.append(t)
        return t

    made = []
    for g1, wqkv, k_cache, v_cache, wo, g2, wgu, wd in layers:
        hd, kv_heads = k_cache.shape[-1], k_cache.shape[1]
        qkv = step(norm_linear.rms_norm_linear(x, g1, 1e-5, wqkv))
        widths = [wo.shape[1], kv_heads * hd, kv_heads * hd]
        q, k, v = (t.unflatten(-1, (-1, hd)).transpose(1, 2) for t in qkv.split(widths, -1))
        q = step(ops.rope_1d_cache(q, k, v, cos, sin, k_cache, v_cache, offset))
        attn = step(ops.decode_attention(q.reshape(1, kv_heads, -1, hd), k_cache, v_cache, keep))
        proj = step(ops.linear(attn.reshape(1, 1, -1), wo))
        gated, h = step(norm_linear.add_rms_norm_linear(proj, x, g2, 1e-5, wgu, activation="swiglu"))
        x = step(ops.linear(gated, wd, None, "none", h))
    return x, made


def test_decode_step_ops_in_a_cuda_graph_give_the_bits_of_one_launch_at_a_time():
    """A decode step runs our ops inside transformers' CUDA graph: four layers captured in one graph, every
    intermediate poisoned with NaN before each replay, give bit for bit what the same ops give launched one at a time
    with the GPU idle in between (and so does the stream without the host's waits): no op reads what it has not
    been given, none depends on launch timing, the static cache rows are the same."""
    gen = torch.Generator("cuda").manual_seed(3)
    hidden, heads, kv_heads, hd, inter, length, at = 4096, 32, 8, 128, 14336, 2048, 1500

    def rand(*shape, scale=1.0):
        return (torch.randn(*shape, device="cuda", generator=gen) * scale).to(torch.bfloat16)

    layers = [(rand(hidden, scale=0.1) + 1, rand((heads + 2 * kv_heads) * hd, hidden, scale=hidden ** -0.5),
               rand(1, kv_heads, length, hd), rand(1, kv_heads, length, hd), rand(hidden, heads * hd, scale=0.02),
               rand(hidden, scale=0.1) + 1, rand(2 * inter, hidden, scale=hidden ** -0.5),
               rand(hidden, inter, scale=0.01)) for _ in range(4)]
    angles = torch.rand(1, hd // 2, device="cuda", generator=gen) * 6
    cos, sin = angles.cos(), angles.sin()
    offset = torch.tensor(at, device="cuda")
    keep = (torch.arange(length, device="cuda") <= at).view(1, 1, 1, length)
    x = rand(1, 1, hidden)
    caches = [t for layer in layers for t in layer[2:4]]
    initial = [c.clone() for c in caches]

    def restore():
        for c, c0 in zip(caches, initial, strict=True):
            c.copy_(c0)

    want, _ = _decode_layers(x, layers, cos, sin, offset, keep, sync=True)
    want_caches = [c.clone() for c in caches]
    assert torch.isfinite(want.float()).all() and want.float().abs().max() > 0.1, want
    restore()
    streamed, _ = _decode_layers(x, layers, cos, sin, offset, keep)
    assert torch.equal(streamed, want), "launched back to back, the ops gave other bits than one at a time"
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(stream), torch.cuda.graph(graph, stream=stream):
        out, made = _decode_layers(x, layers, cos, sin, offset, keep)
    for replay in range(10):
        restore()
        for t in made + [out]:
            for part in _tuple(t):
                part.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, want), f"replay {replay}: the graph's output differs ({out.isnan().sum()} NaN)"
        assert all(torch.equal(c, w) for c, w in zip(caches, want_caches, strict=True)), f"replay {replay}: caches"


def test_a_process_records_the_kernel_files_it_ran():
    """nvcc-compiled kernel files record their entry under their own name: an RMSNorm enters norm.cu and its binding
    file, not the decode attention's files (a result's provenance reads this list)."""
    import ast
    import subprocess
    import sys

    script = ("import torch; from ltxbench import ops; from ltxbench.ops import build; "
              "x = torch.randn(8, 4096, device='cuda', dtype=torch.bfloat16); "
              "ops.rms_norm(x, torch.ones(4096, device='cuda', dtype=torch.bfloat16), 1e-6); "
              "torch.cuda.synchronize(); print(build.sources_used())")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=600)
    used = ast.literal_eval(out.stdout.strip().splitlines()[-1])
    assert "cuda/norm.cu" in used and "cuda/decode_attn.cu" not in used and "cuda/gemv.cu" not in used
    assert "cuda/bindings/norm.cpp" in used and "cuda/bindings/attn.cpp" not in used  # bindings with their folder
