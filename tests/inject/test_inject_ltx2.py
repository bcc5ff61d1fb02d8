"""LTX-2 injection (ltxbench.inject.ltx2) on the CPU, ltx2-tiny in fp32, its text keys/values rule (the fused blocks and
the STG pass, which round differently, off where the output is compared: test_inject_ltx2_block.py and
test_inject_ltx2_stg.py cover them): the keys/values kept for a generation give the model's output bit for bit, are
built once per input, never outlive a generation, see in-place weight changes, and revert exactly."""

from __future__ import annotations

import pytest
import torch

from ltxbench.inject import ltx2 as inject_ltx2
from ltxbench.models import ltx2_build

GENERATE = dict(prompt="a fox in the snow", negative_prompt="blurry", num_frames=9, height=64, width=64,
                num_inference_steps=2, output_type="latent", return_dict=False)


@pytest.fixture
def pipe():
    return ltx2_build.build_pipeline("ltx2-tiny", "random", "cpu", torch.float32, seed=0)


def _latents(pipe, **overrides):
    with torch.no_grad():
        return pipe(**{**GENERATE, **overrides}, generator=torch.Generator("cpu").manual_seed(3))


def _attns(pipe):
    return [getattr(b, name) for b in pipe.transformer.transformer_blocks for name in ("attn2", "audio_attn2")]


def _equal(a, b) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


def test_kept_keys_and_values_give_the_model_output_bit_for_bit(pipe):
    """Default guidance: per step the CFG pair (batch 2) and two batch-1 passes on the positive half; each text
    cross-attention builds its keys/values once per input (2 inputs) and reuses them for the other calls."""
    expected = _latents(pipe)
    report = inject_ltx2.apply_kernels(pipe, "reference", fused_blocks=False, reuse_stg_pass=False,
                                       text_encoder=False)
    try:
        assert dict(report.rules) == {inject_ltx2.TEXT_KV_RULE: 4, inject_ltx2.PROJECTION_RULE: 2,
                                      inject_ltx2.TEXT_MASK_RULE: 1, inject_ltx2.GENERATION_RULE: 1}
        cache = vars(pipe.transformer)[inject_ltx2.CACHE_ATTR]
        assert _equal(_latents(pipe), expected)  # the connectors' all-ones masks left out too
        assert cache.mask_checks == 2  # the pair's mask and the batch-1 passes' (video and audio share each): once each
        kept, calls = len(_attns(pipe)) + 2, 3 * GENERATE["num_inference_steps"]  # + the two prompt projections
        assert cache.builds == 2 * kept and cache.hits == (calls - 2) * kept
        assert cache.entries == {} and cache.generations == 0  # forgotten after the call
        no_guidance = dict(guidance_scale=1.0, audio_guidance_scale=1.0, stg_scale=0.0, audio_stg_scale=0.0,
                           modality_scale=1.0, audio_modality_scale=1.0)
        report.revert()
        plain = _latents(pipe, **no_guidance)
        report = inject_ltx2.apply_kernels(pipe, "reference", fused_blocks=False, reuse_stg_pass=False)
        assert _equal(_latents(pipe, **no_guidance), plain)
    finally:
        report.revert()


def test_weights_changed_between_generations_meet_a_fresh_entry(pipe):
    """fuse_lora writes weight.data (no version bump): the next generation must not reuse the last one's keys."""
    report = inject_ltx2.apply_kernels(pipe, "reference", fused_blocks=False, reuse_stg_pass=False)
    _latents(pipe)
    with torch.no_grad():
        for attn in _attns(pipe):
            attn.to_k.weight.data.mul_(1.5)
            attn.to_v.weight.data.add_(0.01)
    patched = _latents(pipe)
    report.revert()
    assert _equal(patched, _latents(pipe))


def test_the_cache_keys_on_the_input_view_and_the_weights_inside_a_generation(pipe):
    attn = pipe.transformer.transformer_blocks[0].attn2
    cache = inject_ltx2.TextKVCache()
    text = torch.randn(2, 16, attn.to_k.in_features)
    with torch.no_grad():
        cache.key_value(attn, text)
        assert cache.builds == 0 and cache.hits == 0  # outside a generation: computed, not kept
        cache.generations = 1
        first = cache.key_value(attn, text)
        assert cache.key_value(attn, text) is first and cache.hits == 1
        half = text.chunk(2)[1]
        assert cache.key_value(attn, half)[0].shape[0] == 1 and cache.builds == 2  # a view of its own
        attn.to_k.weight.mul_(2.0)  # in place, version bumped: recomputed with the new weights
        again = cache.key_value(attn, text)
        assert again is not first and torch.equal(again[0], attn.norm_k(attn.to_k(text)))
        text.add_(1.0)  # the prompt changed in place
        assert torch.equal(cache.key_value(attn, text)[0], attn.norm_k(attn.to_k(text)))
    assert torch.is_grad_enabled() and cache.key_value(attn, text) is not None  # autograd: never cached
    assert cache.builds == 4


