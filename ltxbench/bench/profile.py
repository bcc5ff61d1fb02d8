"""`ltxbench profile`: where the time goes, per kernel family, per configuration (torch.profiler).

Per configuration (applied and undone by `e2e.configuration`, as in `bench e2e`): one warmup iteration outside
the profile, then one profiled iteration, the model family's workload (ModelFamily.profile: LTX-Video = its timed
generation with --steps denoising steps, phases text_encode / denoise / vae_decode, or the loop alone with --phase
transformer; LLM = what `bench e2e` times at one prompt length: its prefill, then generate() of --new-tokens with a
static cache, the decode step compiled by transformers in the compile configurations; phases prefill / generate). Every
phase is a `record_function` range and, on CUDA, an NVTX range. Time: on CUDA the device time of every kernel /
memcpy / memset event (`self_device_time_total`, which for a device event is its own duration); on the CPU the
self CPU time of every op (`self_cpu_time_total`), so that nested ops are not counted twice. Phase ranges are left out.
The GEMM and attention families also get their achieved TFLOP/s and % of the dense peak (profile_flops).
Only the standard library at top level.
"""

from __future__ import annotations

import contextlib
import re
from collections import defaultdict

from ltxbench.bench.profile_families import FAMILIES, classify
from ltxbench.bench.profile_flops import RATE_KEYS, RATED, rated, table_cells
from ltxbench.configurations import Configuration

_PHASE_NAMES: set[str] = set()  # every name `phase` has opened: ranges, not ops, in the profiler's events


@contextlib.contextmanager
def phase(name: str, cuda: bool):
    """A named range: record_function (profiler trace) and, on CUDA, NVTX (nsys)."""
    import torch

    _PHASE_NAMES.add(name)
    with torch.profiler.record_function(name), (torch.cuda.nvtx.range(name) if cuda else contextlib.nullcontext()):
        yield


def _is_range(evt) -> bool:
    """A phase or user range rather than an op or a device event."""
    return evt.is_user_annotation or evt.name in _PHASE_NAMES or evt.name.startswith("ProfilerStep")


def collect(events, cuda: bool) -> dict:
    """{event name: [calls, microseconds]} over kernel events (CUDA) or CPU ops (CPU); phase ranges excluded."""
    from torch.autograd import DeviceType

    table: dict = defaultdict(lambda: [0, 0.0])
    for evt in events:
        if _is_range(evt):
            continue
        if cuda != (evt.device_type != DeviceType.CPU):
            continue
        us = evt.self_device_time_total if cuda else evt.self_cpu_time_total
        table[evt.name][0] += 1
        table[evt.name][1] += float(us)
    return dict(table)


def busy_and_idle(intervals) -> dict | None:
    """{span_ms, busy_ms, idle_ms} of (start_us, end_us) device intervals: busy is their union (overlapping
    streams count once), idle the rest of the span, i.e. time the GPU waited between kernels."""
    spans = sorted(intervals)
    if not spans:
        return None
    busy, reach = 0.0, spans[0][0]
    for start, end in spans:
        busy += max(0.0, end - max(start, reach))
        reach = max(reach, end)
    span = reach - spans[0][0]
    return {"span_ms": span / 1e3, "busy_ms": busy / 1e3, "idle_ms": (span - busy) / 1e3}


def device_timeline(events) -> dict | None:
    """busy_and_idle over the profiled run's device events (kernels, memcpys, memsets; annotations left out)."""
    from torch.autograd import DeviceType

    return busy_and_idle((e.time_range.start, e.time_range.end) for e in events
                         if e.device_type != DeviceType.CPU and not _is_range(e))


