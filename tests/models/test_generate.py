"""`ltxbench generate` and the LTX-Video family (ltxbench.models.ltx, ltx_build) on the CPU: validation, offline
errors, configs, a tiny e2e run."""

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
from ltxbench.models import ltx, ltx_build
from tests.helpers import LTX_TINY as TINY

REPO = Path(__file__).resolve().parents[2]
runner = CliRunner()


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
        ltx_build.validate_video_args(frames, h, w, s)
    with pytest.raises(UsageError, match="--steps 1 must be at least 2"):
        ltx_build.validate_video_args(9, 64, 64, 1)
    with pytest.raises(UsageError, match="--num-frames 162"):
        ltx_build.validate_video_args(162, 512, 768, 50)
    with pytest.raises(UsageError, match="--width 0"):
        ltx_build.validate_video_args(9, 64, 0, 2)


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


@pytest.mark.parametrize("weights", ["random", "pretrained"])
def test_a_missing_model_directory_is_a_bad_argument_before_any_work(weights, tmp_path):
    """Exit 2 naming --model, whatever the weights; the hint does not suggest the --weights just given."""
    missing = tmp_path / "no" / "such" / "pipeline"
    result = runner.invoke(app, ["generate", "--prompt", "x", "--model", str(missing), "--weights", weights,
                                 "--device", "cpu", "--output", str(tmp_path / "v.mp4")])
    assert result.exit_code == 2, result.output
    assert f"--model {missing}: no such directory" in result.output
    assert "--weights" not in result.output and "offline" not in result.output
    assert not (tmp_path / "v.mp4").exists()


@pytest.mark.parametrize("model", ["Lightricks/LTX-Video", "Lightricks/LTX-Video-0.9.5"])
def test_pretrained_uncached_hub_id_offline_exits_4_in_one_line_of_our_words(model, tmp_path):
    # A fresh process: huggingface_hub reads HF_HUB_OFFLINE once, at import; an empty HF_HOME guarantees no cache.
    # bf16: the 2B pipeline's weights (13 GiB) pass the memory check that comes first on a CPU host.
    env = _env(HF_HUB_OFFLINE="1", HF_HOME=str(tmp_path / "hf"), HF_HUB_CACHE=str(tmp_path / "hf" / "hub"))
    proc = subprocess.run(
        [sys.executable, "-m", "ltxbench", "generate", "--prompt", "x", "--model", model, "--device", "cpu",
         "--dtype", "bf16", "--num-frames", "9", "--height", "64", "--width", "64", "--steps", "2",
         "--output", str(tmp_path / "v.mp4")],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=180)
    if proc.returncode == 4 and "for its weights alone" in proc.stderr:
        pytest.skip("this host has less than 13 GiB of RAM free")
    assert proc.returncode == 4, proc.stdout + proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 2 and lines[0].startswith("error: ") and lines[1].startswith("hint: "), lines
    assert f"weights for '{model}' are not in the Hugging Face cache ({tmp_path / 'hf' / 'hub'})" in lines[0]
    assert lines[0].endswith("and HF_HUB_OFFLINE=1 forbids downloading them")
    assert f"hf download {model}" in lines[1] and "--weights random" in lines[1]


def test_hub_failures_are_told_apart():
    from ltxbench.models import hub

    class GatedRepoError(OSError):
        pass

    class RepositoryNotFoundError(OSError):
        pass

    assert "gated" in hub.hub_reason(GatedRepoError("401 Client Error"))
    wrapped = OSError("Cannot load model x/y: the model is not fully cached locally (Cannot find an appropriate ca")
    wrapped.__cause__ = RepositoryNotFoundError("404 Client Error")
    assert hub.hub_reason(wrapped) == "the hub has no public repository of that name"


@pytest.mark.parametrize("module", ["ltx_build", "ltx2_build"])
def test_random_weights_of_an_uncached_hub_id_are_not_told_to_use_random_weights(module, monkeypatch):
    """--weights random of a hub id reads only its config files: when they are not there, the hint cannot be the
    --weights random just given."""
    import importlib

    import huggingface_hub

    from ltxbench.errors import EnvironmentProblem

    def not_cached(*args, **kwargs):
        raise OSError("Cannot find the requested files in the disk cache")

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", not_cached)
    with pytest.raises(EnvironmentProblem) as err:
        importlib.import_module(f"ltxbench.models.{module}").component_configs("owner/not-cached")
    assert err.value.message.startswith("the config files of 'owner/not-cached' are not in the Hugging Face cache")
    assert "hf download owner/not-cached" in err.value.hint and "use --weights random" not in err.value.hint


