"""`bench e2e`, for every model family: every configuration (baseline, optimized, compile, optimized+compile, and
a family's peer configurations) on ONE model, built once, with the same seed; each configuration starts clean and
is undone afterwards. What one iteration is (and its phases) is the family's (ltxbench.models.<family>).

Before any configuration, one untimed iteration of the unpatched eager model takes the process's one-time costs.
Per configuration: `torch._dynamo.reset()`, the configuration's patch (our kernels for optimized*, a peer library's
for <peer>*), `nn.Module.compile(dynamic=False)` of the family's compiled module (*compile), warmup iterations
(excluded, at least one; the first one minus the steady median is the compile time, recorded with inductor's cache
hits, since its on-disk cache outlives the reset), timed repeats, then the compile is dropped and the patch
reverted. Only the standard library at top level.
"""

from __future__ import annotations

import contextlib
import statistics

from ltxbench.bench.out_of_memory import OUT_OF_MEMORY, did_not_fit, out_of_memory, release
from ltxbench.configurations import CUDA_GRAPH_MODES, Configuration

GRAPH_STEP_HOOK = "_ltxbench_graph_step_hook"  # on a module compiled regionally under CUDA graphs: the hook's handle


def record_params(args: dict, drop: tuple[str, ...]) -> dict:
    """The run arguments that describe every record: `args` less `drop`; compile_mode, rounds, cross_kv_cache,
    tuned_gemm, pair_cfg_halves, pair_guidance, gpus and stop_check only when not the default, so that default
    records match older files (bench e2e and profile); fp8_accumulation only when fast (older FP8 files promoted
    their sums to fp32)."""
    defaults = {"compile_mode": "default", "compile_scope": "model", "rounds": 1, "cross_kv_cache": True,
                "tuned_gemm": True, "pair_cfg_halves": True, "pair_guidance": True, "gpus": 1,
                "fp8_accumulation": "fp32", "stop_check": "per-token"}
    return {k: v for k, v in args.items() if k not in drop and not (k in defaults and v == defaults[k])}


def compile_module(module, mode: str = "default", scope: str = "model") -> None:
    """The compile step of a configuration (a function of its own so that tests can stub it on the CPU).
    mode: torch.compile's; "reduce-overhead" replays CUDA graphs (what transformers uses for static-cache decode).
    dynamic=False: every input shape gets its own static graph, as a user compiling for that shape would get; left
    to dynamo, the second LLM prompt length turns both lengths into one graph with a symbolic length.
    scope "regional": diffusers' regional compilation instead, each of the model's repeated blocks
    (`_repeated_blocks`) compiled on its own, the rest eager: one block's graph reused by all, so a 48-block model
    compiles in the time of one block."""
    if scope == "regional":
        module.compile_repeated_blocks(mode=mode, dynamic=False)
        if mode in CUDA_GRAPH_MODES:
            vars(module)[GRAPH_STEP_HOOK] = module.register_forward_pre_hook(_one_graph_step_per_call)
    else:
        module.compile(mode=mode, dynamic=False)


def uncompile_module(module) -> None:
    """Undo compile_module: the compiled calls (the model's, or its blocks') and the CUDA-graph step hook."""
    for part in module.modules():
        if getattr(part, "_compiled_call_impl", None) is not None:
            part._compiled_call_impl = None
    hook = vars(module).pop(GRAPH_STEP_HOOK, None)
    if hook is not None:
        hook.remove()


def _one_graph_step_per_call(_module, _args) -> None:
    """Regional compile under CUDA graphs: every call of a compiled block would open a new generation of torch's
    CUDA-graph trees, in which the next replays may overwrite the previous block's output while the next block still
    reads it. One step per model call instead: the call's blocks replay as one chain; what the model returns is made
    after its last block, outside the graphs. (The model itself runs eagerly: only its blocks are compiled.)"""
    import torch

    torch.compiler.cudagraph_mark_step_begin()


