"""Table, plot and per-phase records of `bench e2e`, one row per configuration, for every model family (its phases
are its records: encode / denoise step / decode for video models, prefill / decode step for LLMs)."""

from __future__ import annotations

import statistics
from collections import defaultdict

from ltxbench.configurations import Configuration, precision_label
from ltxbench.results.schema import OUT_OF_MEMORY, out_of_memory_label

# derived key of a step record -> the rate column's title
RATES = {"transformer_it_s": "it/s", "tokens_per_s": "tok/s"}


def _by_config(records) -> dict:
    """{config: {phase: record}} of the timings (the FP8 error records are not phases)."""
    rows: dict = defaultdict(dict)
    for rec in records:
        if rec.get("metric", "time") != "time":
            continue
        label = rec["name"] if rec["name"] != "prefill" else f"prefill@{rec['params']['prompt_len']}"
        rows[rec["provider"]][label] = rec
    return rows


def step_record(row: dict) -> dict | None:
    """A configuration's step record (denoise_step, decode_step): the one its rate, TFLOP/s and MFU come from."""
    return row.get("denoise_step") or row.get("decode_step")


def _fmt(value, spec=".1f", suffix="") -> str:
    return "-" if value is None else f"{value:{spec}}{suffix}"


def render_table(records, title: str = "ltxbench bench e2e"):
    from rich.table import Table

    rows = _by_config(records)
    phases = list(dict.fromkeys(k for row in rows.values() for k in row if k != "compile"))
    table = Table(title=title)
    # The configuration names stay whole whatever the width (commands print this table on a wide console when the
    # output is not a terminal: ltxbench.cli._console).
    table.add_column("config", no_wrap=True, min_width=max((len(c) for c in rows), default=6))
    fp8 = any(str(rec.get("dtype")).startswith("fp8") for row in rows.values() for rec in row.values())
    if fp8:  # which precision each row's numbers used
        table.add_column("precision")
    for phase in phases:
        table.add_column(f"{phase} ms", justify="right")
    rate_key = next((key for key in RATES for row in rows.values() for rec in row.values()
                     if key in rec.get("derived", {})), None)
    for col in (RATES.get(rate_key, "rate"), "vs baseline", "vs compile", "compile s", "peak GiB"):
        table.add_column(col, justify="right")
    # The step's achieved TFLOP/s and its share of the GPU's dense peak (bench.flops), where they were counted.
    counted = any("tflops" in (step_record(row) or {}).get("derived", {}) for row in rows.values())
    # An LLM's prefills: their TFLOP/s, one column per prompt length that has one.
    prefills = [p for p in phases if p.startswith("prefill@")
                and any("tflops" in row.get(p, {}).get("derived", {}) for row in rows.values())]
    for phase in prefills:
        table.add_column(f"{phase} TFLOP/s", justify="right")
    if counted:
        table.add_column("step TFLOP/s", justify="right")
        table.add_column("MFU", justify="right")
    # An LLM's batch-1 decode step against its floor: every weight read once at the datasheet bandwidth (hbm_floor)
    floored = any("pct_of_hbm_floor" in (step_record(row) or {}).get("derived", {}) for row in rows.values())
    if floored:
        table.add_column("% of HBM floor", justify="right")
    # The GPU's clock during the timed repeats, where it was sampled: at the power cap, a denser step runs slower.
    clocked = any("gpu_sm_mhz_median" in rec.get("derived", {}) for row in rows.values() for rec in row.values())
    if clocked:
        table.add_column("SM MHz (capped)", justify="right")
    # Joules per denoising step where the energy counter was read: what a change saves when the clock is capped.
    metered = any("gpu_energy_j_per_step" in row.get("denoise_step", {}).get("derived", {}) for row in rows.values())
    if metered:
        table.add_column("J/step", justify="right")
    for config, row in rows.items():
        main = row.get("total") or row.get("generate")
        derived = (main or {}).get("derived", {})
        step = next((rec for rec in row.values() if rate_key in rec.get("derived", {})), None)
        rate = (step or {}).get("derived", {}).get(rate_key)
        peak = derived.get("peak_memory_bytes")
        cells = [_fmt(row[p]["stats"]["median"]) if p in row else "-" for p in phases]
        failed = next(filter(None, map(out_of_memory_label, row.values())), None)
        if failed is not None and cells:  # a configuration that did not fit its memory budget
            cells[0] = failed
        gpu_cells = []
        if clocked:
            gpu = (step or main or {}).get("derived", {})
            gpu_cells = [f"{gpu['gpu_sm_mhz_median']:.0f} ({100 * gpu['gpu_power_capped_share']:.0f}%)"
                     if "gpu_sm_mhz_median" in gpu else "-"]
        if metered:
            gpu_cells.append(_fmt((step or {}).get("derived", {}).get("gpu_energy_j_per_step"), ".1f"))
        precision = [precision_label(next(iter(row.values())))] if fp8 else []
        flop_cells = [_fmt(row.get(p, {}).get("derived", {}).get("tflops"), ".1f") for p in prefills]
        unit = (step_record(row) or {}).get("derived", {})
        if counted:
            mfu = unit.get("mfu")
            flop_cells += [_fmt(unit.get("tflops"), ".1f"), _fmt(None if mfu is None else 100 * mfu, ".1f", "%")]
        if floored:
            flop_cells.append(_fmt(unit.get("pct_of_hbm_floor"), ".1f", "%"))
        table.add_row(config, *precision, *cells, _fmt(rate, ".2f"),
                      _fmt(derived.get("speedup_vs_baseline"), ".2f", "x"),
                      _fmt(derived.get("speedup_vs_compile"), ".2f", "x"), _fmt(derived.get("compile_s"), ".1f"),
                      _fmt(peak / 2**30 if peak is not None else None, ".2f"), *flop_cells, *gpu_cells)
    return table