def summarize(table: dict, top: int) -> dict:
    """Per-family ms/share/calls (every family, zeros included) and the top-N events by total time."""
    total_ms = sum(us for _, us in table.values()) / 1e3
    families = {f: {"ms": 0.0, "calls": 0} for f in FAMILIES}
    for name, (calls, us) in table.items():
        fam = families[classify(name)]
        fam["ms"] += us / 1e3
        fam["calls"] += calls
    for fam in families.values():
        fam["share"] = fam["ms"] / total_ms if total_ms > 0 else 0.0
    ranked = sorted(table.items(), key=lambda kv: (-kv[1][1], kv[0]))[:top]
    kernels = [{"name": name, "family": classify(name), "calls": calls, "ms": us / 1e3,
                "share": us / 1e3 / total_ms if total_ms > 0 else 0.0} for name, (calls, us) in ranked]
    return {"total_ms": total_ms, "families": families, "kernels": kernels}


def profile_configs(module, configs: list[str], apply, run, device, traces: dict, top: int, log,
                    compile_mode: str = "default", monitor=None, compile_scope: str = "model", work=None) -> dict:
    """Every configuration on the one model: warmup, one profiled run, chrome trace, summary (+ injection).

    On CUDA the GPU's SM clock and power are sampled during the profiled run (res["gpu"], gpu_monitor's fields, also
    in the timeline:idle record; {} where NVML cannot be read; monitor(device) makes the monitor). The profiler's
    own launch overhead leaves the GPU idle between kernels, so the kernel times it reads may come from higher
    clocks than a timed run at the power cap gets.

    The model FLOPs of the profiled work by kind (GEMM, attention: flops.by_kind) are counted once, in the warmup of
    the first unpatched eager configuration, or in one more untimed run of the unpatched model before the others
    where there is none; every summary carries them as res["model_flop"] {"kinds", "gpu"} (profile_flops.add_rates
    turns them into the families' TFLOP/s), less the transformer calls its injection answered without running them
    (done_flops). work(config): what a configuration computes where that is not the baseline's, as a key (as
    e2e.run_configs takes it); each other key is counted in one more untimed run of its first configuration,
    uncompiled (LTX-2's stg-off: the pipeline without its STG pass)."""
    import torch

    from ltxbench.bench import flops, gpu_monitor
    from ltxbench.bench.e2e import configuration
    from ltxbench.bench.profile_flops import counting_config

    cuda = device.type == "cuda"
    monitor = monitor or gpu_monitor.open_monitor
    activities = [torch.profiler.ProfilerActivity.CPU]
    if cuda:
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    work = work or (lambda _config: None)
    results, counted = {}, {}  # work -> {"calls": [FLOPs by kind of each call of the transformer], "kinds"}

    def count(key) -> None:  # the whole run by kind, and each call of the transformer by kind
        calls: list = []
        counted[key] = {"kinds": flops.by_kind(lambda: flops.per_call(module, run, calls))[1], "calls": calls}

    counted_in = counting_config(configs)
    for key in dict.fromkeys(map(work, configs)):
        if counted_in is not None and work(counted_in) == key:
            continue
        first = Configuration(next(n for n in ("baseline", *configs) if work(n) == key))
        uncompiled = Configuration.of(first.patch, first.precision, False, first.attention)
        with configuration(module, uncompiled, apply, compile_mode, compile_scope):
            log(f"untimed run of {uncompiled}: its FLOPs")
            count(key)
    for name in configs:
        with configuration(module, name, apply, compile_mode, compile_scope) as injection:
            log(f"{name}: warmup" + (" (counting the model's FLOPs)" if name == counted_in else ""))
            if name == counted_in:
                count(work(name))
            else:
                run()
            if cuda:
                torch.cuda.synchronize(device)
            log(f"{name}: profiling")
            sampler = monitor(device)  # None off CUDA or without NVML
            with torch.profiler.profile(activities=activities) as prof, (sampler or contextlib.nullcontext()):
                run()
                if cuda:
                    torch.cuda.synchronize(device)
            traces[name].parent.mkdir(parents=True, exist_ok=True)
            prof.export_chrome_trace(str(traces[name]))
            events = prof.events()
            res = summarize(collect(events, cuda), top)
            res["timeline"] = device_timeline(events) if cuda else None
            res["gpu"] = gpu_monitor.summarize(sampler.samples if sampler else None)
        res["injection"], res["trace"] = injection, str(traces[name])
        results[name] = res
        log(f"{name}: {res['total_ms']:.2f} ms profiled{gpu_monitor.describe(res['gpu'])}, trace {traces[name]}")
    gpu = torch.cuda.get_device_name(device) if cuda else None
    for name, res in results.items():
        res["model_flop"] = done_flops(counted[work(name)], res["injection"], gpu)
    return results


