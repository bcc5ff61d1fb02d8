"""FP8 self-attention (--precision fp8-attention): the per-head FP8 references (weight-bound scales for q/k, amax
scales for v), the ops' fakes, the CLI's refusals, and the mechanics on the CPU with a stand-in for FlashAttention-3
(attention over the dequantized inputs in fp32). The kernels against the references, and FlashAttention-3 itself:
tests/ops/test_ops_gpu.py (through the KernelSpecs) and tests/inject/test_fp8_attention_gpu.py."""

import importlib.machinery
import json
import math
import sys
import types

import pytest
import torch
import torch.nn.functional as F
from torch._subclasses.fake_tensor import FakeTensorMode
from typer.testing import CliRunner

import ltxbench.ops as ops
from ltxbench.cli import app
from ltxbench.ops import reference
from ltxbench.ops.accuracy import fp8_mismatch
from ltxbench.ops.registry import SPECS
from tests.helpers import BENCH_E2E_LTX_TINY, LTX_TINY, without_flash_attention_3

FP8 = torch.float8_e4m3fn
runner = CliRunner()
TINY = [*BENCH_E2E_LTX_TINY, "--phase", "transformer"]  # bench e2e on the tiny LTX-Video, CPU, reference ops


def _inputs(name, shape, variant=None, seed=0):
    spec = SPECS[name]
    return spec.make_inputs(shape, torch.bfloat16, "cpu", torch.Generator().manual_seed(seed),
                            variant or spec.variants[0])


def _is_power_of_two(t):
    mantissa, _ = torch.frexp(t)
    return bool((mantissa == 0.5).all())


# ---- the references ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("shape", [(2, 7, 128), (1, 83, 2048), (2, 5, 84)], ids=str)
def test_qk_scales_come_from_the_weight_bound_and_nothing_saturates(shape):
    """Each head's scale is the power of two that puts √D · max|w| in (224, 448]; a token with all its energy in one
    channel (the bound's worst case) still lands within ±448, and the dequantized values are qk_rms_norm_rope's fp32
    values within one e4m3 step."""
    kw = _inputs("qk_rms_norm_rope_fp8", shape)
    b, s, d = shape
    kw["q"][0, 0] = 0
    kw["q"][0, 0, 3] = 50.0  # one channel holds the token's whole norm
    q8, qd, k8, kd = reference.qk_rms_norm_rope_fp8(**kw)
    heads = kw["heads"]
    assert q8.dtype == FP8 and q8.shape == shape and qd.shape == (b, heads) and kd.shape == (b, heads)
    assert _is_power_of_two(qd) and _is_power_of_two(kd)
    for w, descale in ((kw["wq"], qd), (kw["wk"], kd)):
        bound = math.sqrt(d) * w.float().abs().reshape(heads, -1).amax(1)
        assert ((bound / descale[0] > 224) & (bound / descale[0] <= 448)).all()
        assert torch.equal(descale[0], descale[-1])  # from the weights alone: every batch element alike
    assert q8.float().abs().max() < 448 and not q8.float().isnan().any()
    plain = {k: v for k, v in kw.items() if k != "heads"}
    q32, _ = reference.qk_rms_norm_rope(**{k: v.float() if torch.is_tensor(v) else v for k, v in plain.items()})
    deq = q8.float().reshape(b, s, heads, -1) * qd[:, None, :, None]
    step = (q32.abs().reshape(b, s, heads, -1) / 8).clamp(min=2.0 ** -9 * qd[:, None, :, None])
    assert ((deq - q32.reshape(b, s, heads, -1)).abs() <= step).all()


