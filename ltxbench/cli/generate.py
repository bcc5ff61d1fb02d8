"""`ltxbench generate`: one LTX-Video text-to-video run, timed per phase, written as mp4 + result JSON.

Only typer and the standard library at top level; torch/diffusers load inside the command, after the
arguments have been validated (exit 2 never waits for a model).
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import typer

EXAMPLES = (
    "Examples:\n\n"
    '  ltxbench generate --prompt "a red fox in the snow" --weights random --num-frames 49\n\n'
    '  ltxbench generate --prompt "waves at dusk" --model Lightricks/LTX-Video --compile --output waves.mp4\n\n'
    '  ltxbench generate --prompt "test" --model ltx-tiny --weights random --device cpu '
    "--num-frames 9 --height 64 --width 64 --steps 2"
)

_PHASES = (("text_encode", "text_encode_ms"), ("vae_decode", "vae_decode_ms"), ("total", "total_ms"))


def generate_command(
    prompt: str = typer.Option(..., "--prompt", help="Text prompt."),
    negative_prompt: str = typer.Option(None, "--negative-prompt", help="Negative prompt (used when guidance > 1)."),
    num_frames: int = typer.Option(161, "--num-frames", help="Frames, 8k+1."),
    height: int = typer.Option(512, "--height", help="Height in pixels, a multiple of 32."),
    width: int = typer.Option(768, "--width", help="Width in pixels, a multiple of 32."),
    steps: int = typer.Option(50, "--steps", help="Denoising steps (at least 2)."),
    guidance_scale: float = typer.Option(3.0, "--guidance-scale", help="Classifier-free guidance (> 1 enables CFG)."),
    seed: int = typer.Option(42, "--seed", help="Seed of the initial noise."),
    fps: int = typer.Option(24, "--fps", help="Frame rate of the mp4 (and of LTX's RoPE conditioning)."),
    output: str = typer.Option("out.mp4", "--output", help="mp4 path; the result JSON goes beside it."),
    force: bool = typer.Option(False, "--force", help="Overwrite an existing mp4/JSON."),
    model: str = typer.Option("Lightricks/LTX-Video", "--model",
                              help="ltx-2b, ltx-13b, ltx-tiny, a hub id or a local pipeline directory."),
    weights: str = typer.Option(None, "--weights", help="pretrained | random (built from the package's configs; "
                                "the default for ltx-tiny, which has no pretrained weights)."),
    use_optimized_kernels: bool = typer.Option(True, "--use-optimized-kernels/--no-optimized-kernels",
                                               help="Inject ltxbench kernels into the transformer."),
    compile_: bool = typer.Option(False, "--compile", help="torch.compile the transformer (step 0 includes it)."),
    gemm_search: bool = typer.Option(False, "--gemm-search/--no-gemm-search",
                                     help="With our kernels: time cuBLASLt's algorithms for each projection shape on "
                                          "its first use (10-55 s in step 0 for LTX-2B on an H100, then ~6% less "
                                          "step time) and store them for this GPU model; off, the projections run "
                                          "stored choices (from bench e2e or an earlier --gemm-search), else "
                                          "cuBLASLt's heuristic pick, as torch."),
    attention_backend: str = typer.Option(None, "--attention-backend",
                                          help="diffusers attention backend, e.g. native, _native_cudnn."),
    cpu_offload: bool = typer.Option(False, "--cpu-offload", help="enable_model_cpu_offload (after injection)."),
    device: str = typer.Option("cuda", "--device", help="cuda | cpu."),
    kernel_provider: str = typer.Option(None, "--kernel-provider",
                                        help="cuda | reference (default: cuda on cuda, reference on cpu)."),
    dtype: str = typer.Option(None, "--dtype", help="bf16 | fp16 | fp32 (default: bf16 on cuda, fp32 on cpu)."),
) -> None:
    """Generate a video with LTX-Video and time text encode, every denoising step and VAE decode."""
    from ltxbench.cli._validate import check_outputs, model_and_weights, prompt_text, runtime
    from ltxbench.errors import EnvironmentProblem, NoCudaDevice, UsageError
    from ltxbench.models.ltx import validate_video_args

    # --- validation: nothing heavy is imported before this passes ---------------------------------------
    prompt_text("--prompt", prompt)
    prompt_text("--negative-prompt", negative_prompt)
    validate_video_args(num_frames, height, width, steps)
    if fps < 1:
        raise UsageError(f"--fps {fps} must be at least 1")
    if guidance_scale < 0:
        raise UsageError(f"--guidance-scale {guidance_scale} must not be negative")
    weights = model_and_weights(model, weights)
    provider, dtype = runtime(device, kernel_provider, dtype, kernels_used=use_optimized_kernels,
                              cpu_hint="use --kernel-provider reference or --no-optimized-kernels on the CPU")
    if device == "cpu" and cpu_offload:
        raise UsageError("--cpu-offload needs --device cuda")
    output = Path(output)
    if output.suffix.lower() != ".mp4":
        raise UsageError(f"--output {output} must end in .mp4 (the result JSON is written beside it)")
    json_path = output.with_suffix(".json")
    check_outputs((output, json_path, json_path.with_suffix(".csv")), force)

    import torch

    if device == "cuda" and not torch.cuda.is_available():
        raise NoCudaDevice("`ltxbench generate --device cuda`")

    from ltxbench.cli._console import console
    from ltxbench.models.ltx import build_pipeline, inject_kernels, run_generate, torch_dtype
    from ltxbench.results.schema import utc_now

    err = console(stderr=True)
    started_at = utc_now()
    with err.status(f"building {model} ({weights} weights, {dtype}, {device})"):
        pipe = build_pipeline(model, weights, device, torch_dtype(dtype))

    if use_optimized_kernels:
        if provider == "cuda":
            from ltxbench import ops

            ops.gemm_tuning(gemm_search)  # before the first step: the search happens at a shape's first call
        injection = inject_kernels(pipe, provider)
        if not injection.get("applied"):
            err.print(f"[yellow]warning:[/] {injection.get('reason', 'kernel injection not applied')}; "
                      "running diffusers' own modules")
    else:
        injection = {"applied": False, "reason": "disabled by --no-optimized-kernels"}
    if attention_backend:
        _set_attention_backend(pipe, attention_backend)
    if compile_:
        pipe.transformer.compile()
    if cpu_offload:
        pipe.enable_model_cpu_offload(device=device)

    frames, timings = run_generate(pipe, prompt, negative_prompt, num_frames, height, width, steps,
                                   guidance_scale, seed, progress=True, frame_rate=fps)
    finished_at = utc_now()

    config = {"model": model, "weights": weights, "device": device, "dtype": dtype, "num_frames": num_frames,
              "height": height, "width": width, "steps": steps, "guidance_scale": guidance_scale, "fps": fps,
              "prompt": prompt, "negative_prompt": negative_prompt, "use_optimized_kernels": use_optimized_kernels,
              "kernel_provider": provider, "compile": compile_, "attention_backend": attention_backend,
              "cpu_offload": cpu_offload, "gemm_search": gemm_search, "output": str(output)}
    doc = _result(config, timings, injection, _argv(config, seed, force), seed, started_at, finished_at)

    video_error, json_written = _write_outputs(frames, doc, output, json_path, fps, force)
    _print_summary(timings, output if video_error is None else None, json_written)
    if video_error is not None:
        raise EnvironmentProblem(f"could not write {output}: {video_error} (timings were saved to {json_written})",
                                 hint="install imageio-ffmpeg (pip install imageio-ffmpeg) or opencv")


def _argv(config: dict, seed: int, force: bool) -> list[str]:
    """The canonical command line that reproduces this run (as bench micro records it)."""
    argv = ["ltxbench", "generate", "--prompt", config["prompt"]]
    if config["negative_prompt"] is not None:
        argv += ["--negative-prompt", config["negative_prompt"]]
    for key in ("num_frames", "height", "width", "steps", "guidance_scale", "fps", "output", "model", "weights",
                "device", "kernel_provider", "dtype"):
        argv += [f"--{key.replace('_', '-')}", str(config[key])]
    argv += ["--seed", str(seed)]
    argv += [] if config["use_optimized_kernels"] else ["--no-optimized-kernels"]
    argv += ["--attention-backend", config["attention_backend"]] if config["attention_backend"] else []
    argv += [flag for flag, on in (("--compile", config["compile"]), ("--cpu-offload", config["cpu_offload"]),
                                   ("--gemm-search", config.get("gemm_search")), ("--force", force)) if on]
    return argv


def _set_attention_backend(pipe, name: str) -> None:
    from diffusers.models.attention_dispatch import AttentionBackendName

    from ltxbench.errors import EnvironmentProblem, UsageError

    names = sorted(b.value for b in AttentionBackendName)
    if name.lower() not in names:
        raise UsageError(f"--attention-backend {name!r} is not a diffusers backend", hint=f"one of {', '.join(names)}")
    try:
        pipe.transformer.set_attention_backend(name.lower())
    except (RuntimeError, ImportError) as exc:
        raise EnvironmentProblem(f"attention backend {name!r} is not usable here: {exc}") from exc


def _write_outputs(frames, doc: dict, output: Path, json_path: Path, fps: int, force: bool):
    """The mp4, then the result JSON + CSV: (the mp4's error text or None, the JSON's path). A write refused late
    (the folders were checked before the run; a mount can still be read-only, full or gone) is one line, exit 2
    or 4, and takes back what this call created: folders, and the mp4 when the result cannot follow it."""
    from ltxbench.errors import LtxbenchError, output_problem
    from ltxbench.results.io import write_result

    created = [folder for folder in (output.parent, *output.parent.parents) if not folder.exists()]
    existed = output.exists()
    try:
        output.parent.mkdir(parents=True, exist_ok=True)
        video_error = _export(frames, output, fps, force)
        json_written, _ = write_result(doc, output=json_path, force=force)
    except (OSError, LtxbenchError) as exc:
        if not existed:
            output.unlink(missing_ok=True)
        for folder in created:  # innermost first; only the ones left empty
            with contextlib.suppress(OSError):
                folder.rmdir()
        if isinstance(exc, OSError):
            raise output_problem(exc.filename or output, exc) from exc
        raise
    return video_error, json_written


def _export(frames, output: Path, fps: int, force: bool) -> str | None:
    """Write the mp4 (outside every timing); return an error text instead of raising, so timings still get saved."""
    from diffusers.utils import export_to_video

    from ltxbench.errors import UsageError

    if output.exists() and not force:  # a concurrent run may have written it meanwhile
        raise UsageError(f"{output} already exists; not overwriting it", hint="pass --force to overwrite")
    try:
        export_to_video(frames, str(output), fps=fps)
    except (ImportError, AttributeError, RuntimeError, OSError) as exc:
        return f"{type(exc).__name__}: {exc}".splitlines()[0]
    return None


def _result(config: dict, timings: dict, injection: dict, argv, seed, started_at, finished_at) -> dict:
    from ltxbench.results.schema import make_record, make_result, stats_from_samples

    provider = injection.get("provider", "diffusers") if injection.get("applied") else "diffusers"
    params = {k: config[k] for k in ("model", "weights", "device", "num_frames", "height", "width", "steps",
                                     "guidance_scale", "compile", "attention_backend", "cpu_offload")}

    def record(name, samples, metric="time", unit="ms", derived=None):
        return make_record(name, provider, config["dtype"], params, metric, unit, "lower",
                           stats_from_samples(samples), derived=derived)

    steps = timings["step_ms"]
    records = [record("text_encode", [timings["text_encode_ms"]]),
               record("denoise_step", steps, derived={"first_step_ms": steps[0], "denoise_total_ms": sum(steps)}),
               record("vae_decode", [timings["vae_decode_ms"]]),
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
    table.add_row("vae decode", f"{timings['vae_decode_ms']:.1f}", "")
    table.add_row("total", f"{timings['total_ms']:.1f}", "video encoding excluded")
    if timings.get("peak_memory_bytes") is not None:
        table.add_row("peak memory", f"{timings['peak_memory_bytes'] / 2**30:.2f} GiB", "max_memory_allocated")
    out = console()
    out.print(table)
    out.print(f"video: {video if video else 'not written'} · result: {json_path}", markup=False)