@contextlib.contextmanager
def configuration(module, name: str, apply, compile_mode: str = "default", compile_scope: str = "model"):
    """Apply configuration `name` to `module` (the transformer / the LLM, or a list of modules: a pipeline's
    denoisers, each compiled on its own), yield the injection dict, undo all.

    apply(name): the configuration's patch, a report with revert() and as_dict() (an InjectionReport, or a peer
    library's), reverted on exit; None where it patches nothing. On exit the dict takes the report's outcomes()
    (what the patches did while the work ran: the calls a memo answered), where it has them. Compile:
    nn.Module.compile() sets _compiled_call_impl, which is set back to None on exit; dynamo's caches are reset before
    and after, so no configuration sees another's.
    """
    import torch

    from ltxbench.bench.flops import modules_of
    from ltxbench.inject import outcomes_of

    torch._dynamo.reset()
    report = apply(name)
    try:
        if Configuration(name).compiled:
            for part in modules_of(module):
                compile_module(part, compile_mode, compile_scope)
        injection = report.as_dict() if report is not None else {"applied": False, "reason": f"config {name}"}
        yield injection
        injection.update(outcomes_of(report))
    finally:
        for part in modules_of(module):
            uncompile_module(part)
        if report is not None:
            report.revert()
        torch._dynamo.reset()


def summarize(name: str, iterations: list[dict], warmup: int, compiled: bool) -> dict:
    """Timed repeats (warmups dropped) -> phase samples; compile_s = first warmup total - steady median total."""
    timed = iterations[warmup:]
    out = {key: [it[key] for it in timed] for key in timed[0] if key != "step_ms"}
    if "step_ms" in timed[0]:
        out["step_ms"] = [ms for it in timed for ms in it["step_ms"]]
    steady = statistics.median(out["total_ms"])
    out["compile_s"] = max(0.0, (iterations[0]["total_ms"] - steady) / 1e3) if compiled and warmup else None
    out["first_iteration_ms"] = iterations[0]["total_ms"]
    return out


def _progress(name: str, i: int, warmup: int, repeats: int) -> str:
    return f"{name}: warmup {i + 1}/{warmup}" if i < warmup else f"{name}: repeat {i - warmup + 1}/{repeats}"


def run_configs(module, configs: list[str], apply, run, warmup: int, repeats: int, device, log,
                compile_mode: str = "default", rounds: int = 1, monitor=None, compile_scope: str = "model",
                warmed_up=None, unit_flops=None, budget_gib: float | None = None, work=None) -> dict:
    """Every configuration on the one model, each from a clean state: warmups, then timed repeats (peak memory
    reset between them); apply(config) patches (see `configuration`), run(config) does one iteration.
    {config: summary} with peak_memory_bytes and the injection report.

    rounds > 1 runs the whole set again in alternating order (A B, B A, A B, ...) and pools the timed samples, so
    that a drift of the host or the GPU during the run does not favour the configuration measured first (an
    H100 host ran compiled Llama decode 12% slower in a second A B pair than in the first:
    the same build, one process). Compile time and the injection report are the first round's.
    On CUDA the GPU's SM clock, power and temperature are sampled during the timed repeats (gpu_monitor; summary
    key gpu_samples, absent where NVML cannot be read); monitor(device) makes the monitor (tests pass a fake).
    warmed_up(): called once after the untimed first iteration (--memory-budget caps the allocator there).
    unit_flops(timings, calls): the family's FLOPs per timed unit ({summary key: FLOPs}, ltxbench.bench.flops) from
    the first iteration's timings and the FLOPs of each call of `module` in it, counted there by torch; every
    summary then carries them as model_flop {"units", "gpu"} (the records' model_tflop, tflops and mfu).
    work(config): what a configuration computes where that is not the baseline's (LTX-2's stg-off leaves the STG
    pass out), as a key; each other key's FLOPs are counted in one more untimed unpatched iteration of its first
    configuration, and its configurations carry those.
    budget_gib (--memory-budget): a configuration that runs out of memory (torch's error under the allocator's cap)
    gets the summary {out_of_memory: {budget_gib, error}, injection} and the run goes on with the next one.
    Ctrl-C raises Interrupted with the configurations measured so far."""
    results: dict = {name: None for name in configs}
    # One untimed iteration of the unpatched eager model before any configuration: the process's one-time costs
    # (cuBLAS / cuDNN handles, lazily loaded kernels, the allocator's first blocks, the first text-encoder and VAE
    # calls) land here and not in whichever configuration runs first.
    log("untimed first iteration (unpatched, eager)")
    work = work or (lambda _config: None)
    counted: dict = {}  # work -> model_flop
    if unit_flops is None:
        run("baseline")
    else:
        counted[work("baseline")] = count_model_flops(module, lambda: run("baseline"), unit_flops, device)
        for name in configs:
            if work(name) not in counted:
                log(f"untimed iteration of {name}'s work (unpatched, eager): its FLOPs")
                counted[work(name)] = count_model_flops(module, lambda name=name: run(name), unit_flops, device)
    if warmed_up is not None:
        warmed_up()
    try:
        _run_rounds(module, configs, apply, run, warmup, repeats, device, log, (compile_mode, compile_scope), rounds,
                    monitor, results, lambda name: counted.get(work(name)), budget_gib)
    except KeyboardInterrupt as stop:
        raise Interrupted({name: res for name, res in results.items() if res is not None}) from stop
    return results