@pytest.mark.parametrize("variant", ["video", "qkv-slices"])
@pytest.mark.parametrize("shape", [(2, 7, 128), (1, 83, 2048), (2, 5, 86)], ids=str)
def test_split_qk_scales_come_from_the_weight_bound_per_group(shape, variant):
    """LTX-2's split-RoPE q/k in FP8: one scale per group of heads ("video": one per tensor, as cuDNN takes them;
    "qkv-slices": per head, strided inputs) putting √D · max|w| over the group in (224, 448]; a token with its whole
    norm in one channel stays within ±448; dequantized, qk_rms_norm_rope_split's fp32 values within one e4m3 step;
    the eager baseline (in bf16) within two steps and its rounding."""
    kw = _inputs("qk_rms_norm_rope_split_fp8", shape, variant)
    b, s, d = shape
    kw["q"][0, 0] = 0
    kw["q"][0, 0, 3] = 50.0
    q8, qd, k8, kd = reference.qk_rms_norm_rope_split_fp8(**kw)
    groups = kw["groups"]
    assert groups == (1 if variant == "video" else kw["cos"].shape[1])
    assert q8.dtype == FP8 and q8.shape == shape and qd.shape == (b, groups) and kd.shape == (b, groups)
    assert _is_power_of_two(qd) and _is_power_of_two(kd)
    for w, descale in ((kw["wq"], qd), (kw["wk"], kd)):
        bound = math.sqrt(d) * w.float().abs().reshape(groups, -1).amax(1)
        assert ((bound / descale[0] > 224) & (bound / descale[0] <= 448)).all()
        assert torch.equal(descale[0], descale[-1])
    assert q8.float().abs().max() < 448 and not q8.float().isnan().any()
    plain = {k: v for k, v in kw.items() if k != "groups"}
    q32, _ = reference.qk_rms_norm_rope_split(**{k: v.float() if torch.is_tensor(v) and v.is_floating_point() else v
                                                 for k, v in plain.items()})
    deq = q8.float().reshape(b, s, groups, -1) * qd[:, None, :, None]
    step = (q32.abs().reshape(b, s, groups, -1) / 8).clamp(min=2.0 ** -9 * qd[:, None, :, None])
    assert ((deq - q32.reshape(b, s, groups, -1)).abs() <= step).all()
    eager_q, eager_qd, _, _ = SPECS["qk_rms_norm_rope_split_fp8"].baselines["eager"](**kw)
    assert torch.equal(eager_qd, qd)
    eager_deq = eager_q.float().reshape(b, s, groups, -1) * qd[:, None, :, None]
    cancelled = 0.01 * q32.abs().amax()  # diffusers' rotation rounds its products to bf16: cancellation near 0
    assert ((eager_deq - q32.reshape(b, s, groups, -1)).abs() <= 2 * step + cancelled).all()


def test_value_scales_follow_each_heads_amax_over_all_its_tokens():
    """v's scale per (batch, head): the head's amax over every token maps into (224, 448] (an outlier head gets its
    own scale, the others keep theirs); q · descale is exact, so the round trip is e4m3 rounding alone."""
    kw = _inputs("quantize_fp8_heads", (2, 33, 256), "outliers")
    x, heads = kw["x"], kw["heads"]
    q, descale = reference.quantize_fp8_heads(**kw)
    amax = x.float().abs().reshape(2, 33, heads, -1).amax(dim=(1, 3))
    mapped = amax / descale
    assert _is_power_of_two(descale) and ((mapped > 224) & (mapped <= 448)).all()
    assert descale[0, 0] >= 4 * descale[0, 1]  # head 0 is the outlier (x8): its own, coarser scale
    assert ((q.float().reshape(2, 33, heads, -1) * descale[:, None, :, None]).reshape(x.shape)
            - x.float()).abs().max() <= amax.max() / 16
    eager_q, eager_descale = SPECS["quantize_fp8_heads"].baselines["eager"](**kw)  # the same math in torch ops
    assert fp8_mismatch(eager_q, eager_descale, q, descale) == (0.0, None)
    assert fp8_mismatch(q, descale, q, descale) == (0.0, None)
    assert "x_scale" in fp8_mismatch(q, descale * 1.01, q, descale)[1]  # a 1% different scale fails the contract


@pytest.mark.parametrize("shape", [(0, 4, 64), (2, 0, 64), (2, 3, 0)], ids=str)
def test_empty_inputs_give_empty_data_and_their_descales(shape):
    """v's descales are 1 without values; q/k's come from the weights, tokens or not (1 where D is 0)."""
    for name in ("qk_rms_norm_rope_fp8", "qk_rms_norm_rope_split_fp8", "quantize_fp8_heads"):
        kw = _inputs(name, shape)
        out = SPECS[name].reference(**kw)
        assert out[0].shape == shape and out[1].shape == (shape[0], kw.get("heads", kw.get("groups")))
        if name == "quantize_fp8_heads" or shape[2] == 0:
            assert torch.equal(out[1], torch.ones_like(out[1]))


