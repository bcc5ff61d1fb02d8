"""precision="fp8" on Wan (CPU, reference provider, fp32 wan-tiny and wan-tiny-i2v transformers with trained-size
modulation): the FP8 path equals a simulation of FP8 on the unpatched model (each block projection's weight and input
rounded to e4m3 per row), a 1% change of a formula fails that, the revert brings back the exact weights and output,
both experts and I2V's image projections are stored, and what cannot run in FP8 is refused before anything is
patched."""

from __future__ import annotations

import pytest
import torch

from ltxbench.errors import UsageError
from ltxbench.inject import fp8
from ltxbench.inject.wan import GELU_RULE, apply_kernels
from ltxbench.inject.wan.precision import projections
from ltxbench.models import wan_build
from ltxbench.ops import reference, reference_fp8
from tests.helpers import (
    max_rel_error,
    simulated_fp8,
    wan_inputs,
    wan_transformer,
    without_flash_attention_3,
)

TOL = 2e-5  # FP8 path vs the simulation: the same roundings, fp32 sums in another order


def _layers(model):
    for block in model.blocks:
        yield from (*projections(block), block.ffn.net[0].proj, block.ffn.net[2])


def _call(model, inputs):
    with torch.no_grad():
        return model(**inputs)[0]


def _simulated(model, inputs):
    """The unpatched model with every block projection's weight and input rounded to FP8 per row."""
    return simulated_fp8(_layers(model), lambda: _call(model, inputs))


@pytest.fixture(scope="module", params=["wan-tiny", "wan-tiny-i2v"])
def runs(request):
    model = wan_transformer(dtype="fp32", preset=request.param)
    inputs = wan_inputs(model)
    return model, inputs, _call(model, inputs), _simulated(model, inputs)


def test_fp8_equals_a_simulation_of_fp8_on_the_unpatched_model(runs):
    model, inputs, exact, simulated = runs
    with apply_kernels(model, "reference", precision="fp8") as report:
        got = _call(model, inputs)
    per_block = len(projections(model.blocks[0])) + 2  # the attentions' and the feed-forward's two
    assert report.rules[fp8.STORE_RULE] == len(model.blocks) * per_block
    assert (GELU_RULE, "precision fp8: the feed-forward runs on its FP8 weights, its GELU writing FP8") in \
        report.skipped
    assert max_rel_error(got, simulated) <= TOL, max_rel_error(got, simulated)
    assert 1e-3 < max_rel_error(got, exact) < 0.05, max_rel_error(got, exact)  # really quantized, and close


@pytest.mark.parametrize("where", ["input scale 1%", "gelu before quantizing"])
def test_a_perturbed_fp8_formula_fails_the_simulation(runs, monkeypatch, where):
    model, inputs, _, simulated = runs
    if where == "input scale 1%":
        original = reference.quantize_fp8
        monkeypatch.setattr(reference, "quantize_fp8", lambda x: (lambda q, s: (q, s * 1.01))(*original(x)))
    else:  # the exact GELU swapped for the erf one
        monkeypatch.setattr(reference, "gelu_tanh_fp8",
                            lambda x: reference_fp8._to_fp8_rows(torch.nn.functional.gelu(x.float())))
    with apply_kernels(model, "reference", precision="fp8"):
        got = _call(model, inputs)
    assert max_rel_error(got, simulated) > 10 * TOL, max_rel_error(got, simulated)


def test_revert_restores_the_exact_weights_and_output(runs):
    model, inputs, exact, _ = runs
    before = {k: v.clone() for k, v in model.state_dict().items()}
    report = apply_kernels(model, "reference", precision="fp8")
    assert model.blocks[0].attn2.to_out[0].weight.numel() == 0  # freed, not shadowed
    report.revert()
    after = model.state_dict()
    assert before.keys() == after.keys() and all(torch.equal(before[k], after[k]) for k in before)
    assert torch.equal(_call(model, inputs), exact)


def test_both_experts_are_stored_in_fp8():
    pipe = wan_build.build_pipeline("wan-tiny-a14b", "random", "cpu", "fp32")
    with apply_kernels(pipe, "reference", precision="fp8") as report:
        for expert in (pipe.transformer, pipe.transformer_2):
            assert all(layer.weight.numel() == 0 for layer in _layers(expert))
        per_block = len(projections(pipe.transformer.blocks[0])) + 2
        assert report.rules[fp8.STORE_RULE] == 2 * len(pipe.transformer.blocks) * per_block


def test_what_cannot_run_in_fp8_is_refused_before_anything_is_patched():
    model = wan_transformer(dtype="fp32")
    classes = {name: type(module) for name, module in model.named_modules()}
    model.blocks[1].attn2.to_k = torch.nn.Sequential(model.blocks[1].attn2.to_k)  # wrapped, as an adapter does
    try:
        with pytest.raises(UsageError, match=r"precision fp8: blocks.1: a projection is not a plain nn.Linear"):
            apply_kernels(model, "reference", precision="fp8")
    finally:
        model.blocks[1].attn2.to_k = model.blocks[1].attn2.to_k[0]
    assert {name: type(module) for name, module in model.named_modules()} == classes
    with pytest.raises(UsageError, match="precision 'int4' is not one of bf16, fp8"):
        apply_kernels(model, "reference", precision="int4")


