"""Wan kernel injection in pipelines as users run them (CPU, reference provider, fp32, every rule on): LoRA adapters
added before or after the injection, fused and unfused; model CPU offload before and after it; prompt embeddings
encoded once and reused, and weights written through `.data` between calls (as PEFT's fuse_lora writes them); guidance
off and on (the guidance pair), one expert and the two of A14B. Each patched result is checked against the unpatched
pipeline in the same state, and revert gives back the unpatched pipeline."""

from __future__ import annotations

import pytest
import torch

from ltxbench.inject.wan import apply_kernels
from ltxbench.models import wan_build
from tests.helpers import max_rel_error

STEPS = 3
GENERATE = dict(num_frames=9, height=64, width=64, num_inference_steps=STEPS, output_type="latent", return_dict=False)
SOLO = 1e-5  # guidance off: the reference ops are the model's own, op for op
# guidance on: the pair runs batch-2 GEMMs, which the CPU may round differently from two batch-1 ones (the pair's own
# tests: at most 3e-6 after 4 steps); a dropped adapter or a stale weight moves the latents by 100x more
PAIRED = 1e-4
ADAPTED = ("to_q", "to_k", "to_v", "to_out.0", "net.0.proj", "net.2")  # every projection of the block, GELU's too


def _pipeline(model: str):
    pipe = wan_build.build_pipeline(model, "random", "cpu", "fp32")
    pipe.set_progress_bar_config(disable=True)
    return pipe


def _experts(pipe) -> list[str]:
    return [name for name in ("transformer", "transformer_2") if getattr(pipe, name, None) is not None]


def _embeddings(pipe):
    from diffusers import WanPipeline

    from ltxbench.models.wan_run import text_side

    with torch.no_grad():
        return WanPipeline.encode_prompt(text_side(pipe), "a fox in the snow", "blurry", device="cpu")


def _latents(pipe, embeddings, guidance: float):
    prompt, negative = embeddings
    scales = {"guidance_scale": guidance, **({"guidance_scale_2": guidance} if len(_experts(pipe)) > 1 else {})}
    with torch.no_grad():
        return pipe(prompt_embeds=prompt, negative_prompt_embeds=negative, **GENERATE, **scales,
                    generator=torch.Generator("cpu").manual_seed(3))[0]


def _tolerance(guidance: float) -> float:
    return SOLO if guidance == 1.0 else PAIRED


@pytest.mark.parametrize("guidance", [1.0, 5.0])
@pytest.mark.parametrize("model", ["wan-tiny", "wan-tiny-a14b"])
@pytest.mark.parametrize("order", ["adapter after injection", "adapter before injection"])
def test_lora_fuse_and_unfuse_match_the_unpatched_pipeline(order, model, guidance, fused_calls):
    pytest.importorskip("peft")
    from peft import LoraConfig

    patched, unpatched = _pipeline(model), _pipeline(model)
    embeddings = _embeddings(patched)
    config = LoraConfig(r=4, lora_alpha=4, target_modules=list(ADAPTED), init_lora_weights=False)

    def add_adapter(pipe):
        torch.manual_seed(5)  # random A and B: the adapter changes the result
        for name in _experts(pipe):
            getattr(pipe, name).add_adapter(config)

    add_adapter(unpatched)
    if order == "adapter before injection":
        add_adapter(patched)
    report = apply_kernels(patched, "reference")
    assert report.active
    _latents(patched, embeddings, guidance)
    if order == "adapter after injection":
        add_adapter(patched)
    results = {"adapter": _latents(patched, embeddings, guidance)}
    patched.fuse_lora(components=_experts(patched))
    results["fused"] = _latents(patched, embeddings, guidance)
    patched.unfuse_lora(components=_experts(patched))
    results["unfused"] = _latents(patched, embeddings, guidance)
    assert {"layer_norm_modulate", "qk_rms_norm_rope"} <= set(fused_calls)  # the rules ran beside the adapters
    report.revert()
    results["reverted"] = _latents(patched, embeddings, guidance)
    expected = _latents(unpatched, embeddings, guidance)
    tol = _tolerance(guidance)
    assert max_rel_error(_latents(_pipeline(model), embeddings, guidance), expected) > 100 * tol  # it matters
    for name, got in results.items():
        assert max_rel_error(got, expected) < tol, name


@pytest.mark.parametrize("model", ["wan-tiny", "wan-tiny-a14b"])
@pytest.mark.parametrize("when", ["before injection", "after injection"])
def test_model_cpu_offload_with_injection_matches_and_revert_restores_the_model(when, model, fused_calls):
    pipe = _pipeline(model)
    embeddings = _embeddings(pipe)
    expected = _latents(pipe, embeddings, 5.0)
    if when == "before injection":
        pipe.enable_model_cpu_offload(device="cpu")
    report = apply_kernels(pipe, "reference")
    if when == "after injection":
        pipe.enable_model_cpu_offload(device="cpu")
    got = _latents(pipe, embeddings, 5.0)
    ran_fused = set(fused_calls)
    report.revert()
    fused_calls.clear()
    after = _latents(pipe, embeddings, 5.0)
    assert {"layer_norm_modulate", "qk_rms_norm_rope"} <= ran_fused
    assert max_rel_error(got, expected) < PAIRED
    assert not fused_calls, f"the reverted pipeline still runs {sorted(set(fused_calls))}"
    assert torch.equal(after, expected)


def _write_through_data(pipe, scale: float) -> None:
    """What PEFT's fuse_lora does to a plain Linear's weight: an in-place write through `.data` (no version bump),
    here on the self-attention's key and the feed-forward's up-projection (under the GELU epilogue)."""
    g = torch.Generator().manual_seed(4)
    for block in pipe.transformer.blocks:
        for weight in (block.attn1.to_k.weight, block.ffn.net[0].proj.weight):
            weight.data += scale * torch.randn(weight.shape, generator=g)


@pytest.mark.parametrize("guidance", [1.0, 5.0])
def test_embeddings_reused_and_weights_written_between_calls_reach_the_next_call(guidance):
    patched, unpatched = _pipeline("wan-tiny"), _pipeline("wan-tiny")
    embeddings = _embeddings(patched)  # encoded once, given to every call
    tol = _tolerance(guidance)
    with apply_kernels(patched, "reference"):
        before = _latents(patched, embeddings, guidance)
        again = _latents(patched, embeddings, guidance)
        _write_through_data(patched, 0.5)
        after = _latents(patched, embeddings, guidance)
    _write_through_data(unpatched, 0.5)
    expected = _latents(unpatched, embeddings, guidance)
    assert torch.equal(before, again)
    assert max_rel_error(before, after) > 100 * tol  # the change matters, so stale state would show
    assert max_rel_error(after, expected) < tol