def plot(records, path, parts: list[str]) -> None:
    """Stacked bars per configuration: per-iteration median time split by phase (`parts`: the record labels
    stacked, from the family; a step record stands for all the steps of an iteration)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = _by_config(records)
    configs = list(rows)
    fig, ax = plt.subplots(figsize=(max(5, 1.6 * len(configs) + 2), 4))
    bottoms = [0.0] * len(configs)
    for phase in parts:
        heights = []
        for row in rows.values():
            rec = row.get(phase)
            if rec is None:
                heights.append(0.0)
            elif "denoise_total_ms" in rec["derived"]:  # a step record: all the steps of an iteration
                heights.append(rec["derived"]["denoise_total_ms"])
            else:
                heights.append(rec["stats"]["median"])
        if any(heights):
            ax.bar(configs, heights, bottom=bottoms, label=phase.removesuffix("_step"))
            bottoms = [b + h for b, h in zip(bottoms, heights, strict=True)]
    ax.set_ylabel("ms per iteration (median)")
    ax.set_title("ltxbench bench e2e")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def compile_derived(res: dict) -> dict:
    """The compile record's derived fields: the first iteration, and inductor's cache hits / misses in it."""
    return {"first_iteration_ms": res["first_iteration_ms"],
            **{f"inductor_{k}": v for k, v in res.get("compile_cache", {}).items()}}


def speedups(results: dict, name: str, key: str) -> dict:
    """speedup_vs_<ref> of config `name` for phase `key` (median over median), against baseline, compile and every
    peer configuration in the run (liger, liger+compile, ...)."""
    out = {}
    mine = statistics.median(results[name][key])
    peers = [ref for ref in results if not Configuration(ref).standard]
    for ref in ("baseline", "compile", *peers):
        if ref in results and ref != name and key in results[ref] and mine > 0:
            out[f"speedup_vs_{ref}"] = statistics.median(results[ref][key]) / mine
    return out


def flop_rates(res: dict, key: str, precision: str, params: dict) -> dict:
    """model_tflop, tflops and mfu (flops.rates) of summary key `key` where the run counted its FLOPs, else {}.
    The FLOPs are the work the configuration did: where its injection answered calls of the iteration without running
    them (CALLS_ANSWERED: LTX-2's STG pass from the guidance pair), their share of the iteration's FLOPs is left out
    of the unit's and reported apart as answered_tflop, so the rate and the MFU describe the GPU, not skipped work."""
    from ltxbench.bench.flops import answered_calls, rates

    counted = res.get("model_flop") or {}
    flop = (counted.get("units") or {}).get(key)
    if flop is None or key not in res:
        return {}
    calls = counted.get("calls") or []
    answered = sum(answered_calls(calls, res.get("injection")))
    done = flop * (1 - answered / sum(calls)) if answered else flop
    out = rates(done, statistics.median(res[key]), counted.get("gpu"), precision, params.get("gpus", 1))
    if answered and out:
        out["answered_tflop"] = (flop - done) / 1e12
    return out


def phase_records(results: dict, params: dict, dtype: str, phases, step: str, rate: str) -> list[dict]:
    """One record per phase per configuration (provider = config) + compile: `phases` are (record name, summary key)
    pairs; the `step` record (a sample per step) also carries `rate` (steps/s), the steps' total per iteration and,
    where the GPU was sampled, the energy per step. The timed phases carry the GPU clock, power, temperature and
    energy of their repeats (gpu_* in derived) when sampled. A configuration that ran out of memory under its budget
    has one "total" record without samples, its derived out_of_memory saying so."""
    from ltxbench.bench.gpu_monitor import summarize as gpu_summary
    from ltxbench.results.schema import NO_STATS, make_record, stats_from_samples

    records = []
    for name, res in results.items():
        ran_in = Configuration(name).precision
        precision = dtype if ran_in == "bf16" else ran_in  # what the projections ran in
        if OUT_OF_MEMORY in res:  # did not fit its memory budget: one record, with nothing measured
            records.append(make_record("total", name, precision, params, "time", "ms", "lower", NO_STATS,
                                       derived={OUT_OF_MEMORY: res[OUT_OF_MEMORY]}))
            continue
        common = {"peak_memory_bytes": res["peak_memory_bytes"], "compile_s": res["compile_s"],
                  **gpu_summary(res.get("gpu_samples"), len(res["total_ms"]))}
        if res.get("peak_reserved_bytes") is not None:  # the caching allocator's peak (a --memory-budget caps it)
            common["peak_reserved_bytes"] = res["peak_reserved_bytes"]
        for record_name, key in phases:
            if key not in res:
                continue
            derived = {**common, **speedups(results, name, key), **flop_rates(res, key, precision, params)}
            if record_name == step:
                median = statistics.median(res[key])
                derived[rate] = 1e3 / median if median > 0 else None
                derived["denoise_total_ms"] = sum(res[key]) / max(1, len(res["total_ms"]))
                if "gpu_power_w_mean" in common:  # an estimate: the timed window's mean power over a median step
                    derived["gpu_energy_j_per_step"] = common["gpu_power_w_mean"] * median / 1e3
            records.append(make_record(record_name, name, precision, params, "time", "ms", "lower",
                                       stats_from_samples(res[key]), derived=derived))
        if res["compile_s"] is not None:
            records.append(make_record("compile", name, precision, params, "time", "s", "lower",
                                       stats_from_samples([res["compile_s"]]),
                                       derived=compile_derived(res)))
    return records
