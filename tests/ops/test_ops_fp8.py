"""FP8 (e4m3, one float32 scale per row): the reference's own properties, the comparison rule the generic tests and
`bench micro` apply to FP8 outputs (and the kernels it must fail), the fakes and schemas, and linear_fp8 (torch's
row-wise _scaled_mm, which also runs on the CPU). The kernels against the reference on every spec's shapes, dtypes,
layouts and empty inputs, opcheck and fullgraph compile: tests/ops/test_ops_gpu.py, through the KernelSpecs."""

import inspect

import pytest
import torch
import torch.nn.functional as F
from torch._subclasses.fake_tensor import FakeTensorMode

import ltxbench.ops as ops
from ltxbench.bench import micro
from ltxbench.ops import eager, reference
from ltxbench.ops.accuracy import fp8_mismatch
from ltxbench.ops.registry import DTYPES, SPECS

FP8 = torch.float8_e4m3fn
FP8_OPS = ("rms_norm_modulate_fp8", "add_rms_norm_modulate_fp8", "gelu_tanh_fp8", "quantize_fp8")
ZERO_ROW_SCALE = torch.tensor(1e-12, dtype=torch.float32) / 448.0


def _gen(seed=0):
    return torch.Generator().manual_seed(seed)


def _inputs(name, shape, dtype=torch.bfloat16, device="cpu", variant=None, seed=0):
    spec = SPECS[name]
    return spec.make_inputs(shape, dtype, device, _gen(seed), variant or spec.variants[0])


# ---- the reference: per-row quantization ---------------------------------------------------------------------

@pytest.mark.parametrize("dtype", sorted(DTYPES))
@pytest.mark.parametrize("width", [7, 83, 769, 2048, 5125])
def test_round_trip_is_within_half_an_e4m3_step(dtype, width):
    """q · x_scale is y rounded to e4m3 in units of x_scale: off by at most half a step, 2^-4 of the value (3 mantissa
    bits) or 2^-10 of x_scale below the normal range; so by at most 1/16 of the row's max."""
    x = (torch.randn(5, width, generator=_gen()) * torch.logspace(-3, 2, 5)[:, None]).to(DTYPES[dtype])
    q, scale = reference.quantize_fp8(x)
    y = x.float()
    deq = q.float() * scale
    assert q.dtype == FP8 and scale.dtype == torch.float32 and scale.shape == (5, 1)
    bound = torch.maximum(y.abs() * 2.0 ** -4, scale * 2.0 ** -10) * (1 + 1e-6)
    assert ((deq - y).abs() <= bound).all()
    assert ((deq - y).abs().amax(-1) <= y.abs().amax(-1) / 16).all()
    torch.testing.assert_close(scale, y.abs().amax(-1, keepdim=True) / 448, atol=0, rtol=0)


def test_the_row_max_saturates_at_448_and_nothing_beyond():
    """Each row's largest |y| maps to ±448, the largest finite e4m3, whatever fp32 makes of amax / (amax / 448);
    no value overflows to NaN (a cast of |v| >= 464 without the clamp would)."""
    x = torch.randn(64, 333, generator=_gen()) * torch.logspace(-8, 8, 64)[:, None]
    q, scale = reference.quantize_fp8(x)
    v = q.float()
    assert not v.isnan().any() and (v.abs() <= 448).all()
    at_max = v.gather(-1, x.abs().argmax(-1, keepdim=True))
    assert torch.equal(at_max.abs(), torch.full_like(at_max, 448.0))
    assert torch.equal(at_max.sign(), x.gather(-1, x.abs().argmax(-1, keepdim=True)).sign())
    assert (x / scale).abs().max() > 448  # some rows do land above 448 in fp32: the clamp is what holds them


def test_zero_rows_get_the_floor_scale_and_zero_values():
    x = torch.randn(3, 4, 64, generator=_gen())
    x[1, 2] = 0
    q, scale = reference.quantize_fp8(x)
    assert torch.equal(scale[1, 2], ZERO_ROW_SCALE.reshape(1)) and (q[1, 2].float() == 0).all()
    assert (scale[0] > ZERO_ROW_SCALE).all()
    q2, scale2 = eager.fp8_rows(x)  # the eager baseline agrees
    assert torch.equal(scale2, scale) and torch.equal(q2.view(torch.uint8), q.view(torch.uint8))


