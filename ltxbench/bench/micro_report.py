"""`bench micro` records from the timings (GB/s, % of the copy peak, speedups) and their rendering: the Rich table,
the n/a notes, and the GB/s plot. Pure: no GPU, so tests can feed it timings."""

from __future__ import annotations

import math

from ltxbench.bench.micro import NA_STATS, SAME_SIZE_COPY, Measurement, known_providers
from ltxbench.results.schema import make_record


def _is_na(rec: dict) -> bool:
    return (rec.get("derived") or {}).get("status") == "n/a"


def _num(value) -> float | None:
    return None if value is None or (isinstance(value, float) and math.isnan(value)) else float(value)


def copy_peak(records) -> float | None:
    """The copy bandwidth (GB/s) of the run, from its `copy` record."""
    for rec in records:
        if rec["name"] == "copy":
            return _num((rec.get("derived") or {}).get("gbps"))
    return None


def group_rows(records) -> dict:
    """{(kernel, shape_name, dtype): {provider: record}} in first-seen order, the copy record left out."""
    rows: dict = {}
    for rec in records:
        if rec["name"] == "copy":
            continue
        key = (rec["name"], rec["params"].get("shape_name"), rec["dtype"])
        rows.setdefault(key, {})[rec["provider"]] = rec
    return rows


def provider_columns(records) -> list[str]:
    present = {r["provider"] for r in records if r["name"] != "copy"}
    order = [p for p in known_providers() if p in present]
    return order + sorted(present - set(order))


def cell(rec: dict | None) -> str:
    """`12.3 µs · 45% (98%)` (of the copy peak, and of a copy of the same bytes) over `1234 GB/s`, † after the time
    where the samples were unsteady; `n/a` when the provider could not run; blank if absent."""
    if rec is None:
        return ""
    if _is_na(rec):
        return "n/a"
    derived = rec.get("derived") or {}
    median = _num(rec["stats"].get("median"))
    bw, pct = _num(derived.get("gbps")), _num(derived.get("pct_of_copy_peak"))
    same = _num(derived.get("pct_of_same_size_copy"))
    first = (f"{median * 1e3:.1f} µs" if median is not None else "?") + ("†" if derived.get("unsteady") else "")
    first += f" · {pct:.0f}%" if pct is not None else ""
    first += f" ({same:.0f}%)" if same is not None else ""
    return first + (f"\n{bw:.0f} GB/s" if bw is not None else "")


def speedup_cell(row: dict) -> str:
    derived = (row.get("cuda") or {}).get("derived") or {}
    best = derived.get("best_baseline")
    value = _num(derived.get("speedup_vs_best"))
    return f"{value:.2f}× vs {best}" if best and value is not None else "—"


def check_cell(row: dict) -> str:
    """`pass` when every provider that ran is within tolerance, else the failing providers and errors."""
    failed, ran = [], 0
    for provider, rec in row.items():
        check = rec.get("check") or {}
        if check.get("passed") is None:
            continue
        ran += 1
        if not check["passed"]:
            err = _num(check.get("max_abs_err"))
            failed.append(f"{provider} {err:.2g}" if err is not None else provider)
    if failed:
        return "FAIL " + ", ".join(failed)
    return "pass" if ran else "n/a"


def render_table(records, title: str = "ltxbench bench micro"):
    from rich import box
    from rich.table import Table

    peak = copy_peak(records)
    if peak:
        title += f" · copy peak {peak:.0f} GB/s"
    table = Table(title=title, show_lines=True, box=box.SIMPLE_HEAD,
                  caption=f"µs: median · % of the copy peak (% of a copy of the same bytes); {UNSTEADY_NOTE}")
    providers = provider_columns(records)
    rows = group_rows(records)
    # Kernel and shape names stay whole whatever the width (the commands print on a wide console where the output
    # is not a terminal: ltxbench.cli._console); the timing cells give way first.
    widths = {"kernel": max((len(k) for k, _, _ in rows), default=6),
              "shape": max((len(str(s)) for _, s, _ in rows), default=5)}
    for col in ("kernel", "shape", "dtype", *providers, "cuda speedup", "check"):
        table.add_column(col, justify="right" if col in providers else "left", overflow="fold",
                         no_wrap=col not in ("cuda speedup", "check"), min_width=widths.get(col))
    for (kernel, shape_name, dtype), row in rows.items():
        check = check_cell(row)
        style = "bold red" if check.startswith("FAIL") else ""
        table.add_row(kernel, shape_name, dtype, *(cell(row.get(p)) for p in providers), speedup_cell(row),
                      f"[{style}]{check}[/]" if style else check)
    return table


def na_notes(records) -> list[str]:
    """One line per distinct (kernel, provider, reason) that was n/a."""
    seen = {}
    for rec in records:
        if _is_na(rec):
            seen.setdefault((rec["name"], rec["provider"], rec["derived"].get("reason")), None)
    return [f"n/a: {provider} for {kernel}: {reason}" for kernel, provider, reason in seen]


def _gbps(rec: dict | None) -> float | None:
    return None if rec is None or _is_na(rec) else _num((rec.get("derived") or {}).get("gbps"))


