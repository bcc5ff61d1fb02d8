"""The Wan family (ltxbench.models.wan, wan_build) on the CPU: --model resolution, the configs against the released
sizes, the builder (dtypes, tokenizer, offline failure), the token count, generate's mp4, bench e2e, profile and the
refusals."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
from typer.testing import CliRunner

from ltxbench.cli import app
from ltxbench.errors import UsageError
from ltxbench.models import family_of, wan, wan_build, wan_run
from tests.helpers import REPO

runner = CliRunner()
TINY = ["--model", "wan-tiny", "--weights", "random", "--device", "cpu", "--num-frames", "9", "--height", "64",
        "--width", "64", "--steps", "2"]
E2E = ["bench", "e2e", *TINY, "--warmup-iterations", "1", "--repeats", "1"]
PHASES = ["text_encode", "denoise_step", "vae_decode", "total"]


@pytest.fixture(scope="module")
def tiny():
    pipe = wan_build.build_pipeline("wan-tiny", "random", "cpu", "fp32")
    pipe.set_progress_bar_config(disable=True)
    return pipe


# --- which family, which defaults -------------------------------------------------------------------

@pytest.mark.parametrize(("model", "title"), [
    ("wan-tiny", "Wan"), ("wan2.1-1.3b", "Wan"), ("wan2.2-5b", "Wan"), ("Wan-AI/Wan2.1-T2V-14B-Diffusers", "Wan"),
    ("Wan-AI/Wan2.2-T2V-A14B-Diffusers", "Wan"), ("ltx2-tiny", "LTX-2"), ("Lightricks/LTX-Video", "LTX-Video"),
    ("acme/swan-lake", "LTX-Video"),  # "wan" inside a word is not Wan's
])
def test_model_resolves_to_its_family(model, title):
    assert family_of(model).title == title


def test_a_wan_pipeline_directory_is_wans_and_an_ltx_one_is_not(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "model_index.json").write_text(json.dumps({"_class_name": "WanPipeline"}))
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "model_index.json").write_text(json.dumps({"_class_name": "LTXPipeline"}))
    assert family_of(str(tmp_path / "a")).title == "Wan" and family_of(str(tmp_path / "b")).title == "LTX-Video"


@pytest.mark.parametrize("command", ["generate", "bench e2e"])
def test_the_pipelines_own_defaults_apply_where_the_command_line_has_none(command):
    """A released preset runs the pipeline's defaults; a tiny one a CPU-sized video, unless the command line says."""
    from ltxbench.cli.options import declared

    values = {o.name: o.default_for(command) for o in declared(command)}
    family = family_of("wan2.1-1.3b")
    settings = family.settings(command, **{**values, "model": "wan2.1-1.3b", "weights": "random", "prompt": "x"})
    assert type(settings) is wan.WanSettings
    assert (settings.num_frames, settings.height, settings.width, settings.steps, settings.guidance_scale,
            settings.frame_rate) == (81, 480, 832, 50, 5.0, 16)
    for tiny in ("wan-tiny", "wan-tiny-a14b", "wan-tiny-ti2v", "wan-tiny-i2v", "wan-tiny-i2v-a14b"):
        settings = family.settings(command, **{**values, "model": tiny, "weights": "random", "prompt": "x"})
        assert (settings.num_frames, settings.height, settings.width, settings.steps) == (9, 64, 64, 50), tiny
    given = family.settings(command, **{**values, "model": "wan-tiny", "weights": "random", "prompt": "x",
                                        "num_frames": 17, "width": 128})
    assert (given.num_frames, given.height, given.width) == (17, 64, 128)


# --- configs and builder ----------------------------------------------------------------------------

@pytest.mark.parametrize(("model", "expected"), [
    ("wan2.1-1.3b", {"transformer": 1.419e9, "vae": 126.9e6, "text_encoder": 5.681e9}),
    ("wan2.1-14b", {"transformer": 14.289e9, "vae": 126.9e6, "text_encoder": 5.681e9}),
    ("wan2.2-5b", {"transformer": 5.000e9, "vae": 704.7e6, "text_encoder": 5.681e9}),
])
def test_released_configs_have_the_released_sizes(model, expected):
    parts = wan_build.build_components(wan_build.component_configs(model), "meta", torch.bfloat16)
    for name, count in expected.items():
        assert abs(sum(p.numel() for p in parts[name].parameters()) / count - 1) < 1e-3, name


