"""LTX-2's STG pass answered from the guidance pair (ltxbench.inject.ltx2.stg) on the CPU, ltx2-tiny in fp32: served
once per step with the pipeline's default guidance and the latents those of the model; never where a block has
perturbed attention, outside a generation, or without a pair; a memo that answers with the wrong half, or with a
stale pair unchecked, fails the parity check."""

from __future__ import annotations

import pytest
import torch

from ltxbench.inject import ltx2 as inject_ltx2
from ltxbench.inject.ltx2 import stg
from tests.helpers import max_abs_error

GENERATE = dict(prompt="a fox in the snow", negative_prompt="blurry", num_frames=9, height=64, width=64,
                num_inference_steps=3, output_type="latent", return_dict=False)
ATOL = 1e-5


@pytest.fixture
def pipe(ltx2_tiny):
    return ltx2_tiny


def _generate(pipe, **overrides):
    with torch.no_grad():
        return pipe(**{**GENERATE, **overrides}, generator=torch.Generator("cpu").manual_seed(3))


def _memo(pipe) -> stg.PairMemo:
    return vars(pipe.transformer)[inject_ltx2.MEMO_ATTR]


def _stg_only(pipe, **kwargs):
    """Only the STG rule (the fused blocks' rounding left out, so that the memo alone is measured)."""
    return inject_ltx2.apply_kernels(pipe, "reference", fused_blocks=False, text_kv_cache=False, **kwargs)


def test_served_once_per_step_with_the_models_latents(pipe):
    expected = _generate(pipe)
    with _stg_only(pipe) as report:
        assert report.rules[inject_ltx2.STG_RULE] == 1
        got = _generate(pipe)
        memo = _memo(pipe)
        assert memo.served == GENERATE["num_inference_steps"] == memo.pairs and memo.last is None
    assert max_abs_error(got, expected) < ATOL


def test_not_served_where_a_block_perturbs_or_without_a_pair(pipe):
    with _stg_only(pipe):
        pipe.transformer.transformer_blocks[1].perturbed_attn = True  # LTX-2.3: STG changes that block
        try:
            _generate(pipe)
        finally:
            pipe.transformer.transformer_blocks[1].perturbed_attn = False
        assert _memo(pipe).served == 0 and _memo(pipe).pairs == GENERATE["num_inference_steps"]
        _generate(pipe, guidance_scale=1.0, audio_guidance_scale=1.0)  # no guidance pair
        assert _memo(pipe).served == 0 and _memo(pipe).pairs == GENERATE["num_inference_steps"]


def test_not_served_under_a_cache_hook_that_must_see_the_stg_pass(pipe):
    """A diffusers cache (First Block Cache's hooks on the blocks) keeps per-branch state from every call: the STG
    pass runs for it. A hook blind to the calls (layerwise casting) leaves the memo serving."""
    from diffusers.hooks import HookRegistry, ModelHook

    block = pipe.transformer.transformer_blocks[0]
    with _stg_only(pipe):
        for name, served in (("fbc_block_hook", 0), ("layerwise_casting", GENERATE["num_inference_steps"])):
            registry = HookRegistry.check_if_exists_or_initialize(block)
            registry.register_hook(ModelHook(), name)
            try:
                _generate(pipe)
            finally:
                registry.remove_hook(name)
            assert _memo(pipe).served == served


def test_the_bare_transformer_serves_only_inside_a_generation(pipe):
    with _stg_only(pipe.transformer) as report:
        assert inject_ltx2.GENERATION_RULE in dict(report.skipped)
        _generate(pipe)
        assert _memo(pipe).served == 0
        with inject_ltx2.generation(pipe.transformer):
            _generate(pipe)
        assert _memo(pipe).served == GENERATE["num_inference_steps"]


def test_a_weight_changed_between_the_pair_and_the_stg_pass_is_seen(pipe):
    """A parameter written in place between the two calls (its version moves): the STG pass runs."""
    transformer = pipe.transformer
    original = stg.PairMemo.remember

    def remember_then_write(self, module, kwargs, output):
        original(self, module, kwargs, output)
        with torch.no_grad():
            module.proj_out.bias.add_(0.0)

    with _stg_only(pipe):
        stg.PairMemo.remember = remember_then_write
        try:
            _generate(pipe)
        finally:
            stg.PairMemo.remember = original
        assert _memo(pipe).served == 0 and transformer is pipe.transformer


@pytest.mark.parametrize("written", ["input", "output"])
def test_a_pair_tensor_written_in_place_before_the_stg_pass_is_seen(pipe, monkeypatch, written):
    original = stg.PairMemo.remember

    def remember_then_write(self, module, kwargs, output):
        original(self, module, kwargs, output)
        (kwargs["hidden_states"] if written == "input" else output[0]).add_(0.0)  # a version bump, as any write

    monkeypatch.setattr(stg.PairMemo, "remember", remember_then_write)
    with _stg_only(pipe):
        _generate(pipe)
        assert _memo(pipe).served == 0 and _memo(pipe).pairs == GENERATE["num_inference_steps"]


@pytest.mark.parametrize("mutation", ["negative half", "stale pair, unchecked"])
def test_a_wrong_memo_fails_the_parity_check(pipe, monkeypatch, mutation):
    expected = _generate(pipe)
    if mutation == "negative half":
        monkeypatch.setattr(stg, "_half_output", lambda out: tuple(o.chunk(2)[0] for o in out))
    else:
        first = {}

        def remember(self, module, kwargs, output):  # keeps the first step's pair for the whole generation
            first.setdefault("last", (kwargs, output, stg.parameter_versions(module), []))
            self.last = first["last"]

        def answer(self, module, kwargs):  # serves it without comparing the inputs
            if not kwargs.get("spatio_temporal_guidance_blocks") or self.last is None:
                return None
            return stg._half_output(self.last[1])

        monkeypatch.setattr(stg.PairMemo, "remember", remember)
        monkeypatch.setattr(stg.PairMemo, "answer", answer)
    with _stg_only(pipe):
        got = _generate(pipe)
    assert max_abs_error(got, expected) > 10 * ATOL, mutation


def test_image_to_video_serves_its_stg_pass_too(pipe, tmp_path):
    """LTX2ImageToVideoPipeline: per-token video timesteps, the same three calls per step."""
    import numpy as np
    from PIL import Image

    from ltxbench.models.video_image import to_image_to_video

    image = Image.fromarray((np.random.default_rng(0).random((64, 64, 3)) * 255).astype(np.uint8))
    i2v = to_image_to_video(pipe, "LTX2ImageToVideoPipeline")
    i2v.set_progress_bar_config(disable=True)
    expected = _generate(i2v, image=image, image_crf=0)  # no H.264 re-compression (PyAV is not a dependency)
    with _stg_only(i2v):
        got = _generate(i2v, image=image, image_crf=0)
        assert _memo(i2v).served == GENERATE["num_inference_steps"]
    assert max_abs_error(got, expected) < ATOL


def test_the_memo_names_the_calls_it_answered_in_the_generation(pipe):
    """bench e2e leaves the answered calls' FLOPs out of the rates: the memo names them by their index among the
    generation's transformer calls (pair, STG, modality each step: the STG pass is 1, 4, 7), read after it ends."""
    with _stg_only(pipe) as report:
        _generate(pipe)
        assert report.outcomes() == {inject_ltx2.CALLS_ANSWERED: [1, 4, 7]}
        _generate(pipe, guidance_scale=1.0, audio_guidance_scale=1.0)  # no pair: the last generation answered none
        assert report.outcomes() == {inject_ltx2.CALLS_ANSWERED: []}
