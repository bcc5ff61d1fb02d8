"""Wan's guidance pair as one call of batch 2 (ltxbench.inject.wan.pair) on the CPU, wan-tiny, wan-tiny-a14b and
wan-tiny-i2v (CLIP image features stacked with the pair) in fp32: the guided pipeline gives the unpaired latents, one
call a step where there were two, each expert its own pairs; nothing pairs without guidance, with the transformer
alone, or across changed inputs; revert is exact."""

from __future__ import annotations

import pytest
import torch

from ltxbench.inject.wan import apply_kernels
from ltxbench.inject.wan.pair import PAIR_ATTR, PAIR_RULE, GuidancePair
from ltxbench.models import wan_build

STEPS = 4
GENERATE = dict(prompt="a fox in the snow", negative_prompt="blurry", num_frames=9, height=64, width=64,
                num_inference_steps=STEPS, output_type="latent", return_dict=False)


@pytest.fixture(scope="module", params=["wan-tiny", "wan-tiny-a14b", "wan-tiny-i2v"])
def pipe(request):
    built = wan_build.build_pipeline(request.param, "random", "cpu", "fp32")
    built.set_progress_bar_config(disable=True)
    return built


def _latents(pipe, **overrides):
    """The guided pipeline's latents; I2V: from the first frame, the prompts given as embeddings (diffusers' I2V
    pipeline cleans prompt text with ftfy, which is not a dependency)."""
    from diffusers import WanPipeline
    from PIL import Image

    from ltxbench.models.wan_run import text_side

    generate = dict(GENERATE)
    with torch.no_grad():
        if getattr(pipe, "image_encoder", None) is not None:
            prompt, negative = WanPipeline.encode_prompt(text_side(pipe), generate.pop("prompt"),
                                                         generate.pop("negative_prompt"), device="cpu")
            generate.update(image=Image.new("RGB", (64, 64), "red"), prompt_embeds=prompt,
                            negative_prompt_embeds=negative)
        return pipe(**{**generate, **overrides}, generator=torch.Generator("cpu").manual_seed(3))[0]


def _calls(pipe, **overrides) -> tuple[torch.Tensor, list[int]]:
    modules = [m for m in (pipe.transformer, getattr(pipe, "transformer_2", None)) if m is not None]
    counts = [0] * len(modules)
    handles = [m.register_forward_pre_hook(lambda *_a, i=i: counts.__setitem__(i, counts[i] + 1))
               for i, m in enumerate(modules)]
    try:
        return _latents(pipe, **overrides), counts
    finally:
        for handle in handles:
            handle.remove()


def test_the_guided_pipeline_gives_the_unpaired_latents_in_one_call_a_step(pipe):
    expected, unpaired = _calls(pipe)
    assert sum(unpaired) == 2 * STEPS
    classes = {name: type(m) for name, m in pipe.components.items()}
    with apply_kernels(pipe, "reference", blocks=False, qk_norms=False, gelu=False) as report:
        assert report.rules[PAIR_RULE] == len(unpaired)
        pair = vars(pipe.transformer)[PAIR_ATTR]
        got, paired = _calls(pipe)
        assert [2 * n for n in paired] == unpaired  # each expert its own steps, one call of batch 2 each
        assert pair.pairs == pair.served == STEPS and pair.negative is None and pair.last is None
        # the same ops per sample, but the CPU's GEMMs may round twice the rows differently: after 4 guided steps the
        # latents (unit scale) moved by at most 3e-6; the halves swapped would move them by O(1)
        torch.testing.assert_close(got, expected, rtol=1e-4, atol=2e-5)
        two_experts = getattr(pipe, "transformer_2", None) is not None
        plain, calls = _calls(pipe, guidance_scale=1.0, **({"guidance_scale_2": 1.0} if two_experts else {}))
        assert sum(calls) == STEPS and pair.pairs == STEPS  # no guidance: nothing to pair
    assert {name: type(m) for name, m in pipe.components.items()} == classes
    assert "encode_prompt" not in vars(pipe) and PAIR_ATTR not in vars(pipe.transformer)
    assert torch.equal(_latents(pipe), expected)


def test_turned_off_or_given_the_transformer_alone_nothing_pairs(pipe):
    with apply_kernels(pipe, "reference", pair_guidance=False) as report:
        assert PAIR_RULE not in report.rules and (PAIR_RULE, "turned off (pair_guidance=False)") in report.skipped
    with apply_kernels(pipe.transformer, "reference") as report:  # a pipeline's rule: nothing to say of it
        assert PAIR_RULE not in report.rules and PAIR_RULE not in dict(report.skipped)
        assert PAIR_ATTR not in vars(pipe.transformer)


def _direct(module, hidden, timestep, text, image=None):
    with torch.no_grad():
        return module(hidden_states=hidden, timestep=timestep, encoder_hidden_states=text, return_dict=False,
                      **({} if image is None else {"encoder_hidden_states_image": image}))[0]


