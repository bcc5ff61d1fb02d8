"""The LTX-2 family (ltxbench.models.ltx2) through the commands on the CPU: --model resolution, per-family defaults,
generate's mp4 with its audio track, bench e2e, profile and validation. The builder: tests/models/test_ltx2_build.py."""

from __future__ import annotations

import json
import re
import subprocess
import wave

import numpy as np
import pytest
from typer.testing import CliRunner

from ltxbench.cli import app
from ltxbench.inject import InjectionReport
from ltxbench.models import family_of, ltx2

runner = CliRunner()
TINY = ["--model", "ltx2-tiny", "--device", "cpu", "--num-frames", "9", "--height", "64", "--width", "64",
        "--steps", "2"]
E2E = ["bench", "e2e", *TINY, "--warmup-iterations", "1", "--repeats", "1"]
PHASES = ["text_encode", "denoise_step", "vae_decode", "audio_decode", "total"]
GUIDANCE = {"guidance_scale": 3.0, "stg_scale": 1.0, "modality_scale": 3.0, "guidance_rescale": 0.7,
            "audio_guidance_scale": 7.0, "audio_stg_scale": 1.0, "audio_modality_scale": 3.0}
RATE = 24000  # the vocoder's output rate


def _ffmpeg(*args: str) -> subprocess.CompletedProcess:
    import imageio_ffmpeg

    return subprocess.run([imageio_ffmpeg.get_ffmpeg_exe(), "-hide_banner", *args], capture_output=True, timeout=60)


def _audio_seconds(path) -> float:
    """The audio track decoded (as ffmpeg plays it: AAC priming trimmed): its length in seconds."""
    pcm = _ffmpeg("-i", str(path), "-map", "0:a", "-f", "s16le", "-ac", "2", "-ar", str(RATE), "-").stdout
    return len(pcm) / (2 * 2 * RATE)


# --- which family, which defaults -------------------------------------------------------------------

@pytest.mark.parametrize(("model", "title"), [
    ("ltx2-19b", "LTX-2"), ("ltx2-tiny", "LTX-2"), ("Lightricks/LTX-2", "LTX-2"), ("Lightricks/LTX-2.3", "LTX-2"),
    ("ltx-2b", "LTX-Video"), ("ltx-tiny", "LTX-Video"), ("Lightricks/LTX-Video", "LTX-Video"),
    ("llama-tiny", "LLM"),
    ("acme/video-model", "LTX-Video"),  # no family claims it: the default
])
def test_model_resolves_to_its_family(model, title):
    assert family_of(model).title == title


def test_help_says_whose_default_is_whose():
    from ltxbench.cli.options import declared

    num_frames = next(o for o in declared("generate") if o.name == "num_frames")
    assert num_frames.default is None and num_frames.help.endswith("(default: LTX-2 121, Wan 81, LTX-Video 161)")
    result = runner.invoke(app, ["generate", "--help"])
    assert result.exit_code == 0 and "(default: LTX-2 121, Wan 81, LTX-Video 161)" in " ".join(result.output.split())


@pytest.mark.parametrize("command", ["generate", "bench e2e"])
@pytest.mark.parametrize(("model", "expected"), [("ltx2-tiny", (121, 30, 24)), ("ltx-tiny", (161, 50, 25))])
def test_each_family_applies_its_own_default_where_the_command_line_has_none(command, model, expected):
    from ltxbench.cli.options import declared

    values = {o.name: o.default_for(command) for o in declared(command)}
    assert [values[name] for name in ("num_frames", "steps", "frame_rate")] == [None] * 3  # differ by family
    family = family_of(model)
    settings = family.settings(command, **{**values, "model": model, "weights": "random", "prompt": "x"})
    assert type(settings) is family.settings_class
    assert (settings.num_frames, settings.steps, settings.frame_rate) == expected


# --- generate: the mp4 with its audio track ----------------------------------------------------------

@pytest.fixture(scope="module")
def generated(tmp_path_factory):
    out = tmp_path_factory.mktemp("generate") / "fox.mp4"
    result = runner.invoke(app, ["generate", "--prompt", "a red fox in the snow", *TINY, "--output", str(out)])
    assert result.exit_code == 0, result.output
    return result, out


def test_generate_writes_h264_video_with_an_aac_stereo_track_and_every_phase(generated):
    result, out = generated
    streams = _ffmpeg("-i", str(out)).stderr.decode()
    video = next(line for line in streams.splitlines() if "Video:" in line)
    audio = next(line for line in streams.splitlines() if "Audio:" in line)
    assert "Video: h264" in video and re.search(r"\b64x64\b", video), video
    assert "Audio: aac" in audio and f"{RATE} Hz" in audio and "stereo" in audio, audio
    doc = json.loads(out.with_suffix(".json").read_text())
    assert [r["name"] for r in doc["records"]] == PHASES  # no peak memory on the CPU
    assert doc["run"]["config"]["weights"] == "random" and doc["run"]["config"]["num_frames"] == 9
    assert "audio decode" in result.output and "audio VAE + vocoder" in result.output