@pytest.mark.gpu
@pytest.mark.parametrize("preset", ["wan-tiny", "wan-tiny-i2v"])
def test_cuda_fp8_against_the_bf16_model_and_the_simulation(preset):
    """Our FP8 GEMMs and quantize kernels on the GPU: within FP8's error of the bf16 model, and at the simulation of
    FP8 on it up to bf16 rounding."""
    gpu = wan_transformer("cuda", "bf16", preset=preset)
    inputs = wan_inputs(gpu, device="cuda")
    exact, simulated = _call(gpu, inputs), _simulated(gpu, inputs)
    with apply_kernels(gpu, "cuda", precision="fp8") as report:
        assert report.rules[fp8.STORE_RULE] == len(gpu.blocks) * (len(projections(gpu.blocks[0])) + 2)
        got = _call(gpu, inputs)

    def cos(a, b):
        return torch.nn.functional.cosine_similarity(a.double().flatten(), b.double().flatten(), dim=0).item()

    assert cos(got, exact) > 0.999 and cos(got, simulated) > cos(got, exact)


def test_fp8_attention_runs_attn1_in_fp8_through_the_chosen_backend(runs, monkeypatch):
    """precision="fp8-attention" (cuDNN's backend, its emulation under the reference provider): attn1's attention
    takes per-tensor FP8 q/k/v with Wan's tables, the output stays within FP8 attention's error of "fp8", the rule
    names the backend, a 1% error in v's descale shows, and the revert gives back the exact model."""
    import sys
    import types

    import torch.nn.functional as F

    from ltxbench.inject.wan import QK_ROPE_RULE
    from ltxbench.ops import cudnn_fp8_attention as op

    model, inputs, exact, _ = runs
    without_flash_attention_3(monkeypatch)
    monkeypatch.setitem(sys.modules, "cudnn", types.ModuleType("cudnn"))  # importable: chosen; emulated on the CPU
    calls, emulated = [], op.emulated

    def recording(q, k, v, qd, kd, vd):
        calls.append((q.dtype, tuple(q.shape), tuple(qd.shape), tuple(vd.shape)))
        return emulated(q, k, v, qd, kd, vd)

    monkeypatch.setattr(op, "emulated", recording)
    with apply_kernels(model, "reference", precision="fp8") as report:
        fp8_only = _call(model, inputs)
    with apply_kernels(model, "reference", precision="fp8-attention") as report:
        got = _call(model, inputs)
        rules = dict(report.rules)
    blocks, heads = len(model.blocks), model.blocks[0].attn1.heads
    assert rules["attn1: FP8 attention (cuDNN) on qk_rms_norm_rope_fp8's q/k and v"] == blocks == rules[QK_ROPE_RULE]
    batch = inputs["hidden_states"].shape[0]  # q's descale per batch element (all alike: from the weights); v's one
    assert len(calls) == blocks
    assert all(c[0] == torch.float8_e4m3fn and c[1][2] == heads and c[2:] == ((batch, 1), (1, 1)) for c in calls)
    cosine = F.cosine_similarity(got.double().flatten(), fp8_only.double().flatten(), dim=0).item()
    assert 0.995 <= cosine < 1.0, cosine
    monkeypatch.setattr(op, "emulated", lambda q, k, v, qd, kd, vd: emulated(q, k, v, qd, kd, vd * 1.01))
    with apply_kernels(model, "reference", precision="fp8-attention"):
        assert max_rel_error(_call(model, inputs), got) > 1e-3
    assert torch.equal(_call(model, inputs), exact)


@pytest.mark.gpu
def test_cuda_fp8_attention_through_cudnn_against_its_emulation_and_the_bf16_model(monkeypatch):
    """cuDNN's FP8 attention in Wan's attn1 on the GPU: equal (up to bf16 rounding) to the reference provider's path,
    whose attention is the op's fp32 emulation, and within FP8's error of the bf16 model, eager and compiled."""

    if torch.cuda.get_device_capability() < (9, 0):
        pytest.skip("needs FP8 tensor cores (compute capability 9.0+)")
    pytest.importorskip("cudnn", reason="cuDNN's frontend (nvidia-cudnn-frontend) not installed")
    without_flash_attention_3(monkeypatch)  # cuDNN's path, FlashAttention-3 or not
    gpu = wan_transformer("cuda", "bf16")
    inputs = wan_inputs(gpu, device="cuda")
    exact = _call(gpu, inputs)

    def run(provider, compiled=False):
        with apply_kernels(gpu, provider, precision="fp8-attention") as report, torch.no_grad():
            assert any("FP8 attention (cuDNN)" in rule for rule in report.rules)
            return (torch.compile(gpu) if compiled else gpu)(**inputs)[0]

    def cos(a, b):
        return torch.nn.functional.cosine_similarity(a.double().flatten(), b.double().flatten(), dim=0).item()

    got, emulated, compiled = run("cuda"), run("reference"), run("cuda", compiled=True)
    rel_l2 = ((got.float() - emulated.float()).norm() / emulated.float().norm()).item()  # a wrong scale shows here
    assert cos(got, emulated) > 0.9995 and rel_l2 < 0.03 and cos(compiled, got) > 0.9999 and cos(got, exact) > 0.995


@pytest.mark.parametrize("layer", ["ffn.net.2", "ffn.net.0.proj", "attn1.to_q"])
def test_a_layer_replaced_after_the_fp8_injection_is_refused(layer):
    """The FP8 feed-forward reads the layers it captured at injection: one put in their place (peft's LoRA wrapping, a
    new nn.Linear) would not run, so it is refused as it happens, as on LTX-Video and LTX-2."""
    from ltxbench.inject.wan import apply_kernels

    model = wan_transformer()
    block = model.blocks[0]
    parent_name, _, name = layer.rpartition(".")
    parent = block.get_submodule(parent_name)
    old = getattr(parent, name)
    with apply_kernels(model, "reference", precision="fp8"):
        with pytest.raises(RuntimeError, match="runs in FP8 under ltxbench's injection"):
            setattr(parent, name, torch.nn.Linear(old.in_features, old.out_features))
    assert getattr(parent, name) is old
