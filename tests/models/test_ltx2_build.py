"""LTX-2's configs and builder (ltxbench.models.ltx2_build) on the CPU: the 19B configs against the released
parameter counts, the tiny pipeline end to end (video and audio), seeding, the in-memory tokenizer, validation and
the errors of --weights pretrained."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from ltxbench.errors import EnvironmentProblem, UsageError
from ltxbench.models import ltx2_build

REPO = Path(__file__).resolve().parents[2]
# Parameters of the released LTX-2 (2.0) components in diffusers' layout (the text encoder with its vision tower).
RELEASED = {"transformer": 18.876e9, "text_encoder": 12.187e9, "connectors": 1.431e9, "vae": 1.222e9,
            "audio_vae": 53.2e6, "vocoder": 55.6e6}
MODULES = tuple(RELEASED)


def _env(**extra) -> dict:
    path = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    return {**os.environ, "PYTHONPATH": path, **extra}


def _params(module) -> int:
    return sum(p.numel() for p in module.parameters())


# --- configs ------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def meta_19b():
    import torch

    return ltx2_build.build_components(ltx2_build.component_configs("ltx2-19b"), "meta", torch.bfloat16)


@pytest.mark.parametrize("component", MODULES)
def test_19b_configs_have_the_released_parameter_counts(meta_19b, component):
    count = _params(meta_19b[component])
    assert abs(count - RELEASED[component]) / RELEASED[component] < 1e-3, f"{component}: {count:,}"


def test_19b_components_are_the_released_architecture(meta_19b):
    import torch

    t = meta_19b["transformer"].config
    assert (t.num_layers, t.num_attention_heads * t.attention_head_dim) == (48, 4096)
    assert t.audio_num_attention_heads * t.audio_attention_head_dim == 2048 and t.caption_channels == 3840
    assert t.rope_type == "split" and t.rope_double_precision and not t.gated_attn and not t.cross_attn_mod
    gemma = meta_19b["text_encoder"].config.text_config
    assert (gemma.num_hidden_layers, gemma.hidden_size, gemma.vocab_size) == (48, 3840, 262208)
    assert gemma.sliding_window == 1024 and gemma.layer_types[:6] == ["sliding_attention"] * 5 + ["full_attention"]
    assert gemma.rope_parameters["full_attention"] == {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6}
    assert gemma.rope_parameters["sliding_attention"]["rope_theta"] == 1e4
    assert meta_19b["text_encoder"].config.vision_config.num_hidden_layers == 27
    vae = meta_19b["vae"]
    assert (vae.spatial_compression_ratio, vae.temporal_compression_ratio, vae.config.latent_channels) == (32, 8, 128)
    assert meta_19b["vocoder"].total_upsample_factor == 240 and meta_19b["vocoder"].config.output_sampling_rate == 24000
    scheduler = meta_19b["scheduler"].config
    assert scheduler.use_dynamic_shifting and (scheduler.base_shift, scheduler.max_shift) == (0.95, 2.05)
    assert scheduler.shift_terminal == 0.1
    for name in MODULES:
        module = meta_19b[name]
        assert not module.training and not any(p.requires_grad for p in module.parameters())
        assert {p.dtype for p in module.parameters()} == {torch.bfloat16}, name


@pytest.mark.parametrize("preset", list(ltx2_build.PRESETS))
def test_component_configs_fit_together(preset):
    from transformers import AutoConfig, Gemma3Config

    c = ltx2_build.component_configs(preset)
    assert set(c) == set(ltx2_build.COMPONENTS)
    gemma = Gemma3Config.from_dict(c["text_encoder"])
    assert AutoConfig.for_model(**c["text_encoder"]).to_dict() == gemma.to_dict()
    hidden, layers = gemma.text_config.hidden_size, gemma.text_config.num_hidden_layers
    t, conn, audio = c["transformer"], c["connectors"], c["audio_vae"]
    assert t["caption_channels"] == conn["caption_channels"] == hidden
    assert conn["text_proj_in_factor"] == layers + 1  # every hidden state, embeddings included
    for side in ("video", "audio"):  # LTX-2.0's connectors work at the caption width
        assert conn[f"{side}_connector_num_attention_heads"] * conn[f"{side}_connector_attention_head_dim"] == hidden
    assert t["in_channels"] == t["out_channels"] == c["vae"]["latent_channels"]
    assert t["audio_in_channels"] == audio["latent_channels"] * audio["mel_bins"] // 4 == audio["base_channels"]
    assert c["vocoder"]["in_channels"] == audio["output_channels"] * audio["mel_bins"]
    assert (t["audio_sampling_rate"], t["audio_hop_length"]) == (audio["sample_rate"], audio["mel_hop_length"])
    assert gemma.text_config.vocab_size >= len(ltx2_build.build_tokenizer())


def test_the_hub_id_with_random_weights_means_the_19b_configs():
    assert ltx2_build.component_configs(ltx2_build.DEFAULT_HUB_ID) == ltx2_build.component_configs("ltx2-19b")


def test_a_diffusers_pipeline_directory_gives_its_configs(tmp_path):
    tiny = ltx2_build.component_configs("ltx2-tiny")
    for comp, config in tiny.items():
        name = "scheduler_config.json" if comp == "scheduler" else "config.json"
        (tmp_path / comp).mkdir()
        (tmp_path / comp / name).write_text(json.dumps(config))
    assert ltx2_build.component_configs(str(tmp_path)) == tiny
    (tmp_path / "vocoder" / "config.json").unlink()
    with pytest.raises(UsageError, match="has no config for vocoder"):
        ltx2_build.component_configs(str(tmp_path))


# --- the tiny pipeline --------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def tiny_pipe():
    return ltx2_build.build_pipeline("ltx2-tiny", "random", "cpu", "fp32")


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_tiny_text_to_video_gives_frames_and_stereo_audio_in_seconds(tiny_pipe, dtype):
    import torch

    start = time.perf_counter()
    pipe = tiny_pipe if dtype == "fp32" else ltx2_build.build_pipeline("ltx2-tiny", "random", "cpu", dtype)
    video, audio = pipe(prompt="a red fox trotting through fresh snow", negative_prompt="blurry", num_frames=9,
                        height=64, width=64, num_inference_steps=2, output_type="np", return_dict=False,
                        generator=torch.Generator().manual_seed(1))  # the pipeline's default guidance
    elapsed = time.perf_counter() - start
    frames = video[0]
    assert frames.shape == (9, 64, 64, 3)
    assert np.isfinite(frames).all() and frames.std() > 0.01  # finite, not a constant image
    assert audio.ndim == 3 and audio.shape[:2] == (1, 2) and torch.isfinite(audio).all() and audio.std() > 0
    seconds = audio.shape[2] / pipe.vocoder.config.output_sampling_rate
    assert abs(seconds - 9 / 24) < 2 / 25, seconds  # 9 frames at 24 fps, to within two audio latents (25 per s)
    assert elapsed < 60, f"{elapsed:.1f} s"  # under a second where the CPU is free; CI machines are shared


def test_prompt_goes_through_gemma_left_padded(tiny_pipe):
    import torch

    embeds, mask, _, _ = tiny_pipe.encode_prompt("a red fox", None, False, device="cpu")
    other, _, _, _ = tiny_pipe.encode_prompt("a blue whale", None, False, device="cpu")
    assert embeds.shape == (1, ltx2_build.TOKENIZER_MAX_LENGTH, 64 * 3)  # 3 hidden states of width 64, stacked
    tokens = len(tiny_pipe.tokenizer("a red fox").input_ids)
    assert int(mask.sum()) == tokens and mask[0, -tokens:].all() and not mask[0, :-tokens].any()
    assert torch.isfinite(embeds).all() and not torch.allclose(embeds, other)


def test_random_weights_are_seeded():
    import torch

    configs = ltx2_build.component_configs("ltx2-tiny")
    one, two, other = (ltx2_build.build_components(configs, "cpu", torch.float32, seed=s) for s in (3, 3, 4))
    for name in MODULES:
        a, b, c = (parts[name].state_dict() for parts in (one, two, other))
        assert all(torch.equal(a[k], b[k]) for k in a), name
        assert any(not torch.equal(a[k], c[k]) for k in a), name


# --- the tokenizer ------------------------------------------------------------------------------------

def test_tokenizer_takes_any_text_and_pads_left_to_the_length_asked():
    tokenizer = ltx2_build.build_tokenizer()
    texts = ["a red fox", "Füchse im Schnee, 雪の中の狐 🦊", "tabs\tand\nnewlines  "]
    for text in texts:
        ids = tokenizer(text).input_ids
        assert ids[0] == tokenizer.bos_token_id and max(ids) < 512 and tokenizer.unk_token_id not in ids
        assert tokenizer.decode(ids, skip_special_tokens=True) == text
    batch = tokenizer(texts, padding="max_length", max_length=40, truncation=True, return_tensors="pt")
    assert batch.input_ids.shape == batch.attention_mask.shape == (3, 40)
    for ids, mask in zip(batch.input_ids, batch.attention_mask, strict=True):
        pad = int((mask == 0).sum())
        assert (ids[:pad] == tokenizer.pad_token_id).all() and ids[pad] == tokenizer.bos_token_id
    assert tokenizer.model_max_length == 1024 and tokenizer.padding_side == "left"


def test_offline_the_tokenizer_builds_and_uncached_weights_are_one_clear_error(tmp_path):
    """A fresh process: huggingface_hub reads HF_HUB_OFFLINE once, at import; an empty HF_HOME means no cache."""
    code = ("from ltxbench.models import ltx2_build as b\n"
            "print(len(b.build_tokenizer()('héllo wörld 狐').input_ids))\n"
            "try:\n    b.build_pipeline('Lightricks/LTX-2.3', 'pretrained', 'cpu', 'bf16')\n"
            "except Exception as e:\n    print(type(e).__name__, e.exit_code); print(e.message); print(e.hint)\n")
    env = _env(HF_HUB_OFFLINE="1", HF_HOME=str(tmp_path / "hf"), HF_HUB_CACHE=str(tmp_path / "hf" / "hub"))
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=180)
    lines = proc.stdout.splitlines()
    assert len(lines) == 4 and int(lines[0]) > 5, proc.stdout + proc.stderr
    assert lines[1] == "EnvironmentProblem 4"
    cache = tmp_path / "hf" / "hub"
    assert lines[2] == (f"weights for 'Lightricks/LTX-2.3' are not in the Hugging Face cache ({cache}) and "
                        "HF_HUB_OFFLINE=1 forbids downloading them")
    assert "hf download Lightricks/LTX-2.3" in lines[3] and "--weights random" in lines[3]


# --- arguments and refusals ---------------------------------------------------------------------------

def test_tiny_has_no_pretrained_weights():
    with pytest.raises(UsageError, match="--model ltx2-tiny has no pretrained weights") as info:
        ltx2_build.build_pipeline("ltx2-tiny", "pretrained", "cpu", "fp32")
    assert "--weights random" in info.value.hint


@pytest.mark.parametrize("weights", ["pretrained", "random"])
def test_a_missing_directory_is_a_usage_error_naming_it(weights, tmp_path):
    missing = str(tmp_path / "no" / "such" / "pipeline")
    with pytest.raises(UsageError, match=f"--model {missing}: no such directory") as info:
        ltx2_build.build_pipeline(missing, weights, "cpu", "bf16")
    assert "ltx2-19b, ltx2-tiny" in info.value.hint


def test_a_pipeline_too_large_for_the_device_is_refused_before_allocating(monkeypatch):
    from ltxbench.memory import fit as memory

    monkeypatch.setattr(memory, "available", lambda device: (2**30, "the host has 1.0 GiB of RAM available"))
    with pytest.raises(EnvironmentProblem, match=r"ltx2-19b in bf16 needs about 6\d\.\d GiB for its weights alone"):
        ltx2_build.build_pipeline("ltx2-19b", "random", "cpu", "bf16")


def test_validate_video_args_accepts_valid_and_names_bad():
    for frames, h, w, steps in ((9, 64, 64, 2), (121, 512, 768, 30), (1, 64, 96, 2)):
        ltx2_build.validate_video_args(frames, h, w, steps)
    for args, needle in (((9, 64, 64, 1), "--steps 1 must be at least 2"), ((10, 64, 64, 2), "--num-frames 10"),
                         ((9, 32, 64, 2), "--height 32 is below LTX-2's minimum of 64"),
                         ((9, 64, 100, 2), "--width 100 is not a positive multiple of 32")):
        with pytest.raises(UsageError, match=needle):
            ltx2_build.validate_video_args(*args)


def test_importing_and_validating_needs_no_torch():
    code = ("import sys; from ltxbench.models import ltx2_build as b; b.validate_video_args(9, 64, 64, 2); "
            "print(*(m in sys.modules for m in ('torch', 'diffusers', 'transformers')))")
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=_env(), capture_output=True, text=True,
                          timeout=60)
    assert proc.stdout.split() == ["False", "False", "False"], proc.stdout + proc.stderr


def test_a_pipeline_too_large_for_the_gpu_is_offered_a_memory_budget(monkeypatch):
    """On a GPU, the refusal's hint offers --memory-budget at what the GPU has free (less a GiB for the context)."""
    from ltxbench.memory import fit as memory

    monkeypatch.setattr(memory, "available", lambda device: (int(47.5 * 2**30), "cuda:0 has 47.5 GiB free"))
    with pytest.raises(EnvironmentProblem) as info:
        ltx2_build.build_pipeline("ltx2-19b", "random", "cuda", "bf16")
    assert info.value.hint.startswith("use --memory-budget 46 (weights streamed from host memory), ")