def test_the_mp4_keeps_every_frame_and_an_audio_track_as_long_as_the_video(generated):
    import imageio_ffmpeg

    _, out = generated
    assert imageio_ffmpeg.count_frames_and_secs(str(out))[0] == 9  # the mux copies the video whole
    assert abs(_audio_seconds(out) - 9 / 24) < 0.1  # num_frames / frame_rate; 0 where the audio were dropped


def test_the_wav_writer_converts_to_int16_exactly_and_clips(tmp_path):
    from ltxbench.cli.generate import _write_wav

    left = np.array([0.0, 0.25, -0.25, 1.0, -1.0, 1.5, -2.0, 3 / 32767], dtype=np.float32)
    _write_wav(tmp_path / "a.wav", np.stack([left, -left]), RATE)
    with wave.open(str(tmp_path / "a.wav"), "rb") as wav:
        assert (wav.getnchannels(), wav.getsampwidth(), wav.getframerate(), wav.getnframes()) == (2, 2, RATE, 8)
        samples = np.frombuffer(wav.readframes(8), dtype="<i2").reshape(8, 2).T  # interleaved L, R
    expected = [0, 8192, -8192, 32767, -32767, 32767, -32767, 3]
    assert samples[0].tolist() == expected and samples[1].tolist() == [-v for v in expected]


def _fake_generation(monkeypatch):
    """generate without the model: the writes are what the mux tests are about."""
    frames = [np.full((64, 64, 3), i / 10, dtype=np.float32) for i in range(9)]
    timings = {"text_encode_ms": 1.0, "step_ms": [2.0, 3.0], "vae_decode_ms": 4.0, "audio_decode_ms": 5.0,
               "total_ms": 15.0, "peak_memory_bytes": None}
    waveform = np.zeros((2, 9000), dtype=np.float32)
    monkeypatch.setattr(ltx2.LTX2Family, "build", lambda self, settings: object())
    monkeypatch.setattr(ltx2.LTX2Family, "generate", lambda self, *a, **k: (frames, timings, (waveform, RATE)))
    monkeypatch.setattr(ltx2.LTX2Family, "inject", lambda self, pipe, settings: InjectionReport("reference"))


@pytest.mark.parametrize(("failure", "reason"), [
    (subprocess.CalledProcessError(1, "ffmpeg", stderr="Unknown encoder 'aac'\n"), "Unknown encoder 'aac'"),
    (FileNotFoundError(2, "No such file or directory", "ffmpeg"), "No such file or directory"),
])
def test_a_failed_mux_is_one_line_exit_4_and_keeps_the_timings(failure, reason, monkeypatch, tmp_path):
    real = subprocess.run

    def mux_fails(cmd, *args, **kwargs):
        if "aac" in cmd:  # the mux; anything else runs
            raise failure
        return real(cmd, *args, **kwargs)

    _fake_generation(monkeypatch)
    monkeypatch.setattr(subprocess, "run", mux_fails)
    out = tmp_path / "fox.mp4"
    result = runner.invoke(app, ["generate", "--prompt", "x", *TINY, "--output", str(out)])
    assert result.exit_code == 4, result.output
    errors = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and errors[0].startswith(f"error: could not write {out}: ") and reason in errors[0]
    assert "Traceback" not in result.output and not out.exists()
    records = {r["name"]: r for r in json.loads(out.with_suffix(".json").read_text())["records"]}
    assert list(records) == PHASES and records["audio_decode"]["stats"]["median"] == 5.0
    assert records["denoise_step"]["stats"]["n"] == 2
    assert not list(tmp_path.glob(".ltxbench-mux-*"))


# --- bench e2e and profile -------------------------------------------------------------------------

def _names(records, config) -> set[str]:
    return {r["name"] for r in records if r["provider"] == config}


def test_bench_e2e_times_every_phase_of_both_configurations(tmp_path, captured, compile_calls):
    out = tmp_path / "e2e.json"
    result = runner.invoke(app, [*E2E, "--configs", "baseline,compile", "--output", str(out)])
    assert result.exit_code == 0, result.output
    records = json.loads(out.read_text())["records"]
    assert _names(records, "baseline") == set(PHASES) and _names(records, "compile") == {*PHASES, "compile"}
    assert all(r["params"][name] == value for r in records for name, value in GUIDANCE.items())
    transformer = captured["target"].transformer
    assert compile_calls == [(transformer, "default")] and transformer._compiled_call_impl is None