def test_random_weights_keep_diffusers_fp32_modules_in_fp32(tiny):
    built = wan_build.build_pipeline("wan-tiny", "random", "cpu", "bf16")
    fp32 = {name for name, p in built.transformer.named_parameters() if p.dtype == torch.float32}
    keep = set(built.transformer._keep_in_fp32_modules)
    assert fp32 and all(keep.intersection(name.split(".")) for name in fp32)
    assert {"blocks.0.scale_shift_table", "blocks.0.norm2.weight", "scale_shift_table"} <= fp32
    assert any("time_embedder" in name for name in fp32)
    assert built.transformer.blocks[0].attn1.to_q.weight.dtype == torch.bfloat16
    assert built.transformer.rope.freqs_cos.dtype == torch.float32  # computed in float64, kept fp32
    # the same seed gives the same weights
    again = wan_build.build_pipeline("wan-tiny", "random", "cpu", "fp32")
    assert torch.equal(again.transformer.proj_out.weight, tiny.transformer.proj_out.weight)


def test_the_tokenizer_stand_in_has_umt5s_special_ids_and_pads_to_512():
    tokenizer = wan_build.build_tokenizer()
    assert (tokenizer.pad_token_id, tokenizer.eos_token_id, tokenizer.unk_token_id) == (0, 1, 2)
    batch = tokenizer(["a red fox in the snow", "héllo 狐"], padding="max_length", max_length=512, truncation=True,
                      return_tensors="pt")
    assert batch.input_ids.shape == (2, 512) and int(batch.input_ids.max()) < 512
    lengths = batch.attention_mask.sum(1)
    assert lengths[0] < len("a red fox in the snow")  # pieces longer than a character are used
    assert (batch.input_ids[0, lengths[0] - 1] == 1) and (batch.input_ids[0, lengths[0]:] == 0).all()


def test_offline_uncached_weights_are_one_clear_error(tmp_path):
    """A fresh process: huggingface_hub reads HF_HUB_OFFLINE once, at import; an empty HF_HOME means no cache."""
    model = "Wan-AI/Wan2.1-FLF2V-14B-720P-Diffusers"  # no preset's: nothing to size before loading
    code = ("from ltxbench.models import wan_build as b\n"
            f"try:\n    b.build_pipeline({model!r}, 'pretrained', 'cpu', 'bf16')\n"
            "except Exception as e:\n    print(type(e).__name__, e.exit_code); print(e.message); print(e.hint)\n")
    env = {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf"),
           "HF_HUB_CACHE": str(tmp_path / "hf" / "hub")}
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=180)
    lines = proc.stdout.splitlines()
    assert len(lines) == 3 and lines[0] == "EnvironmentProblem 4", proc.stdout + proc.stderr
    assert lines[1] == (f"weights for '{model}' are not in the Hugging Face cache ({tmp_path / 'hf' / 'hub'}) and "
                        "HF_HUB_OFFLINE=1 forbids downloading them")
    assert f"hf download {model}" in lines[2] and "--weights random" in lines[2]


# --- tokens and the timed generation ----------------------------------------------------------------

def test_tokens_are_the_transformers_sequence_length(tiny):
    """VideoFamily.tokens (the VAE's x4 / x8 compression over the (1, 2, 2) patch) against the tokens the patch
    embedding makes in a generation: 3 latent frames x 4 x 4."""
    seen = []
    handle = tiny.transformer.patch_embedding.register_forward_hook(
        lambda _m, _i, out: seen.append(out.flatten(2).shape[2]))
    settings = wan.WanSettings(model="wan-tiny", weights="random", num_frames=9, height=64, width=64, steps=1,
                               guidance_scale=1.0)
    try:
        with torch.no_grad():
            wan_run.run_once(tiny, settings)
    finally:
        handle.remove()
    assert seen == [48] and family_of("wan-tiny").tokens(tiny, settings) == 48