def test_fakes_give_contiguous_fp8_and_descales_per_batch_and_head(built_ops):
    real = _inputs("qk_rms_norm_rope_fp8", (2, 9, 256))
    real["q"] = real["q"].transpose(0, 1).contiguous().transpose(0, 1)  # strided rows
    with FakeTensorMode():
        fake = {k: torch.empty_strided(v.shape, v.stride(), dtype=v.dtype, device="cuda") if torch.is_tensor(v)
                else v for k, v in real.items()}
        q8, qd, k8, kd = ops.qk_rms_norm_rope_fp8(**fake)
        v8, vd = ops.quantize_fp8_heads(fake["q"], 4)
    split = _inputs("qk_rms_norm_rope_split_fp8", (2, 9, 256), "qkv-slices")
    with FakeTensorMode():
        fake = {k: torch.empty_strided(v.shape, v.stride(), dtype=v.dtype, device="cuda") if torch.is_tensor(v)
                else v for k, v in split.items()}
        sq8, sqd, sk8, skd = ops.qk_rms_norm_rope_split_fp8(**fake)
    for data, descale in ((q8, qd), (k8, kd), (v8, vd), (sq8, sqd), (sk8, skd)):
        assert data.dtype == FP8 and data.shape == (2, 9, 256) and data.is_contiguous() and data.device.type == "cuda"
        assert descale.dtype == torch.float32 and descale.shape == (2, 4)


def test_schemas(built_ops):
    schemas = {name: str(getattr(torch.ops.ltxbench, name).default._schema)
               for name in ("qk_rms_norm_rope_fp8", "qk_rms_norm_rope_split_fp8", "quantize_fp8_heads")}
    assert schemas == {
        "qk_rms_norm_rope_split_fp8": "ltxbench::qk_rms_norm_rope_split_fp8(Tensor q, Tensor k, Tensor wq, Tensor wk, "
                                      "float eps, Tensor cos, Tensor sin, int groups) "
                                      "-> (Tensor, Tensor, Tensor, Tensor)",
        "qk_rms_norm_rope_fp8": "ltxbench::qk_rms_norm_rope_fp8(Tensor q, Tensor k, Tensor wq, Tensor wk, float eps, "
                                "int heads, Tensor? cos, Tensor? sin, Tensor? grid, Tensor? freqs) "
                                "-> (Tensor, Tensor, Tensor, Tensor)",
        "quantize_fp8_heads": "ltxbench::quantize_fp8_heads(Tensor x, int heads) -> (Tensor, Tensor)",
    }


def test_public_functions_have_the_reference_signatures():
    import inspect

    for name in ("qk_rms_norm_rope_fp8", "qk_rms_norm_rope_split_fp8", "quantize_fp8_heads"):
        assert inspect.signature(getattr(ops, name)) == inspect.signature(getattr(reference, name)), name


# ---- the command line ------------------------------------------------------------------------------------------

def test_without_an_fp8_attention_backend_the_run_exits_4_saying_how_to_install_one(tmp_path, monkeypatch):
    without_flash_attention_3(monkeypatch)  # an import of it raises ImportError
    monkeypatch.setitem(sys.modules, "cudnn", None)
    out = tmp_path / "r.json"
    result = runner.invoke(app, [*TINY, "--configs", "optimized", "--precision", "fp8-attention", "-o", str(out)])
    text = " ".join(result.output.split())
    assert result.exit_code == 4, result.output
    assert "--precision fp8-attention needs FlashAttention-3" in text and "or cuDNN's frontend" in text
    assert "pip install fa3-fwd" in text and "pip install --no-deps nvidia-cudnn-frontend" in text
    assert "fa3_fwd_interface" in text  # both FlashAttention-3 packages were looked for
    assert "built ltx-tiny" not in text  # refused before the model is built
    assert not out.exists()
    named = runner.invoke(app, [*TINY, "--configs", "optimized-fp8-attention", "-o", str(out)])  # by the config
    assert named.exit_code == 4 and "built ltx-tiny" not in named.output, named.output


