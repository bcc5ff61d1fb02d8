"""`ltxbench generate`: one LTX-Video / LTX-2 / Wan text-to-video (or, with --image, image-to-video) run, timed per
phase, written as mp4 + result JSON.

Only typer and the standard library at top level; torch/diffusers load inside the command, after the
arguments have been validated (exit 2 never waits for a model).
"""

from __future__ import annotations

import contextlib
from pathlib import Path

from ltxbench.cli.options import command_line, takes_options

EXAMPLES = (
    "Examples:\n\n"
    '  ltxbench generate --prompt "a red fox in the snow" --weights random --num-frames 49\n\n'
    '  ltxbench generate --prompt "waves at dusk" --model Lightricks/LTX-Video --compile --output waves.mp4\n\n'
    '  ltxbench generate --prompt "the fox runs off" --image fox.png --weights random --num-frames 49   '
    "(image-to-video)\n\n"
    '  ltxbench generate --prompt "test" --model ltx-tiny --weights random --device cpu '
    "--num-frames 9 --height 64 --width 64 --steps 2\n\n"
    '  ltxbench generate --prompt "a red fox in the snow" --model ltx2-19b --gpus 4 --parallel cfg+ulysses   '
    "(4 GPUs; only rank 0 prints and writes)"
)

@takes_options("generate")
def generate_command(**values) -> None:
    """Generate a video (LTX-Video, LTX-2, Wan; from a first frame with --image) and time text encode, every denoising
    step and the decodes."""
    from ltxbench.cli import _parallel
    from ltxbench.cli._validate import (
        attention_installed,
        check_outputs,
        known_model,
        memory_budget,
        model_and_weights,
        not_a_folder,
        prompt_text,
        require_mp4_writer,
        runtime,
    )
    from ltxbench.cli.options import refuse_foreign
    from ltxbench.errors import NoCudaDevice, UsageError
    from ltxbench.models import family_of

    # --- validation: nothing heavy is imported before this passes ---------------------------------------
    known_model(values["model"], values["weights"])
    family = family_of(values["model"])
    if not family.makes_video:
        raise UsageError(f"--model {values['model']} is an {family.title}: generate makes videos",
                         hint="time it with `ltxbench bench e2e` or `ltxbench profile`")
    refuse_foreign("generate", family, values["model"])
    prompt_text("--prompt", values["prompt"])
    prompt_text("--negative-prompt", values["negative_prompt"])
    values["weights"] = model_and_weights(values["model"], values["weights"])
    values["kernel_provider"], values["dtype"] = runtime(
        values["device"], values["kernel_provider"], values["dtype"], kernels_used=values["use_optimized_kernels"],
        cpu_hint="use --kernel-provider reference or --no-optimized-kernels on the CPU")
    settings = family.settings("generate", **values)
    family.validate(settings, "generate")
    if settings.precision != "bf16" and not values["use_optimized_kernels"]:
        raise UsageError(f"--precision {settings.precision} applies to our kernels: drop --no-optimized-kernels")
    memory_budget(family, settings, values["cpu_offload"])
    attention_installed(family, settings)
    if settings.device == "cpu" and values["cpu_offload"]:
        raise UsageError("--cpu-offload needs --device cuda")
    if settings.gpus > 1 and values["cpu_offload"]:
        raise UsageError(f"--cpu-offload runs on one GPU: drop it, or --gpus {settings.gpus}")
    not_a_folder("--output", values["output"], "out.mp4")
    output = Path(values["output"])
    if output.suffix.lower() != ".mp4":
        raise UsageError(f"--output {output} must end in .mp4 (the result JSON is written beside it)")
    json_path = output.with_suffix(".json")
    force = values["force"]
    check_outputs((output, json_path, json_path.with_suffix(".csv")), force)
    require_mp4_writer(output, audio="audio_decode" in family.decodes)
    settings.parallel = _parallel.split_or_relaunch(family, settings.gpus, settings.parallel, settings.device)

    import torch

    if settings.device == "cuda" and not torch.cuda.is_available():
        raise NoCudaDevice("`ltxbench generate --device cuda`")
    with _parallel.joined(settings.parallel, settings.device) as world:
        _run(family, settings, values, output, world)