def test_tiny_has_no_pretrained_weights(tmp_path):
    result = runner.invoke(app, ["generate", "--prompt", "x", *TINY, "--weights", "pretrained",
                                 "--output", str(tmp_path / "v.mp4")])
    assert result.exit_code == 2, result.output
    assert "ltx-tiny has no pretrained weights" in result.output and "--weights random" in result.output


@pytest.mark.parametrize("model,weights", [("ltx-tiny", "random"), ("llama-tiny", "random"),
                                           ("ltx-2b", "pretrained"), ("Lightricks/LTX-Video", "pretrained")])
def test_weights_default_to_random_for_the_presets_that_have_only_those(model, weights):
    from ltxbench.cli._validate import model_and_weights

    assert model_and_weights(model, None) == weights
    assert model_and_weights(model, "random") == "random"


@pytest.mark.parametrize("flag", ["--prompt", "--negative-prompt"])
def test_an_empty_prompt_is_a_usage_error(flag, tmp_path):
    args = ["generate", "--prompt", "x", *TINY, "--output", str(tmp_path / "v.mp4"), flag, " "]
    result = runner.invoke(app, args)
    assert result.exit_code == 2, result.output
    assert f"{flag} is empty" in result.output and not (tmp_path / "v.mp4").exists()


def test_steps_help_says_what_the_check_enforces():
    result = runner.invoke(app, ["generate", "--help"], env={"COLUMNS": "400"})
    assert "Denoising steps (at least 2)." in result.output and ">= 1" not in result.output
    with pytest.raises(UsageError, match="--steps 1 must be at least 2"):
        ltx_build.validate_video_args(9, 64, 64, 1)


# --- configs ------------------------------------------------------------------------------------------

def _params(module) -> int:
    return sum(p.numel() for p in module.parameters())


@pytest.fixture(scope="module")
def meta_2b():
    import torch

    return ltx_build.build_components(ltx_build.component_configs("ltx-2b"), "meta", torch.bfloat16)


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

    configs = ltx_build.component_configs("ltx-13b")
    assert configs["text_encoder"] == ltx_build.component_configs("ltx-2b")["text_encoder"]
    with torch.device("meta"):
        from diffusers import LTXVideoTransformer3DModel

        transformer = LTXVideoTransformer3DModel.from_config(configs["transformer"])
    assert len(transformer.transformer_blocks) == 48
    assert transformer.config.num_attention_heads * transformer.config.attention_head_dim == 4096
    assert transformer.config.cross_attention_dim == 4096
    assert 12e9 < _params(transformer) < 14.5e9, _params(transformer)


@pytest.mark.parametrize("preset", ["ltx-2b", "ltx-13b", "ltx-tiny"])
def test_component_configs_fit_together(preset):
    c = ltx_build.component_configs(preset)
    assert set(c) == set(ltx_build.COMPONENTS)
    assert c["transformer"]["caption_channels"] == c["text_encoder"]["d_model"]
    assert c["transformer"]["in_channels"] == c["vae"]["latent_channels"]
    assert c["text_encoder"]["vocab_size"] >= 384  # ids of the byte-level tokenizer used with random weights


def test_default_hub_id_random_means_2b_configs():
    assert ltx_build.component_configs(ltx_build.DEFAULT_HUB_ID) == ltx_build.component_configs("ltx-2b")


# --- the pipeline and the injection hook -------------------------------------------------------------

@pytest.fixture(scope="module")
def tiny_pipe():
    return ltx_build.build_pipeline("ltx-tiny", "random", "cpu", "fp32")


def test_prompt_goes_through_the_text_encoder(tiny_pipe):
    import torch

    a = tiny_pipe.encode_prompt("a red fox", None, False, device="cpu")
    b = tiny_pipe.encode_prompt("a blue whale", None, False, device="cpu")
    assert a[0].shape == (1, ltx_build.TOKENIZER_MAX_LENGTH, 64)
    assert int(a[1].sum()) == len("a red fox") + 1  # bytes + </s>
    assert torch.isfinite(a[0]).all() and not torch.allclose(a[0], b[0])