@pytest.mark.parametrize("command", [["generate", "--prompt", "a fox"], ["bench", "e2e"], ["profile"]])
def test_cudnn_at_ltx_2b_head_dim_is_refused_before_the_build(command, tmp_path, monkeypatch):
    """LTX-Video 2B's head dim 64 with only cuDNN's FP8 attention installed: exit 2 saying why and what to do, from
    the preset's shipped config, before anything is built."""
    without_flash_attention_3(monkeypatch)
    monkeypatch.setitem(sys.modules, "cudnn", types.ModuleType("cudnn"))
    out = tmp_path / ("v.mp4" if command[0] == "generate" else "r.json")
    result = runner.invoke(app, [*command, "--model", "ltx-2b", "--weights", "random", "--device", "cuda",
                                 "--precision", "fp8-attention", "--output", str(out)])
    text = " ".join(result.output.split())
    assert result.exit_code == 2, result.output
    assert "at head dim 64 cuDNN's FP8 attention is slower than bf16 attention" in text
    assert "run --precision fp8, or install FlashAttention-3" in text and "built" not in text
    assert not out.exists()


def test_generate_refuses_fp8_attention_with_another_attention_backend(tmp_path):
    result = runner.invoke(app, ["generate", "--model", "ltx-tiny", "--weights", "random", "--device", "cpu",
                                 "--prompt", "a fox", "--precision", "fp8-attention", "--attention-backend", "native",
                                 "--output", str(tmp_path / "v.mp4")])
    assert result.exit_code == 2, result.output
    assert "drop --attention-backend native" in " ".join(result.output.split())


# ---- the mechanics on the CPU, FlashAttention-3 stood in for ---------------------------------------------------

def _dequantized_attention(q, k, v, q_descale=None, k_descale=None, v_descale=None, **_):
    """FlashAttention-3's FP8 forward as math: attention over q·q_descale, k·k_descale, v·v_descale per (batch,
    head), in fp32; bf16 out."""
    deq = [t.float() * d[:, None, :, None] for t, d in ((q, q_descale), (k, k_descale), (v, v_descale))]
    out = F.scaled_dot_product_attention(*(t.transpose(1, 2) for t in deq)).transpose(1, 2)
    return out.to(torch.bfloat16)


@pytest.fixture
def flash_stand_in(monkeypatch):
    calls = []

    def flash_attn_func(q, k, v, **kw):
        calls.append((q.dtype, k.dtype, v.dtype, tuple(q.shape), kw["q_descale"].shape))
        return _dequantized_attention(q, k, v, **kw)

    import diffusers.models.attention_dispatch  # noqa: F401  (diffusers probes for FlashAttention-3 on import:
    from diffusers import LTXPipeline  # noqa: F401  it must not find the stand-in)

    module = types.ModuleType("flash_attn_interface")
    module.__spec__ = importlib.machinery.ModuleSpec("flash_attn_interface", None)
    module.flash_attn_func = flash_attn_func
    monkeypatch.setitem(sys.modules, "flash_attn_interface", module)
    return calls


@pytest.mark.slow
def test_fp8_attention_configurations_run_record_their_precision_and_error(tmp_path, flash_stand_in):
    out = tmp_path / "r.json"
    result = runner.invoke(app, [*TINY, "--configs", "optimized", "--precision", "fp8-attention", "-o", str(out)])
    assert result.exit_code == 0, result.output
    doc = json.loads(out.read_text())
    steps = {(r["provider"], r["dtype"]) for r in doc["records"] if r["name"] == "denoise_step"}
    assert steps == {("optimized", "fp32"), ("optimized-fp8", "fp8"), ("optimized-fp8+compile", "fp8"),
                     ("optimized-fp8-attention", "fp8-attention"), ("optimized-fp8-attention+compile", "fp8-attention")}
    errors = {r["provider"]: r for r in doc["records"] if r["name"] == "step_error"}
    assert set(errors) == {"optimized-fp8", "optimized-fp8-attention"}  # each precision measured once
    assert errors["optimized-fp8-attention"]["dtype"] == "fp8-attention"
    assert all(r["check"]["passed"] and 0.995 <= r["stats"]["median"] < 1.0 for r in errors.values())
    assert "fp8-attention step error: cosine" in result.output
    assert flash_stand_in and all(c[:3] == (FP8, FP8, FP8) for c in flash_stand_in)
    b, s, h, _ = flash_stand_in[0][3]
    assert flash_stand_in[0][4] == (b, h)
    rules = doc["run"]["config"]["injection"]
    assert any(rule.startswith("attn1: FP8 attention") for rule in rules["optimized-fp8-attention"]["rules"])
    assert not any(rule.startswith("attn1: FP8 attention") for rule in rules["optimized-fp8"]["rules"])


