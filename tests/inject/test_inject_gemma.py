"""ltxbench.inject.llm on the tiny Gemma 3 (gemma-3-tiny: a sliding, a global and a sliding layer; CPU, reference
provider); the GPU test at the end runs the cuda provider in bf16."""

from __future__ import annotations

import types
from collections import Counter

import pytest
import torch

from ltxbench.inject import llm
from ltxbench.inject.llm import attention as llm_attention
from ltxbench.inject.llm import gemma
from ltxbench.ops import reference
from tests.helpers import count_calls, gemma_build, llm_prompt

OPS = ("rms_norm", "fused_add_rms_norm", "geglu", "rope_1d", "linear", "rope_1d_cache", "decode_attention")


@pytest.fixture
def spy(monkeypatch):
    """The reference provider, counting calls per op and recording the norm weights' dtypes and offsets."""
    calls: Counter = Counter()

    def wrap(name):
        fn = getattr(reference, name)

        def counted(*args, **kwargs):
            calls[name] += 1
            if name in ("rms_norm", "fused_add_rms_norm"):
                calls[f"{name} weight {args[1 if name == 'rms_norm' else 2].dtype}"] += 1
                calls[f"{name} offset {kwargs.get('weight_offset', 0.0)}"] += 1
            return fn(*args, **kwargs)

        return counted

    monkeypatch.setattr(llm, "get_provider", lambda name: types.SimpleNamespace(**{n: wrap(n) for n in OPS}))
    return calls


def logits(model, ids):
    with torch.no_grad():
        return model(ids).logits


def test_patched_gemma_is_bit_identical_in_fp32_and_revert_is_exact(spy, monkeypatch):
    from transformers.models.gemma3 import modeling_gemma3 as m

    model = gemma_build()
    ids = llm_prompt()
    before = logits(model, ids)
    report = llm.apply_kernels(model, "reference")
    # 3 layers x (4 sandwich norms + q_norm + k_norm) + the final norm
    assert {rule: report.rules[rule] for rule in gemma.RULES} == {gemma.RULE_NORM: 19, gemma.RULE_LAYER: 3,
                                                                   gemma.RULE_MLP: 3, gemma.RULE_ROPE: 3,
                                                                   gemma.RULE_DECODE: 7}
    assert report.skipped == []
    called = count_calls(monkeypatch, [(name, layer.get_submodule(name)) for layer in model.model.layers
                                       for name in ("self_attn.q_proj", "self_attn.v_proj", "mlp.up_proj")])
    patched = logits(model, ids)
    assert not called  # q/k/v and gate/up run as one GEMM each
    # pre_feedforward_layernorm runs inside fused_add_rms_norm; every norm reads `1 + weight` through the offset; the
    # prompt's q/k/v, o_proj, gate/up and down per layer and lm_head through ops.linear (tuned_gemm)
    assert dict(spy) == {"rms_norm": 16, "rms_norm weight torch.float32": 16, "rms_norm offset 1.0": 16,
                         "fused_add_rms_norm": 3, "fused_add_rms_norm weight torch.float32": 3,
                         "fused_add_rms_norm offset 1.0": 3, "geglu": 3, "rope_1d": 3, "linear": 13}
    assert torch.equal(patched, before)

    attn, mlp = model.model.layers[1].self_attn, model.model.layers[1].mlp
    assert hasattr(attn, llm_attention.QKV_ATTR) and hasattr(mlp, gemma.FUSED_ATTR)
    assert mlp.gate_proj.weight.data_ptr() == getattr(mlp, gemma.FUSED_ATTR).weight.data_ptr()
    report.revert()
    assert not any("forward" in vars(module) for module in model.modules())
    assert type(attn) is m.Gemma3Attention and type(mlp) is m.Gemma3MLP
    assert type(model.model.layers[0]) is m.Gemma3DecoderLayer and type(model.model.norm) is m.Gemma3RMSNorm
    assert not hasattr(attn, llm_attention.QKV_ATTR) and not hasattr(mlp, gemma.FUSED_ATTR)
    spy.clear()
    assert torch.equal(logits(model, ids), before) and not spy


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_gemma_norm_is_bit_identical_in_16_bits(dtype, spy):
    """In 16 bits the op reads the 16-bit weight and adds the 1 in fp32 (weight_offset; a 16-bit `1 + weight` tensor
    would be a rounding Gemma never does): the same bits as Gemma3RMSNorm. A weight in another dtype than the rows
    runs on fp32 copies with the fp32 `1 + weight`, also bit for bit."""
    model = gemma_build(dtype)
    norms = [model.model.layers[0].input_layernorm, model.model.layers[1].self_attn.q_norm]
    rows = [2.0 * torch.randn(3, 7, norm.weight.shape[0], generator=torch.Generator().manual_seed(4)).to(dtype)
            for norm in norms]
    with torch.no_grad():
        expected = [norm(x) for norm, x in zip(norms, rows, strict=True)]
        with llm.apply_kernels(model, "reference"):
            got = [norm(x) for norm, x in zip(norms, rows, strict=True)]
    assert spy[f"rms_norm weight {dtype}"] == 2 and spy["rms_norm offset 1.0"] == 2
    for g, e in zip(got, expected, strict=True):
        assert g.dtype == dtype and torch.equal(g, e)
    spy.clear()
    norm = norms[0]
    with torch.no_grad():
        norm.weight.data = norm.weight.data.float()  # mixed: an fp32 weight beside 16-bit rows
        expected = norm(rows[0])
        with llm.apply_kernels(model, "reference"):
            got = norm(rows[0])
    assert spy["rms_norm weight torch.float32"] == 1 and spy["rms_norm offset 0.0"] == 1
    assert got.dtype == dtype and torch.equal(got, expected)