def count_model_flops(module, run, unit_flops, device) -> dict:
    """{"units": {summary key: FLOPs}, "calls": [FLOPs of each call], "gpu": the device's name or None off CUDA} of
    one run() of the unpatched model, its calls of `module` counted by torch (flops.per_call); the run is otherwise
    the untimed one it was."""
    import torch

    from ltxbench.bench import flops

    timings, calls = flops.per_call(module, run)
    device = torch.device(device)
    gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else None
    return {"units": unit_flops(timings, calls), "calls": calls, "gpu": gpu}


class Interrupted(KeyboardInterrupt):
    """Ctrl-C during run_configs: `results` holds the configurations measured before it (whole rounds each)."""

    def __init__(self, results: dict):
        super().__init__()
        self.results = results


def _run_rounds(module, configs, apply, run, warmup, repeats, device, log, compiling, rounds, monitor,
                results, flop_of, budget_gib=None) -> None:
    """run_configs' measurement: each configuration's summary (with flop_of(name), its FLOP counts) goes into
    `results` as soon as it is complete. Under a memory budget (budget_gib), a configuration that runs out of memory
    is recorded as not fitting (out_of_memory) and the run goes on."""
    import torch

    from ltxbench.bench import gpu_monitor

    device = torch.device(device)
    cuda = device.type == "cuda"
    monitor = monitor or gpu_monitor.open_monitor
    for round_index in range(rounds):
        for name in configs if round_index % 2 == 0 else configs[::-1]:
            if did_not_fit(results[name]):  # not tried again in later rounds
                continue
            label = f" (round {round_index + 1}/{rounds})" if rounds > 1 else ""
            with configuration(module, name, apply, *compiling) as injection, contextlib.ExitStack() as timed:
                try:
                    iterations, sampler, compile_cache = _iterate(name, run, warmup, repeats, device, monitor,
                                                                  timed, log, label)
                except torch.OutOfMemoryError as exc:
                    if budget_gib is None:
                        raise
                    summary = out_of_memory(exc, budget_gib, injection)
                else:
                    timed.close()  # the sampling ends with the repeats
                    summary = _summary(name, iterations, warmup, device, injection, compile_cache, sampler,
                                       flop_of(name))
            if did_not_fit(summary):  # what the configuration held is freed before the next one
                results[name] = summary
                release(device)
                log(f"{name}: out of memory at {budget_gib:g} GiB (recorded as not fitting; going on): "
                    + summary[OUT_OF_MEMORY]["error"])
                continue
            results[name] = summary if results[name] is None else pool_rounds(results[name], summary)
            # One line per finished configuration, so that a run cut short still shows what it measured.
            steps, compile_s = summary.get("step_ms"), summary.get("compile_s")
            log(f"{name}: done — " + (f"median step {statistics.median(steps):.2f} ms, " if steps else "")
                + f"median total {statistics.median(summary['total_ms']):.1f} ms"
                + (f", compile {compile_s:.1f} s ({_describe_cache(summary['compile_cache'])})"
                   if compile_s is not None else "")
                + gpu_monitor.describe(gpu_monitor.summarize(summary.get("gpu_samples"), repeats)))
            if cuda:
                torch.cuda.empty_cache()


