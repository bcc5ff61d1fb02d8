"""`ltxbench generate` and ltxbench.models.ltx on the CPU: validation, offline errors, configs, a tiny e2e run."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from ltxbench.cli import app
from ltxbench.errors import UsageError
from ltxbench.models import ltx

REPO = Path(__file__).resolve().parents[1]
runner = CliRunner()
TINY = ["--model", "ltx-tiny", "--weights", "random", "--device", "cpu", "--num-frames", "9", "--height", "64",
        "--width", "64", "--steps", "2"]


def _env(**extra) -> dict:
    path = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    return {**os.environ, "PYTHONPATH": path, **extra}


# --- validation (exit 2, before anything heavy) -------------------------------------------------------

@pytest.mark.parametrize(
    ("flag", "value"),
    [("--num-frames", "50"), ("--num-frames", "0"), ("--height", "500"), ("--width", "100"), ("--steps", "0")],
)
def test_bad_video_args_exit_2_naming_the_value(flag, value, tmp_path):
    out = tmp_path / "v.mp4"
    result = runner.invoke(app, ["generate", "--prompt", "x", *TINY, flag, value, "--output", str(out)])
    assert result.exit_code == 2, result.output
    assert f"{flag} {value}" in result.output
    assert not out.exists() and not out.with_suffix(".json").exists()


def test_validate_video_args_accepts_valid_and_names_bad():
    for frames, h, w, s in ((9, 64, 64, 2), (161, 512, 768, 50), (1, 32, 32, 2)):
        ltx.validate_video_args(frames, h, w, s)
    with pytest.raises(UsageError, match="--steps 1 must be at least 2"):
        ltx.validate_video_args(9, 64, 64, 1)
    with pytest.raises(UsageError, match="--num-frames 162"):
        ltx.validate_video_args(162, 512, 768, 50)
    with pytest.raises(UsageError, match="--width 0"):
        ltx.validate_video_args(9, 64, 0, 2)


def test_validation_happens_before_torch_is_imported():
    code = ("import sys; from typer.testing import CliRunner; from ltxbench.cli import app; "
            "r = CliRunner().invoke(app, ['generate', '--prompt', 'x', '--num-frames', '50']); "
            "print(r.exit_code, 'torch' in sys.modules, 'diffusers' in sys.modules)")
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=_env(), capture_output=True, text=True,
                          timeout=60)
    assert proc.stdout.split() == ["2", "False", "False"], proc.stdout + proc.stderr


def test_bad_choices_exit_2(tmp_path):
    out = str(tmp_path / "v.mp4")
    for args, needle in ((["--weights", "bogus"], "--weights 'bogus'"), (["--dtype", "int8"], "--dtype 'int8'"),
                         (["--kernel-provider", "cuda"], "--kernel-provider cuda needs --device cuda"),
                         (["--output", str(tmp_path / "v.avi")], "must end in .mp4")):
        result = runner.invoke(app, ["generate", "--prompt", "x", *TINY, "--output", out, *args])
        assert result.exit_code == 2, result.output
        assert needle in result.output


# --- environment problems (exit 4) ------------------------------------------------------------------

@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="checks the no-GPU path")
def test_device_cuda_without_gpu_exits_4(tmp_path):
    result = runner.invoke(app, ["generate", "--prompt", "x", "--output", str(tmp_path / "v.mp4")])
    assert result.exit_code == 4, result.output
    assert "no CUDA device" in result.output


def test_pretrained_missing_local_path_exits_4_with_hint(tmp_path):
    missing = tmp_path / "no" / "such" / "pipeline"
    result = runner.invoke(app, ["generate", "--prompt", "x", "--model", str(missing), "--device", "cpu",
                                 "--output", str(tmp_path / "v.mp4")])
    assert result.exit_code == 4, result.output
    assert "not available offline" in result.output and "--weights random" in result.output
    assert not (tmp_path / "v.mp4").exists()


def test_pretrained_uncached_hub_id_offline_exits_4_with_hint(tmp_path):
    # A fresh process: huggingface_hub reads HF_HUB_OFFLINE once, at import; an empty HF_HOME guarantees no cache.
    env = _env(HF_HUB_OFFLINE="1", HF_HOME=str(tmp_path / "hf"), HF_HUB_CACHE=str(tmp_path / "hf" / "hub"))
    proc = subprocess.run(
        [sys.executable, "-m", "ltxbench", "generate", "--prompt", "x", "--device", "cpu", "--num-frames", "9",
         "--height", "64", "--width", "64", "--steps", "2", "--output", str(tmp_path / "v.mp4")],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 4, proc.stdout + proc.stderr
    assert "'Lightricks/LTX-Video' are not available offline" in proc.stderr
    assert "--weights random" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_tiny_has_no_pretrained_weights(tmp_path):
    result = runner.invoke(app, ["generate", "--prompt", "x", *TINY, "--weights", "pretrained",
                                 "--output", str(tmp_path / "v.mp4")])
    assert result.exit_code == 2, result.output
    assert "ltx-tiny has no pretrained weights" in result.output


# --- configs ------------------------------------------------------------------------------------------

def _params(module) -> int:
    return sum(p.numel() for p in module.parameters())


@pytest.fixture(scope="module")
def meta_2b():
    import torch

    return ltx.build_components(ltx.component_configs("ltx-2b"), "meta", torch.bfloat16)


def test_2b_config_is_the_2b_checkpoint(meta_2b):
    transformer, t5 = meta_2b["transformer"], meta_2b["text_encoder"]
    assert abs(_params(transformer) - 1.92e9) / 1.92e9 < 0.02, _params(transformer)
    assert len(transformer.transformer_blocks) == 28
    assert transformer.config.num_attention_heads * transformer.config.attention_head_dim == 2048
    assert t5.config.d_model == 4096 and t5.config.num_layers == 24 and t5.config.num_heads == 64
    assert abs(_params(t5) - 4.76e9) / 4.76e9 < 0.02, _params(t5)  # the T5-v1.1-XXL encoder
    assert meta_2b["vae"].spatial_compression_ratio == 32 and meta_2b["vae"].temporal_compression_ratio == 8
    assert meta_2b["scheduler"].config.use_dynamic_shifting
    assert all(not m.training for m in (transformer, t5, meta_2b["vae"]))
    assert transformer.dtype == __import__("torch").bfloat16


def test_13b_config_has_48_blocks_and_t5_width():
    import torch

    configs = ltx.component_configs("ltx-13b")
    assert configs["text_encoder"] == ltx.component_configs("ltx-2b")["text_encoder"]
    with torch.device("meta"):
        from diffusers import LTXVideoTransformer3DModel

        transformer = LTXVideoTransformer3DModel.from_config(configs["transformer"])
    assert len(transformer.transformer_blocks) == 48
    assert transformer.config.num_attention_heads * transformer.config.attention_head_dim == 4096
    assert transformer.config.cross_attention_dim == 4096
    assert 12e9 < _params(transformer) < 14.5e9, _params(transformer)


@pytest.mark.parametrize("preset", ["ltx-2b", "ltx-13b", "ltx-tiny"])
def test_component_configs_fit_together(preset):
    c = ltx.component_configs(preset)
    assert set(c) == set(ltx.COMPONENTS)
    assert c["transformer"]["caption_channels"] == c["text_encoder"]["d_model"]
    assert c["transformer"]["in_channels"] == c["vae"]["latent_channels"]
    assert c["text_encoder"]["vocab_size"] >= 384  # ids of the byte-level tokenizer used with random weights


def test_default_hub_id_random_means_2b_configs():
    assert ltx.component_configs(ltx.DEFAULT_HUB_ID) == ltx.component_configs("ltx-2b")


# --- the pipeline and the injection hook -------------------------------------------------------------

@pytest.fixture(scope="module")
def tiny_pipe():
    return ltx.build_pipeline("ltx-tiny", "random", "cpu", "fp32")


def test_prompt_goes_through_the_text_encoder(tiny_pipe):
    import torch

    a = tiny_pipe.encode_prompt("a red fox", None, False, device="cpu")
    b = tiny_pipe.encode_prompt("a blue whale", None, False, device="cpu")
    assert a[0].shape == (1, ltx.TOKENIZER_MAX_LENGTH, 64)
    assert int(a[1].sum()) == len("a red fox") + 1  # bytes + </s>
    assert torch.isfinite(a[0]).all() and not torch.allclose(a[0], b[0])


def test_random_weights_are_seeded():
    import torch

    configs = ltx.component_configs("ltx-tiny")
    one = ltx.build_components(configs, "cpu", torch.float32, seed=3)["transformer"].proj_in.weight
    two = ltx.build_components(configs, "cpu", torch.float32, seed=3)["transformer"].proj_in.weight
    other = ltx.build_components(configs, "cpu", torch.float32, seed=4)["transformer"].proj_in.weight
    assert torch.equal(one, two) and not torch.equal(one, other)


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_run_generate_frames_and_timings(tiny_pipe, dtype):
    pipe = tiny_pipe if dtype == "fp32" else ltx.build_pipeline("ltx-tiny", "random", "cpu", dtype)
    frames, t = ltx.run_generate(pipe, "a red fox", "blurry", 9, 64, 96, 3, 3.0, seed=1, progress=False)
    video = np.stack(frames)
    assert video.shape == (9, 64, 96, 3)
    assert np.isfinite(video).all() and video.std() > 0.01  # finite, not a constant image
    assert len(t["step_ms"]) == 3 and all(ms > 0 for ms in t["step_ms"])
    assert t["text_encode_ms"] > 0 and t["vae_decode_ms"] > 0 and t["peak_memory_bytes"] is None
    assert t["text_encode_ms"] + sum(t["step_ms"]) + t["vae_decode_ms"] <= t["total_ms"] * 1.001
    again, _ = ltx.run_generate(pipe, "a red fox", "blurry", 9, 64, 96, 3, 3.0, seed=1, progress=False)
    assert np.array_equal(video, np.stack(again))


def test_inject_hook_applies_the_kernels_and_reports(tiny_pipe):
    report = ltx.inject_kernels(tiny_pipe, "reference")
    try:
        assert report["applied"] is True and report["provider"] == "reference"
        assert report["rules"]["attn1: qk_rms_norm_rope"] == 2 and report["skipped"]
    finally:  # the fixture is shared: undo what the hook applied
        from ltxbench.inject import original_class

        for module in tiny_pipe.transformer.modules():
            module.__class__ = original_class(module)
        for block in tiny_pipe.transformer.transformer_blocks:
            for attn in (block.attn1, block.attn2):
                attn.processor = type(attn)._default_processor_cls()


# --- end to end -------------------------------------------------------------------------------------

def test_generate_end_to_end_tiny(tmp_path):
    import imageio

    from ltxbench.results.io import load_result

    out = tmp_path / "tmp" / "x.mp4"
    args = ["generate", "--prompt", "a red fox in the snow", *TINY, "--output", str(out)]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "text encode" in result.output and "vae decode" in result.output

    reader = imageio.get_reader(str(out), "ffmpeg")
    frames = [np.asarray(f) for f in reader]
    reader.close()
    assert len(frames) == 9 and all(f.shape == (64, 64, 3) for f in frames)
    assert np.stack(frames).std() > 1  # uint8 frames, not a constant video

    doc = load_result(out.with_suffix(".json"))
    assert doc["kind"] == "generate" and doc["run"]["seed"] == 42
    config = doc["run"]["config"]
    assert config["prompt"] == "a red fox in the snow" and config["num_frames"] == 9 and config["model"] == "ltx-tiny"
    records = {r["name"]: r for r in doc["records"]}
    assert set(records) == {"text_encode", "denoise_step", "vae_decode", "total"}  # no peak memory on CPU
    for rec in records.values():
        assert rec["metric"] == "time" and rec["unit"] == "ms" and rec["better"] == "lower"
        assert rec["stats"]["min"] > 0
    assert records["denoise_step"]["stats"]["n"] == 2
    assert records["total"]["stats"]["median"] >= records["denoise_step"]["derived"]["denoise_total_ms"]
    injection = doc["injection"]
    assert injection["applied"] is True and injection["provider"] == "reference"  # the CPU default
    assert injection["rules"]["block: rms_norm_modulate, gated_residual x2, add_rms_norm_modulate"] == 2
    assert doc["run"]["argv"][:2] == ["ltxbench", "generate"] and "--weights" in doc["run"]["argv"]
    assert config["gemm_search"] is False and "--gemm-search" not in doc["run"]["argv"]  # off unless asked

    # The same path again: refused without --force (exit 2), nothing touched; accepted with it.
    before = out.stat().st_mtime_ns
    again = runner.invoke(app, args)
    assert again.exit_code == 2, again.output
    assert "already exists" in again.output and out.stat().st_mtime_ns == before
    forced = runner.invoke(app, [*args, "--force", "--no-optimized-kernels", "--gemm-search"])
    assert forced.exit_code == 0, forced.output
    assert "--gemm-search" in load_result(out.with_suffix(".json"))["run"]["argv"]
    assert load_result(out.with_suffix(".json"))["injection"] == {
        "applied": False, "reason": "disabled by --no-optimized-kernels"}