def done_flops(counted: dict, injection: dict, gpu: str | None) -> dict:
    """{"kinds": {kind: FLOPs}, "gpu"} of the work a configuration did: the counted run's, less the calls its
    injection answered without running them (CALLS_ANSWERED; their FLOPs by kind under "answered")."""
    from ltxbench.bench.flops import answered_calls

    answered = answered_calls(counted["calls"], injection)
    out = {"kinds": {kind: flop - sum(call[kind] for call in answered) for kind, flop in counted["kinds"].items()},
           "gpu": gpu}
    if answered:
        out["answered"] = {kind: sum(call[kind] for call in answered) for kind in counted["kinds"]}
    return out


def _point(value: float) -> dict:
    return {"median": value, "p20": value, "p80": value, "min": value, "max": value, "n": 1}


def build_records(results: dict, params: dict, dtype: str) -> list[dict]:
    """One record per family per configuration (provider = config), then `kernel:<name>` for the top-N."""
    from ltxbench.results.schema import make_record

    records = []
    for config, res in results.items():
        for family, fam in res["families"].items():
            rates = {key: fam[key] for key in RATE_KEYS if key in fam}  # GEMM, attention: profile_flops.add_rates
            records.append(make_record(family, config, dtype, params, "time", "ms", "lower", _point(fam["ms"]),
                                       derived={"share": fam["share"], "calls": fam["calls"], **rates}))
        if res.get("timeline"):
            tl = res["timeline"]
            records.append(make_record("timeline:idle", config, dtype, params, "time", "ms", "lower",
                                       _point(tl["idle_ms"]), derived={"span_ms": tl["span_ms"],
                                                                      "busy_ms": tl["busy_ms"],
                                                                      **res.get("gpu", {})}))
        for k in res["kernels"]:
            records.append(make_record(f"kernel:{k['name']}", config, dtype, params, "time", "ms", "lower",
                                       _point(k["ms"]), derived={"share": k["share"], "calls": k["calls"],
                                                                 "family": k["family"]}))
    return records


def _short(name: str, width: int = 90) -> str:
    return name if len(name) <= width else name[:width - 1] + "…"


def render_families(results: dict, unit: str):
    from rich.table import Table

    table = Table(title=f"time per kernel family ({unit})")
    table.add_column("family")
    for config in results:
        table.add_column(f"{config} ms", justify="right")
        table.add_column(f"{config} %", justify="right")
    for family in (*FAMILIES, "total"):
        cells = []
        for res in results.values():
            fam = res["families"].get(family, {"ms": res["total_ms"], "share": 1.0})
            cells += [f"{fam['ms']:.3f}", f"{100 * fam['share']:.1f}"]
        table.add_row(family, *cells)
    if rated(results):  # the GEMM and attention families' achieved TFLOP/s (profile_flops)
        for family in RATED:
            table.add_row(f"{family} TFLOP/s (% of dense peak)",
                          *(cell for res in results.values() for cell in table_cells(res["families"][family])))
    if any(res.get("timeline") for res in results.values()):  # GPU runs: the waits between kernels
        cells = []
        for res in results.values():
            tl = res.get("timeline") or {"idle_ms": 0.0, "span_ms": 0.0}
            cells += [f"{tl['idle_ms']:.3f}", f"{100 * tl['idle_ms'] / tl['span_ms']:.1f}" if tl["span_ms"] else "-"]
        table.add_row("idle between kernels (% of span)", *cells)
    if any(res.get("gpu") for res in results.values()):  # the clock the kernel times were read at
        cells = []
        for res in results.values():
            gpu = res.get("gpu") or {}
            cells += [f"{gpu['gpu_sm_mhz_median']:.0f}", f"{100 * gpu['gpu_power_capped_share']:.0f}"] if gpu \
                else ["-", "-"]
        table.add_row("SM clock MHz (% of samples power-capped)", *cells)
    return table


