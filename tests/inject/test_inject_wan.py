"""Kernel injection into Wan (ltxbench.inject.wan): on the wan-tiny transformer in bf16 (diffusers' fp32 modules kept
fp32) with modulation of a trained model's size, the reference provider gives the unpatched output bit for bit, per
sample and per token (Wan 2.2 5B's timesteps), but for attn1's fused q/k norm + RoPE, which rounds once where Wan
rounds the normalized q/k before rotating them: that rule is held to the unpatched model in float32. A 1% error in
any op the rules call is caught; revert restores the model; what the rules cannot reproduce is refused. GPU: the
cuda provider against the unpatched model."""

from __future__ import annotations

import pytest
import torch

from ltxbench.inject import wan as inject_wan
from ltxbench.inject.wan import BLOCK_RULE, GELU_RULE, QK_NORM_RULE, QK_ROPE_RULE, apply_kernels
from ltxbench.ops import reference
from tests.helpers import wan_inputs, wan_transformer

RULES = {BLOCK_RULE: 2, QK_ROPE_RULE: 2, QK_NORM_RULE: 4, GELU_RULE: 2}  # attn2's norms alone take QK_NORM_RULE
UNFUSED = {BLOCK_RULE: 2, QK_NORM_RULE: 8, GELU_RULE: 2}


@pytest.fixture(scope="module")
def model():
    return wan_transformer()


def _call(model, inputs):
    with torch.no_grad():
        return model(**inputs)[0]


@pytest.fixture(scope="module")
def model_fp32():
    return wan_transformer(dtype="fp32")


def _relative_error(got, expected) -> float:
    return ((got.float() - expected.float()).abs().max() / expected.float().abs().max()).item()


@pytest.mark.parametrize("per_token", [False, True])
def test_reference_provider_is_bit_identical_and_reverts(model, per_token):
    inputs = wan_inputs(model, per_token)
    expected = _call(model, inputs)
    classes = {name: type(module) for name, module in model.named_modules()}
    report = apply_kernels(model, "reference", qk_rope=False)
    assert dict(report.rules) == UNFUSED and report.skipped == [(QK_ROPE_RULE, "turned off (qk_rope=False)")]
    assert torch.equal(_call(model, inputs), expected)
    report.revert()
    assert {name: type(module) for name, module in model.named_modules()} == classes
    assert torch.equal(_call(model, inputs), expected)
    with apply_kernels(model, "reference") as report:  # the fused q/k norm + RoPE: one rounding fewer than Wan's
        assert dict(report.rules) == RULES and report.skipped == []
        assert _relative_error(_call(model, inputs), expected) < 1e-2
    assert {name: type(module) for name, module in model.named_modules()} == classes


@pytest.mark.parametrize("per_token", [False, True])
def test_fused_qk_norm_rope_in_float32_is_the_unpatched_model(model_fp32, per_token):
    """In float32 the rounding between Wan's norm and rotation is gone: every rule against the unpatched model."""
    inputs = wan_inputs(model_fp32, per_token)
    expected = _call(model_fp32, inputs)
    with apply_kernels(model_fp32, "reference") as report:
        assert dict(report.rules) == RULES
        assert _relative_error(_call(model_fp32, inputs), expected) < 1e-5


_QK_ROPE = reference.qk_rms_norm_rope


@pytest.mark.parametrize("wrong", [
    lambda q, k, wq, wk, eps, cos=None, sin=None, **kw: tuple(t * 1.01 for t in _QK_ROPE(q, k, wq, wk, eps, cos, sin)),
    lambda q, k, wq, wk, eps, cos=None, sin=None, **kw: _QK_ROPE(q, k, wq * 1.01, wk, eps, cos, sin),
    lambda q, k, wq, wk, eps, cos=None, sin=None, **kw: _QK_ROPE(q, k, wq, wk * 1.01, eps, cos, sin),
    lambda q, k, wq, wk, eps, cos=None, sin=None, **kw: _QK_ROPE(q, k, wq, wk, eps, cos * 1.01, sin),
    lambda q, k, wq, wk, eps, cos=None, sin=None, **kw: _QK_ROPE(q, k, wq, wk, eps, cos, sin * 1.01),
    lambda q, k, wq, wk, eps, cos=None, sin=None, **kw: _QK_ROPE(q, k, wq, wk, eps, cos, -sin),  # turned backwards
], ids=["output", "wq", "wk", "cos", "sin", "direction"])
def test_a_one_percent_error_in_the_fused_qk_norm_rope_is_caught(model_fp32, wrong, monkeypatch):
    inputs = wan_inputs(model_fp32)
    expected = _call(model_fp32, inputs)
    monkeypatch.setattr(reference, "qk_rms_norm_rope", wrong)
    with apply_kernels(model_fp32, "reference"):
        error = _relative_error(_call(model_fp32, inputs), expected)
    assert error > 3e-4, f"a 1% error moved the output by only {error:.2g}"  # 30x the parity bound above