def test_random_weights_are_seeded():
    import torch

    configs = ltx_build.component_configs("ltx-tiny")
    one = ltx_build.build_components(configs, "cpu", torch.float32, seed=3)["transformer"].proj_in.weight
    two = ltx_build.build_components(configs, "cpu", torch.float32, seed=3)["transformer"].proj_in.weight
    other = ltx_build.build_components(configs, "cpu", torch.float32, seed=4)["transformer"].proj_in.weight
    assert torch.equal(one, two) and not torch.equal(one, other)


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_run_generate_frames_and_timings(tiny_pipe, dtype):
    pipe = tiny_pipe if dtype == "fp32" else ltx_build.build_pipeline("ltx-tiny", "random", "cpu", dtype)
    settings = ltx.LTXSettings(model="ltx-tiny", weights="random", device="cpu", dtype=dtype, num_frames=9, height=64,
                               width=96, steps=3, guidance_scale=3.0, seed=1, prompt="a red fox",
                               negative_prompt="blurry")
    frames, t, audio = ltx.LTXVideoFamily().generate(pipe, settings)
    assert audio is None
    video = np.stack(frames)
    assert video.shape == (9, 64, 96, 3)
    assert np.isfinite(video).all() and video.std() > 0.01  # finite, not a constant image
    assert len(t["step_ms"]) == 3 and all(ms > 0 for ms in t["step_ms"])
    assert t["text_encode_ms"] > 0 and t["vae_decode_ms"] > 0 and t["peak_memory_bytes"] is None
    assert t["text_encode_ms"] + sum(t["step_ms"]) + t["vae_decode_ms"] <= t["total_ms"] * 1.001
    again, _, _ = ltx.LTXVideoFamily().generate(pipe, settings)
    assert np.array_equal(video, np.stack(again))


def test_inject_hook_applies_the_kernels_and_reports(tiny_pipe):
    settings = ltx.LTXSettings(model="ltx-tiny", weights="random", device="cpu", kernel_provider="reference")
    report = ltx.LTXVideoFamily().inject(tiny_pipe, settings).as_dict()
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
    no_weights = [a for a in TINY if a not in ("--weights", "random")]  # ltx-tiny defaults to random weights
    args = ["generate", "--prompt", "a red fox in the snow", *no_weights, "--output", str(out)]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    assert load_result(out.with_suffix(".json"))["run"]["config"]["weights"] == "random"
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


# --- memory, late write failures, warnings ------------------------------------------------------------

def _host_has(monkeypatch, gib: float) -> None:
    from ltxbench.memory import fit as memory

    monkeypatch.setattr(memory, "available", lambda device: (int(gib * 2**30), f"the host has {gib} GiB available"))


def test_the_2b_pipeline_is_measured_before_it_is_built(monkeypatch):
    """Lightricks/LTX-Video in fp32 is 26.5 GiB of weights: refused on a 23 GiB host (the OOM killer's case), in bf16
    it fits; nothing is allocated on the CPU for the check."""
    import torch

    from ltxbench.errors import EnvironmentProblem

    built_on = []
    real = ltx_build.build_components
    monkeypatch.setattr(ltx_build, "build_components", lambda c, device, *a, **k: built_on.append(device) or real(
        c, device, *a, **k))
    _host_has(monkeypatch, 23.0)
    configs = ltx_build.component_configs(ltx_build.DEFAULT_HUB_ID)
    with pytest.raises(EnvironmentProblem, match=r"Lightricks/LTX-Video in fp32 needs about 26\.\d GiB") as err:
        ltx_build.ensure_pipeline_fits(configs, ltx_build.DEFAULT_HUB_ID, "cpu", torch.float32)
    assert "--dtype bf16" in err.value.hint and err.value.exit_code == 4
    ltx_build.ensure_pipeline_fits(configs, ltx_build.DEFAULT_HUB_ID, "cpu", torch.bfloat16)
    assert built_on == ["meta", "meta"]


def test_generate_refuses_a_model_too_large_in_one_line_exit_4(monkeypatch, tmp_path):
    _host_has(monkeypatch, 0.001)
    out = tmp_path / "v.mp4"
    result = runner.invoke(app, ["generate", "--prompt", "x", *TINY, "--output", str(out)])
    assert result.exit_code == 4, result.output
    lines = [ln for ln in result.output.splitlines() if ln.strip()]
    assert lines[0].startswith("error: ltx-tiny in fp32 needs about") and "0.001 GiB available" in lines[0], lines
    assert len(lines) == 2 and not out.exists() and not out.with_suffix(".json").exists()


def test_memory_module_counts_shared_weights_once():
    import torch

    from ltxbench.memory.fit import module_bytes

    a = torch.nn.Linear(4, 4, bias=False)
    b = torch.nn.Linear(4, 4, bias=False)
    b.weight = a.weight
    assert module_bytes(a, b) == 4 * 4 * 4
    assert module_bytes(torch.nn.Linear(4, 4, dtype=torch.bfloat16)) == (16 + 4) * 2


