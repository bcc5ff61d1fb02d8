"""The tables of `ltxbench report`: one stored result document (`Document`) and its Markdown table, by kind (e2e,
micro, profile), with the formatting they share. ltxbench.results.report assembles them into a README;
ltxbench.results.report_plots draws the same documents."""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from pathlib import Path

from ltxbench.configurations import MEMORY_BUDGET, Configuration, precision_label
from ltxbench.errors import UsageError
from ltxbench.results.comparable import world_of
from ltxbench.results.io import load_result
from ltxbench.results.provenance import label as provenance_label
from ltxbench.results.remeasure import BESIDE, CORES
from ltxbench.results.schema import out_of_memory_label

OURS = "cuda"  # the provider name of ltxbench's own kernels in `bench micro`
DASH = "–"


@dataclass(frozen=True)
class Document:
    """One result file: where it lies (as the user named the folder) and its validated content."""

    path: Path
    doc: dict

    @property
    def stem(self) -> str:
        return self.path.stem

    @property
    def gpu(self) -> str:
        gpus = (self.doc.get("env") or {}).get("gpus") or []
        return gpus[0].get("name", "cpu") if gpus else "cpu"

    @property
    def devices(self) -> str:
        """The GPU, or for a run over several GPUs their count and split ("4× NVIDIA H100 80GB HBM3, cfg+ulysses")."""
        size, split = world_of(self.doc)
        return f"{size}× {self.gpu}, {split}" if size > 1 else self.gpu

    @property
    def commit(self) -> str:
        return provenance_label((self.doc.get("env") or {}).get("git"))

    @property
    def started(self) -> str:
        return str(self.doc["run"]["started_at"])[:16].replace("T", " ")

    @property
    def command(self) -> str:
        """The command line that wrote the file, without its output path (a detail of the machine it ran on)."""
        argv, kept, skip = list(self.doc["run"]["argv"]), [], False
        for arg in argv:
            if skip:
                skip = False
            elif arg in ("--output", "-o"):
                skip = True
            elif not arg.startswith("--output="):
                kept.append(arg)
        return shlex.join(kept)

    @property
    def provenance(self) -> str:
        beside = self.doc["run"].get(BESIDE)  # the results manifest ran it on one GPU of several, others beside it
        cores = self.doc["run"].get(CORES)
        shared = f" · beside {len(beside)} other benchmarks on this host's GPUs" if beside else ""
        shared += f", on {cores} CPU cores of its own" if beside and cores else ""
        return f"{self.path.as_posix()} · {self.devices} · git {self.commit} · {self.started} UTC{shared}"


def load_folder(folder: Path) -> list[Document]:
    """Every result document (*.json) directly in `folder`, by file name; an unreadable one stops the report. The
    chrome traces `profile` writes beside its result (*.trace.json) are not result documents."""
    if not folder.is_dir():
        raise UsageError(f"RESULTS_DIR {folder} is not a folder")
    paths = sorted(p for p in folder.glob("*.json") if not p.name.endswith(".trace.json"))
    if not paths:
        raise UsageError(f"RESULTS_DIR {folder} holds no result documents (*.json)",
                         hint="point it at a folder that `ltxbench bench ... --output` wrote into")
    return [Document(path, load_result(path)) for path in paths]


# --- formatting -------------------------------------------------------------------------------------

def _num(value, spec: str = ".2f", suffix: str = "") -> str:
    return DASH if value is None else f"{value:{spec}}{suffix}"


def _us(ms) -> str:
    if ms is None:
        return "n/a"
    us = ms * 1000
    return f"{us:.2f}" if us < 10 else f"{us:.1f}"


def to_markdown(frame) -> str:
    """A pandas frame of strings as a Markdown table (pipes inside cells escaped)."""
    cols = [str(c) for c in frame.columns]
    lines = ["| " + " | ".join(cols) + " |", "|" + "|".join(" --- " for _ in cols) + "|"]
    for row in frame.itertuples(index=False):
        lines.append("| " + " | ".join(str(v).replace("|", "\\|") for v in row) + " |")
    return "\n".join(lines)