@pytest.mark.parametrize(("model", "frames", "height", "width", "tokens"), [
    ("wan2.1-14b", 81, 480, 832, 32760), ("wan2.1-14b", 81, 720, 1280, 75600), ("wan2.2-5b", 121, 704, 1280, 27280),
])
def test_tokens_of_the_released_models(model, frames, height, width, tokens):
    from diffusers import WanPipeline

    parts = wan_build.build_components(wan_build.component_configs(model), "meta", torch.bfloat16)
    pipe = WanPipeline(tokenizer=None, **parts)
    settings = wan.WanSettings(model=model, weights="random", num_frames=frames, height=height, width=width)
    assert family_of(model).tokens(pipe, settings) == tokens


def test_our_decode_is_the_pipelines(tiny):
    """Our phases (encode, the loop to latents, decode) give the video the pipeline gives in one call."""
    settings = wan.WanSettings(model="wan-tiny", weights="random", num_frames=5, height=32, width=48, steps=2,
                               prompt="a red fox", negative_prompt="blurry")
    with torch.no_grad():
        _, outputs = wan_run.run_once(tiny, settings)
        ours = tiny.video_processor.postprocess_video(outputs["vae_decode"], output_type="pt")
        whole = tiny("a red fox", negative_prompt="blurry", num_frames=5, height=32, width=48, num_inference_steps=2,
                     guidance_scale=5.0, generator=torch.Generator("cpu").manual_seed(settings.seed),
                     output_type="pt").frames
    assert ours.shape == (1, 5, 3, 32, 48) and torch.equal(ours, whole)


# --- the commands -----------------------------------------------------------------------------------

def test_generate_writes_the_video_and_every_phase(tmp_path):
    import imageio_ffmpeg

    out = tmp_path / "fox.mp4"
    result = runner.invoke(app, ["generate", "--prompt", "a red fox in the snow", *TINY, "--output", str(out)])
    assert result.exit_code == 0, result.output
    assert imageio_ffmpeg.count_frames_and_secs(str(out))[0] == 9
    doc = json.loads(out.with_suffix(".json").read_text())
    assert [r["name"] for r in doc["records"]] == PHASES
    assert doc["run"]["config"]["family"] == "wan" and doc["injection"]["applied"] is True


def _names(records, config) -> set[str]:
    return {r["name"] for r in records if r["provider"] == config}


@pytest.mark.parametrize("scope", ["model", "regional"])
def test_bench_e2e_times_every_phase_of_baseline_and_compile(scope, tmp_path, captured, compile_calls):
    out = tmp_path / "e2e.json"
    result = runner.invoke(app, [*E2E, "--configs", "baseline,compile", "--compile-scope", scope,
                                 "--output", str(out)])
    assert result.exit_code == 0, result.output
    records = json.loads(out.read_text())["records"]
    assert _names(records, "baseline") == set(PHASES) and _names(records, "compile") == {*PHASES, "compile"}
    assert all(r["params"]["guidance_scale"] == 5.0 and r["params"]["family"] == "wan" for r in records)
    transformer = captured["target"].transformer
    assert compile_calls == [(transformer, "default")] and compile_calls.scopes == [scope]
    assert transformer._compiled_call_impl is None


def test_profile_marks_each_phase_in_the_trace(tmp_path):
    out = tmp_path / "prof.json"
    result = runner.invoke(app, ["profile", *TINY, "--configs", "baseline", "--output", str(out)])
    assert result.exit_code == 0, result.output
    doc = json.loads(out.read_text())
    events = json.loads(open(doc["run"]["config"]["traces"]["baseline"]).read())["traceEvents"]
    assert {"text_encode", "denoise", "vae_decode"} <= {e.get("name") for e in events}


# --- refusals (exit 2, nothing written) -------------------------------------------------------------