def test_the_fp8_attention_path_is_what_the_model_runs(flash_stand_in):
    """The injected tiny transformer with FP8 attention against the same with a stand-in that perturbs v's descales
    by 1% on one head: the outputs differ (the descales reach the attention), and against FP8 projections alone
    they differ by FP8 attention's error only (cosine >= 0.995)."""
    from ltxbench.inject.ltx import apply_kernels
    from ltxbench.models import family_of

    fam = family_of("ltx-tiny")
    settings = fam.settings("bench", model="ltx-tiny", weights="random", device="cpu", kernel_provider="reference",
                            num_frames=9, height=64, width=64, steps=2)
    pipe = fam.build(settings)
    transformer = pipe.transformer
    gen = torch.Generator().manual_seed(0)
    cfg = transformer.config
    latents = torch.randn(2, 3 * 2 * 2, cfg.in_channels, generator=gen).to(transformer.dtype)
    prompt = torch.randn(2, 8, cfg.caption_channels, generator=gen).to(transformer.dtype)
    kwargs = dict(hidden_states=latents, encoder_hidden_states=prompt, timestep=torch.tensor([500, 500]),
                  encoder_attention_mask=torch.ones(2, 8), num_frames=3, height=2, width=2, return_dict=False)

    def run(precision):
        report = apply_kernels(transformer, provider="reference", precision=precision)
        try:
            with torch.no_grad():
                return transformer(**kwargs)[0].double()
        finally:
            report.revert()

    fp8, fp8_attention = run("fp8"), run("fp8-attention")
    cosine = F.cosine_similarity(fp8.flatten(), fp8_attention.flatten(), dim=0).item()
    assert 0.995 <= cosine < 1.0, cosine
    real = sys.modules["flash_attn_interface"].flash_attn_func

    def off_by_one_percent(q, k, v, **kw):
        kw["v_descale"] = kw["v_descale"].clone()
        kw["v_descale"][:, 0] *= 1.01
        return real(q, k, v, **kw)

    sys.modules["flash_attn_interface"].flash_attn_func = off_by_one_percent
    perturbed = run("fp8-attention")
    assert not torch.equal(perturbed, fp8_attention)


def test_generate_with_fp8_attention_says_so_in_its_records(tmp_path, flash_stand_in):
    from ltxbench.results.io import load_result

    out = tmp_path / "v.mp4"
    result = runner.invoke(app, ["generate", "--prompt", "a red fox in the snow", *LTX_TINY,
                                 "--kernel-provider", "reference", "--precision", "fp8-attention",
                                 "--output", str(out)])
    assert result.exit_code == 0, result.output
    doc = load_result(out.with_suffix(".json"))
    assert doc["run"]["config"]["precision"] == "fp8-attention"
    assert {r["dtype"] for r in doc["records"]} == {"fp8-attention"}
    assert any(rule.startswith("attn1: FP8 attention") for rule in doc["injection"]["rules"]) and flash_stand_in


# ---- cuDNN's FP8 attention: its emulation on the CPU, its graph, the backend choice --------------------------------

def _fp8_inputs(batch=2, tokens=77, heads=4, head_dim=64, seed=0):
    """q/k/v (B, S, D) with logits of trained attention's size (a direction shared by each head's tokens), and the
    per-tensor FP8 q/k/v (B, S, H, hd) with their descales as the cuDNN path makes them."""
    gen = torch.Generator().manual_seed(seed)
    d = heads * head_dim
    shared = torch.randn(1, 1, 3 * d, generator=gen)
    qkv = torch.randn(batch, tokens, 3 * d, generator=gen) + 2 * shared
    q, k, v = (qkv[..., i * d:(i + 1) * d].contiguous() for i in range(3))
    quantized = [reference.quantize_fp8_heads(t.reshape(1, -1, d), 1) for t in (q, k, v)]
    per_head = (batch, tokens, heads, head_dim)
    (q8, qd), (k8, kd), (v8, vd) = ((t.view(per_head), descale) for t, descale in quantized)
    return (q, k, v), (q8, k8, v8, qd, kd, vd)