@pytest.mark.parametrize("shape", [(0, 4, 64), (2, 0, 64), (2, 3, 0)], ids=str)
@pytest.mark.parametrize("name", FP8_OPS)
def test_empty_inputs(name, shape):
    """No rows: empty outputs. Rows of width 0: q empty, every scale the all-zero row's."""
    out = SPECS[name].reference(**_inputs(name, shape))
    q, scale = out[0], out[1]
    assert q.shape == shape and q.dtype == FP8 and scale.shape == (*shape[:-1], 1)
    assert torch.equal(scale, ZERO_ROW_SCALE.expand(scale.shape))


@pytest.mark.parametrize("variant", ["per-batch", "per-token", "ltx-unbind", "weight"])
def test_norm_is_quantized_from_fp32_never_rounded_to_the_input_dtype(variant):
    """rms_norm_modulate_fp8 of bf16 inputs = quantize_fp8 of the fp32 rms_norm_modulate of the same values."""
    kw = _inputs("rms_norm_modulate_fp8", (2, 9, 256), variant=variant)
    as_f32 = {k: v.float() if isinstance(v, torch.Tensor) else v for k, v in kw.items()}
    q, scale = reference.rms_norm_modulate_fp8(**kw)
    q32, scale32 = reference.quantize_fp8(reference.rms_norm_modulate(**as_f32))
    assert torch.equal(scale, scale32) and torch.equal(q.view(torch.uint8), q32.view(torch.uint8))
    q16, _ = reference.quantize_fp8(reference.rms_norm_modulate(**kw))  # rounded to bf16 first: another result
    assert not torch.equal(q.view(torch.uint8), q16.view(torch.uint8))


@pytest.mark.parametrize("variant", ["gate", "no-gate"])
def test_add_norm_returns_the_rounded_residual_and_normalizes_it(variant):
    kw = _inputs("add_rms_norm_modulate_fp8", (2, 9, 256), variant=variant)
    q, scale, h_new = reference.add_rms_norm_modulate_fp8(**kw)
    _, h_expected = reference.add_rms_norm_modulate(**kw)
    assert h_new.dtype == torch.bfloat16 and torch.equal(h_new, h_expected)
    q2, scale2 = reference.rms_norm_modulate_fp8(h_new, None, kw["scale"], kw["shift"], kw["eps"])
    assert torch.equal(scale, scale2) and torch.equal(q.view(torch.uint8), q2.view(torch.uint8))


def test_public_functions_have_the_reference_signatures():
    for name in (*FP8_OPS, "linear_fp8"):
        assert inspect.signature(getattr(ops, name)) == inspect.signature(getattr(reference, name)), name


# ---- the comparison rule: what passes, what must fail -------------------------------------------------------------

def _quantize_with(y, scale):
    return (y / scale).clamp(-448, 448).to(FP8)


@pytest.mark.parametrize("name", ["rms_norm_modulate_fp8", "gelu_tanh_fp8"])
def test_the_rule_passes_fp32_noise_and_fails_a_bf16_intermediate_or_an_off_scale(name):
    """What a correct kernel may differ by (fp32 ulps in y, the reciprocal instead of the division) passes; y rounded
    to bf16 before the quantization (the eager baseline's path) and a 1% different scale fail, reported or not."""
    kw = _inputs(name, (2, 256, 2048))
    if name == "gelu_tanh_fp8":
        y = F.gelu(kw["x"].float(), approximate="tanh")
    else:
        as_f32 = {k: v.float() if isinstance(v, torch.Tensor) else v for k, v in kw.items()}
        y = reference.rms_norm_modulate(**as_f32)
    q, scale = SPECS[name].reference(**kw)
    assert fp8_mismatch(q, scale, q, scale) == (0.0, None)
    noisy = y * (1 + 2.0 ** -23 * torch.randint(-2, 3, y.shape, generator=_gen()).float())
    assert fp8_mismatch(*reference.quantize_fp8(noisy), q, scale)[1] is None
    reciprocal = (y * (1 / scale)).clamp(-448, 448).to(FP8)
    assert fp8_mismatch(reciprocal, scale, q, scale)[1] is None

    y16 = y.bfloat16()
    _, why = fp8_mismatch(_quantize_with(y16.float(), scale), scale, q, scale)  # the fp32 row's scale, bf16 values
    assert why is not None and "differ from the reference" in why
    _, why = fp8_mismatch(*reference.quantize_fp8(y16), q, scale)  # bf16 values and their scale
    assert why is not None
    eager_out = SPECS[name].baselines["eager"](**kw)
    assert fp8_mismatch(*eager_out, q, scale)[1] is not None
    assert fp8_mismatch(*eager_out, q, scale, SPECS[name].tolerance(torch.bfloat16))[1] is None  # baselines' rule
    _, why = fp8_mismatch(_quantize_with(y, scale * 1.01), scale * 1.01, q, scale)
    assert why is not None and "x_scale" in why
    _, why = fp8_mismatch(_quantize_with(y, scale * 1.01), scale, q, scale)  # the right scale reported, not used
    assert why is not None and "differ from the reference" in why