@pytest.mark.parametrize("command", [["generate", "--prompt", "x"], ["bench", "e2e"]])
@pytest.mark.parametrize(("extra", "needle"), [
    (["--num-frames", "10"], "--num-frames 10 is not of the form 4k+1 (Wan)"),
    (["--height", "40"], "--height 40 is not a positive multiple of 16 (Wan)"),
    (["--guidance-scale", "-1"], "--guidance-scale -1.0 must not be negative"),
    (["--weights", "pretrained"], "--model wan-tiny has no pretrained weights"),
    (["--image", "first.png"], "--image: Wan's image-to-video runs on the TI2V model (wan2.2-5b) or the I2V one "
                               "(wan2.1-i2v-14b), not wan-tiny"),
    (["--stg-scale", "1"], "--stg-scale does not apply to Wan"),
])
def test_bad_arguments_exit_2(command, extra, needle, tmp_path):
    out = tmp_path / ("v.mp4" if command[0] == "generate" else "r.json")
    result = runner.invoke(app, [*command, *TINY, *extra, "--output", str(out)])
    assert result.exit_code == 2, result.output
    assert needle in result.output
    assert not list(tmp_path.iterdir())


def test_optimized_reports_its_rules(tmp_path):
    """The optimized configuration runs Wan's first rules (reference ops on the CPU) and says so."""
    from ltxbench.inject.wan import BLOCK_RULE, GELU_RULE, GENERATION_RULE, QK_NORM_RULE, QK_ROPE_RULE
    from ltxbench.inject.wan.pair import PAIR_RULE

    out = tmp_path / "o.json"
    result = runner.invoke(app, [*E2E, "--configs", "optimized", "--phase", "transformer", "--output", str(out)])
    assert result.exit_code == 0, result.output
    doc = json.loads(out.read_text())
    injection = doc["run"]["config"]["injection"]["optimized"]
    assert injection["applied"] is True and injection["skipped"] == []
    assert injection["rules"] == {BLOCK_RULE: 2, QK_ROPE_RULE: 2, QK_NORM_RULE: 4, GELU_RULE: 2, PAIR_RULE: 1,
                                   GENERATION_RULE: 1}
    assert _names(doc["records"], "optimized") == {"denoise_step", "total"}


def test_wan_2_2_5b_sides_are_multiples_of_32():
    wan_build.validate_video_args(121, 704, 1280, 50, wan_build.side_multiple("wan2.2-5b"))
    with pytest.raises(UsageError, match="--height 720 is not a positive multiple of 32"):
        wan_build.validate_video_args(121, 720, 1280, 50, wan_build.side_multiple("wan2.2-5b"))
    wan_build.validate_video_args(81, 720, 1280, 50, wan_build.side_multiple("wan2.1-14b"))
    with pytest.raises(UsageError, match="--steps 0 must be at least 1"):
        wan_build.validate_video_args(81, 480, 832, 0)


def _first_frame(tmp_path):
    from PIL import Image

    path = tmp_path / "first.png"
    pixels = torch.rand(64, 64, 3, generator=torch.Generator().manual_seed(5))
    Image.fromarray((pixels * 255).to(torch.uint8).numpy()).save(path)
    return path


def test_image_to_video_on_the_ti2v_model(tmp_path):
    """--image on a TI2V model (wan-tiny-ti2v: wan-tiny run as Wan 2.2 5B runs) builds WanImageToVideoPipeline on the
    same components; the first frame enters as the first latent frame, at timestep 0, so the latents differ from
    text-to-video's; bench e2e pairs the guidance calls there too."""
    image = _first_frame(tmp_path)
    ti2v = [a if a != "wan-tiny" else "wan-tiny-ti2v" for a in TINY]
    out = tmp_path / "i2v.mp4"
    result = runner.invoke(app, ["generate", "--prompt", "a red fox", *ti2v, "--image", str(image), "--output",
                                 str(out)])
    assert result.exit_code == 0, result.output
    doc = json.loads(out.with_suffix(".json").read_text())
    assert doc["run"]["config"]["image"] == str(image) and [r["name"] for r in doc["records"]] == PHASES
    e2e = tmp_path / "e2e.json"
    result = runner.invoke(app, ["bench", "e2e", *ti2v, "--image", str(image), "--configs", "optimized",
                                 "--phase", "transformer", "--warmup-iterations", "1", "--repeats", "1",
                                 "--output", str(e2e)])
    assert result.exit_code == 0, result.output
    rules = json.loads(e2e.read_text())["run"]["config"]["injection"]["optimized"]["rules"]
    assert any(rule.startswith("pipeline: the guidance pair") for rule in rules), rules