def test_gemma_bf16_logits_stay_close(spy):
    """bf16: the norms and the fused sandwich add are exact; rope_1d and geglu round once where Gemma rounds each
    step (the LLaMA rules' policy)."""
    model = gemma_build(torch.bfloat16)
    ids = llm_prompt()
    before = logits(model, ids).float()
    with llm.apply_kernels(model, "reference"):
        patched = logits(model, ids).float()
    assert spy["fused_add_rms_norm"] == 3 and spy["rms_norm"] == 16
    assert spy["fused_add_rms_norm weight torch.bfloat16"] == 3 and spy["rms_norm offset 1.0"] == 16
    cosine = torch.nn.functional.cosine_similarity(patched.flatten(), before.flatten(), dim=0).item()
    assert cosine > 0.999, cosine


@pytest.mark.parametrize("cache", ["dynamic", "static"])
def test_gemma_generates_the_same_tokens(cache, spy):
    model = gemma_build()
    ids = llm_prompt()
    mask = torch.ones_like(ids)
    mask[1, :3] = 0  # left padding
    kwargs = {"cache_implementation": "static"} if cache == "static" else {}

    def greedy():
        with torch.no_grad():
            return model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=8, min_new_tokens=8,
                                  do_sample=False, pad_token_id=0, **kwargs)

    expected = greedy()
    with llm.apply_kernels(model, "reference"):
        tokens = greedy()
    assert spy["rope_1d"] + spy["rope_1d_cache"] == 3 * 8
    # the static cache's global layer (1 of 3) writes its decode steps with rope_1d_cache; sliding ones update
    assert spy["rope_1d_cache"] == (7 if cache == "static" else 0)
    # the prompt's and each decode step's q/k/v, o_proj, gate/up, down and lm_head (tuned_gemm; a decode step's rows:
    # the GEMV)
    assert spy["linear"] == (4 * 3 + 1) * 8
    assert torch.equal(tokens, expected)


