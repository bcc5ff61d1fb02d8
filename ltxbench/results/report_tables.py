"""The tables of `ltxbench report`: one stored result document's Markdown table, by kind (e2e, micro, profile,
micro-attention); ltxbench.results.report assembles them into a README."""

from __future__ import annotations

from ltxbench.configurations import MEMORY_BUDGET, Configuration, precision_label
from ltxbench.results.report_documents import DASH, OURS, fmt, fmt_us, gib, main_measure, measure_label
from ltxbench.results.schema import out_of_memory_label


def _parsed(config: str) -> Configuration | None:
    try:
        return Configuration(config)
    except ValueError:  # a name of an older file's vocabulary
        return None


def _attention_reference(configs) -> str | None:
    """The run's compiled configuration without our kernels on an attention of its own, which the kernels on that
    attention are measured against: compile@fa3, else a peer's (LTX-2's stg-off+compile@fa3); None without one."""
    found = [c for c in map(_parsed, configs) if c is not None and c.attention and c.compiled and not c.ours]
    return min(found, key=lambda c: c.patch != "none", default=None)


def _peers(configs) -> list:
    """The run's peer configurations on the default attention: compiled ones (LTX-2's stg-off+compile, Liger's
    liger+compile), the strongest baselines a user could pick, which all our kernels' rows are measured against; and
    eager ones (Lightricks' ltx-core, Liger, diffusers' group offloading, LTX-2's stg-off), which our eager rows are."""
    return [c for c in map(_parsed, configs) if c is not None and c.peer and not c.attention]


def e2e_table(doc: dict):
    import pandas as pd

    records = [r for r in doc["records"] if r["metric"] == "time"]
    measures = list(dict.fromkeys(measure_label(r) for r in records if r["name"] != "compile"))
    main = main_measure(records)
    fp8 = any(r["dtype"].startswith("fp8") for r in records)  # then each row says which precision its numbers used
    by_config: dict = {}
    for rec in records:
        by_config.setdefault(rec["provider"], {})[measure_label(rec)] = rec
    reference = _attention_reference(by_config)  # its column: the kernels' gain on the same attention
    peers = _peers(by_config)  # a column each: our kernels against that peer
    rows = []
    for config, recs in by_config.items():
        row, parsed = {"config": config}, _parsed(config)
        attention = parsed.attention if parsed is not None else None  # a backend the configuration named for itself
        if fp8:
            row["precision"] = precision_label(next(iter(recs.values())))
        for m in measures:
            row[f"{m} ms"] = fmt(recs[m]["stats"]["median"]) if m in recs else DASH
        failed = next(filter(None, map(out_of_memory_label, recs.values())), None)
        if failed is not None and measures:  # a configuration that did not fit its memory budget
            row[f"{measures[0]} ms"] = failed
        step = recs.get(main, {})
        stats, derived = step.get("stats", {}), step.get("derived", {})
        row[f"{main} p20–p80"] = (f"{stats['p20']:.2f}–{stats['p80']:.2f}" if stats.get("p20") is not None
                                  and stats.get("n", 0) > 1 else DASH)
        row["vs baseline"] = fmt(derived.get("speedup_vs_baseline"), ".3f", "×")
        row["vs compile"] = fmt(derived.get("speedup_vs_compile"), ".3f", "×")
        if reference is not None:
            same = config != reference and attention == reference.attention
            row[f"vs {reference}"] = fmt(derived.get(f"speedup_vs_{reference}") if same else None, ".3f", "×")
        ours = parsed is not None and parsed.ours and attention is None
        for peer in peers:
            against = ours and (peer.compiled or not parsed.compiled)  # an eager peer: against our eager rows
            row[f"vs {peer}"] = fmt(derived.get(f"speedup_vs_{peer}") if against else None, ".3f", "×")
        if "tokens_per_s" in derived:
            row["tok/s"] = fmt(derived["tokens_per_s"], ".1f")
        for m in measures:  # an LLM's prefills carry their own TFLOP/s (a column per prompt length)
            if m.startswith("prefill "):
                row[f"{m} TFLOP/s"] = fmt((recs.get(m) or {}).get("derived", {}).get("tflops"), ".1f")
        # The step's achieved TFLOP/s and MFU (ltxbench.bench.flops); older files lack them: the columns drop out.
        unit = (recs.get("denoise_step") or recs.get("decode_step") or {}).get("derived", {})
        row["step TFLOP/s"] = fmt(unit.get("tflops"), ".1f")
        row["MFU"] = fmt(None if unit.get("mfu") is None else 100 * unit["mfu"], ".1f", "%")
        row["% of HBM floor"] = fmt(unit.get("pct_of_hbm_floor"), ".1f", "%")  # an LLM's batch-1 decode step
        row["SM MHz"] = fmt(derived.get("gpu_sm_mhz_median"), ".0f")
        capped = derived.get("gpu_power_capped_share")
        row["power-capped"] = fmt(None if capped is None else 100 * capped, ".0f", "%")
        row["J/step"] = fmt(derived.get("gpu_energy_j_per_step"), ".1f")
        row["compile s"] = fmt(recs["compile"]["stats"]["median"], ".1f") if "compile" in recs else DASH
        if (step.get("params") or {}).get(MEMORY_BUDGET) is not None:  # under --memory-budget: what it held
            row["peak GiB"] = fmt(gib(derived.get("peak_memory_bytes")), ".2f")
            row["reserved GiB"] = fmt(gib(derived.get("peak_reserved_bytes")), ".2f")
        rows.append(row)
    frame = pd.DataFrame(rows)
    # Columns no configuration has a value for (no GPU monitor in older files, no compile config) say nothing.
    return frame[[c for c in frame.columns if c == "config" or (frame[c] != DASH).any()]]