def test_the_cudnn_emulation_is_attention_within_fp8_error():
    """P at scale 448 and the output at half of v's scale, all e4m3: within FP8's error of fp32 attention over the
    unquantized inputs, and a 1% error in a descale, or the output scale's headroom forgotten, shows."""
    from ltxbench.ops import cudnn_fp8_attention as op

    (q, k, v), fp8 = _fp8_inputs()
    want = F.scaled_dot_product_attention(*(t.unflatten(2, (4, 64)).transpose(1, 2) for t in (q, k, v)))
    want = want.transpose(1, 2)
    got = op.emulated(*fp8)
    cosine = F.cosine_similarity(got.double().flatten(), want.double().flatten(), dim=0).item()
    assert got.dtype == torch.bfloat16 and got.shape == want.shape and 0.998 <= cosine < 1.0, cosine
    q8, k8, v8, qd, kd, vd = fp8
    for wrong in ((q8, k8, v8, qd, kd, vd * 1.01), (q8, k8, v8, qd * 1.01, kd, vd)):
        assert (op.emulated(*wrong).float() - got.float()).abs().max() > 1e-3 * got.float().abs().max()


def test_the_cudnn_graph_says_what_it_computes():
    """The graph as built for cuDNN (plain Python until planned on a GPU): e4m3 (B, H, S, hd) operands in our
    (B, S, H, hd) memory, six fp32 scalars, an e4m3 output in the output's layout."""
    cudnn = pytest.importorskip("cudnn", reason="nvidia-cudnn-frontend not installed")
    from ltxbench.ops import cudnn_fp8_attention as op

    _, (q8, k8, v8, *_) = _fp8_inputs(batch=2, tokens=9, heads=3, head_dim=64)
    v8 = torch.cat([v8, v8], dim=-1)[..., :64]  # a strided v: a column slice
    out = torch.empty(q8.shape, dtype=FP8)
    graph, tensors = op.build_graph(q8, k8, v8, out)
    e4m3 = cudnn.data_type.FP8_E4M3
    assert list(tensors["q"].dim) == [2, 3, 9, 64] and list(tensors["q"].stride) == [9 * 192, 64, 192, 1]
    assert list(tensors["v"].stride) == [9 * 3 * 128, 128, 3 * 128, 1]
    assert all(tensors[n].data_type == e4m3 for n in ("q", "k", "v", "o"))
    assert list(tensors["o"].dim) == [2, 3, 9, 64] and list(tensors["o"].stride) == [9 * 192, 64, 192, 1]
    assert [n for n in tensors if n.startswith(("descale", "scale"))] == [
        "descale_q", "descale_k", "descale_v", "descale_s", "scale_s", "scale_o"]


def test_the_cudnn_op_fake_gives_bf16_of_the_query_shape():
    from ltxbench.ops import cudnn_fp8_attention  # noqa: F401  (registers the op)

    with FakeTensorMode():
        q = torch.empty(2, 9, 3, 64, dtype=FP8)
        descale = torch.empty(1, 1)
        out = torch.ops.ltxbench.cudnn_fp8_attention(q, q, q, descale, descale, descale)
    assert out.shape == (2, 9, 3, 64) and out.dtype == torch.bfloat16


def test_cudnn_is_chosen_where_flash_attention_3_is_missing_and_refuses_head_dims_it_cannot_take(monkeypatch):
    from ltxbench.errors import UsageError
    from ltxbench.inject import fp8_attention

    without_flash_attention_3(monkeypatch)
    monkeypatch.setitem(sys.modules, "cudnn", types.ModuleType("cudnn"))  # importable: the choice alone
    backend = fp8_attention.fp8_attention("reference")
    assert backend.name == "cuDNN" and backend.per_tensor
    backend.require(64)
    with pytest.raises(UsageError, match="head dim 72: cuDNN's FP8 attention takes multiples of 16 up to 256"):
        backend.require(72)
    on_gpu = fp8_attention.fp8_attention("cuda")  # at LTX-Video's head dim slower than bf16: refused, saying so
    on_gpu.require(128)
    with pytest.raises(UsageError, match="at head dim 64 cuDNN's FP8 attention is slower than bf16 attention"):
        on_gpu.require(64)