def test_rope_tables_are_built_once_per_layer_type(monkeypatch, spy):
    """sliding, global, sliding: two (cos, sin) pairs per forward, each made into tables once."""
    built = Counter()
    tables_of = llm_attention._tables_of
    monkeypatch.setattr(llm_attention, "_tables_of", lambda cos, sin: built.update(["tables"]) or tables_of(cos, sin))
    model = gemma_build()
    with llm.apply_kernels(model, "reference"):
        logits(model, llm_prompt())
        logits(model, llm_prompt())
    assert built["tables"] == 2 * 2


def test_python_tanh_gelu_and_unknown_classes_are_skipped(spy):
    from transformers.activations import GELUTanh

    model = gemma_build()
    ids = llm_prompt()
    before = logits(model, ids)
    model.model.layers[0].mlp.act_fn = GELUTanh(use_gelu_tanh_python=True)  # another rounding: not verified

    class OtherRMSNorm(type(model.model.norm)):
        pass

    model.model.layers[2].pre_feedforward_layernorm.__class__ = OtherRMSNorm
    with llm.apply_kernels(model, "reference") as report:
        assert report.rules[gemma.RULE_MLP] == 2 and report.rules[gemma.RULE_LAYER] == 2
        assert any(rule == gemma.RULE_MLP and "layers.0" in why for rule, why in report.skipped)
        assert any(rule == gemma.RULE_NORM and "OtherRMSNorm" in why for rule, why in report.skipped)
        assert any(rule == gemma.RULE_LAYER and "layers.2" in why for rule, why in report.skipped)
        patched = logits(model, ids)
    torch.testing.assert_close(patched, before, atol=1e-5, rtol=1e-5)


def test_gemma3_text_tower_of_the_multimodal_model():
    """model_type gemma3 (Gemma3ForConditionalGeneration, LTX-2's text encoder class): the text tower is patched,
    the vision tower left as it is, text-only logits bit-identical in fp32."""
    import json

    from transformers import Gemma3Config, Gemma3ForConditionalGeneration

    from ltxbench.models.ltx2_build import CONFIGS

    config = json.loads((CONFIGS / "ltx2-tiny" / "text_encoder.json").read_text())
    torch.manual_seed(0)
    model = Gemma3ForConditionalGeneration(Gemma3Config.from_dict(config)).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1 + 1.5 * torch.randn_like(p))
    ids = llm_prompt()
    before = logits(model, ids)
    with llm.apply_kernels(model, "reference") as report:
        assert report.rules[gemma.RULE_LAYER] == len(model.model.language_model.layers) and not report.skipped
        assert not any("forward" in vars(m) for m in model.model.vision_tower.modules())
        assert torch.equal(logits(model, ids), before)


@pytest.mark.gpu
def test_cuda_kernels_bf16_on_tiny_gemma():
    """The cuda provider in bf16: logits cosine >= 0.999 against the unpatched bf16 model, and the 16-bit norm
    (the bf16 weight offset by 1 in the kernel) within one bf16 rounding of Gemma3RMSNorm."""
    model = gemma_build(torch.bfloat16, "cuda")
    ids = llm_prompt().cuda()
    norm = model.model.layers[1].post_feedforward_layernorm
    x = 3.0 * torch.randn(2, 5, norm.weight.shape[0], device="cuda", dtype=torch.bfloat16)
    before = logits(model, ids).float()
    with torch.no_grad():
        expected = norm(x)
    with llm.apply_kernels(model, "cuda") as report:
        assert not report.skipped
        patched = logits(model, ids).float()
        with torch.no_grad():
            got = norm(x)
    cosine = torch.nn.functional.cosine_similarity(patched.flatten(), before.flatten(), dim=0).item()
    print(f"gemma-3-tiny bf16 cuda: logits cosine {cosine:.6f}, norm max diff {(got - expected).abs().max().item()}")
    assert cosine > 0.999
    torch.testing.assert_close(got, expected, atol=0, rtol=2 ** -8)  # one bf16 rounding of fp32 results