def test_optimized_reports_its_rules_and_still_writes(tmp_path):
    """The optimized configuration runs LTX-2's rules (fused blocks, fused projections, the text keys/values once per
    generation) and says so."""
    from ltxbench.inject.fuse import MOVES_RULE
    from ltxbench.inject.ltx2 import (
        BLOCK_RULE,
        GENERATION_RULE,
        PROJECTION_RULE,
        PROJECTIONS_RULE,
        STG_RULE,
        TEXT_KV_RULE,
        TEXT_MASK_RULE,
    )

    out = tmp_path / "o.json"
    result = runner.invoke(app, [*E2E, "--configs", "optimized", "--phase", "transformer", "--output", str(out)])
    assert result.exit_code == 0, result.output
    assert "applied nothing" not in result.output
    doc = json.loads(out.read_text())
    injection = doc["run"]["config"]["injection"]["optimized"]
    assert injection["applied"] is True
    rules = injection["rules"]
    text_encoder = {rule: rules.pop(rule) for rule in list(rules) if rule.startswith("text_encoder: ")}
    assert rules == {TEXT_KV_RULE: 4, PROJECTION_RULE: 2, GENERATION_RULE: 1, BLOCK_RULE: 2,
                     PROJECTIONS_RULE: 8, STG_RULE: 1, TEXT_MASK_RULE: 1, MOVES_RULE: 8}  # each fused set follows .to()
    assert text_encoder["text_encoder: gemma mlp: fused gate_up projection + geglu (tanh GELU)"] == 2  # its layers
    assert _names(doc["records"], "optimized") == {"denoise_step", "total"}


@pytest.mark.slow
def test_profile_marks_each_phase_in_the_trace(tmp_path):
    out = tmp_path / "prof.json"
    result = runner.invoke(app, ["profile", *TINY, "--configs", "baseline", "--output", str(out)])
    assert result.exit_code == 0, result.output
    doc = json.loads(out.read_text())
    assert doc["kind"] == "profile"
    events = json.loads(open(doc["run"]["config"]["traces"]["baseline"]).read())["traceEvents"]
    assert {"text_encode", "denoise", "vae_decode", "audio_decode"} <= {e.get("name") for e in events}


# --- refusals (exit 2, nothing written) -------------------------------------------------------------

@pytest.mark.parametrize("command", [["generate", "--prompt", "x"], ["bench", "e2e"]])
@pytest.mark.parametrize(("extra", "needle"), [
    (["--height", "32"], "--height 32 is below LTX-2's minimum of 64"),
    (["--stg-scale", "-1"], "--stg-scale -1.0 must not be negative"),
    (["--num-frames", "10"], "--num-frames 10"),
    (["--weights", "pretrained"], "--model ltx2-tiny has no pretrained weights"),
])
def test_bad_arguments_exit_2(command, extra, needle, tmp_path):
    out = tmp_path / ("v.mp4" if command[0] == "generate" else "r.json")
    result = runner.invoke(app, [*command, *TINY, *extra, "--output", str(out)])
    assert result.exit_code == 2, result.output
    assert needle in result.output
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("command", [["bench", "e2e"], ["profile"]])
def test_cuda_graph_compile_modes_are_refused_for_the_whole_model(command, tmp_path):
    """The whole-model compile of LTX-2 under CUDA graphs is untested: the modes that replay them are refused there,
    before anything loads."""
    out = tmp_path / "r.json"
    result = runner.invoke(app, [*command, *TINY, "--compile-mode", "reduce-overhead", "--compile-scope", "model",
                                 "--output", str(out)])
    assert result.exit_code == 2, result.output
    assert "--compile-mode reduce-overhead (CUDA graphs) is not supported here" in result.output
    assert not list(tmp_path.iterdir())


@pytest.mark.slow
def test_cuda_graph_compile_modes_run_regionally(tmp_path, captured, compile_calls):
    """Regional compile (LTX-2's default scope) runs under CUDA graphs (bench.e2e.compile_module opens one graph
    step per transformer call; tests/inject/test_inject_ltx2_gpu.py checks the latents on the GPU)."""
    out = tmp_path / "r.json"
    result = runner.invoke(app, ["bench", "e2e", *TINY, "--configs", "compile", "--compile-mode", "reduce-overhead",
                                 "--output", str(out)])
    assert result.exit_code == 0, result.output
    assert [mode for _, mode in compile_calls] == ["reduce-overhead"] and compile_calls.scopes == ["regional"]
