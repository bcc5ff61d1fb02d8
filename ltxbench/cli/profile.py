"""`ltxbench profile`: torch.profiler over a few denoising steps (LTX) or prefill + decode (LLM), time per kernel
family per configuration, the top kernels, a chrome trace per configuration and a result JSON (kind "profile").

Only typer and the standard library at top level; torch/diffusers/transformers load after validation.
"""

from __future__ import annotations

from ltxbench.cli.options import command_line, takes_options
from ltxbench.configurations import Configuration

EXAMPLES = (
    "Examples:\n\n"
    "  ltxbench profile --model ltx-2b --weights random --configs baseline,optimized --steps 2 "
    "--phase transformer --num-frames 49\n\n"
    "  ltxbench profile --model llama-3-8b --weights random --configs baseline --prompt-length 2048\n\n"
    "  ltxbench profile --model ltx-tiny --weights random --device cpu --kernel-provider reference "
    "--num-frames 9 --height 64 --width 64\n\n"
    "Time is kernel (device) time on CUDA and op self CPU time on the CPU. Chrome traces go to --trace-dir "
    "(default: beside the result JSON); open them in chrome://tracing or https://ui.perfetto.dev.\n\n"
    "Exit codes: 0 ok, 2 bad arguments, 4 no GPU / OOM / no weights / a rank that died (--gpus)."
)


@takes_options("profile")
def profile_command(**values) -> None:
    """Profile whole models per configuration: time per kernel family, top kernels, chrome traces."""
    from pathlib import Path

    from ltxbench.cli import _parallel
    from ltxbench.cli._validate import (
        attention_installed,
        check_outputs,
        known_model,
        memory_budget,
        model_and_weights,
        not_a_folder,
        runtime,
    )
    from ltxbench.cli.options import refuse_foreign
    from ltxbench.errors import NoCudaDevice, UsageError
    from ltxbench.models import family_of
    from ltxbench.models.family import parse_configs, with_precision
    from ltxbench.results.io import default_path, result_paths

    # --- validation: nothing heavy is imported before this passes ---------------------------------------
    known_model(values["model"], values["weights"])
    family = family_of(values["model"])
    refuse_foreign("profile", family, values["model"])
    values["configs"] = with_precision(parse_configs(values["configs"] or "baseline,optimized",
                                                     family.config_names()), values["precision"])
    for flag, name in (("--top", "top"), ("--batch-size", "batch_size")):
        if values[name] < 1:
            raise UsageError(f"{flag} {values[name]} must be at least 1")
    values["weights"] = model_and_weights(values["model"], values["weights"])
    values["kernel_provider"], values["dtype"] = runtime(values["device"], values["kernel_provider"], values["dtype"])
    settings = family.settings("profile", **values)
    family.validate(settings, "profile")
    memory_budget(family, settings)
    attention_installed(family, settings)
    output, force = values["output"], values["force"]
    not_a_folder("--output", output, "profile.json")
    json_path, csv_path = result_paths(default_path("profile") if output is None else output)
    traces_at = Path(values["trace_dir"]) if values["trace_dir"] is not None else json_path.parent
    traces = {c: traces_at / f"{json_path.stem}-{c.replace('+', '-')}.trace.json" for c in settings.configs}
    every_rank = [rank_trace(path, rank) for path in traces.values() for rank in range(1, max(settings.gpus, 1))]
    check_outputs((json_path, csv_path, *traces.values(), *every_rank), force,
                  hint="pass --force to overwrite, or choose another --output/--trace-dir")
    settings.parallel = _parallel.split_or_relaunch(family, settings.gpus, settings.parallel, settings.device)

    import torch

    if settings.device == "cuda" and not torch.cuda.is_available():
        raise NoCudaDevice("`ltxbench profile --device cuda`")
    with _parallel.joined(settings.parallel, settings.device) as world:
        _run(family, settings, json_path, traces, force, output, world)


