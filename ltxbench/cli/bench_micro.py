"""`ltxbench bench micro`: each kernel against eager PyTorch, F.rms_norm, torch.compile and Liger, shape by shape.

Only typer and the standard library at top level; torch, rich and the runner load inside the command.
"""

from __future__ import annotations

from typing import Annotated

import typer

from ltxbench.cli._signals import NOTHING_KEPT, interruption, kept_line, terminate_as_interrupt

EXAMPLES = (
    "Examples:\n\n"
    "  ltxbench bench micro rmsnorm --dtype bf16 --shapes ltx\n\n"
    "  ltxbench bench micro rmsnorm rmsnorm_residual --shapes llm --providers cuda,F.rms_norm,compile,liger\n\n"
    "  ltxbench bench micro rmsnorm --variant weight --shapes odd --dtype bf16,fp32\n\n"
    "  ltxbench bench micro all --shapes seed --output results/micro.json --plot results/micro.png\n\n"
    "  ltxbench bench micro attention --shapes ltx2 --providers flash,cudnn,efficient,flash_attn_3\n\n"
    "Exit codes: 0 ok, 1 a cuda kernel failed its correctness check (files are still written), "
    "2 bad arguments, 4 no GPU / build problem, 130 interrupted (the cases measured are written, marked incomplete)."
)


def micro_command(
    kernels: Annotated[list[str] | None, typer.Argument(
        metavar="KERNEL", show_default=False,
        help="Kernel names or aliases (rmsnorm, rmsnorm_residual, adaln_rmsnorm, ...) or `all` (the default).")] = None,
    dtype: str = typer.Option("bf16", "--dtype", help="Comma-separated dtypes: bf16, fp16, fp32, or all."),
    shapes: str = typer.Option(
        "all", "--shapes", help="Shape group: seed, ltx (LTX-Video), ltx2 (LTX-2 19B), wan (Wan 2.1), llm, odd (widths "
        "that defeat vectors), or all (each kernel's benchmark shapes)."),
    providers: str = typer.Option(
        "all", "--providers", help="Comma-separated: cuda, eager, F.rms_norm, compile, liger, fa3, or all."),
    timer: str = typer.Option(
        "do_bench", "--timer", help="do_bench (CUDA events, L2 flushed) or cudagraph (no launch overhead, "
        "L2 not flushed: warm-cache numbers)."),
    variant: str | None = typer.Option(
        None, "--variant", help="Input variant (e.g. weight, per-token); default: each kernel's first."),
    seed: int = typer.Option(0, "--seed", help="Seed of the inputs (the same for every provider)."),
    output: str | None = typer.Option(
        None, "--output", "-o", help="Result JSON path (a CSV is written beside it); default results/runs/."),
    force: bool = typer.Option(False, "--force", help="Overwrite --output if it exists."),
    plot: str | None = typer.Option(
        None, "--plot", help="Also draw GB/s per shape and provider to this file (.png, .svg or .pdf)."),
) -> None:
    """Time each kernel against the host libraries' formulas: median µs, GB/s, % of the copy peak, speedup.

    Every provider runs on the same inputs, shape by shape, and is checked against the fp32 reference.
    """

    from ltxbench.bench import micro
    from ltxbench.cli._validate import check_outputs, result_outputs
    from ltxbench.errors import NoCudaDevice, UsageError

    if kernels and "attention" in kernels:
        if kernels != ["attention"] or variant is not None or plot is not None or dtype != "bf16":
            raise UsageError("bench micro attention runs alone, in bf16, without --variant or --plot",
                             hint="ltxbench bench micro attention [--shapes ltx|ltx2|wan|all] [--providers flash,...]")
        _attention(shapes, providers, timer, seed, output, force)
        return
    specs = micro.resolve_kernels(kernels)
    dtypes = micro.parse_choices(dtype, micro.DTYPE_NAMES, "--dtype")
    if shapes not in micro.SHAPE_GROUPS:
        raise UsageError(f"--shapes: unknown group {shapes!r}; choose from {', '.join(micro.SHAPE_GROUPS)}")
    chosen = micro.parse_choices(providers, micro.known_providers(), "--providers")
    if timer not in micro.TIMERS:
        raise UsageError(f"--timer: unknown timer {timer!r}; choose from {', '.join(micro.TIMERS)}")
    cases, notes = micro.plan(specs, dtypes, shapes, chosen, variant)
    if not cases:
        raise UsageError("nothing to measure: " + "; ".join(notes))
    check_outputs(result_outputs(output, plot), force)

    import torch

    if not torch.cuda.is_available():
        raise NoCudaDevice("micro benchmarking")
    _run(cases, notes, kernels, dtypes, shapes, chosen, timer, variant, seed, output, force, plot)


