"""Table and plot of `bench e2e` records (LTX phases or LLM prefill/decode), one row per configuration."""

from __future__ import annotations

from collections import defaultdict


def _by_config(records) -> dict:
    rows: dict = defaultdict(dict)
    for rec in records:
        label = rec["name"] if rec["name"] != "prefill" else f"prefill@{rec['params']['prompt_len']}"
        rows[rec["provider"]][label] = rec
    return rows


def _fmt(value, spec=".1f", suffix="") -> str:
    return "-" if value is None else f"{value:{spec}}{suffix}"


def render_table(records, title: str = "ltxbench bench e2e"):
    from rich.table import Table

    rows = _by_config(records)
    phases = list(dict.fromkeys(k for row in rows.values() for k in row if k != "compile"))
    table = Table(title=title)
    table.add_column("config")
    for phase in phases:
        table.add_column(f"{phase} ms", justify="right")
    for col in ("it/s" if "denoise_step" in phases else "tok/s", "vs baseline", "vs compile", "compile s",
                "peak GiB"):
        table.add_column(col, justify="right")
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
        step = row.get("denoise_step") or row.get("decode_step")
        rate = (step or {}).get("derived", {}).get("transformer_it_s", (step or {}).get("derived", {}).get(
            "tokens_per_s"))
        peak = derived.get("peak_memory_bytes")
        cells = [_fmt(row[p]["stats"]["median"]) if p in row else "-" for p in phases]
        gpu_cells = []
        if clocked:
            gpu = (step or main or {}).get("derived", {})
            gpu_cells = [f"{gpu['gpu_sm_mhz_median']:.0f} ({100 * gpu['gpu_power_capped_share']:.0f}%)"
                     if "gpu_sm_mhz_median" in gpu else "-"]
        if metered:
            gpu_cells.append(_fmt((step or {}).get("derived", {}).get("gpu_energy_j_per_step"), ".1f"))
        table.add_row(config, *cells, _fmt(rate, ".2f"), _fmt(derived.get("speedup_vs_baseline"), ".2f", "x"),
                      _fmt(derived.get("speedup_vs_compile"), ".2f", "x"), _fmt(derived.get("compile_s"), ".1f"),
                      _fmt(peak / 2**30 if peak is not None else None, ".2f"), *gpu_cells)
    return table


def plot(records, path) -> None:
    """Grouped/stacked bars per configuration: per-iteration median time split by phase."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = _by_config(records)
    configs = list(rows)
    ltx = any("denoise_step" in row for row in rows.values())
    fig, ax = plt.subplots(figsize=(max(5, 1.6 * len(configs) + 2), 4))
    bottoms = [0.0] * len(configs)
    if ltx:
        parts = [("text_encode", 1), ("denoise_step", None), ("vae_decode", 1)]
    else:
        parts = [(k, 1) for k in dict.fromkeys(k for row in rows.values() for k in row if k.startswith("prefill@"))]
        parts.append(("generate", 1))
    for phase, _ in parts:
        heights = []
        for row in rows.values():
            rec = row.get(phase)
            if rec is None:
                heights.append(0.0)
            elif phase == "denoise_step":
                heights.append(rec["derived"].get("denoise_total_ms") or rec["stats"]["median"] * rec["stats"]["n"])
            else:
                heights.append(rec["stats"]["median"])
        if any(heights):
            ax.bar(configs, heights, bottom=bottoms, label=phase.replace("denoise_step", "denoise"))
            bottoms = [b + h for b, h in zip(bottoms, heights, strict=True)]
    ax.set_ylabel("ms per iteration (median)")
    ax.set_title("ltxbench bench e2e")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