def _run(family, settings, json_path, traces: dict, force: bool, output, world) -> None:
    import os
    import shutil

    from ltxbench.bench import profile
    from ltxbench.bench.e2e import record_params
    from ltxbench.bench.profile_flops import add_rates
    from ltxbench.cli import _memory, _parallel
    from ltxbench.cli._console import console as wide_console
    from ltxbench.memory.apply import placement_of
    from ltxbench.results.io import write_result
    from ltxbench.results.schema import make_result, utc_now

    console, err = _parallel.quiet_unless_main(wide_console(), wide_console(stderr=True))
    if settings.device == "cpu":  # Kineto's log on a CPU is its failed GPU probe ("gpuGetDeviceCount failed")
        os.environ.setdefault("KINETO_LOG_LEVEL", "6")

    def log(text: str) -> None:
        err.print(text, markup=False)

    plan = _memory.planned(family, settings, log)
    started = utc_now()
    with err.status(f"building {settings.model} ({settings.weights} weights, {settings.dtype}, {settings.device})"):
        target = _memory.build(family, settings, plan)
    attention = family.set_attention(target, settings, log)

    described = ranks = None
    if world is None:
        results = family.profile(target, settings, traces, log)
    else:
        results, described, ranks = _profile_ranks(family, target, settings, traces, log, world)
        if not world.main:
            return
    args = settings.as_args()
    params = record_params(args, ("configs", "dtype", "kernel_provider", "seed", "top"))
    add_rates(results, settings.dtype)  # the GEMM and attention families' TFLOP/s
    records = profile.build_records(results, params, settings.dtype)
    traces_at = next(iter(traces.values())).parent
    config = {**args, "output": output, "trace_dir": str(traces_at),
              "time": "device (kernel) time" if settings.device == "cuda" else "op self CPU time",
              "totals_ms": {name: res["total_ms"] for name, res in results.items()},
              "traces": {name: res["trace"] for name, res in results.items()},
              "injection": {name: res["injection"] for name, res in results.items()}}
    if placement_of(target) is not None:
        config["memory"] = placement_of(target).as_dict()
    if attention is not None:
        config["attention"] = attention
    if described is not None:
        config["parallel"] = described
        config["ranks"] = ranks  # every rank's kernel time per family (profile.rank_summary), by rank
        config["rank_traces"] = {name: [str(rank_trace(path, rank)) for rank in range(described["world_size"])]
                                 for name, path in traces.items()}
    argv = command_line("profile", {**args, "trace_dir": str(traces_at), "output": str(json_path), "force": force})
    doc = make_result("profile", argv, config, settings.seed, started, utc_now(), records)
    written, csv_path = write_result(doc, json_path, force)
    unit = "kernel time" if settings.device == "cuda" else "CPU self time"
    console.print(profile.render_families(results, unit))
    if ranks is not None:
        console.print(profile.render_ranks(ranks, unit))
    for name, res in results.items():
        console.print(profile.render_kernels(name, res))
    for name, res in results.items():
        if Configuration(name).patch != "none" and not res["injection"].get("applied"):
            err.print(f"warning: {name}: kernel injection applied nothing ({res['injection']})", markup=False)
    for line in profile.external_commands(family, settings, results, traces_at, json_path.stem, shutil.which):
        console.print(line, markup=False)
    count = len(traces) * (described["world_size"] if described else 1)
    console.print(f"wrote {written}, {csv_path} and {count} chrome trace(s) in {traces_at}", markup=False)


def rank_trace(path, rank: int):
    """Where rank `rank` keeps its chrome trace of a configuration whose trace is `path` (rank 0's)."""
    from pathlib import Path

    path = Path(path)
    return path if rank == 0 else path.with_name(path.name.removesuffix(".trace.json") + f"-rank{rank}.trace.json")


def _profile_ranks(family, target, settings, traces: dict, log, world) -> tuple[dict, dict, list]:
    """One rank's profile over several GPUs: every rank traces into a folder of its own and, once every rank has
    finished, moves its traces into place (rank_trace); every rank's summary goes to rank 0. (results, the `parallel`
    entry, the ranks' profile.rank_summary by rank)."""
    import shutil
    import tempfile
    from pathlib import Path

    import torch.distributed as dist

    from ltxbench.bench.profile import rank_summary
    from ltxbench.cli import _parallel

    with tempfile.TemporaryDirectory(prefix="ltxbench-traces-") as staging:
        staged = {name: Path(staging) / path.name for name, path in traces.items()}

        def log_final(text: str) -> None:  # the trace's path once moved, not the staging folder's
            for name, path in staged.items():
                text = text.replace(str(path), str(traces[name]))
            log(text)

        results = family.profile(target, settings, staged, log_final)
        ranks = [None] * world.size
        dist.all_gather_object(ranks, rank_summary(results))
        described = _parallel.finished(world)
        for name, path in traces.items():
            final = rank_trace(path, world.rank)
            final.parent.mkdir(parents=True, exist_ok=True)
            shutil.move(staged[name], final)
            results[name]["trace"] = str(final)
    return results, described, ranks