def test_the_rule_fails_a_value_off_by_two_steps_and_a_nan():
    q, scale = reference.quantize_fp8(torch.randn(4, 2048, generator=_gen()))
    bumped = q.float()
    bumped[1, 7] = bumped[1, 7] * 1.25 + 1  # two or more e4m3 steps away
    assert "more than one e4m3 step" in fp8_mismatch(bumped.to(FP8), scale, q, scale)[1]
    poisoned = q.float()
    poisoned[2, 0] = float("nan")
    assert fp8_mismatch(poisoned.to(FP8), scale, q, scale)[1] is not None
    assert fp8_mismatch(q, scale.double(), q, scale)[1].startswith("q must be float8_e4m3fn and x_scale float32")


def test_bench_micro_checks_fp8_outputs_with_the_rule():
    """check_outputs pairs q with its scale; the kernel is held to the FP8 contract, a baseline (which rounds y to
    the model dtype by design) to the dtype's tolerance and one e4m3 step."""
    kw = _inputs("add_rms_norm_modulate_fp8", (2, 128, 2048))
    spec = SPECS["add_rms_norm_modulate_fp8"]
    ref, base = spec.reference(**kw), spec.baselines["eager"](**kw)
    tol = spec.tolerance(torch.bfloat16)
    assert micro.check_outputs(ref, ref, *tol)["passed"]
    strict = micro.check_outputs(base, ref, *tol)
    assert not strict["passed"] and "x_scale values off" in strict["reason"]
    assert micro.check_outputs(base, ref, *tol, fp8_contract=False)["passed"]
    h_off = (ref[0], ref[1], ref[2] + 1)
    assert not micro.check_outputs(h_off, ref, *tol)["passed"]


def test_bytes_moved_count_one_byte_a_value_and_four_a_row():
    b, s, d = 2, 8064, 2048
    kw = _inputs("rms_norm_modulate_fp8", (b, s, d), variant="per-batch")
    modulation = 2 * b * d * 2
    assert SPECS["rms_norm_modulate_fp8"].bytes_moved(kw) == b * s * d * 2 + modulation + b * s * d + 4 * b * s
    kw = _inputs("add_rms_norm_modulate_fp8", (b, s, d), variant="no-gate")
    assert SPECS["add_rms_norm_modulate_fp8"].bytes_moved(kw) == 2 * b * s * d * 2 + modulation + b * s * d \
        + 4 * b * s + b * s * d * 2
    kw = _inputs("gelu_tanh_fp8", (2, 8064, 8192))
    assert SPECS["gelu_tanh_fp8"].bytes_moved(kw) == 2 * 8064 * 8192 * 3 + 4 * 2 * 8064


# ---- fakes and schemas (the built library, no GPU) -----------------------------------------------------------

@pytest.mark.parametrize("name", FP8_OPS)
def test_fakes_give_contiguous_fp8_and_one_scale_per_row_for_strided_inputs(built_ops, name):
    real = _inputs(name, (2, 7, 96))
    first = next(iter(real))
    real[first] = real[first].transpose(0, 1).contiguous().transpose(0, 1)  # (B, S, D) view of (S, B, D) memory
    with FakeTensorMode():
        fake = {k: torch.empty_strided(v.shape, v.stride(), dtype=v.dtype, device="cuda")
                if isinstance(v, torch.Tensor) else v for k, v in real.items()}
        out = SPECS[name].fn(**fake)
    q, scale = out[0], out[1]
    assert q.device.type == "cuda" and q.dtype == FP8 and q.shape == (2, 7, 96) and q.is_contiguous()
    assert scale.dtype == torch.float32 and scale.shape == (2, 7, 1) and scale.is_contiguous()
    if name == "add_rms_norm_modulate_fp8":
        assert out[2].dtype == torch.bfloat16 and out[2].shape == (2, 7, 96) and out[2].is_contiguous()


