"""The stg-off configuration of LTX-2 (ltxbench.models.ltx2_run.stg_pass_off): on LTX-2.0 blocks the pipeline without
its STG pass gives the same video as with it, one transformer call fewer per step; refused where the pass does
change the video (a block with perturbed attention); timed through bench e2e as a configuration of its own."""

from __future__ import annotations

import json

import pytest
import torch
from typer.testing import CliRunner

from ltxbench.cli import app
from ltxbench.errors import UsageError
from ltxbench.models import family_of, ltx2, ltx2_run
from tests.helpers import max_abs_error

GENERATE = dict(prompt="a fox in the snow", negative_prompt="blurry", num_frames=9, height=64, width=64,
                num_inference_steps=3, output_type="latent", return_dict=False)
STG_OFF = dict(stg_scale=0.0, audio_stg_scale=0.0)


def _generate(pipe, calls: list | None = None, **overrides):
    def count(_module, _args, kwargs):
        calls.append(bool(kwargs.get("spatio_temporal_guidance_blocks")))

    hook = pipe.transformer.register_forward_pre_hook(count, with_kwargs=True) if calls is not None else None
    try:
        with torch.no_grad():
            return pipe(**{**GENERATE, **overrides}, generator=torch.Generator("cpu").manual_seed(3))
    finally:
        if hook is not None:
            hook.remove()


def test_the_same_video_without_the_stg_pass_one_call_fewer_a_step(ltx2_tiny):
    default_calls, off_calls = [], []
    default = _generate(ltx2_tiny, default_calls)
    off = _generate(ltx2_tiny, off_calls, **STG_OFF)
    steps = GENERATE["num_inference_steps"]
    assert default_calls.count(True) == steps and len(default_calls) == 3 * steps
    assert off_calls.count(True) == 0 and len(off_calls) == 2 * steps
    # the STG term is the positive half minus the STG pass's recomputation of it: the rounding of a batch of 1
    # against 2 here (fp32 on the CPU); bit-identical in bf16 on the GPU, which bench e2e checks and records
    assert max_abs_error(off, default) < 1e-5


def test_where_the_stg_pass_differs_the_check_sees_it(ltx2_tiny):
    """The comparison above can fail: an STG pass whose output moves by 1e-3 gives another video."""
    def perturb(_module, _args, kwargs, output):
        if kwargs.get("spatio_temporal_guidance_blocks"):
            return tuple(o + 1e-3 for o in output) if isinstance(output, tuple) else output
        return output

    off = _generate(ltx2_tiny, **STG_OFF)
    hook = ltx2_tiny.transformer.register_forward_hook(perturb, with_kwargs=True)
    try:
        perturbed = _generate(ltx2_tiny)
    finally:
        hook.remove()
    assert max_abs_error(off, perturbed) > 1e-4


def test_settings_drop_both_stg_scales_for_the_stg_off_configurations_only():
    family = family_of("ltx2-tiny")
    settings = family.settings("bench e2e", model="ltx2-tiny", weights="random", stg_scale=2.0)
    for config in ("stg-off", "stg-off+compile"):
        off = family.settings_for(settings, config)
        assert (off.stg_scale, off.audio_stg_scale, off.guidance_scale) == (0.0, 0.0, settings.guidance_scale)
    for config in ("baseline", "compile", "optimized+compile"):
        assert family.settings_for(settings, config) is settings
    assert {"stg-off", "stg-off+compile"} <= set(family.config_names())


def test_refused_where_a_block_perturbs_attention(ltx2_tiny):
    block = ltx2_tiny.transformer.transformer_blocks[1]
    block.perturbed_attn = True  # LTX-2.3's blocks: the STG pass changes the video
    try:
        with pytest.raises(UsageError, match="block 1 has perturbed attention"):
            ltx2_run.stg_pass_off(ltx2_tiny)
    finally:
        del block.perturbed_attn
    assert ltx2_run.stg_pass_off(ltx2_tiny).as_dict()["rules"] == {ltx2.STG_OFF_RULE: 1}


def test_bench_e2e_times_the_stg_off_configuration_without_the_pass(tmp_path, captured, compile_calls, monkeypatch):
    """Through the command: the stg-off configurations' generations never call the STG pass, compile's do."""
    from ltxbench.models.video import VideoFamily

    seen: dict[str, list] = {}
    iteration = ltx2.LTX2Family.iteration

    def recording(self, pipe, settings, embeds=None, phase=None, on_step=None):
        seen.setdefault((settings.stg_scale, settings.audio_stg_scale), []).append(1)
        return iteration(self, pipe, settings, embeds, phase, on_step)

    monkeypatch.setattr(ltx2.LTX2Family, "iteration", recording)
    assert issubclass(ltx2.LTX2Family, VideoFamily)
    out = tmp_path / "e2e.json"
    result = CliRunner().invoke(app, ["bench", "e2e", "--model", "ltx2-tiny", "--device", "cpu", "--num-frames", "9",
                                      "--height", "64", "--width", "64", "--steps", "2", "--warmup-iterations", "1",
                                      "--repeats", "1", "--phase", "transformer",
                                      "--configs", "compile,stg-off+compile", "--output", str(out)])
    assert result.exit_code == 0, result.output
    doc = json.loads(out.read_text())
    assert {r["provider"] for r in doc["records"]} == {"compile", "stg-off+compile"}
    assert doc["run"]["config"]["injection"]["stg-off+compile"]["rules"] == {ltx2.STG_OFF_RULE: 1}
    # the untimed first (and, for stg-off's own work, its FLOPs counted once more untimed); warmup + repeat each
    assert seen == {(1.0, 1.0): [1, 1, 1], (0.0, 0.0): [1, 1, 1]}
    steps = {r["provider"]: r["derived"] for r in doc["records"] if r["name"] == "denoise_step"}
    # its own work: the guidance pair and the modality pass, a batch-1 call fewer a step than compile's
    assert 0.6 < steps["stg-off+compile"]["model_tflop"] / steps["compile"]["model_tflop"] < 0.9
    check = doc["run"]["config"]["injection"]["stg-off+compile"]["same_video"]
    assert check["steps"] == 2 and 0 <= check["max_abs_diff"] < 1e-4
    assert set(check) == {"max_abs_diff", "bit_identical", "steps", "video", "audio"}
    assert all(0 <= check[s]["rel_l2"] < 1e-5 and check[s]["max_abs_diff"] <= check["max_abs_diff"]
               for s in ("video", "audio"))
