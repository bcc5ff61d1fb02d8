"""LLMs (Llama, Qwen3, Gemma 3) patched as users run them with PEFT (CPU, reference provider, fp32): a LoRA adapter
on every projection (the fused q/k/v and gate/up included) added before or after the injection, merged in place or
with `safe_merge` (a new weight tensor given through `.data`), unmerged, and `merge_and_unload`; each against the
unpatched model with the same adapter, by logits and by greedy tokens through the static cache; revert gives the
model back."""

from __future__ import annotations

import pytest
import torch

from ltxbench.inject import llm
from tests.helpers import gemma_build, llm_build, llm_prompt, max_rel_error

TOL = 1e-5  # the reference ops are the model's own math; only the GEMMs' grouping differs (fused q/k/v, gate/up)
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def _build(model_type: str):
    return gemma_build() if model_type == "gemma3" else llm_build(model_type)


def _with_adapter(model):
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(5)  # random A and B: the adapter changes the result
    return get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=TARGETS, init_lora_weights=False))


def _logits(model, ids):
    with torch.no_grad():
        return model(input_ids=ids).logits


def _tokens(model, ids):
    with torch.no_grad():
        return model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=6, min_new_tokens=6,
                              do_sample=False, pad_token_id=0, cache_implementation="static", disable_compile=True)


@pytest.fixture
def norm_calls(monkeypatch):
    """Calls of the reference provider's fused add + RMSNorm: the patched decoder layers ran."""
    from ltxbench.ops import reference

    calls = []
    original = reference.fused_add_rms_norm
    monkeypatch.setattr(reference, "fused_add_rms_norm", lambda *a, **k: calls.append(1) or original(*a, **k))
    return calls


@pytest.mark.parametrize("model_type", ["llama", "qwen3", "gemma3"])
@pytest.mark.parametrize("order", ["adapter after injection", "adapter before injection"])
def test_a_lora_adapter_merged_and_unmerged_matches_the_unpatched_model(order, model_type):
    pytest.importorskip("peft")
    ids = llm_prompt()
    expected_model = _with_adapter(_build(model_type))
    expected = _logits(expected_model, ids)
    assert max_rel_error(_logits(_build(model_type), ids), expected) > 100 * TOL  # the adapter matters

    base = _build(model_type)
    if order == "adapter before injection":
        model = _with_adapter(base)
        report = llm.apply_kernels(model.base_model.model, "reference")
    else:
        report = llm.apply_kernels(base, "reference")
        _logits(base, ids)
        model = _with_adapter(base)
    assert report.active
    results = {"adapter": _logits(model, ids)}
    model.merge_adapter()  # in place: base weight += delta
    results["merged"] = _logits(model, ids)
    model.unmerge_adapter()
    results["unmerged"] = _logits(model, ids)
    for layer in (m for m in model.modules() if hasattr(m, "merge") and hasattr(m, "base_layer")):
        layer.merge(safe_merge=True)  # a new tensor given to the base weight through .data
    results["safe merged"] = _logits(model, ids)
    for name, got in results.items():
        assert max_rel_error(got, expected) < TOL, name
    assert torch.equal(_tokens(model, ids), _tokens(expected_model.merge_and_unload(), ids))
    report.revert()
    assert max_rel_error(_logits(model, ids), expected) < TOL


def test_merge_and_unload_after_the_injection_keeps_the_merged_weights(norm_calls):
    """merge_and_unload puts the base layers back in their parents with the adapter merged: the patched model must
    compute with those weights (not a concatenation made before the merge)."""
    pytest.importorskip("peft")
    ids = llm_prompt()
    expected = _logits(_with_adapter(llm_build("llama")).merge_and_unload(), ids)
    base = llm_build("llama")
    report = llm.apply_kernels(base, "reference")
    merged = _with_adapter(base).merge_and_unload()
    assert merged is base
    got = _logits(merged, ids)
    assert max_rel_error(got, expected) < TOL
    assert norm_calls  # the patched layers ran
    report.revert()
    assert max_rel_error(_logits(base, ids), expected) < TOL
