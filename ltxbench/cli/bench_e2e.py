"""`ltxbench bench e2e`: whole-model timing of baseline / optimized / compile / optimized+compile in one run.

Only typer and the standard library at top level; torch/diffusers/transformers load after validation.
"""

from __future__ import annotations

import typer

from ltxbench.bench.e2e_llm import DECODE_COMPILE_DEFAULT, is_llm  # standard library only at its top level

EXAMPLES = (
    "Examples:\n\n"
    "  ltxbench bench e2e --model ltx-2b --weights random --num-frames 49 --phase transformer "
    "--configs baseline,optimized,compile,optimized+compile --output results/e2e-2b.json\n\n"
    "  ltxbench bench e2e --num-frames 161 --use-optimized-kernels --compile\n\n"
    "  ltxbench bench e2e --model llama-3-8b --weights random --configs baseline,optimized\n\n"
    "  ltxbench bench e2e --model ltx-tiny --weights random --device cpu --num-frames 9 --height 64 --width 64 "
    "--steps 2 --kernel-provider reference\n\n"
    "Exit codes: 0 ok, 2 bad arguments, 4 no GPU / OOM / no weights."
)


def e2e_command(
    model: str = typer.Option("ltx-2b", "--model", help="ltx-2b, ltx-13b, ltx-tiny, llama-3-8b, mistral-7b, qwen2-7b, "
                              "qwen3-8b, llama-tiny, smollm2-135m, a hub id or a local path."),
    weights: str = typer.Option(None, "--weights", help="pretrained | random (built from the package's configs; "
                                "the default for ltx-tiny and llama-tiny, which have no pretrained weights)."),
    configs: str = typer.Option(None, "--configs", help="Comma-separated: baseline, optimized, compile, "
                                "optimized+compile (default: all four)."),
    use_optimized_kernels: bool = typer.Option(None, "--use-optimized-kernels/--no-optimized-kernels",
                                               help="Select ONE configuration, as the original script did."),
    compile_: bool = typer.Option(False, "--compile", help="With/without --use-optimized-kernels: one config."),
    compile_mode: str = typer.Option("default", "--compile-mode",
                                     help="torch.compile mode of both compile configs: default, reduce-overhead "
                                     "(CUDA graphs), max-autotune, max-autotune-no-cudagraphs (LLM: the prompt "
                                     "forwards)."),
    decode_compile_mode: str = typer.Option(DECODE_COMPILE_DEFAULT, "--decode-compile-mode",
                                            help="LLM compile configs: mode of the decode step that generate() "
                                            "compiles itself (transformers' CompileConfig; its default)."),
    compile_cache: str = typer.Option("shared", "--compile-cache",
                                      help="Inductor's on-disk cache for the compile configs: shared (the usual "
                                      "one; a compile may hit what an earlier run wrote) or cold (a fresh one for "
                                      "this run, removed afterwards: compile times comparable between runs)."),
    num_frames: int = typer.Option(161, "--num-frames", help="Frames, 8k+1 (LTX)."),
    height: int = typer.Option(512, "--height", help="Height, a multiple of 32 (LTX)."),
    width: int = typer.Option(768, "--width", help="Width, a multiple of 32 (LTX)."),
    steps: int = typer.Option(50, "--steps", help="Denoising steps (LTX)."),
    batch_size: int = typer.Option(1, "--batch-size", help="Videos per prompt (LTX) / sequences (LLM)."),
    warmup_iterations: int = typer.Option(2, "--warmup-iterations", help="Untimed iterations per config."),
    repeats: int = typer.Option(3, "--repeats", help="Timed iterations per config (median reported)."),
    rounds: int = typer.Option(1, "--rounds", help="Run the configs this many times in alternating order (A B, "
                               "B A, ...) and pool the samples, so that drift during the run favours no config."),
    phase: str = typer.Option("all", "--phase", help="all (encode + denoise + decode) | transformer (loop only)."),
    cross_kv_cache: bool = typer.Option(True, "--cross-kv-cache/--no-cross-kv-cache",
                                        help="LTX optimized configs: attn2's keys/values once per generation (exact), "
                                             "or every step as the model does."),
    tuned_gemm: bool = typer.Option(True, "--tuned-gemm/--no-tuned-gemm",
                                    help="LTX optimized configs: the blocks' projections on cuBLASLt with the "
                                         "algorithm per shape chosen by timing (first call), or torch's linear."),
    pair_cfg_halves: bool = typer.Option(True, "--pair-cfg-halves/--no-pair-cfg-halves",
                                         help="LTX optimized configs: block 0's attn1 once for classifier-free "
                                              "guidance's two identical halves (exact; checked every step), or "
                                              "on both."),
    device: str = typer.Option("cuda", "--device", help="cuda | cpu."),
    kernel_provider: str = typer.Option(None, "--kernel-provider",
                                        help="cuda | reference (default: cuda on cuda, reference on cpu)."),
    dtype: str = typer.Option(None, "--dtype", help="bf16 | fp16 | fp32 (default: bf16 on cuda, fp32 on cpu)."),
    prompt_lengths: str = typer.Option("512,2048", "--prompt-lengths", help="LLM prefill prompt lengths."),
    new_tokens: int = typer.Option(128, "--new-tokens", help="LLM decode: tokens generated (min = max)."),
    seed: int = typer.Option(42, "--seed", help="Seed of weights, noise and token ids (same for every config)."),
    guidance_scale: float = typer.Option(3.0, "--guidance-scale", help="CFG scale (> 1 doubles the batch)."),
    output: str = typer.Option(None, "--output", "-o", help="Result JSON (CSV beside it); default results/runs/."),
    force: bool = typer.Option(False, "--force", help="Overwrite --output if it exists."),
    plot: str = typer.Option(None, "--plot", help="Also draw the per-config phase split to this PNG."),
) -> None:
    """Time whole models per configuration: LTX phases (encode, each step, decode) or LLM prefill/decode."""

    from ltxbench.bench.e2e import COMPILE_CACHES, PHASES, select_configs
    from ltxbench.cli._validate import (
        check_outputs,
        choice,
        compile_mode_choice,
        model_and_weights,
        positive_ints,
        require_matplotlib,
        result_outputs,
        runtime,
    )
    from ltxbench.errors import NoCudaDevice, UsageError
    from ltxbench.models.ltx import validate_video_args

    # --- validation: nothing heavy is imported before this passes ---------------------------------------
    llm = is_llm(model)
    chosen = select_configs(configs, use_optimized_kernels, compile_, "baseline,optimized,compile,optimized+compile")
    if not llm:
        validate_video_args(num_frames, height, width, steps)
    for flag, value, low in (("--batch-size", batch_size, 1), ("--repeats", repeats, 1), ("--rounds", rounds, 1),
                             ("--new-tokens", new_tokens, 1)):
        if value < low:
            raise UsageError(f"{flag} {value} must be at least {low}")
    if warmup_iterations < 1:  # a configuration's first iteration loads its kernels (and compiles): never timed
        raise UsageError(f"--warmup-iterations {warmup_iterations} must be at least 1",
                         hint="each configuration's first iteration pays one-time costs (compilation, kernel loading)")
    if guidance_scale < 0:
        raise UsageError(f"--guidance-scale {guidance_scale} must not be negative")
    lengths = positive_ints("--prompt-lengths", prompt_lengths)
    choice("--phase", phase, PHASES)
    choice("--compile-cache", compile_cache, COMPILE_CACHES)
    compile_mode_choice(compile_mode)
    compile_mode_choice(decode_compile_mode, flag="--decode-compile-mode")
    weights = model_and_weights(model, weights)
    provider, dtype = runtime(device, kernel_provider, dtype)
    check_outputs(result_outputs(output, plot), force)
    if plot is not None:
        require_matplotlib()

    import torch

    if device == "cuda" and not torch.cuda.is_available():
        raise NoCudaDevice("`ltxbench bench e2e --device cuda`")
    args = {"model": model, "weights": weights, "configs": chosen, "device": device, "dtype": dtype,
            "kernel_provider": provider, "seed": seed, "warmup": warmup_iterations, "repeats": repeats,
            "rounds": rounds, "batch_size": batch_size, "compile_mode": compile_mode, "family": "llm" if llm else "ltx"}
    args["compile_cache"] = compile_cache  # in run.config and argv, not in params: it changes no timed iteration
    if llm:
        args.update(prompt_lengths=lengths, new_tokens=new_tokens, decode_compile_mode=decode_compile_mode)
    else:
        args.update(num_frames=num_frames, height=height, width=width, steps=steps, phase=phase,
                    guidance_scale=guidance_scale, frame_rate=25, cross_kv_cache=cross_kv_cache,
                    tuned_gemm=tuned_gemm, pair_cfg_halves=pair_cfg_halves)
    _run(args, output, force, plot)


