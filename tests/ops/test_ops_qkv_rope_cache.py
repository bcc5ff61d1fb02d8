"""rms_norm_qkv_rope_cache (ltxbench.ops.norm_linear): a decode step's input norm, q/k/v GEMV, neox RoPE and static KV
cache writes as one op. Its fake and schema on the CPU; on a GPU (marked `gpu`): the same bits as the two ops it
stands for (rms_norm_linear, then rope_1d_cache), the reference's values within the GEMV's tolerance, the ATen path
for the inputs the GEMV does not take, compile, opcheck and the named errors."""

from __future__ import annotations

import pytest
import torch

from ltxbench.ops import norm_linear
from ltxbench.ops.registry import SPECS

# (batch, tokens a sequence, query heads, key/value heads, head_dim, hidden): Llama-3-8B's, a GQA-2 batch of 2, a
# 3-token step, Qwen-like 64-wide heads over 4 rows, and a K the GEMV does not take (not whole 16-byte vectors).
SHAPES = [(1, 1, 32, 8, 128, 4096), (2, 1, 4, 2, 64, 512), (1, 3, 8, 2, 128, 768), (4, 1, 14, 2, 64, 896),
          (1, 1, 4, 1, 128, 83)]


def make(batch, seq, heads_q, heads_kv, head_dim, hidden, dtype, device="cpu", length=24, per_token=True, seed=0):
    """Operands at a trained model's magnitudes (inputs_norm_linear's x, norm weight and projection), per-token RoPE
    tables at positions 5..5+S, caches filled with noise (rows the op must leave alone) and the offset 5."""
    gen = torch.Generator().manual_seed(seed)
    inp = SPECS["rms_norm_linear"].make_inputs((batch, seq, hidden, (heads_q + 2 * heads_kv) * head_dim), dtype, "cpu",
                                               gen, "llama")
    half = head_dim // 2
    freqs = 500000.0 ** (-torch.arange(half, dtype=torch.float64) / half)
    positions = 5 + torch.arange(seq, dtype=torch.float64)
    angles = (positions[:, None] * freqs).float().repeat(batch if per_token else 1, 1)
    caches = [torch.randn(batch, heads_kv, length, head_dim, generator=gen).to(dtype) for _ in range(2)]
    args = dict(x=inp["x"], norm_weight=inp["norm_weight"], eps=inp["eps"], weight=inp["weight"], cos=angles.cos(),
                sin=angles.sin(), k_cache=caches[0], v_cache=caches[1], offset=torch.tensor([5]))
    return {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in args.items()}


def test_fake_lays_q_out_as_the_reference_and_marks_the_caches_written(built_ops):
    """Under FakeTensorMode on "cuda" tensors: q (B, Hq, S, hd) with the reference's strides (token-major storage,
    as rope_1d_cache returns it); the schema marks k_cache and v_cache (only) as written."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    for shape in SHAPES:
        real = make(*shape, torch.bfloat16)
        want = norm_linear.reference.rms_norm_qkv_rope_cache(**{k: v.clone() if isinstance(v, torch.Tensor) else v
                                                               for k, v in real.items()})
        with FakeTensorMode():
            fake = {k: torch.empty_strided(v.shape, v.stride(), dtype=v.dtype, device="cuda")
                    if isinstance(v, torch.Tensor) else v for k, v in real.items()}
            got = norm_linear.rms_norm_qkv_rope_cache(**fake)
        assert (got.shape, got.dtype, got.device.type) == (want.shape, want.dtype, "cuda")
        assert [s for s, n in zip(got.stride(), got.shape, strict=True) if n > 1] == \
            [s for s, n in zip(want.stride(), want.shape, strict=True) if n > 1]
    schema = torch.ops.ltxbench.rms_norm_qkv_rope_cache.default._schema
    written = [a.name for a in schema.arguments if a.alias_info is not None and a.alias_info.is_write]
    assert written == ["k_cache", "v_cache"] and len(schema.returns) == 1


def test_cpu_tensors_get_a_clear_error_naming_the_argument(built_ops):
    with pytest.raises(RuntimeError, match=r"ltxbench\.rms_norm_qkv_rope_cache: x must be a CUDA tensor"):
        norm_linear.rms_norm_qkv_rope_cache(**make(*SHAPES[1], torch.float32))


def _two_ops(args):
    """What the fused op stands for, on our kernels: rms_norm_linear, then rope_1d_cache of its q, k and v (the spec's
    `ltxbench-unfused` baseline)."""
    from ltxbench.ops.registry_decode import ltxbench_rms_norm_qkv_rope_cache

    return ltxbench_rms_norm_qkv_rope_cache(**args)


def _copies(args):
    return {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in args.items()}


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32], ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("per_token", [True, False], ids=["tables-per-token", "tables-shared"])
def test_gives_the_bits_of_rms_norm_linear_then_rope_1d_cache(dtype, shape, per_token):
    """q and both caches bit for bit as the two ops give them (the GEMV's sums rounded before the same fp32
    rotation; rows other than offset + s untouched), and within the GEMV's tolerance of the fp32 reference. Where
    the GEMV does not take the inputs (K = 83), ATen's rotation: within one rounding of the two ops."""
    args = make(*shape, dtype, "cuda", per_token=per_token)
    fused, unfused, ref = _copies(args), _copies(args), _copies(args)
    got = norm_linear.rms_norm_qkv_rope_cache(**fused)
    want = _two_ops(unfused)
    assert got.shape == want.shape and got.stride() == want.stride()
    same = torch.equal if shape[-1] % 8 == 0 else \
        (lambda a, b: torch.allclose(a.float(), b.float(), atol=1e-6, rtol=2 * torch.finfo(dtype).eps))
    assert same(got, want)
    assert same(fused["k_cache"], unfused["k_cache"]) and same(fused["v_cache"], unfused["v_cache"])
    written = torch.zeros(args["k_cache"].shape[2], dtype=torch.bool)
    written[5:5 + shape[1]] = True
    for name in ("k_cache", "v_cache"):
        assert torch.equal(fused[name][:, :, ~written.cuda()], args[name][:, :, ~written.cuda()])
    expected = norm_linear.reference.rms_norm_qkv_rope_cache(**ref)  # fp32 math, rounded as the op rounds
    atol, rtol = SPECS["rms_norm_linear"].tolerance(dtype)
    torch.testing.assert_close(got, expected, atol=atol, rtol=rtol)
    for name in ("k_cache", "v_cache"):
        torch.testing.assert_close(fused[name], ref[name], atol=atol, rtol=rtol)