def _run(family, settings, values: dict, output: Path, world) -> None:
    """Build, patch, generate, then (rank 0, once every rank has finished) write the mp4 and the result."""
    from ltxbench.cli import _memory, _parallel
    from ltxbench.cli._console import console
    from ltxbench.errors import EnvironmentProblem
    from ltxbench.memory.apply import placement_of
    from ltxbench.parallel.launch import current_world
    from ltxbench.results.schema import utc_now

    json_path, force = output.with_suffix(".json"), values["force"]
    err = _parallel.quiet_unless_main(console(stderr=True))
    chosen = settings.memory_budget_gib is not None
    plan = _memory.planned(family, settings, lambda text: err.print(text, markup=False),
                           fit_free=not values["cpu_offload"])
    started_at = utc_now()
    with err.status(f"building {settings.model} ({settings.weights} weights, {settings.dtype}, {settings.device})"):
        pipe = _memory.build(family, settings, plan)

    if values["use_optimized_kernels"]:
        if settings.kernel_provider == "cuda":
            from ltxbench import ops

            ops.gemm_tuning(values["gemm_search"])  # before the first step: the search happens at a shape's first call
        injection = family.inject_placed(pipe, settings).as_dict()
        if not injection.get("applied"):
            from rich.markup import escape

            reasons = [s["reason"] for s in injection.get("skipped", ())] or ["kernel injection not applied"]
            err.print(f"[yellow]warning:[/] {escape(injection.get('reason', reasons[0]))}; "
                      "running diffusers' own modules")
    else:
        injection = {"applied": False, "reason": "disabled by --no-optimized-kernels"}
    attention = family.set_attention(pipe, settings, lambda text: err.print(text, markup=False))
    if current_world() is not None:
        family.parallelize(pipe, settings)
    if values["compile"]:  # regional for the families whose default it is (LTX-2: the whole model compiles too long)
        for module in family.compiled_modules(pipe):  # each denoiser (Wan 2.2 A14B: both experts)
            module.compile_repeated_blocks() if settings.compile_scope == "regional" else module.compile()
    if values["cpu_offload"]:
        pipe.enable_model_cpu_offload(device=settings.device)

    frames, timings, audio = _generate(family, pipe, settings)
    finished_at = utc_now()
    described = _parallel.finished(world)
    if world is not None and not world.main:
        return

    config = {**settings.as_args(), **{k: values[k] for k in ("use_optimized_kernels", "compile", "cpu_offload",
                                                                 "gemm_search")},
              "negative_prompt": settings.negative_prompt, "output": str(output)}
    if attention is not None:
        config["attention"] = attention
    if described is not None:
        config["parallel"] = described
    if placement_of(pipe) is not None:
        config["memory"] = {**placement_of(pipe).as_dict(), "budget_from": "--memory-budget" if chosen else
                            "the GPU's free memory (the whole pipeline did not fit)"}
    argv = command_line("generate", {**values, "parallel": settings.parallel, "force": force})
    doc = _result(config, timings, injection, argv, settings.seed, started_at, finished_at)

    video_error, json_written = _write_outputs(frames, audio, doc, output, json_path, settings.frame_rate, force)
    _print_summary(timings, output if video_error is None else None, json_written)
    if video_error is not None:
        muxing = video_error.startswith("ffmpeg could not mux")
        raise EnvironmentProblem(f"could not write {output}: {video_error} (timings were saved to {json_written})",
                                 hint="imageio-ffmpeg's ffmpeg needs its AAC encoder for the audio track"
                                 if muxing else "install imageio-ffmpeg (pip install imageio-ffmpeg) or opencv")