def plot(records, path) -> None:
    """GB/s per shape per provider, one subplot per (kernel, dtype), the copy peak as a dashed line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels: dict = {}
    for (kernel, shape_name, dtype), row in group_rows(records).items():
        panels.setdefault((kernel, dtype), []).append((shape_name, row))
    peak = copy_peak(records)
    n = max(len(panels), 1)
    widest = max((len(rows) for rows in panels.values()), default=1)
    fig, axes = plt.subplots(n, 1, figsize=(max(7.0, 1.6 * widest + 3.5), 3.2 * n), squeeze=False)
    colors = {p: f"C{i}" for i, p in enumerate(provider_columns(records))}
    for ax, ((kernel, dtype), rows) in zip(axes[:, 0], panels.items(), strict=False):
        values = {p: [_gbps(row.get(p)) for _, row in rows] for p in colors}
        providers = [p for p, vs in values.items() if any(v is not None for v in vs)]  # n/a everywhere: no slot
        width = 0.8 / max(len(providers), 1)
        for i, provider in enumerate(providers):
            pts = [(j + (i - (len(providers) - 1) / 2) * width, v) for j, v in enumerate(values[provider])
                   if v is not None]
            ax.bar([x for x, _ in pts], [v for _, v in pts], width=width, label=provider, color=colors[provider])
        if peak:
            ax.axhline(peak, color="black", linestyle="--", linewidth=1, label=f"copy peak {peak:.0f} GB/s")
        ax.set_xticks(range(len(rows)), [name for name, _ in rows], rotation=20, ha="right", fontsize=8)
        ax.set_ylabel("GB/s")
        ax.set_title(f"{kernel} · {dtype}")
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def gbps(nbytes: int, median_ms: float) -> float:
    return nbytes / (median_ms * 1e-3) / 1e9


# Samples that spread this much (p80 / p20) are unsteady: their slow part comes from outside the kernels timed. Seen
# on an H100: FlashAttention-3's decode and compiled SDPA late in a long micro run, p20 17.5 us and median 51.9 at
# 2176 keys, where the same calls in a short run were steady at 17.2. A speed-up over an unsteady baseline is taken
# against its p20, so that no claim rests on a baseline's slow samples.
UNSTEADY_SPREAD = 1.25
UNSTEADY_NOTE = f"† unsteady (p80/p20 > {UNSTEADY_SPREAD}): a speed-up takes that baseline's p20"


def unsteady(stats: dict) -> bool:
    """Whether a measurement's samples spread beyond UNSTEADY_SPREAD (p80 / p20)."""
    p20, p80 = _num(stats.get("p20")), _num(stats.get("p80"))
    return p20 is not None and p80 is not None and p20 > 0 and p80 / p20 > UNSTEADY_SPREAD


def compared_ms(stats: dict, provider: str) -> float | None:
    """The time a speed-up uses: the median; for a baseline whose samples are unsteady, its p20."""
    if provider != "cuda" and unsteady(stats):
        return _num(stats.get("p20"))
    return _num(stats.get("median"))


def speedups(times: dict) -> dict:
    """cuda's speedup (baseline time / cuda time) over each baseline and over the fastest one, from compared_ms."""
    cuda = times.get("cuda")
    base = {p: t for p, t in times.items() if p != "cuda" and t and t > 0}
    if not cuda or not base:
        return {}
    out = {f"speedup_vs_{p}": t / cuda for p, t in base.items()}
    best = min(base, key=base.get)
    out.update(best_baseline=best, speedup_vs_best=base[best] / cuda)
    return out


def copy_record(copy: dict) -> dict:
    return make_record("copy", "torch", "uint8", {"bytes": copy["bytes"]}, "time", "ms", "lower", copy["ms"],
                       derived={"gbps": copy["gbps"]})


def build_records(cases, results: dict, nbytes: dict, copy_peak_gbps: float | None) -> list[dict]:
    """One record per (case, provider), n/a ones included; pure (no GPU), so tests can feed it timings."""
    records = []
    for case in cases:
        ms = {p: compared_ms(results[(case, p)].stats, p) for p in case.providers
              if (case, p) in results and results[(case, p)].stats}
        params = {"shape": list(case.shape), "shape_name": case.shape_name, "variant": case.variant,
                  "bytes": nbytes.get(case)}
        copy = results.get((case, SAME_SIZE_COPY))
        copy_ms = copy.stats["median"] if copy is not None and copy.stats else None
        for p in case.providers:
            m = results.get((case, p)) or Measurement(reason="not measured")
            if m.stats is None:
                derived = {"status": "n/a", "reason": m.reason}
                records.append(make_record(case.kernel, p, case.dtype, params, "time", "ms", "lower", NA_STATS,
                                           derived=derived, check=m.check))
                continue
            derived = {"status": "ok", **({"unsteady": True} if unsteady(m.stats) else {})}
            if nbytes.get(case):
                derived["gbps"] = gbps(nbytes[case], m.stats["median"])
                if copy_peak_gbps:
                    derived["pct_of_copy_peak"] = 100 * derived["gbps"] / copy_peak_gbps
            if copy_ms:
                derived["same_size_copy_ms"] = copy_ms
                derived["pct_of_same_size_copy"] = 100 * copy_ms / m.stats["median"]
            if p == "cuda":
                derived.update(speedups(ms))
            records.append(make_record(case.kernel, p, case.dtype, params, "time", "ms", "lower", m.stats,
                                       derived=derived, check=m.check))
    return records


def failed_checks(records) -> list[str]:
    """The `cuda` records whose correctness check failed (exit code 1)."""
    def g(v):
        return f"{v:.3g}" if isinstance(v, float) else str(v)

    return [f"{r['name']} {r['params'].get('shape_name')} {r['dtype']} (max abs err {g(r['check'].get('max_abs_err'))}"
            f", atol {g(r['check'].get('atol'))}, rtol {g(r['check'].get('rtol'))})"
            for r in records if r["provider"] == "cuda" and r.get("check") and r["check"].get("passed") is False]