@pytest.mark.gpu
@pytest.mark.parametrize("case", ["no-rows", "strided-x", "k-5125", "k-7"])
def test_edge_inputs_match_the_two_ops(case):
    """No rows (nothing written, an empty q), x a strided view (a wider buffer's first K columns), and odd hidden
    sizes 5125 and 7 (the ATen path: not whole 16-byte vectors): as the two ops, within one rounding."""
    hidden = {"k-5125": 5125, "k-7": 7}.get(case, 512)
    args = make(2, 1, 4, 2, 64, hidden, torch.bfloat16, "cuda")
    if case == "no-rows":
        args["x"] = args["x"][:, :0]
        args["cos"], args["sin"] = args["cos"][:0], args["sin"][:0]
    if case == "strided-x":
        wide = torch.randn(2, 1, hidden + 64, device="cuda", dtype=torch.bfloat16)
        wide[..., :hidden] = args["x"]
        args["x"] = wide[..., :hidden]
    fused, unfused = _copies(args), _copies(args)
    fused["x"], unfused["x"] = args["x"], args["x"]  # the view itself, not a compact copy
    got = norm_linear.rms_norm_qkv_rope_cache(**fused)
    if case == "no-rows":
        assert got.shape == (2, 4, 0, 64)
        assert torch.equal(fused["k_cache"], args["k_cache"]) and torch.equal(fused["v_cache"], args["v_cache"])
        return
    want = _two_ops(unfused)
    for a, b in ((got, want), (fused["k_cache"], unfused["k_cache"]), (fused["v_cache"], unfused["v_cache"])):
        torch.testing.assert_close(a.float(), b.float(), atol=1e-6, rtol=2 * torch.finfo(torch.bfloat16).eps)


@pytest.mark.gpu
def test_a_one_percent_rotation_error_fails_the_bit_check():
    """The check above can fail: sin 1% off in the two-op path changes q's bits."""
    args = make(*SHAPES[0], torch.bfloat16, "cuda")
    got = norm_linear.rms_norm_qkv_rope_cache(**_copies(args))
    changed = _copies(args)
    changed["sin"] = changed["sin"] * 1.01
    assert not torch.equal(got, _two_ops(changed))


@pytest.mark.gpu
def test_compiles_fullgraph_and_passes_opcheck():
    args = make(*SHAPES[1], torch.bfloat16, "cuda")
    want = norm_linear.rms_norm_qkv_rope_cache(**_copies(args))
    compiled = _copies(args)
    got = torch.compile(lambda a: norm_linear.rms_norm_qkv_rope_cache(**a), fullgraph=True)(compiled)
    assert torch.equal(got, want)
    assert int(compiled["offset"]) == 5  # the caller advances the length, not the op
    torch.library.opcheck(torch.ops.ltxbench.rms_norm_qkv_rope_cache.default, tuple(_copies(args).values()))


@pytest.mark.gpu
def test_replayed_in_a_cuda_graph_it_writes_the_row_the_length_names():
    """Captured once and replayed with the length advanced in between (as a decode step's graph is): each replay
    writes row offset, reading the length on the device, not the value seen at capture."""
    args = make(*SHAPES[0], torch.bfloat16, "cuda", length=12)
    norm_linear.rms_norm_qkv_rope_cache(**_copies(args))  # the build and first launch outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        norm_linear.rms_norm_qkv_rope_cache(**args)
        args["offset"].add_(1)
    start = int(args["offset"])
    for _ in range(3):
        graph.replay()
    torch.cuda.synchronize()
    want = _copies(args)
    for row in range(start, start + 3):  # the two-op path writing the same rows one by one
        want["offset"] = torch.tensor([row], device="cuda")
        _two_ops(want)
    assert torch.equal(args["k_cache"], want["k_cache"]) and torch.equal(args["v_cache"], want["v_cache"])


@pytest.mark.gpu
@pytest.mark.parametrize(("change", "message"), [
    (lambda a: a.update(k_cache=a["k_cache"][:, :, :, :-2].contiguous()), "v_cache has shape"),
    (lambda a: a.update(weight=a["weight"][:-32]), "weight must be \\[q \\| k \\| v\\]"),
    (lambda a: a.update(cos=a["cos"][:, :-1].contiguous()), "cos must be a per-token"),
    (lambda a: a.update(offset=a["offset"].float()), "offset must be one int64 value"),
    (lambda a: a.update(k_cache=a["k_cache"].half()), "k_cache has dtype"),
])
def test_bad_arguments_name_the_argument(change, message):
    args = make(*SHAPES[1], torch.bfloat16, "cuda")
    change(args)
    with pytest.raises(RuntimeError, match=rf"ltxbench\.rms_norm_qkv_rope_cache: {message}"):
        norm_linear.rms_norm_qkv_rope_cache(**args)