# --- one table per kind --------------------------------------------------------------------------

def measure_label(rec: dict) -> str:
    """The measured quantity of an e2e record: its phase, and the prompt length for LLM prefill."""
    if rec["name"] == "prefill" and "prompt_len" in rec["params"]:
        return f"prefill {rec['params']['prompt_len']}"
    return rec["name"]


def main_measure(records) -> str | None:
    """The record the speedups and GPU columns are read from: the whole run for a full pipeline, else the step."""
    names = {measure_label(r) for r in records}
    if "total" in names and any(r["params"].get("phase") == "all" for r in records):
        return "total"
    return next((n for n in ("denoise_step", "decode_step", "generate", "total") if n in names), None)


def _gib(nbytes):
    return None if nbytes is None else nbytes / 2**30


def _parsed(config: str) -> Configuration | None:
    try:
        return Configuration(config)
    except ValueError:  # a name of an older file's vocabulary
        return None


def _attention_of(config: str) -> str | None:
    """The attention backend a configuration named for itself (`compile@fa3`), None for any other name."""
    parsed = _parsed(config)
    return parsed.attention if parsed is not None else None


def _attention_reference(configs) -> str | None:
    """The run's compiled configuration without our kernels on an attention of its own, which the kernels on that
    attention are measured against: compile@fa3, else a peer's (LTX-2's stg-off+compile@fa3); None without one."""
    found = [c for c in map(_parsed, configs) if c is not None and c.attention and c.compiled and not c.ours]
    return min(found, key=lambda c: c.patch != "none", default=None)