def _run(cases, notes, kernels, dtypes, shapes, providers, timer, variant, seed, output, force, plot) -> None:
    from rich.console import Console

    from ltxbench.bench import micro, micro_report
    from ltxbench.bench.timing import HOST_HEADROOM_CYCLES, copy_bandwidth_gbps
    from ltxbench.cli._console import console as wide_console
    from ltxbench.errors import CheckFailed
    from ltxbench.results.io import write_result
    from ltxbench.results.schema import INCOMPLETE, make_result, utc_now

    console, log = wide_console(), Console(stderr=True, highlight=False)
    for note in notes:
        log.print(f"note: {note}", markup=False)
    if "cuda" in providers:
        from ltxbench.ops import build

        log.print("loading the ltxbench CUDA kernels (compiled on first use)…", markup=False)
        build.load()  # a build failure is an environment problem (exit 4), never an n/a column
    started = utc_now()
    cause = {"signal": "Ctrl-C"}
    with terminate_as_interrupt(cause):
        log.print(f"measuring the copy bandwidth ({timer})…", markup=False)
        copy = copy_bandwidth_gbps(timer=timer)
        try:
            results, nbytes = micro.run_cases(cases, timer=timer, seed=seed,
                                              log=lambda s: log.print(f"measuring {s}", markup=False))
        except micro.Interrupted as stop:
            results, nbytes = stop.results, stop.nbytes
    measured = [case for case in cases if case in nbytes]
    cut_short = None
    if len(measured) < len(cases):
        if not measured:
            log.print(NOTHING_KEPT, markup=False)
            raise typer.Exit(130)
        cut_short = interruption(cause, map(_label, measured), [_label(c) for c in cases if c not in nbytes])
    records = [micro_report.copy_record(copy), *micro_report.build_records(measured, results, nbytes, copy["gbps"])]
    argv = ["ltxbench", "bench", "micro", *(kernels or ["all"]), "--dtype", ",".join(dtypes), "--shapes", shapes,
            "--providers", ",".join(providers), "--timer", timer, "--seed", str(seed)]
    argv += ["--variant", variant] if variant else []
    config = {"kernels": sorted({c.kernel for c in cases}), "dtypes": dtypes, "shapes": shapes,
              "providers": providers, "timer": timer, "variant": variant, "copy_peak_gbps": copy["gbps"],
              "copy_bytes": copy["bytes"],
              "host_headroom_cycles": HOST_HEADROOM_CYCLES if timer == "do_bench" else 0,
              "l2_persisting_reset": timer == "do_bench"}
    if cut_short is not None:
        config[INCOMPLETE] = cut_short
    doc = make_result("micro", argv, config, seed, started, utc_now(), records)
    json_path, csv_path = write_result(doc, output, force)

    console.print(micro_report.render_table(records))
    for line in micro_report.na_notes(records):
        console.print(line, markup=False)
    if cut_short is not None:  # no plot: a figure would not say that it shows part of the run
        log.print(kept_line(len(measured), len(cases), "cases", json_path), markup=False)
        raise typer.Exit(130)
    console.print(f"wrote {json_path} and {csv_path}", markup=False)
    if plot is not None:
        micro_report.plot(records, plot)
        console.print(f"wrote {plot}", markup=False)
    failures = micro_report.failed_checks(records)
    if failures:
        more = f" (and {len(failures) - 1} more)" if len(failures) > 1 else ""
        raise CheckFailed(f"cuda kernel outside tolerance: {failures[0]}{more}",
                          hint="the table's check column and the JSON's check fields have the details")


def _label(case) -> str:
    return f"{case.kernel} {case.shape_name} {case.dtype}"


def _attention(shapes: str, providers: str, timer: str, seed: int, output, force: bool) -> None:
    """`bench micro attention`: SDPA per backend at our models' shapes (ltxbench.bench.micro_attention)."""
    from ltxbench.bench import micro, micro_attention
    from ltxbench.cli._validate import check_outputs, result_outputs
    from ltxbench.errors import CheckFailed, NoCudaDevice, UsageError

    chosen = micro_attention.parse_shapes(shapes)
    backends = micro_attention.parse_backends(providers)
    if timer not in micro.TIMERS:
        raise UsageError(f"--timer: unknown timer {timer!r}; choose from {', '.join(micro.TIMERS)}")
    check_outputs(result_outputs(output, None), force)

    import torch

    if not torch.cuda.is_available():
        raise NoCudaDevice("micro benchmarking")
    from rich.console import Console

    from ltxbench.bench.timing import time_cuda
    from ltxbench.cli._console import console as wide_console
    from ltxbench.results.io import write_result
    from ltxbench.results.schema import INCOMPLETE, make_result, utc_now

    console, log = wide_console(), Console(stderr=True, highlight=False)
    started = utc_now()
    cause, cut_short = {"signal": "Ctrl-C"}, None
    with terminate_as_interrupt(cause):
        try:
            records = micro_attention.measure(chosen, backends, lambda fn: time_cuda(fn, timer=timer), seed=seed,
                                              log=lambda s: log.print(f"measuring {s}", markup=False))
        except micro_attention.Interrupted as stop:
            records = stop.records
            done = list(dict.fromkeys(r["params"]["shape_name"] for r in records))
            if not done:
                log.print(NOTHING_KEPT, markup=False)
                raise typer.Exit(130) from None
            cut_short = interruption(cause, done, [name for name in chosen if name not in done])
    argv = ["ltxbench", "bench", "micro", "attention", "--shapes", shapes, "--providers", ",".join(backends),
            "--timer", timer, "--seed", str(seed)]
    config = {"shapes": shapes, "providers": backends, "timer": timer, "atol": micro_attention.ATOL}
    if cut_short is not None:
        config[INCOMPLETE] = cut_short
    doc = make_result("micro-attention", argv, config, seed, started, utc_now(), records)
    json_path, csv_path = write_result(doc, output, force)
    console.print(micro_attention.render_table(records))
    if cut_short is not None:
        log.print(kept_line(len(cut_short["measured"]), len(chosen), "shapes", json_path), markup=False)
        raise typer.Exit(130)
    console.print(f"wrote {json_path} and {csv_path}", markup=False)
    failures = micro_attention.failed(records)
    if failures:
        raise CheckFailed(f"attention outside tolerance: {failures[0]}", hint="the table's check column has the rest")
