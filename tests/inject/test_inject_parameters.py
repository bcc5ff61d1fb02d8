"""The model's own Parameters under injection (CPU, reference provider; LTX-Video, LTX-2, LLMs): a weight replaced
after the injection (`layer.weight = nn.Parameter(w)`, as load_state_dict(assign=True) and adapter loaders do) is
followed by the fused bf16 projections and refused, with the layer's name, by FP8 (whose GEMMs read a copy the new
Parameter never reaches); and revert() gives back the very objects the model had (an optimizer's or a user's
reference reaches the model again), with their values, dtype, device and requires_grad, each with its own storage."""

from __future__ import annotations

import pytest
import torch

from ltxbench.inject import llm
from ltxbench.inject import ltx as inject_ltx
from ltxbench.inject import ltx2 as inject_ltx2
from tests.helpers import build_ltx2_tiny, llm_build, llm_prompt, ltx2_call, ltx_inputs, ltx_transformer

HELD = r"is held by ltxbench's FP8 injection \(--precision fp8\).*revert\(\) the injection before replacing"
IN_ITS_PLACE = r"runs in FP8 under ltxbench's injection.*revert\(\) the injection before replacing"


def _ltx():
    model = ltx_transformer()
    inputs = ltx_inputs(model)
    return model, lambda: model(**inputs)[0], inject_ltx.apply_kernels


def _ltx2():
    model = build_ltx2_tiny().transformer
    return model, lambda: torch.cat([t.flatten() for t in ltx2_call(model)]), inject_ltx2.apply_kernels


def _llm(family):
    def make():
        model = llm_build(family)
        ids = llm_prompt()
        return model, lambda: model(input_ids=ids).logits, llm.apply_kernels

    return make


MODELS = {"ltx": _ltx, "ltx2": _ltx2, "llama": _llm("llama"), "qwen3": _llm("qwen3")}
# per model, layers whose projections the bf16 injection fuses: q/k/v, k/v, gate/up
FUSED = {"ltx": ("transformer_blocks.0.attn1.to_k", "transformer_blocks.1.attn2.to_v"),
         "ltx2": ("transformer_blocks.0.attn1.to_v", "transformer_blocks.1.audio_to_video_attn.to_k"),
         "llama": ("model.layers.0.self_attn.k_proj", "model.layers.1.mlp.up_proj"),
         "qwen3": ("model.layers.1.self_attn.q_proj", "model.layers.0.mlp.gate_proj")}
# per model, FP8 layers of every kind: in a q/k/v or k/v concatenation, on their own, the feed-forward's two
FP8_LAYERS = {"ltx": ("transformer_blocks.0.attn1.to_q", "transformer_blocks.0.attn1.to_out.0",
                      "transformer_blocks.1.attn2.to_k", "transformer_blocks.1.ff.net.0.proj",
                      "transformer_blocks.0.ff.net.2"),
              "ltx2": ("transformer_blocks.0.attn1.to_k", "transformer_blocks.1.audio_to_video_attn.to_v",
                       "transformer_blocks.0.attn2.to_q", "transformer_blocks.1.audio_ff.net.2",
                       "transformer_blocks.0.video_to_audio_attn.to_out.0")}


def _rel(a, b) -> float:
    return ((a - b).norm() / b.norm()).item()


@pytest.mark.parametrize("name", list(MODELS))
def test_a_weight_replaced_after_the_bf16_injection_is_followed(name):
    """The fused projections run the layers themselves once one has a new Parameter: the output is the unpatched
    model's with the new weights (what the unpatched model gives after the revert, which keeps them)."""
    model, run, apply_kernels = MODELS[name]()
    g = torch.Generator().manual_seed(7)
    with torch.no_grad():
        before = run()
        report = apply_kernels(model, "reference")
        assert any("GEMM" in rule or "gate_up" in rule for rule in report.rules), dict(report.rules)
        for path in FUSED[name]:
            layer = model.get_submodule(path)
            layer.weight = torch.nn.Parameter(torch.randn(layer.weight.shape, generator=g) * layer.weight.std() * 3)
        got = run()
        report.revert()
        unpatched = run()
    assert _rel(unpatched, before) > 0.05  # the new weights matter
    assert _rel(got, unpatched) < 1e-5, _rel(got, unpatched)