def _argv(args: dict, output, force: bool, plot) -> list[str]:
    argv = ["ltxbench", "bench", "e2e", "--configs", ",".join(args["configs"])]
    skip = {"configs", "family", "frame_rate", "warmup"}
    for key, value in args.items():
        if key in skip:
            continue
        flag = f"--{key.replace('_', '-')}"
        if isinstance(value, bool):
            argv.append(flag if value else flag.replace("--", "--no-", 1))
        else:
            argv += [flag, ",".join(map(str, value)) if isinstance(value, list) else str(value)]
    argv += ["--warmup-iterations", str(args["warmup"])]
    argv += (["--output", str(output)] if output else []) + (["--plot", str(plot)] if plot else [])
    return argv + (["--force"] if force else [])


def _run(args: dict, output, force: bool, plot) -> None:
    from rich.console import Console

    from ltxbench.bench import e2e, e2e_llm, e2e_report
    from ltxbench.cli._console import console as wide_console
    from ltxbench.models.ltx import torch_dtype
    from ltxbench.results.io import write_result
    from ltxbench.results.schema import INCOMPLETE, make_result, utc_now

    console, err = wide_console(), Console(stderr=True, highlight=False, soft_wrap=True)
    started = utc_now()
    dtype = torch_dtype(args["dtype"])
    with err.status(f"building {args['model']} ({args['weights']} weights, {args['dtype']}, {args['device']})"):
        if args["family"] == "llm":
            target = e2e_llm.build_llm(args["model"], args["weights"], args["device"], dtype, args["seed"])
        else:
            from ltxbench.models.ltx import build_pipeline

            target = build_pipeline(args["model"], args["weights"], args["device"], dtype, args["seed"])

    def log(text: str) -> None:
        err.print(text, markup=False)

    params = e2e.record_params(args, ("configs", "dtype", "kernel_provider", "seed", "warmup", "repeats",
                                      "decode_compile_mode", "compile_cache"))
    run = e2e_llm.run_llm if args["family"] == "llm" else e2e.run_ltx
    interrupted = False
    with e2e.inductor_cache(args["compile_cache"]):
        try:
            results = run(target, args["configs"], args, args["kernel_provider"], log)
        except KeyboardInterrupt as stop:  # Ctrl-C: keep what was measured (e2e.Interrupted carries it)
            results, interrupted = getattr(stop, "results", {}), True
    if interrupted and not results:
        err.print("interrupted before any configuration was measured: nothing written", markup=False)
        raise typer.Exit(130)
    if args["family"] == "llm":
        records = e2e_llm.build_records(results, params, args["dtype"], args["prompt_lengths"], args["new_tokens"],
                                        args["decode_compile_mode"])
    else:
        records = e2e_report.build_records(results, params, args["dtype"])
    config = {**{k: v for k, v in args.items() if k != "warmup"}, "warmup_iterations": args["warmup"],
              "output": output, "plot": plot, "injection": {name: res["injection"] for name, res in results.items()},
              "timer": "CUDA events per phase, medians of the timed repeats" if args["device"] == "cuda"
              else "time.perf_counter per phase (CPU), medians of the timed repeats",
              "untimed_first_iteration": True}
    if interrupted:
        config[INCOMPLETE] = {"reason": "interrupted (Ctrl-C)", "measured": list(results),
                              "not_measured": [name for name in args["configs"] if name not in results]}
    doc = make_result("e2e", _argv(args, output, force, plot), config, args["seed"], started, utc_now(), records)
    json_path, csv_path = write_result(doc, output, force)
    if interrupted:
        err.print(f"interrupted: wrote the {len(results)} of {len(args['configs'])} configurations measured "
                  f"({', '.join(results)}) to {json_path}, marked incomplete (not a baseline for compare)",
                  markup=False)
        raise typer.Exit(130)
    console.print(e2e_report.render_table(records))
    for name, res in results.items():
        inj = res["injection"]
        if name.startswith("optimized") and not inj.get("applied"):
            err.print(f"warning: {name}: kernel injection applied nothing ({inj})", markup=False)
    console.print(f"wrote {json_path} and {csv_path}", markup=False)
    if plot is not None:
        e2e_report.plot(records, plot)
        console.print(f"wrote {plot}", markup=False)