def test_revert_restores_the_processors_and_the_pipeline_class(pipe):
    before = [a.processor for a in _attns(pipe)]
    cls = type(pipe)
    report = inject_ltx2.apply_kernels(pipe, "reference")
    assert all(isinstance(a.processor, inject_ltx2.TextKVProcessor) for a in _attns(pipe)) and type(pipe) is not cls
    again = inject_ltx2.apply_kernels(pipe, "reference")
    assert not again.rules and "patched by ltxbench already" in again.skipped[0][1]
    report.revert()
    assert [a.processor for a in _attns(pipe)] == before and type(pipe) is cls
    assert inject_ltx2.CACHE_ATTR not in vars(pipe.transformer)


def test_unknown_processors_and_sources_are_left_alone(pipe, monkeypatch):
    first = pipe.transformer.transformer_blocks[0].attn2

    class Other:
        def __call__(self, *args, **kwargs):
            raise AssertionError("not called")

    first.processor = Other()
    report = inject_ltx2.apply_kernels(pipe, "reference")
    assert report.rules[inject_ltx2.TEXT_KV_RULE] == 3
    assert report.skipped == [("block 0 attn2", "its processor is Other, not LTX2AudioVideoAttnProcessor: left as is")]
    report.revert()
    monkeypatch.setattr(inject_ltx2, "PROCESSOR_SOURCE", "0" * 16)  # diffusers changed the code we reproduce
    refused = inject_ltx2.apply_kernels(pipe, "reference")
    assert inject_ltx2.TEXT_KV_RULE not in refused.rules and inject_ltx2.BLOCK_RULE not in refused.rules
    assert "is not the code this rule reproduces" in dict(refused.skipped)[inject_ltx2.TEXT_KV_RULE]


def test_the_bare_transformer_keeps_nothing_across_calls(pipe):
    report = inject_ltx2.apply_kernels(pipe.transformer, "reference")
    assert inject_ltx2.GENERATION_RULE in dict(report.skipped)
    cache = vars(pipe.transformer)[inject_ltx2.CACHE_ATTR]
    _latents(pipe)
    assert cache.builds == 0 and cache.hits == 0
    with inject_ltx2.generation(pipe.transformer):
        _latents(pipe)
    assert cache.builds > 0 and cache.hits > 0 and cache.entries == {}
    report.revert()


def test_entries_do_not_outlive_a_generation(pipe):
    """The same prompt tensor in two generations, the weights changed through .data between them (no version bump,
    as PEFT's fuse_lora): the second generation computes afresh. Within one, such a change would go unseen; that is
    why nothing is kept across generations."""
    report = inject_ltx2.apply_kernels(pipe.transformer, "reference")
    attn = pipe.transformer.transformer_blocks[0].attn2
    cache = vars(pipe.transformer)[inject_ltx2.CACHE_ATTR]
    text = torch.randn(1, 16, attn.to_k.in_features)
    with torch.no_grad():
        with inject_ltx2.generation(pipe.transformer):
            first = cache.key_value(attn, text)[0]
        attn.to_k.weight.data.mul_(1.5)
        with inject_ltx2.generation(pipe.transformer):
            second = cache.key_value(attn, text)[0]
        assert torch.equal(second, attn.norm_k(attn.to_k(text))) and not torch.equal(first, second)
    report.revert()


def _prompt_embeds(pipe):
    with torch.no_grad():
        return pipe.encode_prompt("a fox in the snow", "blurry", max_sequence_length=64, device="cpu")


def test_the_pipelines_text_encoder_runs_the_gemma_rules_and_reverts(pipe):
    """The pipeline's Gemma 3 text encoder is patched with the rest (the LLM rules, under "text_encoder: "): in fp32
    its every-layer hidden states, which LTX-2 reads all of, are bit for bit the model's; revert gives back its
    classes; text_encoder=False leaves it alone."""
    encoder = pipe.text_encoder
    classes = {name: type(m) for name, m in encoder.named_modules()}
    expected = _prompt_embeds(pipe)
    with inject_ltx2.apply_kernels(pipe, "reference") as report:
        encoder_rules = {r for r in report.rules if r.startswith("text_encoder: ")}
        assert {"text_encoder: gemma rms_norm (1 + weight)", "text_encoder: attention: one q/k/v GEMM + rope_1d",
                "text_encoder: gemma mlp: fused gate_up projection + geglu (tanh GELU)"} <= encoder_rules
        assert any(type(m) is not classes[name] for name, m in encoder.named_modules())
        assert _equal(_prompt_embeds(pipe), expected)
    assert {name: type(m) for name, m in encoder.named_modules()} == classes
    with inject_ltx2.apply_kernels(pipe, "reference", text_encoder=False) as report:
        assert not any(r.startswith("text_encoder: ") for r in report.rules)
        assert ("text_encoder", "turned off (text_encoder=False)") in report.skipped
        assert {name: type(m) for name, m in encoder.named_modules()} == classes
    with inject_ltx2.apply_kernels(pipe.transformer, "reference") as report:  # the transformer alone: no encoder
        assert not any(r.startswith("text_encoder") for r, _ in report.skipped) and not any(
            r.startswith("text_encoder: ") for r in report.rules)