@pytest.mark.parametrize("name", ["ltx", "ltx2"])
def test_a_weight_or_layer_replaced_after_the_fp8_injection_is_refused(name):
    """FP8 GEMMs read a copy of the weights made at injection: a new Parameter, or a module put in a held one's place
    (peft's LoRA wrapping), would never reach it. Refused at the assignment, naming the layer; nothing changes, and
    after the revert the same replacement passes."""
    model, run, apply_kernels = MODELS[name]()
    with torch.no_grad():
        report = apply_kernels(model, "reference", precision="fp8")
        before = run()
        for path in FP8_LAYERS[name]:
            layer = model.get_submodule(path)
            new = torch.nn.Parameter(torch.randn(layer.out_features, layer.in_features))
            with pytest.raises(RuntimeError, match=f"{path.replace('.', '[.]')}.weight {HELD}"):
                layer.weight = new
            assert layer.weight.numel() == 0  # still the placeholder
            parent, _, child = path.rpartition(".")
            with pytest.raises(RuntimeError, match=f"{path.replace('.', '[.]')} {IN_ITS_PLACE}"):
                model.get_submodule(parent).register_module(child, torch.nn.Sequential(layer))
            assert model.get_submodule(path) is layer
        joined = model.get_submodule(FP8_LAYERS[name][0])  # its bias is in the concatenation's: held too
        with pytest.raises(RuntimeError, match=HELD):
            joined.bias = torch.nn.Parameter(torch.randn(joined.out_features))
        block = model.transformer_blocks[0]
        with pytest.raises(RuntimeError, match=f"transformer_blocks[.]0[.]ff {IN_ITS_PLACE}"):
            block.ff = torch.nn.Identity()
        assert torch.equal(run(), before)
        report.revert()
        layer = model.get_submodule(FP8_LAYERS[name][1])
        layer.weight = torch.nn.Parameter(layer.weight.detach() * 2)  # not held any more
        block.ff = torch.nn.Identity()


@pytest.mark.parametrize("name", ["ltx", "ltx2"])
def test_a_bias_replaced_on_a_single_fp8_layer_is_followed(name):
    """A layer on its own keeps its bias (the FP8 GEMM reads `layer.bias` at each call): a new bias Parameter gives
    the output that the same values written in place give."""
    model, run, apply_kernels = MODELS[name]()
    layer = model.get_submodule(FP8_LAYERS[name][2])
    bias = layer.bias
    with torch.no_grad(), apply_kernels(model, "reference", precision="fp8"):
        before = run()
        layer.bias = torch.nn.Parameter(bias.detach() + 1.0)
        replaced = run()
        layer.bias = bias
        bias.add_(1.0)
        in_place = run()
        bias.sub_(1.0)
    assert _rel(replaced, before) > 1e-3 and torch.equal(replaced, in_place)


def _snapshot(model) -> dict:
    return {name: (t, type(t), t.dtype, t.device, t.requires_grad, t.detach().clone())
            for kind in ("parameters", "buffers")
            for name, t in getattr(model, f"named_{kind}")(remove_duplicate=False)}


CASES = [(name, "bf16") for name in MODELS] + [("ltx", "fp8"), ("ltx2", "fp8")]


@pytest.mark.parametrize(("name", "precision"), CASES)
def test_revert_gives_back_the_very_same_parameters_and_buffers(name, precision):
    """After apply + revert every named parameter and buffer is the object it was (identity, class, dtype, device,
    requires_grad, values), none is left sharing storage with another (the fused concatenations are gone), and an
    in-place update through a reference taken before the injection reaches the model."""
    model, run, apply_kernels = MODELS[name]()
    frozen = model.get_submodule(FUSED[name][0]).weight
    frozen.requires_grad_(False)  # one fused weight frozen, as a partly trained model has them
    kwargs = {} if precision == "bf16" else {"precision": "fp8"}
    before = _snapshot(model)
    with torch.no_grad():
        expected = run()
        report = apply_kernels(model, "reference", **kwargs)
        run()
        report.revert()
    after = _snapshot(model)
    assert after.keys() == before.keys()
    for key, (obj, kind, dtype, device, grad, values) in before.items():
        now = after[key]
        assert now[0] is obj, f"{key}: another object after the revert"
        assert now[1:5] == (kind, dtype, device, grad), (key, now[1:5], (kind, dtype, device, grad))
        assert torch.equal(now[5], values), key
    storages = [t.untyped_storage().data_ptr() for t in dict.fromkeys(o for o, *_ in after.values()) if t.numel()]
    assert len(storages) == len(set(storages)), "tensors share storage after the revert"
    with torch.no_grad():
        assert torch.equal(run(), expected)
        frozen.mul_(0.0)  # the reference taken before the injection still is the model's weight
        assert not torch.equal(run(), expected)
