"""`ltxbench bench e2e`: whole-model timing of baseline / optimized / compile / optimized+compile in one run.

Only typer and the standard library at top level; torch/diffusers/transformers load after validation.
"""

from __future__ import annotations

import contextlib
import time

import typer

from ltxbench.cli._signals import NOTHING_KEPT, interruption, kept_line, terminate_as_interrupt
from ltxbench.cli.options import command_line, takes_options
from ltxbench.configurations import Configuration

EXAMPLES = (
    "Examples:\n\n"
    "  ltxbench bench e2e --model ltx-2b --weights random --num-frames 49 --phase transformer "
    "--configs baseline,optimized,compile,optimized+compile --output results/e2e-2b.json\n\n"
    "  ltxbench bench e2e --num-frames 161 --use-optimized-kernels --compile\n\n"
    "  ltxbench bench e2e --model llama-3-8b --weights random --configs all   (ours beside Liger-Kernel's)\n\n"
    "  ltxbench bench e2e --model wan2.1-1.3b --weights random --phase transformer --configs "
    "compile,compile@fa3,optimized+compile@fa3   (FlashAttention-3's gain apart from the kernels')\n\n"
    "  ltxbench bench e2e --model ltx-tiny --weights random --device cpu --num-frames 9 --height 64 --width 64 "
    "--steps 2 --kernel-provider reference\n\n"
    "  ltxbench bench e2e --model ltx-2b --weights random --num-frames 161 --gpus 2   (the guidance pair over 2 "
    "GPUs: --parallel cfg)\n\n"
    "Exit codes: 0 ok, 2 bad arguments, 4 no GPU / OOM / no weights / a rank that died (--gpus)."
)


@takes_options("bench e2e")
def e2e_command(**values) -> None:
    """Time whole models per configuration: a video model's phases (encode, each step, decode) or an LLM's
    prefill/decode."""
    from ltxbench.cli import _parallel
    from ltxbench.cli._validate import (
        attention_installed,
        check_outputs,
        known_model,
        memory_budget,
        model_and_weights,
        result_outputs,
        runtime,
    )
    from ltxbench.cli.options import refuse_foreign
    from ltxbench.errors import NoCudaDevice, UsageError
    from ltxbench.models import family_of
    from ltxbench.models.family import select_configs, with_precision

    # --- validation: nothing heavy is imported before this passes ---------------------------------------
    known_model(values["model"], values["weights"])
    family = family_of(values["model"])
    refuse_foreign("bench e2e", family, values["model"])
    values["configs"] = select_configs(values["configs"], values.pop("use_optimized_kernels"), values.pop("compile"),
                                       "baseline,optimized,compile,optimized+compile", family.config_names())
    values["configs"] = with_precision(values["configs"], values["precision"])
    for flag, name in (("--batch-size", "batch_size"), ("--repeats", "repeats"), ("--rounds", "rounds")):
        if values[name] < 1:
            raise UsageError(f"{flag} {values[name]} must be at least 1")
    if values["warmup"] < 1:  # a configuration's first iteration loads its kernels (and compiles): never timed
        raise UsageError(f"--warmup-iterations {values['warmup']} must be at least 1",
                         hint="each configuration's first iteration pays one-time costs (compilation, kernel loading)")
    values["weights"] = model_and_weights(values["model"], values["weights"])
    values["kernel_provider"], values["dtype"] = runtime(values["device"], values["kernel_provider"], values["dtype"])
    settings = family.settings("bench e2e", **values)
    family.validate(settings, "bench e2e")
    memory_budget(family, settings)
    attention_installed(family, settings)
    check_outputs(result_outputs(values["output"], values["plot"]), values["force"])
    settings.parallel = _parallel.split_or_relaunch(family, settings.gpus, settings.parallel, settings.device)

    import torch

    if settings.device == "cuda" and not torch.cuda.is_available():
        raise NoCudaDevice("`ltxbench bench e2e --device cuda`")
    with _parallel.joined(settings.parallel, settings.device) as world:
        _run(family, settings, values["output"], values["force"], values["plot"], world)