def test_fp8_schemas(built_ops):
    schemas = {name: str(getattr(torch.ops.ltxbench, name).default._schema) for name in FP8_OPS}
    assert schemas == {
        "rms_norm_modulate_fp8": "ltxbench::rms_norm_modulate_fp8(Tensor x, Tensor? weight, Tensor scale, "
                                 "Tensor shift, float eps) -> (Tensor, Tensor)",
        "add_rms_norm_modulate_fp8": "ltxbench::add_rms_norm_modulate_fp8(Tensor h, Tensor a, Tensor? gate, "
                                     "Tensor scale, Tensor shift, float eps) -> (Tensor, Tensor, Tensor)",
        "gelu_tanh_fp8": "ltxbench::gelu_tanh_fp8(Tensor x) -> (Tensor, Tensor)",
        "quantize_fp8": "ltxbench::quantize_fp8(Tensor x) -> (Tensor, Tensor)",
    }


def test_quantize_fp8_fake_keeps_any_leading_dims(built_ops):
    with FakeTensorMode():
        q, scale = ops.quantize_fp8(torch.empty(8192, 2048, dtype=torch.bfloat16, device="cuda"))  # a weight
        q1, scale1 = ops.gelu_tanh_fp8(torch.empty(5, dtype=torch.float16, device="cuda"))
    assert (q.shape, scale.shape, q1.shape, scale1.shape) == ((8192, 2048), (8192, 1), (5,), (1,))


# ---- linear_fp8: torch._scaled_mm, row-wise ------------------------------------------------------------------

def _linear_operands(m=37, k=256, n=96, device="cpu", seed=0):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(2, m, k, generator=gen).to(device)
    w = ((2 * torch.rand(n, k, generator=gen) - 1) * k ** -0.5).to(device)
    bias = ((2 * torch.rand(n, generator=gen) - 1) * k ** -0.5).to(device, torch.bfloat16)
    return x, w, bias


def _cpu_rowwise_scaled_mm() -> bool:
    """torch._scaled_mm with row-wise scales on the CPU (torch 2.11's CPU backend takes per-tensor scales only)."""
    one = torch.ones(16, 16).to(torch.float8_e4m3fn)
    try:
        torch._scaled_mm(one, one.t(), scale_a=torch.ones(16, 1), scale_b=torch.ones(1, 16), out_dtype=torch.bfloat16)
    except RuntimeError:
        return False
    return True


cpu_rowwise = pytest.mark.skipif(not _cpu_rowwise_scaled_mm(), reason="this torch's CPU _scaled_mm is per-tensor only")


@cpu_rowwise
def test_linear_fp8_matches_the_reference_on_the_cpu():
    x, w, bias = _linear_operands()
    xq, xs = reference.quantize_fp8(x)
    wq, ws = reference.quantize_fp8(w)
    for b, wscale in ((bias, ws), (None, ws.reshape(-1))):
        got = ops.linear_fp8(xq, xs, wq, wscale, b)
        want = reference.linear_fp8(xq, xs, wq, wscale, b)
        assert got.shape == (2, 37, 96) and got.dtype == torch.bfloat16
        torch.testing.assert_close(got, want, atol=1e-2, rtol=1.6e-2)
    empty = ops.linear_fp8(xq[:, :0], xs[:, :0], wq, ws)
    assert empty.shape == (2, 0, 96) and empty.dtype == torch.bfloat16


@cpu_rowwise
def test_linear_fp8_traces_in_one_graph():
    x, w, bias = _linear_operands()
    xq, xs = reference.quantize_fp8(x)
    wq, ws = reference.quantize_fp8(w)
    torch._dynamo.reset()
    compiled = torch.compile(ops.linear_fp8, fullgraph=True, backend="eager")
    assert torch.equal(compiled(xq, xs, wq, ws, bias), ops.linear_fp8(xq, xs, wq, ws, bias))