def _compiled_peers(configs) -> list[str]:
    """The run's compiled peer configurations on the default attention (LTX-2's stg-off+compile, Liger's
    liger+compile): the strongest baselines a user could pick, which our kernels' rows are also measured against."""
    return [c for c in map(_parsed, configs) if c is not None and c.peer and c.compiled and not c.attention]


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
    peers = _compiled_peers(by_config)  # a column each: our kernels against that peer
    rows = []
    for config, recs in by_config.items():
        row = {"config": config}
        if fp8:
            row["precision"] = precision_label(next(iter(recs.values())))
        for m in measures:
            row[f"{m} ms"] = _num(recs[m]["stats"]["median"]) if m in recs else DASH
        failed = next(filter(None, map(out_of_memory_label, recs.values())), None)
        if failed is not None and measures:  # a configuration that did not fit its memory budget
            row[f"{measures[0]} ms"] = failed
        step = recs.get(main, {})
        stats, derived = step.get("stats", {}), step.get("derived", {})
        row[f"{main} p20–p80"] = (f"{stats['p20']:.2f}–{stats['p80']:.2f}" if stats.get("p20") is not None
                                  and stats.get("n", 0) > 1 else DASH)
        row["vs baseline"] = _num(derived.get("speedup_vs_baseline"), ".3f", "×")
        row["vs compile"] = _num(derived.get("speedup_vs_compile"), ".3f", "×")
        if reference is not None:
            same = config != reference and _attention_of(config) == reference.attention
            row[f"vs {reference}"] = _num(derived.get(f"speedup_vs_{reference}") if same else None, ".3f", "×")
        ours = (_parsed(config) or Configuration("baseline")).ours and not _attention_of(config)
        for peer in peers:
            row[f"vs {peer}"] = _num(derived.get(f"speedup_vs_{peer}") if ours else None, ".3f", "×")
        if "tokens_per_s" in derived:
            row["tok/s"] = _num(derived["tokens_per_s"], ".1f")
        for m in measures:  # an LLM's prefills carry their own TFLOP/s (a column per prompt length)
            if m.startswith("prefill "):
                row[f"{m} TFLOP/s"] = _num((recs.get(m) or {}).get("derived", {}).get("tflops"), ".1f")
        # The step's achieved TFLOP/s and MFU (ltxbench.bench.flops); older files lack them: the columns drop out.
        unit = (recs.get("denoise_step") or recs.get("decode_step") or {}).get("derived", {})
        row["step TFLOP/s"] = _num(unit.get("tflops"), ".1f")
        row["MFU"] = _num(None if unit.get("mfu") is None else 100 * unit["mfu"], ".1f", "%")
        row["% of HBM floor"] = _num(unit.get("pct_of_hbm_floor"), ".1f", "%")  # an LLM's batch-1 decode step
        row["SM MHz"] = _num(derived.get("gpu_sm_mhz_median"), ".0f")
        capped = derived.get("gpu_power_capped_share")
        row["power-capped"] = _num(None if capped is None else 100 * capped, ".0f", "%")
        row["J/step"] = _num(derived.get("gpu_energy_j_per_step"), ".1f")
        row["compile s"] = _num(recs["compile"]["stats"]["median"], ".1f") if "compile" in recs else DASH
        if (step.get("params") or {}).get(MEMORY_BUDGET) is not None:  # under --memory-budget: what it held
            row["peak GiB"] = _num(_gib(derived.get("peak_memory_bytes")), ".2f")
            row["reserved GiB"] = _num(_gib(derived.get("peak_reserved_bytes")), ".2f")
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
    import pandas as pd

    cases = micro_cases(doc)
    baselines = list(dict.fromkeys(p for recs in cases.values() for p in recs if p != OURS))
    rows = []
    for (kernel, variant, shape_name, dtype), recs in cases.items():
        ours = recs.get(OURS, {})
        derived = ours.get("derived") or {}
        check = ours.get("check") or {}
        shape = "x".join(str(d) for d in recs[next(iter(recs))]["params"].get("shape", []))
        row = {"kernel": kernel + (f" ({variant})" if variant else ""), "shape": f"{shape_name} ({shape})",
               "dtype": dtype, "ltxbench µs": _us(ours.get("stats", {}).get("median")),
               "% of copy peak": _num(derived.get("pct_of_copy_peak"), ".1f"),
               "% of same-size copy": _num(derived.get("pct_of_same_size_copy"), ".1f")}
        for provider in baselines:
            row[f"{provider} µs"] = _us(recs[provider]["stats"]["median"]) if provider in recs else DASH
        row["vs fastest baseline"] = _num(derived.get("speedup_vs_best"), ".3f", "×")
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
            rows.setdefault("GPU idle between kernels", {})[config] = _num(rec["stats"]["median"] / steps)
            clock = rec["derived"].get("gpu_sm_mhz_median")
            if clock is not None:
                rows.setdefault("SM MHz (median)", {})[config] = f"{clock:.0f}"
        else:
            rows.setdefault(rec["name"], {})[config] = _num(rec["stats"]["median"] / steps)
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
                     "backend": rec["provider"], "µs": _us(median), "TFLOP/s": _num(derived.get("tflops"), ".1f"),
                     "% of peak": _num(derived.get("pct_of_peak"), ".1f"),
                     "check": DASH if not check else ("ok" if check.get("passed") else "FAIL")})
    return pd.DataFrame(rows)


def generic_table(doc: dict):
    import pandas as pd

    return pd.DataFrame([{"name": r["name"], "provider": r["provider"], "dtype": r["dtype"],
                          "params": " ".join(f"{k}={v}" for k, v in sorted(r["params"].items())),
                          "median": _num(r["stats"]["median"], ".4g", f" {r.get('unit', '')}")}
                         for r in doc["records"]])


TABLES = {"e2e": e2e_table, "micro": micro_table, "profile": profile_table, "micro-attention": attention_table}


def table_for(doc: dict):
    return TABLES.get(doc["kind"], generic_table)(doc)
