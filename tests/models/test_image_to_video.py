"""Image-to-video (--image) on the CPU with the tiny models of both video families: the image-to-video pipelines
on the same components, the image conditioning the first frame, per-token timesteps, validation and the records."""

from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from ltxbench.cli import app
from ltxbench.models import family_of

runner = CliRunner()
SHAPE = ["--device", "cpu", "--num-frames", "9", "--height", "64", "--width", "64", "--steps", "2"]
I2V_CLASSES = {"ltx-tiny": "LTXImageToVideoPipeline", "ltx2-tiny": "LTX2ImageToVideoPipeline"}
# LTX-2 with one transformer call per step (the CFG pair): no STG or modality-isolated pass, for time
ONE_PASS = {"ltx2-tiny": {"stg_scale": 0.0, "audio_stg_scale": 0.0, "modality_scale": 1.0,
                          "audio_modality_scale": 1.0}}


def _png(path, seed: int) -> str:
    from PIL import Image

    pixels = (np.random.default_rng(seed).random((64, 64, 3)) * 255).astype(np.uint8)
    Image.fromarray(pixels).save(path)
    return str(path)


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    folder = tmp_path_factory.mktemp("images")
    return _png(folder / "a.png", 0), _png(folder / "b.png", 1)


def _settings(model: str, image: str | None):
    family = family_of(model)
    return family, family.settings("generate", model=model, weights="random", device="cpu", dtype="fp32",
                                   num_frames=9, height=64, width=64, steps=2, prompt="a red fox", image=image,
                                   **ONE_PASS.get(model, {}))


def _timesteps(pipe) -> list:
    """The `timestep` of each transformer call, as the pipeline passes it."""
    seen: list = []
    pipe.transformer.register_forward_pre_hook(lambda _m, _a, kw: seen.append(kw["timestep"].clone()),
                                               with_kwargs=True)
    return seen


# --- the commands -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("model", ["ltx-tiny", "ltx2-tiny"])
def test_generate_with_an_image_runs_the_image_to_video_pipeline(model, images, tmp_path, captured):
    import diffusers

    out = tmp_path / "v.mp4"
    result = runner.invoke(app, ["generate", "--prompt", "a red fox", "--model", model, "--weights", "random",
                                 *SHAPE, "--image", images[0], "--output", str(out)])
    assert result.exit_code == 0, result.output
    assert out.stat().st_size > 0
    assert isinstance(captured["target"], getattr(diffusers, I2V_CLASSES[model]))
    doc = json.loads(out.with_suffix(".json").read_text())
    assert doc["run"]["config"]["image"] == images[0]
    assert doc["run"]["argv"][-2:] == ["--image", images[0]]
    assert all(record["params"]["image"] == images[0] for record in doc["records"])


def test_bench_e2e_with_an_image_records_it_in_every_record(images, tmp_path, captured):
    import diffusers

    out = tmp_path / "r.json"
    result = runner.invoke(app, ["bench", "e2e", "--model", "ltx-tiny", "--weights", "random", *SHAPE,
                                 "--kernel-provider", "reference", "--configs", "baseline,optimized",
                                 "--phase", "transformer", "--warmup-iterations", "1", "--repeats", "1",
                                 "--image", images[0], "--output", str(out)])
    assert result.exit_code == 0, result.output
    assert isinstance(captured["target"], diffusers.LTXImageToVideoPipeline)
    doc = json.loads(out.read_text())
    assert doc["run"]["config"]["injection"]["optimized"]["applied"]  # our (reference) kernels ran on it
    records = doc["records"]
    assert {r["provider"] for r in records} == {"baseline", "optimized"}
    assert all(r["params"]["image"] == images[0] and r["params"]["phase"] == "transformer" for r in records)


def test_text_to_video_settings_record_no_image():
    family, settings = _settings("ltx-tiny", None)
    assert "image" not in settings.as_args()
    assert "--image" not in family.bench_argv(settings)


@pytest.mark.parametrize("model", ["ltx-tiny", "ltx2-tiny"])
def test_profile_reruns_keep_the_image(model, images):
    family, settings = _settings(model, images[0])
    assert family.bench_argv(settings)[-2:] == ["--image", images[0]]


# --- the image is used --------------------------------------------------------------------------------------

@pytest.mark.parametrize("model", ["ltx-tiny", "ltx2-tiny"])
def test_the_image_conditions_the_video_through_per_token_timesteps(model, images):
    import diffusers

    family, t2v_settings = _settings(model, None)
    t2v = family.build(t2v_settings)
    assert not isinstance(t2v, getattr(diffusers, I2V_CLASSES[model]))
    t2v_steps = _timesteps(t2v)
    family.generate(t2v, t2v_settings)
    assert t2v_steps and all(t.ndim == 1 for t in t2v_steps)  # one timestep per sample

    _, settings = _settings(model, images[0])
    pipe = family.build(settings)
    steps = _timesteps(pipe)
    first_a = family.generate(pipe, settings)[0][0]
    # one timestep per token: zero on the first frame's tokens (the image's), the step's own on the others
    assert steps and all(t.ndim == 2 and (t == 0).any() and (t > 0).any() for t in steps)
    assert all(t.shape[0] == u.shape[0] for t, u in zip(steps, t2v_steps, strict=True))

    _, other = _settings(model, images[1])
    first_b = family.generate(pipe, other)[0][0]
    assert first_a.shape == first_b.shape == (64, 64, 3)
    assert not np.allclose(first_a, first_b, atol=1e-3)  # same seed, same weights: the image made the difference


# --- validation (exit 2, before anything loads) -------------------------------------------------------------

def _text_file(folder):
    (folder / "notes.png").write_text("not an image")
    return folder / "notes.png"


@pytest.mark.parametrize(("make", "needle"), [
    (lambda folder: folder / "missing.png", "does not exist"),
    (lambda folder: folder, "is not a file"),
    (_text_file, "is not an image PIL can read"),
])
@pytest.mark.parametrize("command", [["generate", "--prompt", "x"], ["bench", "e2e"]])
def test_a_bad_image_exits_2_naming_it(command, make, needle, tmp_path):
    path = make(tmp_path)
    out = tmp_path / ("v.mp4" if command[0] == "generate" else "r.json")
    result = runner.invoke(app, [*command, "--model", "ltx-tiny", "--weights", "random", *SHAPE,
                                 "--kernel-provider", "reference", "--image", str(path), "--output", str(out)])
    assert result.exit_code == 2, result.output
    assert f"--image {path} {needle}" in " ".join(result.output.split())
    assert not out.exists()