def precision_error_lines(doc: dict) -> list[str]:
    """The FP8 configurations' step error (bench.precision_error), one line each."""
    lines = []
    for rec in doc["records"]:
        if rec["name"] != "step_error":
            continue
        derived, check = rec["derived"], rec.get("check") or {}
        line = (f"{precision_label(rec)} error, one transformer step from the first step's inputs "
                f"({check.get('weights', '?')} weights): "
                f"cosine {rec['stats']['median']:.5f} to our bf16 output (gate {check.get('min_cosine')}: "
                f"{'passed' if check.get('passed') else 'FAILED'}), relative L2 {derived['rel_l2_vs_bf16']:.4f}")
        against = [(name.removesuffix("_cosine_vs_fp32"), value) for name, value in derived.items()
                   if name.endswith("_cosine_vs_fp32")]
        if against:
            line += "; against fp32: " + ", ".join(
                f"{name} cosine {value:.5f} / rel L2 {derived[f'{name}_rel_l2_vs_fp32']:.4f}"
                for name, value in against)
        if derived.get("video_ssim") is not None:
            psnr = derived.get("video_psnr_db")
            line += (f"; the decoded video ({derived['video_frames']} frames) against bf16's, same seed: "
                     + (f"PSNR {psnr:.2f} dB" if psnr is not None else "identical")
                     + f", SSIM {derived['video_ssim']:.4f}")
        lines.append(line + f"; transformer weights {derived['weight_bytes_fp8'] / 2**30:.2f} GiB in FP8 against "
                            f"{derived['weight_bytes_bf16'] / 2**30:.2f} GiB ({derived['weight_ratio']:.2f}×).")
    return lines


def micro_cases(doc: dict) -> dict:
    """(kernel, variant, shape name, dtype) -> {provider: record}, in the document's order; the copy excluded."""
    cases: dict = {}
    for rec in doc["records"]:
        if rec["name"] == "copy" or rec["metric"] != "time":
            continue
        key = (rec["name"], rec["params"].get("variant"), rec["params"].get("shape_name", ""), rec["dtype"])
        cases.setdefault(key, {})[rec["provider"]] = rec
    return cases


def copy_peak_gbps(doc: dict) -> float | None:
    peak = (doc["run"].get("config") or {}).get("copy_peak_gbps")
    if peak is None:
        peak = next((r["derived"].get("gbps") for r in doc["records"] if r["name"] == "copy"), None)
    return peak