def test_the_ti2v_pipeline_conditions_on_the_image():
    from diffusers import WanImageToVideoPipeline
    from PIL import Image

    family = family_of("wan-tiny-ti2v")
    settings = family.settings("generate", model="wan-tiny-ti2v", weights="random", device="cpu", num_frames=9,
                               height=64, width=64, steps=2, image="unused")
    pipe = family.build(settings)
    assert isinstance(pipe, WanImageToVideoPipeline) and pipe.config.expand_timesteps
    embeds = wan_run.encode(pipe, settings, "cpu")
    red, blue = (Image.new("RGB", (64, 64), color) for color in ("red", "blue"))
    latents = [wan_run.denoise(pipe, embeds, settings, torch.Generator().manual_seed(0), None, image)
               for image in (red, red, blue)]
    assert torch.equal(latents[0], latents[1]) and not torch.equal(latents[0], latents[2])


# --- Wan 2.1 I2V (CLIP image features beside the text) ------------------------------------------------------------

I2V = [a if a != "wan-tiny" else "wan-tiny-i2v" for a in TINY]


def test_the_i2v_model_refuses_without_an_image(tmp_path):
    out = tmp_path / "v.mp4"
    needle = "--model wan-tiny-i2v is an image-to-video model: give the first frame with --image"
    result = runner.invoke(app, ["generate", "--prompt", "x", *I2V, "--output", str(out)])
    assert result.exit_code == 2 and needle in " ".join(result.output.split()), result.output
    assert not out.exists()


def test_the_i2v_model_through_generate_and_bench(tmp_path):
    """Wan 2.1 I2V (wan-tiny-i2v): WanImageToVideoPipeline with CLIP's vision tower; generate writes the video, bench
    e2e runs the optimized configuration, its guidance pair with the image features stacked."""
    image = _first_frame(tmp_path)
    out = tmp_path / "i2v.mp4"
    result = runner.invoke(app, ["generate", "--prompt", "a red fox", *I2V, "--image", str(image), "--output",
                                 str(out)])
    assert result.exit_code == 0, result.output
    assert [r["name"] for r in json.loads(out.with_suffix(".json").read_text())["records"]] == PHASES
    e2e = tmp_path / "e2e.json"
    result = runner.invoke(app, ["bench", "e2e", *I2V, "--image", str(image), "--configs", "baseline,optimized",
                                 "--phase", "transformer", "--warmup-iterations", "1", "--repeats", "1",
                                 "--output", str(e2e)])
    assert result.exit_code == 0, result.output
    injection = json.loads(e2e.read_text())["run"]["config"]["injection"]["optimized"]
    assert injection["applied"] and any(rule.startswith("block:") for rule in injection["rules"]), injection
    assert any(rule.startswith("pipeline: the guidance pair") for rule in injection["rules"]), injection


def test_the_i2v_pipeline_conditions_on_the_image_and_its_clip_features():
    """The first frame reaches the transformer twice: as VAE latents in the condition channels and as CLIP features
    in the image cross-attention (its add_k_proj / add_v_proj). Either alone changes the latents."""
    from diffusers import WanImageToVideoPipeline
    from PIL import Image

    family = family_of("wan-tiny-i2v")
    settings = family.settings("generate", model="wan-tiny-i2v", weights="random", device="cpu", num_frames=9,
                               height=64, width=64, steps=2, image="unused")
    pipe = family.build(settings)
    assert isinstance(pipe, WanImageToVideoPipeline) and pipe.image_encoder is not None
    assert pipe.transformer.config.in_channels == 36 and pipe.transformer.config.image_dim == 32
    embeds = wan_run.encode(pipe, settings, "cpu")
    red, blue = (Image.new("RGB", (64, 64), color) for color in ("red", "blue"))

    def latents(image):
        return wan_run.denoise(pipe, embeds, settings, torch.Generator().manual_seed(0), None, image)

    plain = latents(red)
    assert torch.equal(plain, latents(red)) and not torch.equal(plain, latents(blue))
    with torch.no_grad():  # the CLIP features alone: the image cross-attention's values scaled
        pipe.transformer.blocks[0].attn2.add_v_proj.weight.mul_(1.01)
    assert not torch.equal(plain, latents(red))