def _fake_run(monkeypatch):
    """generate without the model: the mp4 and result writes are what these tests are about."""
    frames = [np.full((64, 64, 3), i / 10, dtype=np.float32) for i in range(9)]
    timings = {"text_encode_ms": 1.0, "step_ms": [2.0, 2.0], "vae_decode_ms": 1.0, "total_ms": 7.0,
               "peak_memory_bytes": None}
    monkeypatch.setattr(ltx.LTXVideoFamily, "build", lambda self, settings: object())
    monkeypatch.setattr(ltx.LTXVideoFamily, "generate", lambda self, *a, **k: (frames, timings, None))


@pytest.mark.parametrize("errno_name,code", [("EROFS", 2), ("ENOSPC", 4)])
def test_a_result_that_cannot_be_written_late_is_one_line_and_leaves_nothing(errno_name, code, monkeypatch,
                                                                             tmp_path):
    """The folder passed the up-front check, then refused the result JSON (a mount turned read-only, or full):
    one line, exit 2 for the --output (4 for a full disk), and the mp4 and the folders made for it are taken back."""
    import errno

    from ltxbench.results import io

    def refuse(text, final, force):
        raise OSError(getattr(errno, errno_name), os.strerror(getattr(errno, errno_name)), str(final))

    _fake_run(monkeypatch)
    monkeypatch.setattr(io, "_publish", refuse)
    out = tmp_path / "new" / "v.mp4"
    result = runner.invoke(app, ["generate", "--prompt", "x", *TINY, "--no-optimized-kernels", "--output", str(out)])
    assert result.exit_code == code, result.output
    lines = [ln for ln in result.output.splitlines() if ln.strip()]
    assert lines[-2].startswith("error: ") and str(out.with_suffix(".json")) in lines[-2], lines
    assert "Traceback" not in result.output
    assert list(tmp_path.iterdir()) == []


def test_a_csv_refused_after_its_json_takes_the_json_back(monkeypatch, tmp_path):
    from ltxbench.results import io

    real = io._publish

    def csv_refused(text, final, force):
        if final.suffix == ".csv":
            raise PermissionError(13, "Permission denied", str(final))
        real(text, final, force)

    _fake_run(monkeypatch)
    monkeypatch.setattr(io, "_publish", csv_refused)
    out = tmp_path / "v.mp4"
    result = runner.invoke(app, ["generate", "--prompt", "x", *TINY, "--no-optimized-kernels", "--output", str(out)])
    assert result.exit_code == 2, result.output
    assert "v.csv cannot be written: Permission denied" in result.output
    assert list(tmp_path.iterdir()) == []


def test_pretrained_directory_loads_without_diffusers_dtype_warning(tiny_pipe, tmp_path):
    import warnings

    import torch

    tiny_pipe.save_pretrained(tmp_path / "tiny")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        pipe = ltx_build.build_pipeline(str(tmp_path / "tiny"), "pretrained", "cpu", torch.float32)
    assert pipe.transformer.dtype == torch.float32
    assert not [w for w in caught if "torch_dtype" in str(w.message)], [str(w.message) for w in caught]


def test_precision_fp8_generates_with_the_fp8_projections_and_says_so(tmp_path):
    from ltxbench.results.io import load_result

    out = tmp_path / "fp8.mp4"
    result = runner.invoke(app, ["generate", "--prompt", "a red fox in the snow", *TINY, "--kernel-provider",
                                 "reference", "--precision", "fp8", "--output", str(out)])
    assert result.exit_code == 0, result.output
    doc = load_result(out.with_suffix(".json"))
    assert doc["run"]["config"]["precision"] == "fp8" and {r["dtype"] for r in doc["records"]} == {"fp8"}
    assert {r["params"]["fp8_accumulation"] for r in doc["records"]} == {"fast"}
    assert any(rule.startswith("fp8: weights stored") for rule in doc["injection"]["rules"])


def test_precision_fp8_without_our_kernels_exits_2(tmp_path):
    out = tmp_path / "x.mp4"
    result = runner.invoke(app, ["generate", "--prompt", "a fox", *TINY, "--no-optimized-kernels", "--precision",
                                 "fp8", "--output", str(out)])
    assert result.exit_code == 2, result.output
    assert "--precision fp8 applies to our kernels" in " ".join(result.output.split())
    assert not out.exists()