def test_the_modulation_is_large_enough_to_matter(model):
    """The modulation the parity runs on is of a trained model's size, not the init's near-zero."""
    inputs = wan_inputs(model)
    with torch.no_grad():
        temb = model.condition_embedder(inputs["timestep"], inputs["encoder_hidden_states"])[1]
        mod = model.blocks[0].scale_shift_table + temb.float().unflatten(1, (6, -1))
    assert mod.abs().mean() > 0.3


_LN_MOD, _GATED = reference.layer_norm_modulate, reference.gated_residual  # the ops before a test mutates them


def _scaled(fn):
    """fn with its output 1% too large."""
    return lambda *args, **kwargs: fn(*args, **kwargs) * 1.01


@pytest.mark.parametrize(("op", "wrong"), [
    ("layer_norm_modulate", lambda x, scale, shift, eps: _LN_MOD(x, scale * 1.01, shift, eps)),
    ("layer_norm_modulate", lambda x, scale, shift, eps: _LN_MOD(x, scale, shift * 1.01, eps)),
    ("layer_norm_modulate", _scaled(reference.layer_norm_modulate)),
    ("gated_residual", lambda h, a, gate: _GATED(h, a, gate * 1.01)),
    ("rms_norm", _scaled(reference.rms_norm)),
    ("linear_gelu_tanh", _scaled(reference.linear_gelu_tanh)),
])
def test_a_one_percent_error_in_an_op_is_caught(model, op, wrong, monkeypatch):
    inputs = wan_inputs(model)
    expected = _call(model, inputs)
    monkeypatch.setattr(reference, op, wrong)
    with apply_kernels(model, "reference"):
        got = _call(model, inputs)
    error = ((got.float() - expected.float()).abs().max() / expected.float().abs().max()).item()
    assert error > 2e-3, f"{op}: a 1% error moved the output by only {error:.2g}"


def test_the_gelu_epilogue_steps_aside_for_a_projection_hooked_after_the_injection(model, monkeypatch):
    """The up-projection + GELU as one GEMM reads the projection's weight and bias: a hook put on it after the
    injection (a LoRA wrapper, a user's probe) must still run, so that call takes the projection's own forward."""
    inputs = wan_inputs(model)
    calls = []
    proj = model.blocks[0].ffn.net[0].proj
    fused = reference.linear_gelu_tanh
    monkeypatch.setattr(reference, "linear_gelu_tanh", lambda *a: calls.append(1) or fused(*a))
    with apply_kernels(model, "reference"):
        _call(model, inputs)
        assert len(calls) == len(model.blocks)  # every block's feed-forward as one GEMM
        handle = proj.register_forward_hook(lambda module, args, out: out * 2)
        try:
            hooked = _call(model, inputs)
        finally:
            handle.remove()
        assert len(calls) == 2 * len(model.blocks) - 1  # block 0's ran its projection, hook and all
    handle = proj.register_forward_hook(lambda module, args, out: out * 2)
    try:
        expected = _call(model, inputs)
    finally:
        handle.remove()
    assert _relative_error(hooked, expected) < 1e-2  # the fused q/k rule's rounding, not the hook's doubling


def test_cuda_provider_in_bf16_runs_every_rule_and_refuses_rows_too_wide(model, monkeypatch):
    """Our CUDA modulated LayerNorm and gated residual read Wan's float32 modulation over bf16 rows: every rule
    applies; blocks wider than the kernel's float32-modulation rows are refused, with the width."""
    monkeypatch.setattr(inject_wan, "require_provider", lambda *a, **k: None)  # no GPU here: the choice alone
    with apply_kernels(model, "cuda") as report:
        assert dict(report.rules) == RULES and report.skipped == []
    width = model.blocks[0].scale_shift_table.shape[-1]
    monkeypatch.setattr(inject_wan, "MAX_F32_MODULATION_ROW", width - 1)
    with apply_kernels(model, "cuda") as report:
        assert dict(report.rules) == {QK_ROPE_RULE: 2, QK_NORM_RULE: 4, GELU_RULE: 2}
        assert report.skipped == [(BLOCK_RULE, f"blocks {width} wide: the cuda provider's float32-modulation rows "
                                               f"take at most {width - 1}")]


def test_what_the_rules_do_not_reproduce_is_refused(model):
    block = model.blocks[1]
    original = type(block)

    class Other(original):
        def forward(self, hidden_states, encoder_hidden_states, temb, rotary_emb):
            return super().forward(hidden_states, encoder_hidden_states, temb, rotary_emb)

    block.__class__ = Other
    model.blocks[0].ffn.net[0].approximate = "none"
    try:
        with apply_kernels(model, "reference") as report:
            assert dict(report.rules) == {BLOCK_RULE: 1, QK_ROPE_RULE: 2, QK_NORM_RULE: 4, GELU_RULE: 1}
            reasons = dict(report.skipped)
            assert "is not the code this rule reproduces" in reasons["blocks.1"]
            assert reasons["blocks.0.ffn"] == "GELU approximation 'none', not 'tanh'"
    finally:
        block.__class__ = original
        model.blocks[0].ffn.net[0].approximate = "tanh"


