"""LTX-2's pipeline as users run it, patched (reference provider, ltx2-tiny, fp32, the CPU): a LoRA adapter added
before or after the injection, fused and unfused; model CPU offload enabled before or after it; prompt embeddings
reused across generations. Each matches the unpatched pipeline in the same state to the fused kernels' rounding."""

from __future__ import annotations

import pytest
import torch

from ltxbench.inject import ltx2 as inject_ltx2
from tests.helpers import build_ltx2_tiny, ltx2_generate, max_abs_error

ATOL = 1e-5


def _pipeline():
    return build_ltx2_tiny()


@pytest.mark.parametrize("order", ["adapter after injection", "adapter before injection"])
def test_lora_fuse_and_unfuse_match_the_unpatched_pipeline(order):
    pytest.importorskip("peft")
    from peft import LoraConfig

    patched, unpatched = _pipeline(), _pipeline()
    config = LoraConfig(r=4, lora_alpha=4, target_modules=["to_q", "to_k", "to_v", "to_out.0"],
                        init_lora_weights=False)  # random A and B: the adapter changes the result

    def add_adapter(pipe):
        torch.manual_seed(5)
        pipe.transformer.add_adapter(config)

    add_adapter(unpatched)
    if order == "adapter before injection":
        add_adapter(patched)
    report = inject_ltx2.apply_kernels(patched, "reference")
    ltx2_generate(patched)
    if order == "adapter after injection":
        add_adapter(patched)
    results = {"adapter": ltx2_generate(patched)}
    patched.fuse_lora(components=["transformer"])
    results["fused"] = ltx2_generate(patched)
    patched.unfuse_lora(components=["transformer"])
    results["unfused"] = ltx2_generate(patched)
    report.revert()
    expected = ltx2_generate(unpatched)
    assert max_abs_error(expected, ltx2_generate(_pipeline())) > 100 * ATOL  # the adapter matters
    for name, got in results.items():
        assert max_abs_error(got, expected) < ATOL, name


@pytest.mark.parametrize("when", ["before injection", "after injection"])
def test_model_cpu_offload_matches(when, fused_calls):
    pipe = _pipeline()
    expected = ltx2_generate(pipe)
    if when == "before injection":
        pipe.enable_model_cpu_offload(device="cpu")
    report = inject_ltx2.apply_kernels(pipe, "reference")
    if when == "after injection":
        pipe.enable_model_cpu_offload(device="cpu")
    got = ltx2_generate(pipe)
    assert "qk_rms_norm_rope_split" in fused_calls  # whole-model offload keeps the kernels
    report.revert()
    assert max_abs_error(got, expected) < ATOL


def test_reused_prompt_embeddings_across_generations():
    """The prompt encoded once and passed to three generations (the text keys/values cache sees the same tensors
    each time, and must rebuild per generation: a weight written through .data in between is seen)."""
    pipe = _pipeline()
    embeds = pipe.encode_prompt("a fox in the snow", "blurry", device="cpu")
    names = ("prompt_embeds", "prompt_attention_mask", "negative_prompt_embeds", "negative_prompt_attention_mask")
    given = dict(zip(names, embeds, strict=True), prompt=None, negative_prompt=None)
    expected = ltx2_generate(pipe, **given)
    with inject_ltx2.apply_kernels(pipe, "reference"):
        first, second = ltx2_generate(pipe, **given), ltx2_generate(pipe, **given)
        with torch.no_grad():
            pipe.transformer.transformer_blocks[0].attn2.to_k.weight.data.mul_(1.5)
        changed = ltx2_generate(pipe, **given)
    unpatched_changed = ltx2_generate(pipe, **given)
    assert max_abs_error(first, expected) < ATOL and torch.equal(first[0], second[0])
    assert max_abs_error(changed, unpatched_changed) < ATOL and max_abs_error(changed, first) > 100 * ATOL