def test_the_i2v_14b_preset_counts_as_published():
    """Wan 2.1 I2V 14B from its configs on the meta device: 16.395 B transformer parameters (the 14B one and the image
    branch: add_k/add_v per block, the image embedder), CLIP ViT-H/14's vision tower 630.8 M, 257 image tokens."""
    from ltxbench.models import wan_build

    parts = wan_build.build_components(wan_build.component_configs("wan2.1-i2v-14b"), "meta", torch.bfloat16)
    count = {name: sum(p.numel() for p in part.parameters()) for name, part in parts.items()
             if hasattr(part, "parameters")}
    assert abs(count["transformer"] / 16.395e9 - 1) < 1e-3 and abs(count["image_encoder"] / 630.8e6 - 1) < 1e-3
    clip = parts["image_encoder"].config
    assert (clip.image_size // clip.patch_size) ** 2 + 1 == 257
    assert wan_build.needs_an_image("wan2.1-i2v-14b") and wan_build.needs_an_image("Wan-AI/Wan2.1-I2V-14B-720P")
    assert not wan_build.needs_an_image("wan2.1-14b") and wan_build.takes_an_image("wan-tiny-i2v")


def test_the_wan22_i2v_a14b_model_runs_image_to_video_on_both_experts(tmp_path):
    """Wan 2.2 I2V A14B (wan-tiny-i2v-a14b): WanImageToVideoPipeline without CLIP (the image enters as latents in the
    condition channels alone), both experts, the boundary at 0.9; generate writes the video; --image is required."""
    from diffusers import WanImageToVideoPipeline

    from ltxbench.models import wan_build

    args = [a if a != "wan-tiny" else "wan-tiny-i2v-a14b" for a in TINY]
    result = runner.invoke(app, ["generate", "--prompt", "x", *args, "--output", str(tmp_path / "n.mp4")])
    assert result.exit_code == 2 and "is an image-to-video model" in result.output
    out = tmp_path / "i2v.mp4"
    result = runner.invoke(app, ["generate", "--prompt", "a red fox", *args, "--image", str(_first_frame(tmp_path)),
                                 "--output", str(out)])
    assert result.exit_code == 0, result.output
    pipe = wan_build.build_pipeline("wan-tiny-i2v-a14b", "random", "cpu", "fp32")
    assert isinstance(pipe, WanImageToVideoPipeline) and pipe.image_encoder is None
    assert pipe.transformer_2 is not None and pipe.config.boundary_ratio == 0.9
    assert pipe.transformer.config.in_channels == 36 and pipe.transformer.config.image_dim is None
    assert wan_build.needs_an_image("wan2.2-i2v-a14b") and not wan_build.needs_an_image("wan2.2-5b")


def test_bench_e2e_in_fp8_adds_ours_in_fp8_with_its_error_measured(tmp_path):
    """--precision fp8 on Wan: ours in FP8 beside the bf16 configurations (the same FP8 math in plain torch on the
    CPU), and the FP8 step's error against the bf16 one recorded in the same run."""
    out = tmp_path / "fp8.json"
    result = runner.invoke(app, [*E2E, "--kernel-provider", "reference", "--configs", "optimized", "--precision",
                                 "fp8", "--phase", "transformer", "--output", str(out)])
    assert result.exit_code == 0, result.output
    doc = json.loads(out.read_text())
    assert {r["provider"] for r in doc["records"] if r["name"] == "denoise_step"} >= {"optimized", "optimized-fp8"}
    assert any(r["name"] == "step_error" and r["provider"] == "optimized-fp8" for r in doc["records"])
    assert "fp8: attention projections on FP8 weights, each input quantized per token" in \
        doc["run"]["config"]["injection"]["optimized-fp8"]["rules"]