def test_rules_can_be_turned_off(model):
    with apply_kernels(model, "reference", blocks=False, gelu=False) as report:
        assert dict(report.rules) == {QK_ROPE_RULE: 2, QK_NORM_RULE: 4}
        assert [target for target, _ in report.skipped] == [BLOCK_RULE, GELU_RULE]
    with apply_kernels(model, "reference", qk_rope=False, blocks=False, gelu=False) as report:
        assert dict(report.rules) == {QK_NORM_RULE: 8}  # attn1's norms back on the unfused rule


# --- GPU -----------------------------------------------------------------------------------------------

@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_cuda_provider_against_the_unpatched_model(dtype):
    """Every rule; fp32: equal to rounding; bf16 (the float32 modulation read as it is): within bf16 rounding of the
    unpatched output."""
    gpu = wan_transformer("cuda", dtype)
    inputs = wan_inputs(gpu, device="cuda")
    expected = _call(gpu, inputs)
    with apply_kernels(gpu, "cuda") as report:
        assert dict(report.rules) == RULES and report.skipped == []
        got = _call(gpu, inputs)
    if dtype == "fp32":
        torch.testing.assert_close(got, expected, atol=5e-5, rtol=1e-5)
    else:
        cos = torch.nn.functional.cosine_similarity(got.double().flatten(), expected.double().flatten(), dim=0)
        assert cos.item() > 0.9999


def test_i2v_blocks_with_the_image_cross_attention_are_bit_identical_and_mutations_show(monkeypatch):
    """Wan 2.1 I2V's blocks (attn2 adds the image's keys and values, add_k_proj / add_v_proj with norm_added_k, left
    as diffusers runs them): every rule applies, the output is the unpatched one bit for bit, and a 1% error in the
    q/k norm or the modulated LayerNorm still shows through the image branch."""
    i2v = wan_transformer(preset="wan-tiny-i2v")
    inputs = wan_inputs(i2v)
    expected = _call(i2v, inputs)
    with apply_kernels(i2v, "reference", qk_rope=False) as report:
        assert dict(report.rules) == UNFUSED and len(report.skipped) == 1
        assert torch.equal(_call(i2v, inputs), expected)
    with apply_kernels(i2v, "reference") as report:  # attn1 fused: one rounding fewer than Wan's
        assert dict(report.rules) == RULES and report.skipped == []
        assert _relative_error(_call(i2v, inputs), expected) < 1e-2
    assert torch.equal(_call(i2v, inputs), expected)
    without_image = _call(i2v, {**inputs, "encoder_hidden_states_image": torch.zeros_like(
        inputs["encoder_hidden_states_image"])})
    assert not torch.equal(without_image, expected)  # the image branch is live
    for op, wrong in (("rms_norm", _scaled(reference.rms_norm)),
                      ("layer_norm_modulate", lambda x, scale, shift, eps: _LN_MOD(x, scale * 1.01, shift, eps))):
        with monkeypatch.context() as patch:
            patch.setattr(reference, op, wrong)
            with apply_kernels(i2v, "reference", qk_rope=False):
                got = _call(i2v, inputs)
        error = ((got.float() - expected.float()).abs().max() / expected.float().abs().max()).item()
        assert error > 2e-3, f"{op}: a 1% error moved the output by only {error:.2g}"


@pytest.mark.gpu
def test_cuda_provider_on_i2v_blocks_against_the_unpatched_model():
    gpu = wan_transformer("cuda", "bf16", preset="wan-tiny-i2v")
    inputs = wan_inputs(gpu, device="cuda")
    expected = _call(gpu, inputs)
    with apply_kernels(gpu, "cuda") as report:
        assert dict(report.rules) == RULES and report.skipped == []
        got = _call(gpu, inputs)
    cos = torch.nn.functional.cosine_similarity(got.double().flatten(), expected.double().flatten(), dim=0)
    assert cos.item() > 0.9999


def test_every_patched_block_shares_one_class(model):
    """One patched subclass for all blocks (and for all norms, all GELUs): regional compile guards on a block's
    class, so a class per block would compile the block again for each of them."""
    with apply_kernels(model, "reference"):
        assert len({type(block) for block in model.blocks}) == 1
        assert len({type(block.attn1.norm_q) for block in model.blocks}) == 1
        assert len({type(block.ffn.net[0]) for block in model.blocks}) == 1