def test_linear_fp8_bad_arguments_name_the_argument():
    x, w, bias = _linear_operands()
    xq, xs = reference.quantize_fp8(x)
    wq, ws = reference.quantize_fp8(w)
    odd_q, odd_s = reference.quantize_fp8(x[..., :40])
    cases = [
        ((x, xs, wq, ws), r"x must be float8_e4m3fn, got torch.float32"),
        ((xq, xs, w, ws), r"weight must be float8_e4m3fn"),
        ((xq, xs, wq[:, :128], ws), r"weight must be \(N, K\) = \(N, 256\), got \(96, 128\)"),
        ((odd_q, odd_s, reference.quantize_fp8(w[:, :40])[0], ws), r"K = 40 and N = 96 must be multiples of 16"),
        ((xq, xs, wq[:90], ws[:90]), r"K = 256 and N = 90 must be multiples of 16"),
        ((xq, xs, wq.t().contiguous().t(), ws), r"weight must be contiguous"),
        ((xq, xs[..., 0], wq, ws), r"x_scale must be float32 \(2, 37, 1\)"),
        ((xq, xs.double(), wq, ws), r"x_scale must be float32"),
        ((xq, xs, wq, ws[:95]), r"weight_scale must be float32 \(96, 1\) or \(96,\)"),
        ((xq, xs, wq, ws, bias.half()), r"bias must be \(96,\) of out_dtype"),
        ((xq, xs, wq, ws, bias[:95]), r"bias must be \(96,\) of out_dtype"),
    ]
    for args, pattern in cases:
        with pytest.raises(ValueError, match=r"^linear_fp8: " + pattern):
            ops.linear_fp8(*args)
    with pytest.raises(ValueError, match=r"bias must be .* bfloat16 or float16 \(torch._scaled_mm\)"):
        ops.linear_fp8(xq, xs, wq, ws, bias.float(), torch.float32)
    with pytest.raises(ValueError, match=r"out_dtype must be bfloat16, float16 or float32"):
        ops.linear_fp8(xq, xs, wq, ws, None, torch.float64)


# ---- GPU: what the generic tests do not cover ---------------------------------------------------------------------

def _h100_fp8():
    return torch.cuda.is_available() and torch.cuda.get_device_capability() >= (8, 9)


@pytest.mark.gpu
@pytest.mark.parametrize("name", FP8_OPS)
@pytest.mark.parametrize("dtype", sorted(DTYPES))
def test_kernels_zero_rows_and_saturation(name, dtype):
    """A zero row (in registers and in a streamed row): scale 1e-12 / 448, q 0; every other row's max at ±448."""
    for shape in ((2, 5, 2048), (1, 3, 40960)):
        kw = _inputs(name, shape, DTYPES[dtype], "cuda")
        first = next(iter(kw))
        kw[first][0, 1] = 0
        if name == "add_rms_norm_modulate_fp8":
            kw["a"][0, 1] = 0
        if "shift" in kw:  # else the zero row's y is the shift
            kw["shift"] = torch.zeros_like(kw["shift"])
        out = SPECS[name].fn(**kw)
        q, scale = out[0].float(), out[1]
        assert scale[0, 1].item() == ZERO_ROW_SCALE.item() and (q[0, 1] == 0).all()
        rows = q.abs().amax(-1)
        rows[0, 1] = 448
        assert (rows == 448).all()


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["rms_norm_modulate_fp8", "gelu_tanh_fp8"])
def test_kernel_passes_where_a_bf16_intermediate_or_an_off_scale_fails(name):
    """At an LTX width: the kernel meets the rule; its own q with a 1% different scale, and the eager path (y rounded
    to bf16 before the quantization), do not."""
    kw = _inputs(name, (2, 1024, 8192 if name == "gelu_tanh_fp8" else 2048), device="cuda")
    spec = SPECS[name]
    ref = spec.reference(**kw)
    q, scale = spec.fn(**kw)
    assert fp8_mismatch(q, scale, *ref)[1] is None
    assert "x_scale" in fp8_mismatch(q, scale * 1.01, *ref)[1]
    assert fp8_mismatch(*spec.baselines["eager"](**kw), *ref)[1] is not None