def _iterate(name, run, warmup, repeats, device, monitor, timed, log, label):
    """A configuration's warmups and timed repeats (peak memory reset and the GPU sampled from the first repeat):
    (iterations, the sampler or None, inductor's cache counts during the warmups)."""
    import torch

    iterations, sampler, cache_before, compile_cache = [], None, _inductor_cache_counts(), {}
    for i in range(warmup + repeats):
        if i == warmup:
            compile_cache = {k: v - cache_before[k] for k, v in _inductor_cache_counts().items()}
            if device.type == "cuda":
                torch.cuda.synchronize(device)
                torch.cuda.reset_peak_memory_stats(device)
            sampler = monitor(device)
            if sampler is not None:
                timed.enter_context(sampler)
        log(_progress(name, i, warmup, repeats) + label)
        iterations.append(run(name))
    return iterations, sampler, compile_cache


def _summary(name, iterations, warmup, device, injection, compile_cache, sampler, model_flop) -> dict:
    import torch

    cuda = device.type == "cuda"
    summary = summarize(name, iterations, warmup, Configuration(name).compiled)
    if summary["compile_s"] is not None:  # inductor's on-disk caches outlive dynamo.reset(): say if hit
        summary["compile_cache"] = compile_cache
    summary["peak_memory_bytes"] = torch.cuda.max_memory_allocated(device) if cuda else None
    summary["peak_reserved_bytes"] = torch.cuda.max_memory_reserved(device) if cuda else None
    summary["injection"] = injection
    if model_flop is not None:
        summary["model_flop"] = model_flop
    if sampler is not None:
        summary["gpu_samples"] = sampler.samples
    return summary


@contextlib.contextmanager
def inductor_cache(mode: str):
    """--compile-cache cold: inductor, and Triton under it (else ~/.triton), cache in a fresh directory removed
    afterwards, so every compile of the run is cold and compares with another cold one (docs/compare.md)."""
    import os
    import shutil
    import tempfile

    if mode != "cold":
        yield None
        return
    from torch._inductor import utils as inductor_utils

    # inductor memoizes paths under its cache directory; clearing them makes it look the directory up again
    clear_paths = getattr(inductor_utils, "clear_caches", lambda: None)
    saved = {name: os.environ.get(name) for name in ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR")}
    directory = tempfile.mkdtemp(prefix="ltxbench-inductor-")
    os.environ.update(TORCHINDUCTOR_CACHE_DIR=directory, TRITON_CACHE_DIR=os.path.join(directory, "triton"))
    clear_paths()
    try:
        yield directory
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        clear_paths()
        shutil.rmtree(directory, ignore_errors=True)


def _inductor_cache_counts() -> dict:
    """Inductor's FX-graph cache hits and misses so far in this process: a compile that hit the on-disk cache
    (written by an earlier configuration or run) takes a fraction of a cold one's time."""
    from torch._dynamo.utils import counters

    return {key: counters["inductor"][key] for key in ("fxgraph_cache_hit", "fxgraph_cache_miss")}


def _describe_cache(counts: dict) -> str:
    return f"inductor FX-graph cache: {counts['fxgraph_cache_hit']} hit, {counts['fxgraph_cache_miss']} missed"


def pool_rounds(first: dict, later: dict) -> dict:
    """One configuration's summaries of two rounds as one: the samples (lists, and the GPU monitor's lists)
    concatenated, the peak memory the larger, everything else (compile time, first iteration, injection report) the
    first round's."""
    pooled = {key: first[key] + later[key] if isinstance(first[key], list) else first[key] for key in first}
    if "gpu_samples" in first and "gpu_samples" in later:
        pooled["gpu_samples"] = {name: first["gpu_samples"][name] + later["gpu_samples"][name]
                                 for name in first["gpu_samples"]}
    for key in ("peak_memory_bytes", "peak_reserved_bytes"):
        if first.get(key) is not None:
            pooled[key] = max(first[key], later[key])
    return pooled
