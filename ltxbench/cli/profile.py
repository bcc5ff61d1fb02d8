"""`ltxbench profile`: torch.profiler over a few denoising steps (LTX) or prefill + decode (LLM), time per kernel
family per configuration, the top kernels, a chrome trace per configuration and a result JSON (kind "profile").

Only typer and the standard library at top level; torch/diffusers/transformers load after validation.
"""

from __future__ import annotations

import typer

EXAMPLES = (
    "Examples:\n\n"
    "  ltxbench profile --model ltx-2b --weights random --configs baseline,optimized --steps 2 "
    "--phase transformer --num-frames 49\n\n"
    "  ltxbench profile --model llama-3-8b --weights random --configs baseline --prompt-length 2048\n\n"
    "  ltxbench profile --model ltx-tiny --weights random --device cpu --kernel-provider reference "
    "--num-frames 9 --height 64 --width 64\n\n"
    "Time is kernel (device) time on CUDA and op self CPU time on the CPU. Chrome traces go to --trace-dir "
    "(default: beside the result JSON); open them in chrome://tracing or https://ui.perfetto.dev.\n\n"
    "Exit codes: 0 ok, 2 bad arguments, 4 no GPU / OOM / no weights."
)


def profile_command(
    model: str = typer.Option("ltx-2b", "--model", help="ltx-2b, ltx-13b, ltx-tiny, llama-3-8b, mistral-7b, qwen2-7b, "
                              "qwen3-8b, llama-tiny, smollm2-135m, a hub id or a local path."),
    weights: str = typer.Option(None, "--weights", help="pretrained | random (built from the package's configs; "
                                "the default for ltx-tiny and llama-tiny, which have no pretrained weights)."),
    configs: str = typer.Option(None, "--configs", help="Comma-separated: baseline, optimized, compile, "
                                "optimized+compile (default: baseline,optimized; LLMs without injection: baseline)."),
    steps: int = typer.Option(2, "--steps", help="Denoising steps profiled (LTX, at least 2)."),
    phase: str = typer.Option("all", "--phase", help="all (encode + denoise + decode) | transformer (loop only)."),
    top: int = typer.Option(20, "--top", help="Kernels listed (and recorded) per configuration."),
    trace_dir: str = typer.Option(None, "--trace-dir", help="Chrome traces (default: beside the result JSON)."),
    device: str = typer.Option("cuda", "--device", help="cuda | cpu."),
    kernel_provider: str = typer.Option(None, "--kernel-provider",
                                        help="cuda | reference (default: cuda on cuda, reference on cpu)."),
    dtype: str = typer.Option(None, "--dtype", help="bf16 | fp16 | fp32 (default: bf16 on cuda, fp32 on cpu)."),
    num_frames: int = typer.Option(161, "--num-frames", help="Frames, 8k+1 (LTX)."),
    height: int = typer.Option(512, "--height", help="Height, a multiple of 32 (LTX)."),
    width: int = typer.Option(768, "--width", help="Width, a multiple of 32 (LTX)."),
    batch_size: int = typer.Option(1, "--batch-size", help="Videos per prompt (LTX) / sequences (LLM)."),
    prompt_length: int = typer.Option(512, "--prompt-length", help="LLM prefill length."),
    new_tokens: int = typer.Option(8, "--new-tokens", help="LLM decode steps profiled."),
    seed: int = typer.Option(42, "--seed", help="Seed of weights, noise and token ids."),
    guidance_scale: float = typer.Option(3.0, "--guidance-scale", help="CFG scale (> 1 doubles the batch)."),
    output: str = typer.Option(None, "--output", "-o", help="Result JSON (CSV beside it); default results/runs/."),
    force: bool = typer.Option(False, "--force", help="Overwrite --output and the traces if they exist."),
    compile_mode: str = typer.Option("default", "--compile-mode",
                                     help="torch.compile mode of the compile configs (as in bench e2e)."),
) -> None:
    """Profile whole models per configuration: time per kernel family, top kernels, chrome traces."""
    from pathlib import Path

    from ltxbench.bench.e2e import PHASES, parse_configs
    from ltxbench.bench.e2e_llm import is_llm
    from ltxbench.cli._validate import check_outputs, choice, compile_mode_choice, model_and_weights, runtime
    from ltxbench.errors import NoCudaDevice, UsageError
    from ltxbench.models.ltx import validate_video_args
    from ltxbench.results.io import default_path, result_paths

    # --- validation: nothing heavy is imported before this passes ---------------------------------------
    llm = is_llm(model)
    chosen = parse_configs(configs if configs is not None else "baseline,optimized")
    if not llm:
        validate_video_args(num_frames, height, width, steps)
    for flag, value in (("--top", top), ("--batch-size", batch_size), ("--prompt-length", prompt_length),
                        ("--new-tokens", new_tokens)):
        if value < 1:
            raise UsageError(f"{flag} {value} must be at least 1")
    choice("--phase", phase, PHASES)
    weights = model_and_weights(model, weights)
    compile_mode_choice(compile_mode, "profile's LLM decode loop feeds each step the cache tensors the previous "
                        "CUDA-graph replay returned, which the next replay overwrites; use default or "
                        "max-autotune-no-cudagraphs" if llm else None)
    provider, dtype = runtime(device, kernel_provider, dtype)
    json_path, csv_path = result_paths(default_path("profile") if output is None else output)
    traces_at = Path(trace_dir) if trace_dir is not None else json_path.parent
    traces = {c: traces_at / f"{json_path.stem}-{c.replace('+', '-')}.trace.json" for c in chosen}
    check_outputs((json_path, csv_path, *traces.values()), force,
                  hint="pass --force to overwrite, or choose another --output/--trace-dir")

    import torch

    if device == "cuda" and not torch.cuda.is_available():
        raise NoCudaDevice("`ltxbench profile --device cuda`")
    args = {"model": model, "weights": weights, "configs": chosen, "device": device, "dtype": dtype,
            "kernel_provider": provider, "seed": seed, "batch_size": batch_size, "top": top,
            "compile_mode": compile_mode, "family": "llm" if llm else "ltx"}
    if llm:
        args.update(prompt_length=prompt_length, new_tokens=new_tokens)
    else:
        args.update(num_frames=num_frames, height=height, width=width, steps=steps, phase=phase,
                    guidance_scale=guidance_scale, frame_rate=25)
    _run(args, json_path, traces, force, output)