def _generate(family, pipe, settings):
    """The family's generation with a progress bar of its denoising steps (on stderr, gone when done)."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from ltxbench.cli._parallel import quiet_unless_main

    bar = Progress(TextColumn("denoising"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                   console=quiet_unless_main(Console(stderr=True)), transient=True)
    with bar:
        task = bar.add_task("denoising", total=settings.steps)
        return family.generate(pipe, settings, on_step=lambda: bar.advance(task))


def _write_outputs(frames, audio, doc: dict, output: Path, json_path: Path, fps: int, force: bool):
    """The mp4, then the result JSON + CSV: (the mp4's error text or None, the JSON's path). A write refused late
    (the folders were checked before the run; a mount can still be read-only, full or gone) is one line, exit 2
    or 4, and takes back what this call created: folders, and the mp4 when the result cannot follow it."""
    from ltxbench.errors import LtxbenchError, output_problem
    from ltxbench.results.io import write_result

    created = [folder for folder in (output.parent, *output.parent.parents) if not folder.exists()]
    existed = output.exists()
    try:
        output.parent.mkdir(parents=True, exist_ok=True)
        video_error = _export(frames, audio, output, fps, force)
        json_written, _ = write_result(doc, output=json_path, force=force)
    except (OSError, LtxbenchError, KeyboardInterrupt) as exc:  # interrupted too: nothing of this call left
        if not existed:
            output.unlink(missing_ok=True)
        for folder in created:  # innermost first; only the ones left empty
            with contextlib.suppress(OSError):
                folder.rmdir()
        if isinstance(exc, OSError):
            raise output_problem(exc.filename or output, exc) from exc
        raise
    return video_error, json_written


def _export(frames, audio, output: Path, fps: int, force: bool) -> str | None:
    """Write the mp4 (outside every timing), with the audio track when the model made one ((waveform (channels, n),
    sample rate): muxed as AAC by imageio-ffmpeg's ffmpeg); return an error text instead of raising, so timings
    still get saved."""
    import subprocess
    import tempfile

    from diffusers.utils import export_to_video

    from ltxbench.errors import UsageError

    if output.exists() and not force:  # a concurrent run may have written it meanwhile
        raise UsageError(f"{output} already exists; not overwriting it", hint="pass --force to overwrite")
    # written beside it under another name, then renamed: an interrupted or failed write leaves no partial mp4
    partial = output.with_name(f".{output.stem}.partial{output.suffix}")
    try:
        if audio is None:
            export_to_video(frames, str(partial), fps=fps)
        else:
            import imageio_ffmpeg

            with tempfile.TemporaryDirectory(dir=output.parent, prefix=".ltxbench-mux-") as work:
                silent, wav = Path(work) / "video.mp4", Path(work) / "audio.wav"
                export_to_video(frames, str(silent), fps=fps)
                waveform, rate = audio  # no longer than the video: the mux copies the video stream as it is
                _write_wav(wav, waveform[:, :round(len(frames) / fps * rate)], rate)
                subprocess.run([imageio_ffmpeg.get_ffmpeg_exe(), "-loglevel", "error", "-y", "-i", str(silent), "-i",
                                str(wav), "-c:v", "copy", "-c:a", "aac", "-b:a", "192k", "-f", "mp4", str(partial)],
                               check=True, capture_output=True, text=True)
        partial.replace(output)
    except subprocess.CalledProcessError as exc:
        return f"ffmpeg could not mux the audio: {((exc.stderr or '').strip().splitlines() or [exc.returncode])[-1]}"
    except (ImportError, AttributeError, RuntimeError, OSError) as exc:
        return f"{type(exc).__name__}: {exc}".splitlines()[0]
    finally:
        partial.unlink(missing_ok=True)
    return None


def _write_wav(path: Path, waveform, rate: int) -> None:
    """(channels, n) float samples in [-1, 1] as a 16-bit PCM WAV file."""
    import wave

    import numpy as np

    pcm = (np.clip(waveform, -1.0, 1.0) * 32767).round().astype("<i2")
    with wave.open(str(path), "wb") as out:
        out.setnchannels(pcm.shape[0])
        out.setsampwidth(2)
        out.setframerate(int(rate))
        out.writeframes(pcm.T.tobytes())


def _result(config: dict, timings: dict, injection: dict, argv, seed, started_at, finished_at) -> dict:
    from ltxbench.configurations import MEMORY_BUDGET
    from ltxbench.results.schema import make_record, make_result, stats_from_samples

    provider = injection.get("provider", "diffusers") if injection.get("applied") else "diffusers"
    params = {k: config.get(k) for k in ("model", "weights", "device", "num_frames", "height", "width", "steps",
                                         "guidance_scale", "compile", "attention_backend", "cpu_offload")}
    if config.get("image") is not None:  # image-to-video; text-to-video records stay as they were
        params["image"] = config["image"]
    if config.get(MEMORY_BUDGET) is not None:  # --memory-budget; records without it stay as they were
        params[MEMORY_BUDGET] = config[MEMORY_BUDGET]
    if "parallel" in config:  # over several GPUs; one-GPU records stay as they were
        params["gpus"], params["parallel"] = config["gpus"], config["parallel"]["split"]

    fp8 = injection.get("applied") and config.get("precision", "bf16") != "bf16"
    dtype = config["precision"] if fp8 else config["dtype"]  # what the projections (and attention) ran in
    if fp8 and config.get("fp8_accumulation") == "fast":  # as bench e2e records it (older files: fp32)
        params["fp8_accumulation"] = "fast"

    def record(name, samples, metric="time", unit="ms", derived=None):
        return make_record(name, provider, dtype, params, metric, unit, "lower", stats_from_samples(samples),
                           derived=derived)

    steps = timings["step_ms"]
    decodes = [key.removesuffix("_ms") for key in timings if key.endswith("_decode_ms")]  # video, audio
    records = [record("text_encode", [timings["text_encode_ms"]]),
               record("denoise_step", steps, derived={"first_step_ms": steps[0], "denoise_total_ms": sum(steps)}),
               *(record(name, [timings[f"{name}_ms"]]) for name in decodes),
               record("total", [timings["total_ms"]])]
    if timings.get("peak_memory_bytes") is not None:
        records.append(record("peak_memory", [timings["peak_memory_bytes"]], metric="peak_memory", unit="bytes"))
    doc = make_result(kind="generate", argv=list(argv), config=config, seed=seed, started_at=started_at,
                      finished_at=finished_at, records=records)
    doc["injection"] = injection
    return doc


def _print_summary(timings: dict, video: Path | None, json_path: Path) -> None:
    import statistics

    from rich.table import Table

    from ltxbench.cli._console import console

    steps = timings["step_ms"]
    table = Table(title="ltxbench generate")
    table.add_column("phase", no_wrap=True)
    table.add_column("ms", justify="right")
    table.add_column("note")
    table.add_row("text encode", f"{timings['text_encode_ms']:.1f}", "")
    table.add_row(f"denoise ({len(steps)} steps)", f"{sum(steps):.1f}",
                  f"median {statistics.median(steps):.1f} ms/step, first {steps[0]:.1f}")
    for key in (k for k in timings if k.endswith("_decode_ms")):
        table.add_row(key.removesuffix("_ms").replace("_", " "), f"{timings[key]:.1f}",
                      "audio VAE + vocoder" if key.startswith("audio") else "")
    table.add_row("total", f"{timings['total_ms']:.1f}", "video encoding excluded")
    if timings.get("peak_memory_bytes") is not None:
        table.add_row("peak memory", f"{timings['peak_memory_bytes'] / 2**30:.2f} GiB", "max_memory_allocated")
    out = console()
    out.print(table)
    out.print(f"video: {video if video else 'not written'} · result: {json_path}", markup=False)