@pytest.mark.gpu
@pytest.mark.skipif(not _h100_fp8(), reason="FP8 tensor cores: compute capability 8.9 or newer")
def test_linear_fp8_on_the_tensor_cores_matches_the_reference_and_records_its_error_against_bf16():
    """K = 2048 (LTX-2B's projections): against reference.linear_fp8 (same FP8 operands, fp32 math) the error is the
    GEMM's accumulation and bf16 output rounding; against a bf16 F.linear it is the FP8 quantization itself."""
    x, w, bias = _linear_operands(m=1000, k=2048, n=2048, device="cuda")
    xq, xs = ops.quantize_fp8(x.bfloat16())
    wq, ws = ops.quantize_fp8(w.bfloat16())
    got = ops.linear_fp8(xq, xs, wq, ws, bias).double()  # float64: an fp32 cosine over 4M values is off by 1e-4
    want = reference.linear_fp8(xq, xs, wq, ws, bias).double()
    cosine = F.cosine_similarity(got.flatten(), want.flatten(), dim=0).item()
    rel_l2 = ((got - want).norm() / want.norm()).item()
    assert cosine >= 0.9999 and rel_l2 <= 5e-3, (cosine, rel_l2)
    bf16 = F.linear(x.bfloat16(), w.bfloat16(), bias).double()
    cosine16 = F.cosine_similarity(got.flatten(), bf16.flatten(), dim=0).item()
    rel_l2_16 = ((got - bf16).norm() / bf16.norm()).item()
    print(f"linear_fp8 vs reference: cosine {cosine:.6f}, rel L2 {rel_l2:.2e}; "
          f"vs bf16 F.linear: cosine {cosine16:.6f}, rel L2 {rel_l2_16:.2e}")
    assert cosine16 >= 0.998 and rel_l2_16 <= 0.06, (cosine16, rel_l2_16)


@pytest.mark.gpu
@pytest.mark.skipif(not _h100_fp8(), reason="FP8 tensor cores: compute capability 8.9 or newer")
@pytest.mark.parametrize("k", [2048, 8192])
def test_fast_accumulation_stays_within_its_bound_and_does_reach_the_gemm(k):
    """At LTX-2B's K (2048; the feed-forward's down-projection 8192), with a few outlier channels (20x, as trained
    activations have): the tensor cores' own accumulation differs from the promoted fp32 sum (so the flag reaches
    cuBLASLt), by a relative L2 of a few 1e-3 at most, an order below the FP8 quantization's own ~3e-2."""
    x, w, bias = _linear_operands(m=1000, k=k, n=2048, device="cuda", seed=1)
    x[..., : k // 100] *= 20
    xq, xs = ops.quantize_fp8(x.bfloat16())
    wq, ws = ops.quantize_fp8(w.bfloat16())
    want = reference.linear_fp8(xq, xs, wq, ws, bias).double()
    exact = ops.linear_fp8(xq, xs, wq, ws, bias)
    fast = ops.linear_fp8(xq, xs, wq, ws, bias, fast_accumulation=True)
    assert not torch.equal(fast, exact)
    errors = {}
    for name, got in (("fp32", exact), ("fast", fast)):
        got = got.double()
        errors[name] = (F.cosine_similarity(got.flatten(), want.flatten(), dim=0).item(),
                        ((got - want).norm() / want.norm()).item())
    print(f"K={k}: linear_fp8 vs reference (cosine, rel L2): {errors}")
    assert errors["fast"][0] >= 0.99998 and errors["fast"][1] <= 6e-3, errors
    assert errors["fp32"][1] <= errors["fast"][1], errors


@pytest.mark.gpu
@pytest.mark.skipif(not _h100_fp8(), reason="FP8 tensor cores: compute capability 8.9 or newer")
def test_norm_then_fp8_projection_compiles_in_one_graph():
    """The injected pattern: modulated norm writes FP8, the projection reads it; torch.compile(fullgraph=True) keeps
    our op and _scaled_mm in one graph and gives the eager result."""
    kw = _inputs("rms_norm_modulate_fp8", (2, 64, 2048), device="cuda")
    _, w, bias = _linear_operands(k=2048, n=2048, device="cuda")
    wq, ws = ops.quantize_fp8(w.bfloat16())

    def block(kw):
        q, scale = ops.rms_norm_modulate_fp8(**kw)
        return ops.linear_fp8(q, scale, wq, ws, bias)

    torch._dynamo.reset()
    torch.testing.assert_close(torch.compile(block, fullgraph=True)(kw), block(kw), atol=1e-2, rtol=1.6e-2)