def test_the_ltx_fp8_attention_path_through_cudnn(monkeypatch):
    """The tiny LTX-Video with FP8 attention through cuDNN (its emulation, under the reference provider): per-tensor
    scales reach it, the rule names the backend, and the output is FP8 projections' within FP8 attention's error."""
    from ltxbench.inject import fp8_attention
    from ltxbench.inject.ltx import apply_kernels
    from ltxbench.models import family_of
    from ltxbench.ops import cudnn_fp8_attention as op

    without_flash_attention_3(monkeypatch)
    monkeypatch.setitem(sys.modules, "cudnn", types.ModuleType("cudnn"))
    calls, emulated = [], op.emulated

    def recording(q, k, v, qd, kd, vd):
        calls.append((q.dtype, tuple(qd.shape), tuple(vd.shape)))
        return emulated(q, k, v, qd, kd, vd)

    monkeypatch.setattr(op, "emulated", recording)
    fam = family_of("ltx-tiny")
    settings = fam.settings("bench", model="ltx-tiny", weights="random", device="cpu", kernel_provider="reference",
                            num_frames=9, height=64, width=64, steps=2)
    transformer = fam.build(settings).transformer
    gen = torch.Generator().manual_seed(0)
    cfg = transformer.config
    kwargs = dict(hidden_states=torch.randn(2, 12, cfg.in_channels, generator=gen).to(transformer.dtype),
                  encoder_hidden_states=torch.randn(2, 8, cfg.caption_channels, generator=gen).to(transformer.dtype),
                  timestep=torch.tensor([500, 500]), encoder_attention_mask=torch.ones(2, 8), num_frames=3, height=2,
                  width=2, return_dict=False)

    def run(precision):
        with apply_kernels(transformer, provider="reference", precision=precision) as report, torch.no_grad():
            return transformer(**kwargs)[0].double(), dict(report.rules)

    (fp8, _), (attention, rules) = run("fp8"), run("fp8-attention")
    assert any(rule.startswith("attn1: FP8 attention (cuDNN)") for rule in rules)
    assert calls and all(c == (FP8, (2, 1), (1, 1)) for c in calls)  # per tensor: q's (B, 1), v's one
    cosine = F.cosine_similarity(fp8.flatten(), attention.flatten(), dim=0).item()
    assert 0.995 <= cosine < 1.0, cosine
    assert fp8_attention.fp8_attention("reference").name == "cuDNN"


def test_the_fp8_attention_kernel_can_be_chosen(monkeypatch):
    """LTXBENCH_FP8_ATTENTION=cudnn takes cuDNN's even where FlashAttention-3 imports; =fa3 takes FlashAttention-3
    or fails (exit 4), never falling back; another value is refused."""
    from ltxbench.errors import EnvironmentProblem, UsageError
    from ltxbench.inject import fp8_attention

    fa3 = types.ModuleType("fa3_fwd_interface")
    fa3.flash_attn_func = lambda *a, **k: None
    monkeypatch.setitem(sys.modules, "flash_attn_interface", None)
    monkeypatch.setitem(sys.modules, "fa3_fwd_interface", fa3)
    monkeypatch.setitem(sys.modules, "cudnn", types.ModuleType("cudnn"))
    assert fp8_attention.fp8_attention().name == "FlashAttention-3"
    monkeypatch.setenv("LTXBENCH_FP8_ATTENTION", "cudnn")
    assert fp8_attention.fp8_attention().name == "cuDNN"
    monkeypatch.setenv("LTXBENCH_FP8_ATTENTION", "fa3")
    assert fp8_attention.fp8_attention().name == "FlashAttention-3"
    without_flash_attention_3(monkeypatch)
    with pytest.raises(EnvironmentProblem, match="LTXBENCH_FP8_ATTENTION=fa3: FlashAttention-3 does not import"):
        fp8_attention.fp8_attention()
    monkeypatch.setenv("LTXBENCH_FP8_ATTENTION", "fast")
    with pytest.raises(UsageError, match="fa3 or cudnn"):
        fp8_attention.fp8_attention()