def micro_table(doc: dict):
    """One row per case; the speed-up over the fastest baseline by bench micro's rule (compared_ms: a baseline with
    unsteady samples, marked †, is taken at its p20), applied to the stored samples."""
    import pandas as pd

    from ltxbench.bench.micro_report import compared_ms, speedups, unsteady

    cases = micro_cases(doc)
    baselines = list(dict.fromkeys(p for recs in cases.values() for p in recs if p != OURS))
    rows = []
    for (kernel, variant, shape_name, dtype), recs in cases.items():
        ours = recs.get(OURS, {})
        derived = ours.get("derived") or {}
        check = ours.get("check") or {}
        shape = "x".join(str(d) for d in recs[next(iter(recs))]["params"].get("shape", []))
        row = {"kernel": kernel + (f" ({variant})" if variant else ""), "shape": f"{shape_name} ({shape})",
               "dtype": dtype, "ltxbench µs": fmt_us(ours.get("stats", {}).get("median")),
               "% of copy peak": fmt(derived.get("pct_of_copy_peak"), ".1f"),
               "% of same-size copy": fmt(derived.get("pct_of_same_size_copy"), ".1f")}
        for provider in baselines:
            stats = recs[provider]["stats"] if provider in recs else None
            mark = "†" if stats is not None and unsteady(stats) else ""
            row[f"{provider} µs"] = DASH if stats is None else fmt_us(stats["median"]) + mark
        times = {p: compared_ms(r["stats"], p) for p, r in recs.items() if r["stats"].get("median") is not None}
        row["vs fastest baseline"] = fmt(speedups(times).get("speedup_vs_best"), ".3f", "×")
        row["check"] = DASH if not check else ("ok" if check.get("passed") else "FAIL")
        rows.append(row)
    return pd.DataFrame(rows)


def profile_table(doc: dict):
    """Kernel time per denoising step (or per iteration) by kernel family, one column per configuration; after them,
    where the records carry them, the GEMM and attention families' achieved TFLOP/s (and % of the dense peak)."""
    import pandas as pd

    rows: dict = {}
    rates: dict = {}
    configs: list = []
    for rec in doc["records"]:
        if rec["name"].startswith("kernel:"):
            continue
        steps = rec["params"].get("steps") or 1
        config = rec["provider"]
        configs = list(dict.fromkeys([*configs, config]))
        if rec["name"] == "timeline:idle":
            rows.setdefault("GPU idle between kernels", {})[config] = fmt(rec["stats"]["median"] / steps)
            clock = rec["derived"].get("gpu_sm_mhz_median")
            if clock is not None:
                rows.setdefault("SM MHz (median)", {})[config] = f"{clock:.0f}"
        else:
            rows.setdefault(rec["name"], {})[config] = fmt(rec["stats"]["median"] / steps)
            derived = rec.get("derived") or {}
            if derived.get("tflops") is not None:  # a CPU run's fraction of a TFLOP/s keeps 3 digits
                tflops, pct = derived["tflops"], derived.get("pct_of_peak")
                rates.setdefault(f"{rec['name']} TFLOP/s (% of dense peak)", {})[config] = \
                    (f"{tflops:.1f}" if tflops >= 10 else f"{tflops:.3g}") + ("" if pct is None else f" ({pct:.1f}%)")
    return pd.DataFrame([{"ms per step": name, **{c: vals.get(c, DASH) for c in configs}}
                         for name, vals in {**rows, **rates}.items()])


def attention_table(doc: dict):
    """`bench micro attention`: per shape and backend, µs, TFLOP/s, % of the dense bf16 peak and the fp32 check."""
    import pandas as pd

    rows = []
    for rec in doc["records"]:
        derived, check, median = rec.get("derived") or {}, rec.get("check") or {}, rec["stats"]["median"]
        rows.append({"shape": f"{rec['params']['shape_name']} ({'x'.join(map(str, rec['params']['shape']))})",
                     "backend": rec["provider"], "µs": fmt_us(median), "TFLOP/s": fmt(derived.get("tflops"), ".1f"),
                     "% of peak": fmt(derived.get("pct_of_peak"), ".1f"),
                     "check": DASH if not check else ("ok" if check.get("passed") else "FAIL")})
    return pd.DataFrame(rows)


def generic_table(doc: dict):
    import pandas as pd

    return pd.DataFrame([{"name": r["name"], "provider": r["provider"], "dtype": r["dtype"],
                          "params": " ".join(f"{k}={v}" for k, v in sorted(r["params"].items())),
                          "median": fmt(r["stats"]["median"], ".4g", f" {r.get('unit', '')}")}
                         for r in doc["records"]])


TABLES = {"e2e": e2e_table, "micro": micro_table, "profile": profile_table, "micro-attention": attention_table}


def table_for(doc: dict):
    return TABLES.get(doc["kind"], generic_table)(doc)