def _run(family, settings, output, force: bool, plot, world) -> None:
    from rich.console import Console

    from ltxbench.bench import e2e, e2e_report, precision_error
    from ltxbench.bench.out_of_memory import did_not_fit
    from ltxbench.cli import _memory, _parallel
    from ltxbench.cli._console import console as wide_console
    from ltxbench.errors import CheckFailed, EnvironmentProblem
    from ltxbench.memory.apply import placement_of
    from ltxbench.results.io import write_result
    from ltxbench.results.schema import INCOMPLETE, make_result, utc_now

    console, err = _parallel.quiet_unless_main(wide_console(), Console(stderr=True, highlight=False, soft_wrap=True))

    def log(text: str) -> None:
        err.print(text, markup=False)

    plan = _memory.planned(family, settings, log)
    started = utc_now()
    building = time.perf_counter()
    with err.status(f"building {settings.model} ({settings.weights} weights, {settings.dtype}, {settings.device})"):
        target = _memory.build(family, settings, plan)
    log(f"built {settings.model} in {time.perf_counter() - building:.1f} s")
    attention = family.set_attention(target, settings, log)  # before any configuration: the same for all of them

    args = settings.as_args()
    params = e2e.record_params(args, ("configs", "dtype", "kernel_provider", "seed", "warmup", "repeats",
                                      "decode_compile_mode", "compile_cache"))
    interrupted, cause = False, {"signal": "Ctrl-C"}
    # Over several GPUs the launcher stops the other ranks with SIGTERM when one fails: that ends them, with no
    # partial result; only a one-process run turns SIGTERM into an interruption that writes what was measured.
    terminating = terminate_as_interrupt(cause) if world is None else contextlib.nullcontext()
    with e2e.inductor_cache(settings.compile_cache), terminating:
        try:
            results = family.bench(target, settings, log)
        except KeyboardInterrupt as stop:  # Ctrl-C or SIGTERM: keep what was measured (e2e.Interrupted carries it)
            results, interrupted = getattr(stop, "results", {}), True
    if interrupted and (not results or world is not None):
        err.print(NOTHING_KEPT if world is None else
                  f"interrupted: nothing written (a run over {world.size} GPUs writes complete results only)",
                  markup=False)
        raise typer.Exit(130)
    described = _parallel.finished(world)
    if world is not None and not world.main:
        return
    records = family.records(results, params, settings)
    config = {**{k: v for k, v in args.items() if k != "warmup"}, "warmup_iterations": settings.warmup,
              "output": output, "plot": plot, "injection": {name: res["injection"] for name, res in results.items()},
              "timer": "CUDA events per phase, medians of the timed repeats" if settings.device == "cuda"
              else "time.perf_counter per phase (CPU), medians of the timed repeats",
              "untimed_first_iteration": True}
    if described is not None:
        config["parallel"] = described
    if attention is not None:
        config["attention"] = attention
    placement = placement_of(target)
    if placement is not None:  # the plan, the streamers as they stand, and how the budget was enforced
        config["memory"] = {**placement.as_dict(), "enforced": placement.enforced}
    if interrupted:
        config[INCOMPLETE] = interruption(cause, results, [name for name in settings.configs if name not in results])
    argv = command_line("bench e2e", {**args, "output": output, "plot": plot, "force": force})
    doc = make_result("e2e", argv, config, settings.seed, started, utc_now(), records)
    json_path, csv_path = write_result(doc, output, force)
    if interrupted:
        err.print(kept_line(len(results), len(settings.configs), f"configurations ({', '.join(results)})", json_path),
                  markup=False)
        raise typer.Exit(130)
    console.print(e2e_report.render_table(records))
    for name, res in results.items():
        inj = res["injection"]
        if Configuration(name).patch != "none" and not inj.get("applied"):
            err.print(f"warning: {name}: kernel injection applied nothing ({inj})", markup=False)
    console.print(f"wrote {json_path} and {csv_path}", markup=False)
    if plot is not None:
        e2e_report.plot(records, plot, family.plot_parts(records))
        console.print(f"wrote {plot}", markup=False)
    unfit = [name for name, res in results.items() if did_not_fit(res) and Configuration(name).peer is None]
    if unfit:  # a peer that did not fit is a finding; ours (or the unpatched model) not fitting is a failure
        raise EnvironmentProblem(f"{unfit[0]}: out of memory at {settings.memory_budget_gib:g} GiB",
                                 hint="the result is written, the configuration marked as not fitting: raise "
                                      "--memory-budget or lower the shapes")
    failed = precision_error.failed_gates(records)
    if failed:
        raise CheckFailed(f"FP8 step error above its gate: {failed[0]}", hint="the result is written; "
                          "the FP8 configurations' times stand for output that differs from bf16 by more than allowed")
