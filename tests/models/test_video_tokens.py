"""The video tokens a family's parallel split plans for (VideoFamily.tokens) come from the pipeline's own VAE and
patch sizes: equal to the sequence the transformer is given, for both LTX families; Wan's attribute names too."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from ltxbench.models import family_of
from ltxbench.models.video_phases import video_tokens


def _sequence_length(pipe, **call) -> int:
    seen = []
    hook = pipe.transformer.register_forward_pre_hook(
        lambda _m, _a, kwargs: seen.append(kwargs["hidden_states"].shape[1]), with_kwargs=True)
    try:
        with torch.no_grad():
            pipe(prompt="a fox", num_inference_steps=2, output_type="latent", return_dict=False,
                 generator=torch.Generator().manual_seed(0), **call)
    finally:
        hook.remove()
    return seen[0]


@pytest.mark.parametrize(("model", "frames", "height", "width"), [
    ("ltx-tiny", 17, 64, 96), ("ltx-tiny", 9, 96, 64), ("ltx2-tiny", 9, 64, 64), ("ltx2-tiny", 17, 128, 64)])
def test_tokens_are_the_sequence_the_transformer_gets(model, frames, height, width):
    family = family_of(model)
    settings = family.settings("bench e2e", model=model, weights="random", device="cpu", dtype="fp32",
                               num_frames=frames, height=height, width=width)
    pipe = family.build(settings)
    pipe.set_progress_bar_config(disable=True)
    expected = _sequence_length(pipe, num_frames=frames, height=height, width=width)
    assert family.tokens(pipe, settings) == expected


def test_wan_style_pipelines_give_their_factors_and_a_3d_patch():
    wan = SimpleNamespace(vae_scale_factor_temporal=4, vae_scale_factor_spatial=8,
                          transformer=SimpleNamespace(config=SimpleNamespace(patch_size=(1, 2, 2))))
    assert video_tokens(wan, 81, 480, 832) == 21 * 30 * 52  # Wan 2.1 at 81 frames 480x832


@pytest.mark.parametrize("model", ["ltx-tiny", "ltx2-tiny"])
def test_a_pipeline_with_other_factors_gets_other_tokens(model):
    """Not LTX's 8x32x32 hard-coded: a VAE compressing 4x16 under a 2x2 patch."""
    family = family_of(model)
    settings = family.settings("bench e2e", model=model, weights="random", device="cpu", num_frames=33, height=256,
                               width=512)
    pipe = SimpleNamespace(vae_temporal_compression_ratio=4, vae_spatial_compression_ratio=16,
                           transformer_temporal_patch_size=1, transformer_spatial_patch_size=2)
    assert family.tokens(pipe, settings) == 9 * 8 * 16