def _argv(args: dict, json_path, traces_at, force: bool) -> list[str]:
    argv = ["ltxbench", "profile", "--configs", ",".join(args["configs"])]
    for key, value in args.items():
        if key not in ("configs", "family", "frame_rate"):
            argv += [f"--{key.replace('_', '-')}", str(value)]
    return argv + ["--trace-dir", str(traces_at), "--output", str(json_path)] + (["--force"] if force else [])


def _run(args: dict, json_path, traces: dict, force: bool, output) -> None:
    import os
    import shutil

    from ltxbench.bench import profile
    from ltxbench.bench.e2e import record_params
    from ltxbench.cli._console import console as wide_console
    from ltxbench.models.ltx import torch_dtype
    from ltxbench.results.io import write_result
    from ltxbench.results.schema import make_result, utc_now

    console, err = wide_console(), wide_console(stderr=True)
    if args["device"] == "cpu":  # Kineto's log on a CPU is its failed GPU probe ("gpuGetDeviceCount failed")
        os.environ.setdefault("KINETO_LOG_LEVEL", "6")
    started = utc_now()
    dtype = torch_dtype(args["dtype"])
    with err.status(f"building {args['model']} ({args['weights']} weights, {args['dtype']}, {args['device']})"):
        if args["family"] == "llm":
            from ltxbench.bench.e2e_llm import build_llm

            target = build_llm(args["model"], args["weights"], args["device"], dtype, args["seed"])
        else:
            from ltxbench.models.ltx import build_pipeline

            target = build_pipeline(args["model"], args["weights"], args["device"], dtype, args["seed"])

    def log(text: str) -> None:
        err.print(text, markup=False)

    run = profile.profile_llm if args["family"] == "llm" else profile.profile_ltx
    results = run(target, args["configs"], args, args["kernel_provider"], traces, args["top"], log)
    params = record_params(args, ("configs", "dtype", "kernel_provider", "seed", "top"))
    records = profile.build_records(results, params, args["dtype"])
    traces_at = next(iter(traces.values())).parent
    config = {**args, "output": output, "trace_dir": str(traces_at),
              "time": "device (kernel) time" if args["device"] == "cuda" else "op self CPU time",
              "totals_ms": {name: res["total_ms"] for name, res in results.items()},
              "traces": {name: res["trace"] for name, res in results.items()},
              "injection": {name: res["injection"] for name, res in results.items()}}
    doc = make_result("profile", _argv(args, json_path, traces_at, force), config, args["seed"], started, utc_now(),
                      records)
    written, csv_path = write_result(doc, json_path, force)
    console.print(profile.render_families(results, "kernel time" if args["device"] == "cuda" else "CPU self time"))
    for name, res in results.items():
        console.print(profile.render_kernels(name, res))
    for name, res in results.items():
        if name.startswith("optimized") and not res["injection"].get("applied"):
            err.print(f"warning: {name}: kernel injection applied nothing ({res['injection']})", markup=False)
    for line in profile.external_commands(args, results, traces_at, json_path.stem, shutil.which):
        console.print(line, markup=False)
    console.print(f"wrote {written}, {csv_path} and {len(traces)} chrome trace(s) in {traces_at}", markup=False)