def test_the_kept_half_is_served_only_for_the_same_inputs_unchanged(pipe):
    """A second call with other latents, latents written in place, weights changed since the pair, or (I2V) other
    image features or features written in place is computed, not answered from the pair."""
    module = pipe.transformer
    config = module.config
    gen = torch.Generator().manual_seed(0)
    hidden = torch.randn(1, config.in_channels, 3, 8, 8, generator=gen)
    timestep = torch.tensor([500.0])
    prompt, negative = (torch.randn(1, 512, config.text_dim, generator=gen) for _ in range(2))
    image = torch.randn(1, 5, config.image_dim, generator=gen) if config.image_dim else None
    changes = ("none", "other latents", "in place", "weights") + (
        ("other image", "image in place") if image is not None else ())
    with apply_kernels(pipe, "reference", blocks=False, qk_norms=False, gelu=False):
        pair: GuidancePair = vars(module)[PAIR_ATTR]
        pair.generations += 1
        try:
            for change in changes:
                pair.negative, pair.missed = negative, False  # each change against a pair of its own
                conditional = _direct(module, hidden, timestep, prompt, image)
                served = pair.served
                latents, features = hidden, image
                if change == "other latents":
                    latents = hidden.clone()
                elif change == "in place":
                    hidden.mul_(1.0)  # the same values, a new version: the kept half no longer vouched for
                elif change == "weights":
                    with torch.no_grad():
                        module.proj_out.bias.add_(0.0)  # an in-place edit: a new version
                elif change == "other image":
                    features = image.clone()
                elif change == "image in place":
                    image.mul_(1.0)
                unconditional = _direct(module, latents, timestep, negative, features)
                assert pair.served == served + (change == "none"), change
                pair.generations -= 1  # the model itself, unpaired
                try:
                    torch.testing.assert_close(conditional, _direct(module, latents, timestep, prompt, features))
                    torch.testing.assert_close(unconditional, _direct(module, latents, timestep, negative, features))
                finally:
                    pair.generations += 1
        finally:
            pair.generations -= 1


def test_a_step_callback_with_new_negative_embeddings_stops_the_pairs_for_the_generation(pipe):
    """The kept half not taken (the callback's negative embeddings are new tensors): the calls left run as they come,
    one sample each, not as pairs computed for nothing; the latents are the unpatched pipeline's."""
    if getattr(pipe, "image_encoder", None) is not None or getattr(pipe, "transformer_2", None) is not None:
        pytest.skip("one text-to-video expert: every step's calls on the hooked transformer")
    samples: list[int] = []
    handle = pipe.transformer.register_forward_pre_hook(
        lambda _m, _a, kwargs: samples.append(kwargs["hidden_states"].shape[0]), with_kwargs=True)

    def renew(_pipe, _step, _timestep, kwargs):
        return {"negative_prompt_embeds": kwargs["negative_prompt_embeds"] * 1.0}

    callback = dict(callback_on_step_end=renew, callback_on_step_end_tensor_inputs=["negative_prompt_embeds"])
    try:
        expected = _latents(pipe, **callback)
        assert samples == [1] * 2 * STEPS
        samples.clear()
        with apply_kernels(pipe, "reference", blocks=False, qk_norms=False, gelu=False):
            got = _latents(pipe, **callback)
            # step 0 paired and answered; step 1's pair is not taken (the callback's new negative): from then on one
            # sample a call
            assert samples == [2, 2, 1] + [1] * 2 * (STEPS - 2)
        torch.testing.assert_close(got, expected, rtol=1e-4, atol=2e-5)
    finally:
        handle.remove()


def test_a_cache_hook_on_the_blocks_keeps_the_calls_apart(pipe):
    """diffusers' First Block Cache decides per call, in a context per guidance branch, from hooks on the blocks: a
    pair would give its conditional context one call of batch 2 and its unconditional one none (another video).
    With it on, nothing pairs and the latents are the unpatched pipeline's."""
    from diffusers.hooks import FirstBlockCacheConfig

    experts = [m for m in (pipe.transformer, getattr(pipe, "transformer_2", None)) if m is not None]
    for expert in experts:
        expert.enable_cache(FirstBlockCacheConfig(threshold=0.5))
    try:
        expected = _latents(pipe)
        with apply_kernels(pipe, "reference", blocks=False, qk_norms=False, gelu=False):
            got = _latents(pipe)
            assert vars(pipe.transformer)[PAIR_ATTR].pairs == 0
        assert torch.equal(got, expected)
    finally:
        for expert in experts:
            expert.disable_cache()


@pytest.mark.parametrize(("name", "refused"), [("fbc_block_hook", True), ("mag_cache_block_hook", True),
                                               ("layerwise_casting", False), ("group_offloading", False),
                                               ("cp_input---blocks.0", False)])
def test_hooks_blind_to_the_batch_leave_the_pair_on(name, refused):
    from diffusers.hooks import HookRegistry, ModelHook

    from ltxbench.inject import decides_per_call

    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Sequential(torch.nn.Linear(2, 2)))
    assert not decides_per_call(model)
    HookRegistry.check_if_exists_or_initialize(model[1][0]).register_hook(ModelHook(), name)
    assert decides_per_call(model) is refused