def rank_summary(results: dict) -> dict:
    """One rank's share of a multi-GPU profile, per configuration: its kernel time in all and per family, the idle
    time between its kernels and its SM clock. The ranks run the same work, so where one waits for another at the
    collectives (a slower clock, a late launch) it shows as a difference in communication time between ranks."""
    return {config: {"total_ms": res["total_ms"],
                     "families_ms": {family: fam["ms"] for family, fam in res["families"].items()},
                     "idle_ms": (res.get("timeline") or {}).get("idle_ms"),
                     "sm_mhz": (res.get("gpu") or {}).get("gpu_sm_mhz_median")}
            for config, res in results.items()}


def render_ranks(ranks: list[dict], unit: str):
    """Every rank's rank_summary side by side: total, communication, the rest, idle time and clock."""
    from rich.table import Table

    table = Table(title=f"per rank ({unit}, ms)")
    for col in ("config", "rank", "total", "communication", "other kernels", "idle", "SM MHz"):
        table.add_column(col, justify="left" if col == "config" else "right")
    for config in ranks[0]:
        for rank, summary in enumerate(ranks):
            row = summary[config]
            comm = row["families_ms"].get("communication", 0.0)
            table.add_row(config, str(rank), f"{row['total_ms']:.3f}", f"{comm:.3f}", f"{row['total_ms'] - comm:.3f}",
                          "-" if row["idle_ms"] is None else f"{row['idle_ms']:.3f}",
                          "-" if row["sm_mhz"] is None else f"{row['sm_mhz']:.0f}")
    return table


def render_kernels(config: str, res: dict):
    from rich.table import Table

    table = Table(title=f"top {len(res['kernels'])} kernels: {config}")
    for col, justify in (("#", "right"), ("kernel", "left"), ("family", "left"), ("calls", "right"),
                         ("total ms", "right"), ("%", "right")):
        table.add_column(col, justify=justify)
    for i, k in enumerate(res["kernels"], 1):
        table.add_row(str(i), _short(k["name"]), k["family"], str(k["calls"]), f"{k['ms']:.3f}",
                      f"{100 * k['share']:.1f}")
    return table


def kernel_base(name: str) -> str:
    """'void ltxbench::(anonymous namespace)::row_op_cached<bf16, 8>(...)' -> 'row_op_cached' (for ncu -k)."""
    text = name.replace("(anonymous namespace)", "anon").removeprefix("void ").strip()
    text = re.split(r"[<(\s]", text, maxsplit=1)[0]
    return text.split("::")[-1] or name


def external_commands(family, settings, results: dict, out_dir, stem: str, which) -> list[str]:
    """nsys/ncu command lines (when those tools are on PATH) profiling each configuration with `bench e2e` over the
    family's smallest form of this workload (ModelFamily.bench_argv: e.g. the 2 steps a video model needs)."""
    import shlex

    lines = []
    for config, res in results.items():
        argv = ["ltxbench", "bench", "e2e", "--model", settings.model, "--weights", settings.weights,
                "--device", "cuda", "--dtype", settings.dtype, "--configs", config, "--repeats", "1",
                "--warmup-iterations", "1", "--seed", str(settings.seed), "--batch-size", str(settings.batch_size),
                "--compile-mode", settings.compile_mode, "--compile-scope", settings.compile_scope,
                *family.bench_argv(settings)]
        if Configuration(config).ours:
            argv += ["--kernel-provider", "cuda"]
        tag = f"{out_dir}/{stem}-{config.replace('+', '-')}"
        if which("nsys"):
            lines.append(shlex.join(["nsys", "profile", "-t", "cuda,nvtx", "--force-overwrite", "true", "-o",
                                     f"{tag}-nsys", *argv]))
        if which("ncu") and res["kernels"]:
            lines.append(shlex.join(["ncu", "--set", "full", "-f", "-o", f"{tag}-ncu", "-k",
                                     f"regex:{re.escape(kernel_base(res['kernels'][0]['name']))}",
                                     "--launch-count", "5", *argv]))
    return lines
